//! The few utility kernels ficco launches itself (random fill, reduce,
//! output check), compiled at run time by [`crate::nvrtc`] to a CUBIN for
//! the device's own architecture (sm_90 on Hopper), cached, and loaded once
//! per device.
//!
//! - `ficco_fill`: hash-RNG fill, bf16 values ~U(-1, 1) (inputs are never zeros).
//! - `ficco_reduce`: dst = sum of up to 8 strided bf16 views, f32 accumulation,
//!   16-byte loads and stores where the views allow it.
//! - `ficco_check`: sum of squared differences, sum of squared reference and NaN
//!   count of two bf16 arrays, reduced on the device.
//! - `ficco_signal`: one warp that does a batch of flag operations in order
//!   (wait for a word, write a word, clear words), in place of stream memory
//!   operations where no GEMM can run beside it ([`crate::driver::cuda::signal_kernel`]).
//!
//! bf16 is handled as raw 16-bit words so no CUDA header is needed.

use crate::error::{drv, Result};
use crate::mem::DevicePtr;
use crate::nvrtc;
use cudarc::driver::{CudaContext, CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// Most source views of one Reduce task.
pub const MAX_REDUCE_SRCS: usize = 8;

const SRC: &str = r#"
typedef unsigned short bf16;
__device__ __forceinline__ float b2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2b(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
__device__ __forceinline__ unsigned mix(unsigned x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x;
}

extern "C" __global__ void ficco_fill(bf16* p, unsigned long long n, unsigned seed) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned h = mix((unsigned)i ^ mix(seed ^ mix((unsigned)(i >> 32) + 0x9e3779b9u)));
        float u = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
        p[i] = f2b(u);
    }
}

struct Srcs { unsigned long long p[8]; unsigned long long ld[8]; };

extern "C" __global__ void ficco_reduce(Srcs s, int nsrc, bf16* dst, unsigned long long ldd,
                                        unsigned long long rows, unsigned long long cols, int vec) {
    unsigned long long per_row = vec ? cols / 8 : cols;
    unsigned long long total = rows * per_row;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        unsigned long long r = idx / per_row;
        unsigned long long c = (idx - r * per_row) * (vec ? 8 : 1);
        if (vec) {
            float acc[8];
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] = 0.0f;
            for (int j = 0; j < nsrc; j++) {
                const bf16* src = (const bf16*)s.p[j] + r * s.ld[j] + c;
                uint4 v = *(const uint4*)src;
                unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    acc[2 * e] += b2f((bf16)(w[e] & 0xffffu));
                    acc[2 * e + 1] += b2f((bf16)(w[e] >> 16));
                }
            }
            unsigned o[4];
#pragma unroll
            for (int e = 0; e < 4; e++) o[e] = (unsigned)f2b(acc[2 * e]) | ((unsigned)f2b(acc[2 * e + 1]) << 16);
            *(uint4*)(dst + r * ldd + c) = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
            float acc = 0.0f;
            for (int j = 0; j < nsrc; j++) acc += b2f(((const bf16*)s.p[j])[r * s.ld[j] + c]);
            dst[r * ldd + c] = f2b(acc);
        }
    }
}

extern "C" __global__ void ficco_check(const bf16* out, const bf16* ref, unsigned long long n,
                                       double* acc, unsigned long long* nans) {
    double sd = 0.0, sr = 0.0;
    unsigned long long nn = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float o = b2f(out[i]);
        float r = b2f(ref[i]);
        if (o != o) { nn++; } else { double d = (double)o - (double)r; sd += d * d; }
        sr += (double)r * (double)r;
    }
    for (int off = 16; off > 0; off >>= 1) {
        sd += __shfl_down_sync(0xffffffffu, sd, off);
        sr += __shfl_down_sync(0xffffffffu, sr, off);
        nn += __shfl_down_sync(0xffffffffu, nn, off);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&acc[0], sd);
        atomicAdd(&acc[1], sr);
        atomicAdd(nans, nn);
    }
}

// Flag operations in order, by one thread (the layout of SignalOps in
// driver/cuda/signals.rs). 0: wait until the word is >= arg (wrap-aware, as
// CU_STREAM_WAIT_VALUE_GEQ); 1: write arg after a system-scope fence (as a
// default cuStreamWriteValue32); 2: zero arg words. Before it spins on a
// wait, a fence pushes the writes out: nothing bounds when a store the
// thread leaves behind becomes visible while it spins, and a peer or the
// host (the watch's host-mapped words) may be waiting for it (one H200: the
// host saw such a write 158 us after the launch without the fence, 17 us
// with it; bench/signal_kernel.py --host-visibility).
struct SignalOps { unsigned long long addr[32]; unsigned arg[32]; unsigned kind[32]; unsigned n; };

extern "C" __global__ void __launch_bounds__(32) ficco_signal(SignalOps s) {
    if (threadIdx.x != 0) return;
    bool wrote = false;
    for (unsigned i = 0; i < s.n && i < 32; i++) {
        unsigned* p = (unsigned*)s.addr[i];
        unsigned v = s.arg[i];
        if (s.kind[i] == 0) {
            if (wrote) {
                asm volatile("fence.sc.sys;" ::: "memory");
                wrote = false;
            }
            for (;;) {
                unsigned x;
                asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(x) : "l"(p) : "memory");
                if ((int)(x - v) >= 0) break;
                __nanosleep(64);
            }
        } else if (s.kind[i] == 1) {
            asm volatile("fence.sc.sys;\n\tst.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
            wrote = true;
        } else {
            for (unsigned j = 0; j < v; j++)
                asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(p + j), "r"(0u) : "memory");
            asm volatile("fence.sc.sys;" ::: "memory");
        }
    }
}
"#;

/// Source pointers and leading dimensions (elements) of a reduce, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ReduceSrcs {
    pub p: [DevicePtr; MAX_REDUCE_SRCS],
    pub ld: [u64; MAX_REDUCE_SRCS],
}

// SAFETY: plain-old-data with the same layout as `struct Srcs` in the kernel.
unsafe impl DeviceRepr for ReduceSrcs {}

/// The kernels, loaded on one device.
#[derive(Debug, Clone)]
pub struct Kernels {
    pub fill: CudaFunction,
    pub reduce: CudaFunction,
    pub check: CudaFunction,
    pub signal: CudaFunction,
    sms: u32,
}

impl Kernels {
    /// Compiles (once per architecture) and loads the kernels on `ctx`'s device.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let cc = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute(compute capability)"))?;
        let cubin = nvrtc::cubin(
            "ficco kernels",
            SRC,
            nvrtc::DEFAULT_OPTIONS,
            &nvrtc::arch_of(cc),
        )?;
        ficco_core::settings::trace(|| format!("kernels: {}", cubin.stats));
        let module = ctx
            .load_module(Ptx::from_binary((*cubin.image).clone()))
            .map_err(drv("cuModuleLoadData"))?;
        let f = |name: &'static str| {
            module
                .load_function(name)
                .map_err(drv("cuModuleGetFunction"))
        };
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(drv("cuDeviceGetAttribute(SM count)"))?;
        let k = Kernels {
            fill: f("ficco_fill")?,
            reduce: f("ficco_reduce")?,
            check: f("ficco_check")?,
            signal: f("ficco_signal")?,
            sms: sms.max(1) as u32,
        };
        k.warm(ctx)?;
        Ok(k)
    }

    /// Launches each kernel once on a scratch buffer: CUDA loads kernels
    /// lazily, and loading inside a running multi-GPU plan can deadlock.
    fn warm(&self, ctx: &Arc<CudaContext>) -> Result<()> {
        let buf = crate::mem::DeviceBuffer::alloc(ctx, 256)?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let p = buf.ptr();
        let mut srcs = ReduceSrcs::default();
        srcs.p[0] = p;
        srcs.ld[0] = 8;
        // SAFETY: 256 bytes hold 64 bf16 (fill, reduce 1 x 8 into byte 64) and
        // the 24-byte accumulator at byte 128.
        unsafe {
            self.fill(&stream, p, 64, 1)?;
            self.reduce(&stream, &srcs, 1, p.offset(64), 8, 1, 8)?;
            self.check(&stream, p, p, 8, p.offset(128), p.offset(144))?;
            crate::driver::cuda::signal_kernel(
                self.signal.cu_function(),
                stream.cu_stream(),
                &[crate::driver::cuda::MemOp::Write(p.offset(200), 1)],
            )?;
        }
        stream.synchronize().map_err(drv("cuStreamSynchronize"))
    }

    /// A grid-stride launch over `work` items: at most 8 blocks per SM of 256 threads.
    pub fn grid(&self, work: u64) -> LaunchConfig {
        let blocks = work.div_ceil(256).clamp(1, self.sms as u64 * 8) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Fills `n` bf16 at `ptr` with ~U(-1, 1) values from `seed`.
    ///
    /// # Safety
    /// `ptr` must hold `n` bf16 on `stream`'s device.
    pub unsafe fn fill(
        &self,
        stream: &cudarc::driver::CudaStream,
        ptr: DevicePtr,
        n: u64,
        seed: u32,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        stream
            .launch_builder(&self.fill)
            .arg(&ptr)
            .arg(&n)
            .arg(&seed)
            .launch(self.grid(n))
            .map_err(drv("cuLaunchKernel(ficco_fill)"))?;
        Ok(())
    }

    /// dst[rows, cols] (leading dim `ldd`) = sum of the sources.
    ///
    /// # Safety
    /// Every pointer must hold `rows` rows of `cols` bf16 at its leading dimension,
    /// reachable from `stream`'s device.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        stream: &cudarc::driver::CudaStream,
        srcs: &ReduceSrcs,
        nsrc: usize,
        dst: DevicePtr,
        ldd: u64,
        rows: u64,
        cols: u64,
    ) -> Result<()> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let aligned = |p: DevicePtr, ld: u64| p.is_aligned(16) && ld % 8 == 0;
        let vec =
            cols % 8 == 0 && aligned(dst, ldd) && (0..nsrc).all(|j| aligned(srcs.p[j], srcs.ld[j]));
        let work = if vec { rows * cols / 8 } else { rows * cols };
        let nsrc_i = nsrc as i32;
        let vec_i = vec as i32;
        stream
            .launch_builder(&self.reduce)
            .arg(srcs)
            .arg(&nsrc_i)
            .arg(&dst)
            .arg(&ldd)
            .arg(&rows)
            .arg(&cols)
            .arg(&vec_i)
            .launch(self.grid(work))
            .map_err(drv("cuLaunchKernel(ficco_reduce)"))?;
        Ok(())
    }

    /// Accumulates into `acc` (two f64: sum sq diff, sum sq ref) and `nans` (one u64).
    ///
    /// # Safety
    /// `out` and `reference` hold `n` bf16 reachable from the stream's device;
    /// `acc` and `nans` are device memory of that device, zeroed beforehand.
    pub unsafe fn check(
        &self,
        stream: &cudarc::driver::CudaStream,
        out: DevicePtr,
        reference: DevicePtr,
        n: u64,
        acc: DevicePtr,
        nans: DevicePtr,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        stream
            .launch_builder(&self.check)
            .arg(&out)
            .arg(&reference)
            .arg(&n)
            .arg(&acc)
            .arg(&nans)
            .launch(self.grid(n))
            .map_err(drv("cuLaunchKernel(ficco_check)"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// Compiles the kernels for Hopper (needs NVRTC, no GPU).
    #[test]
    #[ignore = "needs NVRTC (.ci/run and bench/gpu-tests.sh run it: --include-ignored)"]
    fn kernels_compile_for_sm90() {
        crate::loader::require_nvrtc("kernels_compile_for_sm90");
        match crate::nvrtc::compile(
            "ficco kernels",
            super::SRC,
            crate::nvrtc::DEFAULT_OPTIONS,
            "sm_90",
        ) {
            Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "not a CUBIN"),
            Err(e) => panic!("{e}"),
        }
    }
}
