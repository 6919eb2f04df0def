//! The dependency graph of a plan, derived once: every task is a node
//! (numbered rank by rank, in issue order), and its predecessors are its
//! stream predecessor (tasks on one stream run in order), its explicit
//! dependencies, which may cross ranks, and for a [`TaskKind::Wait`] the
//! [`TaskKind::Signal`] of its flag ([`crate::plan::signal::flag_edges`]).
//! The validator, the simulator and the GPU executor all read ordering from
//! here.
//!
//! [`TaskKind::Wait`]: crate::plan::TaskKind::Wait
//! [`TaskKind::Signal`]: crate::plan::TaskKind::Signal

use crate::error::{Error, Result};
use crate::plan::{Plan, TaskId};
use std::collections::HashMap;

/// Node numbering and predecessor lists of one plan.
#[derive(Debug, Clone)]
pub struct Graph {
    offsets: Vec<usize>,
    total: usize,
    /// Per node: the previous task on the same stream of the same rank.
    stream_pred: Vec<Option<usize>>,
    /// Per node: explicit dependencies, as nodes (sorted, deduplicated).
    deps: Vec<Vec<usize>>,
    /// Per node: for a Wait, the Signal of its flag; for a tile GEMM, the
    /// signallers of its blocks' flags (sorted, deduplicated).
    flag_pred: Vec<Vec<usize>>,
}

impl Graph {
    /// Builds the graph; a dependency on a task that does not exist is an
    /// invalid plan, and so are flags that [`crate::plan::signal::flag_edges`]
    /// rejects (a wait never signalled, a flag signalled twice, ...).
    pub fn new(plan: &Plan) -> Result<Self> {
        let mut offsets = Vec::with_capacity(plan.ranks.len());
        let mut total = 0;
        for rp in &plan.ranks {
            offsets.push(total);
            total += rp.tasks.len();
        }
        let mut stream_pred = vec![None; total];
        let mut deps = vec![vec![]; total];
        for (rank, rp) in plan.ranks.iter().enumerate() {
            let mut last: HashMap<usize, usize> = HashMap::new();
            for (index, task) in rp.tasks.iter().enumerate() {
                let me = offsets[rank] + index;
                stream_pred[me] = last.insert(task.stream, me);
                let mut ds = Vec::with_capacity(task.deps.len());
                for d in &task.deps {
                    let exists = plan
                        .ranks
                        .get(d.rank)
                        .is_some_and(|r| d.index < r.tasks.len());
                    if !exists {
                        return Err(Error::InvalidPlan(format!(
                            "task '{}' (rank {rank}, index {index}) depends on rank {} task {}, which does not exist",
                            task.label, d.rank, d.index
                        )));
                    }
                    ds.push(offsets[d.rank] + d.index);
                }
                ds.sort_unstable();
                ds.dedup();
                deps[me] = ds;
            }
        }
        let mut flag_pred = vec![vec![]; total];
        for (sig, wait) in crate::plan::signal::flag_edges(plan)? {
            flag_pred[offsets[wait.rank] + wait.index].push(offsets[sig.rank] + sig.index);
        }
        for ps in &mut flag_pred {
            ps.sort_unstable();
            ps.dedup();
        }
        Ok(Graph {
            offsets,
            total,
            stream_pred,
            deps,
            flag_pred,
        })
    }

    /// Number of task nodes.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the plan has no task.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The node of a task.
    pub fn node(&self, id: TaskId) -> usize {
        self.offsets[id.rank] + id.index
    }

    /// The task of a node.
    pub fn id(&self, node: usize) -> TaskId {
        // The last rank whose first node is at or before `node` (ranks
        // without tasks share an offset with the next one).
        let rank = self
            .offsets
            .partition_point(|&o| o <= node)
            .saturating_sub(1);
        TaskId {
            rank,
            index: node - self.offsets[rank],
        }
    }

    /// The previous task on the same stream, if any.
    pub fn stream_pred(&self, node: usize) -> Option<usize> {
        self.stream_pred[node]
    }

    /// Explicit dependencies of a node (sorted, no duplicates).
    pub fn deps(&self, node: usize) -> &[usize] {
        &self.deps[node]
    }

    /// For a Wait, the Signal of its flag; for a tile GEMM, the signallers of
    /// its blocks' flags (happens-before edges that the device keeps, not the
    /// host: issue order ignores them).
    pub fn flag_preds(&self, node: usize) -> &[usize] {
        &self.flag_pred[node]
    }

    /// Every predecessor: the stream predecessor, the explicit dependencies
    /// and the flag's Signal (sorted, no duplicates).
    pub fn preds(&self, node: usize) -> Vec<usize> {
        let mut ps = Vec::new();
        self.preds_into(node, &mut ps);
        ps
    }

    /// [`Graph::preds`] into `out` (cleared first), reusing its memory.
    pub fn preds_into(&self, node: usize, out: &mut Vec<usize>) {
        out.clear();
        out.extend(self.stream_pred[node]);
        out.extend_from_slice(&self.deps[node]);
        out.extend_from_slice(&self.flag_pred[node]);
        out.sort_unstable();
        out.dedup();
    }

    /// Per task, whether its completion must be signalled to another stream
    /// or rank: it is an explicit dependency of a task on another stream or
    /// another rank. Dependencies on the same stream are kept by stream order
    /// and need no event or flag.
    pub fn cross_stream_points(&self, plan: &Plan) -> Vec<Vec<bool>> {
        let mut out: Vec<Vec<bool>> = plan
            .ranks
            .iter()
            .map(|r| vec![false; r.tasks.len()])
            .collect();
        for v in 0..self.total {
            let me = self.id(v);
            let stream = plan.ranks[me.rank].tasks[me.index].stream;
            for &u in &self.deps[v] {
                let d = self.id(u);
                let same = d.rank == me.rank && plan.ranks[d.rank].tasks[d.index].stream == stream;
                if !same {
                    out[d.rank][d.index] = true;
                }
            }
        }
        out
    }
}

/// Adjacency lists of `n` nodes in one array: node v's are
/// `flat[start[v]..start[v + 1]]` (one allocation, not one per node: plans
/// at large GPU counts have tens of thousands of tasks).
#[derive(Debug, Clone, Default)]
pub struct Csr {
    start: Vec<usize>,
    flat: Vec<usize>,
}

impl Csr {
    /// An empty list of no node; [`Csr::push_node`] adds nodes in order.
    pub fn with_capacity(nodes: usize, edges: usize) -> Self {
        let mut start = Vec::with_capacity(nodes + 1);
        start.push(0);
        Csr {
            start,
            flat: Vec::with_capacity(edges),
        }
    }

    /// Appends the next node with the list `list`.
    pub fn push_node(&mut self, list: impl IntoIterator<Item = usize>) {
        self.flat.extend(list);
        self.start.push(self.flat.len());
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    /// Whether there is no node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Node `v`'s list.
    pub fn of(&self, v: usize) -> &[usize] {
        &self.flat[self.start[v]..self.start[v + 1]]
    }
}

/// A topological order of `n` nodes given each node's predecessors, or
/// `Err(node)` with a node on a cycle (or behind one).
pub fn topo(n: usize, preds: &[Vec<usize>]) -> std::result::Result<Vec<usize>, usize> {
    let mut csr = Csr::with_capacity(n, preds.iter().map(Vec::len).sum());
    for ps in preds.iter().take(n) {
        csr.push_node(ps.iter().copied());
    }
    while csr.len() < n {
        csr.push_node([]);
    }
    topo_csr(&csr)
}

/// [`topo`] of the nodes of `preds`.
pub fn topo_csr(preds: &Csr) -> std::result::Result<Vec<usize>, usize> {
    let n = preds.len();
    let mut indeg = vec![0usize; n];
    // Successor lists (CSR): node u's are succs[start[u]..start[u + 1]], in
    // increasing order.
    let mut start = vec![0usize; n + 1];
    for (v, d) in indeg.iter_mut().enumerate() {
        let ps = preds.of(v);
        *d = ps.len();
        for &u in ps {
            start[u + 1] += 1;
        }
    }
    for u in 0..n {
        start[u + 1] += start[u];
    }
    let mut fill = start.clone();
    let mut succs = vec![0usize; start[n]];
    for v in 0..n {
        for &u in preds.of(v) {
            succs[fill[u]] = v;
            fill[u] += 1;
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&v| indeg[v] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(v) = ready.pop() {
        order.push(v);
        for &w in &succs[start[v]..start[v + 1]] {
            indeg[w] -= 1;
            if indeg[w] == 0 {
                ready.push(w);
            }
        }
    }
    if order.len() == n {
        Ok(order)
    } else {
        Err((0..n).find(|&v| indeg[v] > 0).unwrap_or(0))
    }
}
