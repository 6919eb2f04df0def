//! One rank's iteration, issued call by call: the barrier
//! ([`RankIssue::begin`]), each task with its waits and signals
//! ([`RankIssue::task`]) and the end ([`RankIssue::end`]). The same calls
//! either run directly or are captured once per parity into a CUDA graph
//! ([`capture`]) that each iteration replays: the flag protocol of
//! [`crate::signal`] uses constant values, so a captured iteration is
//! replayable.

use super::issue::issue;
use super::rank::Rank;
use super::shared::Shared;
use crate::driver::cuda::{self as cu, MemOp, MemOpQueue};
use crate::error::{drv, CudaError, Result};
use crate::signal::{word, Point, SET};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaFunction, CudaGraph, CudaStream};
use ficco_core::plan::graph::Graph;
use std::sync::Arc;

/// Per rank per task: an event recorded after the task when another rank
/// waits for it, or when it is the Signal task of a Wait task's flag. Only
/// for a loopback capture, where every rank is in one graph: the event turns
/// each cross-rank dependency and each Signal -> Wait pair into a graph
/// edge, so the driver orders producer before consumer on the device's
/// shared hardware queues (the flag wait stays in the graph too). A tile
/// GEMM block's counter gets no such edge (it could only follow the whole
/// GEMM, and the counters are waited on while it runs): every other stream
/// of the rank follows the GEMM's launch instead (`launched`, a
/// `LAUNCH_ORDER` edge), and plans whose tile GEMMs wait on flags are not
/// captured at all ([`super::shared::graph_safe`]).
pub(crate) type CrossEvents = Vec<Vec<Option<CudaEvent>>>;

/// The events and streams one rank issues an iteration with.
pub(crate) struct RankIssue {
    pub r: usize,
    pub streams: Vec<Arc<CudaStream>>,
    pub control: Arc<CudaStream>,
    go: CudaEvent,
    stream_done: Vec<CudaEvent>,
    /// Per task: another stream of this rank waits for it.
    point_ev: Vec<Option<CudaEvent>>,
    /// Per task (start, end) timing events, when a timeline is asked for.
    pub task_ev: Vec<(CudaEvent, CudaEvent)>,
    /// Per task: its cross-rank flag waits, and the flags it sets after it
    /// (derived once per run, so issuing does no lookups).
    flag_waits: Vec<Vec<MemOp>>,
    flag_writes: Vec<Vec<MemOp>>,
    /// `ficco_signal`, where flags may go by kernel ([`Shared::flag_kernels`]).
    signal: Option<CudaFunction>,
    /// Per task: its (waits, writes) go by the signal kernel (see
    /// [`kernel_flags`]).
    kernel_task: Vec<(bool, bool)>,
    /// Per task: for a tile GEMM whose blocks wait on no flag, an event its
    /// launch records once every block has begun; every other stream of
    /// the rank waits for it before its next task, so no wait on the GEMM's
    /// counters is queued ahead of its launch, also in a graph
    /// ([`Shared::graphs`]).
    launched: Vec<Option<CudaEvent>>,
}

/// Per task of rank `r` of `plan`: whether its flag waits (issued on its
/// stream just before it) and its flag writes (just after it) may go by the
/// signal kernel ([`cu::signal_kernel`]). A warp resident beside a GEMM that
/// fills the SMs slows that GEMM, so a group may only where no SM task
/// (GEMM, reduce, NCCL) of another stream of the rank can be running: every
/// such task has ended before (it happens before the task) or starts only
/// after (it waits, through dependencies and stream order, for the task, or
/// for a writes group, for the next task on the stream). In ag-gemm's copy
/// schedules that is the GEMM stream's waits for landed chunks; in the
/// reductions, the waits of a reduce that follows the last GEMM and the
/// writes after the broadcasts; never the copies' flags while GEMMs run.
/// Order is read from the plan's graph ([`Graph`]), the rank's own edges
/// only (edges through other ranks only add order).
pub(crate) fn kernel_flags(
    plan: &ficco_core::plan::Plan,
    graph: &Graph,
    r: usize,
) -> Vec<(bool, bool)> {
    use ficco_core::plan::{Task, TaskId, TaskKind as K};
    let tasks = &plan.ranks[r].tasks;
    let n = tasks.len();
    let first = graph.node(TaskId { rank: r, index: 0 });
    let on_sms = |t: &Task| {
        matches!(
            t.kind,
            K::Gemm { .. }
                | K::GroupedGemm { .. }
                | K::Reduce { .. }
                | K::Nccl { .. }
                | K::TileGemm(_)
        )
    };
    // before[i][j]: task j has ended before task i starts.
    let mut before = vec![vec![false; n]; n];
    let mut next_on = vec![None; n];
    for i in 0..n {
        let node = first + i;
        let own = |p: usize| p.checked_sub(first).filter(|&q| q < i);
        let stream_pred = graph.stream_pred(node).and_then(own);
        if let Some(p) = stream_pred {
            next_on[p] = Some(i);
        }
        let preds = graph
            .deps(node)
            .iter()
            .filter_map(|&p| own(p))
            .chain(stream_pred);
        for p in preds {
            let (done, rest) = before.split_at_mut(i);
            rest[0][p] = true;
            for (j, &b) in done[p].iter().enumerate() {
                rest[0][j] |= b;
            }
        }
    }
    let apart = |i: usize, after: Option<usize>| {
        tasks.iter().enumerate().all(|(j, t)| {
            t.stream == tasks[i].stream
                || !on_sms(t)
                || before[i][j]
                || after.is_some_and(|a| j > a && before[j][a])
        })
    };
    (0..n)
        .map(|i| (apart(i, Some(i)), apart(i, next_on[i])))
        .collect()
}

impl RankIssue {
    /// Creates every event up front (no creation while issuing).
    pub fn new(
        rank: &Rank,
        sh: &Shared<'_>,
        streams: Vec<Arc<CudaStream>>,
        timeline: bool,
    ) -> Result<Self> {
        let r = rank.rank;
        let plain = || rank.ctx.new_event(None).map_err(drv("cuEventCreate"));
        let timed = || {
            rank.ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv("cuEventCreate"))
        };
        let rp = &sh.plan.ranks[r];
        let n_tasks = rp.tasks.len();
        let flag_waits = rp
            .tasks
            .iter()
            .map(|t| {
                t.deps
                    .iter()
                    .filter(|d| d.rank != r)
                    .map(|d| {
                        let p = Point {
                            rank: d.rank,
                            index: d.index,
                        };
                        let w = sh.layout.slot(p, r).ok_or_else(|| {
                            CudaError::Plan(format!("no signal flag for {p:?} on rank {r}"))
                        })?;
                        Ok(MemOp::WaitGeq(word(sh.flags[r], w), SET))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let flag_writes = (0..n_tasks)
            .map(|i| {
                sh.layout.signals[r]
                    .get(i)
                    .into_iter()
                    .flatten()
                    .map(|&(q, w)| MemOp::Write(word(sh.flags[q], w), SET))
                    .collect()
            })
            .collect();
        let signal = sh.flag_kernels().then(|| rank.kernels.signal.clone());
        let kernel_task = match signal {
            Some(_) => {
                let graph = Graph::new(sh.plan).map_err(|e| CudaError::Plan(e.to_string()))?;
                kernel_flags(sh.plan, &graph, r)
            }
            None => vec![],
        };
        // Events of the primary context: not under green contexts, whose
        // streams belong to others (nor are their iterations captured).
        let launched = rp
            .tasks
            .iter()
            .map(|t| {
                (sh.plan.resources.green_sms.is_none() && super::shared::launch_ordered(&t.kind))
                    .then(plain)
                    .transpose()
            })
            .collect::<Result<_>>()?;
        let mut task_ev = vec![];
        if timeline {
            for _ in 0..n_tasks {
                task_ev.push((timed()?, timed()?));
            }
        }
        Ok(RankIssue {
            r,
            go: plain()?,
            stream_done: streams.iter().map(|_| plain()).collect::<Result<_>>()?,
            point_ev: sh.events[r]
                .iter()
                .map(|&need| need.then(plain).transpose())
                .collect::<Result<_>>()?,
            task_ev,
            flag_waits,
            flag_writes,
            signal,
            kernel_task,
            launched,
            control: rank.control().clone(),
            streams,
        })
    }

    /// Start of an iteration of `parity`: [`RankIssue::wait_peers`], then
    /// [`RankIssue::fork`].
    pub fn begin(&self, sh: &Shared<'_>, parity: usize) -> Result<()> {
        let mut q = self.control_queue();
        self.wait_peers(sh, parity, &mut q)?;
        // SAFETY: the control stream is live; the words are as above.
        unsafe { q.flush()? };
        self.fork()
    }

    /// A queue of memory operations for the control stream: the control
    /// steps below gather theirs into it, so that consecutive steps make
    /// one graph node (see [`cu::stream_memops`]).
    pub fn control_queue(&self) -> MemOpQueue {
        MemOpQueue::new(self.control.cu_stream(), self.kernel_if(true))
    }

    /// The signal kernel, where flags go by kernel and `here` allows it.
    fn kernel_if(&self, here: bool) -> Option<cudarc::driver::sys::CUfunction> {
        self.signal
            .as_ref()
            .filter(|_| here)
            .map(|f| f.cu_function())
    }

    /// On the control stream (into `q`): wait for every other rank's end
    /// of the previous iteration (barrier bank `1 - parity`), then clear
    /// that bank. Past it, no peer reads or writes this iteration's buffers
    /// any more for the previous iteration.
    pub fn wait_peers(&self, sh: &Shared<'_>, parity: usize, q: &mut MemOpQueue) -> Result<()> {
        let r = self.r;
        let bank = 1 - parity % 2;
        q.push(
            sh.peers(r)
                .map(|p| MemOp::WaitGeq(word(sh.flags[r], sh.layout.end_slot(p, r, bank)), SET)),
        );
        let (first, n) = sh.layout.bank(r, bank);
        // SAFETY: the words are inside rank r's live flag buffer (sized to
        // the layout); every writer of this bank is done (see crate::signal).
        unsafe { q.clear(word(sh.flags[r], first), n) }
    }

    /// Every plan stream starts after what the control stream has so far.
    pub fn fork(&self) -> Result<()> {
        self.go
            .record(&self.control)
            .map_err(drv("cuEventRecord"))?;
        for s in &self.streams {
            s.wait(&self.go).map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Task `i`: its waits (events within the rank, flags across ranks, and
    /// the `cross` events of a loopback capture), the task itself, its event
    /// and its signals.
    pub fn task(
        &self,
        rank: &mut Rank,
        sh: &Shared<'_>,
        i: usize,
        timeline: bool,
        cross: Option<&CrossEvents>,
    ) -> Result<()> {
        let r = self.r;
        let rp = &sh.plan.ranks[r];
        let task = &rp.tasks[i];
        let stream = self.streams.get(task.stream).ok_or_else(|| {
            CudaError::Plan(format!("task {i} of rank {r} names stream {}", task.stream))
        })?;
        for d in &task.deps {
            if d.rank == r {
                // Stream order already keeps a dependency on the same stream.
                if let Some(ev) = self.point_ev.get(d.index).and_then(|e| e.as_ref()) {
                    if rp.tasks[d.index].stream != task.stream {
                        stream.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
                    }
                }
                continue;
            }
            if let Some(ev) = cross.and_then(|c| c.get(d.rank)?.get(d.index)?.as_ref()) {
                stream.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
            }
        }
        // One batch (or kernel) for all of the task's flag waits (one graph node).
        let (waits_by_kernel, writes_by_kernel) =
            self.kernel_task.get(i).copied().unwrap_or_default();
        let kernel = self.kernel_if(waits_by_kernel);
        // SAFETY: the words are inside rank r's live flag buffer, on the stream's device.
        unsafe { cu::stream_flags(stream.cu_stream(), kernel, &self.flag_waits[i])? };
        // A Wait task's Signal (the plan's own flags) as a graph edge too,
        // like the dependencies above (only in a loopback capture).
        for &(q, j) in sh
            .flag_preds
            .get(r)
            .and_then(|t| t.get(i))
            .into_iter()
            .flatten()
        {
            if let Some(ev) = cross.and_then(|c| c.get(q)?.get(j)?.as_ref()) {
                stream.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
            }
        }
        if timeline {
            self.task_ev[i]
                .0
                .record(stream)
                .map_err(drv("cuEventRecord"))?;
        }
        // The test hook drops a Signal task too (its waiter hangs).
        let dropped = sh.opts.drop_signal == Some((r, i))
            && matches!(task.kind, ficco_core::plan::TaskKind::Signal { .. });
        let launched = self.launched.get(i).and_then(|e| e.as_ref());
        if !dropped {
            let ev = launched.map(|e| e.cu_event());
            issue(rank, sh, stream, task.stream, i, &task.kind, ev)?;
        }
        if let Some(ev) = launched {
            for (k, s) in self.streams.iter().enumerate() {
                if k != task.stream {
                    s.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
                }
            }
        }
        if timeline {
            self.task_ev[i]
                .1
                .record(stream)
                .map_err(drv("cuEventRecord"))?;
        }
        if let Some(Some(ev)) = self.point_ev.get(i) {
            ev.record(stream).map_err(drv("cuEventRecord"))?;
        }
        if let Some(ev) = cross.and_then(|c| c.get(r)?.get(i)?.as_ref()) {
            ev.record(stream).map_err(drv("cuEventRecord"))?;
        }
        if sh.opts.drop_signal == Some((r, i)) {
            return Ok(());
        }
        // SAFETY: each word is inside its consumer's live flag buffer; peer
        // access is enabled between the devices (or it is the same device).
        unsafe {
            cu::stream_flags(
                stream.cu_stream(),
                self.kernel_if(writes_by_kernel),
                &self.flag_writes[i],
            )
        }
    }

    /// End of an iteration of `parity`: [`RankIssue::join`], then
    /// [`RankIssue::signal_end`].
    pub fn end(&self, sh: &Shared<'_>, parity: usize) -> Result<()> {
        self.join()?;
        let mut q = self.control_queue();
        self.signal_end(sh, parity, &mut q)?;
        // SAFETY: the control stream is live; the words are as in signal_end.
        unsafe { q.flush() }
    }

    /// The control stream waits for every plan stream.
    pub fn join(&self) -> Result<()> {
        for (s, ev) in self.streams.iter().zip(&self.stream_done) {
            ev.record(s).map_err(drv("cuEventRecord"))?;
            self.control.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// On the control stream (into `q`), after [`RankIssue::join`]: clear
    /// this rank's task flags (every wait passed), and set this rank's word
    /// in every other rank's barrier bank `parity`.
    pub fn signal_end(&self, sh: &Shared<'_>, parity: usize, q: &mut MemOpQueue) -> Result<()> {
        let r = self.r;
        let (first, tw) = sh.layout.task_range(r);
        // SAFETY: the task words are inside rank r's live flag buffer.
        unsafe { q.clear(word(sh.flags[r], first), tw)? };
        q.push(
            sh.peers(r)
                .map(|p| MemOp::Write(word(sh.flags[p], sh.layout.end_slot(r, p, parity)), SET)),
        );
        Ok(())
    }

    /// On the control stream (into `q`): set word `slot(r)` (a fixed
    /// bank's word for this rank) in the flag memory of every rank of `to`.
    pub fn signal_peers(
        &self,
        sh: &Shared<'_>,
        to: &[usize],
        slot: impl Fn(usize) -> usize,
        q: &mut MemOpQueue,
    ) {
        q.push(
            to.iter()
                .map(|&p| MemOp::Write(word(sh.flags[p], slot(self.r)), SET)),
        );
    }

    /// On the control stream (into `q`): wait for word `slot(p)` of this
    /// rank's flag memory for every rank `p` of `from`, then clear those
    /// words (their writers set them again only after this rank's next end
    /// signal).
    pub fn wait_peers_and_clear(
        &self,
        sh: &Shared<'_>,
        from: &[usize],
        slot: impl Fn(usize) -> usize,
        q: &mut MemOpQueue,
    ) {
        let r = self.r;
        q.push(
            from.iter()
                .map(|&p| MemOp::WaitGeq(word(sh.flags[r], slot(p)), SET)),
        );
        // After every wait (the batch keeps their order).
        q.push(
            from.iter()
                .map(|&p| MemOp::Write(word(sh.flags[r], slot(p)), 0)),
        );
    }

    /// On the control stream (into `q`), after [`RankIssue::signal_end`]
    /// of `parity`: wait until every other rank ended this iteration too
    /// (its word of bank `parity`), then clear those words (each writer
    /// sets its word again only after [`RankIssue::signal_done`], which the
    /// waiter's next call waits for before it can end). Past it, no rank
    /// touches any buffer of this iteration.
    pub fn wait_all_ended(&self, sh: &Shared<'_>, parity: usize, q: &mut MemOpQueue) -> Result<()> {
        let r = self.r;
        let bank = parity % 2;
        q.push(
            sh.peers(r)
                .map(|p| MemOp::WaitGeq(word(sh.flags[r], sh.layout.end_slot(p, r, bank)), SET)),
        );
        let (first, n) = sh.layout.bank(r, bank);
        // SAFETY: the words are inside rank r's live flag buffer; every
        // writer of this bank is done with it.
        unsafe { q.clear(word(sh.flags[r], first), n) }
    }

    /// On the control stream (into `q`), after
    /// [`RankIssue::wait_all_ended`] of `parity`: set this rank's word in
    /// every peer's bank `1 - parity`, the bank the next call's
    /// [`RankIssue::wait_peers`] waits on. The banks are then as they were
    /// before the call: a call leaves no parity behind, so a captured call
    /// replays any number of times.
    pub fn signal_done(&self, sh: &Shared<'_>, parity: usize, q: &mut MemOpQueue) {
        let r = self.r;
        let bank = 1 - parity % 2;
        q.push(
            sh.peers(r)
                .map(|p| MemOp::Write(word(sh.flags[p], sh.layout.end_slot(r, p, bank)), SET)),
        );
    }
}

/// Captures what `f` issues on `control` (and on the streams it forks from
/// it) into an instantiated CUDA graph that replays on `control`. The
/// capture is always ended, also when `f` fails, so the streams stay usable.
pub(crate) fn capture(
    control: &Arc<CudaStream>,
    mut f: impl FnMut() -> Result<()>,
) -> Result<CudaGraph> {
    // Thread-local mode first (other threads may allocate meanwhile), then
    // relaxed mode, which also admits calls that are unsafe under capture.
    let first = capture_mode(
        control,
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        &mut f,
    );
    match first {
        Ok(g) => Ok(g),
        Err(e) => capture_mode(
            control,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            &mut f,
        )
        .map_err(|e2| {
            CudaError::Plan(format!(
                "CUDA graph capture failed: {e}; relaxed mode: {e2}"
            ))
        }),
    }
}

fn capture_mode(
    control: &Arc<CudaStream>,
    mode: CUstreamCaptureMode,
    f: &mut impl FnMut() -> Result<()>,
) -> Result<CudaGraph> {
    control
        .begin_capture(mode)
        .map_err(drv("cuStreamBeginCapture"))?;
    let issued = f();
    // Node priorities keep `-hi` streams' priority inside the graph.
    let graph = control
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY);
    issued?;
    let graph = graph.map_err(drv("cuStreamEndCapture"))?;
    let graph =
        graph.ok_or_else(|| CudaError::Plan("stream capture produced an empty graph".into()))?;
    // A graph with a launch-order edge (a tile GEMM's launch, which the
    // rank's other streams follow) is uploaded by its first launch:
    // `cuGraphUpload` of one crashes inside the CUDA 13.0 driver (H200;
    // `bench/launch_order.py --upload`, `bench/segv_report.c`).
    // SAFETY: the graph is live (held by `graph`).
    if !unsafe { cu::graph_has_launch_order_edge(graph.cu_graph()) }? {
        graph.upload().map_err(drv("cuGraphUpload"))?;
    }
    Ok(graph)
}

#[cfg(test)]
mod tests {
    use super::kernel_flags;
    use ficco_core::plan::lower::lower;
    use ficco_core::plan::{Plan, TaskKind};
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::Schedule;

    fn plan(op: Op, schedule: &str) -> Plan {
        let p = Problem::new(op, 8192, 2048, 8192, 4).expect("problem");
        lower(&p, &schedule.parse::<Schedule>().expect("schedule")).expect("lower")
    }

    /// Rank 0's tasks of `plan` whose (waits, writes) go by kernel, by label.
    fn by_kernel(plan: &Plan) -> (Vec<String>, Vec<String>) {
        let tasks = &plan.ranks[0].tasks;
        let graph = ficco_core::plan::graph::Graph::new(plan).expect("graph");
        let flags = kernel_flags(plan, &graph, 0);
        let pick = |f: fn(&(bool, bool)) -> bool| {
            tasks
                .iter()
                .zip(&flags)
                .filter(|(_, k)| f(k))
                .map(|(t, _)| t.label.clone())
                .collect()
        };
        (pick(|k| k.0), pick(|k| k.1))
    }

    /// ag-gemm's copy schedules run every GEMM on one stream and only
    /// copies elsewhere: the GEMMs' waits for landed chunks go by kernel,
    /// and no copy's flags do (the GEMMs run while the copies land).
    #[test]
    fn the_gemm_streams_waits_go_by_kernel_and_no_copys_flags_do() {
        for s in [
            "shard-copy-ring",
            "bulk-copy-ring",
            "fine4-copy-ring",
            "shard-copy-all",
        ] {
            let p = plan(Op::AgGemm, s);
            let (waits, writes) = by_kernel(&p);
            for t in &p.ranks[0].tasks {
                let gemm = matches!(t.kind, TaskKind::Gemm { .. });
                assert_eq!(waits.contains(&t.label), gemm, "{s}: waits of {}", t.label);
                if !gemm {
                    assert!(!writes.contains(&t.label), "{s}: writes of {}", t.label);
                }
            }
        }
    }

    /// A reduction's reduce that follows the last GEMM waits by kernel, the
    /// broadcasts after it write by kernel, and the pushes of partials
    /// (while GEMMs run) never do; with two chunks, the first chunk's
    /// reduce runs beside the own second GEMM and keeps memory operations.
    #[test]
    fn a_reduce_after_the_last_gemm_waits_by_kernel_and_pushes_beside_gemms_never_do() {
        let (waits, writes) = by_kernel(&plan(Op::GemmAr, "shard-copy-ring"));
        assert!(waits.contains(&"reduce c0".to_string()), "{waits:?}");
        for b in ["bcast d1.c0", "bcast d2.c0", "bcast d3.c0"] {
            assert!(writes.contains(&b.to_string()), "{b}: {writes:?}");
        }
        for push in ["push d1.c0", "push d2.c0", "push d3.c0"] {
            assert!(!writes.contains(&push.to_string()), "{push}: {writes:?}");
        }
        let (waits, _) = by_kernel(&plan(Op::GemmRs, "fine2-copy-ring"));
        assert!(waits.contains(&"reduce c1".to_string()), "{waits:?}");
        assert!(!waits.contains(&"reduce c0".to_string()), "{waits:?}");
    }

    /// NCCL schedules run their collectives beside the GEMMs: only the last
    /// GEMM, which waits for the last collective, has nothing beside it.
    #[test]
    fn beside_an_nccl_collective_nothing_goes_by_kernel() {
        let (waits, writes) = by_kernel(&plan(Op::AgGemm, "shard-nccl-ring"));
        assert_eq!(waits, ["gemm q3.c0"]);
        assert_eq!(writes, ["gemm q3.c0"]);
    }

    /// Over every schedule of the three operators on 2 and 4 GPUs: a flags
    /// group said to go by kernel has no SM task of another stream of its
    /// rank unordered with it, by a plain search of the rank's edges
    /// (dependencies and stream order) rather than the table `kernel_flags`
    /// builds (resource-control variants included).
    #[test]
    fn no_flags_by_kernel_have_sm_work_of_another_stream_unordered_with_them() {
        use ficco_core::space::{enumerate, SpaceOptions};
        let space = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 24,
        };
        let mut by_kernel = 0;
        for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
            for gpus in [2, 4] {
                let p = Problem::new(op, 8192, 2048, 4096, gpus).expect("problem");
                for s in enumerate(op, space) {
                    let Ok(plan) = lower(&p, &s) else { continue };
                    let graph = ficco_core::plan::graph::Graph::new(&plan).expect("graph");
                    for r in 0..gpus {
                        let tasks = &plan.ranks[r].tasks;
                        let first = graph.node(ficco_core::plan::TaskId { rank: r, index: 0 });
                        // Whether task `a` ends before task `b` starts.
                        let ends_before = |a: usize, b: usize| {
                            let mut todo = vec![b];
                            let mut seen = vec![false; tasks.len()];
                            while let Some(x) = todo.pop() {
                                let node = first + x;
                                let preds = graph
                                    .deps(node)
                                    .iter()
                                    .copied()
                                    .chain(graph.stream_pred(node));
                                for q in preds
                                    .filter_map(|q| q.checked_sub(first))
                                    .filter(|&q| q < tasks.len())
                                {
                                    if q == a {
                                        return true;
                                    }
                                    if !seen[q] {
                                        seen[q] = true;
                                        todo.push(q);
                                    }
                                }
                            }
                            false
                        };
                        let next_on = |i: usize| {
                            (i + 1..tasks.len()).find(|&j| tasks[j].stream == tasks[i].stream)
                        };
                        let sm = |t: &ficco_core::plan::Task| {
                            !matches!(
                                t.kind,
                                TaskKind::Copy { .. }
                                    | TaskKind::Signal { .. }
                                    | TaskKind::Wait { .. }
                            )
                        };
                        for (i, &(waits, writes)) in
                            kernel_flags(&plan, &graph, r).iter().enumerate()
                        {
                            for (j, t) in tasks.iter().enumerate() {
                                if t.stream == tasks[i].stream || !sm(t) {
                                    continue;
                                }
                                if waits {
                                    assert!(
                                        ends_before(j, i) || ends_before(i, j),
                                        "{s} P={gpus} rank {r}: waits of {} beside {}",
                                        tasks[i].label,
                                        t.label
                                    );
                                }
                                if writes {
                                    let after = next_on(i).is_some_and(|a| ends_before(a, j));
                                    assert!(
                                        ends_before(j, i) || after,
                                        "{s} P={gpus} rank {r}: writes of {} beside {}",
                                        tasks[i].label,
                                        t.label
                                    );
                                }
                            }
                            by_kernel += usize::from(waits) + usize::from(writes);
                        }
                    }
                }
            }
        }
        assert!(by_kernel > 0);
    }
}
