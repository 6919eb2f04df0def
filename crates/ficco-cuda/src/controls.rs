//! Resource controls shared by the other control modules: stream priorities,
//! raw streams (green-context streams are not cudarc streams), CUDA-event
//! timing on raw streams, and context-independent NVRTC kernel libraries.
//!
//! The controls of the design space live in their own modules:
//! [`crate::comm`] (NCCL `maxCTAs`/`minCTAs`/CTA policy),
//! [`crate::green`] (green-context SM partitions) and [`crate::hgemm`]
//! (ficco's own GEMM: SM budget and occupancy shaping). This module holds
//! the fourth control, communication stream priority, and the plumbing the
//! others share.
//!
//! Kernels are loaded with the library API (`cuLibraryLoadData`), not
//! `cuModuleLoadData`: a library's kernels can be launched in any context of
//! the device, including green contexts, which a module loaded into the
//! primary context cannot. Sources are compiled by `crate::nvrtc`.

use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::nvrtc;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};
use std::ffi::{c_void, CString};
use std::sync::Arc;

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
        let (least, greatest) = cu::stream_priority_range()?;
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
    cu::stream_priority(stream)
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
        unsafe { cu::stream_synchronize(self.stream) }
    }

    /// The stream's priority.
    pub fn priority(&self) -> Result<i32> {
        // SAFETY: the stream is alive while self is.
        unsafe { stream_priority(self.stream) }
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        // SAFETY: created by the driver, destroyed once.
        unsafe { cu::stream_destroy(self.stream) }
    }
}

/// A CUDA event made in the current context, destroyed on drop.
struct RawEvent(sys::CUevent);

impl RawEvent {
    fn new() -> Result<Self> {
        Ok(RawEvent(cu::event_create()?))
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        unsafe { cu::event_destroy(self.0) }
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
        // SAFETY: the events are alive; the stream is live (caller).
        unsafe {
            cu::event_record(e0.0, stream)?;
            f()?;
            cu::event_record(e1.0, stream)?;
            cu::event_synchronize(e1.0)?;
            out.push(cu::event_elapsed_ms(e0.0, e1.0)?);
        }
    }
    out.sort_by(f32::total_cmp);
    Ok(out)
}

/// Times `f` on `stream` in batches, for runs of a few microseconds: each
/// batch enqueues `warmup` (at least one) untimed runs, records the start
/// event while the GPU is still busy with them (so the host's launch gaps
/// stay out of the measurement), then `per_batch` runs back to back and the
/// end event, and synchronizes only then. Returns each batch's time per
/// run in ms, sorted.
///
/// # Safety
/// `stream` must be a live stream of `ctx`'s device.
pub unsafe fn time_batched_ms(
    ctx: &Arc<CudaContext>,
    stream: sys::CUstream,
    warmup: usize,
    batches: usize,
    per_batch: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f32>> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let (e0, e1) = (RawEvent::new()?, RawEvent::new()?);
    let per_batch = per_batch.max(1);
    let mut out = Vec::with_capacity(batches);
    for _ in 0..batches {
        for _ in 0..warmup.max(1) {
            f()?;
        }
        // SAFETY: the events are alive; the stream is live (caller).
        unsafe {
            cu::event_record(e0.0, stream)?;
            for _ in 0..per_batch {
                f()?;
            }
            cu::event_record(e1.0, stream)?;
            cu::event_synchronize(e1.0)?;
            out.push(cu::event_elapsed_ms(e0.0, e1.0)? / per_batch as f32);
        }
    }
    out.sort_by(f32::total_cmp);
    Ok(out)
}

/// An integer device attribute.
/// See [cuDeviceGetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html).
pub fn device_attribute(ctx: &Arc<CudaContext>, a: sys::CUdevice_attribute) -> Result<i32> {
    ctx.attribute(a).map_err(drv("cuDeviceGetAttribute"))
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
    /// Compiles `src` for `ctx`'s architecture (cached, see `crate::nvrtc`)
    /// with the default options and loads it.
    pub fn load(ctx: &Arc<CudaContext>, name: &'static str, src: &str) -> Result<Self> {
        let cc = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute(compute capability)"))?;
        Self::load_with(ctx, name, src, nvrtc::DEFAULT_OPTIONS, &nvrtc::arch_of(cc))
    }

    /// As [`KernelLibrary::load`] with explicit NVRTC options and
    /// architecture (e.g. `sm_90a` for Hopper-only instructions).
    pub fn load_with(
        ctx: &Arc<CudaContext>,
        name: &'static str,
        src: &str,
        options: &[&str],
        arch: &str,
    ) -> Result<Self> {
        let cubin = nvrtc::cubin(name, src, options, arch)?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let lib = cu::library_load_data(&cubin.image)?;
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
        // SAFETY: the library is loaded while self lives.
        let k = unsafe { cu::library_get_kernel(self.lib, &cname)? };
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
        // SAFETY: loaded once, unloaded once; kernels are not used after
        // (their handles are documented as valid while the library lives).
        unsafe { cu::library_unload(self.lib) }
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
        // SAFETY: the kernel handle is alive (its library lives).
        unsafe { cu::kernel_get_function(self.kernel) }
    }

    /// Sets a function attribute for this kernel on its device, all contexts.
    /// See [cuKernelSetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__LIBRARY.html).
    pub fn set_attribute(&self, attr: sys::CUfunction_attribute, value: i32) -> Result<()> {
        // SAFETY: the kernel handle is alive (its library lives).
        unsafe { cu::kernel_set_attribute(self.kernel, self.device, attr, value) }
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
        cu::with_stream_ctx(stream, || {
            let f = self.function_in_current()?;
            if dyn_smem > 48 * 1024 {
                cu::func_set_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dyn_smem as i32,
                )?;
            }
            cu::launch_kernel(f, grid, block, dyn_smem, stream, params, None)
        })
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
        // SAFETY: a live function of the current context.
        unsafe { cu::occupancy_blocks_per_sm(f, block_threads, dyn_smem) }
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
        // SAFETY: a live function of the current context.
        unsafe { cu::func_get_attribute(f, attr) }
    }
}

// GPU unit tests of the resource controls (they use crate-internal NCCL
// calls, so they live beside the code, not under tests/).
#[cfg(test)]
mod gpu_tests;
