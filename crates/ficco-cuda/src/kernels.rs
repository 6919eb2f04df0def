//! The few kernels ficco launches itself, compiled at run time by NVRTC to a
//! CUBIN for the device's own architecture (sm_90 on Hopper), once per
//! architecture and loaded once per device.
//!
//! - `ficco_fill`: hash-RNG fill, bf16 values ~U(-1, 1) (inputs are never zeros).
//! - `ficco_reduce`: dst = sum of up to 8 strided bf16 views, f32 accumulation,
//!   16-byte loads and stores where the views allow it.
//! - `ficco_check`: sum of squared differences, sum of squared reference and NaN
//!   count of two bf16 arrays, reduced on the device.
//!
//! bf16 is handled as raw 16-bit words so no CUDA header is needed.

use crate::error::{drv, CudaError, Result};
use cudarc::driver::{CudaContext, CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys, Ptx};
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

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
"#;

/// Source pointers and leading dimensions (elements) of a reduce, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ReduceSrcs {
    pub p: [u64; MAX_REDUCE_SRCS],
    pub ld: [u64; MAX_REDUCE_SRCS],
}

// SAFETY: plain-old-data with the same layout as `struct Srcs` in the kernel.
unsafe impl DeviceRepr for ReduceSrcs {}

/// CUBINs by architecture, compiled once per process.
type CubinCache = Mutex<HashMap<(i32, i32), Arc<Vec<u8>>>>;

fn cubin_cache() -> &'static CubinCache {
    static C: OnceLock<CubinCache> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

fn nvrtc_err(code: nvrtc_sys::nvrtcResult, log: String) -> CudaError {
    CudaError::Nvrtc {
        kernel: "ficco kernels",
        code,
        log,
    }
}

/// Compiles the kernels to a CUBIN for `sm_{major}{minor}`.
fn compile(major: i32, minor: i32) -> Result<Vec<u8>> {
    let src = CString::new(SRC).map_err(|e| CudaError::Plan(e.to_string()))?;
    let prog = nvrtc::create_program(&src, None).map_err(|e| nvrtc_err(e.0, String::new()))?;
    let arch = format!("--gpu-architecture=sm_{major}{minor}");
    // SAFETY: `prog` was just created and is destroyed below, once.
    let out = unsafe {
        let r = nvrtc::compile_program(prog, &[arch.as_str(), "-std=c++17"]);
        let res = match r {
            Err(e) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                Err(nvrtc_err(e.0, log))
            }
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                    Err(nvrtc_err(r, "nvrtcGetCUBINSize".into()))
                } else {
                    let mut buf = vec![0u8; size];
                    let r = nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _);
                    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(nvrtc_err(r, "nvrtcGetCUBIN".into()))
                    } else {
                        Ok(buf)
                    }
                }
            }
        };
        let _ = nvrtc::destroy_program(prog);
        res
    };
    out
}

/// The kernels, loaded on one device.
#[derive(Debug, Clone)]
pub struct Kernels {
    pub fill: CudaFunction,
    pub reduce: CudaFunction,
    pub check: CudaFunction,
    sms: u32,
}

impl Kernels {
    /// Compiles (once per architecture) and loads the kernels on `ctx`'s device.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let cc = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute(compute capability)"))?;
        let cubin = {
            let mut cache = cubin_cache()
                .lock()
                .map_err(|_| CudaError::Plan("kernel cache poisoned".into()))?;
            match cache.get(&cc) {
                Some(c) => c.clone(),
                None => {
                    let c = Arc::new(compile(cc.0, cc.1)?);
                    cache.insert(cc, c.clone());
                    c
                }
            }
        };
        let module = ctx
            .load_module(Ptx::from_binary((*cubin).clone()))
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
        // SAFETY: 256 bytes hold 64 bf16 (fill, reduce 1 x 8 into p + 64) and
        // the 24-byte accumulator at p + 128.
        unsafe {
            self.fill(&stream, p, 64, 1)?;
            self.reduce(&stream, &srcs, 1, p + 64, 8, 1, 8)?;
            self.check(&stream, p, p, 8, p + 128, p + 144)?;
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
        ptr: u64,
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
        dst: u64,
        ldd: u64,
        rows: u64,
        cols: u64,
    ) -> Result<()> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let aligned = |p: u64, ld: u64| p % 16 == 0 && ld % 8 == 0;
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
        out: u64,
        reference: u64,
        n: u64,
        acc: u64,
        nans: u64,
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
    /// Compiles the kernels for Hopper when NVRTC is loadable (no GPU needed).
    #[test]
    fn kernels_compile_for_sm90_when_nvrtc_present() {
        // SAFETY: only dlopen attempts.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        match super::compile(9, 0) {
            Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "not a CUBIN"),
            Err(e) => panic!("{e}"),
        }
    }
}
