//! Stream memory operations (device-side signal words written and waited
//! on by streams) and pinned, mapped host memory.

use crate::driver::DevicePtr;
use crate::error::{check, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

// ---------------------------------------------------------------------------
// Stream memory operations (device-side signals) and pinned host memory

/// Enqueues on `stream` a write of `value` to the 32-bit word at `addr`
/// once all earlier work of the stream is done. Default flags: the write is
/// preceded by a system-scope memory fence (release), so a peer that sees the
/// value also sees every write of the stream's earlier work.
/// See [cuStreamWriteValue32](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEMOP.html).
///
/// # Safety
/// `stream` is live; `addr` is a 4-byte aligned word of device memory (or
/// mapped pinned host memory) reachable from the stream's device.
pub(crate) unsafe fn stream_write_value32(
    stream: sys::CUstream,
    addr: DevicePtr,
    value: u32,
) -> Result<()> {
    check(
        "cuStreamWriteValue32",
        sys::cuStreamWriteValue32_v2(
            stream,
            addr.raw(),
            value,
            sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
        ),
    )
}

/// Makes `stream` wait (on the device, no host involvement) until the
/// 32-bit word at `addr` is >= `value` (`CU_STREAM_WAIT_VALUE_GEQ`, a
/// wrap-aware comparison: the values used stay far below 2^31 apart).
///
/// # Safety
/// `stream` is live; `addr` is a 4-byte aligned word of device memory
/// reachable from the stream's device that stays allocated until the wait
/// is satisfied.
pub(crate) unsafe fn stream_wait_value32_geq(
    stream: sys::CUstream,
    addr: DevicePtr,
    value: u32,
) -> Result<()> {
    check(
        "cuStreamWaitValue32",
        sys::cuStreamWaitValue32_v2(
            stream,
            addr.raw(),
            value,
            sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        ),
    )
}

/// Stream-ordered fill of `count` 32-bit words.
///
/// # Safety
/// `ptr` holds `count` 32-bit words reachable from the stream's device; `stream` is live.
pub(crate) unsafe fn memset_d32_async(
    ptr: DevicePtr,
    value: u32,
    count: usize,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemsetD32Async",
        sys::cuMemsetD32Async(ptr.raw(), value, count, stream),
    )
}

/// One 32-bit stream memory operation of a batch ([`stream_memops`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemOp {
    /// Wait until the word is >= the value (`CU_STREAM_WAIT_VALUE_GEQ`).
    WaitGeq(DevicePtr, u32),
    /// Write the value after a system-scope release fence (default flags).
    Write(DevicePtr, u32),
}

/// Enqueues `ops` in order on `stream` as one `cuStreamBatchMemOp`: one
/// node in a captured graph instead of one per word, which is what a graph
/// launch pays for. A single operation uses the plain call.
///
/// # Safety
/// Every address is a live, 4-byte aligned device word the stream's device
/// can reach; `stream` is live.
pub(crate) unsafe fn stream_memops(stream: sys::CUstream, ops: &[MemOp]) -> Result<()> {
    match ops {
        [] => Ok(()),
        [MemOp::WaitGeq(a, v)] => stream_wait_value32_geq(stream, *a, *v),
        [MemOp::Write(a, v)] => stream_write_value32(stream, *a, *v),
        _ => {
            let mut params: Vec<sys::CUstreamBatchMemOpParams> = ops
                .iter()
                .map(|op| {
                    // SAFETY: an all-zero union is a valid starting point; the
                    // member written below selects the operation.
                    let mut p: sys::CUstreamBatchMemOpParams = std::mem::zeroed();
                    match *op {
                        MemOp::WaitGeq(a, v) => {
                            p.waitValue.operation =
                                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32;
                            p.waitValue.address = a.raw();
                            p.waitValue.__bindgen_anon_1.value = v;
                            p.waitValue.flags =
                                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
                        }
                        MemOp::Write(a, v) => {
                            p.writeValue.operation =
                                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32;
                            p.writeValue.address = a.raw();
                            p.writeValue.__bindgen_anon_1.value = v;
                            p.writeValue.flags =
                                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
                        }
                    }
                    p
                })
                .collect();
            let n = u32::try_from(params.len()).map_err(|_| {
                crate::error::CudaError::Plan(format!(
                    "{} memory operations in one batch",
                    ops.len()
                ))
            })?;
            check(
                "cuStreamBatchMemOp",
                sys::cuStreamBatchMemOp_v2(stream, n, params.as_mut_ptr(), 0),
            )
        }
    }
}

/// A non-blocking stream of the current context (watchdog side work).
pub(crate) fn stream_create_nonblocking() -> Result<sys::CUstream> {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver reports an error without a context.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    })?;
    Ok(s)
}

/// Pinned host memory mapped into every context's address space
/// (`PORTABLE | DEVICEMAP`): returns the host pointer and its device address.
pub(crate) fn mem_host_alloc_mapped(bytes: usize) -> Result<(*mut c_void, DevicePtr)> {
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a context is current (callers).
    check("cuMemHostAlloc", unsafe {
        sys::cuMemHostAlloc(
            &mut p,
            bytes.max(4),
            sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
        )
    })?;
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: `p` was just allocated mapped; valid out-pointer.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
    if let Err(e) = check("cuMemHostGetDevicePointer", r) {
        // SAFETY: allocated above, freed once.
        unsafe { sys::cuMemFreeHost(p) };
        return Err(e);
    }
    Ok((p, DevicePtr(d)))
}

/// Frees [`mem_host_alloc_mapped`] memory; errors on teardown cannot be reported.
///
/// # Safety
/// `p` came from [`mem_host_alloc_mapped`], is freed once, and no device work uses it.
pub(crate) unsafe fn mem_free_host(p: *mut c_void) {
    let _ = sys::cuMemFreeHost(p);
}

/// Whether all work of `stream` is done (`cuStreamQuery`), without blocking.
///
/// # Safety
/// `stream` must be live.
pub(crate) unsafe fn stream_done(stream: sys::CUstream) -> Result<bool> {
    let r = sys::cuStreamQuery(stream);
    if r == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuStreamQuery", r).map(|_| true)
}
