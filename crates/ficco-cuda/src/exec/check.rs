//! Host-side checks and the output comparison: every task of a plan is
//! checked before anything is issued ([`precheck`]), view addresses are
//! bounds-checked ([`view_addr`]), and outputs are poisoned, copied and
//! compared on the device ([`poison`], [`copy_d2d`], [`compare`]).

use super::rank::Rank;
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::{memset_d16_async, DevicePtr};
use ficco_core::plan::validate::validate;
use ficco_core::plan::{Buffer, Plan, View};
use ficco_core::problem::workload::ELEM_BYTES;

/// bf16 quiet NaN, used to poison outputs before a checked run.
pub const BF16_NAN: u16 = 0x7fc0;

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

/// Checks `plan` on the host before anything is issued: a task that fails
/// to issue on one rank would leave its peers' NCCL kernels waiting forever
/// on the device. The plan checks are the core's one validator (shapes,
/// bounds, NCCL contiguity, reduce sources, ordering, races); here only the
/// binding to device memory is added. What passes issues without further checks.
pub fn precheck(plan: &Plan, ptrs: &[Vec<DevicePtr>]) -> Result<()> {
    validate(plan).map_err(|e| CudaError::Plan(e.to_string()))?;
    // Before any rank issues anything: a tile plan must not half-run.
    if let Some(t) = plan.ranks.iter().flat_map(|r| &r.tasks).find(|t| {
        matches!(
            t.kind,
            ficco_core::plan::TaskKind::TileGemm(_)
                | ficco_core::plan::TaskKind::Signal { .. }
                | ficco_core::plan::TaskKind::Wait { .. }
        )
    }) {
        return Err(CudaError::Plan(format!(
            "{} tasks ('{}') are not supported by this executor yet",
            t.kind.short(),
            t.label
        )));
    }
    check_bound(plan, ptrs)
}

/// Every buffer of every rank has a device pointer.
pub fn check_bound(plan: &Plan, ptrs: &[Vec<DevicePtr>]) -> Result<()> {
    if ptrs.len() != plan.ranks.len() {
        return Err(CudaError::Plan(format!(
            "{} ranks bound for a plan of {}",
            ptrs.len(),
            plan.ranks.len()
        )));
    }
    for (r, (rp, p)) in plan.ranks.iter().zip(ptrs).enumerate() {
        if p.len() != rp.buffers.len() {
            return Err(CudaError::Plan(format!(
                "rank {r}: {} buffers bound for {} in the plan",
                p.len(),
                rp.buffers.len()
            )));
        }
    }
    Ok(())
}

/// Fills `n` bf16 at `ptr` on `rank` with the NaN poison (stream-ordered on the control stream).
pub fn poison(rank: &Rank, ptr: DevicePtr, n: usize) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: callers pass pool allocations of at least n elements.
    unsafe { memset_d16_async(ptr, BF16_NAN, n, rank.control().cu_stream()) }
}

/// Device-to-device copy of `bytes` on the rank's control stream.
pub fn copy_d2d(rank: &Rank, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: callers pass allocations of at least `bytes` on this device.
    unsafe { cu::memcpy_dtod_async(dst, src, bytes, rank.control().cu_stream()) }
}

/// Sum of squared differences, sum of squared reference, NaN count of `n`
/// bf16 at `out` against `reference` (either may be a peer's memory).
pub fn compare(
    rank: &Rank,
    out: DevicePtr,
    reference: DevicePtr,
    n: usize,
) -> Result<(f64, f64, u64)> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let s = rank.control();
    let acc = rank.check_acc.ptr();
    // SAFETY: check_acc holds 32 bytes; out/reference hold n bf16 (callers).
    unsafe {
        cu::memset_d8_async(acc, 0, 24, s.cu_stream())?;
        rank.kernels
            .check(s, out, reference, n as u64, acc, acc.offset(16))?;
    }
    s.synchronize().map_err(drv("cuStreamSynchronize"))?;
    let mut host = [0u8; 24];
    rank.check_acc.download(&mut host)?;
    let f = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&host[i * 8..i * 8 + 8]);
        b
    };
    Ok((
        f64::from_le_bytes(f(0)),
        f64::from_le_bytes(f(1)),
        u64::from_le_bytes(f(2)),
    ))
}

#[cfg(test)]
mod tests {
    use crate::mem::DevicePtr;
    use ficco_core::plan::lower::{comm_only, gemm_only, lower};
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::{enumerate, SpaceOptions};

    /// Every lowered plan passes the executor's host-side checks (views in
    /// bounds, NCCL views contiguous, sizes consistent). Runs without a GPU.
    #[test]
    fn every_lowered_plan_passes_precheck() {
        let opts = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 16,
        };
        let spec = ficco_core::problem::routing::MoeSpec::new(
            8,
            2,
            ficco_core::problem::routing::Skew::HEAVY,
            1,
        );
        for gpus in [2, 4] {
            for op in Op::ALL.into_iter().chain(Op::MOE) {
                let problem = if op.is_moe() {
                    Problem::moe(op, 512, 256, 384, gpus, spec)
                } else {
                    Problem::new(op, 512, 256, 384, gpus)
                }
                .expect("problem");
                let mut plans = vec![gemm_only(&problem), comm_only(&problem)];
                plans.extend(
                    enumerate(op, opts)
                        .iter()
                        .filter_map(|s| lower(&problem, s).ok()),
                );
                for plan in plans {
                    let ptrs: Vec<Vec<DevicePtr>> = plan
                        .ranks
                        .iter()
                        .map(|rp| vec![DevicePtr::NULL; rp.buffers.len()])
                        .collect();
                    let tile = plan
                        .schedule
                        .is_some_and(|s| s.granularity == ficco_core::space::Granularity::Tile);
                    match super::precheck(&plan, &ptrs) {
                        // Not run by this executor yet: rejected up front.
                        Err(e) if tile => assert!(e.to_string().contains("not supported")),
                        Err(e) => panic!("{} {}: {e}", problem.label(), plan.name),
                        Ok(()) => assert!(!tile, "{} {}", problem.label(), plan.name),
                    }
                }
            }
        }
    }
}
