//! Plain device memory and copy-engine transfers.
//!
//! cudarc allocates from the stream-ordered pool (`cuMemAllocAsync`); a peer copy
//! out of pool memory is staged and ran at 38 GB/s on the H200 machine, against
//! 390 GB/s between `cuMemAlloc` buffers with peer access. So every buffer a plan
//! uses is a [`DeviceBuffer`] from plain `cuMemAlloc`. Peer access and peer copies
//! exist only in cudarc's `sys` layer; this module is the small safe(ish) wrapper
//! in cudarc's style.

use crate::error::{check, Result};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// Device memory from `cuMemAlloc`, freed on drop.
/// See [cuMemAlloc](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1gb82d2a09844a58dd9e744dc31e8aa467).
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) on `ctx`'s device; contents are undefined.
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(crate::error::drv("cuCtxSetCurrent"))?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes.max(1))
        })?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }

    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies host bytes in (synchronous).
    pub fn upload(&self, data: &[u8]) -> Result<()> {
        let n = data.len().min(self.bytes);
        self.ctx
            .bind_to_thread()
            .map_err(crate::error::drv("cuCtxSetCurrent"))?;
        // SAFETY: `n` bytes fit both the host slice and the allocation.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(self.ptr, data.as_ptr() as *const _, n)
        })
    }

    /// Copies `out.len()` bytes out (synchronous).
    pub fn download(&self, out: &mut [u8]) -> Result<()> {
        let n = out.len().min(self.bytes);
        self.ctx
            .bind_to_thread()
            .map_err(crate::error::drv("cuCtxSetCurrent"))?;
        // SAFETY: `n` bytes fit both.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut _, self.ptr, n)
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc and not freed before. Errors on
            // teardown cannot be reported from drop.
            unsafe {
                let _ = sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

/// Whether `dev` can access `peer`'s memory directly.
/// See [cuDeviceCanAccessPeer](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html).
pub fn can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut v = 0;
    // SAFETY: valid out-pointer; device handles come from the driver.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut v, dev, peer)
    })?;
    Ok(v != 0)
}

/// Lets kernels and copies of `ctx` reach `peer`'s memory. Already-enabled is fine.
/// See [cuCtxEnablePeerAccess](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html).
pub fn enable_peer_access(ctx: &Arc<CudaContext>, peer: &Arc<CudaContext>) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(crate::error::drv("cuCtxSetCurrent"))?;
    // SAFETY: both contexts are alive (held by Arc).
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check("cuCtxEnablePeerAccess", r)
}

/// One end of a 2-D copy: base pointer of the view's first element, its context
/// and the row pitch in bytes.
#[derive(Debug, Clone, Copy)]
pub struct CopyEnd {
    pub ptr: sys::CUdeviceptr,
    pub ctx: sys::CUcontext,
    pub pitch: usize,
}

/// Enqueues a copy of `rows` rows of `width` bytes from `src` to `dst` on
/// `stream`, through the copy engines: `cuMemcpyPeerAsync` when both ends are
/// contiguous (pitch == width or one row), else `cuMemcpy2DAsync`.
///
/// See [cuMemcpyPeerAsync](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g82fcecb38018e64b98616a8ac30112f2)
/// and [cuMemcpy2DAsync](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html#group__CUDA__MEM_1g4acf155faeb969d9d21f5433d3d0f274).
///
/// # Safety
/// Both ends must name live device memory that holds `rows` rows of `width`
/// bytes at their pitch; peer access must be enabled between the devices or
/// the copy is staged; nothing may write the ranges while the copy runs.
pub unsafe fn copy_2d_async(
    src: CopyEnd,
    dst: CopyEnd,
    width: usize,
    rows: usize,
    stream: sys::CUstream,
) -> Result<()> {
    if width == 0 || rows == 0 {
        return Ok(());
    }
    let contiguous = rows == 1 || (src.pitch == width && dst.pitch == width);
    if contiguous {
        return check(
            "cuMemcpyPeerAsync",
            sys::cuMemcpyPeerAsync(dst.ptr, dst.ctx, src.ptr, src.ctx, width * rows, stream),
        );
    }
    let p = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src.ptr,
        srcArray: std::ptr::null_mut(),
        srcPitch: src.pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.ptr,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst.pitch,
        WidthInBytes: width,
        Height: rows,
    };
    check("cuMemcpy2DAsync", sys::cuMemcpy2DAsync_v2(&p, stream))
}

/// Fills `count` 16-bit words at `ptr` with `value` on `stream` (NaN poisoning).
///
/// # Safety
/// `ptr` must hold `count` 16-bit words on the stream's device.
pub unsafe fn memset_d16_async(
    ptr: sys::CUdeviceptr,
    value: u16,
    count: usize,
    stream: sys::CUstream,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    check(
        "cuMemsetD16Async",
        sys::cuMemsetD16Async(ptr, value, count, stream),
    )
}
