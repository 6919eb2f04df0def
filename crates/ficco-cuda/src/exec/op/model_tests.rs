//! A CPU model of operator calls (tests only), to check the fast path's
//! ordering argument ([`super::op`]) without a GPU. It builds the
//! happens-before graph of a sequence of calls on every rank from the same
//! pieces the executor issues from: [`fast_steps`], [`Handoff`],
//! [`bind_operands`] on the job's arena layout, and the plan's tasks with
//! their stream order, events and flags (a flag wait is an edge from the
//! task or step that sets it). A full call is one node after every rank's
//! device went idle (its own run is correct by the run's barriers).
//!
//! It then checks, over the whole sequence:
//! * *no deadlock*: the graph has no cycle;
//! * *no race*: two accesses of overlapping bytes, one a write, are ordered
//!   (across calls too: every plan shares the arena, and the caller's
//!   tensors are reused call after call);
//! * *no stale read*: every read sees bytes written by its own call (one
//!   topological order suffices once there is no race).
//!
//! What it does not model: a flag word's value (it assumes each wait is
//! released by its own call's write; the words' clearing is argued in
//! [`crate::signal`] and [`super::op`]), NCCL and grouped GEMMs (not in
//! the plans it is given). A tile GEMM is one node per block, each after
//! its wait flag, and a last node after them all.

use super::{bind_operands, call_local, fast_steps, Handoff, Operand, Step};
use crate::exec::shared::flag_preds;
use crate::mem::DevicePtr;
use crate::runtime::job::arena_layout;
use ficco_core::plan::validate::{accesses, buffer_use};
use ficco_core::plan::{BufferRole, Plan, TaskKind, View};
use ficco_core::problem::workload::ELEM_BYTES;
use std::collections::{BTreeMap, HashMap};

/// Bytes `[lo, hi)` of the model's one address space, read or written.
#[derive(Debug, Clone, Copy)]
struct Acc {
    lo: u64,
    hi: u64,
    write: bool,
}

#[derive(Debug)]
struct Node {
    preds: Vec<usize>,
    acc: Vec<Acc>,
    call: usize,
    what: String,
    /// Whether its reads must see its own call's data (a full call's
    /// internals are not under test).
    check_reads: bool,
}

/// One operator call of the sequence, made alike by every rank.
pub(super) struct Call<'a> {
    pub plan: &'a Plan,
    /// The full path (a shape's first call), or the fast path.
    pub full: bool,
    /// Which set of the caller's tensors it uses (the same set again is
    /// the same memory again).
    pub tensors: u64,
    /// The caller's tensors are shared allocations, bound in place.
    pub shared: bool,
}

/// Where rank `q`'s memory lies in the model's address space.
fn arena_base(q: usize) -> u64 {
    (q as u64 + 1) << 40
}
fn tensor_base(q: usize, shared: bool, tensors: u64, role: BufferRole) -> u64 {
    let role = match role {
        BufferRole::InputA => 0,
        BufferRole::InputB => 1,
        BufferRole::InputX => 2,
        BufferRole::Output => 3,
        BufferRole::Scratch => 4,
    };
    arena_base(q) + ((1 + u64::from(shared)) << 36) + ((tensors * 8 + role) << 28)
}

/// The model: nodes in creation order, and per rank the last node of the
/// caller's stream and of the control stream, and its latest end.
pub(super) struct Model {
    nodes: Vec<Node>,
    caller: Vec<usize>,
    control: Vec<usize>,
    ended: Vec<usize>,
    /// The hand-offs a plan's fast calls use (the executor's, or a broken
    /// one to show that the checks fail without them).
    handoff: fn(&Plan) -> Handoff,
    /// Whether a tile GEMM's blocks follow their flags (off only to show
    /// that the checks fail without them).
    block_flags: bool,
}

impl Model {
    pub fn new(world: usize, handoff: fn(&Plan) -> Handoff) -> Self {
        let mut m = Model {
            nodes: vec![],
            caller: vec![],
            control: vec![],
            ended: vec![],
            handoff,
            block_flags: true,
        };
        // The session's start: every rank idle, every flag cleared.
        let start = m.node(vec![], vec![], 0, "start".into(), false);
        m.caller = vec![start; world];
        m.control = vec![start; world];
        m.ended = vec![start; world];
        m
    }

    fn node(
        &mut self,
        preds: Vec<usize>,
        acc: Vec<Acc>,
        call: usize,
        what: String,
        check_reads: bool,
    ) -> usize {
        self.nodes.push(Node {
            preds,
            acc,
            call,
            what,
            check_reads,
        });
        self.nodes.len() - 1
    }

    /// The bytes of view `v` of `owner`'s buffer bound at `ptrs`.
    fn view(plan: &Plan, ptrs: &[Vec<DevicePtr>], owner: usize, v: &View, write: bool) -> Vec<Acc> {
        let b = &plan.ranks[owner].buffers[v.buf];
        let base = ptrs[owner][v.buf].raw();
        let (e, pitch) = (ELEM_BYTES as u64, (b.cols * ELEM_BYTES) as u64);
        let rows = v.row as u64..(v.row + v.rows) as u64;
        if v.col == 0 && v.cols == b.cols {
            return vec![Acc {
                lo: base + rows.start * pitch,
                hi: base + rows.end * pitch,
                write,
            }];
        }
        rows.map(|row| Acc {
            lo: base + row * pitch + v.col as u64 * e,
            hi: base + row * pitch + (v.col + v.cols) as u64 * e,
            write,
        })
        .collect()
    }

    fn span(addr: DevicePtr, bytes: usize, write: bool) -> Acc {
        Acc {
            lo: addr.raw(),
            hi: addr.raw() + bytes as u64,
            write,
        }
    }

    /// Adds call number `c` (from 1) on every rank.
    pub fn call(&mut self, c: usize, call: &Call<'_>) {
        let plan = call.plan;
        let world = plan.ranks.len();
        let uses = buffer_use(plan);
        let (offsets, _) = arena_layout(plan, &call_local(plan, &uses));
        let arena: Vec<Vec<DevicePtr>> = offsets
            .iter()
            .enumerate()
            .map(|(q, offs)| {
                offs.iter()
                    .map(|&o| DevicePtr(arena_base(q) + o as u64))
                    .collect()
            })
            .collect();
        let roles = [BufferRole::InputA, BufferRole::InputB, BufferRole::Output];
        let operands = |r: usize| -> Vec<Operand> {
            let rp = &plan.ranks[r];
            roles
                .iter()
                .filter_map(|&role| {
                    let b = rp.buffer_with(role)?;
                    Some(Operand {
                        role,
                        addr: tensor_base(r, call.shared, call.tensors, role),
                        bytes: rp.buffers[b].bytes(),
                        shared: call.shared.then(|| {
                            (0..world)
                                .map(|q| DevicePtr(tensor_base(q, true, call.tensors, role)))
                                .collect()
                        }),
                        gathered: false,
                    })
                })
                .collect()
        };
        let ops: Vec<Vec<Operand>> = (0..world).map(operands).collect();
        let bound: Vec<_> = (0..world)
            .map(|r| bind_operands(plan, r, &uses, arena.clone(), &ops[r]).expect("binds"))
            .collect();
        // The caller writes this call's inputs on its stream.
        for (r, ops) in ops.iter().enumerate() {
            let acc = ops
                .iter()
                .filter(|o| o.role != BufferRole::Output)
                .map(|o| Self::span(DevicePtr(o.addr), o.bytes, true))
                .collect();
            self.caller[r] = self.node(
                vec![self.caller[r]],
                acc,
                c,
                format!("rank {r} caller writes inputs"),
                true,
            );
        }
        if call.full {
            self.full(c, plan, &bound);
        } else {
            self.fast(c, plan, &bound);
        }
        // The caller reads the output on its stream, after the call.
        for (r, ops) in ops.iter().enumerate() {
            let acc = ops
                .iter()
                .filter(|o| o.role == BufferRole::Output)
                .map(|o| Self::span(DevicePtr(o.addr), o.bytes, false))
                .collect();
            let preds = vec![self.caller[r], self.control[r]];
            self.caller[r] = self.node(
                preds,
                acc,
                c,
                format!("rank {r} caller reads the output"),
                true,
            );
        }
    }

    /// A full call: after every rank's device is idle, the whole run, and
    /// every rank idle again (its final barrier).
    fn full(&mut self, c: usize, plan: &Plan, bound: &[super::Bound]) {
        let mut preds = self.caller.clone();
        preds.extend(&self.control);
        let mut acc = vec![];
        for (r, b) in bound.iter().enumerate() {
            for &(dst, src, bytes) in b.copy_in.iter().chain(&b.copy_out) {
                acc.push(Self::span(src, bytes, false));
                acc.push(Self::span(dst, bytes, true));
            }
            for t in &plan.ranks[r].tasks {
                for (owner, v, write) in accesses(r, &t.kind) {
                    acc.extend(Self::view(plan, &b.ptrs, owner, &v, write));
                }
            }
        }
        let n = self.node(preds, acc, c, format!("full call {c}"), false);
        let world = bound.len();
        self.caller = vec![n; world];
        self.control = vec![n; world];
        self.ended = vec![n; world];
    }

    /// A fast call: each rank's steps as the executor issues them.
    fn fast(&mut self, c: usize, plan: &Plan, bound: &[super::Bound]) {
        let world = plan.ranks.len();
        let h = (self.handoff)(plan);
        let preds_of_flags = flag_preds(plan).expect("flag links");
        let links = ficco_core::plan::signal::flag_links(plan).expect("flag links");
        let mut steps: Vec<HashMap<Step, usize>> = vec![HashMap::new(); world];
        let mut tasks: Vec<Vec<usize>> = vec![vec![]; world];
        // Per rank per task: a tile GEMM's block nodes (empty for others).
        let mut blocks: Vec<Vec<Vec<usize>>> = vec![vec![]; world];
        // Pass 1: every node, with the edges within its rank.
        for (r, b) in bound.iter().enumerate() {
            // The control stream waits for the caller's stream first.
            let mut last = self.node(
                vec![self.caller[r], self.control[r]],
                vec![],
                c,
                format!("rank {r} call {c} waits for the caller"),
                true,
            );
            for step in fast_steps(&h, r) {
                let what = format!("rank {r} call {c} {step:?}");
                let n = match step {
                    Step::CopyIn | Step::CopyOut => {
                        let list = if step == Step::CopyIn {
                            &b.copy_in
                        } else {
                            &b.copy_out
                        };
                        let acc = list
                            .iter()
                            .flat_map(|&(dst, src, bytes)| {
                                [Self::span(src, bytes, false), Self::span(dst, bytes, true)]
                            })
                            .collect();
                        self.node(vec![last], acc, c, what, true)
                    }
                    Step::Tasks => {
                        let rp = &plan.ranks[r];
                        let mut on_stream: Vec<Option<usize>> = vec![None; rp.streams.len()];
                        for (i, t) in rp.tasks.iter().enumerate() {
                            let mut preds = vec![on_stream[t.stream].unwrap_or(last)];
                            preds.extend(
                                t.deps
                                    .iter()
                                    .filter(|d| d.rank == r)
                                    .map(|d| tasks[r][d.index]),
                            );
                            let what = format!("rank {r} call {c} task {i} {}", t.label);
                            let n = if let TaskKind::TileGemm(g) = &t.kind {
                                // Its blocks run side by side, each after
                                // its own wait flag (pass 2), reading its
                                // rows of A and storing its rows; the task
                                // ends when every block has.
                                let mut ends = vec![];
                                for blk in 0..g.blocks() {
                                    let (row, rows) = g.block_span(blk);
                                    let (out, add) = g.block_out(blk);
                                    let mut acc =
                                        Self::view(plan, &b.ptrs, r, &g.a.rows(row, rows), false);
                                    acc.extend(Self::view(plan, &b.ptrs, r, &g.b, false));
                                    acc.extend(Self::view(plan, &b.ptrs, r, &out, true));
                                    if add {
                                        acc.extend(Self::view(plan, &b.ptrs, r, &out, false));
                                    }
                                    ends.push(self.node(
                                        preds.clone(),
                                        acc,
                                        c,
                                        format!("{what} block {blk}"),
                                        true,
                                    ));
                                }
                                let n = self.node(ends.clone(), vec![], c, what, true);
                                blocks[r].push(ends);
                                n
                            } else {
                                let mut acc = vec![];
                                for (owner, v, write) in accesses(r, &t.kind) {
                                    acc.extend(Self::view(plan, &b.ptrs, owner, &v, write));
                                }
                                blocks[r].push(vec![]);
                                self.node(preds, acc, c, what, true)
                            };
                            tasks[r].push(n);
                            on_stream[t.stream] = Some(n);
                        }
                        let mut preds = vec![last];
                        preds.extend(on_stream.into_iter().flatten());
                        self.node(preds, vec![], c, format!("rank {r} call {c} join"), true)
                    }
                    _ => self.node(vec![last], vec![], c, what, true),
                };
                steps[r].insert(step, n);
                last = n;
            }
            self.control[r] = last;
        }
        // Pass 2: the edges across ranks (flags).
        let step_of = |steps: &Vec<HashMap<Step, usize>>, q: usize, s: Step| -> usize {
            *steps[q]
                .get(&s)
                .unwrap_or_else(|| panic!("rank {q} has no {s:?} step in call {c}"))
        };
        for r in 0..world {
            let mut cross: Vec<(usize, usize)> = vec![];
            if let Some(&w) = steps[r].get(&Step::WaitPeers) {
                for q in (0..world).filter(|&q| q != r) {
                    cross.push((w, self.ended[q]));
                }
            }
            if let Some(&w) = steps[r].get(&Step::WaitReady) {
                for &q in &h.ready_from[r] {
                    cross.push((w, step_of(&steps, q, Step::SignalReady)));
                }
            }
            if let Some(&w) = steps[r].get(&Step::WaitLanded) {
                for &q in &h.landed_from[r] {
                    cross.push((w, step_of(&steps, q, Step::SignalLanded)));
                }
            }
            if let Some(&w) = steps[r].get(&Step::WaitAllEnded) {
                for q in (0..world).filter(|&q| q != r) {
                    cross.push((w, step_of(&steps, q, Step::SignalEnd)));
                }
            }
            for (i, t) in plan.ranks[r].tasks.iter().enumerate() {
                for d in t.deps.iter().filter(|d| d.rank != r) {
                    cross.push((tasks[r][i], tasks[d.rank][d.index]));
                }
                for &(q, j) in &preds_of_flags[r][i] {
                    cross.push((tasks[r][i], tasks[q][j]));
                }
            }
            // A tile GEMM's flags: a block waits for its flag, or signals
            // its counter once stored ([`flag_preds`] leaves them out).
            for l in links.iter().filter(|l| {
                self.block_flags
                    && l.wait.rank == r
                    && (l.signal_block.is_some() || l.wait_block.is_some())
            }) {
                let at = |id: ficco_core::plan::TaskId, blk: Option<usize>| match blk {
                    Some(k) => blocks[id.rank][id.index][k],
                    None => tasks[id.rank][id.index],
                };
                cross.push((at(l.wait, l.wait_block), at(l.signal, l.signal_block)));
            }
            for (n, p) in cross {
                self.nodes[n].preds.push(p);
            }
        }
        for r in 0..world {
            self.ended[r] = step_of(&steps, r, Step::SignalDone);
        }
    }

    /// The checks of the module doc: the first violation found.
    pub fn check(&self) -> Result<(), String> {
        let n = self.nodes.len();
        // Kahn's topological order; a cycle is a deadlock.
        let mut succs = vec![vec![]; n];
        let mut indeg = vec![0usize; n];
        for (v, node) in self.nodes.iter().enumerate() {
            for &p in &node.preds {
                succs[p].push(v);
                indeg[v] += 1;
            }
        }
        let mut order: Vec<usize> = (0..n).filter(|&v| indeg[v] == 0).collect();
        let mut at = 0;
        while at < order.len() {
            let v = order[at];
            at += 1;
            for &s in &succs[v] {
                indeg[s] -= 1;
                if indeg[s] == 0 {
                    order.push(s);
                }
            }
        }
        if order.len() < n {
            let stuck = (0..n)
                .find(|&v| indeg[v] > 0)
                .map(|v| self.nodes[v].what.clone());
            return Err(format!("deadlock: a cycle of waits through {stuck:?}"));
        }
        // Ancestor bitsets.
        let words = n.div_ceil(64);
        let mut anc = vec![vec![0u64; words]; n];
        for &v in &order {
            let mut a = vec![0u64; words];
            for &p in &self.nodes[v].preds {
                for (x, y) in a.iter_mut().zip(&anc[p]) {
                    *x |= *y;
                }
                a[p / 64] |= 1 << (p % 64);
            }
            anc[v] = a;
        }
        let before = |a: usize, b: usize| anc[b][a / 64] >> (a % 64) & 1 == 1;
        // Races: overlapping accesses of different nodes, one a write.
        let mut all: Vec<(usize, Acc)> = self
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(v, node)| node.acc.iter().map(move |&a| (v, a)))
            .filter(|(_, a)| a.lo < a.hi)
            .collect();
        all.sort_by_key(|(_, a)| a.lo);
        for (i, &(u, x)) in all.iter().enumerate() {
            for &(v, y) in all[i + 1..].iter().take_while(|(_, y)| y.lo < x.hi) {
                if u != v && (x.write || y.write) && !before(u, v) && !before(v, u) {
                    return Err(format!(
                        "race: {} and {} touch bytes {:#x}.. unordered",
                        self.nodes[u].what, self.nodes[v].what, y.lo
                    ));
                }
            }
        }
        // Stale reads: which call wrote each byte, in one topological order.
        let mut written: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
        for &v in &order {
            let node = &self.nodes[v];
            if node.check_reads {
                for a in node.acc.iter().filter(|a| !a.write) {
                    let mut at = a.lo;
                    let segs = written
                        .range(..a.hi)
                        .rev()
                        .take_while(|(_, &(hi, _))| hi > a.lo);
                    let mut segs: Vec<(u64, u64, usize)> =
                        segs.map(|(&lo, &(hi, call))| (lo, hi, call)).collect();
                    segs.reverse();
                    for (lo, hi, call) in segs {
                        if lo > at || call != node.call {
                            return Err(format!(
                                "stale read: {} (call {}) reads bytes {:#x}.. {}",
                                node.what,
                                node.call,
                                lo.max(at),
                                if lo > at {
                                    "that nothing wrote".to_string()
                                } else {
                                    format!("written by call {call}")
                                }
                            ));
                        }
                        at = hi;
                    }
                    if at < a.hi {
                        return Err(format!(
                            "stale read: {} reads bytes {at:#x}.. that nothing wrote",
                            node.what
                        ));
                    }
                }
            }
            for a in node.acc.iter().filter(|a| a.write && a.lo < a.hi) {
                write_span(&mut written, a.lo, a.hi, node.call);
            }
        }
        Ok(())
    }
}

/// Marks bytes `[lo, hi)` as written by `call` in a map of disjoint
/// segments (start -> (end, call)).
fn write_span(map: &mut BTreeMap<u64, (u64, usize)>, lo: u64, hi: u64, call: usize) {
    let over: Vec<(u64, (u64, usize))> = map
        .range(..hi)
        .rev()
        .take_while(|(_, &(end, _))| end > lo)
        .map(|(&s, &e)| (s, e))
        .collect();
    for (s, (e, old)) in over {
        map.remove(&s);
        if s < lo {
            map.insert(s, (lo, old));
        }
        if e > hi {
            map.insert(hi, (e, old));
        }
    }
    map.insert(lo, (hi, call));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::op::fast_capable;
    use ficco_core::plan::lower::lower;
    use ficco_core::plan::TaskKind;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::{enumerate, Schedule, SpaceOptions};

    /// The plans of `op` on `gpus` that take the fast path and that the
    /// model covers (no NCCL: its rendezvous is not modelled).
    fn fast_plans(op: Op, (m, k, n): (usize, usize, usize), gpus: usize) -> Vec<Plan> {
        let p = Problem::new(op, m, k, n, gpus).expect("problem");
        enumerate(op, SpaceOptions::default())
            .iter()
            .filter_map(|s| lower(&p, s).ok())
            .filter(|plan| {
                fast_capable(plan) && !plan.has_task(|k| matches!(k, TaskKind::Nccl { .. }))
            })
            .collect()
    }

    fn plan(op: Op, (m, k, n): (usize, usize, usize), gpus: usize, s: &str) -> Plan {
        let p = Problem::new(op, m, k, n, gpus).expect("problem");
        lower(&p, &s.parse::<Schedule>().expect("schedule")).expect("lower")
    }

    /// (full, plan, tensors) of each call: every shape's first call full,
    /// then fast calls alternating between the plans (each after another
    /// plan's), each plan twice in a row (each after its own, on the same
    /// tensors), a full call after fast ones, and the plans backwards.
    fn sequence(plans: usize) -> Vec<(bool, usize, u64)> {
        let fast = |i: usize| (false, i, i as u64);
        let mut out: Vec<_> = (0..plans).map(|i| (true, i, i as u64)).collect();
        out.extend((0..plans).map(fast));
        out.extend((0..plans).flat_map(|i| [fast(i), fast(i)]));
        out.push((true, 0, 0));
        out.extend((0..plans).rev().map(fast));
        out
    }

    fn run(plans: &[&Plan], shared: bool, handoff: fn(&Plan) -> Handoff) -> Result<(), String> {
        run_model(plans, shared, handoff, true)
    }

    fn run_model(
        plans: &[&Plan],
        shared: bool,
        handoff: fn(&Plan) -> Handoff,
        block_flags: bool,
    ) -> Result<(), String> {
        let world = plans[0].ranks.len();
        let mut m = Model::new(world, handoff);
        m.block_flags = block_flags;
        for (c, (full, i, tensors)) in sequence(plans.len()).into_iter().enumerate() {
            m.call(
                c + 1,
                &Call {
                    plan: plans[i],
                    full,
                    tensors,
                    shared,
                },
            );
        }
        m.check().map_err(|e| {
            let names: Vec<&str> = plans.iter().map(|p| p.name.as_str()).collect();
            format!("{names:?} shared={shared}: {e}")
        })
    }

    const AG: (usize, usize, usize) = (512, 256, 384);
    const RS: (usize, usize, usize) = (256, 512, 384);
    const AR: (usize, usize, usize) = (512, 256, 256);

    /// The repeated calls that came out wrong on the GPU: an ag-gemm whose
    /// peers pull this rank's shard, a gemm-ar whose peers push into this
    /// rank's output, alternating with a gemm-rs.
    #[test]
    fn repeated_alternating_calls_neither_race_nor_read_stale_data() {
        for gpus in [2, 4] {
            for s in ["shard-copy-ring", "fine2-copy-all"] {
                let ag = plan(Op::AgGemm, AG, gpus, s);
                let rs = plan(Op::GemmRs, RS, gpus, s);
                let ar = plan(Op::GemmAr, AR, gpus, s);
                for shared in [false, true] {
                    run(&[&ag, &rs, &ar], shared, Handoff::of).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }

    /// Without the hand-offs (the fast path as first written) the model
    /// finds what the GPU showed: the output is copied out before a peer's
    /// push.
    #[test]
    fn without_the_handoffs_the_model_finds_the_races_seen_on_the_gpu() {
        let none = |_: &Plan| Handoff::default();
        // ag-gemm once pulled the peers' shards (the race the GPU showed);
        // it pushes now: it reaches only scratch memory of its peers.
        let ag = plan(Op::AgGemm, AG, 2, "shard-copy-ring");
        assert!(Handoff::of(&ag).ready_to.iter().all(Vec::is_empty));
        run(&[&ag], false, none).expect("ag-gemm needs no hand-off");
        let ar = plan(Op::GemmAr, AR, 2, "fine2-copy-all");
        let e = run(&[&ar], false, none).expect_err("gemm-ar races");
        assert!(
            e.contains("race") && e.contains("CopyOut") && e.contains("bcast"),
            "{e}"
        );
        // A gemm-rs reaches only scratch memory of its peers: nothing to hand off.
        let rs = plan(Op::GemmRs, RS, 2, "fine2-copy-all");
        assert_eq!(Handoff::of(&rs), {
            let mut h = Handoff::of(&rs);
            h.ready_to.iter_mut().for_each(Vec::clear);
            h.ready_from.iter_mut().for_each(Vec::clear);
            h.landed_to.iter_mut().for_each(Vec::clear);
            h.landed_from.iter_mut().for_each(Vec::clear);
            h
        });
        run(&[&rs], false, none).expect("gemm-rs needs no hand-off");
        // Nor in shared memory (the end of every peer is waited for).
        run(&[&ag], true, none).expect("ag-gemm in place needs no hand-off");
    }

    /// Tile GEMMs on the fast path: each block is ordered by its own flag.
    /// Without the blocks' flag edges the model finds races (ag-gemm's
    /// blocks read pushed rows, gemm-rs's pushes read stored blocks): it
    /// sees the blocks, not only the task.
    #[test]
    fn tile_blocks_are_ordered_by_their_flags_across_calls() {
        // Shards of whole 128-row blocks on 4 ranks.
        let tile = (1024, 256, 384);
        for gpus in [2, 4] {
            let ag = plan(Op::AgGemm, tile, gpus, "tile-copy-ring");
            let rs = plan(Op::GemmRs, tile, gpus, "tile-copy-all");
            let ar = plan(Op::GemmAr, tile, gpus, "tile-copy-ring");
            for shared in [false, true] {
                run(&[&ag, &rs, &ar], shared, Handoff::of).unwrap_or_else(|e| panic!("{e}"));
            }
            if gpus == 2 {
                // `-acc`: each own block waits for the peer's pushed chunk
                // and adds into the output, which peers also write.
                let rs_acc = plan(Op::GemmRs, tile, gpus, "tile-copy-ring-acc");
                let ar_acc = plan(Op::GemmAr, tile, gpus, "tile-copy-all-acc");
                for shared in [false, true] {
                    run(&[&rs_acc, &ag, &ar_acc], shared, Handoff::of)
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            }
            for p in [&ag, &rs] {
                let e = run_model(&[p], false, Handoff::of, false)
                    .expect_err("blocks that ignore their flags race");
                assert!(e.contains("race") && e.contains("tile-gemm"), "{e}");
            }
        }
    }

    /// Every fast-capable copy schedule of the three operators, on 2 and 4
    /// ranks, alternating with one another.
    #[test]
    fn every_fast_schedule_is_ordered_across_calls() {
        for gpus in [2, 4] {
            let ag = fast_plans(Op::AgGemm, AG, gpus);
            let rs = fast_plans(Op::GemmRs, RS, gpus);
            let ar = fast_plans(Op::GemmAr, AR, gpus);
            assert!(!ag.is_empty() && !rs.is_empty() && !ar.is_empty());
            let n = ag.len().max(rs.len()).max(ar.len());
            for i in 0..n {
                let plans = [&ag[i % ag.len()], &rs[i % rs.len()], &ar[i % ar.len()]];
                run(&plans, i % 2 == 1, Handoff::of).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}
