//! Address arithmetic of plan views on bound device memory: the one place
//! that turns a (buffer, rows, cols) view into a device address and pitch,
//! bounds-checked.

use crate::error::{CudaError, Result};
use crate::mem::DevicePtr;
use ficco_core::plan::{Buffer, View};
use ficco_core::problem::workload::ELEM_BYTES;

/// Bounds-checked device address of a view's first element, and its pitch in bytes.
pub(crate) fn view_addr(
    bufs: &[Buffer],
    ptrs: &[DevicePtr],
    v: &View,
    what: &str,
) -> Result<(DevicePtr, usize)> {
    let b = bufs
        .get(v.buf)
        .ok_or_else(|| CudaError::Plan(format!("{what}: buffer {} does not exist", v.buf)))?;
    if v.row + v.rows > b.rows || v.col + v.cols > b.cols {
        return Err(CudaError::Plan(format!(
            "{what}: view rows {}+{} cols {}+{} outside buffer '{}' [{} x {}]",
            v.row, v.rows, v.col, v.cols, b.name, b.rows, b.cols
        )));
    }
    Ok((
        ptrs[v.buf].offset((v.row * b.cols + v.col) * ELEM_BYTES),
        b.cols * ELEM_BYTES,
    ))
}
