//! Shared-memory occupancy shaping (arXiv 2606.09200) and the kernels ficco
//! launches itself: a tensor-core bf16 GEMM and a bias+GELU epilogue.
//!
//! Shaping: a kernel launched with extra dynamic shared memory that it never
//! touches fits fewer blocks per SM, which leaves SMs room for concurrently
//! running communication kernels. The kernel code is unchanged. [`Shaper`]
//! finds, per target b blocks/SM, the least extra shared memory for which the
//! occupancy calculator gives at most b (after raising
//! `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` to the device's opt-in
//! limit), and reports the occupancy actually achieved.
//!
//! The GEMM: row-major C[M,N] = A[M,K] · B[K,N], bf16 in and out, f32
//! accumulation, `mma.sync.m16n8k16` bf16 tensor-core instructions via inline
//! PTX, 128×128×32 block tiles, 8 warps of 64×32, `ldmatrix` fragment loads
//! and `cp.async` double buffering. Any M; N, K and the leading dimensions
//! must be multiples of 8 and the pointers 16-byte aligned (each 16-byte
//! chunk is then wholly in or out of range; partial tiles are zero-filled).
//! Natural occupancy is 2 blocks/SM (`__launch_bounds__(256, 2)`).
//!
//! See [cuOccupancyMaxActiveBlocksPerMultiprocessor](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__OCCUPANCY.html),
//! [cuFuncSetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html)
//! and the [PTX mma instructions](https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-instructions-mma).

use crate::controls::{device_attribute, Kernel, KernelLibrary};
use crate::error::{CudaError, Result};
use crate::mem::DevicePtr;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::ffi::c_void;
use std::sync::Arc;

/// Block tile of the GEMM (rows of C, columns of C).
pub const TILE_M: usize = 128;
pub const TILE_N: usize = 128;
/// Threads per GEMM block.
pub const GEMM_THREADS: u32 = 256;
/// Threads per bias+GELU block.
pub const EPILOGUE_THREADS: u32 = 256;

const SRC: &str = r#"
typedef unsigned short bf16;
#define BM 128
#define BN 128
#define BK 32
#define AST (BK + 8)
#define BST (BN + 8)

__device__ __forceinline__ float b2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2b(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void ldsm4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

extern "C" __global__ void __launch_bounds__(256, 2)
ficco_gemm_bf16(const bf16* __restrict__ A, const bf16* __restrict__ B, bf16* __restrict__ C,
                int M, int N, int K, long long lda, long long ldb, long long ldc) {
    __shared__ __align__(128) bf16 As[2][BM * AST];
    __shared__ __align__(128) bf16 Bs[2][BK * BST];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    const int KT = (K + BK - 1) / BK;

    auto load = [&](int stage, int kt) {
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = tid + i * 256;
            const int r = c >> 2, col = (c & 3) * 8;
            const int gr = bm + r, gk = k0 + col;
            const bool ok = gr < M && gk < K;
            const bf16* src = ok ? A + (long long)gr * lda + gk : A;
            cp16(smem_u32(&As[stage][r * AST + col]), src, ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = tid + i * 256;
            const int r = c >> 4, col = (c & 15) * 8;
            const int gk = k0 + r, gn = bn + col;
            const bool ok = gk < K && gn < N;
            const bf16* src = ok ? B + (long long)gk * ldb + gn : B;
            cp16(smem_u32(&Bs[stage][r * BST + col]), src, ok ? 16 : 0);
        }
    };

    load(0, 0);
    cp_commit();
    for (int kt = 0; kt < KT; kt++) {
        if (kt + 1 < KT) load((kt + 1) & 1, kt + 1);
        cp_commit();
        cp_wait1();
        __syncthreads();
        const bf16* as = As[kt & 1];
        const bf16* bs = Bs[kt & 1];
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            unsigned a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int r = wm * 64 + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int c = ks * 16 + (lane >> 4) * 8;
                ldsm4(a[mi], smem_u32(as + r * AST + c));
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                const int r = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int c = wn * 32 + nj * 16 + (lane >> 4) * 8;
                unsigned t[4];
                ldsm4t(t, smem_u32(bs + r * BST + c));
                b[2 * nj][0] = t[0];
                b[2 * nj][1] = t[1];
                b[2 * nj + 1][0] = t[2];
                b[2 * nj + 1][1] = t[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma16816(acc[mi][ni], a[mi], b[ni]);
        }
        __syncthreads();
    }
    cp_wait0();

    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++) {
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const int r0 = bm + wm * 64 + mi * 16 + g;
            const int c0 = bn + wn * 32 + ni * 8 + t * 2;
            if (c0 < N) {
                if (r0 < M)
                    *(unsigned*)(C + (long long)r0 * ldc + c0) =
                        (unsigned)f2b(acc[mi][ni][0]) | ((unsigned)f2b(acc[mi][ni][1]) << 16);
                if (r0 + 8 < M)
                    *(unsigned*)(C + (long long)(r0 + 8) * ldc + c0) =
                        (unsigned)f2b(acc[mi][ni][2]) | ((unsigned)f2b(acc[mi][ni][3]) << 16);
            }
        }
    }
}

extern "C" __global__ void ficco_bias_gelu(bf16* y, const bf16* bias, unsigned long long rows,
                                           unsigned long long cols, unsigned long long ld) {
    const unsigned long long n = rows * cols;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned long long r = i / cols, c = i - r * cols;
        float x = b2f(y[r * ld + c]);
        if (bias) x += b2f(bias[c]);
        y[r * ld + c] = f2b(0.5f * x * (1.0f + erff(x * 0.70710678118654752f)));
    }
}
"#;

/// Occupancy shaping of one kernel at a fixed block size.
#[derive(Debug, Clone)]
pub struct Shaper {
    kernel: Kernel,
    ctx: Arc<CudaContext>,
    threads: u32,
    /// Blocks/SM with no extra shared memory.
    pub natural: u32,
    /// Static shared memory of the kernel, bytes.
    pub static_smem: usize,
    /// Most dynamic shared memory a block may have (opt-in limit − static).
    pub max_dyn_smem: usize,
    /// Least extra bytes for b = 1..=natural blocks/SM (index b − 1);
    /// `None` where no amount gets that low.
    extra: Vec<Option<usize>>,
}

impl Shaper {
    /// Raises the kernel's dynamic shared memory limit to the device's
    /// opt-in maximum and tabulates the extra bytes for each b ≤ natural.
    pub fn new(ctx: &Arc<CudaContext>, kernel: Kernel, threads: u32) -> Result<Self> {
        let optin = device_attribute(
            ctx,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?
        .max(0) as usize;
        let static_smem = kernel
            .attribute(
                ctx,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            )?
            .max(0) as usize;
        let max_dyn_smem = optin.saturating_sub(static_smem);
        kernel.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            max_dyn_smem as i32,
        )?;
        // The per-context function too (some drivers read the attribute there).
        ctx.bind_to_thread()
            .map_err(crate::error::drv("cuCtxSetCurrent"))?;
        let f = kernel.function_in_current()?;
        // SAFETY: a live function of the current context.
        unsafe {
            crate::driver::cuda::func_set_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                max_dyn_smem as i32,
            )?;
        }
        let natural = kernel.occupancy(ctx, threads, 0)?;
        if natural == 0 {
            return Err(CudaError::Plan(format!(
                "kernel does not fit an SM at {threads} threads"
            )));
        }
        let mut s = Shaper {
            kernel,
            ctx: ctx.clone(),
            threads,
            natural,
            static_smem,
            max_dyn_smem,
            extra: vec![],
        };
        for b in 1..=natural {
            let e = s.search(b)?;
            s.extra.push(e);
        }
        Ok(s)
    }

    /// Least dynamic shared memory with occupancy ≤ b (binary search; the
    /// occupancy is non-increasing in shared memory).
    fn search(&self, b: u32) -> Result<Option<usize>> {
        if self.kernel.occupancy(&self.ctx, self.threads, 0)? <= b {
            return Ok(Some(0));
        }
        if self
            .kernel
            .occupancy(&self.ctx, self.threads, self.max_dyn_smem)?
            > b
        {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0usize, self.max_dyn_smem); // occ(lo) > b >= occ(hi)
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.kernel.occupancy(&self.ctx, self.threads, mid)? <= b {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Ok(Some(hi))
    }

    /// Extra dynamic shared memory for at most `blocks_per_sm` blocks/SM
    /// (`None`: unshaped, 0 bytes). b ≥ natural needs none; b = 0 or a b no
    /// amount reaches is [`CudaError::Plan`].
    pub fn extra_smem(&self, blocks_per_sm: Option<u32>) -> Result<usize> {
        let Some(b) = blocks_per_sm else {
            return Ok(0);
        };
        if b == 0 {
            return Err(CudaError::Plan("blocks_per_sm must be at least 1".into()));
        }
        if b >= self.natural {
            return Ok(0);
        }
        self.extra
            .get(b as usize - 1)
            .copied()
            .flatten()
            .ok_or_else(|| {
                CudaError::Plan(format!(
                    "no shared-memory size limits this kernel to {b} blocks/SM (natural {})",
                    self.natural
                ))
            })
    }

    /// Blocks/SM the occupancy calculator gives at the shaping for `blocks_per_sm`.
    pub fn occupancy(&self, blocks_per_sm: Option<u32>) -> Result<u32> {
        let e = self.extra_smem(blocks_per_sm)?;
        self.kernel.occupancy(&self.ctx, self.threads, e)
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn threads(&self) -> u32 {
        self.threads
    }
}

/// ficco's GEMM and epilogue on one device, each with its [`Shaper`].
#[derive(Debug)]
pub struct ShapedGemm {
    pub gemm: Shaper,
    pub epilogue: Shaper,
    sms: u32,
    _lib: KernelLibrary,
}

fn aligned16(p: DevicePtr) -> bool {
    p.is_aligned(16)
}

impl ShapedGemm {
    /// Compiles (once per architecture), loads and tabulates the shaping.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        crate::loader::require()?;
        let lib = KernelLibrary::load(ctx, "ficco_shaped", SRC)?;
        let gemm = Shaper::new(ctx, lib.kernel("ficco_gemm_bf16")?, GEMM_THREADS)?;
        let epilogue = Shaper::new(ctx, lib.kernel("ficco_bias_gelu")?, EPILOGUE_THREADS)?;
        let sms = device_attribute(
            ctx,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?
        .max(1) as u32;
        Ok(ShapedGemm {
            gemm,
            epilogue,
            sms,
            _lib: lib,
        })
    }

    /// Blocks/SM of the GEMM at `blocks_per_sm` (see [`Shaper::occupancy`]).
    pub fn occupancy(&self, blocks_per_sm: Option<u32>) -> Result<u32> {
        self.gemm.occupancy(blocks_per_sm)
    }

    /// Checks a GEMM's shape and operands; the reason is a [`CudaError::Plan`].
    #[allow(clippy::too_many_arguments)]
    pub fn check_shape(
        a: DevicePtr,
        lda: usize,
        b: DevicePtr,
        ldb: usize,
        c: DevicePtr,
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let bad = |s: String| Err(CudaError::Plan(format!("ficco GEMM {m}x{n}x{k}: {s}")));
        if m > i32::MAX as usize || n > i32::MAX as usize || k > i32::MAX as usize {
            return bad("dimension exceeds i32".into());
        }
        if m.div_ceil(TILE_M) > 65535 {
            return bad("M exceeds 65535 tiles".into());
        }
        if n % 8 != 0 || k % 8 != 0 {
            return bad("N and K must be multiples of 8".into());
        }
        if lda % 8 != 0 || ldb % 8 != 0 || ldc % 8 != 0 {
            return bad(format!(
                "leading dimensions must be multiples of 8 (lda {lda}, ldb {ldb}, ldc {ldc})"
            ));
        }
        if lda < k || ldb < n || ldc < n {
            return bad(format!(
                "leading dimension smaller than a row (lda {lda}, ldb {ldb}, ldc {ldc})"
            ));
        }
        if !(aligned16(a) && aligned16(b) && aligned16(c)) {
            return bad("pointers must be 16-byte aligned".into());
        }
        Ok(())
    }

    /// Enqueues C = A · B (contiguous row-major) on `stream`, shaped to at
    /// most `blocks_per_sm` blocks per SM.
    ///
    /// # Safety
    /// `a`, `b`, `c` must be device memory of the stream's device holding
    /// M×K, K×N and M×N bf16; C must not overlap A or B; `stream` must be live.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
        &self,
        stream: sys::CUstream,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        m: usize,
        n: usize,
        k: usize,
        blocks_per_sm: Option<u32>,
    ) -> Result<()> {
        self.launch_ld(stream, a, k, b, n, c, n, m, n, k, blocks_per_sm)
    }

    /// As [`ShapedGemm::launch`] with leading dimensions (elements).
    ///
    /// # Safety
    /// As [`ShapedGemm::launch`], each matrix at its leading dimension.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_ld(
        &self,
        stream: sys::CUstream,
        a: DevicePtr,
        lda: usize,
        b: DevicePtr,
        ldb: usize,
        c: DevicePtr,
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
        blocks_per_sm: Option<u32>,
    ) -> Result<()> {
        Self::check_shape(a, lda, b, ldb, c, ldc, m, n, k)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let extra = self.gemm.extra_smem(blocks_per_sm)?;
        let (mut pa, mut pb, mut pc) = (a, b, c);
        let (mut mi, mut ni, mut ki) = (m as i32, n as i32, k as i32);
        let (mut la, mut lb, mut lc) = (lda as i64, ldb as i64, ldc as i64);
        let mut params: [*mut c_void; 9] = [
            &mut pa as *mut DevicePtr as *mut c_void,
            &mut pb as *mut DevicePtr as *mut c_void,
            &mut pc as *mut DevicePtr as *mut c_void,
            &mut mi as *mut i32 as *mut c_void,
            &mut ni as *mut i32 as *mut c_void,
            &mut ki as *mut i32 as *mut c_void,
            &mut la as *mut i64 as *mut c_void,
            &mut lb as *mut i64 as *mut c_void,
            &mut lc as *mut i64 as *mut c_void,
        ];
        let grid = (n.div_ceil(TILE_N) as u32, m.div_ceil(TILE_M) as u32, 1);
        self.gemm.kernel().launch(
            stream,
            grid,
            (GEMM_THREADS, 1, 1),
            extra as u32,
            &mut params,
        )
    }

    /// Enqueues y = GELU(y + bias) (exact erf GELU, in place) over `rows` ×
    /// `cols` bf16 at leading dimension `ld`; `bias` holds `cols` bf16 or is
    /// `None`. Shaped like the GEMM.
    ///
    /// # Safety
    /// `y` and `bias` must be device memory of the stream's device of the
    /// sizes given; `stream` must be live.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn bias_gelu(
        &self,
        stream: sys::CUstream,
        y: DevicePtr,
        ld: usize,
        rows: usize,
        cols: usize,
        bias: Option<DevicePtr>,
        blocks_per_sm: Option<u32>,
    ) -> Result<()> {
        if ld < cols {
            return Err(CudaError::Plan(format!(
                "bias+GELU: leading dimension {ld} < {cols} columns"
            )));
        }
        let work = (rows * cols) as u64;
        if work == 0 {
            return Ok(());
        }
        let extra = self.epilogue.extra_smem(blocks_per_sm)?;
        let per_sm = self.epilogue.occupancy(blocks_per_sm)?.max(1) as u64;
        let blocks = work
            .div_ceil(EPILOGUE_THREADS as u64)
            .clamp(1, self.sms as u64 * per_sm) as u32;
        let (mut py, mut pbias) = (y, bias.unwrap_or(DevicePtr::NULL));
        let (mut r, mut c, mut l) = (rows as u64, cols as u64, ld as u64);
        let mut params: [*mut c_void; 5] = [
            &mut py as *mut DevicePtr as *mut c_void,
            &mut pbias as *mut DevicePtr as *mut c_void,
            &mut r as *mut u64 as *mut c_void,
            &mut c as *mut u64 as *mut c_void,
            &mut l as *mut u64 as *mut c_void,
        ];
        self.epilogue.kernel().launch(
            stream,
            (blocks, 1, 1),
            (EPILOGUE_THREADS, 1, 1),
            extra as u32,
            &mut params,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_checked() {
        let z = DevicePtr::NULL;
        let ok = ShapedGemm::check_shape(z, 64, z, 72, z, 72, 100, 72, 64);
        assert!(ok.is_ok(), "{ok:?}");
        for (m, n, k, lda, ldb, ldc, p) in [
            (16, 12, 64, 64, 12, 12, 0), // N not a multiple of 8
            (16, 16, 60, 60, 16, 16, 0), // K not a multiple of 8
            (16, 16, 64, 32, 16, 16, 0), // lda < K
            (16, 16, 64, 64, 16, 16, 8), // misaligned pointer
        ] {
            assert!(matches!(
                ShapedGemm::check_shape(DevicePtr(p), lda, z, ldb, z, ldc, m, n, k),
                Err(CudaError::Plan(_))
            ));
        }
    }

    /// Compiles the kernels for Hopper when NVRTC is loadable (no GPU needed).
    #[test]
    fn kernels_compile_for_sm90_when_nvrtc_present() {
        if !crate::driver::nvrtc_present() {
            eprintln!("SKIPPED: kernels_compile_for_sm90_when_nvrtc_present: NVRTC not found");
            return;
        }
        match crate::nvrtc::compile("ficco_shaped", SRC, crate::nvrtc::DEFAULT_OPTIONS, "sm_90") {
            Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "not a CUBIN"),
            Err(e) => panic!("{e}"),
        }
    }
}
