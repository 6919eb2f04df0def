//! The residency rule of persistent kernels: a tile GEMM whose blocks wait
//! on flags ([`TaskKind::TileGemm`] with `wait`) spins *inside* the kernel,
//! one CTA per SM, and can hold every SM of its GPU while it waits. Work
//! that needs an SM of that GPU and must finish before one of those flags is
//! set can then never start: the run hangs. Measured on 4 H100s
//! (`bench/probe_sm_copy.py`, `bench/data/2026-11-26-h100x4-hang/`): a copy
//! within one GPU (`cuMemcpyAsync`, 2D or batched with the
//! prefer-overlap hint) and a memset run as kernels on SMs and wait for a
//! kernel that fills the GPU; a copy between two GPUs runs on copy engines
//! and does not. Before this rule, ag-gemm `tile` launched its GEMM before
//! the copy of its own shard into the gathered A, and on 4 H100s every such
//! run hung in its first iteration.
//!
//! [`check_spin_producers`] rejects a plan in which such a producer is not
//! ordered before the kernel's launch. Producers that need no SM of the
//! GPU pass: Signal and Wait tasks (stream memory operations), copies to or
//! from another rank's memory (copy engines), and tile GEMMs (persistent
//! kernels resident from their launch, each within its share of the SMs).
//! Work on other GPUs is left to their own kernels' rule. In loopback every
//! rank is on one GPU and every copy needs SMs, so the executor keeps SMs
//! free of tile GEMMs there instead.

use crate::error::{Error, Result};
use crate::plan::signal::flag_links;
use crate::plan::{Plan, TaskId, TaskKind};
use std::collections::{HashMap, HashSet};

/// Whether `task` of `rank` runs on SMs of `rank`'s GPU (a kernel, or a
/// copy whose two ends are both on that GPU), apart from tile GEMMs.
fn needs_sms(rank: usize, kind: &TaskKind) -> bool {
    match kind {
        TaskKind::Gemm { .. }
        | TaskKind::GroupedGemm { .. }
        | TaskKind::Nccl { .. }
        | TaskKind::Reduce { .. } => true,
        TaskKind::Copy { src, dst } => src.rank == rank && dst.rank == rank,
        TaskKind::Signal { .. } | TaskKind::Wait { .. } | TaskKind::TileGemm(_) => false,
    }
}

/// Rejects a plan where a tile GEMM that waits on flags could hold the SMs
/// that a producer of one of those flags needs (see the module doc).
pub fn check_spin_producers(plan: &Plan) -> Result<()> {
    let links = flag_links(plan)?;
    // Happens-before predecessors of each task: the previous task of its
    // stream, its dependencies, and for a Wait task the signaller of its
    // flag (a tile GEMM's own waits are not edges here: they are what is
    // being checked).
    let mut flag_pred: HashMap<TaskId, Vec<TaskId>> = HashMap::new();
    for l in &links {
        flag_pred.entry(l.wait).or_default().push(l.signal);
    }
    let preds = |id: TaskId| -> Vec<TaskId> {
        let Some(rp) = plan.ranks.get(id.rank) else {
            return vec![];
        };
        let Some(t) = rp.tasks.get(id.index) else {
            return vec![];
        };
        let mut ps: Vec<TaskId> = t.deps.clone();
        if let Some(prev) = (0..id.index)
            .rev()
            .find(|&j| rp.tasks[j].stream == t.stream)
        {
            ps.push(TaskId {
                rank: id.rank,
                index: prev,
            });
        }
        if matches!(t.kind, TaskKind::Wait { .. }) {
            ps.extend(flag_pred.get(&id).into_iter().flatten().copied());
        }
        ps
    };
    // Every task that finishes before `from` starts, walking back from the
    // given starts; the walk stops at tile GEMMs (see the module doc).
    let closure = |starts: Vec<TaskId>, stop: &HashSet<TaskId>| -> HashSet<TaskId> {
        let mut seen: HashSet<TaskId> = HashSet::new();
        let mut stack = starts;
        while let Some(v) = stack.pop() {
            if stop.contains(&v) || !seen.insert(v) {
                continue;
            }
            if plan
                .task(v)
                .is_some_and(|t| matches!(t.kind, TaskKind::TileGemm(_)))
            {
                continue;
            }
            stack.extend(preds(v));
        }
        seen
    };
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            let TaskKind::TileGemm(g) = &t.kind else {
                continue;
            };
            if g.wait.is_none() {
                continue;
            }
            let gemm = TaskId { rank: r, index: i };
            // What is done before the launch (the GEMM's own predecessors).
            let before_launch = closure(preds(gemm), &HashSet::new());
            for l in links.iter().filter(|l| l.wait == gemm) {
                let producers = closure(vec![l.signal], &before_launch);
                let starved = producers.into_iter().filter(|x| {
                    x.rank == r && plan.task(*x).is_some_and(|xt| needs_sms(x.rank, &xt.kind))
                });
                if let Some(x) = starved.min_by_key(|x| x.index) {
                    return Err(Error::InvalidPlan(format!(
                        "{} waits inside the kernel for flag {} of rank {r}, and {} \
                         must finish first but needs SMs of this GPU without being ordered before \
                         the launch: the persistent GEMM can hold every SM while it waits (a \
                         hang). Make that task a dependency of the tile GEMM",
                        task_name(plan, gemm),
                        l.flag,
                        task_name(plan, x)
                    )));
                }
            }
        }
    }
    Ok(())
}

fn task_name(plan: &Plan, id: TaskId) -> String {
    let label = plan.task(id).map(|t| t.label.as_str()).unwrap_or("?");
    format!("rank {} task {} '{}'", id.rank, id.index, label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::lower::lower;
    use crate::plan::RankView;
    use crate::problem::workload::{Op, Problem};
    use crate::space::{enumerate, SpaceOptions};

    /// Every tile schedule of the design space keeps the rule, at 2, 4 and 8
    /// GPUs and with chunked shards.
    #[test]
    fn every_tile_plan_orders_sm_producers_before_its_launch() {
        let mut checked = 0;
        for gpus in [2, 4, 8] {
            for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
                for m in [1024 * gpus, 4096 * gpus] {
                    let problem = Problem::new(op, m, 1024, 512, gpus).expect("problem");
                    let opts = SpaceOptions {
                        controls: true,
                        ..SpaceOptions::default()
                    };
                    for s in enumerate(op, opts) {
                        let Ok(plan) = lower(&problem, &s) else {
                            continue;
                        };
                        if !crate::plan::tile::has_tiles(&plan) {
                            continue;
                        }
                        check_spin_producers(&plan)
                            .unwrap_or_else(|e| panic!("{}: {e}", plan.name));
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 0, "no tile plan in the space");
    }

    /// The ag-gemm tile plan as it was lowered before the rule (the GEMM
    /// launched first, the own shard's copy after it) is rejected, naming
    /// the copy; the plan as lowered now passes.
    #[test]
    fn a_gemm_launched_before_its_local_copy_is_rejected() {
        let problem = Problem::new(Op::AgGemm, 4096, 1024, 512, 4).expect("problem");
        let s = enumerate(Op::AgGemm, SpaceOptions::default())
            .into_iter()
            .find(|s| s.name() == "tile-copy-all")
            .expect("tile-copy-all");
        let plan = lower(&problem, &s).expect("lowered");
        check_spin_producers(&plan).expect("today's lowering keeps the rule");
        let mut old = plan.clone();
        for rp in &mut old.ranks {
            let g = rp
                .tasks
                .iter()
                .position(|t| matches!(t.kind, TaskKind::TileGemm(_)))
                .expect("tile gemm");
            rp.tasks[g].deps.clear();
        }
        let err = check_spin_producers(&old)
            .expect_err("must be rejected")
            .to_string();
        assert!(
            err.contains("'own c0'") && err.contains("needs SMs"),
            "{err}"
        );
        assert!(crate::plan::validate::validate(&old).is_err());
        // A push to a peer runs on copy engines: not a starved producer.
        let push = old.ranks[0].tasks.iter().find(
            |t| matches!(&t.kind, TaskKind::Copy { dst: RankView { rank, .. }, .. } if *rank != 0),
        );
        assert!(push.is_some_and(|t| !needs_sms(0, &t.kind)));
    }
}
