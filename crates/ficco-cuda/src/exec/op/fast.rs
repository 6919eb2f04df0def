//! The fast, stream-ordered call: which plans can take it, how a call
//! hands its operands and flags over ([`Handoff`], [`fast_steps`]), the
//! per-shape plan cache and the operand binding.

use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::exec::iter::RankIssue;
use crate::exec::progress::Issuing;
use crate::exec::rank::Rank;
use crate::exec::shared::{
    flag_preds, graph_safe, same_rank_events, tile_share, CommHandle, FlagPreds, RunOpts, RunSpec,
    Shared, TileTables,
};
use crate::exec::tables::{table_buffers, tile_table_bytes};
use crate::mem::{DeviceBuffer, DevicePtr};
use crate::signal::{HostWords, SignalLayout};
use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaContext;
use ficco_core::plan::lower::GATHERED_A;
use ficco_core::plan::validate::BufferUse;
use ficco_core::plan::{BufferRole, Plan, TaskKind};
use ficco_core::problem::workload::{Problem, ELEM_BYTES};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Whether `plan` can run on the fast path (the core's rule, which the
/// call decision prices: [`ficco_core::choose::call::fast_path`]).
pub fn fast_capable(plan: &Plan) -> bool {
    ficco_core::choose::call::fast_path(plan)
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
    /// Wait for every peer's end of this call (bank `parity`) and clear it.
    WaitAllEnded,
    /// Set this rank's word in every peer's bank `1 - parity`, which the
    /// next call's [`Step::WaitPeers`] waits on: the banks are as before
    /// the call, whatever number of calls (or graph replays) follow.
    SignalDone,
}

/// The steps of a fast call of rank `r`. Hand-offs with nobody to tell or
/// wait for are left out. Every call ends at a barrier (the caller's stream
/// resumes once every rank ended the call, so operands bound in place in
/// shared memory are free for the caller again), and leaves the barrier
/// banks as it found them.
pub fn fast_steps(h: &Handoff, r: usize) -> Vec<Step> {
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
    out.extend([
        Step::CopyOut,
        Step::SignalEnd,
        Step::WaitAllEnded,
        Step::SignalDone,
    ]);
    out
}

/// A call shape: what decides the plan of an operator call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OpKey {
    pub problem: Problem,
    /// The plan's name (its schedule's canonical name).
    pub plan: String,
    /// B comes transposed (its GEMMs differ).
    pub b_transposed: bool,
}

impl OpKey {
    pub fn of(plan: &Plan) -> Self {
        OpKey {
            problem: plan.problem,
            plan: plan.name.clone(),
            b_transposed: plan.resources.b_transposed,
        }
    }
}

/// Per-call-shape state, at most `cap` shapes: when a new one comes and the
/// cache is full, every entry goes (alike on every rank: the same calls in
/// the same order), and each shape's next call is full again.
#[derive(Debug)]
pub struct OpCache<V> {
    pub(super) map: HashMap<OpKey, V>,
    pub(super) cap: usize,
}

impl<V> OpCache<V> {
    pub fn new(cap: usize) -> Self {
        OpCache {
            map: HashMap::new(),
            cap: cap.max(1),
        }
    }

    pub fn get(&self, k: &OpKey) -> Option<&V> {
        self.map.get(k)
    }

    pub fn get_mut(&mut self, k: &OpKey) -> Option<&mut V> {
        self.map.get_mut(k)
    }

    #[cfg(test)]
    pub(super) fn contains(&self, k: &OpKey) -> bool {
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
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}

/// Address sets of destination tables kept per call shape (`-acc` only;
/// the tables name the output, which is in the job's arena unless the
/// caller allocated it with `ficco.torch.empty`).
pub const TABLE_SETS: usize = 64;

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
}

impl Bound {
    /// Where the call's operands are: every address the issued work uses
    /// that can change from call to call (a graph of the call is valid for
    /// calls with the same key).
    pub fn where_key(&self) -> Vec<u64> {
        let mut k: Vec<u64> = self.ptrs.iter().flatten().map(|p| p.raw()).collect();
        for &(d, s, n) in self.copy_in.iter().chain(&self.copy_out) {
            k.extend([d.raw(), s.raw(), n as u64]);
        }
        k
    }
}

/// What a fast call does about its graph ([`CallGraphs::action`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<'a, V> {
    /// Operands never seen at these addresses: issue the call directly.
    First,
    /// Seen once before: capture the call into a graph and launch it.
    Again,
    /// A graph of the call at these addresses: launch it.
    Replay(&'a V),
}

/// Graphs of one call shape's calls, by where their operands are. A model
/// calls each site with the same addresses step after step (PyTorch's
/// caching allocator hands the same blocks back), so its second call at an
/// address set is captured and later ones replay; addresses seen once cost
/// nothing but a key. At most `cap` address sets are kept: a new one takes
/// the place of one seen only once, and where every entry holds a graph,
/// calls at new addresses are issued directly (clearing the table would
/// wait for the graphs in flight, a host synchronize in the steady state,
/// and a model with more sites of a shape than `cap` would clear it every
/// step).
///
/// A capture costs far more than the direct issue it saves (it is issued,
/// captured and instantiated): where a shape's operands keep moving, its
/// captures stop once [`FREE_CAPTURES`] did not pay back [`PAYBACK`]
/// replays each, until the replays catch up. (A training step's backward
/// on 4 H200s was 4.7 ms slower with per-call graphs than without.)
#[derive(Debug)]
pub struct CallGraphs<V> {
    seen: HashMap<Vec<u64>, Option<V>>,
    cap: usize,
    captured: u64,
    replayed: u64,
}

/// Captures of a call shape made whatever their payback.
pub const FREE_CAPTURES: u64 = 4;
/// Replays that each capture beyond [`FREE_CAPTURES`] must have paid back.
pub const PAYBACK: u64 = 8;

/// Address sets kept per call shape (Llama-3-405B has 126 sites of each
/// layer shape).
pub const GRAPHS_PER_SHAPE: usize = 128;

impl<V> CallGraphs<V> {
    pub fn new(cap: usize) -> Self {
        CallGraphs {
            seen: HashMap::new(),
            cap: cap.max(1),
            captured: 0,
            replayed: 0,
        }
    }

    /// What to do for a call with operands at `key`.
    pub fn action(&mut self, key: Vec<u64>) -> Seen<'_, V> {
        let paid = self.captured < FREE_CAPTURES || self.replayed >= self.captured * PAYBACK;
        if !self.seen.contains_key(&key) {
            if self.seen.len() >= self.cap {
                // Full: forget an address set seen once (no graph to free);
                // with graphs only, the new one is not recorded.
                let once = self.seen.iter().find(|(_, g)| g.is_none());
                match once.map(|(k, _)| k.clone()) {
                    Some(k) => {
                        self.seen.remove(&k);
                    }
                    None => return Seen::First,
                }
            }
            self.seen.insert(key, None);
            return Seen::First;
        }
        match self.seen.get_mut(&key) {
            Some(Some(g)) => {
                self.replayed += 1;
                Seen::Replay(g)
            }
            Some(None) if paid => Seen::Again,
            _ => Seen::First,
        }
    }

    /// The graph of calls at `key`.
    pub fn insert(&mut self, key: Vec<u64>, graph: V) {
        self.captured += 1;
        self.seen.insert(key, Some(graph));
    }
}

/// A captured fast call. cudarc's graph holds raw driver handles, so it is
/// not `Send`; the session that owns it moves between threads (Python's),
/// but only ever one thread uses it at a time (the session's lock), with
/// the graph's context bound first, and the driver's graph calls may come
/// from any thread.
pub struct CallGraph(pub cudarc::driver::CudaGraph);

// SAFETY: see the type's doc: exclusive use under the owner's lock; CUDA
// graph and graph-exec handles are not tied to the thread that made them.
unsafe impl Send for CallGraph {}

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
    /// An output the call also hands back: ag-gemm's gathered A, the
    /// plan's [`GATHERED_A`] buffer (`role` is ignored; never `shared`).
    pub gathered: bool,
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
    for op in operands.iter().filter(|o| o.gathered) {
        let a = operands
            .iter()
            .find(|o| o.role == BufferRole::InputA && !o.gathered)
            .ok_or_else(|| CudaError::Plan("a gathered A without an A operand".into()))?;
        let mine = bind_gathered(plan, r, uses, &mut ptrs, op, a.addr)?;
        copy_out.extend(mine);
    }
    for op in operands.iter().filter(|o| !o.gathered) {
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
        if let Some(all) = &op.shared {
            for (q, (rq, &p)) in plan.ranks.iter().zip(all).enumerate() {
                if let Some(bq) = rq.buffer_with(op.role) {
                    ptrs[q][bq] = p;
                }
            }
        } else if in_place(op.role, u) {
            // The arena keeps no room for it (`call_local`): bound in place
            // or not at all.
            if op.addr % 16 != 0 {
                return Err(CudaError::Plan(format!(
                    "{:?} of rank {r} starts at {:#x}, not a multiple of 16 bytes (a view with an offset); pass a tensor that starts on 16 bytes, e.g. its .clone()",
                    op.role, op.addr
                )));
            }
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
    })
}

/// The operand roles an operator call passes (A, B and the output).
const CALL_ROLES: [BufferRole; 3] = [BufferRole::InputA, BufferRole::InputB, BufferRole::Output];

/// Whether a call binds its operand of `role` in place, whatever it is: no
/// peer touches the buffer, and no task writes it unless it is the output.
fn in_place(role: BufferRole, u: BufferUse) -> bool {
    CALL_ROLES.contains(&role) && !u.remote && (role == BufferRole::Output || !u.written)
}

/// Per rank per buffer of `plan` (whose buffer uses are `uses`): an
/// operand every call binds in place ([`bind_operands`]), so the job's
/// shared arena keeps no room for it (`runtime::job::arena_layout`). Alike
/// on every rank: it depends on the plan only. A call shape keeps it
/// ([`OpPlan::arena`]): deriving it costs microseconds a call.
pub fn call_local(plan: &Plan, uses: &[Vec<BufferUse>]) -> Vec<Vec<bool>> {
    plan.ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            (0..rp.buffers.len())
                .map(|b| {
                    let u = uses
                        .get(r)
                        .and_then(|v| v.get(b))
                        .copied()
                        .unwrap_or_default();
                    CALL_ROLES
                        .iter()
                        .any(|&role| rp.buffer_with(role) == Some(b) && in_place(role, u))
                })
                .collect()
        })
        .collect()
}

/// Binds ag-gemm's gathered A (`op`, `[m, k]` at the caller) of rank `r`:
/// the plan's buffer itself where only this rank writes it (NCCL
/// schedules), else copied out of it once the tasks joined (every GEMM of
/// this rank then read every peer chunk of it, after its arrival). The
/// rows of this rank's own shard come from its A (`a_addr`, the caller's):
/// the plans compute that shard from A, so the buffer's rows may be stale.
/// Returns the copies (destination, source, bytes), in order.
fn bind_gathered(
    plan: &Plan,
    r: usize,
    uses: &[Vec<BufferUse>],
    ptrs: &mut [Vec<DevicePtr>],
    op: &Operand,
    a_addr: u64,
) -> Result<Vec<(DevicePtr, DevicePtr, usize)>> {
    let rp = &plan.ranks[r];
    let b = rp
        .buffers
        .iter()
        .position(|b| b.name == GATHERED_A)
        .ok_or_else(|| {
            CudaError::Plan(format!(
                "plan {} has no gathered A (only ag-gemm plans do)",
                plan.name
            ))
        })?;
    let buf = &rp.buffers[b];
    if buf.bytes() != op.bytes {
        return Err(CudaError::Plan(format!(
            "the gathered A has {} bytes, the plan's buffer '{}' {}",
            op.bytes,
            buf.name,
            buf.bytes()
        )));
    }
    let row = buf.cols * ELEM_BYTES;
    let shard = plan.problem.shard_rows();
    let (own, end) = (r * shard * row, (r + 1) * shard * row);
    let dst = DevicePtr(op.addr);
    let own_rows = (dst.offset(own), DevicePtr(a_addr), shard * row);
    let u = uses
        .get(r)
        .and_then(|v| v.get(b))
        .copied()
        .unwrap_or_default();
    if !u.remote && op.addr % 16 == 0 {
        ptrs[r][b] = dst;
        return Ok(vec![own_rows]);
    }
    let src = ptrs[r][b];
    Ok([
        (dst, src, own),
        (dst.offset(end), src.offset(end), op.bytes - end),
        own_rows,
    ]
    .into_iter()
    .filter(|c| c.2 > 0)
    .collect())
}

/// Run options of a fast call: issued directly (a graph per call shape
/// would pay its capture once, but the operands' addresses change from call
/// to call), no test hooks; its watchdog is the [`Watch`] thread. The
/// grouped route is the process's, as in the full call that prepared it.
pub(super) fn fast_opts() -> RunOpts {
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
    /// Where its buffers lie in the job's shared arena, and the bytes they
    /// need there (`runtime::job::arena_layout` without the operands its
    /// calls bind in place, [`call_local`]; the full call that prepared it
    /// laid it out): kept, not derived per call.
    pub arena: (Vec<Vec<usize>>, usize),
    pub(super) layout: SignalLayout,
    pub(super) handoff: Handoff,
    pub(super) events: Vec<Vec<bool>>,
    pub(super) flag_preds: FlagPreds,
    pub(super) tile_share: Vec<usize>,
    /// This rank's buffers that its tile GEMMs' destination tables name
    /// (`-acc`; [`table_buffers`]): empty when it has none.
    table_bufs: Vec<usize>,
    /// The tables by the addresses of `table_bufs`, each set in a buffer of
    /// its own, made by the first call that binds those addresses
    /// ([`OpPlan::ensure_tables`]); per plan rank, this rank's filled.
    tables_at: HashMap<Vec<u64>, (DeviceBuffer, Vec<TileTables>)>,
    /// Per plan rank, no tables (plans without destination tables).
    no_tables: Vec<TileTables>,
    pub(super) ctxs: Vec<Arc<CudaContext>>,
    pub(super) comms: Vec<Option<CommHandle>>,
    pub(super) local: Vec<usize>,
    /// Every rank's flag memory as it was when this state was made (the
    /// issue's flag addresses are baked in: any change drops the cache).
    pub flags: Vec<DevicePtr>,
    pub(super) iss: RankIssue,
    /// Graphs of this shape's calls by operand addresses.
    pub(super) graphs: CallGraphs<CallGraph>,
    /// Whether its calls may replay graphs: not with NCCL tasks, whose
    /// graph launches wait on the host for the previous one (measured: a
    /// 1.5 ms host stall per call at 16384 x 8192 x 8192), not when it
    /// cannot be captured at all, nor after a capture of one failed.
    pub(super) graphable: std::cell::Cell<bool>,
    /// Whether a call may be captured in a graph (the caller's or ours):
    /// not with a tile GEMM whose blocks wait on flags (ag-gemm's, `-acc`;
    /// [`crate::exec::shared::graph_safe`]).
    pub(super) capturable: bool,
    pub(super) start: std::sync::Barrier,
    pub(super) abort: AtomicBool,
    pub(super) issuing: Issuing,
    /// Several ranks of the job share this GPU (loopback).
    shares_gpu: bool,
}

impl OpPlan {
    /// Makes the fast state of `plan` for `rank` (streams, events, the
    /// signal layout), after a full call of it prepared its GEMMs.
    pub(crate) fn new(
        rank: &mut Rank,
        plan: Plan,
        arena: (Vec<Vec<usize>>, usize),
        flags: Vec<DevicePtr>,
        comm: Option<CommHandle>,
        diag: &HostWords,
        shares_gpu: bool,
    ) -> Result<Self> {
        let world = plan.ranks.len();
        let r = rank.rank;
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let streams = rank.plan_streams(&plan.ranks[r], &plan.resources)?;
        let layout = SignalLayout::new(&plan);
        let events = same_rank_events(&plan);
        let flag_preds = flag_preds(&plan)?;
        // As the full call that prepared it: in loopback every rank's
        // persistent tile GEMM shares this GPU's SMs.
        let tile_share = tile_share(&plan, shares_gpu);
        let uses = ficco_core::plan::validate::buffer_use(&plan);
        let no_tables = vec![TileTables::default(); world];
        let table_bufs = table_buffers(&plan.ranks[r]);
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
            shares_gpu,
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
            tables: &no_tables,
            spec: RunSpec::ONCE,
            opts: fast_opts(),
            start: &start,
            abort: &abort,
            issuing: &issuing,
        };
        let capturable = graph_safe(&plan);
        let graphable = capturable && !plan.has_task(|k| matches!(k, TaskKind::Nccl { .. }));
        // Events and flag operations, made once (they do not depend on
        // where the operands are).
        let iss = RankIssue::new(rank, &sh, streams, false)?;
        Ok(OpPlan {
            handoff: Handoff::of(&plan),
            arena,
            plan,
            uses,
            layout,
            events,
            flag_preds,
            tile_share,
            table_bufs,
            tables_at: HashMap::new(),
            no_tables,
            ctxs,
            comms,
            local,
            flags,
            iss,
            graphs: CallGraphs::new(GRAPHS_PER_SHAPE),
            graphable: std::cell::Cell::new(graphable),
            capturable,
            start,
            abort,
            issuing,
            shares_gpu,
        })
    }

    /// The most flag words a rank of the plan uses.
    pub fn layout_words(&self) -> usize {
        self.layout.words.iter().copied().max().unwrap_or(1)
    }

    /// The key of the destination tables a call bound at `ptrs` uses
    /// (`None`: the plan has none).
    fn table_key(&self, ptrs: &[Vec<DevicePtr>]) -> Option<Vec<u64>> {
        if self.table_bufs.is_empty() {
            return None;
        }
        let mine = ptrs.get(self.local[0])?;
        Some(
            self.table_bufs
                .iter()
                .map(|&b| mine.get(b).map_or(0, |p| p.raw()))
                .collect(),
        )
    }

    /// Makes the destination tables of a call bound at `ptrs`, unless an
    /// earlier call made them: in a new buffer (no call in flight reads
    /// it), their bytes copied on `stream` (the control stream, ahead of
    /// the call's fork) from pageable memory, which the driver stages before
    /// it returns. Past [`TABLE_SETS`] address sets every set is dropped,
    /// after `idle` (this rank's earlier calls are done).
    pub(super) fn ensure_tables(
        &mut self,
        rank: &Rank,
        ptrs: &[Vec<DevicePtr>],
        stream: CUstream,
        idle: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let Some(key) = self.table_key(ptrs) else {
            return Ok(());
        };
        if self.tables_at.contains_key(&key) {
            return Ok(());
        }
        let r = self.local[0];
        let (rp, mine) = match (self.plan.ranks.get(r), ptrs.get(r)) {
            (Some(rp), Some(mine)) => (rp, mine),
            _ => return Err(CudaError::Plan(format!("no operands of rank {r}"))),
        };
        let tb = tile_table_bytes(&rank.own_gemms, rp, mine)?;
        if self.tables_at.len() >= TABLE_SETS {
            idle()?;
            self.tables_at.clear();
        }
        let buf = DeviceBuffer::alloc(&rank.ctx, tb.bytes.len())?;
        // SAFETY: the buffer holds the bytes and is new; the stream is live
        // on its context.
        unsafe { cu::memcpy_htod_async(buf.ptr(), &tb.bytes, stream)? };
        let mut tables = self.no_tables.clone();
        if let Some(t) = tables.get_mut(r) {
            *t = tb.at(buf.ptr());
        }
        self.tables_at.insert(key, (buf, tables));
        Ok(())
    }

    /// What a fast call bound at `ptrs` issues from; its destination tables
    /// must exist ([`OpPlan::ensure_tables`]).
    pub(super) fn shared<'a>(
        &'a self,
        ptrs: &'a [Vec<DevicePtr>],
        diag: &'a HostWords,
    ) -> Result<Shared<'a>> {
        let tables = match self.table_key(ptrs) {
            None => &self.no_tables,
            Some(k) => match self.tables_at.get(&k) {
                Some((_, t)) => t,
                None => {
                    return Err(CudaError::Plan(
                        "a tile GEMM's destination tables were not made before its call".into(),
                    ))
                }
            },
        };
        Ok(Shared {
            shares_gpu: self.shares_gpu,
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
            tables,
            spec: RunSpec::ONCE,
            opts: fast_opts(),
            start: &self.start,
            abort: &self.abort,
            issuing: &self.issuing,
        })
    }
}
