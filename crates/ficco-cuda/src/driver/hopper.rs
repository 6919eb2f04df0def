//! CUDA driver calls that only Hopper's kernels need: TMA tensor maps and
//! the occupancy of thread-block clusters (ficco's own GEMM, `crate::hgemm`).
//! Kept apart from [`super::cuda`] because they describe one kernel family's
//! hardware features, not the driver's general objects.
//!
//! As in [`super::cuda`], every result is checked into
//! [`crate::error::CudaError::Driver`] naming the call.

use super::DevicePtr;
use crate::error::{check, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

/// An all-zero tensor map: a placeholder for a kernel parameter the kernel
/// does not read (e.g. C's map when the epilogue stores from registers).
pub(crate) fn zeroed_tensor_map() -> sys::CUtensorMap {
    // SAFETY: CUtensorMap is 128 plain bytes; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Encodes a 2-D bf16 tensor map (`cuTensorMapEncodeTiled`): `dims[0]`
/// contiguous elements per row, `dims[1]` rows `row_bytes` apart, boxes of
/// `boxes[0]` × `boxes[1]` elements, 128-byte swizzle, 256-byte L2
/// promotion, out-of-bounds elements read as zeros. Encoding reads nothing
/// at `base` (the driver only checks its alignment and the sizes), so this
/// is safe; the kernel that uses the map needs the memory.
pub(crate) fn tensor_map_bf16_2d(
    base: DevicePtr,
    dims: [u64; 2],
    row_bytes: u64,
    boxes: [u32; 2],
) -> Result<sys::CUtensorMap> {
    let strides = [row_bytes];
    let elem = [1u32, 1];
    let mut map = zeroed_tensor_map();
    // SAFETY: valid pointers to arrays of rank (strides: rank - 1) entries;
    // the encoder only reads them and writes `map`.
    check("cuTensorMapEncodeTiled", unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            base.raw() as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    })?;
    Ok(map)
}

/// Clusters of `f` that can be resident at once
/// (`cuOccupancyMaxActiveClusters`) for a grid of `grid` × 1 × 1 CTAs of
/// `threads` threads with `dyn_smem` bytes of dynamic shared memory. The
/// config names no stream and no attributes: the cluster dimensions are the
/// kernel's own (compile time).
///
/// # Safety
/// `f` is a live function handle of the current context.
pub(crate) unsafe fn occupancy_max_active_clusters(
    f: sys::CUfunction,
    grid: u32,
    threads: u32,
    dyn_smem: u32,
) -> Result<u32> {
    // SAFETY: a plain C struct; all-zero is "no stream, no attributes".
    let mut cfg: sys::CUlaunchConfig = std::mem::zeroed();
    cfg.gridDimX = grid;
    cfg.gridDimY = 1;
    cfg.gridDimZ = 1;
    cfg.blockDimX = threads;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.sharedMemBytes = dyn_smem;
    let mut n = 0i32;
    check(
        "cuOccupancyMaxActiveClusters",
        sys::cuOccupancyMaxActiveClusters(&mut n, f, &cfg),
    )?;
    Ok(n.max(0) as u32)
}
