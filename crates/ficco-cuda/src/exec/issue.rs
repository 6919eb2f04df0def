//! Enqueues one task on its stream, one function per task kind. Plans reach
//! here after [`super::precheck`], so shapes, bounds, contiguity and source
//! counts hold; view addresses are still computed through the bounds-checked
//! [`view_addr`].

use super::check::view_addr;
use super::rank::Rank;
use super::run::Shared;
use crate::driver::cuda as cu;
use crate::driver::nccl as nc;
use crate::error::{CudaError, Result};
use crate::gemm::GemmKey;
use crate::hgemm::{DevPtr, GemmArgs, Hooks, Occupancy};
use crate::kernels::ReduceSrcs;
use crate::mem::{copy_2d_async, CopyEnd, DevicePtr};
use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaStream;
use ficco_core::plan::{GemmGroup, NcclOp, RankView, TaskKind, View};
use ficco_core::problem::workload::ELEM_BYTES;
use ficco_core::space::GemmEngine;

/// Enqueues `kind` on `stream` (plan stream `stream_idx`) of `rank`. Under a
/// green split the stream's own context is made current for the call.
pub(super) fn issue(
    rank: &mut Rank,
    sh: &Shared<'_>,
    stream: &CudaStream,
    stream_idx: usize,
    kind: &TaskKind,
) -> Result<()> {
    let mut go = || match kind {
        TaskKind::Gemm { .. } => gemm(rank, sh, stream.cu_stream(), stream_idx, kind),
        TaskKind::GroupedGemm { groups, sm_target } => {
            grouped_gemm(rank, sh, stream.cu_stream(), stream_idx, groups, *sm_target)
        }
        TaskKind::Copy { src, dst } => copy(sh, stream.cu_stream(), src, dst),
        TaskKind::Reduce { srcs, dst } => reduce(rank, sh, stream, srcs, dst),
        TaskKind::Nccl { op, .. } => nccl(rank, sh, stream.cu_stream(), op),
        TaskKind::Signal { .. } | TaskKind::Wait { .. } | TaskKind::TileGemm(_) => {
            Err(CudaError::Plan(format!(
                "{} tasks are not supported by this executor yet",
                kind.short()
            )))
        }
    };
    if sh.plan.resources.green_sms.is_some() {
        // SAFETY: the stream is live (held by the rank for the plan).
        unsafe { cu::with_stream_ctx(stream.cu_stream(), go) }
    } else {
        go()
    }
}

/// Address and pitch of a view of this rank's buffers.
fn local(rank: &Rank, sh: &Shared<'_>, v: &View, what: &str) -> Result<(DevicePtr, usize)> {
    let r = rank.rank;
    view_addr(&sh.plan.ranks[r].buffers, &sh.ptrs[r], v, what)
}

/// The GEMM on the plan's engine: cuBLASLt (autotuned, with the SM count
/// target under a green context), or ficco's own kernel with the task's SM
/// budget and pipeline stages ([`own_gemm`]).
fn gemm(
    rank: &mut Rank,
    sh: &Shared<'_>,
    s: CUstream,
    stream_idx: usize,
    kind: &TaskKind,
) -> Result<()> {
    let TaskKind::Gemm {
        a,
        b,
        c,
        sm_target,
        accumulate,
        occupancy,
    } = kind
    else {
        return Err(CudaError::Plan("not a GEMM task".into()));
    };
    let (pa, lda) = local(rank, sh, a, "gemm a")?;
    let (pb, ldb) = local(rank, sh, b, "gemm b")?;
    let (pc, ldc) = local(rank, sh, c, "gemm c")?;
    if sh.plan.resources.gemm == GemmEngine::Own {
        let g = rank.own_gemms.get(stream_idx).ok_or_else(|| {
            CudaError::Plan(format!(
                "ficco's own GEMM not loaded for stream {stream_idx} before the run"
            ))
        })?;
        let args = own_gemm_args(
            (a.rows, b.cols, a.cols),
            [(pa, lda), (pb, ldb), (pc, ldc)],
            *accumulate,
            *sm_target,
            *occupancy,
        )?;
        // SAFETY: bounds-checked views of live allocations on this rank's
        // device; c does not overlap a or b (validated plan); no wait hook.
        return unsafe { g.launch(s, &args) };
    }
    if occupancy.is_some() {
        return Err(CudaError::Plan(
            "a pipeline stage count (-occS) needs ficco's own GEMM engine".into(),
        ));
    }
    let key = GemmKey {
        m: a.rows,
        n: b.cols,
        k: a.cols,
        lda: lda / ELEM_BYTES,
        ldb: ldb / ELEM_BYTES,
        ldc: ldc / ELEM_BYTES,
        sm_target: *sm_target,
    };
    let ws = rank.workspaces[stream_idx].ptr();
    // SAFETY: views are bounds-checked against live pool allocations;
    // the workspace belongs to this stream alone.
    unsafe { rank.gemms.gemm(key, pa, pb, pc, *accumulate, ws, s) }
}

/// The launch of ficco's own GEMM for (m, n, k) on views given as (address,
/// pitch in bytes) of A, B and C: the SM budget is the task's SM limit
/// (`-smN`, or the green context's SMs), the stages its `-occS`.
pub(crate) fn own_gemm_args(
    (m, n, k): (usize, usize, usize),
    [(pa, lda), (pb, ldb), (pc, ldc)]: [(DevicePtr, usize); 3],
    accumulate: bool,
    sm_target: Option<usize>,
    stages: Option<usize>,
) -> Result<GemmArgs> {
    let small = |v: usize, what: &str| {
        u32::try_from(v)
            .map_err(|_| CudaError::Plan(format!("ficco's own GEMM: {what} {v} too large")))
    };
    let mut hooks = Hooks {
        sm_budget: sm_target.map(|s| small(s, "SM budget")).transpose()?,
        ..Hooks::default()
    };
    if let Some(st) = stages {
        hooks.occupancy = Occupancy {
            stages: small(st, "stage count")?,
            extra_smem: 0,
        };
    }
    Ok(GemmArgs {
        m,
        n,
        k,
        a: DevPtr::new(pa.raw()),
        lda: lda / ELEM_BYTES,
        b: DevPtr::new(pb.raw()),
        ldb: ldb / ELEM_BYTES,
        c: DevPtr::new(pc.raw()),
        ldc: ldc / ELEM_BYTES,
        accumulate,
        hooks,
    })
}

/// A grouped GEMM as a loop of cuBLASLt calls, one per group, in order on
/// the task's stream with its workspace (the groups are independent; one
/// stream keeps them the single task the plan made them). cuBLASLt has no
/// grouped entry point (`cublasGemmGroupedBatchedEx` is in libcublas,
/// which ficco does not load).
fn grouped_gemm(
    rank: &mut Rank,
    sh: &Shared<'_>,
    s: CUstream,
    stream_idx: usize,
    groups: &[GemmGroup],
    sm_target: Option<usize>,
) -> Result<()> {
    let ws = rank.workspaces[stream_idx].ptr();
    for g in groups {
        let (pa, lda) = local(rank, sh, &g.a, "grouped gemm a")?;
        let (pb, ldb) = local(rank, sh, &g.b, "grouped gemm b")?;
        let (pc, ldc) = local(rank, sh, &g.c, "grouped gemm c")?;
        let key = GemmKey {
            m: g.a.rows,
            n: g.b.cols,
            k: g.a.cols,
            lda: lda / ELEM_BYTES,
            ldb: ldb / ELEM_BYTES,
            ldc: ldc / ELEM_BYTES,
            sm_target,
        };
        // SAFETY: views are bounds-checked against live pool allocations
        // (validated: groups' outputs are disjoint from each other and from
        // their inputs); the workspace belongs to this stream alone, and the
        // calls on it run one after another.
        unsafe { rank.gemms.gemm(key, pa, pb, pc, false, ws, s)? }
    }
    Ok(())
}

/// Copy-engine copy between any two ranks' views.
fn copy(sh: &Shared<'_>, s: CUstream, src: &RankView, dst: &RankView) -> Result<()> {
    let end = |rv: &RankView, what| -> Result<CopyEnd> {
        let rp = sh
            .plan
            .ranks
            .get(rv.rank)
            .ok_or_else(|| CudaError::Plan(format!("{what}: no rank {}", rv.rank)))?;
        let (ptr, pitch) = view_addr(&rp.buffers, &sh.ptrs[rv.rank], &rv.view, what)?;
        Ok(CopyEnd {
            ptr,
            ctx: sh.ctxs[rv.rank].cu_ctx(),
            pitch,
        })
    };
    let (se, de) = (end(src, "copy src")?, end(dst, "copy dst")?);
    // SAFETY: both ends are bounds-checked views of live allocations;
    // peer access is enabled at open.
    unsafe { copy_2d_async(se, de, src.view.cols * ELEM_BYTES, src.view.rows, s) }
}

/// dst = sum of the source views (ficco's reduce kernel).
fn reduce(
    rank: &Rank,
    sh: &Shared<'_>,
    stream: &CudaStream,
    srcs: &[View],
    dst: &View,
) -> Result<()> {
    let mut rs = ReduceSrcs::default();
    for (j, v) in srcs.iter().enumerate() {
        let (p, pitch) = local(rank, sh, v, "reduce src")?;
        rs.p[j] = p;
        rs.ld[j] = (pitch / ELEM_BYTES) as u64;
    }
    let (pd, pitch) = local(rank, sh, dst, "reduce dst")?;
    // SAFETY: bounds-checked views on this device; at most MAX_REDUCE_SRCS
    // sources (precheck).
    unsafe {
        rank.kernels.reduce(
            stream,
            &rs,
            srcs.len(),
            pd,
            (pitch / ELEM_BYTES) as u64,
            dst.rows as u64,
            dst.cols as u64,
        )
    }
}

/// One NCCL operation on this rank's communicator for the plan.
fn nccl(rank: &Rank, sh: &Shared<'_>, s: CUstream, op: &NcclOp) -> Result<()> {
    let comm = sh.comms[rank.rank].0;
    let ptr = |v: &View, what: &str| local(rank, sh, v, what).map(|(p, _)| p);
    // SAFETY (all calls below): contiguous (precheck), bounds-checked views of
    // live allocations; the communicator belongs to this rank's thread.
    unsafe {
        match op {
            NcclOp::AllGather { send, recv } => nc::all_gather(
                ptr(send, "all-gather send")?,
                ptr(recv, "all-gather recv")?,
                send.elems(),
                comm,
                s,
            ),
            NcclOp::ReduceScatter { send, recv } => nc::reduce_scatter(
                ptr(send, "reduce-scatter send")?,
                ptr(recv, "reduce-scatter recv")?,
                recv.elems(),
                comm,
                s,
            ),
            NcclOp::AllReduce { send, recv } => nc::all_reduce(
                ptr(send, "all-reduce send")?,
                ptr(recv, "all-reduce recv")?,
                recv.elems(),
                comm,
                s,
            ),
            NcclOp::SendRecv { sends, recvs } => nc::grouped(|| {
                for (peer, v) in sends {
                    nc::send(ptr(v, "send")?, v.elems(), *peer, comm, s)?;
                }
                for (peer, v) in recvs {
                    nc::recv(ptr(v, "recv")?, v.elems(), *peer, comm, s)?;
                }
                Ok(())
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_gemm_args_carry_views_budget_and_stages() {
        let p = DevicePtr;
        // Pitches in bytes: A rows of 1024 bf16, B 512, C 768 (a wider buffer).
        let args = own_gemm_args(
            (64, 512, 256),
            [(p(0x1000), 2048), (p(0x2000), 1024), (p(0x3000), 1536)],
            true,
            Some(116),
            Some(2),
        )
        .unwrap();
        assert_eq!((args.m, args.n, args.k), (64, 512, 256));
        assert_eq!((args.lda, args.ldb, args.ldc), (1024, 512, 768));
        assert_eq!(
            (args.a.addr(), args.b.addr(), args.c.addr()),
            (0x1000, 0x2000, 0x3000)
        );
        assert!(args.accumulate);
        assert_eq!(args.hooks.sm_budget, Some(116));
        assert_eq!(args.hooks.occupancy.stages, 2);
        assert_eq!(args.hooks.occupancy.extra_smem, 0);
        // No limits: the kernel's defaults (every SM, the most stages).
        let plain = own_gemm_args(
            (8, 8, 8),
            [(p(0x1000), 16), (p(0x2000), 16), (p(0x3000), 16)],
            false,
            None,
            None,
        )
        .unwrap();
        assert_eq!(plain.hooks, Hooks::default());
        assert!(own_gemm_args(
            (8, 8, 8),
            [(p(0), 16), (p(0), 16), (p(0), 16)],
            false,
            Some(usize::MAX),
            None
        )
        .is_err());
    }
}
