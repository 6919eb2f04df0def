//! Address arithmetic of plan views on bound device memory: the one place
//! that turns a (buffer, rows, cols) view into a device address and pitch,
//! bounds-checked.

use crate::error::{CudaError, Result};
use crate::mem::DevicePtr;
use ficco_core::plan::{Buffer, View};
use ficco_core::problem::workload::ELEM_BYTES;

/// As [`view_addr`] for a GEMM's B operand, which may be stored transposed
/// (`transposed`: the buffer's `[rows x cols]` held as its transpose,
/// `[cols x rows]` row-major; see [`crate::gemm`]): then the view's first
/// element is at `col * rows + row` and the pitch is `rows` elements.
pub(crate) fn b_view_addr(
    bufs: &[Buffer],
    ptrs: &[DevicePtr],
    v: &View,
    transposed: bool,
    what: &str,
) -> Result<(DevicePtr, usize)> {
    let (p, pitch) = view_addr(bufs, ptrs, v, what)?;
    if !transposed {
        return Ok((p, pitch));
    }
    // view_addr checked the buffer and the bounds.
    let rows = bufs.get(v.buf).map_or(0, |b| b.rows);
    Ok((
        ptrs[v.buf].offset((v.col * rows + v.row) * ELEM_BYTES),
        rows * ELEM_BYTES,
    ))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(rows: usize, cols: usize) -> Buffer {
        Buffer {
            name: "b".into(),
            role: ficco_core::plan::BufferRole::InputB,
            rows,
            cols,
            peer_visible: false,
        }
    }

    #[test]
    fn a_transposed_b_view_starts_at_its_column_of_the_stored_transpose() {
        // B is [6 x 4] (k x n), held as [4 x 6] row-major.
        let bufs = [buf(6, 4)];
        let ptrs = [DevicePtr(0x1000)];
        let v = View {
            buf: 0,
            row: 2,
            col: 3,
            rows: 4,
            cols: 1,
        };
        let (p, pitch) = b_view_addr(&bufs, &ptrs, &v, false, "b").unwrap();
        assert_eq!((p.raw(), pitch), (0x1000 + (2 * 4 + 3) * 2, 4 * 2));
        let (p, pitch) = b_view_addr(&bufs, &ptrs, &v, true, "b").unwrap();
        assert_eq!((p.raw(), pitch), (0x1000 + (3 * 6 + 2) * 2, 6 * 2));
        // Out of bounds either way.
        let far = View { rows: 5, ..v };
        assert!(b_view_addr(&bufs, &ptrs, &far, true, "b").is_err());
    }
}
