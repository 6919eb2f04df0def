//! Tile GEMMs ([`TaskKind::TileGemm`]) as the validator and the interpreter
//! see them: [`expand`] rewrites each into one ordinary task chain per row
//! block, so the existing happens-before, memory and flag checks apply to
//! every block on its own.
//!
//! Block i of a tile GEMM becomes, on a stream of its own (the kernel's CTAs
//! take blocks independently: one block waiting for its rows does not hold
//! the others back):
//!
//! 1. `Wait { flag: wait + i }` when the GEMM waits, depending on what the
//!    whole task depended on (its stream predecessor and its `deps`);
//! 2. a [`TaskKind::Gemm`] of the block's rows (into its `dest` view, adding
//!    when `dest_add`);
//! 3. `Signal { to_rank: own rank, flag: signal + i }` when the GEMM signals
//!    and some task waits on that flag (a block's counter may go unwaited).
//!
//! The task after the tile GEMM on its stream, and every task that depended
//! on it, depends on the last task of every block chain instead. Nothing
//! else changes, so the expansion is exact: the expanded plan orders exactly
//! what the device orders, and no more.

use crate::plan::{Plan, StreamRole, StreamSpec, Task, TaskId, TaskKind};
use std::collections::HashSet;

/// Whether the plan has a tile GEMM.
pub fn has_tiles(plan: &Plan) -> bool {
    plan.ranks
        .iter()
        .flat_map(|r| &r.tasks)
        .any(|t| matches!(t.kind, TaskKind::TileGemm(_)))
}

/// The plan with every tile GEMM expanded into per-block tasks (see the
/// module doc); a plan without tile GEMMs comes back equal. Dependencies that
/// name a task which does not exist are kept as they are (the validator
/// reports them).
pub fn expand(plan: &Plan) -> Plan {
    if !has_tiles(plan) {
        return plan.clone();
    }
    let (waited, shapes) = shapes(plan);
    // First new index of every old task.
    let starts: Vec<Vec<usize>> = shapes
        .iter()
        .map(|ts| {
            let mut at = 0;
            ts.iter()
                .map(|(n, _)| {
                    let s = at;
                    at += n;
                    s
                })
                .collect()
        })
        .collect();
    let done = |d: &TaskId| -> Vec<TaskId> {
        match (shapes.get(d.rank), starts.get(d.rank)) {
            (Some(ts), Some(st)) if d.index < ts.len() => ts[d.index]
                .1
                .iter()
                .map(|&o| TaskId {
                    rank: d.rank,
                    index: st[d.index] + o,
                })
                .collect(),
            _ => vec![*d],
        }
    };
    let mut out = plan.clone();
    for (r, rp) in plan.ranks.iter().enumerate() {
        let mut streams = rp.streams.clone();
        let mut tasks: Vec<Task> = Vec::with_capacity(starts[r].last().map_or(0, |s| s + 4));
        // Per original stream: the old index of its last task so far.
        let mut last_on: Vec<Option<usize>> = vec![None; rp.streams.len()];
        for (i, t) in rp.tasks.iter().enumerate() {
            let mut deps: Vec<TaskId> = t.deps.iter().flat_map(&done).collect();
            // A tile GEMM's blocks end on streams of their own: the next
            // task of its stream follows all of them.
            let pred = last_on.get(t.stream).copied().flatten();
            if let Some(j) = pred {
                if matches!(rp.tasks[j].kind, TaskKind::TileGemm(_)) {
                    deps.extend(done(&TaskId { rank: r, index: j }));
                }
            }
            if let Some(slot) = last_on.get_mut(t.stream) {
                *slot = Some(i);
            }
            let TaskKind::TileGemm(g) = &t.kind else {
                tasks.push(Task { deps, ..t.clone() });
                continue;
            };
            // Blocks start after the task's stream predecessor, like the task.
            if let Some(j) = pred {
                deps.extend(done(&TaskId { rank: r, index: j }));
            }
            deps.sort();
            deps.dedup();
            let (name, priority) = rp
                .streams
                .get(t.stream)
                .map_or(("?".to_string(), Default::default()), |s| {
                    (s.name.clone(), s.priority)
                });
            for b in g.order() {
                let stream = streams.len();
                streams.push(StreamSpec {
                    name: format!("{name}.block{b}"),
                    role: StreamRole::Compute,
                    priority,
                });
                let mut first = Some(deps.clone());
                let mut take = || first.take().unwrap_or_default();
                if let Some(w) = g.wait {
                    tasks.push(Task {
                        label: format!("wait f{} > {} b{b}", w + b, t.label),
                        stream,
                        kind: TaskKind::Wait { flag: w + b },
                        deps: take(),
                    });
                }
                let (row, rows) = g.block_span(b);
                let (c, accumulate) = g.block_out(b);
                tasks.push(Task {
                    label: format!("{} b{b}", t.label),
                    stream,
                    kind: TaskKind::Gemm {
                        a: g.a.rows(row, rows),
                        b: g.b,
                        c,
                        sm_target: g.sm_target,
                        accumulate,
                        occupancy: None,
                    },
                    deps: take(),
                });
                if let Some(s) = g.signal.filter(|s| waited.contains(&(r, s + b))) {
                    tasks.push(Task {
                        label: format!("signal r{r}.f{} < {} b{b}", s + b, t.label),
                        stream,
                        kind: TaskKind::Signal {
                            to_rank: r,
                            flag: s + b,
                        },
                        deps: vec![],
                    });
                }
            }
        }
        out.ranks[r].streams = streams;
        out.ranks[r].tasks = tasks;
    }
    out
}

/// Per rank, per expanded task (in [`expand`]'s order): the index of the
/// original task it comes from (a tile GEMM's block tasks all map to it).
/// Executors that issue the original plan but order it by the expanded one
/// (a tile GEMM's blocks wait and signal independently) read it.
pub fn expand_origins(plan: &Plan) -> Vec<Vec<usize>> {
    let (_, shapes) = shapes(plan);
    shapes
        .iter()
        .map(|ts| {
            ts.iter()
                .enumerate()
                .flat_map(|(i, (n, _))| std::iter::repeat_n(i, *n))
                .collect()
        })
        .collect()
}

/// Flags (rank, flag) that something waits on, and per rank per task the
/// number of tasks [`expand`] makes of it and which of them (offsets) mark
/// it done.
#[allow(clippy::type_complexity)]
fn shapes(plan: &Plan) -> (HashSet<(usize, usize)>, Vec<Vec<(usize, Vec<usize>)>>) {
    // (rank, flag) pairs something waits on: a Wait task or a tile GEMM block.
    let mut waited: HashSet<(usize, usize)> = HashSet::new();
    for (r, rp) in plan.ranks.iter().enumerate() {
        for t in &rp.tasks {
            match &t.kind {
                TaskKind::Wait { flag } => {
                    waited.insert((r, *flag));
                }
                TaskKind::TileGemm(g) => {
                    if let Some(w) = g.wait {
                        waited.extend((0..g.blocks()).map(|b| (r, w + b)));
                    }
                }
                _ => {}
            }
        }
    }
    let shapes: Vec<Vec<(usize, Vec<usize>)>> = plan
        .ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            rp.tasks
                .iter()
                .map(|t| match &t.kind {
                    TaskKind::TileGemm(g) => {
                        let mut n = 0;
                        let mut ends = vec![];
                        for b in g.order() {
                            n += usize::from(g.wait.is_some()) + 1;
                            if g.signal.is_some_and(|s| waited.contains(&(r, s + b))) {
                                n += 1;
                            }
                            ends.push(n - 1);
                        }
                        (n, ends)
                    }
                    _ => (1, vec![0]),
                })
                .collect()
        })
        .collect();
    (waited, shapes)
}
