//! Host-side checks and the output comparison: every task of a plan is
//! checked before anything is issued ([`precheck`]), and outputs are
//! poisoned, copied and compared on the device ([`poison`], [`copy_d2d`],
//! [`compare`]).

use super::addr::view_addr;
use super::rank::Rank;
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::{memset_d16_async, DevicePtr};
use ficco_core::plan::validate::validate;
use ficco_core::plan::{Plan, TaskKind};
use ficco_core::problem::workload::ELEM_BYTES;

/// bf16 quiet NaN, used to poison outputs before a checked run.
pub const BF16_NAN: u16 = 0x7fc0;

/// Checks `plan` on the host before anything is issued: a task that fails
/// to issue on one rank would leave its peers' NCCL kernels waiting forever
/// on the device. The plan checks are the core's one validator (shapes,
/// bounds, NCCL contiguity, reduce sources, ordering, races); here only the
/// binding to device memory is added. What passes issues without further checks.
pub fn precheck(plan: &Plan, ptrs: &[Vec<DevicePtr>]) -> Result<()> {
    validate(plan).map_err(|e| CudaError::Plan(e.to_string()))?;
    check_bound(plan, ptrs)?;
    check_tiles(plan, ptrs)
}

/// What ficco's own kernel needs of every tile GEMM, checked before any rank
/// issues anything (a launch that fails on one rank would leave its peers
/// waiting on its flags): N and K multiples of 8 and A and B pitches
/// multiples of 8 elements (TMA), every view in bounds, one pitch for every
/// destination view (the destination hook has one leading dimension), and
/// signal counters that advance by at most
/// [`crate::hgemm::MAX_SIGNAL_ADVANCE`] per launch, which no wait hook reads.
pub fn check_tiles(plan: &Plan, ptrs: &[Vec<DevicePtr>]) -> Result<()> {
    let counted = crate::signal::counted_flags(plan);
    for (r, rp) in plan.ranks.iter().enumerate() {
        for t in &rp.tasks {
            let TaskKind::TileGemm(g) = &t.kind else {
                continue;
            };
            let bad =
                |why: String| CudaError::Plan(format!("rank {r} tile GEMM '{}': {why}", t.label));
            let (_, lda) = view_addr(&rp.buffers, &ptrs[r], &g.a, "tile gemm a")?;
            let (_, ldb) = view_addr(&rp.buffers, &ptrs[r], &g.b, "tile gemm b")?;
            view_addr(&rp.buffers, &ptrs[r], &g.c, "tile gemm c")?;
            let pitch8 = |p: usize| p % (8 * ELEM_BYTES) == 0;
            if g.a.cols == 0 || g.a.cols % 8 != 0 || g.b.cols % 8 != 0 {
                return Err(bad(format!(
                    "N and K must be positive multiples of 8 (N={}, K={})",
                    g.b.cols, g.a.cols
                )));
            }
            if !pitch8(lda) || !pitch8(ldb) {
                return Err(bad(
                    "A and B rows must be multiples of 8 elements apart".into()
                ));
            }
            if g.block_rows == 0 {
                return Err(bad("a block of 0 rows".into()));
            }
            if g.signal.is_some() {
                use crate::hgemm::{signal_advance, MAX_SIGNAL_ADVANCE};
                let (m, n) = (g.a.rows, g.b.cols);
                if (0..g.blocks()).any(|b| {
                    signal_advance(m, n, g.block_rows, b).is_none_or(|v| v > MAX_SIGNAL_ADVANCE)
                }) {
                    return Err(bad(format!(
                        "blocks of {} rows x {n} columns advance their signal counters by more than {MAX_SIGNAL_ADVANCE} per launch; use smaller blocks",
                        g.block_rows
                    )));
                }
            }
            // The wait hook has one epoch (SET) for every block: it cannot
            // wait for counters that count another tile GEMM's stores.
            if let Some(f) = g
                .wait
                .and_then(|w| (w..w + g.blocks()).find(|f| counted[r].contains_key(f)))
            {
                return Err(bad(format!(
                    "its wait hook reads flag {f}, a tile GEMM's signal counter; wait on it with a Wait task instead"
                )));
            }
            if !g.dest.is_empty() && g.dest.len() != g.blocks() {
                return Err(bad(format!(
                    "{} destination entries for {} blocks",
                    g.dest.len(),
                    g.blocks()
                )));
            }
            let mut pitch = None;
            for v in g.dest.iter().flatten() {
                let (_, p) = view_addr(&rp.buffers, &ptrs[r], v, "tile gemm destination")?;
                if pitch.is_some_and(|q| q != p) {
                    return Err(bad("destination views of different pitches".into()));
                }
                pitch = Some(p);
            }
        }
    }
    Ok(())
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
    use ficco_core::plan::{Plan, TaskKind};
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
        let mut tiles = 0;
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
                    if let Err(e) = super::precheck(&plan, &ptrs) {
                        panic!("{} {}: {e}", problem.label(), plan.name);
                    }
                    tiles += usize::from(
                        plan.ranks[0]
                            .tasks
                            .iter()
                            .any(|t| t.kind.short() == "tile-gemm"),
                    );
                }
            }
        }
        assert!(tiles > 0, "no tile plan was checked");
    }

    /// What ficco's kernel cannot run is refused before anything is issued:
    /// a K that is not a multiple of 8, destination views of two pitches,
    /// and a wait hook on signal counters.
    #[test]
    fn precheck_refuses_tile_gemms_the_kernel_cannot_run() {
        let tile_plan = |k: usize| {
            let problem = Problem::new(Op::GemmRs, 512, k, 256, 2).expect("problem");
            let s: ficco_core::space::Schedule = "tile-copy-ring-acc".parse().expect("schedule");
            lower(&problem, &s).expect("lowered")
        };
        let null = |plan: &Plan| -> Vec<Vec<DevicePtr>> {
            plan.ranks
                .iter()
                .map(|rp| vec![DevicePtr::NULL; rp.buffers.len()])
                .collect()
        };
        let plan = tile_plan(256);
        super::precheck(&plan, &null(&plan)).expect("a valid tile plan passes");
        let mut odd = plan.clone();
        for rp in &mut odd.ranks {
            for t in &mut rp.tasks {
                if let TaskKind::TileGemm(g) = &mut t.kind {
                    g.a.cols = 252;
                    g.b.rows = 252;
                }
            }
        }
        let e = super::check_tiles(&odd, &null(&odd)).expect_err("K = 252");
        assert!(e.to_string().contains("multiples of 8"), "{e}");
        let mut two = plan.clone();
        // Rank 0's destination of its second block goes to another buffer
        // (part: N columns too, but its own pitch once widened).
        two.ranks[0].buffers[3].cols = 264;
        for t in &mut two.ranks[0].tasks {
            if let TaskKind::TileGemm(g) = &mut t.kind {
                let i = g
                    .dest
                    .iter()
                    .position(Option::is_some)
                    .expect("a destination");
                let mut v = g.dest[i].expect("view");
                v.buf = 3;
                v.row = 0;
                g.dest.push(None);
                g.dest.truncate(g.blocks());
                let j = g.dest.iter().position(Option::is_none).expect("a C block");
                g.dest[j] = Some(v);
            }
        }
        let e = super::check_tiles(&two, &null(&two)).expect_err("two pitches");
        assert!(e.to_string().contains("different pitches"), "{e}");
        // A wait hook on the GEMM's own signal counters (which count to
        // their blocks' advances, not to the wait hook's SET).
        let mut own = plan.clone();
        for t in &mut own.ranks[0].tasks {
            if let TaskKind::TileGemm(g) = &mut t.kind {
                g.wait = g.signal;
            }
        }
        let e = super::check_tiles(&own, &null(&own)).expect_err("wait on counters");
        assert!(e.to_string().contains("signal counter"), "{e}");
    }
}
