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
use crate::kernels::ReduceSrcs;
use crate::mem::{copy_2d_async, CopyEnd, DevicePtr};
use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaStream;
use ficco_core::plan::{NcclOp, RankView, TaskKind, View};
use ficco_core::problem::workload::ELEM_BYTES;

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

/// cuBLASLt GEMM, or ficco's shaped GEMM when the task asks for an occupancy.
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
    if let Some(blocks) = occupancy {
        let shaped = rank
            .shaped
            .as_ref()
            .ok_or_else(|| CudaError::Plan("shaped GEMM not loaded before the run".into()))?;
        if *accumulate {
            return Err(CudaError::Plan(
                "ficco's shaped GEMM does not accumulate (C += A.B)".into(),
            ));
        }
        // SAFETY: bounds-checked views of live allocations; c is an
        // output view that does not overlap a or b (validated plan).
        return unsafe {
            shaped.launch_ld(
                s,
                pa,
                lda / ELEM_BYTES,
                pb,
                ldb / ELEM_BYTES,
                pc,
                ldc / ELEM_BYTES,
                a.rows,
                b.cols,
                a.cols,
                Some(*blocks as u32),
            )
        };
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
