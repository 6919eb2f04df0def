//! Tests of [`super::buffer_use`].

use super::*;
use crate::plan::lower::lower;
use crate::problem::workload::{Op, Problem};
use crate::space::Schedule;

fn uses(op: Op, schedule: &str) -> (Plan, Vec<Vec<BufferUse>>) {
    let p = Problem::new(op, 1024, 512, 256, 4).expect("problem");
    let s: Schedule = schedule.parse().expect("schedule");
    let plan = lower(&p, &s).expect("lower");
    let u = buffer_use(&plan);
    (plan, u)
}

/// Inputs are never written; B is never touched by another rank; a copy
/// schedule's peers reach some buffer of every rank, NCCL's none.
#[test]
fn inputs_are_read_only_and_only_copies_reach_across_ranks() {
    for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
        for s in [
            "seq",
            "shard-nccl-ring",
            "shard-copy-ring",
            "fine2-copy-all-acc",
            "tile-copy-ring",
        ] {
            if s.ends_with("-acc") && op == Op::AgGemm {
                continue;
            }
            let (plan, u) = uses(op, s);
            for (rp, ru) in plan.ranks.iter().zip(&u) {
                for (b, bu) in rp.buffers.iter().zip(ru) {
                    if matches!(b.role, BufferRole::InputA | BufferRole::InputB) {
                        assert!(!bu.written, "{op} {s}: input {} written", b.name);
                    }
                    if b.role == BufferRole::InputB {
                        assert!(!bu.remote, "{op} {s}: B reached by a peer");
                    }
                }
                let copies = s.contains("copy");
                assert_eq!(ru.iter().any(|x| x.remote), copies, "{op} {s}");
            }
        }
    }
}

/// The allocation-free walk gives exactly `accesses`, kind by kind.
#[test]
fn each_access_is_the_listed_access() {
    use crate::problem::routing::{MoeSpec, Skew};
    let mut plans = vec![];
    for op in Op::ALL {
        for s in [
            "seq",
            "shard-nccl-ring",
            "fine2-copy-all",
            "bulk-nccl-all",
            "tile-copy-ring",
        ] {
            let p = Problem::new(op, 1024, 512, 256, 4).expect("problem");
            if let Ok(plan) = lower(&p, &s.parse().expect("schedule")) {
                plans.push(plan);
            }
        }
    }
    let spec = MoeSpec::new(8, 2, Skew::HEAVY, 3);
    for op in Op::MOE {
        let p = Problem::moe(op, 256, 64, 32, 4, spec).expect("moe");
        plans.push(lower(&p, &"shard-nccl-all".parse().expect("schedule")).expect("lower"));
    }
    let mut kinds = std::collections::BTreeSet::new();
    for plan in &plans {
        for (r, rp) in plan.ranks.iter().enumerate() {
            for t in &rp.tasks {
                kinds.insert(t.kind.short().to_string());
                let mut got = vec![];
                for_each_access(r, &t.kind, |o, v, w| got.push((o, v, w)));
                assert_eq!(got, accesses(r, &t.kind), "{}", t.label);
            }
        }
    }
    assert!(kinds.len() >= 6, "{kinds:?}");
}
