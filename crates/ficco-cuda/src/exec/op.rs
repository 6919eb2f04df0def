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
//!   in [`super::Rank`] slots shared by every plan (tile and grouped GEMMs),
//!   and every call under `FICCO_OP_SYNC=1`. When fast calls preceded it, it
//!   first waits for this rank's device and passes one more barrier
//!   (*quiet*): then no write of an earlier call is in flight on any rank
//!   when the flags are reset.
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
//!    showed. `exec::op_model` checks points 4 and 5 on a CPU model of
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

use super::check::precheck;
use super::iter::RankIssue;
use super::progress::Issuing;
use super::rank::Rank;
use super::shared::{
    flag_preds, same_rank_events, tile_share, CommHandle, FlagPreds, RunOpts, RunSpec, Shared,
};
use super::watchdog::{on_side_stream, RELEASED};
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::DevicePtr;
use crate::signal::{HostWords, SignalLayout};
use cudarc::driver::{CudaContext, CudaEvent};
use ficco_core::plan::validate::BufferUse;
use ficco_core::plan::{BufferRole, Plan, TaskKind};
use ficco_core::problem::workload::Problem;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether `FICCO_OP_SYNC=1` asks for the full path on every call (reset,
/// barriers, host synchronize), as before the fast path existed.
pub fn sync_from_env() -> bool {
    ficco_core::settings::Settings::current().op_sync
}

/// Which path a call takes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Reset every flag, barriers, host synchronize. `quiet`: fast calls
    /// preceded it, so first wait for this rank's device and pass a barrier.
    Full { quiet: bool },
    /// Stream-ordered, as the iteration of `parity`.
    Fast { parity: usize },
}

/// What a call's path depends on besides the [`Epoch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallFacts {
    /// `FICCO_OP_SYNC=1` (agreed by every rank).
    pub sync: bool,
    /// The plan needs a larger shared arena or more flag words than the
    /// job holds.
    pub grows: bool,
    /// The call shape's state is cached (it ran before, full).
    pub cached: bool,
    /// The plan can run fast ([`fast_capable`]).
    pub capable: bool,
}

/// The flag state carried from one call to the next, alike on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Epoch {
    /// The parity of the next iteration while every flag is in its
    /// between-iterations state; `None` before the first full run and after
    /// any failure (the flags are then unknown: reset them).
    parity: Option<usize>,
    /// Fast calls were issued since the last barrier after which every
    /// rank's device was idle.
    fast_since_quiet: bool,
}

impl Epoch {
    /// The path of a call with `facts`.
    pub fn path(&self, facts: CallFacts) -> Path {
        match self.parity {
            Some(parity) if !facts.sync && !facts.grows && facts.cached && facts.capable => {
                Path::Fast { parity }
            }
            _ => Path::Full {
                quiet: self.fast_since_quiet,
            },
        }
    }

    /// After a full run of `iterations` iterations (from parity 0, every
    /// rank's device idle at its final barrier).
    pub fn after_full(&mut self, iterations: usize) {
        self.parity = Some(iterations % 2);
        self.fast_since_quiet = false;
    }

    /// After a fast call was issued as the iteration of `parity`.
    pub fn after_fast(&mut self, parity: usize) {
        self.parity = Some(1 - parity % 2);
        self.fast_since_quiet = true;
    }

    /// After this rank's device went idle and every rank passed a barrier.
    pub fn quiet(&mut self) {
        self.fast_since_quiet = false;
    }

    /// After a failure: the flags are unknown until the next full run.
    pub fn failed(&mut self) {
        self.parity = None;
    }

    /// Whether fast calls may still be in flight on some rank.
    pub fn needs_quiet(&self) -> bool {
        self.fast_since_quiet
    }
}

/// Whether `plan` can run on the fast path: no tile GEMM (its destination
/// tables) and no grouped GEMM (its tensor-map tables) live in per-rank
/// slots that the next plan's preparation overwrites while a call may be in
/// flight.
pub fn fast_capable(plan: &Plan) -> bool {
    !plan.ranks.iter().any(|rp| {
        rp.tasks
            .iter()
            .any(|t| matches!(t.kind, TaskKind::TileGemm(_) | TaskKind::GroupedGemm { .. }))
    })
}

/// Who tells whom around a fast call's tasks: what a multi-iteration run
/// gets for free (its inputs are in place before its first barrier and
/// stay; its outputs are read after its last barrier) but consecutive
/// calls on new operands do not. Derived from the plan's copies, the only
/// tasks that reach another rank's memory, so every rank derives the same
/// pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handoff {
    /// Per rank `r`: the peers whose tasks touch one of `r`'s operand
    /// buffers (an input or the output): `r` sets its word of their *ready*
    /// bank once its operands of the call are in place.
    pub ready_to: Vec<Vec<usize>>,
    /// Per rank `q`: the peers whose operand buffers `q`'s tasks touch;
    /// `q` waits for their ready words before it forks its tasks.
    pub ready_from: Vec<Vec<usize>>,
    /// Per rank `q`: the peers whose output `q`'s tasks write: `q` sets its
    /// word of their *landed* bank after its tasks.
    pub landed_to: Vec<Vec<usize>>,
    /// Per rank `r`: the peers that write `r`'s output; `r` waits for
    /// their landed words before it copies its output out (no task of `r`
    /// waits for those writes: in a run, the final barrier does).
    pub landed_from: Vec<Vec<usize>>,
}

impl Handoff {
    pub fn of(plan: &Plan) -> Self {
        let p = plan.ranks.len();
        let mut ready = vec![vec![false; p]; p];
        let mut landed = vec![vec![false; p]; p];
        for (t, rp) in plan.ranks.iter().enumerate() {
            for task in &rp.tasks {
                let TaskKind::Copy { src, dst } = &task.kind else {
                    continue;
                };
                for (end, write) in [(src, false), (dst, true)] {
                    let o = end.rank;
                    if o == t || o >= p {
                        continue;
                    }
                    let role = plan.ranks[o].buffers.get(end.view.buf).map(|b| b.role);
                    if role.is_some_and(|r| r != BufferRole::Scratch) {
                        ready[o][t] = true;
                    }
                    if write && role == Some(BufferRole::Output) {
                        landed[t][o] = true;
                    }
                }
            }
        }
        let list = |m: &Vec<Vec<bool>>, from: bool| -> Vec<Vec<usize>> {
            (0..p)
                .map(|a| {
                    (0..p)
                        .filter(|&b| if from { m[b][a] } else { m[a][b] })
                        .collect()
                })
                .collect()
        };
        Handoff {
            ready_to: list(&ready, false),
            ready_from: list(&ready, true),
            landed_to: list(&landed, false),
            landed_from: list(&landed, true),
        }
    }
}

/// One step of a fast call on the control stream, in issue order
/// ([`fast_steps`]; the module doc says why each is there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Wait for every peer's end of the previous call (bank `1 - parity`)
    /// and clear it.
    WaitPeers,
    /// Copy the copied operands into the arena.
    CopyIn,
    /// Tell the peers that touch this rank's operands that they are in
    /// place ([`Handoff::ready_to`]).
    SignalReady,
    /// Wait until the peers whose operands this rank's tasks touch have
    /// theirs in place ([`Handoff::ready_from`]), and clear their words.
    WaitReady,
    /// Fork the plan's streams, the tasks with their flag waits and
    /// signals, join.
    Tasks,
    /// Tell the peers whose output this rank wrote that the writes are done
    /// ([`Handoff::landed_to`]).
    SignalLanded,
    /// Wait until every peer that writes this rank's output is done
    /// ([`Handoff::landed_from`]), and clear their words.
    WaitLanded,
    /// Copy the output out of the arena.
    CopyOut,
    /// Clear this rank's task words; set this rank's word in every peer's
    /// bank `parity`.
    SignalEnd,
    /// Wait for every peer's end of this call (operands in shared memory).
    WaitAllEnded,
}

/// The steps of a fast call of rank `r`; `shared`: some operand is bound in
/// place in shared memory. Hand-offs with nobody to tell or wait for are
/// left out.
pub fn fast_steps(h: &Handoff, r: usize, shared: bool) -> Vec<Step> {
    let has = |v: &Vec<Vec<usize>>| v.get(r).is_some_and(|x| !x.is_empty());
    let mut out = vec![Step::WaitPeers, Step::CopyIn];
    if has(&h.ready_to) {
        out.push(Step::SignalReady);
    }
    if has(&h.ready_from) {
        out.push(Step::WaitReady);
    }
    out.push(Step::Tasks);
    if has(&h.landed_to) {
        out.push(Step::SignalLanded);
    }
    if has(&h.landed_from) {
        out.push(Step::WaitLanded);
    }
    out.extend([Step::CopyOut, Step::SignalEnd]);
    if shared {
        out.push(Step::WaitAllEnded);
    }
    out
}

/// A call shape: what decides the plan of an operator call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OpKey {
    pub problem: Problem,
    /// The plan's name (its schedule's canonical name).
    pub plan: String,
}

impl OpKey {
    pub fn of(plan: &Plan) -> Self {
        OpKey {
            problem: plan.problem,
            plan: plan.name.clone(),
        }
    }
}

/// Per-call-shape state, at most `cap` shapes: when a new one comes and the
/// cache is full, every entry goes (alike on every rank: the same calls in
/// the same order), and each shape's next call is full again.
#[derive(Debug)]
pub struct OpCache<V> {
    map: HashMap<OpKey, V>,
    cap: usize,
}

impl<V> OpCache<V> {
    pub fn new(cap: usize) -> Self {
        OpCache {
            map: HashMap::new(),
            cap: cap.max(1),
        }
    }

    pub fn get_mut(&mut self, k: &OpKey) -> Option<&mut V> {
        self.map.get_mut(k)
    }

    #[cfg(test)]
    fn contains(&self, k: &OpKey) -> bool {
        self.map.contains_key(k)
    }

    pub fn insert(&mut self, k: OpKey, v: V) {
        if !self.map.contains_key(&k) && self.map.len() >= self.cap {
            self.map.clear();
        }
        self.map.insert(k, v);
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Call shapes kept at once (a model has a handful per layer type).
pub const CACHE_SHAPES: usize = 64;

/// One operand of a call as the plan sees it.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The plan's buffers of every rank, with the operands bound in place.
    pub ptrs: Vec<Vec<DevicePtr>>,
    /// (arena buffer, caller address, bytes) to copy in before the tasks.
    pub copy_in: Vec<(DevicePtr, DevicePtr, usize)>,
    /// (caller address, arena buffer, bytes) to copy out after them.
    pub copy_out: Vec<(DevicePtr, DevicePtr, usize)>,
    /// Some operand lives in shared memory the peers use in place.
    pub shared: bool,
}

/// One operand of an operator call on caller memory.
#[derive(Debug, Clone)]
pub struct Operand {
    /// The plan buffer it fills (an input) or receives (the output).
    pub role: BufferRole,
    /// Its device address in this process, and its size.
    pub addr: u64,
    pub bytes: usize,
    /// Every rank's address of its operand of this role, as mapped here,
    /// when every rank's operand lives in shared memory at the same offset:
    /// the plan then reads and writes it in place.
    pub shared: Option<Vec<DevicePtr>>,
}

/// Binds `operands` of rank `r` into `ptrs` (the plan's arena binding):
/// shared ones in place on every rank; a buffer no other rank's task
/// touches, and (an input) no task writes, is the caller's memory itself
/// (weights, rank-local activations), when aligned as TMA loads want; the
/// others are copied.
pub fn bind_operands(
    plan: &Plan,
    r: usize,
    uses: &[Vec<BufferUse>],
    mut ptrs: Vec<Vec<DevicePtr>>,
    operands: &[Operand],
) -> Result<Bound> {
    let rp = plan
        .ranks
        .get(r)
        .ok_or_else(|| CudaError::Plan(format!("the plan has no rank {r}")))?;
    let mut copy_in = vec![];
    let mut copy_out = vec![];
    let mut shared = false;
    for op in operands {
        let b = rp.buffer_with(op.role).ok_or_else(|| {
            CudaError::Plan(format!("the plan of rank {r} has no {:?} buffer", op.role))
        })?;
        let want = rp.buffers[b].bytes();
        if want != op.bytes {
            return Err(CudaError::Plan(format!(
                "{:?} of rank {r} has {} bytes, the plan's buffer '{}' {want}",
                op.role, op.bytes, rp.buffers[b].name
            )));
        }
        let u = uses
            .get(r)
            .and_then(|v| v.get(b))
            .copied()
            .unwrap_or_default();
        let local = !u.remote && (op.role == BufferRole::Output || !u.written) && op.addr % 16 == 0;
        if let Some(all) = &op.shared {
            for (q, (rq, &p)) in plan.ranks.iter().zip(all).enumerate() {
                if let Some(bq) = rq.buffer_with(op.role) {
                    ptrs[q][bq] = p;
                }
            }
            shared = true;
        } else if local {
            ptrs[r][b] = DevicePtr(op.addr);
        } else if op.role == BufferRole::Output {
            copy_out.push((DevicePtr(op.addr), ptrs[r][b], op.bytes));
        } else {
            copy_in.push((ptrs[r][b], DevicePtr(op.addr), op.bytes));
        }
    }
    Ok(Bound {
        ptrs,
        copy_in,
        copy_out,
        shared,
    })
}

/// Run options of a fast call: issued directly (a graph per call shape
/// would pay its capture once, but the operands' addresses change from call
/// to call), no test hooks; its watchdog is the [`Watch`] thread. The
/// grouped route is the process's, as in the full call that prepared it.
fn fast_opts() -> RunOpts {
    RunOpts {
        watchdog_ms: 0,
        drop_signal: None,
        graphs: false,
        ..RunOpts::default()
    }
}

/// What a fast call of one call shape reuses.
pub(crate) struct OpPlan {
    pub plan: Plan,
    pub uses: Vec<Vec<BufferUse>>,
    layout: SignalLayout,
    handoff: Handoff,
    events: Vec<Vec<bool>>,
    flag_preds: FlagPreds,
    tile_share: Vec<usize>,
    tables: Vec<Vec<Option<DevicePtr>>>,
    ctxs: Vec<Arc<CudaContext>>,
    comms: Vec<Option<CommHandle>>,
    local: Vec<usize>,
    /// Every rank's flag memory as it was when this state was made (the
    /// issue's flag addresses are baked in: any change drops the cache).
    pub flags: Vec<DevicePtr>,
    iss: RankIssue,
    start: std::sync::Barrier,
    abort: AtomicBool,
    issuing: Issuing,
}

impl OpPlan {
    /// Makes the fast state of `plan` for `rank` (streams, events, the
    /// signal layout), after a full call of it prepared its GEMMs.
    pub(crate) fn new(
        rank: &mut Rank,
        plan: Plan,
        flags: Vec<DevicePtr>,
        comm: Option<CommHandle>,
        diag: &HostWords,
    ) -> Result<Self> {
        let world = plan.ranks.len();
        let r = rank.rank;
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let streams = rank.plan_streams(&plan.ranks[r], &plan.resources)?;
        let layout = SignalLayout::new(&plan);
        let events = same_rank_events(&plan);
        let flag_preds = flag_preds(&plan)?;
        let tile_share = tile_share(&plan, false);
        let uses = ficco_core::plan::validate::buffer_use(&plan);
        let tables: Vec<Vec<Option<DevicePtr>>> = plan
            .ranks
            .iter()
            .map(|rp| vec![None; rp.tasks.len()])
            .collect();
        let ctxs = vec![rank.ctx.clone(); world];
        let comms: Vec<Option<CommHandle>> = (0..world)
            .map(|q| if q == r { comm } else { None })
            .collect();
        let local = vec![r];
        let start = std::sync::Barrier::new(1);
        let abort = AtomicBool::new(false);
        let issuing = Issuing::new(world);
        let empty: Vec<Vec<DevicePtr>> = plan
            .ranks
            .iter()
            .map(|rp| vec![DevicePtr::NULL; rp.buffers.len()])
            .collect();
        let sh = Shared {
            plan: &plan,
            ptrs: &empty,
            ctxs: &ctxs,
            comms: &comms,
            local: &local,
            layout: &layout,
            flags: &flags,
            progress: diag,
            diag,
            events: &events,
            flag_preds: &flag_preds,
            tile_share: &tile_share,
            tables: &tables,
            spec: RunSpec::ONCE,
            opts: fast_opts(),
            start: &start,
            abort: &abort,
            issuing: &issuing,
        };
        // Events and flag operations, made once (they do not depend on
        // where the operands are).
        let iss = RankIssue::new(rank, &sh, streams, false)?;
        Ok(OpPlan {
            handoff: Handoff::of(&plan),
            plan,
            uses,
            layout,
            events,
            flag_preds,
            tile_share,
            tables,
            ctxs,
            comms,
            local,
            flags,
            iss,
            start,
            abort,
            issuing,
        })
    }

    /// The most flag words a rank of the plan uses.
    pub fn layout_words(&self) -> usize {
        self.layout.words.iter().copied().max().unwrap_or(1)
    }

    fn shared<'a>(&'a self, ptrs: &'a [Vec<DevicePtr>], diag: &'a HostWords) -> Shared<'a> {
        Shared {
            plan: &self.plan,
            ptrs,
            ctxs: &self.ctxs,
            comms: &self.comms,
            local: &self.local,
            layout: &self.layout,
            flags: &self.flags,
            progress: diag,
            diag,
            events: &self.events,
            flag_preds: &self.flag_preds,
            tile_share: &self.tile_share,
            tables: &self.tables,
            spec: RunSpec::ONCE,
            opts: fast_opts(),
            start: &self.start,
            abort: &self.abort,
            issuing: &self.issuing,
        }
    }
}

/// What the [`Watch`] thread and the calls share.
struct WatchState {
    ctx: Arc<CudaContext>,
    /// Word 0: the number of the last call this rank's device finished
    /// (written by the control stream at each call's end).
    done: HostWords,
    /// The number of the last call issued.
    issued: AtomicU32,
    /// This rank's flag memory (base, words), released on a hang.
    flags: Mutex<(DevicePtr, usize)>,
    /// The hang found, until a call reports it.
    failed: Mutex<Option<CudaError>>,
    stop: AtomicBool,
    bound: Duration,
    rank: usize,
}

/// The thread that ends a hung fast call (see the module doc).
pub(crate) struct Watch {
    state: Arc<WatchState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the watch thread looks at the finished-call word.
const WATCH_POLL: Duration = Duration::from_micros(500);
/// How often a hung call's flags are released again while it drains.
const RELEASE_EVERY: Duration = Duration::from_millis(20);

impl Watch {
    fn new(rank: &Rank, bound_ms: u64) -> Result<Self> {
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let state = Arc::new(WatchState {
            ctx: rank.ctx.clone(),
            done: HostWords::new(1)?,
            issued: AtomicU32::new(0),
            flags: Mutex::new((DevicePtr::NULL, 0)),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            bound: Duration::from_millis(bound_ms.max(1)),
            rank: rank.rank,
        });
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("ficco-op-watch".into())
            .spawn(move || watch_loop(&s))
            .map_err(|e| CudaError::Plan(format!("cannot start the call watchdog: {e}")))?;
        Ok(Watch {
            state,
            thread: Some(thread),
        })
    }

    fn take_failure(&self) -> Option<CudaError> {
        self.state
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch_loop(s: &WatchState) {
    // The clock runs from the last call the device finished, or from when
    // it went busy; calls issued meanwhile do not reset it (a caller that
    // keeps queueing behind a hung call must not hide the hang).
    let mut last_done = u32::MAX;
    let mut since = Instant::now();
    while !s.stop.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_POLL);
        let now = (s.done.get(0), s.issued.load(Ordering::Acquire));
        if now.0 != last_done || now.0 == now.1 {
            last_done = now.0;
            since = Instant::now();
            continue;
        }
        if since.elapsed() < s.bound {
            continue;
        }
        let waited_ms = since.elapsed().as_millis() as u64;
        *s.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(CudaError::Hang {
            rank: s.rank,
            point: format!(
                "operator call {} (a peer rank died or hangs; this call and any issued after it have no valid result)",
                now.0.wrapping_add(1)
            ),
            waited_ms,
        });
        drain(s);
        last_done = s.done.get(0);
        since = Instant::now();
    }
}

/// Releases this rank's flags again and again until every issued call
/// finished; ends the process when the device does not drain (a kernel
/// that never ends), as the run's watchdog does.
fn drain(s: &WatchState) {
    let deadline = Instant::now() + s.bound.max(Duration::from_secs(2));
    while s.done.get(0) != s.issued.load(Ordering::Acquire) && !s.stop.load(Ordering::Acquire) {
        let (base, words) = *s.flags.lock().unwrap_or_else(|p| p.into_inner());
        if words > 0 && !base.is_null() {
            let _ = on_side_stream(&s.ctx, |st| {
                // SAFETY: this rank's live flag memory holds `words` words
                // (it is only replaced after every call finished).
                unsafe { cu::memset_d32_async(base, RELEASED, words, st) }
            });
        }
        if Instant::now() > deadline {
            eprintln!(
                "ficco: rank {}: an operator call hung and the device did not drain; exiting",
                s.rank
            );
            std::process::exit(super::HANG_EXIT_CODE);
        }
        std::thread::sleep(RELEASE_EVERY);
    }
}

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
    /// Recorded on the control stream after a call; the caller's stream
    /// waits for it, [`OpRunner::synchronize`] too.
    done: Option<CudaEvent>,
    /// Calls issued fast so far (the watch thread's numbering).
    seq: u32,
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
            done: None,
            seq: 0,
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
        match &self.done {
            Some(ev) => ev.synchronize().map_err(drv("cuEventSynchronize")),
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
        // Made once, at the first fast call (no allocation per call).
        if self.caller.is_none() {
            self.caller = Some(rank.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
        }
        if self.done.is_none() {
            self.done = Some(rank.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
        }
        let (Some(watch), Some(caller), Some(done)) = (&self.watch, &self.caller, &self.done)
        else {
            return Err(CudaError::Plan("the call's events are missing".into()));
        };
        let st = self
            .cache
            .get_mut(key)
            .ok_or_else(|| CudaError::Plan("a fast call of a shape never run".into()))?;
        precheck(&st.plan, &bound.ptrs)?;
        *watch.state.flags.lock().unwrap_or_else(|p| p.into_inner()) = flags;
        let sh = st.shared(&bound.ptrs, &watch.state.done);
        let caller_stream = stream as cudarc::driver::sys::CUstream;
        let control = rank.control().clone();
        // SAFETY: the caller's stream and the event are live on this context.
        unsafe {
            cu::event_record(caller.cu_event(), caller_stream)?;
            cu::stream_wait_event(control.cu_stream(), caller.cu_event())?;
        }
        for step in fast_steps(&st.handoff, rank.rank, bound.shared) {
            match step {
                Step::WaitPeers => st.iss.wait_peers(&sh, parity)?,
                Step::CopyIn => {
                    for &(dst, src, bytes) in &bound.copy_in {
                        // SAFETY: the arena buffer and the caller's operand hold `bytes`.
                        unsafe { cu::memcpy_dtod_async(dst, src, bytes, control.cu_stream())? };
                    }
                }
                Step::SignalReady => {
                    let l = &st.layout;
                    st.iss
                        .signal_peers(&sh, &st.handoff.ready_to[rank.rank], |q| l.ready_slot(q))?
                }
                Step::WaitReady => {
                    let l = &st.layout;
                    st.iss
                        .wait_peers_and_clear(&sh, &st.handoff.ready_from[rank.rank], |q| {
                            l.ready_slot(q)
                        })?
                }
                Step::Tasks => {
                    st.iss.fork()?;
                    for i in 0..st.plan.ranks[rank.rank].tasks.len() {
                        st.iss.task(rank, &sh, i, false, None)?;
                    }
                    st.iss.join()?;
                }
                Step::SignalLanded => {
                    let l = &st.layout;
                    st.iss
                        .signal_peers(&sh, &st.handoff.landed_to[rank.rank], |q| l.landed_slot(q))?
                }
                Step::WaitLanded => {
                    let l = &st.layout;
                    st.iss
                        .wait_peers_and_clear(&sh, &st.handoff.landed_from[rank.rank], |q| {
                            l.landed_slot(q)
                        })?
                }
                Step::CopyOut => {
                    for &(dst, src, bytes) in &bound.copy_out {
                        // SAFETY: as above.
                        unsafe { cu::memcpy_dtod_async(dst, src, bytes, control.cu_stream())? };
                    }
                }
                Step::SignalEnd => st.iss.signal_end(&sh, parity)?,
                Step::WaitAllEnded => st.iss.wait_all_ended(&sh, parity)?,
            }
        }
        self.seq = self.seq.wrapping_add(1);
        watch.state.issued.store(self.seq, Ordering::Release);
        // SAFETY: word 0 of the watch's live mapped host words; the events
        // and streams are live on this context.
        unsafe {
            cu::stream_write_value32(control.cu_stream(), watch.state.done.device(0), self.seq)?;
            cu::event_record(done.cu_event(), control.cu_stream())?;
            cu::stream_wait_event(caller_stream, done.cu_event())?;
        }
        self.epoch.after_fast(parity);
        Ok(())
    }

    /// After a full call of `plan` (its GEMMs prepared, nothing in flight):
    /// keeps what its fast calls reuse, under its call shape.
    pub fn prepare(
        &mut self,
        rank: &mut Rank,
        plan: Plan,
        flags: Vec<DevicePtr>,
        comm: Option<CommHandle>,
        watchdog_ms: u64,
    ) -> Result<()> {
        if self.watch.is_none() {
            let bound = watchdog_ms.max(self.peer_wait.as_millis() as u64);
            self.watch = Some(Watch::new(rank, bound)?);
        }
        let Some(watch) = &self.watch else {
            return Err(CudaError::Plan("the call watchdog is missing".into()));
        };
        let key = OpKey::of(&plan);
        let st = OpPlan::new(rank, plan, flags, comm, &watch.state.done)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use ficco_core::plan::lower::lower;
    use ficco_core::problem::workload::Op;
    use ficco_core::space::Schedule;

    fn facts() -> CallFacts {
        CallFacts {
            sync: false,
            grows: false,
            cached: true,
            capable: true,
        }
    }

    #[test]
    fn the_first_call_is_full_and_later_ones_fast_with_alternating_parity() {
        let mut e = Epoch::default();
        assert_eq!(e.path(facts()), Path::Full { quiet: false });
        e.after_full(1);
        assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
        e.after_fast(1);
        assert_eq!(e.path(facts()), Path::Fast { parity: 0 });
        e.after_fast(0);
        assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
        // A full run of 3 iterations (a measurement) ends at parity 1.
        e.after_full(3);
        assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
        e.after_full(2);
        assert_eq!(e.path(facts()), Path::Fast { parity: 0 });
    }

    #[test]
    fn every_reason_for_the_full_path_takes_it_and_asks_for_quiet_after_fast_calls() {
        let mut e = Epoch::default();
        e.after_full(1);
        e.after_fast(1);
        for f in [
            CallFacts {
                sync: true,
                ..facts()
            },
            CallFacts {
                grows: true,
                ..facts()
            },
            CallFacts {
                cached: false,
                ..facts()
            },
            CallFacts {
                capable: false,
                ..facts()
            },
        ] {
            assert_eq!(e.path(f), Path::Full { quiet: true }, "{f:?}");
        }
        // After the quiet barrier and the full run: no quiet needed.
        e.quiet();
        assert!(!e.needs_quiet());
        e.after_full(1);
        assert_eq!(
            e.path(CallFacts {
                cached: false,
                ..facts()
            }),
            Path::Full { quiet: false }
        );
    }

    #[test]
    fn a_failure_forgets_the_parity_until_a_full_run() {
        let mut e = Epoch::default();
        e.after_full(1);
        e.after_fast(1);
        e.failed();
        assert_eq!(e.path(facts()), Path::Full { quiet: true });
        e.quiet();
        e.after_full(1);
        assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
    }

    fn plan(op: Op, m: usize, s: &str) -> Plan {
        let p = Problem::new(op, m, 512, 256, 2).expect("problem");
        lower(&p, &s.parse::<Schedule>().expect("schedule")).expect("lower")
    }

    #[test]
    fn the_cache_keys_on_the_call_shape_and_forgets_everything_when_full() {
        let a = OpKey::of(&plan(Op::AgGemm, 1024, "shard-copy-ring"));
        let b = OpKey::of(&plan(Op::AgGemm, 2048, "shard-copy-ring"));
        let c = OpKey::of(&plan(Op::AgGemm, 1024, "fine2-copy-all"));
        let d = OpKey::of(&plan(Op::GemmRs, 1024, "shard-copy-ring"));
        assert_eq!(a, OpKey::of(&plan(Op::AgGemm, 1024, "shard-copy-ring")));
        let mut cache = OpCache::new(3);
        cache.insert(a.clone(), 1);
        cache.insert(b.clone(), 2);
        cache.insert(c.clone(), 3);
        assert_eq!(cache.get_mut(&a).copied(), Some(1));
        assert_eq!(cache.get_mut(&c).copied(), Some(3));
        assert!(!cache.contains(&d));
        // Replacing a shape keeps the others.
        cache.insert(b.clone(), 20);
        assert_eq!((cache.len(), cache.get_mut(&b).copied()), (3, Some(20)));
        // A fourth shape: everything goes, alike on every rank.
        cache.insert(d.clone(), 4);
        assert_eq!(cache.len(), 1);
        assert!(cache.contains(&d) && !cache.contains(&a));
    }

    #[test]
    fn tile_and_grouped_plans_are_not_fast_capable() {
        assert!(fast_capable(&plan(Op::AgGemm, 1024, "shard-copy-ring")));
        assert!(fast_capable(&plan(Op::GemmRs, 1024, "fine2-copy-all")));
        assert!(fast_capable(&plan(Op::GemmAr, 1024, "fine2-nccl-ring")));
        assert!(!fast_capable(&plan(Op::AgGemm, 1024, "tile-copy-ring")));
    }

    /// Distinct fake device addresses for every rank's plan buffers.
    fn fake_arena(p: &Plan) -> Vec<Vec<DevicePtr>> {
        p.ranks
            .iter()
            .enumerate()
            .map(|(q, rp)| {
                (0..rp.buffers.len())
                    .map(|b| DevicePtr(0x1000_0000 * (q as u64 + 1) + 0x10_0000 * b as u64))
                    .collect()
            })
            .collect()
    }

    /// Rank 0's A, B and output as caller memory at 0xa000, 0xb000, 0xc000.
    fn caller_operands(p: &Plan) -> Vec<Operand> {
        let rp = &p.ranks[0];
        [
            (BufferRole::InputA, 0xa000),
            (BufferRole::InputB, 0xb000),
            (BufferRole::Output, 0xc000),
        ]
        .into_iter()
        .map(|(role, addr)| Operand {
            role,
            addr,
            bytes: rp
                .buffer_with(role)
                .map(|b| rp.buffers[b].bytes())
                .expect("buffer"),
            shared: None,
        })
        .collect()
    }

    #[test]
    fn operands_bind_in_place_or_copy_as_the_plan_uses_them() {
        let p = plan(Op::AgGemm, 1024, "shard-copy-ring");
        let uses = ficco_core::plan::validate::buffer_use(&p);
        let arena = fake_arena(&p);
        let rp = &p.ranks[0];
        let ops = caller_operands(&p);
        let got = bind_operands(&p, 0, &uses, arena.clone(), &ops).expect("binds");
        // Only this rank reads its shard (it pushes it to its peers): the
        // caller's memory itself, no copy in. B is rank-local too.
        let a = rp.buffer_with(BufferRole::InputA).expect("a");
        assert_eq!(got.ptrs[0][a], DevicePtr(0xa000));
        assert!(got.copy_in.is_empty() && got.copy_out.is_empty());
        let b = rp.buffer_with(BufferRole::InputB).expect("b");
        assert_eq!(got.ptrs[0][b], DevicePtr(0xb000));
        assert!(!got.shared);
        // gemm-ar on the copy engines: peers push into this rank's output,
        // so the output is the plan's own buffer, copied out after the call.
        let ar = plan(Op::GemmAr, 1024, "fine2-copy-all");
        let ar_uses = ficco_core::plan::validate::buffer_use(&ar);
        let out = ar.ranks[0].buffer_with(BufferRole::Output).expect("out");
        let ar_arena = fake_arena(&ar);
        let ar_ops = caller_operands(&ar);
        let got_ar = bind_operands(&ar, 0, &ar_uses, ar_arena.clone(), &ar_ops).expect("binds");
        assert_eq!(
            got_ar.copy_out,
            vec![(DevicePtr(0xc000), ar_arena[0][out], ar_ops[2].bytes)]
        );
        // Shared operands: every rank's in place, and the call waits for
        // every peer's end before the caller's stream resumes.
        let mut shared = ops.clone();
        shared[0].shared = Some(vec![DevicePtr(0x5000), DevicePtr(0x6000)]);
        let got = bind_operands(&p, 0, &uses, arena, &shared).expect("binds");
        assert!(got.shared && got.copy_in.is_empty());
        assert_eq!(got.ptrs[1][a], DevicePtr(0x6000));
        // A wrong size is an error, not a silent overrun.
        let mut bad = ops.to_vec();
        bad[1].bytes += 2;
        let arena2 = vec![vec![DevicePtr(0x100); 8]; 2];
        assert!(bind_operands(&p, 0, &uses, arena2, &bad).is_err());
    }
}
