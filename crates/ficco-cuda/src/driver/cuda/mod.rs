//! CUDA driver API calls (`cuda.h`): devices, contexts, memory, streams,
//! events, context-independent libraries and kernels, green contexts; stream
//! memory operations and pinned host memory ([`signals`]); virtual memory
//! shared across processes ([`vmm`]).
//!
//! Every function checks its `CUresult` into [`CudaError::Driver`] naming the
//! call. Functions that take a driver handle or a device address are
//! `unsafe`: the handle must be live and the address must hold what the call
//! reads or writes.

use super::DevicePtr;
use crate::error::{check, CudaError, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr};

mod signals;
mod vmm;
pub(crate) use signals::*;
pub(crate) use vmm::*;

// ---------------------------------------------------------------------------
// Driver, devices

/// Initialises the driver and returns the device count; no device is
/// [`CudaError::NoGpu`], any other `cuInit` failure (a stub library, a
/// driver/kernel-module mismatch, no permission) [`CudaError::DriverInit`]:
/// either way there is no usable GPU here. The caller has checked that
/// libcuda is usable ([`crate::loader::require_driver`]).
pub(crate) fn init_and_count() -> Result<usize> {
    // SAFETY: cuInit takes no pointers; the library is present (caller).
    let r = unsafe { sys::cuInit(0) };
    if r == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return Err(CudaError::NoGpu(
            "cuInit: CUDA_ERROR_NO_DEVICE (the driver sees no GPU)".into(),
        ));
    }
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::DriverInit { code: r });
    }
    let mut n = 0;
    // SAFETY: valid out-pointer after cuInit.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    if n <= 0 {
        return Err(CudaError::NoGpu("cuDeviceGetCount returned 0".into()));
    }
    Ok(n as usize)
}

/// The device handle of an ordinal (`ordinal` < device count).
pub(crate) fn device(ordinal: usize) -> Result<sys::CUdevice> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; the driver checks the ordinal.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    })?;
    Ok(dev)
}

/// The device's marketing name.
pub(crate) fn device_name(dev: sys::CUdevice) -> Result<String> {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: a buffer of the given length; the driver NUL-terminates.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
    })?;
    let bytes: Vec<u8> = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Total device memory in bytes.
pub(crate) fn device_total_mem(dev: sys::CUdevice) -> Result<usize> {
    let mut mem = 0usize;
    // SAFETY: valid out-pointer; the driver checks the handle.
    check("cuDeviceTotalMem", unsafe {
        sys::cuDeviceTotalMem_v2(&mut mem, dev)
    })?;
    Ok(mem)
}

/// An integer device attribute.
/// See [cuDeviceGetAttribute](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html).
pub(crate) fn device_attribute(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer; the driver checks the handle.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, a, dev)
    })?;
    Ok(v)
}

/// A peer-to-peer attribute between two device ordinals.
pub(crate) fn p2p_attribute(from: usize, to: usize, a: sys::CUdevice_P2PAttribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer; ordinals are device handles (CUdevice == ordinal).
    check("cuDeviceGetP2PAttribute", unsafe {
        sys::cuDeviceGetP2PAttribute(&mut v, a, from as i32, to as i32)
    })?;
    Ok(v)
}

/// Whether `dev` can access `peer`'s memory directly.
pub(crate) fn can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut v = 0;
    // SAFETY: valid out-pointer; the driver checks the handles.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut v, dev, peer)
    })?;
    Ok(v != 0)
}

// ---------------------------------------------------------------------------
// Contexts

/// Lets the current context reach `peer`'s memory; already enabled is fine.
///
/// # Safety
/// A context must be current and `peer` must be a live context.
pub(crate) unsafe fn enable_peer_access(peer: sys::CUcontext) -> Result<()> {
    let r = sys::cuCtxEnablePeerAccess(peer, 0);
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check("cuCtxEnablePeerAccess", r)
}

/// The current context's stream priority range, `(least, greatest)`;
/// numerically lower is greater priority.
pub(crate) fn stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: valid out-pointers; the driver reports an error without a context.
    check("cuCtxGetStreamPriorityRange", unsafe {
        sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
    })?;
    Ok((least, greatest))
}

/// Runs `f` with `stream`'s own context current (a green context for green
/// streams), restoring the previous one after, also when `f` fails.
///
/// # Safety
/// `stream` must be a live stream.
pub(crate) unsafe fn with_stream_ctx<T>(
    stream: sys::CUstream,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let mut ctx = std::ptr::null_mut();
    check("cuStreamGetCtx", sys::cuStreamGetCtx(stream, &mut ctx))?;
    check("cuCtxPushCurrent", sys::cuCtxPushCurrent_v2(ctx))?;
    let res = f();
    let mut popped = std::ptr::null_mut();
    let pop = check("cuCtxPopCurrent", sys::cuCtxPopCurrent_v2(&mut popped));
    res.and_then(|v| pop.map(|_| v))
}

// ---------------------------------------------------------------------------
// Memory

/// `cuMemAlloc` of `bytes` (> 0) in the current context.
pub(crate) fn mem_alloc(bytes: usize) -> Result<DevicePtr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the driver reports an error without a context.
    check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
    Ok(DevicePtr(ptr))
}

/// Frees a `cuMemAlloc` allocation. Errors on teardown cannot be reported.
///
/// # Safety
/// `ptr` came from [`mem_alloc`] and is freed once; its context is current.
pub(crate) unsafe fn mem_free(ptr: DevicePtr) {
    let _ = sys::cuMemFree_v2(ptr.raw());
}

/// Stream-ordered host-to-device copy of `src.len()` bytes from pageable
/// memory: the driver stages `src` before it returns (so the caller may
/// drop it), and the copy runs in `stream`'s order. Not under capture (a
/// captured node would read `src` at every replay).
///
/// # Safety
/// `dst` must hold `src.len()` bytes; `stream` is live on its context.
pub(crate) unsafe fn memcpy_htod_async(
    dst: DevicePtr,
    src: &[u8],
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemcpyHtoDAsync",
        sys::cuMemcpyHtoDAsync_v2(dst.raw(), src.as_ptr() as *const c_void, src.len(), stream),
    )
}

/// Synchronous host-to-device copy of `src.len()` bytes.
///
/// # Safety
/// `dst` must hold `src.len()` bytes; its context (or a peer's) is current.
pub(crate) unsafe fn memcpy_htod(dst: DevicePtr, src: &[u8]) -> Result<()> {
    check(
        "cuMemcpyHtoD",
        sys::cuMemcpyHtoD_v2(dst.raw(), src.as_ptr() as *const c_void, src.len()),
    )
}

/// Synchronous device-to-host copy of `dst.len()` bytes.
///
/// # Safety
/// `src` must hold `dst.len()` bytes; its context (or a peer's) is current.
pub(crate) unsafe fn memcpy_dtoh(dst: &mut [u8], src: DevicePtr) -> Result<()> {
    check(
        "cuMemcpyDtoH",
        sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src.raw(), dst.len()),
    )
}

/// Stream-ordered device-to-device copy.
///
/// # Safety
/// Both addresses hold `bytes` bytes reachable from the stream's device;
/// `stream` is live.
pub(crate) unsafe fn memcpy_dtod_async(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemcpyDtoDAsync",
        sys::cuMemcpyDtoDAsync_v2(dst.raw(), src.raw(), bytes, stream),
    )
}

/// Stream-ordered copy between any two devices' memory (unified
/// addressing, copy engines). Unlike `cuMemcpyPeerAsync`, which stream
/// capture rejects, it can be captured into a CUDA graph.
///
/// # Safety
/// Both addresses hold `bytes` bytes in live allocations, peer access is
/// enabled between their devices; `stream` is live.
pub(crate) unsafe fn memcpy_async(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemcpyAsync",
        sys::cuMemcpyAsync(dst.raw(), src.raw(), bytes, stream),
    )
}

/// Stream-ordered pitched copy of `rows` rows of `width` bytes between
/// device memory (unified addressing: any device).
///
/// # Safety
/// Each end holds `rows` rows of `width` bytes at its pitch; `stream` is live.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn memcpy_2d_async(
    src: DevicePtr,
    src_pitch: usize,
    dst: DevicePtr,
    dst_pitch: usize,
    width: usize,
    rows: usize,
    stream: sys::CUstream,
) -> Result<()> {
    let p = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src.raw(),
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.raw(),
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: rows,
    };
    check("cuMemcpy2DAsync", sys::cuMemcpy2DAsync_v2(&p, stream))
}

/// Stream-ordered device-to-host copy.
///
/// # Safety
/// `src` holds `dst.len()` bytes; `stream` is live; the host slice stays
/// borrowed until the stream is synchronized.
// Only the GPU unit tests read device memory back on a stream.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: &mut [u8],
    src: DevicePtr,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemcpyDtoHAsync",
        sys::cuMemcpyDtoHAsync_v2(
            dst.as_mut_ptr() as *mut c_void,
            src.raw(),
            dst.len(),
            stream,
        ),
    )
}

/// Fill of `count` 32-bit words (`cuMemsetD32`, on the legacy stream: a
/// caller whose other streams must see it synchronizes the context).
///
/// # Safety
/// `ptr` holds `count` 32-bit words of the current context's device.
pub(crate) unsafe fn memset_d32(ptr: DevicePtr, value: u32, count: usize) -> Result<()> {
    check("cuMemsetD32", sys::cuMemsetD32_v2(ptr.raw(), value, count))
}

/// Stream-ordered fill of `count` bytes.
///
/// # Safety
/// `ptr` holds `count` bytes on the stream's device; `stream` is live.
pub(crate) unsafe fn memset_d8_async(
    ptr: DevicePtr,
    value: u8,
    count: usize,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemsetD8Async",
        sys::cuMemsetD8Async(ptr.raw(), value, count, stream),
    )
}

/// Stream-ordered fill of `count` 16-bit words.
///
/// # Safety
/// `ptr` holds `count` 16-bit words on the stream's device; `stream` is live.
pub(crate) unsafe fn memset_d16_async(
    ptr: DevicePtr,
    value: u16,
    count: usize,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        "cuMemsetD16Async",
        sys::cuMemsetD16Async(ptr.raw(), value, count, stream),
    )
}

// ---------------------------------------------------------------------------
// Streams and events

/// Blocks until all work on the stream is done.
///
/// # Safety
/// `stream` must be live.
pub(crate) unsafe fn stream_synchronize(stream: sys::CUstream) -> Result<()> {
    check("cuStreamSynchronize", sys::cuStreamSynchronize(stream))
}

/// Launches an instantiated graph on `stream`.
///
/// # Safety
/// `exec` and `stream` must be live on the current context.
pub(crate) unsafe fn graph_launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    check("cuGraphLaunch", sys::cuGraphLaunch(exec, stream))
}

/// How many nodes of each type `graph` holds, by type name, and its
/// edges (`"edges"`): what its launch has to set up (for traces of the
/// call path's host cost).
///
/// # Safety
/// `graph` must be a live graph.
pub(crate) unsafe fn graph_census(graph: sys::CUgraph) -> Result<Vec<(String, usize)>> {
    let mut n = 0usize;
    check(
        "cuGraphGetNodes",
        sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n),
    )?;
    let mut nodes = vec![std::ptr::null_mut(); n];
    check(
        "cuGraphGetNodes",
        sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n),
    )?;
    let mut counts: Vec<(String, usize)> = Vec::new();
    for &node in nodes.iter().take(n) {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check("cuGraphNodeGetType", sys::cuGraphNodeGetType(node, &mut t))?;
        let name = format!("{t:?}")
            .trim_start_matches("CU_GRAPH_NODE_TYPE_")
            .to_lowercase();
        match counts.iter_mut().find(|(k, _)| *k == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    // Forks, joins and cross-stream waits; a launch was measured to pay
    // nothing for them beyond their nodes (`bench/graph_launch.py`), but
    // they show the graph's shape.
    counts.push(("edges".into(), graph_edges(graph)?.len()));
    Ok(counts)
}

/// Whether `graph` has an edge from a kernel's launch (a `LAUNCH_ORDER`
/// port: a stream captured waiting on a launch-completion event).
///
/// # Safety
/// `graph` must be a live graph.
pub(crate) unsafe fn graph_has_launch_order_edge(graph: sys::CUgraph) -> Result<bool> {
    let port = sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER as u8;
    Ok(graph_edges(graph)?.iter().any(|e| e.from_port == port))
}

/// Every edge's data (ports and type) of `graph`.
///
/// # Safety
/// `graph` must be a live graph.
unsafe fn graph_edges(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphEdgeData>> {
    let mut n = 0usize;
    let null = std::ptr::null_mut::<sys::CUgraphNode>;
    check(
        "cuGraphGetEdges_v2",
        sys::cuGraphGetEdges_v2(graph, null(), null(), std::ptr::null_mut(), &mut n),
    )?;
    let mut from: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    let mut to = from.clone();
    // SAFETY: a plain C struct; all-zero is the default edge.
    let mut data: Vec<sys::CUgraphEdgeData> = vec![std::mem::zeroed(); n];
    check(
        "cuGraphGetEdges_v2",
        sys::cuGraphGetEdges_v2(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        ),
    )?;
    data.truncate(n);
    Ok(data)
}

/// Writes `graph` to `path` as Graphviz DOT with every node's parameters
/// (`cuGraphDebugDotPrint`, verbose): what its launches set up.
///
/// # Safety
/// `graph` must be a live graph.
pub(crate) unsafe fn graph_dot_print(graph: sys::CUgraph, path: &std::path::Path) -> Result<()> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| CudaError::Plan(format!("{} has a NUL byte", path.display())))?;
    // 1: CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE.
    check(
        "cuGraphDebugDotPrint",
        sys::cuGraphDebugDotPrint(graph, path.as_ptr(), 1),
    )
}

/// Whether work issued on `stream` is being captured into a CUDA graph
/// (then nothing may synchronize it, or the device).
///
/// # Safety
/// `stream` must be live (0: the legacy default stream).
pub(crate) unsafe fn stream_is_capturing(stream: sys::CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    check(
        "cuStreamIsCapturing",
        sys::cuStreamIsCapturing(stream, &mut status),
    )?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// The priority a stream has.
///
/// # Safety
/// `stream` must be live.
pub(crate) unsafe fn stream_priority(stream: sys::CUstream) -> Result<i32> {
    let mut p = 0;
    check(
        "cuStreamGetPriority",
        sys::cuStreamGetPriority(stream, &mut p),
    )?;
    Ok(p)
}

/// Destroys a stream; errors on teardown cannot be reported.
///
/// # Safety
/// `stream` was created by the driver and is destroyed once.
pub(crate) unsafe fn stream_destroy(stream: sys::CUstream) {
    let _ = sys::cuStreamDestroy_v2(stream);
}

/// A timing event in the current context.
pub(crate) fn event_create() -> Result<sys::CUevent> {
    let mut e = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver reports an error without a context.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
    })?;
    Ok(e)
}

/// Destroys an event; errors on teardown cannot be reported.
///
/// # Safety
/// `e` came from [`event_create`] and is destroyed once.
pub(crate) unsafe fn event_destroy(e: sys::CUevent) {
    let _ = sys::cuEventDestroy_v2(e);
}

/// Records `e` on `stream`.
///
/// # Safety
/// Both handles are live.
pub(crate) unsafe fn event_record(e: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    check("cuEventRecord", sys::cuEventRecord(e, stream))
}

/// Makes `stream`'s later work wait for `e` (`cuStreamWaitEvent`).
///
/// # Safety
/// Both handles are live on the current context's device.
pub(crate) unsafe fn stream_wait_event(stream: sys::CUstream, e: sys::CUevent) -> Result<()> {
    check("cuStreamWaitEvent", sys::cuStreamWaitEvent(stream, e, 0))
}

/// Blocks until `e` has completed.
///
/// # Safety
/// `e` is live.
pub(crate) unsafe fn event_synchronize(e: sys::CUevent) -> Result<()> {
    check("cuEventSynchronize", sys::cuEventSynchronize(e))
}

/// Milliseconds between two completed timing events.
///
/// # Safety
/// Both events are live.
pub(crate) unsafe fn event_elapsed_ms(start: sys::CUevent, end: sys::CUevent) -> Result<f32> {
    let mut ms = 0.0f32;
    check(
        "cuEventElapsedTime",
        sys::cuEventElapsedTime_v2(&mut ms, start, end),
    )?;
    Ok(ms)
}

// ---------------------------------------------------------------------------
// Context-independent libraries and kernels

/// Loads a CUBIN with `cuLibraryLoadData` (no options).
pub(crate) fn library_load_data(image: &[u8]) -> Result<sys::CUlibrary> {
    let mut lib = std::ptr::null_mut();
    // SAFETY: the image outlives the call (the driver copies it); no options.
    check("cuLibraryLoadData", unsafe {
        sys::cuLibraryLoadData(
            &mut lib,
            image.as_ptr() as *const c_void,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    })?;
    Ok(lib)
}

/// Unloads a library; errors on teardown cannot be reported.
///
/// # Safety
/// `lib` was loaded once and is unloaded once; no kernel of it runs or is used after.
pub(crate) unsafe fn library_unload(lib: sys::CUlibrary) {
    let _ = sys::cuLibraryUnload(lib);
}

/// A kernel of a library by its `extern "C"` name.
///
/// # Safety
/// `lib` is loaded.
pub(crate) unsafe fn library_get_kernel(lib: sys::CUlibrary, name: &CStr) -> Result<sys::CUkernel> {
    let mut k = std::ptr::null_mut();
    check(
        "cuLibraryGetKernel",
        sys::cuLibraryGetKernel(&mut k, lib, name.as_ptr()),
    )?;
    Ok(k)
}

/// The kernel's function in the current context (loads it there).
///
/// # Safety
/// `kernel` belongs to a loaded library.
pub(crate) unsafe fn kernel_get_function(kernel: sys::CUkernel) -> Result<sys::CUfunction> {
    let mut f = std::ptr::null_mut();
    check(
        "cuKernelGetFunction",
        sys::cuKernelGetFunction(&mut f, kernel),
    )?;
    Ok(f)
}

/// Sets a function attribute of a kernel on `device`, all contexts.
///
/// # Safety
/// `kernel` belongs to a loaded library.
pub(crate) unsafe fn kernel_set_attribute(
    kernel: sys::CUkernel,
    device: sys::CUdevice,
    attr: sys::CUfunction_attribute,
    value: i32,
) -> Result<()> {
    check(
        "cuKernelSetAttribute",
        sys::cuKernelSetAttribute(attr, value, kernel, device),
    )
}

/// Sets a function attribute in the function's context.
///
/// # Safety
/// `f` is a live function handle.
pub(crate) unsafe fn func_set_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
    value: i32,
) -> Result<()> {
    check(
        "cuFuncSetAttribute",
        sys::cuFuncSetAttribute(f, attr, value),
    )
}

/// A function attribute (static shared memory, registers, ...).
///
/// # Safety
/// `f` is a live function handle.
pub(crate) unsafe fn func_get_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
) -> Result<i32> {
    let mut v = 0;
    check(
        "cuFuncGetAttribute",
        sys::cuFuncGetAttribute(&mut v, attr, f),
    )?;
    Ok(v)
}

/// Blocks per SM the occupancy calculator gives `f` at `threads` threads
/// and `dyn_smem` bytes of dynamic shared memory.
///
/// # Safety
/// `f` is a live function handle.
pub(crate) unsafe fn occupancy_blocks_per_sm(
    f: sys::CUfunction,
    threads: u32,
    dyn_smem: usize,
) -> Result<u32> {
    let mut n = 0;
    check(
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, threads as i32, dyn_smem),
    )?;
    Ok(n.max(0) as u32)
}

/// `cuLaunchKernel` of `f` on `stream`; with `launched`, `cuLaunchKernelEx`
/// that also records that event once every block of the grid has begun
/// (`CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT`; captured, a
/// `LAUNCH_ORDER` edge): a stream that waits for it may run beside the
/// kernel but is never queued behind its launch. The driver calls that
/// best effort (a waiter may be held until the kernel ends), so only a
/// kernel that waits on nothing may rely on it for progress.
///
/// # Safety
/// `params` points to the kernel's arguments, each of the type and layout the
/// kernel declares; every pointer argument is valid for what the kernel does
/// with it; `f` belongs to the current context and `stream` to its device;
/// `launched` is a live event of that context, created without timing.
pub(crate) unsafe fn launch_kernel(
    f: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    dyn_smem: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
    launched: Option<sys::CUevent>,
) -> Result<()> {
    let Some(launched) = launched else {
        return check(
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
        );
    };
    // SAFETY: a plain C struct; all-zero is a valid (IGNORE) attribute.
    let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
    attr.value.launchCompletionEvent.event = launched;
    attr.value.launchCompletionEvent.flags = 0;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: dyn_smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    check(
        "cuLaunchKernelEx",
        sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()),
    )
}

// ---------------------------------------------------------------------------
// Green contexts

/// An all-zero resource (type INVALID), to be filled by the driver.
pub(crate) fn zeroed_resource() -> sys::CUdevResource {
    // SAFETY: a plain C struct for which all-zero is a valid (INVALID-typed) value.
    unsafe { std::mem::zeroed() }
}

/// `(smCount, minSmPartitionSize, smCoscheduledAlignment)` of an SM resource.
pub(crate) fn sm_fields(r: &sys::CUdevResource) -> (u32, u32, u32) {
    // SAFETY: every resource read here was filled by the driver as type SM
    // (or is all-zero), so `sm` is the active member of the union.
    let sm = unsafe { r.__bindgen_anon_1.sm };
    (sm.smCount, sm.minSmPartitionSize, sm.smCoscheduledAlignment)
}

/// The device's whole SM resource.
pub(crate) fn device_sm_resource(dev: sys::CUdevice) -> Result<sys::CUdevResource> {
    let mut r = zeroed_resource();
    // SAFETY: valid out-pointer; the driver checks the device handle.
    check("cuDeviceGetDevResource", unsafe {
        sys::cuDeviceGetDevResource(dev, &mut r, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM)
    })?;
    Ok(r)
}

/// Splits one group of at least `min_count` SMs off `full`: returns
/// `(groups made, the group, the remainder)`.
pub(crate) fn sm_split_by_count(
    full: &sys::CUdevResource,
    min_count: u32,
) -> Result<(u32, sys::CUdevResource, sys::CUdevResource)> {
    let mut groups = 1u32;
    let mut result = zeroed_resource();
    let mut rest = zeroed_resource();
    // SAFETY: one result slot for one group; valid input and remainder.
    check("cuDevSmResourceSplitByCount", unsafe {
        sys::cuDevSmResourceSplitByCount(&mut result, &mut groups, full, &mut rest, 0, min_count)
    })?;
    Ok((groups, result, rest))
}

/// A green context on `dev` holding the SM resource `res`.
pub(crate) fn green_ctx_create(
    dev: sys::CUdevice,
    res: &mut sys::CUdevResource,
) -> Result<sys::CUgreenCtx> {
    let mut desc = std::ptr::null_mut();
    // SAFETY: `res` is one SM resource filled by the driver; valid out-pointer.
    check("cuDevResourceGenerateDesc", unsafe {
        sys::cuDevResourceGenerateDesc(&mut desc, res, 1)
    })?;
    let mut g = std::ptr::null_mut();
    // SAFETY: desc was just generated; CU_GREEN_CTX_DEFAULT_STREAM is the
    // flag the driver requires.
    check("cuGreenCtxCreate", unsafe {
        sys::cuGreenCtxCreate(
            &mut g,
            desc,
            dev,
            sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
        )
    })?;
    Ok(g)
}

/// Destroys a green context; errors on teardown cannot be reported.
///
/// # Safety
/// `g` was created by [`green_ctx_create`], is destroyed once, after its streams.
pub(crate) unsafe fn green_ctx_destroy(g: sys::CUgreenCtx) {
    let _ = sys::cuGreenCtxDestroy(g);
}

/// A non-blocking stream on a green context at a raw priority.
///
/// # Safety
/// `g` is a live green context.
pub(crate) unsafe fn green_stream_create(
    g: sys::CUgreenCtx,
    priority: i32,
) -> Result<sys::CUstream> {
    let mut s = std::ptr::null_mut();
    check(
        "cuGreenCtxStreamCreate",
        sys::cuGreenCtxStreamCreate(
            &mut s,
            g,
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            priority,
        ),
    )?;
    Ok(s)
}

/// The SM resource a green context got.
///
/// # Safety
/// `g` is a live green context.
pub(crate) unsafe fn green_ctx_sm_resource(g: sys::CUgreenCtx) -> Result<sys::CUdevResource> {
    let mut r = zeroed_resource();
    check(
        "cuGreenCtxGetDevResource",
        sys::cuGreenCtxGetDevResource(g, &mut r, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM),
    )?;
    Ok(r)
}
