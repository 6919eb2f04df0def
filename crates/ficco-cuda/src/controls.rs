//! Resource controls shared by the other control modules: stream priorities,
//! raw streams (green-context streams are not cudarc streams), CUDA-event
//! timing on raw streams, and context-independent NVRTC kernel libraries.
//!
//! The controls of the design space live in their own modules:
//! [`crate::nccl_config`] (NCCL `maxCTAs`/`minCTAs`/CTA policy),
//! [`crate::green`] (green-context SM partitions) and [`crate::shaped`]
//! (shared-memory occupancy shaping and ficco's own GEMM). This module holds
//! the fourth control, communication stream priority, and the plumbing the
//! others share.
//!
//! Kernels are loaded with the library API (`cuLibraryLoadData`), not
//! `cuModuleLoadData`: a library's kernels can be launched in any context of
//! the device, including green contexts, which a module loaded into the
//! primary context cannot.

use crate::error::{check, drv, CudaError, Result};
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// A device's stream priority range. Numerically lower is greater priority:
/// on H200 `least` is 0 and `greatest` is −5.
/// See [cuCtxGetStreamPriorityRange](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityRange {
    pub least: i32,
    pub greatest: i32,
}

/// The two priority levels a schedule uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamPriority {
    /// The device's least priority (the default of every stream).
    Normal,
    /// The device's greatest priority.
    High,
}

impl PriorityRange {
    /// Reads the range of `ctx`'s device (binds `ctx` to this thread).
    pub fn of(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers; a context is current.
        check("cuCtxGetStreamPriorityRange", unsafe {
            sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        Ok(PriorityRange { least, greatest })
    }

    /// The numeric priority of a level.
    pub fn value(&self, p: StreamPriority) -> i32 {
        match p {
            StreamPriority::Normal => self.least,
            StreamPriority::High => self.greatest,
        }
    }
}

/// A cudarc stream on `ctx` at priority level `p`.
/// See [cuStreamCreateWithPriority](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html).
pub fn priority_stream(ctx: &Arc<CudaContext>, p: StreamPriority) -> Result<Arc<CudaStream>> {
    let range = PriorityRange::of(ctx)?;
    ctx.new_stream_with_priority(range.value(p))
        .map_err(drv("cuStreamCreateWithPriority"))
}

/// The priority a stream actually has.
/// See [cuStreamGetPriority](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html).
///
/// # Safety
/// `stream` must be a live stream handle.
pub unsafe fn stream_priority(stream: sys::CUstream) -> Result<i32> {
    let mut p = 0;
    check(
        "cuStreamGetPriority",
        sys::cuStreamGetPriority(stream, &mut p),
    )?;
    Ok(p)
}

/// A stream created outside cudarc (e.g. on a green context); destroyed on drop.
#[derive(Debug)]
pub struct RawStream {
    pub(crate) stream: sys::CUstream,
}

// SAFETY: CUDA stream handles may be used from any thread.
unsafe impl Send for RawStream {}
// SAFETY: as above; the driver serialises work on the handle.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// The driver handle (valid while `self` lives).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Blocks until all work on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is alive while self is.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }

    /// The stream's priority.
    pub fn priority(&self) -> Result<i32> {
        // SAFETY: the stream is alive while self is.
        unsafe { stream_priority(self.stream) }
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        // SAFETY: created by the driver, destroyed once; errors cannot be reported.
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.stream);
        }
    }
}

/// A CUDA event made in the current context, destroyed on drop.
struct RawEvent(sys::CUevent);

impl RawEvent {
    fn new() -> Result<Self> {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
        })?;
        Ok(RawEvent(e))
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.0);
        }
    }
}

/// Times `f` on `stream` with CUDA events: `warmup` untimed runs, then
/// `iters` timed runs; returns the per-run times in ms, sorted.
/// `ctx` must be the device of `stream` (it is bound to this thread).
/// See [cuEventElapsedTime](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html).
///
/// # Safety
/// `stream` must be a live stream of `ctx`'s device.
pub unsafe fn time_ms(
    ctx: &Arc<CudaContext>,
    stream: sys::CUstream,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f32>> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    for _ in 0..warmup {
        f()?;
    }
    let (e0, e1) = (RawEvent::new()?, RawEvent::new()?);
    let mut out = Vec::with_capacity(iters);
    for _ in 0..iters {
        // SAFETY: events and stream are alive.
        unsafe {
            check("cuEventRecord", sys::cuEventRecord(e0.0, stream))?;
            f()?;
            check("cuEventRecord", sys::cuEventRecord(e1.0, stream))?;
            check("cuEventSynchronize", sys::cuEventSynchronize(e1.0))?;
            let mut ms = 0.0f32;
            check(
                "cuEventElapsedTime",
                sys::cuEventElapsedTime_v2(&mut ms, e0.0, e1.0),
            )?;
            out.push(ms);
        }
    }
    out.sort_by(f32::total_cmp);
    Ok(out)
}

/// Median of sorted times (0 when empty).
pub fn median(sorted: &[f32]) -> f32 {
    if sorted.is_empty() {
        0.0
    } else {
        sorted[sorted.len() / 2]
    }
}

/// An integer device attribute.
/// See [cuDeviceGetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html).
pub fn device_attribute(ctx: &Arc<CudaContext>, a: sys::CUdevice_attribute) -> Result<i32> {
    ctx.attribute(a).map_err(drv("cuDeviceGetAttribute"))
}

// ---------------------------------------------------------------------------
// NVRTC → CUBIN → context-independent library.

fn nvrtc_err(kernel: &'static str, code: nvrtc_sys::nvrtcResult, log: String) -> CudaError {
    CudaError::Nvrtc { kernel, code, log }
}

/// Compiles CUDA C++ `src` (no headers) to a CUBIN for `sm_{major}{minor}`.
pub fn compile_cubin(name: &'static str, src: &str, major: i32, minor: i32) -> Result<Vec<u8>> {
    let csrc = CString::new(src).map_err(|e| CudaError::Plan(e.to_string()))?;
    let prog =
        nvrtc::create_program(&csrc, None).map_err(|e| nvrtc_err(name, e.0, String::new()))?;
    let arch = format!("--gpu-architecture=sm_{major}{minor}");
    // SAFETY: `prog` was just created and is destroyed below, once.
    unsafe {
        let res = match nvrtc::compile_program(prog, &[arch.as_str(), "-std=c++17"]) {
            Err(e) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                Err(nvrtc_err(name, e.0, log))
            }
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                    Err(nvrtc_err(name, r, "nvrtcGetCUBINSize".into()))
                } else {
                    let mut buf = vec![0u8; size];
                    let r = nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _);
                    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(nvrtc_err(name, r, "nvrtcGetCUBIN".into()))
                    } else {
                        Ok(buf)
                    }
                }
            }
        };
        let _ = nvrtc::destroy_program(prog);
        res
    }
}

type CubinKey = (&'static str, i32, i32);
type CubinCache = Mutex<HashMap<CubinKey, Arc<Vec<u8>>>>;

/// Compiles once per (source name, architecture) per process.
pub(crate) fn cached_cubin(
    name: &'static str,
    src: &str,
    major: i32,
    minor: i32,
) -> Result<Arc<Vec<u8>>> {
    static C: OnceLock<CubinCache> = OnceLock::new();
    let cache = C.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (name, major, minor);
    if let Some(c) = cache
        .lock()
        .map_err(|_| CudaError::Plan("cubin cache poisoned".into()))?
        .get(&key)
    {
        return Ok(c.clone());
    }
    let c = Arc::new(compile_cubin(name, src, major, minor)?);
    cache
        .lock()
        .map_err(|_| CudaError::Plan("cubin cache poisoned".into()))?
        .insert(key, c.clone());
    Ok(c)
}

/// A CUBIN loaded with `cuLibraryLoadData`: its kernels can be launched in
/// every context of the device (primary or green). Unloaded on drop.
/// See [Library Management](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__LIBRARY.html).
#[derive(Debug)]
pub struct KernelLibrary {
    lib: sys::CUlibrary,
    ctx: Arc<CudaContext>,
}

// SAFETY: library and kernel handles are context-independent driver objects.
unsafe impl Send for KernelLibrary {}
// SAFETY: as above.
unsafe impl Sync for KernelLibrary {}

impl KernelLibrary {
    /// Compiles `src` for `ctx`'s architecture (once per process) and loads it.
    pub fn load(ctx: &Arc<CudaContext>, name: &'static str, src: &str) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute(compute capability)"))?;
        let cubin = cached_cubin(name, src, major, minor)?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut lib = std::ptr::null_mut();
        // SAFETY: the CUBIN image outlives the call (the driver copies it);
        // no options are passed.
        check("cuLibraryLoadData", unsafe {
            sys::cuLibraryLoadData(
                &mut lib,
                cubin.as_ptr() as *const c_void,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        })?;
        Ok(KernelLibrary {
            lib,
            ctx: ctx.clone(),
        })
    }

    /// The device context the library was loaded from.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A kernel by its `extern "C"` name.
    /// See [cuLibraryGetKernel](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__LIBRARY.html).
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let cname = CString::new(name).map_err(|e| CudaError::Plan(e.to_string()))?;
        let mut k = std::ptr::null_mut();
        // SAFETY: the library is loaded; valid out-pointer and C string.
        check("cuLibraryGetKernel", unsafe {
            sys::cuLibraryGetKernel(&mut k, self.lib, cname.as_ptr())
        })?;
        let kernel = Kernel {
            kernel: k,
            device: self.ctx.cu_device(),
        };
        // Load it into the primary context now (CUDA loads lazily, and a lazy
        // load in the middle of a multi-GPU plan can deadlock).
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        kernel.function_in_current()?;
        Ok(kernel)
    }
}

impl Drop for KernelLibrary {
    fn drop(&mut self) {
        // SAFETY: loaded once, unloaded once.
        unsafe {
            let _ = sys::cuLibraryUnload(self.lib);
        }
    }
}

/// A context-independent kernel handle (valid while its [`KernelLibrary`] lives).
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    kernel: sys::CUkernel,
    device: sys::CUdevice,
}

// SAFETY: kernel handles are context-independent driver objects.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// The kernel's function in the current context.
    /// See [cuKernelGetFunction](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__LIBRARY.html).
    pub fn function_in_current(&self) -> Result<sys::CUfunction> {
        let mut f = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the kernel handle is alive.
        check("cuKernelGetFunction", unsafe {
            sys::cuKernelGetFunction(&mut f, self.kernel)
        })?;
        Ok(f)
    }

    /// Sets a function attribute for this kernel on its device, all contexts.
    /// See [cuKernelSetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__LIBRARY.html).
    pub fn set_attribute(&self, attr: sys::CUfunction_attribute, value: i32) -> Result<()> {
        // SAFETY: the kernel handle is alive.
        check("cuKernelSetAttribute", unsafe {
            sys::cuKernelSetAttribute(attr, value, self.kernel, self.device)
        })
    }

    /// Launches on `stream` in the stream's own context (primary or green):
    /// the context is pushed for the launch and popped after.
    /// See [cuLaunchKernel](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html).
    ///
    /// # Safety
    /// `params` must point to the kernel's arguments, each of the type and
    /// layout the kernel declares; every pointer argument must be valid for
    /// what the kernel does with it; `stream` must be a live stream of the
    /// kernel's device.
    pub unsafe fn launch(
        &self,
        stream: sys::CUstream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        dyn_smem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let mut ctx = std::ptr::null_mut();
        check("cuStreamGetCtx", sys::cuStreamGetCtx(stream, &mut ctx))?;
        check("cuCtxPushCurrent", sys::cuCtxPushCurrent_v2(ctx))?;
        let res = (|| {
            let f = self.function_in_current()?;
            if dyn_smem > 48 * 1024 {
                check(
                    "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                    sys::cuFuncSetAttribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        dyn_smem as i32,
                    ),
                )?;
            }
            check(
                "cuLaunchKernel",
                sys::cuLaunchKernel(
                    f,
                    grid.0,
                    grid.1,
                    grid.2,
                    block.0,
                    block.1,
                    block.2,
                    dyn_smem,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            )
        })();
        let mut popped = std::ptr::null_mut();
        let pop = check("cuCtxPopCurrent", sys::cuCtxPopCurrent_v2(&mut popped));
        res.and(pop)
    }

    /// Blocks per SM the occupancy calculator gives this kernel at
    /// `block_threads` threads and `dyn_smem` bytes of dynamic shared memory
    /// (binds the primary context of `ctx`).
    /// See [cuOccupancyMaxActiveBlocksPerMultiprocessor](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__OCCUPANCY.html).
    pub fn occupancy(
        &self,
        ctx: &Arc<CudaContext>,
        block_threads: u32,
        dyn_smem: usize,
    ) -> Result<u32> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let f = self.function_in_current()?;
        let mut n = 0;
        // SAFETY: valid out-pointer and function.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                f,
                block_threads as i32,
                dyn_smem,
            )
        })?;
        Ok(n.max(0) as u32)
    }

    /// A function attribute (e.g. static shared memory, registers) in the
    /// primary context of `ctx`.
    /// See [cuFuncGetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html).
    pub fn attribute(
        &self,
        ctx: &Arc<CudaContext>,
        attr: sys::CUfunction_attribute,
    ) -> Result<i32> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let f = self.function_in_current()?;
        let mut v = 0;
        // SAFETY: valid out-pointer and function.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(&mut v, attr, f)
        })?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_sorted() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[1.0, 2.0, 3.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), 3.0);
    }
}
