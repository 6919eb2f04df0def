//! Device-side signalling: cross-rank dependencies as flags.
//!
//! A lowered plan orders ranks with plain dependencies: task T on rank c
//! lists task D of rank p ≠ c in its `deps`. An executor that honours those
//! with host threads must take part in every such edge. [`with_signals`]
//! makes them explicit in the plan instead, as the GPU executor runs them:
//!
//! * after D, on D's stream (rank p), a [`TaskKind::Signal`] `{ to_rank: c,
//!   flag: F }`: the producer's stream writes signal word F of rank c once D
//!   (and everything before it on that stream) is done;
//! * before T, on T's stream (rank c), a [`TaskKind::Wait`] `{ flag: F }`: the
//!   consumer's stream holds until word F of its own rank is signalled;
//! * T drops D from its `deps`: it follows the Wait by stream order.
//!
//! Flags live on the waiter's rank and are numbered per rank from 0. There is
//! one flag per (producer task, consumer rank): several consumers of D on
//! rank c share it, and one Wait per (stream, flag) suffices, placed before
//! the first consumer on that stream (later ones follow it by stream order).
//! Dependencies within a rank are left as they are (the executor keeps them
//! as events). Within one run of a plan each flag is signalled exactly once;
//! turning that into epochs that grow per iteration is the executor's
//! business.
//!
//! Happens-before through flags: a Signal finishes before every Wait on the
//! same (rank, flag) ends ([`flag_edges`], which [`crate::plan::graph::Graph`]
//! adds to every task's predecessors). On the original tasks the rewritten
//! plan has exactly the original happens-before relation (D → Signal → Wait →
//! T, and the inserted tasks only sit between tasks already ordered), so it is
//! valid and computes the same result whenever the original does. A Wait does
//! not block the host, so a plan with signals has no cross-rank host edges in
//! issue order at all.

use crate::error::{Error, Result};
use crate::plan::{Plan, Task, TaskId, TaskKind};
use std::collections::{BTreeMap, HashMap};

fn name(plan: &Plan, id: TaskId) -> String {
    let label = plan.task(id).map(|t| t.label.as_str()).unwrap_or("?");
    format!("rank {} task {} '{}'", id.rank, id.index, label)
}

/// One happens-before edge through a flag: `signal` (a Signal task, or
/// block `signal_block` of a tile GEMM) sets flag `flag` of rank `rank`, and
/// `wait` (a Wait task, or block `wait_block` of a tile GEMM) holds until it
/// is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagLink {
    pub rank: usize,
    pub flag: usize,
    pub signal: TaskId,
    pub signal_block: Option<usize>,
    pub wait: TaskId,
    pub wait_block: Option<usize>,
}

/// Every flag edge of the plan, in plan order of the waiters (see
/// [`flag_edges`] for the errors).
pub fn flag_links(plan: &Plan) -> Result<Vec<FlagLink>> {
    // (rank, flag) -> (signaller, its block when a tile GEMM signals it).
    let mut signals: HashMap<(usize, usize), (TaskId, Option<usize>)> = HashMap::new();
    let mut set = |key: (usize, usize), id: TaskId, block: Option<usize>| -> Result<()> {
        if let Some((first, _)) = signals.insert(key, (id, block)) {
            return Err(Error::InvalidPlan(format!(
                "flag {} of rank {} is signalled twice, by {} and by {}: a flag is signalled at most once per plan",
                key.1,
                key.0,
                name(plan, first),
                name(plan, id)
            )));
        }
        Ok(())
    };
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            let id = TaskId { rank: r, index: i };
            match &t.kind {
                TaskKind::Signal { to_rank, flag } => {
                    if *to_rank >= plan.ranks.len() {
                        return Err(Error::InvalidPlan(format!(
                            "{}: signals rank {to_rank}, which does not exist ({} ranks)",
                            name(plan, id),
                            plan.ranks.len()
                        )));
                    }
                    set((*to_rank, *flag), id, None)?;
                }
                TaskKind::TileGemm(g) => {
                    if let Some(s) = g.signal {
                        for b in 0..g.blocks() {
                            set((r, s + b), id, Some(b))?;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut links = vec![];
    let mut waited = std::collections::HashSet::new();
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            let id = TaskId { rank: r, index: i };
            let waits: Vec<(usize, Option<usize>)> = match &t.kind {
                TaskKind::Wait { flag } => vec![(*flag, None)],
                TaskKind::TileGemm(g) => match g.wait {
                    Some(w) => (0..g.blocks()).map(|b| (w + b, Some(b))).collect(),
                    None => vec![],
                },
                _ => continue,
            };
            for (flag, wait_block) in waits {
                let Some(&(sig, signal_block)) = signals.get(&(r, flag)) else {
                    return Err(Error::InvalidPlan(format!(
                        "wait on flag {flag} of rank {r} is never signalled: {} would hang",
                        name(plan, id)
                    )));
                };
                waited.insert((r, flag));
                links.push(FlagLink {
                    rank: r,
                    flag,
                    signal: sig,
                    signal_block,
                    wait: id,
                    wait_block,
                });
            }
        }
    }
    // A tile GEMM's block flag may go unwaited (nothing drains that block);
    // a Signal task's may not.
    if let Some((&(rank, flag), &(sig, _))) = signals
        .iter()
        .filter(|(k, (_, block))| block.is_none() && !waited.contains(*k))
        .min_by_key(|(_, (id, _))| *id)
    {
        return Err(Error::InvalidPlan(format!(
            "{} signals flag {flag} of rank {rank}, which no task waits on",
            name(plan, sig)
        )));
    }
    Ok(links)
}

/// Happens-before edges through flags, as (signaller, waiter) pairs in plan
/// order of the waits: the Signal of (rank, flag) precedes every Wait on flag
/// of that rank. A tile GEMM appears as a whole (as the waiter of its
/// blocks' flags and the signaller of its blocks' counters): per-block
/// edges are in [`flag_links`].
///
/// Errors (an invalid plan) when a Signal names a rank that does not exist,
/// when a flag is signalled more than once, when a Wait's flag is never
/// signalled ("wait on flag F of rank r is never signalled", the static form
/// of a run that would hang), or when a flag signalled by a Signal task is
/// never waited on.
pub fn flag_edges(plan: &Plan) -> Result<Vec<(TaskId, TaskId)>> {
    let mut edges: Vec<(TaskId, TaskId)> = flag_links(plan)?
        .into_iter()
        .map(|l| (l.signal, l.wait))
        .collect();
    edges.dedup();
    Ok(edges)
}

/// Number of distinct (producer task, consumer rank) pairs over the plan's
/// cross-rank dependencies: the Signal tasks [`with_signals`] adds.
pub fn cross_rank_edges(plan: &Plan) -> usize {
    let mut pairs = std::collections::HashSet::new();
    for (c, rp) in plan.ranks.iter().enumerate() {
        for t in &rp.tasks {
            for d in t.deps.iter().filter(|d| d.rank != c) {
                pairs.insert((*d, c));
            }
        }
    }
    pairs.len()
}

/// The plan with every cross-rank dependency made a Signal/Wait pair through
/// a flag on the consumer's rank (see the module doc). Same-rank dependencies,
/// buffers, streams, resources and names are unchanged; flags already in the
/// plan keep their numbers and new ones follow them. A plan without
/// cross-rank dependencies comes back equal.
pub fn with_signals(plan: &Plan) -> Plan {
    let p = plan.ranks.len();
    let mut next_flag = plan.signal_words();
    // (producer, consumer rank) -> flag, numbered per consumer rank in plan order.
    let mut flags: HashMap<(TaskId, usize), usize> = HashMap::new();
    // Per consumer rank and task index: flags to wait on just before it.
    let mut waits_before: Vec<BTreeMap<usize, Vec<usize>>> = vec![BTreeMap::new(); p];
    // Per producer rank and task index: (consumer rank, flag) to signal after it.
    let mut signals_after: Vec<BTreeMap<usize, Vec<(usize, usize)>>> = vec![BTreeMap::new(); p];
    for (c, rp) in plan.ranks.iter().enumerate() {
        // (stream, flag) already waited on by an earlier task of the stream.
        let mut waited = std::collections::HashSet::new();
        for (i, t) in rp.tasks.iter().enumerate() {
            for d in t.deps.iter().filter(|d| d.rank != c) {
                let flag = *flags.entry((*d, c)).or_insert_with(|| {
                    let f = next_flag[c];
                    next_flag[c] += 1;
                    signals_after[d.rank]
                        .entry(d.index)
                        .or_default()
                        .push((c, f));
                    f
                });
                if waited.insert((t.stream, flag)) {
                    waits_before[c].entry(i).or_default().push(flag);
                }
            }
        }
    }
    let ranks = plan
        .ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            // New index of every old task of this rank.
            let mut at = Vec::with_capacity(rp.tasks.len());
            let mut n = 0;
            for i in 0..rp.tasks.len() {
                n += waits_before[r].get(&i).map_or(0, Vec::len);
                at.push(n);
                n += 1 + signals_after[r].get(&i).map_or(0, Vec::len);
            }
            let mut tasks = Vec::with_capacity(n);
            for (i, t) in rp.tasks.iter().enumerate() {
                for &flag in waits_before[r].get(&i).into_iter().flatten() {
                    tasks.push(Task {
                        label: format!("wait f{flag} > {}", t.label),
                        stream: t.stream,
                        kind: TaskKind::Wait { flag },
                        deps: vec![],
                    });
                }
                let deps = t
                    .deps
                    .iter()
                    .filter(|d| d.rank == r)
                    .map(|d| TaskId {
                        rank: r,
                        index: at[d.index],
                    })
                    .collect();
                tasks.push(Task { deps, ..t.clone() });
                for &(to_rank, flag) in signals_after[r].get(&i).into_iter().flatten() {
                    tasks.push(Task {
                        label: format!("signal r{to_rank}.f{flag} < {}", t.label),
                        stream: t.stream,
                        kind: TaskKind::Signal { to_rank, flag },
                        deps: vec![],
                    });
                }
            }
            crate::plan::RankPlan {
                tasks,
                ..rp.clone()
            }
        })
        .collect();
    Plan {
        ranks,
        ..plan.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::lower::lower;
    use crate::plan::validate::validate;
    use crate::problem::workload::{Op, Problem};

    fn plan(op: Op, name: &str, gpus: usize) -> Plan {
        let problem = Problem::new(op, 8 * gpus, 3, 2, gpus).unwrap();
        lower(&problem, &name.parse().unwrap()).unwrap()
    }

    #[test]
    fn signals_replace_every_cross_rank_dependency() {
        let p = plan(Op::GemmRs, "fine2-copy-ring", 4);
        let s = with_signals(&p);
        validate(&s).unwrap();
        for (r, rp) in s.ranks.iter().enumerate() {
            for t in &rp.tasks {
                assert!(t.deps.iter().all(|d| d.rank == r), "{}", t.label);
            }
        }
        let count = |k: &str| {
            s.ranks
                .iter()
                .flat_map(|r| &r.tasks)
                .filter(|t| t.kind.short() == k)
                .count()
        };
        assert_eq!(count("signal"), cross_rank_edges(&p));
        assert!(count("wait") >= count("signal"));
        assert_eq!(
            s.task_count(),
            p.task_count() + count("signal") + count("wait")
        );
        let words: usize = s.signal_words().iter().sum();
        assert_eq!(words, cross_rank_edges(&p));
    }

    #[test]
    fn a_plan_without_cross_rank_dependencies_is_unchanged() {
        let p = plan(Op::GemmAr, "fine2-nccl-ring", 2);
        assert_eq!(cross_rank_edges(&p), 0);
        assert_eq!(with_signals(&p), p);
        assert_eq!(p.signal_words(), vec![0, 0]);
    }

    #[test]
    fn with_signals_is_idempotent() {
        let s = with_signals(&plan(Op::AgGemm, "fine2-copy-all", 4));
        assert_eq!(with_signals(&s), s);
    }
}
