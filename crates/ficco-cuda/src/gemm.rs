//! bf16 GEMMs through cuBLASLt with row-major semantics.
//!
//! cuBLASLt is column-major. A row-major `C[M,N] = A[M,K] · B[K,N]` with
//! leading dimensions lda, ldb, ldc is, read column-major,
//! `C^T[N,M] = B^T[N,K] · A^T[K,M]` with the same leading dimensions and no
//! transposes: cuBLASLt's A is our B and its B is our A. B may also come as
//! its transpose (`b_transposed`: the caller's `[N, K]` row-major, as a
//! weight `W` of `x @ W^T`): read column-major that is B itself, `[K x N]`
//! at leading dimension `ldb`, and cuBLASLt transposes it (`TRANSA`), at no
//! cost. Descriptors and the chosen algorithm are cached per (shape,
//! leading dimensions, SM target, layout of B); each compute stream has its
//! own workspace.
//!
//! The algorithm is chosen by measurement, not by cuBLASLt's first guess: the
//! top [`CANDIDATES`] heuristic results are each timed on the real operands
//! once per configuration ([`Gemms::tune`]). The first guess is up to 15%
//! slower on wide-N shapes (measured on H200 against PyTorch), and chunked
//! GEMMs suffer most, since their best tile shape differs from the whole GEMM's.

use crate::driver::blas::{self as lt, Algo, Handle, Layout, MatmulDesc};
use crate::error::{CudaError, Result};
use crate::mem::DevicePtr;
use std::collections::HashMap;

/// Workspace each compute stream gets (cuBLASLt recommends 32 MiB on Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Heuristic candidates timed per configuration.
pub const CANDIDATES: usize = 8;

/// Key of a cached GEMM configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmKey {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub sm_target: Option<usize>,
    /// B is stored transposed, `[N, K]` row-major, `ldb` its pitch (>= K).
    pub b_transposed: bool,
}

struct Cached {
    desc: MatmulDesc,
    a: Layout,
    b: Layout,
    c: Layout,
    algo: Algo,
    /// Further heuristic candidates, until [`Gemms::tune`] has picked one.
    others: Vec<Algo>,
}

/// One device's cuBLASLt handle and GEMM cache. Used by one host thread at a time.
pub struct Gemms {
    handle: Handle,
    cache: HashMap<GemmKey, Cached>,
}

// SAFETY: the handle and descriptors are only used by the thread that owns the
// `Gemms` at a time (it moves between threads, never shared).
unsafe impl Send for Gemms {}

impl std::fmt::Debug for Gemms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gemms({} cached)", self.cache.len())
    }
}

impl Gemms {
    /// Creates the handle; the device's context must be current.
    pub fn new() -> Result<Self> {
        let handle = lt::create_handle()?;
        Ok(Gemms {
            handle,
            cache: HashMap::new(),
        })
    }

    fn build(&self, key: GemmKey) -> Result<Cached> {
        let desc = lt::matmul_desc(key.sm_target.map(|s| s as i32), key.b_transposed)?;
        // Column-major view: cuBLASLt A = our B^T [N x K], B = our A^T [K x M], D = C^T [N x M].
        // A transposed B is stored as B^T row-major, i.e. B [K x N] column-major: op(A) = T.
        let (a_rows, a_cols) = if key.b_transposed {
            (key.k, key.n)
        } else {
            (key.n, key.k)
        };
        let a = lt::layout_bf16(
            a_rows as u64,
            a_cols as u64,
            key.ldb as i64,
            "cublasLtMatrixLayoutCreate(A)",
        )?;
        let b = lt::layout_bf16(
            key.k as u64,
            key.m as u64,
            key.lda as i64,
            "cublasLtMatrixLayoutCreate(B)",
        )?;
        let c = lt::layout_bf16(
            key.n as u64,
            key.m as u64,
            key.ldc as i64,
            "cublasLtMatrixLayoutCreate(C)",
        )?;
        // SAFETY: the handle and the descriptors just made are live.
        let heur = unsafe {
            lt::heuristics(
                self.handle,
                desc,
                a,
                b,
                c,
                CANDIDATES,
                WORKSPACE_BYTES as u64,
            )?
        };
        let mut algos = heur.into_iter();
        let Some(algo) = algos.next() else {
            return Err(CudaError::Cublas {
                call: "cublasLtMatmulAlgoGetHeuristic (no algorithm for this GEMM)",
                code: lt::NOT_SUPPORTED,
            });
        };
        Ok(Cached {
            desc,
            a,
            b,
            c,
            algo,
            others: algos.collect(),
        })
    }

    /// Enqueues c = a · b, or c = a · b + c with `accumulate` (row-major bf16,
    /// f32 accumulation; beta = 1 reads c), on `stream`.
    ///
    /// # Safety
    /// The pointers must hold the matrices `key` describes on the current
    /// device; `workspace` must hold [`WORKSPACE_BYTES`] and be used by no other
    /// stream concurrently.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &mut self,
        key: GemmKey,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        accumulate: bool,
        workspace: DevicePtr,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        if key.m == 0 || key.n == 0 {
            return Ok(());
        }
        if key.k == 0 {
            return Err(CudaError::Plan("GEMM with k = 0".into()));
        }
        if !self.cache.contains_key(&key) {
            let built = self.build(key)?;
            self.cache.insert(key, built);
        }
        let Some(g) = self.cache.get(&key) else {
            return Err(CudaError::Plan("GEMM cache miss".into()));
        };
        let beta = if accumulate { 1.0 } else { 0.0 };
        self.matmul(g, &g.algo, a, b, c, beta, workspace, stream)
    }

    /// Times every candidate algorithm of `key` on these operands (3 runs
    /// each after one warm-up, fastest median wins) and caches the winner.
    /// A candidate that fails to launch is dropped.
    ///
    /// # Safety
    /// As [`Gemms::gemm`]; `stream` belongs to the current device.
    pub unsafe fn tune(
        &mut self,
        key: GemmKey,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        workspace: DevicePtr,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<()> {
        use crate::error::drv;
        if key.m == 0 || key.n == 0 || key.k == 0 {
            return Ok(());
        }
        if !self.cache.contains_key(&key) {
            let built = self.build(key)?;
            self.cache.insert(key, built);
        }
        let Some(g) = self.cache.get(&key) else {
            return Err(CudaError::Plan("GEMM cache miss".into()));
        };
        if g.others.is_empty() {
            return Ok(());
        }
        let ctx = stream.context();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (e0, e1) = (
            ctx.new_event(flags).map_err(drv("cuEventCreate"))?,
            ctx.new_event(flags).map_err(drv("cuEventCreate"))?,
        );
        let cu = stream.cu_stream();
        let mut best: Option<(f32, Algo)> = None;
        for algo in std::iter::once(g.algo).chain(g.others.iter().copied()) {
            if self.matmul(g, &algo, a, b, c, 0.0, workspace, cu).is_err() {
                continue;
            }
            let mut times = vec![];
            for _ in 0..3 {
                e0.record(stream).map_err(drv("cuEventRecord"))?;
                self.matmul(g, &algo, a, b, c, 0.0, workspace, cu)?;
                e1.record(stream).map_err(drv("cuEventRecord"))?;
                e1.synchronize().map_err(drv("cuEventSynchronize"))?;
                times.push(e0.elapsed_ms(&e1).map_err(drv("cuEventElapsedTime"))?);
            }
            times.sort_by(f32::total_cmp);
            let t = times[1];
            if best.is_none_or(|(bt, _)| t < bt) {
                best = Some((t, algo));
            }
        }
        stream.synchronize().map_err(drv("cuStreamSynchronize"))?;
        if let (Some((_, algo)), Some(g)) = (best, self.cache.get_mut(&key)) {
            g.algo = algo;
            g.others.clear();
        }
        Ok(())
    }

    /// Enqueues one matmul of a cached configuration.
    ///
    /// # Safety
    /// As [`Gemms::gemm`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul(
        &self,
        g: &Cached,
        algo: &Algo,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        beta: f32,
        workspace: DevicePtr,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        // Row-major C = A·B is column-major C^T = B^T·A^T: cuBLASLt's A is our b.
        lt::matmul(
            self.handle,
            g.desc,
            beta,
            (b, g.a),
            (a, g.b),
            (c, g.c),
            algo,
            workspace,
            WORKSPACE_BYTES,
            stream,
        )
    }
}

impl Drop for Gemms {
    fn drop(&mut self) {
        // SAFETY: each descriptor and the handle are destroyed exactly once.
        unsafe {
            for (_, g) in self.cache.drain() {
                lt::destroy_layout(g.a);
                lt::destroy_layout(g.b);
                lt::destroy_layout(g.c);
                lt::destroy_desc(g.desc);
            }
            lt::destroy_handle(self.handle);
        }
    }
}
