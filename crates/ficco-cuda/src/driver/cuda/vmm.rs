//! Virtual memory management: allocations exportable to other processes as
//! POSIX file descriptors, imported and mapped by the node's other ranks.

use crate::driver::DevicePtr;
use crate::error::{check, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

// ---------------------------------------------------------------------------
// Virtual memory management: allocations exportable to other processes
// See [Virtual Memory Management](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html).

/// Allocation properties of pinned device memory on `ordinal`, exportable
/// as a POSIX file descriptor.
fn fd_alloc_prop(ordinal: usize) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal as i32,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The granularity (bytes) that sizes and addresses of exportable
/// allocations on `ordinal` must be multiples of (the recommended one).
pub(crate) fn mem_granularity(ordinal: usize) -> Result<usize> {
    let prop = fd_alloc_prop(ordinal);
    let mut g = 0usize;
    // SAFETY: valid out-pointer and a fully initialised property struct.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    })?;
    Ok(g.max(1))
}

/// `cuMemCreate`: `bytes` (a multiple of [`mem_granularity`]) of physical
/// memory on `ordinal`, exportable as a POSIX fd. Release with [`mem_release`].
pub(crate) fn mem_create_fd_exportable(
    ordinal: usize,
    bytes: usize,
) -> Result<sys::CUmemGenericAllocationHandle> {
    let prop = fd_alloc_prop(ordinal);
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer and property struct; the driver checks size.
    check("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut h, bytes, &prop, 0)
    })?;
    Ok(h)
}

/// Exports an allocation as a new POSIX file descriptor (owned by the caller).
///
/// # Safety
/// `h` is a live handle from [`mem_create_fd_exportable`].
pub(crate) unsafe fn mem_export_fd(h: sys::CUmemGenericAllocationHandle) -> Result<i32> {
    let mut fd: std::ffi::c_int = -1;
    check(
        "cuMemExportToShareableHandle",
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            h,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        ),
    )?;
    Ok(fd)
}

/// Imports an allocation another process exported; the fd stays the
/// caller's (the driver does not take it). Release with [`mem_release`].
///
/// # Safety
/// `fd` is an open descriptor from [`mem_export_fd`] of some process.
pub(crate) unsafe fn mem_import_fd(fd: i32) -> Result<sys::CUmemGenericAllocationHandle> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // The POSIX-fd handle type passes the descriptor by value in the pointer.
    check(
        "cuMemImportFromShareableHandle",
        sys::cuMemImportFromShareableHandle(
            &mut h,
            fd as isize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        ),
    )?;
    Ok(h)
}

/// Reserves `bytes` of virtual address space aligned to `align`.
pub(crate) fn mem_address_reserve(bytes: usize, align: usize) -> Result<DevicePtr> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; no fixed address requested.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut p, bytes, align, 0, 0)
    })?;
    Ok(DevicePtr(p))
}

/// Maps the whole of allocation `h` (`bytes`) at `ptr`.
///
/// # Safety
/// `ptr..ptr+bytes` is reserved and unmapped; `h` is live and of `bytes`.
pub(crate) unsafe fn mem_map(
    ptr: DevicePtr,
    bytes: usize,
    h: sys::CUmemGenericAllocationHandle,
) -> Result<()> {
    check("cuMemMap", sys::cuMemMap(ptr.raw(), bytes, 0, h, 0))
}

/// Grants read-write access to a mapped range to each device ordinal.
///
/// # Safety
/// `ptr..ptr+bytes` is mapped.
pub(crate) unsafe fn mem_set_access_rw(
    ptr: DevicePtr,
    bytes: usize,
    ordinals: &[usize],
) -> Result<()> {
    let desc: Vec<sys::CUmemAccessDesc> = ordinals
        .iter()
        .map(|&o| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: o as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    check(
        "cuMemSetAccess",
        sys::cuMemSetAccess(ptr.raw(), bytes, desc.as_ptr(), desc.len()),
    )
}

/// Unmaps a range (teardown: errors cannot be reported).
///
/// # Safety
/// `ptr..ptr+bytes` was mapped by [`mem_map`]; no work uses it any more.
pub(crate) unsafe fn mem_unmap(ptr: DevicePtr, bytes: usize) {
    let _ = sys::cuMemUnmap(ptr.raw(), bytes);
}

/// Releases an allocation handle (the memory goes once unmapped everywhere).
///
/// # Safety
/// `h` is live and released once.
pub(crate) unsafe fn mem_release(h: sys::CUmemGenericAllocationHandle) {
    let _ = sys::cuMemRelease(h);
}

/// Frees a reserved address range.
///
/// # Safety
/// The range came from [`mem_address_reserve`] and nothing is mapped in it.
pub(crate) unsafe fn mem_address_free(ptr: DevicePtr, bytes: usize) {
    let _ = sys::cuMemAddressFree(ptr.raw(), bytes);
}
