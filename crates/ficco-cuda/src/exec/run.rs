//! The run loop: [`run_plan_with`] picks the plan's communicators, prepares every
//! rank (streams, GEMM warm-up, ficco's own GEMM, signal flags), then issues the
//! warm-up, timed and timeline iterations: one host thread per rank, or in
//! loopback one thread for every rank ([`run_loopback`]). Each iteration is
//! issued call by call or replayed from a CUDA graph ([`super::iter`]).
//! Cross-rank dependencies are device-side signals ([`crate::signal`]): host
//! threads only issue, and the calling thread is the watchdog that ends a
//! hung run ([`super::watchdog`]).

use super::check::precheck;
use super::iter::{capture, CrossEvents, RankIssue};
use super::progress::Issuing;
use super::rank::Rank;
use super::shared::{
    flag_preds, same_rank_events, tile_share, CommHandle, JobLink, RunOpts, RunSpec, Shared,
    TileTables,
};
use super::watchdog::watchdog;
use crate::comm::{CommCache, CommSet, NcclLimits};
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::DevicePtr;
use crate::signal::{HostWords, SignalLayout};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaStream};
use ficco_core::plan::graph::{topo, Graph};
use ficco_core::plan::tile::{expand, expand_origins};
use ficco_core::plan::{Plan, TaskKind};
use ficco_core::settings::trace;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Test hook of a job (the rank-failure tests, `FICCO_TEST_KILL_RANK`):
/// the rank it names exits abruptly once its first run started, leaving its
/// peers waiting on it. Off unless a test sets it.
fn kill_hook() -> Option<usize> {
    ficco_core::settings::Settings::current().faults.kill_rank
}

/// What one rank's thread measured.
#[derive(Debug, Clone, Default)]
pub struct RankTimes {
    /// Per timed iteration, ms from start to end on this rank.
    pub iters: Vec<f64>,
    /// Per task (start, end) in ms from the iteration start, when asked.
    pub tasks: Vec<(f64, f64)>,
    /// Per timed iteration, host µs spent issuing this rank's part of the
    /// operator: every launch, copy, event, signal write and wait, or the one
    /// graph launch. In loopback one thread issues every rank: the total
    /// divided by the ranks.
    pub host_us: Vec<f64>,
    /// The timed iterations were replayed from a CUDA graph.
    pub graphed: bool,
    /// Why graphs were asked for but not used (capture failed).
    pub graph_error: Option<String>,
}

/// The communicators of `ranks`' GPUs under `limits` (created once per
/// process and limits, see [`CommCache`]).
fn comm_set(ranks: &[Rank], limits: NcclLimits) -> Result<Arc<CommSet>> {
    let gpus: Vec<usize> = ranks.iter().map(|r| r.ctx.ordinal()).collect();
    CommCache::global().get(&gpus, limits)
}

/// Creates and warms the default communicators of GPUs `ctxs` (ordinals in
/// rank order) up front, so the first plan does not pay for them.
pub fn open_comms(ctxs: &[Arc<CudaContext>]) -> Result<()> {
    let gpus: Vec<usize> = ctxs.iter().map(|c| c.ordinal()).collect();
    CommCache::global()
        .get(&gpus, NcclLimits::default())?
        .warm()
}

/// Timing events of a run: a start and an end per timed (and timeline) iteration.
struct Clock {
    starts: Vec<CudaEvent>,
    ends: Vec<CudaEvent>,
}

impl Clock {
    fn new(rank: &Rank, spec: RunSpec) -> Result<Self> {
        let ev = || {
            rank.ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv("cuEventCreate"))
        };
        let n = spec.timed + usize::from(spec.timeline);
        Ok(Clock {
            starts: (0..n).map(|_| ev()).collect::<Result<_>>()?,
            ends: (0..n).map(|_| ev()).collect::<Result<_>>()?,
        })
    }

    /// Per timed iteration, ms between its events (after a synchronize).
    fn iters(&self, timed: usize) -> Result<Vec<f64>> {
        (0..timed)
            .map(|k| {
                self.starts[k]
                    .elapsed_ms(&self.ends[k])
                    .map(|t| t as f64)
                    .map_err(drv("cuEventElapsedTime"))
            })
            .collect()
    }

    /// Per task (start, end) of the timeline iteration.
    fn tasks(&self, timed: usize, task_ev: &[(CudaEvent, CudaEvent)]) -> Result<Vec<(f64, f64)>> {
        let st = &self.starts[timed];
        task_ev
            .iter()
            .map(|(a, b)| {
                Ok((
                    st.elapsed_ms(a).map_err(drv("cuEventElapsedTime"))? as f64,
                    st.elapsed_ms(b).map_err(drv("cuEventElapsedTime"))? as f64,
                ))
            })
            .collect()
    }
}

/// Records the iteration's start event (timed iterations only).
fn clock_start(clock: &Clock, spec: RunSpec, it: usize, s: &CudaStream) -> Result<()> {
    if let Some(k) = it.checked_sub(spec.warmup) {
        clock.starts[k].record(s).map_err(drv("cuEventRecord"))?;
    }
    Ok(())
}

/// Records the iteration's end event and writes `ranks`' finished count.
fn clock_end(
    sh: &Shared<'_>,
    clock: &Clock,
    it: usize,
    s: &CudaStream,
    ranks: impl Iterator<Item = usize>,
) -> Result<()> {
    if let Some(k) = it.checked_sub(sh.spec.warmup) {
        clock.ends[k].record(s).map_err(drv("cuEventRecord"))?;
    }
    for r in ranks {
        // SAFETY: word r of the run's live mapped host words.
        unsafe { cu::stream_write_value32(s.cu_stream(), sh.progress.device(r), it as u32 + 1)? };
    }
    Ok(())
}

/// Runs one rank's share of every iteration on its own thread (one GPU per
/// rank): issues without waiting for any other rank, then waits for its own
/// device work (which the watchdog releases if it hangs).
pub(crate) fn run_rank(
    rank: &mut Rank,
    sh: &Shared<'_>,
    streams: Vec<Arc<CudaStream>>,
) -> Result<RankTimes> {
    let r = rank.rank;
    let bound = rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"));
    let spec = sh.spec;
    let n_tasks = sh.plan.ranks[r].tasks.len();
    // Events and graphs exist before any rank issues work.
    let prep = (|| -> Result<_> {
        bound?;
        let iss = RankIssue::new(rank, sh, streams, spec.timeline)?;
        let clock = Clock::new(rank, spec)?;
        let mut graphs: Vec<CudaGraph> = vec![];
        let mut graph_error = None;
        if sh.graphs() {
            for parity in 0..2 {
                let g = capture(&iss.control, || {
                    iss.begin(sh, parity)?;
                    for i in 0..n_tasks {
                        iss.task(rank, sh, i, false, None)?;
                    }
                    iss.end(sh, parity)
                });
                match g {
                    Ok(g) => graphs.push(g),
                    // Capture does not work for this plan: issue directly.
                    Err(e) => {
                        graphs.clear();
                        graph_error = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        Ok((iss, clock, graphs, graph_error))
    })();
    sh.start.wait();
    let (iss, clock, graphs, graph_error) = prep?;
    let mut host_us = Vec::with_capacity(spec.timed);
    let total = sh.total();
    for it in 0..total {
        if sh.abort.load(Ordering::Acquire) {
            return Err(CudaError::Aborted);
        }
        let parity = it % 2;
        let timeline = spec.timeline && it + 1 == total;
        clock_start(&clock, spec, it, &iss.control)?;
        let t0 = Instant::now();
        let at = |step| sh.issuing.set(r, it, step);
        match graphs.get(parity) {
            Some(g) if !timeline => {
                at(Issuing::GRAPH);
                g.launch().map_err(drv("cuGraphLaunch"))?
            }
            _ => {
                at(Issuing::BEGIN);
                iss.begin(sh, parity)?;
                for i in 0..n_tasks {
                    at(i as u32);
                    iss.task(rank, sh, i, timeline, None)?;
                    let s = &iss.streams[sh.plan.ranks[r].tasks[i].stream];
                    sh.issuing.task_done(s.cu_stream(), r, i, it)?;
                }
                at(Issuing::END);
                iss.end(sh, parity)?;
            }
        }
        let took = t0.elapsed().as_secs_f64() * 1e6;
        if it >= spec.warmup && it < spec.warmup + spec.timed {
            host_us.push(took);
        }
        clock_end(sh, &clock, it, &iss.control, std::iter::once(r))?;
        at(Issuing::ISSUED);
    }
    sh.issuing.set(r, total, Issuing::SYNC);
    rank.synchronize()?;
    Ok(RankTimes {
        iters: clock.iters(spec.timed)?,
        tasks: if spec.timeline {
            clock.tasks(spec.timed, &iss.task_ev)?
        } else {
            vec![]
        },
        host_us,
        graphed: !graphs.is_empty(),
        graph_error,
    })
}

/// Every (rank, task) of the plan in one order that respects stream order
/// and every dependency, also across ranks and through flags. The order is
/// taken on the plan with every tile GEMM expanded into its blocks
/// ([`expand`]), whose blocks wait and signal independently (on 2 GPUs with
/// `-acc` each rank's GEMM waits on the peer's pushes of the peer's GEMM's
/// counters: as whole tasks, a cycle); a tile GEMM goes out where its first
/// block does. Its other blocks' producers may follow it: the kernel spins
/// on their flags on its SMs (each resident, see [`Shared::tile_share`]), it
/// does not hold up a hardware queue as a stream wait does.
fn global_order(plan: &Plan) -> Result<Vec<(usize, usize)>> {
    let flat = expand(plan);
    let origins = expand_origins(plan);
    let graph = Graph::new(&flat).map_err(|e| CudaError::Plan(e.to_string()))?;
    let preds: Vec<Vec<usize>> = (0..graph.len()).map(|v| graph.preds(v)).collect();
    let order = topo(graph.len(), &preds)
        .map_err(|v| CudaError::Plan(format!("the plan has a dependency cycle at node {v}")))?;
    let mut issued: Vec<Vec<bool>> = plan
        .ranks
        .iter()
        .map(|rp| vec![false; rp.tasks.len()])
        .collect();
    let mut out = Vec::with_capacity(plan.task_count());
    for v in order {
        let id = graph.id(v);
        let Some(&i) = origins.get(id.rank).and_then(|o| o.get(id.index)) else {
            return Err(CudaError::Plan(format!(
                "expanded task {} of rank {} has no original task",
                id.index, id.rank
            )));
        };
        if !std::mem::replace(&mut issued[id.rank][i], true) {
            out.push((id.rank, i));
        }
    }
    Ok(out)
}

/// Runs every rank of a loopback plan (all on one GPU) from this one thread.
///
/// Ranks share the device's hardware queues, so a stream blocked on a flag
/// can hold up the producer of that flag queued behind it, which a thread per
/// rank issuing in any interleaving can cause. Issued directly, every task
/// goes out in one global order that respects every dependency: then a
/// flag's producer is always queued before any waiter of it, and no queue
/// sharing can deadlock. Captured, all ranks' iteration is one graph in that
/// order, and each cross-rank dependency is also a graph edge (an event), so
/// the driver keeps the order. Iterations are timed on rank 0's control
/// stream, which forks and joins every rank's.
fn run_loopback(
    ranks: &mut [Rank],
    sh: &Shared<'_>,
    all_streams: Vec<Vec<Arc<CudaStream>>>,
) -> Result<Vec<RankTimes>> {
    let spec = sh.spec;
    let p = ranks.len();
    let prep = (|| -> Result<_> {
        ranks[0]
            .ctx
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        let order = global_order(sh.plan)?;
        let mut iss = vec![];
        for (rank, streams) in ranks.iter().zip(all_streams) {
            iss.push(RankIssue::new(rank, sh, streams, spec.timeline)?);
        }
        let clock = Clock::new(&ranks[0], spec)?;
        let plain = || ranks[0].ctx.new_event(None).map_err(drv("cuEventCreate"));
        let fork = plain()?;
        let joins: Vec<CudaEvent> = (0..p).map(|_| plain()).collect::<Result<_>>()?;
        Ok((order, iss, clock, fork, joins))
    })();
    sh.start.wait();
    let (order, iss, clock, fork, joins) = prep?;
    let control = iss[0].control.clone();
    let whole = |ranks: &mut [Rank],
                 it: usize,
                 parity: usize,
                 timeline: bool,
                 cross: Option<&CrossEvents>|
     -> Result<()> {
        fork.record(&control).map_err(drv("cuEventRecord"))?;
        for i in &iss[1..] {
            i.control.wait(&fork).map_err(drv("cuStreamWaitEvent"))?;
        }
        for i in &iss {
            i.begin(sh, parity)?;
        }
        for &(r, t) in &order {
            if cross.is_none() {
                sh.issuing.set(r, it, t as u32);
            }
            iss[r].task(&mut ranks[r], sh, t, timeline, cross)?;
            if cross.is_none() {
                let s = &iss[r].streams[sh.plan.ranks[r].tasks[t].stream];
                sh.issuing.task_done(s.cu_stream(), r, t, it)?;
            }
        }
        for i in &iss {
            i.end(sh, parity)?;
        }
        for (i, ev) in iss[1..].iter().zip(&joins) {
            ev.record(&i.control).map_err(drv("cuEventRecord"))?;
            control.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    };
    let mut graphs: Vec<CudaGraph> = vec![];
    let mut graph_error = None;
    if sh.graphs() {
        let signallers: std::collections::HashSet<(usize, usize)> =
            sh.flag_preds.iter().flatten().flatten().copied().collect();
        let cross: CrossEvents = sh
            .layout
            .signals
            .iter()
            .enumerate()
            .map(|(r, per_task)| {
                per_task
                    .iter()
                    .enumerate()
                    .map(|(i, consumers)| {
                        (!consumers.is_empty() || signallers.contains(&(r, i)))
                            .then(|| ranks[0].ctx.new_event(None).map_err(drv("cuEventCreate")))
                            .transpose()
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?;
        for parity in 0..2 {
            match capture(&control, || {
                whole(ranks, parity, parity, false, Some(&cross))
            }) {
                Ok(g) => graphs.push(g),
                Err(e) => {
                    graphs.clear();
                    graph_error = Some(e.to_string());
                    break;
                }
            }
        }
    }
    let mut host_us = Vec::with_capacity(spec.timed);
    let total = sh.total();
    for it in 0..total {
        if sh.abort.load(Ordering::Acquire) {
            return Err(CudaError::Aborted);
        }
        let parity = it % 2;
        let timeline = spec.timeline && it + 1 == total;
        clock_start(&clock, spec, it, &control)?;
        let t0 = Instant::now();
        let at = |step| (0..p).for_each(|r| sh.issuing.set(r, it, step));
        match graphs.get(parity) {
            Some(g) if !timeline => {
                at(Issuing::GRAPH);
                g.launch().map_err(drv("cuGraphLaunch"))?
            }
            _ => whole(ranks, it, parity, timeline, None)?,
        }
        let took = t0.elapsed().as_secs_f64() * 1e6 / p as f64;
        if it >= spec.warmup && it < spec.warmup + spec.timed {
            host_us.push(took);
        }
        clock_end(sh, &clock, it, &control, 0..p)?;
        at(Issuing::ISSUED);
    }
    (0..p).for_each(|r| sh.issuing.set(r, total, Issuing::SYNC));
    ranks[0].synchronize()?;
    let iters = clock.iters(spec.timed)?;
    iss.iter()
        .map(|i| {
            Ok(RankTimes {
                iters: iters.clone(),
                tasks: if spec.timeline {
                    clock.tasks(spec.timed, &i.task_ev)?
                } else {
                    vec![]
                },
                host_us: host_us.clone(),
                graphed: !graphs.is_empty(),
                graph_error: graph_error.clone(),
            })
        })
        .collect()
}

/// Whether two ranks share a GPU (loopback: P ranks on one device).
pub(crate) fn is_loopback(ranks: &[Rank]) -> bool {
    let mut seen = std::collections::HashSet::new();
    !ranks.iter().all(|r| seen.insert(r.ctx.ordinal()))
}

/// Why a plan cannot run in loopback, if it cannot.
pub(crate) const NCCL_IN_LOOPBACK: &str = "NCCL cannot run several ranks on one GPU (loopback)";

/// Runs `plan` on every rank: one host thread per rank that only issues, or
/// in loopback one thread for all ranks ([`run_loopback`]). The calling
/// thread is the watchdog ([`super::watchdog`]): a run in which no rank
/// finishes an iteration for `opts.watchdog_ms` fails with
/// [`CudaError::Hang`] naming the rank and plan point.
pub fn run_plan_with(
    ranks: &mut [Rank],
    plan: &Plan,
    ptrs: &[Vec<DevicePtr>],
    spec: RunSpec,
    opts: RunOpts,
) -> Result<Vec<RankTimes>> {
    run_plan_in(ranks, plan, ptrs, spec, opts, None)
}

/// How a run reaches the ranks other processes drive (one process per GPU,
/// see [`crate::session::Session`]): their flags mapped here, this rank's
/// communicator, and the job's barriers around the run.
pub(crate) struct JobRun<'a> {
    pub rv: &'a dyn JobLink,
    /// Every rank's flag memory as mapped here (NULL: a rank of another
    /// node), `flag_words` words each.
    pub flags: Vec<DevicePtr>,
    pub flag_words: usize,
    /// Every rank of the job shares one GPU (no NCCL; tile GEMMs share SMs).
    pub loopback: bool,
    /// This rank's communicator under the plan's limits (`None` in loopback).
    pub comm: Option<CommHandle>,
    /// Names this run's barriers; the same on every rank.
    pub tag: u64,
}

/// [`run_plan_with`] for `ranks` of the plan (`Rank::rank` is the plan
/// rank), the others driven by other processes of `job`. Every rank resets
/// its own flags, then a job barrier; after the run each rank waits for its
/// device, then a second barrier, so no write of this run lands in a flag
/// the next run has reset. A failure here is passed to every rank through
/// the store.
pub(crate) fn run_plan_in(
    ranks: &mut [Rank],
    plan: &Plan,
    ptrs: &[Vec<DevicePtr>],
    spec: RunSpec,
    opts: RunOpts,
    job: Option<&JobRun<'_>>,
) -> Result<Vec<RankTimes>> {
    let world = plan.ranks.len();
    let expected = job.map_or(ranks.len(), |j| j.rv.world_size());
    if world != expected || ranks.is_empty() || ranks.iter().any(|r| r.rank >= world) {
        return Err(CudaError::Plan(format!(
            "plan has {world} ranks but the job has {expected} ({} driven here)",
            ranks.len()
        )));
    }
    if ptrs.len() != world {
        return Err(CudaError::Plan(format!(
            "{} ranks' buffers bound for a plan of {world} ranks",
            ptrs.len()
        )));
    }
    let res = run_bound(ranks, plan, ptrs, spec, opts, job);
    let Some(j) = job else {
        return res;
    };
    match res {
        Ok(t) => {
            j.rv.barrier(&format!("run/{}/done", j.tag))?;
            Ok(t)
        }
        Err(e) => Err(j.rv.abort_on(e)),
    }
}

fn run_bound(
    ranks: &mut [Rank],
    plan: &Plan,
    ptrs: &[Vec<DevicePtr>],
    spec: RunSpec,
    opts: RunOpts,
    job: Option<&JobRun<'_>>,
) -> Result<Vec<RankTimes>> {
    let world = plan.ranks.len();
    // Several ranks on one device: no NCCL, tile GEMMs share the SMs.
    let loopback = job.map_or_else(|| is_loopback(ranks), |j| j.loopback);
    // Several of this process's ranks on one device: one issuing thread.
    let one_thread = is_loopback(ranks);
    let has_nccl = plan.has_task(|k| matches!(k, TaskKind::Nccl { .. }));
    if loopback && has_nccl {
        return Err(CudaError::Skipped(NCCL_IN_LOOPBACK.into()));
    }
    for (r, rp) in plan.ranks.iter().enumerate() {
        if rp.streams.is_empty() && !rp.tasks.is_empty() {
            return Err(CudaError::Plan(format!(
                "rank {r} has tasks but no streams"
            )));
        }
    }
    // The one validator (ficco_core::plan::validate) accepted every plan
    // that reaches here; only the binding to device memory is checked.
    precheck(plan, ptrs)?;
    let layout = SignalLayout::new(plan);
    // All allocation and kernel loading happens here, before any rank issues
    // work (either can wait for a device to go idle).
    let mut all_streams = vec![];
    let mut flags = job.map_or_else(|| vec![DevicePtr::NULL; world], |j| j.flags.clone());
    let mut tables = vec![TileTables::default(); world];
    let tile_share = tile_share(plan, loopback);
    let local: Vec<usize> = ranks.iter().map(|r| r.rank).collect();
    for rank in ranks.iter_mut() {
        let r = rank.rank;
        trace(|| format!("run {}: rank {r} streams, GEMM warm-up, flags", plan.name));
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        all_streams.push(rank.plan_streams(&plan.ranks[r], &plan.resources)?);
        rank.prewarm_gemms(&plan.ranks[r], &plan.resources, &ptrs[r], opts.grouped)?;
        rank.prepare_own_gemm(
            &plan.ranks[r],
            &plan.resources,
            &ptrs[r],
            tile_share.get(r).copied().unwrap_or(1),
            opts.grouped,
        )?;
        flags[r] = match job {
            None => rank.reset_flags(layout.words[r], layout.bank(r, 1))?,
            Some(j) => {
                if layout.words[r] > j.flag_words || j.flags[r].is_null() {
                    return Err(CudaError::Plan(format!(
                        "rank {r} needs {} signal words, the job's flag memory holds {}",
                        layout.words[r], j.flag_words
                    )));
                }
                // Every word the job holds, not only this plan's: words of
                // plans run before (or released by a watchdog) must be 0
                // before any later plan's fast calls ([`super::op`]).
                rank.reset_flags_at(j.flags[r], j.flag_words.max(1), layout.bank(r, 1))?;
                j.flags[r]
            }
        };
        tables[r] = rank.tile_tables(&plan.ranks[r], &ptrs[r])?;
    }
    // Contexts by plan rank; a rank of another process has its memory
    // mapped into this process's context.
    let mut ctxs: Vec<Arc<CudaContext>> = vec![ranks[0].ctx.clone(); world];
    for rank in ranks.iter() {
        ctxs[rank.rank] = rank.ctx.clone();
    }
    // The communicators under the plan's NCCL limits (default limits when
    // the plan sets none): one set per limits, cached for the process and
    // warmed up at first use. None in loopback.
    trace(|| format!("run {}: communicators", plan.name));
    let comms: Vec<Option<CommHandle>> = if let Some(j) = job {
        (0..world)
            .map(|q| if q == local[0] { j.comm } else { None })
            .collect()
    } else if loopback {
        vec![None; world]
    } else {
        let limits = NcclLimits {
            max_ctas: plan.resources.nccl_ctas.map(|c| c as u32),
            ..NcclLimits::default()
        };
        let set = comm_set(ranks, limits)?;
        set.warm()?;
        set.comms()
            .iter()
            .map(|c| Some(CommHandle(c.raw())))
            .collect()
    };
    ranks[0]
        .ctx
        .bind_to_thread()
        .map_err(drv("cuCtxSetCurrent"))?;
    let progress = HostWords::new(world)?;
    let diag = HostWords::new(layout.words.iter().copied().max().unwrap_or(1))?;
    let threads = if one_thread { 1 } else { ranks.len() };
    let start = std::sync::Barrier::new(threads);
    let events = same_rank_events(plan);
    let flag_preds = flag_preds(plan)?;
    let abort = AtomicBool::new(false);
    let issuing = Issuing::for_plan(plan)?;
    let sh = Shared {
        shares_gpu: loopback,
        plan,
        ptrs,
        ctxs: &ctxs,
        comms: &comms,
        local: &local,
        layout: &layout,
        flags: &flags,
        progress: &progress,
        diag: &diag,
        events: &events,
        flag_preds: &flag_preds,
        tile_share: &tile_share,
        tables: &tables,
        spec,
        opts,
        start: &start,
        abort: &abort,
        issuing: &issuing,
    };
    if let Some(j) = job {
        // Every rank's flags are reset before any rank may write them.
        j.rv.barrier(&format!("run/{}/ready", j.tag))?;
        if kill_hook() == Some(j.rv.rank()) {
            eprintln!(
                "ficco: rank {} exits now ({}, a test of rank failure)",
                j.rv.rank(),
                ficco_core::settings::TEST_KILL_RANK
            );
            std::process::exit(3);
        }
    }
    trace(|| format!("run {}: issuing threads start", plan.name));
    let finished = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let mut hang: Option<CudaError> = None;
    let results: Vec<Result<RankTimes>> = std::thread::scope(|s| {
        let (sh, finished, failed) = (&sh, &finished, &failed);
        let done = |ok: bool, ranks: &[Rank]| {
            if !ok {
                failed.store(true, Ordering::Release);
                for rank in ranks {
                    let _ = rank.synchronize();
                }
            }
            finished.fetch_add(1, Ordering::AcqRel);
        };
        let handles: Vec<_> = if one_thread {
            vec![s.spawn(move || {
                let res = run_loopback(ranks, sh, all_streams);
                done(res.is_ok(), ranks);
                match res {
                    Ok(v) => v.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                }
            })]
        } else {
            ranks
                .iter_mut()
                .zip(all_streams)
                .map(|(rank, streams)| {
                    s.spawn(move || {
                        let res = run_rank(rank, sh, streams);
                        done(res.is_ok(), std::slice::from_ref(rank));
                        vec![res]
                    })
                })
                .collect()
        };
        hang = watchdog(sh, &ctxs, finished, failed, threads);
        handles
            .into_iter()
            .enumerate()
            .flat_map(|(i, h)| {
                h.join().unwrap_or_else(|_| {
                    vec![Err(CudaError::Worker(local.get(i).copied().unwrap_or(i)))]
                })
            })
            .collect()
    });
    trace(|| {
        format!(
            "run {}: threads joined (hang: {})",
            plan.name,
            hang.is_some()
        )
    });
    if let Some(h) = hang {
        return Err(h);
    }
    // The first real failure, not the ranks that stopped because of it.
    if let Some(pos) = results
        .iter()
        .position(|r| matches!(r, Err(e) if !matches!(e, CudaError::Aborted)))
    {
        return Err(results
            .into_iter()
            .nth(pos)
            .and_then(|r| r.err())
            .unwrap_or(CudaError::Aborted));
    }
    results.into_iter().collect()
}
