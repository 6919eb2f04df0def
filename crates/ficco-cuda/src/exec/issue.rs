//! Enqueues one task on its stream, one function per task kind. Plans reach
//! here after [`super::precheck`], so shapes, bounds, contiguity and source
//! counts hold; view addresses are still computed through the bounds-checked
//! [`super::addr::view_addr`].
//!
//! The plan's own flags ([`TaskKind::Signal`], [`TaskKind::Wait`] and tile
//! GEMM blocks) are words of the flag buffers ([`crate::signal`]): a Signal
//! writes [`SET`] into the target rank's word, a Wait holds its stream until
//! its own rank's word reaches the flag's target (`SignalLayout::plan_target`),
//! and a tile GEMM is one launch of ficco's own kernel whose wait hook reads
//! the same words (epoch [`SET`]) and whose signal hook adds its blocks'
//! advances (from the 0 the consumer cleared at the end of the previous
//! iteration to exactly the target). Every value is a constant, so a
//! captured iteration replays unchanged.

use super::addr::{b_view_addr, view_addr};
use super::gemm_args::{own_gemm_args, tile_gemm_args, TileFlags};
use super::rank::Rank;
use super::shared::Shared;
use crate::driver::cuda as cu;
use crate::driver::nccl as nc;
use crate::error::{CudaError, Result};
use crate::gemm::GemmKey;
use crate::kernels::ReduceSrcs;
use crate::mem::{copy_2d_async, CopyEnd, DevicePtr};
use crate::signal::{word, SET};
use cudarc::driver::sys::{CUevent, CUstream};
use cudarc::driver::CudaStream;
use ficco_core::plan::{GemmGroup, NcclOp, RankView, TaskKind, TileGemm, View};
use ficco_core::problem::workload::ELEM_BYTES;
use ficco_core::space::GemmEngine;

/// Enqueues `kind` on `stream` (plan stream `stream_idx`) of `rank`. Under a
/// green split the stream's own context is made current for the call.
/// `launched`: for a tile GEMM, an event its launch records once every block
/// has begun.
pub(super) fn issue(
    rank: &mut Rank,
    sh: &Shared<'_>,
    stream: &CudaStream,
    stream_idx: usize,
    index: usize,
    kind: &TaskKind,
    launched: Option<CUevent>,
) -> Result<()> {
    let mut go = || match kind {
        TaskKind::Gemm { .. } => gemm(rank, sh, stream.cu_stream(), stream_idx, kind),
        TaskKind::GroupedGemm { groups, sm_target } => grouped_gemm(
            rank,
            sh,
            stream.cu_stream(),
            stream_idx,
            index,
            groups,
            *sm_target,
        ),
        TaskKind::Copy { src, dst } => copy(sh, stream.cu_stream(), src, dst),
        TaskKind::Reduce { srcs, dst } => reduce(rank, sh, stream, srcs, dst),
        TaskKind::Nccl { op, .. } => nccl(rank, sh, stream.cu_stream(), op),
        TaskKind::Signal { to_rank, flag } => {
            let w = plan_flag(sh, *to_rank, *flag)?;
            // SAFETY: the word is inside rank `to_rank`'s live flag buffer
            // (sized to the layout); peer access is enabled between the
            // devices (or it is the same device).
            unsafe { cu::stream_write_value32(stream.cu_stream(), w, SET) }
        }
        TaskKind::Wait { flag } => {
            let w = plan_flag(sh, rank.rank, *flag)?;
            let target = sh.layout.plan_target(rank.rank, *flag);
            // SAFETY: the word is inside this rank's live flag buffer.
            unsafe { cu::stream_wait_value32_geq(stream.cu_stream(), w, target) }
        }
        TaskKind::TileGemm(g) => tile_gemm(
            rank,
            sh,
            stream.cu_stream(),
            (stream_idx, index),
            g,
            launched,
        ),
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
    let b_transposed = sh.plan.resources.b_transposed;
    let r = rank.rank;
    let (pb, ldb) = b_view_addr(
        &sh.plan.ranks[r].buffers,
        &sh.ptrs[r],
        b,
        b_transposed,
        "gemm b",
    )?;
    let (pc, ldc) = local(rank, sh, c, "gemm c")?;
    if sh.plan.resources.gemm == GemmEngine::Own {
        if b_transposed {
            return Err(CudaError::Plan(
                "a transposed B operand needs GEMMs on cuBLASLt, not ficco's own kernel".into(),
            ));
        }
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
        b_transposed,
    };
    let ws = rank.workspaces[stream_idx].ptr();
    // SAFETY: views are bounds-checked against live pool allocations;
    // the workspace belongs to this stream alone.
    unsafe { rank.gemms.gemm(key, pa, pb, pc, *accumulate, ws, s) }
}

/// A grouped GEMM: one launch of ficco's grouped kernel when the run
/// prepared one for this task ([`Rank::prepare_own_gemm`]: its table of
/// tensor maps is on the device), else a loop of cuBLASLt calls, one per
/// group, in order on the task's stream with its workspace (the groups are
/// independent; one stream keeps them the single task the plan made them).
/// cuBLASLt has no grouped entry point (`cublasGemmGroupedBatchedEx` is in
/// libcublas, which ficco does not load).
fn grouped_gemm(
    rank: &mut Rank,
    sh: &Shared<'_>,
    s: CUstream,
    stream_idx: usize,
    index: usize,
    groups: &[GemmGroup],
    sm_target: Option<usize>,
) -> Result<()> {
    if sh.plan.resources.b_transposed {
        return Err(CudaError::Plan(
            "a transposed B operand is for plain GEMM tasks, not grouped ones".into(),
        ));
    }
    if let Some(launch) = rank.grouped.get(&index) {
        let g = rank.own_gemms.get(stream_idx).ok_or_else(|| {
            CudaError::Plan(format!(
                "ficco's own GEMM not loaded for stream {stream_idx} before the run"
            ))
        })?;
        // SAFETY: the table was built by this run's preparation from
        // bounds-checked views of the live, bound buffers (validated: the
        // groups' outputs are disjoint from each other and from their inputs).
        unsafe { g.launch_grouped(s, launch)? };
        rank.grouped_issued += 1;
        return Ok(());
    }
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
            b_transposed: false,
        };
        // SAFETY: views are bounds-checked against live pool allocations
        // (validated: groups' outputs are disjoint from each other and from
        // their inputs); the workspace belongs to this stream alone, and the
        // calls on it run one after another.
        unsafe { rank.gemms.gemm(key, pa, pb, pc, false, ws, s)? }
    }
    Ok(())
}

/// The device address of the plan's flag `flag` of rank `rank`.
fn plan_flag(sh: &Shared<'_>, rank: usize, flag: usize) -> Result<DevicePtr> {
    let w = sh
        .layout
        .plan_word(rank, flag)
        .ok_or_else(|| CudaError::Plan(format!("rank {rank} has no signal flag {flag}")))?;
    let base = sh
        .flags
        .get(rank)
        .ok_or_else(|| CudaError::Plan(format!("no flag buffer for rank {rank}")))?;
    Ok(word(*base, w))
}

/// One launch of ficco's own GEMM for a tile GEMM task: its blocks wait on
/// their flags, signal their counters and store through the destination
/// table that the run wrote before it started ([`Shared::tables`]), and the
/// kernel's M order starts at the task's first block. The SM budget is the
/// task's, capped at this rank's share of the SMs its stream can use (the
/// device's, or its green context's; [`Shared::tile_share`]): in loopback
/// every rank's persistent GEMM must be resident at once, or one spinning on
/// a flag whose producer GEMM cannot get an SM never ends (on 2 GPUs with
/// `-acc` each rank's own blocks wait for the peer GEMM's pushed blocks),
/// and the copies between them (kernels there) need SMs of their own
/// ([`super::shared::tile_sm_cap`]). One CTA per SM each (the kernel's shared
/// memory allows no more), so P GEMMs of (SMs - free) / P CTAs fit side by
/// side.
fn tile_gemm(
    rank: &Rank,
    sh: &Shared<'_>,
    s: CUstream,
    (stream_idx, index): (usize, usize),
    g: &TileGemm,
    launched: Option<CUevent>,
) -> Result<()> {
    let r = rank.rank;
    let kernel = rank.own_gemms.get(stream_idx).ok_or_else(|| {
        CudaError::Plan(format!(
            "ficco's own GEMM not loaded for stream {stream_idx} before the run"
        ))
    })?;
    let (pa, lda) = local(rank, sh, &g.a, "tile gemm a")?;
    let (pb, ldb) = local(rank, sh, &g.b, "tile gemm b")?;
    let (pc, ldc) = local(rank, sh, &g.c, "tile gemm c")?;
    // The SMs the GEMM's stream can use: a green context's, else the device's.
    let sms = rank
        .green_compute_sms(sh.plan.resources.green_sms)
        .map_or(kernel.sms(), |g| g.min(kernel.sms()));
    let share = sh.tile_share.get(r).copied().unwrap_or(1).max(1);
    let cap = super::shared::tile_sm_cap(sms, share);
    if cap == 0 {
        return Err(CudaError::Plan(format!(
            "{share} persistent tile GEMMs share {sms} SMs: not every one can be resident"
        )));
    }
    let tables = sh.tables.get(r);
    let table = tables.and_then(|t| t.dest.get(index)).copied().flatten();
    let maps = tables.and_then(|t| t.maps.get(index)).copied().flatten();
    let dest_ld = match table {
        Some(_) => Some(dest_pitch(rank, sh, g)?),
        None => None,
    };
    let args = tile_gemm_args(
        g,
        [(pa, lda), (pb, ldb), (pc, ldc)],
        TileFlags {
            wait: g.wait.map(|f| plan_flag(sh, r, f)).transpose()?,
            signal: g.signal.map(|f| plan_flag(sh, r, f)).transpose()?,
            dest: table.zip(dest_ld),
            dest_maps: table.and(maps),
        },
        cap,
    )?;
    // SAFETY: bounds-checked views of live allocations on this rank's device
    // (precheck: every destination view too, all of one pitch); the flag
    // words of every block exist (the layout holds the plan's flags), and the
    // table holds one entry per block. A wait hook whose flag never comes
    // hangs the kernel: the validator proved every waited flag is
    // signalled, and the watchdog releases every flag of a hung run.
    unsafe { kernel.launch_ordered(s, &args, launched) }
}

/// The pitch (bytes) shared by every destination view of a tile GEMM.
fn dest_pitch(rank: &Rank, sh: &Shared<'_>, g: &TileGemm) -> Result<usize> {
    let mut pitch = None;
    for v in g.dest.iter().flatten() {
        let (_, p) = local(rank, sh, v, "tile gemm destination")?;
        if pitch.is_some_and(|q| q != p) {
            return Err(CudaError::Plan(
                "a tile GEMM's destination views have different pitches".into(),
            ));
        }
        pitch = Some(p);
    }
    pitch.ok_or_else(|| CudaError::Plan("a tile GEMM's destination table has no view".into()))
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
    let comm = sh
        .comms
        .get(rank.rank)
        .copied()
        .flatten()
        .ok_or_else(|| {
            CudaError::Plan(format!(
                "rank {} has no NCCL communicator in this run",
                rank.rank
            ))
        })?
        .0;
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
