//! Plan validation: what must hold before any executor runs a plan.
//!
//! * Structure: indices in range, views inside their buffers, operand shapes
//!   that agree, NCCL buffers contiguous, reduces of at most
//!   [`MAX_REDUCE_SOURCES`] sources, NCCL calls that match on every rank in
//!   the same order.
//!
//! This is the one validator: the executors run only plans it accepted and
//! do not re-check them.
//! * No cycle in happens-before (stream order, dependencies, Signal → Wait
//!   through flags, and NCCL rendezvous, where every member waits for every
//!   member's predecessors), and none in issue order (each rank's host thread
//!   issues its tasks in plan order and may wait for another rank to issue a
//!   dependency first; a Wait is device-side and adds no host edge).
//! * Flags ([`crate::plan::signal::flag_edges`]): every Wait's flag is
//!   signalled exactly once, to a rank that exists, and every signalled flag
//!   is waited on; otherwise "wait on flag F of rank r is never signalled" and
//!   the like, naming rank, task and flag.
//! * A tile GEMM that waits inside the kernel has every producer of its
//!   flags that needs its GPU's SMs ordered before its launch
//!   ([`crate::plan::spin`]).
//! * Every read of non-input memory is covered by writes ordered before it.
//! * No two unordered tasks touch overlapping memory where either writes.

use crate::error::{Error, Result};
use crate::plan::graph::{topo_csr, Csr, Graph};
use crate::plan::{
    BufferRole, GemmGroup, NcclOp, Plan, TaskId, TaskKind, TileGemm, View, MAX_REDUCE_SOURCES,
};
use std::collections::HashMap;

/// Rejects structural errors, cycles, reads not ordered after their writes, and races.
///
/// Tile GEMMs are checked as a whole for structure, then every block as its
/// own task chain ([`crate::plan::tile::expand`]): errors about a block name
/// the expanded task (the GEMM's label and ` bI`).
pub fn validate(plan: &Plan) -> Result<()> {
    check_structure(plan)?;
    if crate::plan::tile::has_tiles(plan) {
        // The tile-level graph first: its errors name the plan's own tasks.
        Graph::new(plan)?;
        crate::plan::spin::check_spin_producers(plan)?;
        let expanded = crate::plan::tile::expand(plan);
        check_structure(&expanded)?;
        return validate_flat(&expanded);
    }
    validate_flat(plan)
}

/// [`validate`] of a plan without tile GEMMs.
fn validate_flat(plan: &Plan) -> Result<()> {
    let g = Graph::new(plan)?;
    check_issue_order(plan, &g)?;
    let hb = HappensBefore::build(plan, g)?;
    check_memory(plan, &hb)
}

fn invalid(msg: String) -> Error {
    Error::InvalidPlan(msg)
}

fn name(plan: &Plan, id: TaskId) -> String {
    let label = plan.task(id).map(|t| t.label.as_str()).unwrap_or("?");
    format!("rank {} task {} '{}'", id.rank, id.index, label)
}

fn check_view(plan: &Plan, rank: usize, v: &View, what: &str, id: TaskId) -> Result<()> {
    let rp = plan.ranks.get(rank).ok_or_else(|| {
        invalid(format!(
            "{}: {what} names rank {rank}, which does not exist",
            name(plan, id)
        ))
    })?;
    let b = rp.buffers.get(v.buf).ok_or_else(|| {
        invalid(format!(
            "{}: {what} names buffer {} that rank {rank} lacks",
            name(plan, id),
            v.buf
        ))
    })?;
    if v.rows == 0 || v.cols == 0 || v.row + v.rows > b.rows || v.col + v.cols > b.cols {
        return Err(invalid(format!(
            "{}: {what} [{}+{}, {}+{}] is empty or outside buffer '{}' [{}, {}]",
            name(plan, id),
            v.row,
            v.rows,
            v.col,
            v.cols,
            b.name,
            b.rows,
            b.cols
        )));
    }
    Ok(())
}

/// NCCL takes a pointer and a count, so its views must be contiguous.
fn contiguous(plan: &Plan, rank: usize, v: &View) -> bool {
    let cols = plan.ranks[rank].buffers[v.buf].cols;
    v.rows == 1 || (v.col == 0 && v.cols == cols)
}

fn check_structure(plan: &Plan) -> Result<()> {
    let p = plan.problem.gpus;
    if plan.ranks.len() != p {
        return Err(invalid(format!(
            "{} rank plans for {p} GPUs",
            plan.ranks.len()
        )));
    }
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            let id = TaskId { rank: r, index: i };
            if t.stream >= rp.streams.len() {
                return Err(invalid(format!(
                    "{}: stream {} does not exist",
                    name(plan, id),
                    t.stream
                )));
            }
            for d in &t.deps {
                if plan.task(*d).is_none() || *d == id {
                    return Err(invalid(format!("{}: bad dependency {d:?}", name(plan, id))));
                }
            }
            match &t.kind {
                TaskKind::Gemm {
                    a, b, c, sm_target, ..
                } => {
                    for (v, w) in [(a, "a"), (b, "b"), (c, "c")] {
                        check_view(plan, r, v, w, id)?;
                    }
                    if a.rows != c.rows || a.cols != b.rows || b.cols != c.cols {
                        return Err(invalid(format!(
                            "{}: GEMM shapes disagree: [{}x{}] x [{}x{}] -> [{}x{}]",
                            name(plan, id),
                            a.rows,
                            a.cols,
                            b.rows,
                            b.cols,
                            c.rows,
                            c.cols
                        )));
                    }
                    if *sm_target == Some(0) {
                        return Err(invalid(format!("{}: SM target 0", name(plan, id))));
                    }
                }
                TaskKind::GroupedGemm { groups, sm_target } => {
                    check_grouped(plan, r, id, groups)?;
                    if *sm_target == Some(0) {
                        return Err(invalid(format!("{}: SM target 0", name(plan, id))));
                    }
                }
                TaskKind::Copy { src, dst } => {
                    check_view(plan, src.rank, &src.view, "copy source", id)?;
                    check_view(plan, dst.rank, &dst.view, "copy destination", id)?;
                    if src.rank != r && dst.rank != r {
                        return Err(invalid(format!(
                            "{}: neither end of the copy is on rank {r}",
                            name(plan, id)
                        )));
                    }
                    if (src.view.rows, src.view.cols) != (dst.view.rows, dst.view.cols) {
                        return Err(invalid(format!(
                            "{}: copy ends differ in shape",
                            name(plan, id)
                        )));
                    }
                }
                TaskKind::Reduce { srcs, dst } => {
                    check_view(plan, r, dst, "reduce destination", id)?;
                    if srcs.is_empty() || srcs.len() > MAX_REDUCE_SOURCES {
                        return Err(invalid(format!(
                            "{}: reduce of {} sources (1..={MAX_REDUCE_SOURCES} supported)",
                            name(plan, id),
                            srcs.len()
                        )));
                    }
                    for s in srcs {
                        check_view(plan, r, s, "reduce source", id)?;
                        if (s.rows, s.cols) != (dst.rows, dst.cols) {
                            return Err(invalid(format!(
                                "{}: reduce operands differ in shape",
                                name(plan, id)
                            )));
                        }
                    }
                }
                // Flags are checked with the graph (`signal::flag_edges`).
                TaskKind::Signal { .. } | TaskKind::Wait { .. } => {}
                TaskKind::TileGemm(g) => check_tile(plan, r, id, g)?,
                TaskKind::Nccl { op, .. } => {
                    let views: Vec<&View> = match op {
                        NcclOp::AllGather { send, recv }
                        | NcclOp::ReduceScatter { send, recv }
                        | NcclOp::AllReduce { send, recv } => vec![send, recv],
                        NcclOp::SendRecv { sends, recvs } => {
                            for (peer, _) in sends.iter().chain(recvs) {
                                if *peer >= p || *peer == r {
                                    return Err(invalid(format!(
                                        "{}: bad peer {peer}",
                                        name(plan, id)
                                    )));
                                }
                            }
                            sends.iter().chain(recvs).map(|(_, v)| v).collect()
                        }
                    };
                    for v in views {
                        check_view(plan, r, v, "NCCL buffer", id)?;
                        if !contiguous(plan, r, v) {
                            return Err(invalid(format!(
                                "{}: NCCL buffer is not contiguous",
                                name(plan, id)
                            )));
                        }
                    }
                    let ok = match op {
                        NcclOp::AllGather { send, recv } => recv.elems() == p * send.elems(),
                        NcclOp::ReduceScatter { send, recv } => send.elems() == p * recv.elems(),
                        NcclOp::AllReduce { send, recv } => send.elems() == recv.elems(),
                        NcclOp::SendRecv { .. } => true,
                    };
                    if !ok {
                        return Err(invalid(format!(
                            "{}: NCCL counts disagree with {p} ranks",
                            name(plan, id)
                        )));
                    }
                }
            }
        }
    }
    check_nccl_matching(plan)
}

/// A grouped GEMM: at least one group, every group's views in bounds with
/// agreeing shapes, and outputs pairwise disjoint (a grouped kernel runs the
/// groups at once) and disjoint from every input of the task.
fn check_grouped(plan: &Plan, r: usize, id: TaskId, groups: &[GemmGroup]) -> Result<()> {
    if groups.is_empty() {
        return Err(invalid(format!(
            "{}: grouped GEMM of no groups",
            name(plan, id)
        )));
    }
    for (i, g) in groups.iter().enumerate() {
        for (v, w) in [(&g.a, "a"), (&g.b, "b"), (&g.c, "c")] {
            check_view(plan, r, v, &format!("group {i} {w}"), id)?;
        }
        if g.a.rows != g.c.rows || g.a.cols != g.b.rows || g.b.cols != g.c.cols {
            return Err(invalid(format!(
                "{}: group {i}: GEMM shapes disagree: [{}x{}] x [{}x{}] -> [{}x{}]",
                name(plan, id),
                g.a.rows,
                g.a.cols,
                g.b.rows,
                g.b.cols,
                g.c.rows,
                g.c.cols
            )));
        }
    }
    // Sorted by (buffer, first row), overlapping outputs are neighbours.
    let mut outs: Vec<&View> = groups.iter().map(|g| &g.c).collect();
    outs.sort_by_key(|v| (v.buf, v.row));
    if let Some(w) = outs.windows(2).find(|w| w[0].overlaps(w[1])) {
        return Err(invalid(format!(
            "{}: groups write overlapping rows {}..{} and {}..{}",
            name(plan, id),
            w[0].row,
            w[0].row + w[0].rows,
            w[1].row,
            w[1].row + w[1].rows
        )));
    }
    for g in groups {
        for c in &outs {
            if c.overlaps(&g.a) || c.overlaps(&g.b) {
                return Err(invalid(format!(
                    "{}: a group's output overlaps an input of the same grouped GEMM",
                    name(plan, id)
                )));
            }
        }
    }
    Ok(())
}

/// A tile GEMM's shapes, blocks and destinations.
fn check_tile(plan: &Plan, r: usize, id: TaskId, g: &TileGemm) -> Result<()> {
    for (v, w) in [(&g.a, "a"), (&g.b, "b"), (&g.c, "c")] {
        check_view(plan, r, v, w, id)?;
    }
    if g.a.rows != g.c.rows || g.a.cols != g.b.rows || g.b.cols != g.c.cols {
        return Err(invalid(format!(
            "{}: tile GEMM shapes disagree: [{}x{}] x [{}x{}] -> [{}x{}]",
            name(plan, id),
            g.a.rows,
            g.a.cols,
            g.b.rows,
            g.b.cols,
            g.c.rows,
            g.c.cols
        )));
    }
    if g.block_rows == 0 || g.a.rows % g.block_rows != 0 {
        return Err(invalid(format!(
            "{}: {} rows are not whole blocks of {} rows",
            name(plan, id),
            g.a.rows,
            g.block_rows
        )));
    }
    let blocks = g.blocks();
    if g.first_block >= blocks {
        return Err(invalid(format!(
            "{}: first block {} of {blocks}",
            name(plan, id),
            g.first_block
        )));
    }
    if g.sm_target == Some(0) {
        return Err(invalid(format!("{}: SM target 0", name(plan, id))));
    }
    if !g.dest.is_empty() && g.dest.len() != blocks {
        return Err(invalid(format!(
            "{}: {} destinations for {blocks} blocks",
            name(plan, id),
            g.dest.len()
        )));
    }
    let mut ld = None;
    for (b, d) in g.dest.iter().enumerate() {
        let Some(v) = d else { continue };
        check_view(plan, r, v, "tile destination", id)?;
        if (v.rows, v.cols) != (g.block_rows, g.c.cols) {
            return Err(invalid(format!(
                "{}: destination of block {b} is [{}x{}], the block [{}x{}]",
                name(plan, id),
                v.rows,
                v.cols,
                g.block_rows,
                g.c.cols
            )));
        }
        // The kernel takes one leading dimension for every destination.
        let cols = plan.ranks[r].buffers[v.buf].cols;
        if *ld.get_or_insert(cols) != cols {
            return Err(invalid(format!(
                "{}: destinations in buffers of different widths",
                name(plan, id)
            )));
        }
    }
    Ok(())
}

/// Every rank makes the same NCCL calls in the same order, on one stream, and
/// every send has its matching receive.
fn check_nccl_matching(plan: &Plan) -> Result<()> {
    let mut seqs: Vec<Vec<(usize, TaskId)>> = vec![];
    for (r, rp) in plan.ranks.iter().enumerate() {
        let mut seq = vec![];
        let mut stream = None;
        for (i, t) in rp.tasks.iter().enumerate() {
            if let TaskKind::Nccl { group, .. } = t.kind {
                let id = TaskId { rank: r, index: i };
                if *stream.get_or_insert(t.stream) != t.stream {
                    return Err(invalid(format!(
                        "{}: NCCL calls of a rank must share one stream",
                        name(plan, id)
                    )));
                }
                seq.push((group, id));
            }
        }
        seqs.push(seq);
    }
    let groups: Vec<usize> = seqs[0].iter().map(|(g, _)| *g).collect();
    for (r, seq) in seqs.iter().enumerate() {
        let gs: Vec<usize> = seq.iter().map(|(g, _)| *g).collect();
        if gs != groups {
            return Err(invalid(format!(
                "rank {r} makes NCCL calls {gs:?} but rank 0 makes {groups:?}: every rank must make the same calls in the same order"
            )));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (k, g) in groups.iter().enumerate() {
        if !seen.insert(*g) {
            return Err(invalid(format!("NCCL group {g} is used twice on a rank")));
        }
        let members: Vec<TaskId> = seqs.iter().map(|s| s[k].1).collect();
        let ops: Vec<&NcclOp> = members
            .iter()
            .filter_map(|id| match &plan.task(*id)?.kind {
                TaskKind::Nccl { op, .. } => Some(op),
                _ => None,
            })
            .collect();
        let first = std::mem::discriminant(ops[0]);
        for (r, op) in ops.iter().enumerate() {
            if std::mem::discriminant(*op) != first {
                return Err(invalid(format!(
                    "NCCL group {g}: rank {r} calls {} but rank 0 calls {}",
                    op.short(),
                    ops[0].short()
                )));
            }
            match op {
                NcclOp::SendRecv { sends, .. } => {
                    for (d, v) in sends {
                        let NcclOp::SendRecv { recvs, .. } = ops[*d] else {
                            continue;
                        };
                        let n = sends
                            .iter()
                            .filter(|(x, w)| x == d && w.elems() == v.elems())
                            .count();
                        let m = recvs
                            .iter()
                            .filter(|(x, w)| *x == r && w.elems() == v.elems())
                            .count();
                        if n != m {
                            return Err(invalid(format!(
                                "NCCL group {g}: rank {r} sends {} elements to rank {d}, which has no matching receive",
                                v.elems()
                            )));
                        }
                    }
                    let NcclOp::SendRecv { recvs, .. } = op else {
                        continue;
                    };
                    for (q, v) in recvs {
                        let NcclOp::SendRecv { sends, .. } = ops[*q] else {
                            continue;
                        };
                        if !sends.iter().any(|(x, w)| *x == r && w.elems() == v.elems()) {
                            return Err(invalid(format!(
                                "NCCL group {g}: rank {r} receives {} elements from rank {q}, which sends none",
                                v.elems()
                            )));
                        }
                    }
                }
                _ => {
                    let size = |o: &NcclOp| match o {
                        NcclOp::AllGather { send, .. }
                        | NcclOp::ReduceScatter { send, .. }
                        | NcclOp::AllReduce { send, .. } => send.elems(),
                        NcclOp::SendRecv { .. } => 0,
                    };
                    if size(op) != size(ops[0]) {
                        return Err(invalid(format!(
                            "NCCL group {g}: rank {r}'s count differs from rank 0's"
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

fn check_issue_order(plan: &Plan, g: &Graph) -> Result<()> {
    // Each rank's host thread issues in plan order: the previous task of the
    // rank (any stream) comes first, then the explicit dependencies. A Wait's
    // flag edge is not here: the host issues a Wait without waiting for its
    // Signal, so a plan with signals has no cross-rank host edge.
    let mut preds = Csr::with_capacity(g.len(), 2 * g.len());
    for v in 0..g.len() {
        let prev = (g.id(v).index > 0).then(|| v - 1);
        preds.push_node(g.deps(v).iter().copied().chain(prev));
    }
    topo_csr(&preds).map(|_| ()).map_err(|v| {
        invalid(format!(
            "issue-order cycle: {} waits for a task its rank's host thread can only issue later",
            name(plan, g.id(v))
        ))
    })
}

/// Happens-before over tasks (and one node per NCCL group): the
/// predecessor lists and a topological order. [`HappensBefore::before`]
/// answers a query by a backward search from the later task that never
/// leaves the part of the topological order between the two tasks, so no
/// O(n²) ancestor table is built: validation stays fast and small at
/// large GPU counts, where plans have tens of thousands of tasks and the
/// memory check asks only about tasks that touch overlapping memory
/// (mostly direct dependencies, answered at once).
pub(crate) struct HappensBefore {
    ix: Graph,
    preds: Csr,
    /// Position of every node in `topo_nodes`.
    pos: Vec<usize>,
    /// A topological order of task nodes (group nodes removed).
    pub(crate) order: Vec<TaskId>,
    /// Search scratch: per node the query stamp that visited it, and the stack.
    scratch: std::cell::RefCell<(Vec<u32>, u32, Vec<usize>)>,
}

impl HappensBefore {
    pub(crate) fn build(plan: &Plan, ix: Graph) -> Result<Self> {
        let total = ix.len();
        let mut groups: HashMap<usize, usize> = HashMap::new();
        for rp in &plan.ranks {
            for t in &rp.tasks {
                if let TaskKind::Nccl { group, .. } = t.kind {
                    let next = total + groups.len();
                    groups.entry(group).or_insert(next);
                }
            }
        }
        let n = total + groups.len();
        // Task nodes' lists first (in one array), the groups' after: a
        // group node gathers every member's predecessors, and a member
        // waits for its group node.
        let mut preds = Csr::with_capacity(n, 2 * total);
        let mut group_preds: Vec<Vec<usize>> = vec![vec![]; groups.len()];
        let mut ps = Vec::new();
        let mut rank = 0;
        for v in 0..total {
            while rank + 1 < plan.ranks.len()
                && ix.node(TaskId {
                    rank: rank + 1,
                    index: 0,
                }) <= v
            {
                rank += 1;
            }
            let id = TaskId {
                rank,
                index: v - ix.node(TaskId { rank, index: 0 }),
            };
            ix.preds_into(v, &mut ps);
            if let TaskKind::Nccl { group, .. } = plan.ranks[id.rank].tasks[id.index].kind {
                let gnode = groups[&group];
                group_preds[gnode - total].extend_from_slice(&ps);
                preds.push_node([gnode]);
            } else {
                preds.push_node(ps.iter().copied());
            }
        }
        for gp in group_preds {
            preds.push_node(gp);
        }
        let order = topo_csr(&preds).map_err(|v| {
            let what = if v < total {
                name(plan, ix.id(v))
            } else {
                "an NCCL rendezvous".to_string()
            };
            invalid(format!("dependency cycle through {what}"))
        })?;
        let mut pos = vec![0; n];
        for (i, &v) in order.iter().enumerate() {
            pos[v] = i;
        }
        let task_order = order
            .into_iter()
            .filter(|&v| v < total)
            .map(|v| ix.id(v))
            .collect();
        Ok(HappensBefore {
            ix,
            preds,
            pos,
            order: task_order,
            scratch: std::cell::RefCell::new((vec![0; n], 0, vec![])),
        })
    }

    /// Whether `a` finishes before `b` starts.
    pub(crate) fn before(&self, a: TaskId, b: TaskId) -> bool {
        let (u, v) = (self.ix.node(a), self.ix.node(b));
        if u == v || self.pos[u] >= self.pos[v] {
            return false;
        }
        let mut guard = self.scratch.borrow_mut();
        let (seen, stamp, stack) = &mut *guard;
        *stamp = stamp.wrapping_add(1);
        if *stamp == 0 {
            seen.iter_mut().for_each(|x| *x = 0);
            *stamp = 1;
        }
        stack.clear();
        stack.push(v);
        while let Some(w) = stack.pop() {
            for &p in self.preds.of(w) {
                if p == u {
                    return true;
                }
                // Nodes at or before u in topological order cannot reach u.
                if self.pos[p] > self.pos[u] && seen[p] != *stamp {
                    seen[p] = *stamp;
                    stack.push(p);
                }
            }
        }
        false
    }
}

#[derive(Clone, Copy)]
struct Access {
    task: TaskId,
    view: View,
    write: bool,
}

/// Memory a task reads and writes, keyed by the rank that owns it: (owner
/// rank, view, written).
pub fn accesses(rank: usize, kind: &TaskKind) -> Vec<(usize, View, bool)> {
    accesses_listed(rank, kind)
}

/// [`accesses`] one at a time, in the same order, with no allocation for
/// the common kinds (one Vec per task was a tenth of validating at P = 72).
fn for_each_access(rank: usize, kind: &TaskKind, mut f: impl FnMut(usize, View, bool)) {
    let mut each = |list: &[(usize, View, bool)]| {
        for &(o, v, w) in list {
            f(o, v, w);
        }
    };
    match kind {
        TaskKind::Gemm {
            a,
            b,
            c,
            accumulate,
            ..
        } => {
            each(&[(rank, *a, false), (rank, *b, false), (rank, *c, true)]);
            if *accumulate {
                each(&[(rank, *c, false)]);
            }
        }
        TaskKind::Copy { src, dst } => {
            each(&[(src.rank, src.view, false), (dst.rank, dst.view, true)]);
        }
        TaskKind::Signal { .. } | TaskKind::Wait { .. } => {}
        TaskKind::Nccl {
            op:
                NcclOp::AllGather { send, recv }
                | NcclOp::ReduceScatter { send, recv }
                | NcclOp::AllReduce { send, recv },
            ..
        } => each(&[(rank, *send, false), (rank, *recv, true)]),
        other => each(&accesses_listed(rank, other)),
    }
}

/// [`accesses`]: every kind's list.
fn accesses_listed(rank: usize, kind: &TaskKind) -> Vec<(usize, View, bool)> {
    match kind {
        TaskKind::Gemm {
            a,
            b,
            c,
            accumulate,
            ..
        } => {
            let mut v = vec![(rank, *a, false), (rank, *b, false), (rank, *c, true)];
            if *accumulate {
                v.push((rank, *c, false));
            }
            v
        }
        TaskKind::GroupedGemm { groups, .. } => groups
            .iter()
            .flat_map(|g| [(rank, g.a, false), (rank, g.b, false), (rank, g.c, true)])
            .collect(),
        TaskKind::Copy { src, dst } => {
            vec![(src.rank, src.view, false), (dst.rank, dst.view, true)]
        }
        TaskKind::Reduce { srcs, dst } => {
            let mut v: Vec<_> = srcs.iter().map(|s| (rank, *s, false)).collect();
            v.push((rank, *dst, true));
            v
        }
        TaskKind::Signal { .. } | TaskKind::Wait { .. } => vec![],
        // The whole GEMM; per block after `tile::expand`.
        TaskKind::TileGemm(g) => {
            let mut v = vec![(rank, g.a, false), (rank, g.b, false)];
            for b in 0..g.blocks() {
                let (out, add) = g.block_out(b);
                v.push((rank, out, true));
                if add {
                    v.push((rank, out, false));
                }
            }
            v
        }
        TaskKind::Nccl { op, .. } => match op {
            NcclOp::AllGather { send, recv }
            | NcclOp::ReduceScatter { send, recv }
            | NcclOp::AllReduce { send, recv } => vec![(rank, *send, false), (rank, *recv, true)],
            NcclOp::SendRecv { sends, recvs } => sends
                .iter()
                .map(|(_, v)| (rank, *v, false))
                .chain(recvs.iter().map(|(_, v)| (rank, *v, true)))
                .collect(),
        },
    }
}

/// Whether the union of `covers` contains every element of `target`.
fn covered(target: &View, covers: &[View]) -> bool {
    // Mostly one write covers the whole read: no grid to build.
    let contains = |v: &View| {
        v.row <= target.row
            && target.row + target.rows <= v.row + v.rows
            && v.col <= target.col
            && target.col + target.cols <= v.col + v.cols
    };
    if covers.iter().any(contains) {
        return true;
    }
    let clip = |v: &View| {
        let r0 = v.row.max(target.row);
        let r1 = (v.row + v.rows).min(target.row + target.rows);
        let c0 = v.col.max(target.col);
        let c1 = (v.col + v.cols).min(target.col + target.cols);
        (r0 < r1 && c0 < c1).then_some((r0, r1, c0, c1))
    };
    let rects: Vec<_> = covers.iter().filter_map(clip).collect();
    let mut rows: Vec<usize> = vec![target.row, target.row + target.rows];
    let mut cols: Vec<usize> = vec![target.col, target.col + target.cols];
    for &(r0, r1, c0, c1) in &rects {
        rows.extend([r0, r1]);
        cols.extend([c0, c1]);
    }
    rows.sort_unstable();
    rows.dedup();
    cols.sort_unstable();
    cols.dedup();
    for rw in rows.windows(2) {
        for cw in cols.windows(2) {
            let hit = rects
                .iter()
                .any(|&(r0, r1, c0, c1)| r0 <= rw[0] && rw[1] <= r1 && c0 <= cw[0] && cw[1] <= c1);
            if !hit {
                return false;
            }
        }
    }
    true
}

fn check_memory(plan: &Plan, hb: &HappensBefore) -> Result<()> {
    // Per owner rank, per buffer: the accesses (check_structure proved the
    // ranks and buffers exist).
    let mut by_buf: Vec<Vec<Vec<Access>>> = plan
        .ranks
        .iter()
        .map(|rp| vec![vec![]; rp.buffers.len()])
        .collect();
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            let task = TaskId { rank: r, index: i };
            for_each_access(r, &t.kind, |owner, view, write| {
                if let Some(list) = by_buf.get_mut(owner).and_then(|b| b.get_mut(view.buf)) {
                    list.push(Access { task, view, write });
                }
            });
        }
    }
    let lists = by_buf
        .iter()
        .enumerate()
        .flat_map(|(owner, bufs)| bufs.iter().enumerate().map(move |(buf, a)| (owner, buf, a)));
    for (owner, buf, acc) in lists {
        let b = &plan.ranks[owner].buffers[buf];
        let is_input = matches!(
            b.role,
            BufferRole::InputA | BufferRole::InputB | BufferRole::InputX
        );
        // Only accesses whose rows overlap can race or cover each other:
        // sweep them by first row instead of comparing every pair.
        let mut by_row: Vec<usize> = (0..acc.len()).collect();
        by_row.sort_by_key(|&i| acc[i].view.row);
        // Per read of non-input memory: the overlapping writes ordered before it.
        let mut covers: Vec<Vec<View>> = vec![vec![]; acc.len()];
        // Positions (in `by_row`) of the writes: a read is only paired with
        // writes, and an input read by every peer's copies has tens of
        // reads per row range to step over otherwise.
        let write_at: Vec<usize> = (0..by_row.len())
            .filter(|&k| acc[by_row[k]].write)
            .collect();
        for (at, &i) in by_row.iter().enumerate() {
            let x = &acc[i];
            let end = x.view.row + x.view.rows;
            let later: Box<dyn Iterator<Item = usize> + '_> = if x.write {
                Box::new(by_row[at + 1..].iter().copied())
            } else {
                let first = write_at.partition_point(|&k| k <= at);
                Box::new(write_at[first..].iter().map(|&k| by_row[k]))
            };
            for j in later {
                let y = &acc[j];
                if y.view.row >= end {
                    break;
                }
                if x.task == y.task || !(x.write || y.write) || !x.view.overlaps(&y.view) {
                    continue;
                }
                let xy = hb.before(x.task, y.task);
                let yx = !xy && hb.before(y.task, x.task);
                if !xy && !yx {
                    let (x, y) = if (x.task.rank, x.task.index) <= (y.task.rank, y.task.index) {
                        (x, y)
                    } else {
                        (y, x)
                    };
                    return Err(invalid(format!(
                        "race on rank {owner} buffer '{}': {} and {} touch the same rows unordered",
                        b.name,
                        name(plan, x.task),
                        name(plan, y.task)
                    )));
                }
                if !is_input {
                    if x.write && !y.write && xy {
                        covers[j].push(x.view);
                    } else if y.write && !x.write && yx {
                        covers[i].push(y.view);
                    }
                }
            }
        }
        for (i, x) in acc.iter().enumerate() {
            if !x.write && !is_input && !covered(&x.view, &covers[i]) {
                return Err(invalid(format!(
                    "{} reads rows {}..{} of rank {owner} buffer '{}' that no task writes before it",
                    name(plan, x.task),
                    x.view.row,
                    x.view.row + x.view.rows,
                    b.name
                )));
            }
        }
    }
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (id, b) in rp.buffers.iter().enumerate() {
            if b.role == BufferRole::Output {
                let writes: Vec<View> = by_buf[r][id]
                    .iter()
                    .filter(|x| x.write)
                    .map(|x| x.view)
                    .collect();
                if !covered(&View::whole(id, b.rows, b.cols), &writes) {
                    return Err(invalid(format!(
                        "rank {r}'s output '{}' is not fully written",
                        b.name
                    )));
                }
            }
        }
    }
    Ok(())
}

/// How the tasks of a plan use one buffer of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferUse {
    /// A task of another rank reads or writes it (a copy's far end): it must
    /// live in memory the other ranks can reach.
    pub remote: bool,
    /// Some task writes it.
    pub written: bool,
}

/// Per rank per buffer: how the plan's tasks use it ([`BufferUse`]).
pub fn buffer_use(plan: &Plan) -> Vec<Vec<BufferUse>> {
    let mut out: Vec<Vec<BufferUse>> = plan
        .ranks
        .iter()
        .map(|rp| vec![BufferUse::default(); rp.buffers.len()])
        .collect();
    for (r, rp) in plan.ranks.iter().enumerate() {
        for t in &rp.tasks {
            for (owner, view, write) in accesses(r, &t.kind) {
                if let Some(u) = out.get_mut(owner).and_then(|b| b.get_mut(view.buf)) {
                    u.remote |= owner != r;
                    u.written |= write;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod buffer_use_tests;
