//! The operator-call path ([`crate::session::Session::run_op`], the Python
//! ops): one plan, one iteration, on this process's rank of a job, called
//! again and again on the caller's tensors. Its steady state is
//! stream-ordered and allocation-free: no flag reset, no store barrier, no
//! host synchronize.
//!
//! **Two paths.** A call takes one of them ([`Epoch::path`]), decided alike
//! on every rank, because every rank makes the same calls in the same order
//! and every input of the decision is a function of that sequence (and of
//! `FICCO_OP_SYNC`, agreed when the session opens):
//! * *full* ([`Path::Full`]): the run of [`super::run::run_plan_in`], which
//!   synchronizes the caller's stream, resets every flag word, passes a
//!   store barrier, runs, synchronizes the host and passes a second
//!   barrier. Taken for the first call of a session, the first call of each
//!   call shape (its streams, events and GEMMs are set up then, while
//!   nothing runs), a call whose plan makes the shared arena or the flag
//!   memory grow, any call after a failure, plans whose per-plan state lives
//!   in [`super::Rank`] slots shared by every plan (grouped GEMMs' tensor
//!   maps; no operator call has them), and every call under
//!   `FICCO_OP_SYNC=1` ([`fast_capable`]). Tile GEMMs run fast: their
//!   flags, counters and operands are launch arguments, and a destination
//!   table (`-acc`) is made once per address set of the buffers it names
//!   ([`OpPlan::ensure_tables`]); calls of a tile GEMM whose blocks wait on
//!   flags (ag-gemm's, `-acc`) are never captured in a graph (ours or the
//!   caller's; [`OpPlan`]'s `capturable`). When fast calls
//!   preceded it, it first waits for this rank's device and passes one
//!   more barrier (*quiet*): then no write of an earlier call is in flight
//!   on any rank when the flags are reset.
//! * *fast* ([`Path::Fast`]): on the control stream, after an event of the
//!   caller's stream, the [`fast_steps`]: wait for every peer's end of the
//!   previous call (barrier bank `1 - parity`) and clear it; copy the inputs
//!   into the shared arena; tell the peers that touch this rank's operands
//!   that they are in place, and wait until the peers whose operands this
//!   rank touches said so (*ready*, [`Handoff`]); fork the plan's streams;
//!   the tasks with their flag waits and signals; join; tell the peers whose
//!   output this rank wrote, and wait for the peers that write its output
//!   (*landed*); copy the output out; clear this rank's task words; set this
//!   rank's word in every peer's bank `parity`; with operands bound in
//!   shared memory, also wait for every peer's end of this call; then the
//!   caller's stream waits for an event of the control stream. Everything
//!   it uses (the plan, its signal layout and hand-offs, events, streams,
//!   the tuned GEMMs) was made at the shape's first, full, call and is kept
//!   in an [`OpCache`].
//!   (What stays per call on the host: binding the operands, and, once the
//!   session holds shared allocations, one store exchange that decides
//!   which operands are in place: another rank's operand may lie elsewhere.)
//!
//! **Repeated calls replay a graph.** Issuing a fast call takes some
//! forty driver calls (about 100 µs of host time); a model calls each site
//! with its operands at the same addresses step after step. So the second
//! call of a shape at an address set is captured into a CUDA graph (the
//! same steps, from the start mark to the end mark), and later calls there
//! launch it straight on the caller's stream, which orders it as the two
//! events of an issued call do; the watch's `done` event, recorded after
//! every call, orders calls the caller makes on different streams
//! ([`CallGraphs`]; `FICCO_GRAPHS=0` turns it off). It is the same protocol, issued once: a call leaves the flags
//! as it found them, so a graph of it replays any number of times.
//!
//! **Why skipping the reset and the barriers is safe.** The flag protocol
//! of [`crate::signal`] already makes consecutive iterations of one run
//! safe without either; a fast call is the next iteration of the same
//! protocol, with the parity carried over from the previous call
//! ([`Epoch`]), also when that call ran another plan:
//! 1. *Every plan agrees on the barrier banks*: they are the first `2P`
//!    words of every rank's flag memory, word `q` of bank `b` set by rank
//!    `q` at the end of an iteration of parity `b` ([`SignalLayout::bank`]);
//!    the ready and landed banks of point 5 follow at fixed words too
//!    ([`crate::signal::FIXED_BANKS`]).
//! 2. *Between two iterations every task word is 0*: a full call zeroes the
//!    whole flag memory (bank 1 then preset, as if an iteration -1 had
//!    ended); each consumer clears its own task words at the end of each
//!    iteration, after its streams joined, so after every wait of the
//!    iteration passed, i.e. after every producer's write of it landed;
//!    words that another plan uses but this one does not stay 0. The only
//!    words set between calls are the peers' end signals in bank `parity`
//!    of the call just done; bank `1 - parity` is 0 (cleared at that call's
//!    start), and so are the ready and landed words (each cleared by its
//!    waiter before its end signal).
//! 3. *No stale flag passes as a signal of this call*: a task word written
//!    by this call's producer could only be stale if a producer wrote it in
//!    an earlier call after the consumer cleared it; but a producer starts
//!    a call only after seeing the consumer's end of the previous call (its
//!    first wait, on bank `1 - parity`), and the consumer sets its end
//!    signal after clearing its task words, on one stream, behind the
//!    system-scope fence of `cuStreamWriteValue32`. A bank word of parity
//!    `b` is set by rank `q` only at the end of its call of parity `b`; the
//!    consumer clears it right after waiting on it, before it ends the call
//!    that lets `q` start its next call of parity `b` (two calls later).
//! 4. *No peer overwrites a buffer another rank still reads*: a rank issues
//!    anything that reads or writes a peer's buffers, and copies new inputs
//!    into its own arena buffers (which peers read), only after its first
//!    wait: after every peer ended the previous call, and a peer ends a call
//!    only after all its streams, hence all its reads and writes of that
//!    call, are done. It copies its output out before its end signal, so
//!    no peer's next call can overwrite the arena output first. Operands
//!    bound in place in shared memory (`ficco.torch.empty`) belong to the
//!    caller, who may overwrite them as soon as the call is done on its
//!    stream: those calls also wait for every peer's end before the
//!    caller's stream resumes.
//! 5. *Every rank reads this call's operands, and copies out this call's
//!    output*. Here a call is *not* the next iteration of a run: a run's
//!    inputs are in place before its first barrier and stay, and its output
//!    is read after its last barrier, so its plan has no dependency for
//!    either, while a call brings new operands and copies its output out
//!    right after its tasks. Hence the hand-offs ([`Handoff`], from the
//!    plan's copies, alike on every rank): a rank whose tasks touch a
//!    peer's operand buffer (its shard, pulled by ag-gemm; its output,
//!    pushed into by gemm-ar) forks its tasks only after that peer's
//!    *ready*, set once the peer's inputs are copied in (or, in shared
//!    memory, once its caller's stream reached the call); a rank copies its
//!    output out only after the *landed* of every peer that writes it, set
//!    after that peer's tasks joined. Their words ([`SignalLayout::ready_slot`],
//!    [`SignalLayout::landed_slot`]) are cleared by their waiter right after
//!    the wait, before its end signal; the writer sets them again only in
//!    its next call, after that end signal, so no stale word passes.
//!    Without them, a peer pulls the previous call's shard, or the output
//!    is copied out before a peer's push landed: exactly what the GPU
//!    showed. `exec::op::model_tests` checks points 4 and 5 on a CPU model of
//!    call sequences built from the same steps (no race, no stale read, no
//!    deadlock), and that without the hand-offs it finds those two races.
//! 6. *Nothing is freed under a call in flight*: the arena and the flag
//!    memory only grow in a full call, which first waits for this rank's
//!    device and the quiet barrier; a shared allocation is freed only after
//!    this rank's calls finished ([`OpRunner::synchronize`]).
//!
//! **Hangs.** A fast call returns before it ran, so the run's watchdog
//! cannot guard it. The [`Watch`] thread does: when a call has not finished
//! within the watchdog bound (`FICCO_WATCHDOG_MS`), a peer died or hung; it
//! releases every flag of this rank (so its streams, and the caller's
//! stream behind them, drain instead of hanging), and the next call (or
//! [`OpRunner::synchronize`]) fails with the hang; the results of the calls
//! since are not valid. The failure ends the job, like a failure in a full
//! call.

pub mod clock;
mod fast;
#[cfg(test)]
mod model_tests;
mod path;
#[cfg(test)]
mod tests;
mod watch;

pub use fast::*;
pub use path::*;
use watch::*;

use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::exec::check::precheck;
use crate::exec::iter::capture;
use crate::exec::rank::Rank;
use crate::exec::shared::CommHandle;
use crate::mem::DevicePtr;
use cudarc::driver::CudaEvent;
use ficco_core::plan::Plan;
use std::time::Duration;

/// The operator-call state of one rank of a job: the [`Epoch`], the cached
/// call shapes, the watch thread and the two events between the caller's
/// stream and the control stream.
pub(crate) struct OpRunner {
    pub epoch: Epoch,
    pub cache: OpCache<OpPlan>,
    /// `FICCO_OP_SYNC=1` on some rank (agreed when the job opened).
    pub sync: bool,
    /// How long a fast call may wait for a peer before the watch thread
    /// calls it hung: the longer of the watchdog bound and the job's
    /// rendezvous bound, since a fast call's first wait is where a full
    /// call's store barrier was (a peer may still be busy elsewhere).
    pub peer_wait: Duration,
    watch: Option<Watch>,
    /// Recorded on the caller's stream; the control stream waits for it.
    caller: Option<CudaEvent>,
    /// Joins the caller's stream to a call under CUDA graph capture.
    capture_join: Option<CudaEvent>,
    /// Calls issued fast so far (the watch thread's numbering; a call
    /// captured in a graph keeps its number at every replay).
    seq: u32,
    /// Repeated calls replay a graph of their first ([`CallGraphs`]);
    /// `FICCO_GRAPHS=0` turns it off.
    graphs: bool,
    /// The stream on which the watch's `done` event was last recorded
    /// (the stream of the last call issued outside capture): a call on
    /// another stream first waits for that event, so this rank's calls stay
    /// in order whatever streams the caller uses.
    last_on: Option<u64>,
}

impl OpRunner {
    /// `peer_wait`: how long a peer may take before a call gives up on it
    /// (the job's rendezvous bound).
    pub fn new(sync: bool, peer_wait: Duration) -> Self {
        OpRunner {
            epoch: Epoch::default(),
            cache: OpCache::new(CACHE_SHAPES),
            sync,
            peer_wait,
            watch: None,
            caller: None,
            capture_join: None,
            seq: 0,
            graphs: ficco_core::settings::Settings::current().graphs,
            last_on: None,
        }
    }

    /// Waits until every call issued here finished on this rank's device;
    /// the hang of one of them, if the watch thread found one.
    pub fn synchronize(&mut self) -> Result<()> {
        self.wait_idle()?;
        self.failure()
    }

    /// Waits until every call issued here finished on this rank's device
    /// (a hung one is released by the watch thread), leaving a hang found
    /// for the next call to report.
    pub fn wait_idle(&self) -> Result<()> {
        match &self.watch {
            Some(w) => w
                .state
                .done_event
                .synchronize()
                .map_err(drv("cuEventSynchronize")),
            None => Ok(()),
        }
    }

    /// The hang the watch thread found since the last call, if any (the
    /// epoch is then unknown).
    pub fn failure(&mut self) -> Result<()> {
        match self.watch.as_ref().and_then(Watch::take_failure) {
            Some(e) => {
                self.epoch.failed();
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Issues one fast call of the cached `key` on `rank` as the iteration
    /// of `parity`, ordered after the work queued on the caller's `stream`
    /// and before the caller's later work on it. `flags` is this rank's
    /// flag memory (base, words) for the watch thread.
    ///
    /// A call whose operands are where they were at an earlier call of the
    /// shape is issued as a CUDA graph of that call ([`CallGraphs`]): one
    /// launch instead of some forty driver calls.
    #[allow(clippy::too_many_arguments)]
    pub fn issue_fast(
        &mut self,
        rank: &mut Rank,
        key: &OpKey,
        bound: &Bound,
        parity: usize,
        stream: u64,
        flags: (DevicePtr, usize),
        watchdog_ms: u64,
    ) -> Result<()> {
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        if self.watch.is_none() {
            let bound = watchdog_ms.max(self.peer_wait.as_millis() as u64);
            self.watch = Some(Watch::new(rank, bound)?);
        }
        let (Some(watch), Some(caller), Some(capture_join)) =
            (&self.watch, &self.caller, &self.capture_join)
        else {
            return Err(CudaError::Plan("the call's events are missing".into()));
        };
        let st = self
            .cache
            .get_mut(key)
            .ok_or_else(|| CudaError::Plan("a fast call of a shape never run".into()))?;
        *watch.state.flags.lock().unwrap_or_else(|p| p.into_inner()) = flags;
        let caller_stream = stream as cudarc::driver::sys::CUstream;
        let control = rank.control().clone();
        let words = &watch.state.words;
        let done = &watch.state.done_event;
        // SAFETY: the caller's stream is live on this context.
        let capturing = unsafe { cu::stream_is_capturing(caller_stream)? };
        if capturing && !st.capturable {
            return Err(CudaError::Capture(format!(
                "ficco: an operator call cannot be captured in a CUDA graph: schedule {} has a tile GEMM whose blocks wait on flags that the peers' copies set, which a graph cannot order safely; pick another schedule (or \"auto\", which never runs such a one in a model) for captured code",
                st.plan.name
            )));
        }
        let action = if capturing || !self.graphs || !st.graphable.get() {
            GraphAction::Issue
        } else {
            match st.graphs.action(bound.where_key()) {
                Seen::First => GraphAction::Issue,
                Seen::Again => GraphAction::Capture,
                Seen::Replay(g) => GraphAction::Launch(g.0.cu_graph_exec()),
            }
        };
        let c = control.cu_stream();
        clock::lap(clock::Phase::Setup);
        if let GraphAction::Launch(g) = action {
            // A replay goes straight onto the caller's stream: after the
            // caller's work so far and before its later work without the
            // two events of an issued call (the host cost of a model's
            // steady-state call is this launch and one event record).
            // SAFETY: a graph of this shape's state captured with these
            // very operand addresses (still held in `st.graphs`); the
            // caller's stream and the event are live on this context.
            unsafe {
                if self.last_on != Some(stream) {
                    cu::stream_wait_event(caller_stream, done.cu_event())?;
                }
                cu::graph_launch(g, caller_stream)?;
                cu::event_record(done.cu_event(), caller_stream)?;
            }
            self.last_on = Some(stream);
            self.epoch.after_fast();
            clock::lap(clock::Phase::Launch);
            return Ok(());
        }
        // An issued call runs on the control stream, after the caller's
        // work so far and before the caller's later work. Under capture the
        // join needs an event of its own: an event last recorded in a
        // capture cannot be synchronized, and `done` is what
        // [`OpRunner::wait_idle`] synchronizes (nor may a capture wait for
        // `done`: the caller's stream orders it after the eager calls).
        let join = if capturing { capture_join } else { done };
        // SAFETY: the caller's stream and the events are live on this
        // context.
        unsafe {
            if !capturing && self.last_on != Some(c as u64) {
                cu::stream_wait_event(c, done.cu_event())?;
            }
            cu::event_record(caller.cu_event(), caller_stream)?;
            cu::stream_wait_event(c, caller.cu_event())?;
        }
        let mut graph = None;
        let mut captured = None;
        {
            precheck(&st.plan, &bound.ptrs)?;
            // `-acc` plans, the only ones with tables, are never captured.
            st.ensure_tables(rank, &bound.ptrs, c, || {
                done.synchronize().map_err(drv("cuEventSynchronize"))
            })?;
            self.seq = self.seq.wrapping_add(1).max(1);
            let seq = self.seq;
            let sh = st.shared(&bound.ptrs, words)?;
            if action == GraphAction::Capture {
                // Issued into a graph (nothing runs yet), launched below. A
                // capture that fails ran nothing and was ended: the call
                // is issued directly, and so are the shape's later calls
                // (graphs made before stay until the shape's state goes:
                // they may be in flight).
                match capture(&control, || {
                    issue_steps(st, rank, &sh, bound, parity, words, seq)
                }) {
                    Ok(g) => {
                        ficco_core::settings::trace(|| {
                            // SAFETY: the graph just captured, live.
                            let census = unsafe { cu::graph_census(g.cu_graph()) };
                            format!("op {}: call graph captured: {census:?}", key.plan)
                        });
                        dump_graph(&g, &key.plan, rank.rank, seq);
                        graph = Some(g.cu_graph_exec());
                        captured = Some(g);
                    }
                    Err(e) => {
                        ficco_core::settings::trace(|| {
                            format!(
                                "op {}: no graph of the call ({e}); issued directly",
                                key.plan
                            )
                        });
                        st.graphable.set(false);
                    }
                }
            }
            if graph.is_none() {
                issue_steps(st, rank, &sh, bound, parity, words, seq)?;
            }
        }
        if let Some(g) = captured {
            st.graphs.insert(bound.where_key(), CallGraph(g));
        }
        // SAFETY: a graph of this shape's state captured with these very
        // operand addresses (still held in `st.graphs`); the streams and
        // events are live on this context.
        unsafe {
            if let Some(g) = graph {
                cu::graph_launch(g, c)?;
            }
            cu::event_record(join.cu_event(), c)?;
            cu::stream_wait_event(caller_stream, join.cu_event())?;
        }
        if !capturing {
            self.last_on = Some(c as u64);
        }
        self.epoch.after_fast();
        clock::lap(if graph.is_some() {
            clock::Phase::Capture
        } else {
            clock::Phase::Issue
        });
        Ok(())
    }

    /// After a full call of `plan` (its GEMMs prepared, nothing in flight):
    /// keeps what its fast calls reuse, under its call shape. `arena`: where
    /// the full call laid its buffers out in the job's shared arena
    /// (`runtime::job::arena_layout`). `shares_gpu`: other ranks of the job
    /// are on this rank's GPU (loopback).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        &mut self,
        rank: &mut Rank,
        plan: Plan,
        arena: (Vec<Vec<usize>>, usize),
        flags: Vec<DevicePtr>,
        comm: Option<CommHandle>,
        watchdog_ms: u64,
        shares_gpu: bool,
    ) -> Result<()> {
        if self.watch.is_none() {
            let bound = watchdog_ms.max(self.peer_wait.as_millis() as u64);
            self.watch = Some(Watch::new(rank, bound)?);
        }
        // Made here, outside any capture (a fast call may be the first
        // thing captured), once.
        for ev in [&mut self.caller, &mut self.capture_join] {
            if ev.is_none() {
                *ev = Some(rank.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
            }
        }
        let Some(watch) = &self.watch else {
            return Err(CudaError::Plan("the call watchdog is missing".into()));
        };
        let key = OpKey::of(&plan);
        let st = OpPlan::new(
            rank,
            plan,
            arena,
            flags,
            comm,
            &watch.state.words,
            shares_gpu,
        )?;
        self.cache.insert(key, st);
        Ok(())
    }

    /// The operands of a fast call of the cached `key`, bound into `ptrs`.
    pub fn bind(
        &mut self,
        key: &OpKey,
        r: usize,
        ptrs: Vec<Vec<DevicePtr>>,
        operands: &[Operand],
    ) -> Result<Bound> {
        let st = self
            .cache
            .get_mut(key)
            .ok_or_else(|| CudaError::Plan("a fast call of a shape never run".into()))?;
        bind_operands(&st.plan, r, &st.uses, ptrs, operands)
    }
}

/// With [`ficco_core::settings::GRAPH_DOT`] set, writes a call graph just
/// captured there as `call-<schedule>-r<rank>-<n>.dot` (diagnostics: a
/// failure is traced, the call goes on).
fn dump_graph(g: &cudarc::driver::CudaGraph, plan: &str, rank: usize, seq: u32) {
    let Some(dir) = &ficco_core::settings::Settings::current().graph_dot else {
        return;
    };
    let path = dir.join(format!("call-{plan}-r{rank}-{seq}.dot"));
    let written = std::fs::create_dir_all(dir)
        .map_err(|e| CudaError::Plan(format!("{}: {e}", dir.display())))
        // SAFETY: the graph just captured, live.
        .and_then(|()| unsafe { cu::graph_dot_print(g.cu_graph(), &path) });
    if let Err(e) = written {
        ficco_core::settings::trace(|| format!("op {plan}: no DOT of the call graph: {e}"));
    }
}

/// How a fast call is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GraphAction {
    /// Step by step on the control stream, joined to the caller's stream
    /// by events.
    Issue,
    /// Captured into a graph, kept for the next calls at these addresses,
    /// and launched.
    Capture,
    /// A kept graph, launched.
    Launch(cudarc::driver::sys::CUgraphExec),
}

/// The steps of one fast call on the control stream, from its start mark
/// to its end mark in the watch's words (see the module doc). Consecutive
/// memory operations of the steps go out as one batch: a replayed call's
/// host cost is about 1 µs per memory-operation node of its graph.
fn issue_steps(
    st: &OpPlan,
    rank: &mut Rank,
    sh: &crate::exec::shared::Shared<'_>,
    bound: &Bound,
    parity: usize,
    words: &crate::signal::HostWords,
    seq: u32,
) -> Result<()> {
    let control = rank.control().clone();
    let c = control.cu_stream();
    let r = rank.rank;
    let l = &st.layout;
    let mut q = st.iss.control_queue();
    // DONE first moves off the call's number: a replayed graph writes its
    // capture-time number into both words, so a replay that follows a call
    // of the same graph (the same op called in a loop) would otherwise leave
    // STARTED == DONE while it hangs, and the watch would never see it.
    q.push([
        cu::MemOp::Write(words.device(DONE), !seq),
        cu::MemOp::Write(words.device(STARTED), seq),
    ]);
    for step in fast_steps(&st.handoff, r) {
        match step {
            Step::WaitPeers => st.iss.wait_peers(sh, parity, &mut q)?,
            Step::CopyIn | Step::CopyOut => {
                let copies = if step == Step::CopyIn {
                    &bound.copy_in
                } else {
                    &bound.copy_out
                };
                if !copies.is_empty() {
                    // SAFETY: the words queued are live (see the steps).
                    unsafe { q.flush()? };
                }
                for &(dst, src, bytes) in copies {
                    // SAFETY: the arena buffer and the caller's operand hold `bytes`.
                    unsafe { cu::memcpy_dtod_async(dst, src, bytes, c)? };
                }
            }
            Step::SignalReady => {
                st.iss
                    .signal_peers(sh, &st.handoff.ready_to[r], |p| l.ready_slot(p), &mut q)
            }
            Step::WaitReady => st.iss.wait_peers_and_clear(
                sh,
                &st.handoff.ready_from[r],
                |p| l.ready_slot(p),
                &mut q,
            ),
            Step::Tasks => {
                // SAFETY: as above.
                unsafe { q.flush()? };
                st.iss.fork()?;
                for i in 0..st.plan.ranks[r].tasks.len() {
                    st.iss.task(rank, sh, i, false, None)?;
                }
                st.iss.join()?;
            }
            Step::SignalLanded => {
                st.iss
                    .signal_peers(sh, &st.handoff.landed_to[r], |p| l.landed_slot(p), &mut q)
            }
            Step::WaitLanded => st.iss.wait_peers_and_clear(
                sh,
                &st.handoff.landed_from[r],
                |p| l.landed_slot(p),
                &mut q,
            ),
            Step::SignalEnd => st.iss.signal_end(sh, parity, &mut q)?,
            Step::WaitAllEnded => st.iss.wait_all_ended(sh, parity, &mut q)?,
            Step::SignalDone => st.iss.signal_done(sh, parity, &mut q),
        }
    }
    q.push([cu::MemOp::Write(words.device(DONE), seq)]);
    // SAFETY: the watch's mapped host words and the flag words queued are live.
    unsafe { q.flush() }
}
