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
use std::sync::Arc;

/// Per rank per task: an event recorded after the task when another rank
/// waits for it, or when it is the Signal task of a Wait task's flag. Only
/// for a loopback capture, where every rank is in one graph: the event turns
/// each cross-rank dependency and each Signal -> Wait pair into a graph
/// edge, so the driver orders producer before consumer on the device's
/// shared hardware queues (the flag wait stays in the graph too). A tile
/// GEMM block's counter gets no edge: an edge can only follow the whole
/// GEMM, which on 2 GPUs with `-acc` waits for the peer's pushes of its own
/// counters (a cycle); the kernel is issued before every Wait on its
/// counters, and a running kernel does not hold up its hardware queue.
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
    /// Per plan stream: its tasks' flags go by the signal kernel (see
    /// [`kernel_streams`]).
    kernel_stream: Vec<bool>,
}

/// Per plan stream of `tasks`: whether its flag operations may go by the
/// signal kernel ([`cu::signal_kernel`]). A warp resident beside a GEMM
/// that fills the SMs slows that GEMM, so only the one stream that issues
/// every SM task of the rank (GEMMs, reduces, NCCL) may: there, stream
/// order keeps the kernel from ever running beside one. Copy-only streams,
/// whose flags wait and land while the GEMMs run, keep memory operations,
/// and so does every stream of a rank whose SM work is on several streams.
pub(crate) fn kernel_streams(tasks: &[ficco_core::plan::Task], n_streams: usize) -> Vec<bool> {
    use ficco_core::plan::TaskKind as K;
    let mut sm = vec![false; n_streams];
    for t in tasks {
        let on_sms = matches!(
            t.kind,
            K::Gemm { .. }
                | K::GroupedGemm { .. }
                | K::Reduce { .. }
                | K::Nccl { .. }
                | K::TileGemm(_)
        );
        if on_sms {
            if let Some(s) = sm.get_mut(t.stream) {
                *s = true;
            }
        }
    }
    if sm.iter().filter(|&&s| s).count() > 1 {
        sm.fill(false);
    }
    sm
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
        let kernel_stream = kernel_streams(&rp.tasks, streams.len());
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
            kernel_stream,
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
        MemOpQueue::new(self.control.cu_stream(), self.kernel_for(None))
    }

    /// The signal kernel for plan stream `stream` (`None`: the control
    /// stream, which runs no task), where flags go by kernel there.
    fn kernel_for(&self, stream: Option<usize>) -> Option<cudarc::driver::sys::CUfunction> {
        let on = stream.is_none_or(|s| self.kernel_stream.get(s).copied().unwrap_or(false));
        self.signal.as_ref().filter(|_| on).map(|f| f.cu_function())
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
        let kernel = self.kernel_for(Some(task.stream));
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
        if !dropped {
            issue(rank, sh, stream, task.stream, i, &task.kind)?;
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
        unsafe { cu::stream_flags(stream.cu_stream(), kernel, &self.flag_writes[i]) }
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
    graph.upload().map_err(drv("cuGraphUpload"))?;
    Ok(graph)
}

#[cfg(test)]
mod tests {
    use super::kernel_streams;
    use ficco_core::plan::lower::lower;
    use ficco_core::plan::TaskKind;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::Schedule;

    /// Per rank of `op` at P = 4 under `schedule`: (the streams whose flags
    /// go by kernel, the streams that run SM work).
    fn streams(op: Op, schedule: &str) -> Vec<(Vec<usize>, Vec<usize>)> {
        let p = Problem::new(op, 4096, 1024, 2048, 4).expect("problem");
        let plan = lower(&p, &schedule.parse::<Schedule>().expect("schedule")).expect("lower");
        plan.ranks
            .iter()
            .map(|rp| {
                let n = rp.tasks.iter().map(|t| t.stream + 1).max().unwrap_or(0);
                let on: Vec<usize> = (0..n)
                    .filter(|&s| kernel_streams(&rp.tasks, n)[s])
                    .collect();
                let mut sm: Vec<usize> = rp
                    .tasks
                    .iter()
                    .filter(|t| {
                        !matches!(
                            t.kind,
                            TaskKind::Copy { .. } | TaskKind::Signal { .. } | TaskKind::Wait { .. }
                        )
                    })
                    .map(|t| t.stream)
                    .collect();
                sm.sort();
                sm.dedup();
                (on, sm)
            })
            .collect()
    }

    /// ag-gemm's copy schedules run every GEMM on stream 0 and only copies
    /// elsewhere: stream 0's flags go by kernel, the copy streams' never.
    #[test]
    fn the_one_stream_with_every_gemm_signals_by_kernel_and_copy_streams_never_do() {
        for s in [
            "shard-copy-ring",
            "bulk-copy-ring",
            "fine4-copy-ring",
            "shard-copy-all",
        ] {
            for (r, (on, sm)) in streams(Op::AgGemm, s).into_iter().enumerate() {
                assert_eq!(sm, [0], "{s} rank {r}: SM work on {sm:?}");
                assert_eq!(on, sm, "{s} rank {r}");
            }
        }
    }

    /// The reductions run their reduce kernels on a copy stream beside the
    /// GEMMs, and NCCL schedules their collectives: no stream's task flags
    /// go by kernel there (the control steps still may).
    #[test]
    fn no_stream_signals_by_kernel_where_sm_work_is_on_several_streams() {
        for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
            for s in [
                "shard-copy-ring",
                "shard-copy-all",
                "shard-nccl-ring",
                "seq",
            ] {
                if op == Op::AgGemm && s.contains("copy") {
                    continue;
                }
                for (r, (on, sm)) in streams(op, s).into_iter().enumerate() {
                    assert!(sm.len() > 1, "{op:?} {s} rank {r}: SM work on {sm:?} only");
                    assert!(on.is_empty(), "{op:?} {s} rank {r}: {on:?} by kernel");
                }
            }
        }
    }
}
