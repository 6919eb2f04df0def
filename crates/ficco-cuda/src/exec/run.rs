//! The run loop: [`run_plan_with`] picks the plan's communicators, prepares every
//! rank (streams, GEMM warm-up, ficco's own GEMM, signal flags), then runs one host
//! thread per rank through warm-up, timed and timeline iterations
//! ([`run_rank`]). Cross-rank dependencies are device-side signals
//! ([`crate::signal`]): host threads only issue, and the calling thread is the
//! watchdog that ends a hung run (see [`run_plan_with`]).

use super::check::precheck;
use super::issue::issue;
use super::rank::Rank;
use crate::comm::{CommCache, CommSet, NcclLimits};
use crate::driver::cuda as cu;
use crate::driver::nccl::RawComm;
use crate::error::{drv, CudaError, Result};
use crate::mem::DevicePtr;
use crate::signal::{word, HostWords, Point, SignalLayout};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use ficco_core::plan::{Plan, TaskKind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default watchdog bound: a run in which no rank finishes an iteration for
/// this long is ended with [`CudaError::Hang`]. `FICCO_WATCHDOG_MS` overrides it.
pub const DEFAULT_WATCHDOG_MS: u64 = 10_000;

/// The watchdog bound: `FICCO_WATCHDOG_MS` when set to a positive integer,
/// else [`DEFAULT_WATCHDOG_MS`].
pub(crate) fn watchdog_ms() -> u64 {
    std::env::var("FICCO_WATCHDOG_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v > 0)
        .unwrap_or(DEFAULT_WATCHDOG_MS)
}

/// How to run a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSpec {
    /// Iterations run before the timed ones.
    pub warmup: usize,
    /// Timed iterations (0: run `warmup` iterations only, no timing).
    pub timed: usize,
    /// Record per-task events in one extra iteration after the timed ones.
    pub timeline: bool,
}

impl RunSpec {
    /// Run the plan once, untimed (reference runs and correctness checks).
    pub const ONCE: RunSpec = RunSpec {
        warmup: 1,
        timed: 0,
        timeline: false,
    };
}

/// Run-wide options that are not about timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOpts {
    /// Watchdog bound in ms (see [`watchdog_ms`]).
    pub watchdog_ms: u64,
    /// Test hook: the producer of this point never writes its signal flags,
    /// so its consumers wait forever (the watchdog test).
    pub drop_signal: Option<(usize, usize)>,
}

impl Default for RunOpts {
    fn default() -> Self {
        RunOpts {
            watchdog_ms: watchdog_ms(),
            drop_signal: None,
        }
    }
}

/// What one rank's thread measured.
#[derive(Debug, Clone, Default)]
pub struct RankTimes {
    /// Per timed iteration, ms from start to end on this rank.
    pub iters: Vec<f64>,
    /// Per task (start, end) in ms from the iteration start, when asked.
    pub tasks: Vec<(f64, f64)>,
    /// Per timed iteration, host µs this thread spent issuing the plan: every
    /// launch, copy, event record, signal write and signal wait, from the
    /// start event to the end event (no CUDA graphs).
    pub host_us: Vec<f64>,
}

/// Per rank per task: a task of another stream *of the same rank* waits for
/// it, so it records an event (other ranks wait on signal flags).
fn same_rank_events(plan: &Plan) -> Vec<Vec<bool>> {
    plan.ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            let mut need = vec![false; rp.tasks.len()];
            for t in &rp.tasks {
                for d in t.deps.iter().filter(|d| d.rank == r) {
                    if rp.tasks.get(d.index).is_some_and(|p| p.stream != t.stream) {
                        need[d.index] = true;
                    }
                }
            }
            need
        })
        .collect()
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

/// The NCCL communicator a rank uses for one plan.
#[derive(Clone, Copy)]
pub(crate) struct CommHandle(pub(crate) RawComm);
// SAFETY: each handle is used by its rank's thread only during a run.
unsafe impl Send for CommHandle {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for CommHandle {}

/// Everything the rank threads share for one run.
pub(crate) struct Shared<'a> {
    pub plan: &'a Plan,
    /// Base pointers per rank per buffer.
    pub ptrs: &'a [Vec<DevicePtr>],
    /// Raw context of each rank (peer copies name both).
    pub ctxs: &'a [Arc<CudaContext>],
    /// Each rank's communicator for this plan (its NCCL limits); empty in
    /// loopback (no NCCL task runs there).
    pub comms: &'a [CommHandle],
    /// Where every signal flag is.
    pub layout: &'a SignalLayout,
    /// Base of each rank's flag buffer.
    pub flags: &'a [DevicePtr],
    /// Per rank, the last iteration its control stream finished.
    pub progress: &'a HostWords,
    /// Where the watchdog reads a rank's flags (as many words as the largest rank's).
    pub diag: &'a HostWords,
    /// Per rank per task: another stream of the same rank waits for it.
    pub events: &'a [Vec<bool>],
    pub spec: RunSpec,
    pub opts: RunOpts,
    /// Every rank thread passes it once its events exist.
    pub start: &'a std::sync::Barrier,
}

impl Shared<'_> {
    /// Makes `stream` of rank `r` wait until `producer`'s flag on `r` is >= `epoch`.
    fn wait_signal(
        &self,
        r: usize,
        stream: &CudaStream,
        producer: Point,
        epoch: u32,
    ) -> Result<()> {
        let w = self.layout.slot(producer, r).ok_or_else(|| {
            CudaError::Plan(format!("no signal flag for {producer:?} on rank {r}"))
        })?;
        // SAFETY: the flag word is inside rank r's live flag buffer (sized
        // to the layout), on the stream's device.
        unsafe { cu::stream_wait_value32_geq(stream.cu_stream(), word(self.flags[r], w), epoch) }
    }

    /// Writes `epoch` into every consumer's flag for `point` after the work
    /// on `stream` so far.
    fn signal(&self, stream: &CudaStream, point: Point, epoch: u32) -> Result<()> {
        if self.opts.drop_signal == Some((point.rank, point.index)) {
            return Ok(());
        }
        let Some(consumers) = self
            .layout
            .signals
            .get(point.rank)
            .and_then(|s| s.get(point.index))
        else {
            return Ok(());
        };
        for &(q, w) in consumers {
            // SAFETY: the word is inside rank q's live flag buffer; peer
            // access is enabled between the devices (or it is the same device).
            unsafe { cu::stream_write_value32(stream.cu_stream(), word(self.flags[q], w), epoch)? };
        }
        Ok(())
    }
}

/// Runs one rank's share of `warmup + timed (+1)` iterations: issues
/// everything without waiting for any other rank, then waits for its own
/// device work (which the watchdog releases if it hangs).
pub(crate) fn run_rank(
    rank: &mut Rank,
    sh: &Shared<'_>,
    streams: Vec<Arc<CudaStream>>,
) -> Result<RankTimes> {
    let r = rank.rank;
    let bound = rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"));
    let rp = &sh.plan.ranks[r];
    let n_ranks = sh.plan.ranks.len();
    let n_tasks = rp.tasks.len();
    let ctx = rank.ctx.clone();
    let timed_ev = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventCreate"))
    };
    let plain_ev = || ctx.new_event(None).map_err(drv("cuEventCreate"));
    let spec = sh.spec;
    let total = spec.warmup + spec.timed + usize::from(spec.timeline);
    // Create every event before any rank issues work, then start together.
    let prep = (|| -> Result<_> {
        bound?;
        let mut starts: Vec<CudaEvent> = vec![];
        let mut ends: Vec<CudaEvent> = vec![];
        for _ in 0..spec.timed + usize::from(spec.timeline) {
            starts.push(timed_ev()?);
            ends.push(timed_ev()?);
        }
        let mut task_ev: Vec<(CudaEvent, CudaEvent)> = vec![];
        if spec.timeline {
            for _ in 0..n_tasks {
                task_ev.push((timed_ev()?, timed_ev()?));
            }
        }
        let go = plain_ev()?;
        let stream_done: Vec<CudaEvent> =
            streams.iter().map(|_| plain_ev()).collect::<Result<_>>()?;
        let point_ev: Vec<Option<CudaEvent>> = sh.events[r]
            .iter()
            .map(|&need| need.then(plain_ev).transpose())
            .collect::<Result<_>>()?;
        Ok((starts, ends, task_ev, go, stream_done, point_ev))
    })();
    sh.start.wait();
    let (starts, ends, task_ev, go, stream_done, point_ev) = prep?;
    let mut host_us = Vec::with_capacity(spec.timed);
    let control = rank.control().clone();
    for it in 0..total {
        let epoch = (it + 1) as u32;
        // Barrier: wait for every other rank's end of the previous iteration
        // (this rank's own end is earlier on this control stream).
        if it > 0 {
            for q in (0..n_ranks).filter(|&q| q != r) {
                let end = Point {
                    rank: q,
                    index: sh.plan.ranks[q].tasks.len(),
                };
                sh.wait_signal(r, &control, end, epoch - 1)?;
            }
        }
        let timed_slot = it.checked_sub(spec.warmup);
        let issue_start = Instant::now();
        if let Some(k) = timed_slot {
            starts[k].record(&control).map_err(drv("cuEventRecord"))?;
        }
        go.record(&control).map_err(drv("cuEventRecord"))?;
        for s in &streams {
            s.wait(&go).map_err(drv("cuStreamWaitEvent"))?;
        }
        let in_timeline = spec.timeline && it + 1 == total;
        for (i, task) in rp.tasks.iter().enumerate() {
            let stream = streams.get(task.stream).ok_or_else(|| {
                CudaError::Plan(format!("task {i} of rank {r} names stream {}", task.stream))
            })?;
            for d in &task.deps {
                if d.rank == r {
                    // Stream order already keeps a dependency on the same stream.
                    if let Some(ev) = point_ev.get(d.index).and_then(|e| e.as_ref()) {
                        if rp.tasks[d.index].stream != task.stream {
                            stream.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
                        }
                    }
                } else {
                    let p = Point {
                        rank: d.rank,
                        index: d.index,
                    };
                    sh.wait_signal(r, stream, p, epoch)?;
                }
            }
            if in_timeline {
                task_ev[i].0.record(stream).map_err(drv("cuEventRecord"))?;
            }
            issue(rank, sh, stream, task.stream, &task.kind)?;
            if in_timeline {
                task_ev[i].1.record(stream).map_err(drv("cuEventRecord"))?;
            }
            if let Some(Some(ev)) = point_ev.get(i) {
                ev.record(stream).map_err(drv("cuEventRecord"))?;
            }
            sh.signal(stream, Point { rank: r, index: i }, epoch)?;
        }
        for (s, ev) in streams.iter().zip(&stream_done) {
            ev.record(s).map_err(drv("cuEventRecord"))?;
            control.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
        }
        if let Some(k) = timed_slot {
            ends[k].record(&control).map_err(drv("cuEventRecord"))?;
        }
        sh.signal(
            &control,
            Point {
                rank: r,
                index: n_tasks,
            },
            epoch,
        )?;
        // SAFETY: word r of the run's live mapped host words.
        unsafe { cu::stream_write_value32(control.cu_stream(), sh.progress.device(r), epoch)? };
        if let Some(k) = timed_slot {
            if k < spec.timed {
                host_us.push(issue_start.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    rank.synchronize()?;
    let mut out = RankTimes {
        host_us,
        ..RankTimes::default()
    };
    for k in 0..spec.timed {
        out.iters.push(
            starts[k]
                .elapsed_ms(&ends[k])
                .map_err(drv("cuEventElapsedTime"))? as f64,
        );
    }
    if spec.timeline {
        let st = &starts[spec.timed];
        for (a, b) in &task_ev {
            out.tasks.push((
                st.elapsed_ms(a).map_err(drv("cuEventElapsedTime"))? as f64,
                st.elapsed_ms(b).map_err(drv("cuEventElapsedTime"))? as f64,
            ));
        }
    }
    Ok(out)
}

/// Whether two ranks share a GPU (loopback: P ranks on one device).
pub(crate) fn is_loopback(ranks: &[Rank]) -> bool {
    let mut seen = std::collections::HashSet::new();
    !ranks.iter().all(|r| seen.insert(r.ctx.ordinal()))
}

/// Why a plan cannot run in loopback, if it cannot.
pub(crate) const NCCL_IN_LOOPBACK: &str = "NCCL cannot run several ranks on one GPU (loopback)";

/// Runs `plan` on every rank, one host thread per rank that only issues.
///
/// **Watchdog.** The calling thread watches each rank's finished iteration
/// (a mapped host word its control stream writes). When no rank finishes an
/// iteration for `opts.watchdog_ms`, or a rank thread failed, it reads the
/// flags to find the first unsatisfied wait, then writes `RELEASED` (2^30) into
/// every flag of the run from a side stream: every wait is satisfied, the
/// streams drain, the rank threads return, and the run fails with
/// [`CudaError::Hang`] naming the rank and plan point. Its side work never
/// blocks (polled for at most a second). When the device does not drain
/// after [`GIVE_UP_ROUNDS`] releases, one bound apart (a kernel or NCCL call
/// that never ends), no thread can be joined, and the watchdog ends the
/// process with status [`HANG_EXIT_CODE`] after printing the hang.
pub fn run_plan_with(
    ranks: &mut [Rank],
    plan: &Plan,
    ptrs: &[Vec<DevicePtr>],
    spec: RunSpec,
    opts: RunOpts,
) -> Result<Vec<RankTimes>> {
    if plan.ranks.len() != ranks.len() {
        return Err(CudaError::Plan(format!(
            "plan has {} ranks but the backend drives {} GPUs",
            plan.ranks.len(),
            ranks.len()
        )));
    }
    let loopback = is_loopback(ranks);
    let has_nccl = plan.ranks.iter().any(|rp| {
        rp.tasks
            .iter()
            .any(|t| matches!(t.kind, TaskKind::Nccl { .. }))
    });
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
    let mut flags = vec![];
    for (r, rank) in ranks.iter_mut().enumerate() {
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        all_streams.push(rank.plan_streams(&plan.ranks[r], &plan.resources)?);
        rank.prewarm_gemms(&plan.ranks[r], &plan.resources, &ptrs[r])?;
        rank.prepare_own_gemm(&plan.ranks[r], &plan.resources)?;
        flags.push(rank.reset_flags(layout.words[r])?);
    }
    let ctxs: Vec<Arc<CudaContext>> = ranks.iter().map(|r| r.ctx.clone()).collect();
    // The communicators under the plan's NCCL limits (default limits when
    // the plan sets none): one set per limits, cached for the process and
    // warmed up at first use. None in loopback.
    let comms: Vec<CommHandle> = if loopback {
        vec![]
    } else {
        let limits = NcclLimits {
            max_ctas: plan.resources.nccl_ctas.map(|c| c as u32),
            ..NcclLimits::default()
        };
        let set = comm_set(ranks, limits)?;
        set.warm()?;
        set.comms().iter().map(|c| CommHandle(c.raw())).collect()
    };
    ranks[0]
        .ctx
        .bind_to_thread()
        .map_err(drv("cuCtxSetCurrent"))?;
    let progress = HostWords::new(ranks.len())?;
    let diag = HostWords::new(layout.words.iter().copied().max().unwrap_or(1))?;
    let start = std::sync::Barrier::new(ranks.len());
    let events = same_rank_events(plan);
    let sh = Shared {
        plan,
        ptrs,
        ctxs: &ctxs,
        comms: &comms,
        layout: &layout,
        flags: &flags,
        progress: &progress,
        diag: &diag,
        events: &events,
        spec,
        opts,
        start: &start,
    };
    let total = (spec.warmup + spec.timed + usize::from(spec.timeline)) as u32;
    let finished = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let mut hang: Option<CudaError> = None;
    let results: Vec<Result<RankTimes>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter_mut()
            .zip(all_streams)
            .map(|(rank, streams)| {
                let (sh, finished, failed) = (&sh, &finished, &failed);
                s.spawn(move || {
                    let res = run_rank(rank, sh, streams);
                    if res.is_err() {
                        failed.store(true, Ordering::Release);
                        let _ = rank.synchronize();
                    }
                    finished.fetch_add(1, Ordering::AcqRel);
                    res
                })
            })
            .collect();
        hang = watchdog(&sh, &ctxs, &finished, &failed, total);
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| h.join().unwrap_or(Err(CudaError::Worker(r))))
            .collect()
    });
    if let Some(h) = hang {
        return Err(h);
    }
    let mut out = Vec::with_capacity(results.len());
    for res in results {
        out.push(res?);
    }
    Ok(out)
}

/// Releases the watchdog tries before it ends the process.
const GIVE_UP_ROUNDS: u32 = 3;

/// Exit status of a process the watchdog ends (EX_SOFTWARE).
pub const HANG_EXIT_CODE: i32 = 70;

/// The watchdog loop (see [`run_plan_with`]): returns the hang, if one was found.
fn watchdog(
    sh: &Shared<'_>,
    ctxs: &[Arc<CudaContext>],
    finished: &AtomicUsize,
    failed: &AtomicBool,
    total: u32,
) -> Option<CudaError> {
    let n = ctxs.len();
    let bound = Duration::from_millis(sh.opts.watchdog_ms);
    let snapshot = || (0..n).map(|r| sh.progress.get(r)).collect::<Vec<u32>>();
    let mut last = snapshot();
    let mut last_change = Instant::now();
    let mut hang = None;
    let mut released_on_failure = false;
    let mut rounds = 0;
    while finished.load(Ordering::Acquire) < n {
        std::thread::sleep(Duration::from_micros(100));
        if failed.load(Ordering::Acquire) && !released_on_failure {
            // A rank failed to issue: its consumers would wait forever.
            let _ = release_all(sh, ctxs);
            released_on_failure = true;
            continue;
        }
        let now = snapshot();
        if now != last {
            last = now;
            last_change = Instant::now();
            continue;
        }
        if last.iter().all(|&p| p >= total) || last_change.elapsed() < bound {
            continue;
        }
        if hang.is_none() {
            let waited_ms = last_change.elapsed().as_millis() as u64;
            let (rank, point) = diagnose(sh, ctxs, &last);
            hang = Some(CudaError::Hang {
                rank,
                point,
                waited_ms,
            });
        }
        let released = release_all(sh, ctxs);
        rounds += 1;
        if rounds >= GIVE_UP_ROUNDS {
            // The device does not drain even with every wait released (a
            // kernel or an NCCL call never ends, or the watchdog's own side
            // streams cannot run): no thread of this process can be joined.
            eprintln!(
                "ficco: watchdog: {} and the device did not drain after {rounds} releases \
                 (flag writes completed: {released}); exiting",
                hang.as_ref().map(|h| h.to_string()).unwrap_or_default()
            );
            std::process::exit(HANG_EXIT_CODE);
        }
        last_change = Instant::now();
    }
    hang
}

/// How long the watchdog waits for its own side work (a flag read or release).
const SIDE_WORK_MS: u64 = 1000;

/// Runs `f` on a fresh non-blocking stream of `ctx` and polls it for at most
/// [`SIDE_WORK_MS`]. Returns whether the work finished; the stream is
/// destroyed either way (the driver frees it once its work is done). Never
/// blocks on a stuck device.
fn on_side_stream(
    ctx: &Arc<CudaContext>,
    f: impl FnOnce(cudarc::driver::sys::CUstream) -> Result<()>,
) -> Result<bool> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let s = cu::stream_create_nonblocking()?;
    let res = f(s);
    let deadline = Instant::now() + Duration::from_millis(SIDE_WORK_MS);
    let mut done = false;
    while res.is_ok() && Instant::now() < deadline {
        // SAFETY: `s` is live until destroyed below.
        if unsafe { cu::stream_done(s) }.unwrap_or(true) {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    // SAFETY: created above, destroyed once; pending work still completes.
    unsafe { cu::stream_destroy(s) };
    res.map(|_| done)
}

/// The value the watchdog writes into every flag. `CU_STREAM_WAIT_VALUE_GEQ`
/// compares `(int32_t)(*addr - value) >= 0`, so `u32::MAX` would satisfy no
/// wait; 2^30 satisfies every epoch below 2^30.
const RELEASED: u32 = 1 << 30;

/// Writes [`RELEASED`] into every flag of the run: every wait is satisfied.
/// Returns whether every write was seen to complete.
fn release_all(sh: &Shared<'_>, ctxs: &[Arc<CudaContext>]) -> bool {
    let mut all = true;
    for (r, ctx) in ctxs.iter().enumerate() {
        let words = sh.layout.words[r];
        if words == 0 {
            continue;
        }
        let done = on_side_stream(ctx, |s| {
            // SAFETY: rank r's live flag buffer holds `words` words.
            unsafe { cu::memset_d32_async(sh.flags[r], RELEASED, words, s) }
        });
        all &= matches!(done, Ok(true));
    }
    all
}

/// The first wait (task waits before barrier waits) whose flag is below its
/// epoch, as (rank, description).
fn diagnose(sh: &Shared<'_>, ctxs: &[Arc<CudaContext>], progress: &[u32]) -> (usize, String) {
    let plan = sh.plan;
    let label = |p: Point| {
        plan.ranks[p.rank]
            .tasks
            .get(p.index)
            .map(|t| format!("task {} '{}'", p.index, t.label))
            .unwrap_or_else(|| "end of iteration".into())
    };
    let mut values: Vec<Vec<u32>> = vec![];
    for (r, ctx) in ctxs.iter().enumerate() {
        // No pinned allocation or free here: cuMemFreeHost synchronizes the
        // device, which is what is stuck. `sh.diag` lives until the run ends,
        // after the device drained.
        let words = sh.layout.words[r];
        let host = sh.diag;
        let res = on_side_stream(ctx, |s| {
            // SAFETY: rank r's live flag buffer holds `words` words and the
            // mapped diagnostic buffer at least as many (run_plan_with).
            unsafe { cu::memcpy_dtod_async(host.device(0), sh.flags[r], words * 4, s) }
        });
        if matches!(res, Ok(true)) {
            values.push((0..words).map(|i| host.get(i)).collect());
        } else {
            values.push(vec![u32::MAX; words]);
        }
    }
    let unsatisfied = |r: usize, producer: Point, epoch: u32| {
        sh.layout
            .slot(producer, r)
            .is_some_and(|w| values[r].get(w).is_some_and(|&v| v < epoch))
    };
    for (r, rp) in plan.ranks.iter().enumerate() {
        if progress[r] >= (sh.spec.warmup + sh.spec.timed + usize::from(sh.spec.timeline)) as u32 {
            continue;
        }
        let epoch = progress[r] + 1;
        for (i, t) in rp.tasks.iter().enumerate() {
            for d in t.deps.iter().filter(|d| d.rank != r) {
                let p = Point {
                    rank: d.rank,
                    index: d.index,
                };
                if unsatisfied(r, p, epoch) {
                    return (
                        r,
                        format!(
                            "task {i} '{}' (iteration {epoch}) waiting for the signal of rank {} {}",
                            t.label,
                            d.rank,
                            label(p)
                        ),
                    );
                }
            }
        }
    }
    for (r, _) in plan.ranks.iter().enumerate() {
        let epoch = progress[r] + 1;
        for q in (0..plan.ranks.len()).filter(|&q| q != r) {
            let end = Point {
                rank: q,
                index: plan.ranks[q].tasks.len(),
            };
            if epoch > 1 && unsatisfied(r, end, epoch - 1) {
                return (
                    r,
                    format!(
                        "start of iteration {epoch}, waiting for rank {q}'s end of iteration {}",
                        epoch - 1
                    ),
                );
            }
        }
    }
    let r = progress
        .iter()
        .enumerate()
        .min_by_key(|(_, &p)| p)
        .map(|(r, _)| r)
        .unwrap_or(0);
    (
        r,
        format!(
            "iteration {}: no unsatisfied signal wait (a kernel, copy or NCCL call does not finish)",
            progress.get(r).copied().unwrap_or(0) + 1
        ),
    )
}
