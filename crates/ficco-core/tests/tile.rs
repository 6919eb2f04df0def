//! The `tile` granularity: every `tile` schedule of every operator is a
//! valid plan whose exact interpretation equals the sequential reference, at
//! P = 2, 4 and 8 and for 1, 2, 4 and 8 chunks per shard; a plan that lets a
//! GEMM block read rows before their flag, or pushes a block before its
//! counter, is caught by the validator and by the interpreter.

use ficco_core::plan::interp::{interpret, reference, Inputs};
use ficco_core::plan::lower::{lower, tile_chunks, TILE_BLOCK_ROWS};
use ficco_core::plan::signal::with_signals;
use ficco_core::plan::tile::{expand, expand_origins};
use ficco_core::plan::validate::validate;
use ficco_core::plan::{Plan, TaskKind};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::simulate;
use ficco_core::space::{enumerate, Granularity, Schedule, SpaceOptions};
use proptest::prelude::*;

fn tiles(op: Op) -> Vec<Schedule> {
    let opts = SpaceOptions {
        controls: true,
        sm_count: 132,
        nccl_sms: 16,
    };
    enumerate(op, opts)
        .into_iter()
        .filter(|s| s.granularity == Granularity::Tile)
        .collect()
}

/// Every `tile` schedule of `problem`: valid, exact, unchanged by
/// `with_signals` (no cross-rank dependency is left to rewrite), and
/// simulated. Returns how many ran.
fn check_all(problem: &Problem, seed: u64) -> Result<usize, TestCaseError> {
    let inputs = Inputs::random(problem, seed);
    let want = reference(problem, &inputs);
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let mut ran = 0;
    for s in tiles(problem.op) {
        let what = format!("{} {s}", problem.label());
        if let Some(why) = s.misfit(problem) {
            prop_assert!(s.fused_reduce && problem.gpus != 2, "{what}: {why}");
            continue;
        }
        let plan = lower(problem, &s).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        validate(&plan).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        let got =
            interpret(&plan, &inputs).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        prop_assert_eq!(&got, &want, "{}", what);
        prop_assert_eq!(&with_signals(&plan), &plan, "{}", what);
        let t = simulate(&plan, &hw).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        prop_assert!(t.total_ms > 0.0 && t.total_ms.is_finite(), "{}", what);
        ran += 1;
    }
    Ok(ran)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn every_tile_schedule_matches_the_reference(
        op in prop::sample::select(Op::ALL.to_vec()),
        gpus in prop::sample::select(vec![2usize, 4, 8]),
        blocks_per_shard in prop::sample::select(vec![1usize, 2, 4, 8, 12, 16]),
        k in 1usize..=4,
        n in 1usize..=4,
        seed in any::<u64>(),
    ) {
        let problem =
            Problem::new(op, gpus * blocks_per_shard * TILE_BLOCK_ROWS, k, n, gpus).unwrap();
        prop_assert!(check_all(&problem, seed)? >= 2);
    }
}

/// Named cases: P = 2, 4, 8 and 1, 2, 4, 8 chunks per shard, every operator.
#[test]
fn every_tile_schedule_is_exact_at_2_4_and_8_gpus() {
    for gpus in [2, 4, 8] {
        for (blocks, chunks) in [(1, 1), (8, 2), (16, 4), (32, 8)] {
            for op in Op::ALL {
                let problem =
                    Problem::new(op, gpus * blocks * TILE_BLOCK_ROWS, 3, 2, gpus).expect("problem");
                assert_eq!(tile_chunks(&problem), chunks, "{}", problem.label());
                let ran = check_all(&problem, 7).unwrap();
                // ring and all, each also with -hi; gemm-rs/ar on 2 GPUs also -acc.
                let want = match op {
                    Op::AgGemm => 4,
                    _ if gpus == 2 => 8,
                    _ => 4,
                };
                assert_eq!(ran, want, "{}", problem.label());
            }
        }
    }
}

#[test]
fn names_and_fit() {
    for op in Op::ALL {
        let names: Vec<String> = tiles(op).iter().map(|s| s.name()).collect();
        assert!(names.contains(&"tile-copy-ring".to_string()), "{op}");
        assert!(names.contains(&"tile-copy-all-hi".to_string()), "{op}");
        assert!(names
            .iter()
            .all(|n| !n.contains("nccl") && !n.contains("-2s")));
        assert_eq!(
            names.iter().any(|n| n.contains("-acc")),
            op != Op::AgGemm,
            "{op}"
        );
    }
    let s: Schedule = "tile-copy-ring-acc".parse().unwrap();
    assert_eq!(s.name(), "tile-copy-ring-acc");
    assert!(s.describe(2).contains("one persistent GEMM"));
    for bad in ["tile-nccl-ring", "tile-copy-ring-2s", "tile-copy-ring-occ1"] {
        let s: Schedule = bad.parse().unwrap();
        assert!(!s.applies_to(Op::GemmRs), "{bad}");
    }
    let p = Problem::new(Op::GemmRs, 4 * 192, 8, 8, 4).unwrap();
    let why = "tile-copy-ring"
        .parse::<Schedule>()
        .unwrap()
        .misfit(&p)
        .unwrap();
    assert!(why.contains("128-row"), "{why}");
    let p = Problem::new(Op::GemmRs, 4 * 128, 8, 8, 4).unwrap();
    let why = s.misfit(&p).unwrap();
    assert!(why.contains("2 GPUs"), "{why}");
}

fn plan(op: Op, name: &str, gpus: usize, blocks: usize) -> (Problem, Plan) {
    let problem = Problem::new(op, gpus * blocks * TILE_BLOCK_ROWS, 3, 2, gpus).unwrap();
    let plan = lower(&problem, &name.parse().unwrap()).unwrap();
    (problem, plan)
}

fn find(plan: &Plan, rank: usize, pred: impl Fn(&str, &TaskKind) -> bool) -> usize {
    plan.ranks[rank]
        .tasks
        .iter()
        .position(|t| pred(&t.label, &t.kind))
        .expect("task")
}

/// ag-gemm: the Signal of a pushed chunk moved before its copy lets the
/// receiver's GEMM block read the rows before they arrive.
#[test]
fn a_block_reading_before_its_flag_is_caught() {
    let (problem, mut p) = plan(Op::AgGemm, "tile-copy-ring", 4, 8);
    // Rank 3 pushes its chunk 1 to rank 1, whose block 7 reads it.
    let copy = find(&p, 3, |l, _| l == "push r1.c1");
    assert!(matches!(
        p.ranks[3].tasks[copy + 1].kind,
        TaskKind::Signal { to_rank: 1, .. }
    ));
    p.ranks[3].tasks.swap(copy, copy + 1);
    let err = validate(&p).unwrap_err().to_string();
    assert!(
        err.contains("race") && err.contains("push r1.c1") && err.contains("tile-gemm b7"),
        "{err}"
    );
    let inputs = Inputs::random(&problem, 1);
    let err = interpret(&p, &inputs).unwrap_err().to_string();
    assert!(err.contains("read before arrival"), "{err}");
    assert!(err.contains("tile-gemm b7"), "{err}");
}

/// ag-gemm: a block that waits on the wrong flag (two chunks' flags swapped)
/// reads rows that are not covered by its flag.
#[test]
fn a_block_waiting_on_the_wrong_flag_is_caught() {
    let (problem, mut p) = plan(Op::AgGemm, "tile-copy-all", 2, 8);
    for rp in &mut p.ranks {
        for t in &mut rp.tasks {
            if let TaskKind::Signal { flag, .. } = &mut t.kind {
                // Blocks 2 and 3 (the peer's chunks 0 and 1 on rank 0, the own ones on rank 1).
                if *flag == 2 {
                    *flag = 3;
                } else if *flag == 3 {
                    *flag = 2;
                }
            }
        }
    }
    assert!(validate(&p).is_err());
    let err = interpret(&p, &Inputs::random(&problem, 2))
        .unwrap_err()
        .to_string();
    assert!(err.contains("read before arrival"), "{err}");
}

/// A missing flag write: the validator names the wait that would hang.
#[test]
fn a_missing_flag_write_is_caught() {
    for (op, name) in [
        (Op::AgGemm, "tile-copy-ring"),
        (Op::GemmRs, "tile-copy-ring"),
        (Op::GemmRs, "tile-copy-ring-acc"),
        (Op::GemmAr, "tile-copy-all"),
    ] {
        let (problem, mut p) = plan(op, name, 2, 8);
        let i = find(&p, 1, |_, k| matches!(k, TaskKind::Signal { .. }));
        // Removed as a task is: later indices shift down and dependencies
        // on it go (else a shifted dependency, not the flag, is what fails).
        p.ranks[1].tasks.remove(i);
        for rp in &mut p.ranks {
            for t in &mut rp.tasks {
                t.deps.retain(|d| !(d.rank == 1 && d.index == i));
                for d in &mut t.deps {
                    if d.rank == 1 && d.index > i {
                        d.index -= 1;
                    }
                }
            }
        }
        let err = validate(&p).unwrap_err().to_string();
        assert!(err.contains("never signalled"), "{name}: {err}");
        assert!(
            interpret(&p, &Inputs::random(&problem, 3)).is_err(),
            "{name}"
        );
    }
}

/// gemm-rs: a push that does not wait for its block's counter reads the
/// partial before the GEMM stored it.
#[test]
fn a_push_before_its_counter_is_caught() {
    for name in ["tile-copy-ring", "tile-copy-ring-acc"] {
        let (problem, mut p) = plan(Op::GemmRs, name, 2, 8);
        let w = find(&p, 0, |l, _| l.starts_with("wait") && l.contains("push"));
        let TaskKind::Wait { flag } = p.ranks[0].tasks[w].kind else {
            panic!("not a wait")
        };
        // Wait on another block's counter instead (one that is waited on elsewhere).
        let other = find(&p, 0, |l, k| {
            l.starts_with("wait") && matches!(k, TaskKind::Wait { flag: f } if *f != flag)
        });
        let TaskKind::Wait { flag: f2 } = p.ranks[0].tasks[other].kind else {
            panic!("not a wait")
        };
        p.ranks[0].tasks[w].kind = TaskKind::Wait { flag: f2 };
        let err = validate(&p).unwrap_err().to_string();
        assert!(
            err.contains("race") || err.contains("no task writes"),
            "{name}: {err}"
        );
        let err = interpret(&p, &Inputs::random(&problem, 4))
            .unwrap_err()
            .to_string();
        assert!(err.contains("read before arrival"), "{name}: {err}");
    }
}

/// The expansion: one chain per block, each on its own stream, in the
/// kernel's order (own shard first for ag-gemm, peer r+1 first for gemm-rs).
#[test]
fn expansion_has_one_chain_per_block_in_kernel_order() {
    let (_, p) = plan(Op::AgGemm, "tile-copy-ring", 4, 8);
    let e = expand(&p);
    let gemms: Vec<&str> = e.ranks[2]
        .tasks
        .iter()
        .filter(|t| t.kind.short() == "gemm")
        .map(|t| t.label.as_str())
        .collect();
    assert_eq!(gemms.len(), 8);
    assert_eq!(gemms[0], "tile-gemm b4");
    assert_eq!(gemms[2], "tile-gemm b6");
    assert_eq!(gemms[7], "tile-gemm b3");
    let streams: std::collections::HashSet<usize> = e.ranks[2]
        .tasks
        .iter()
        .filter(|t| t.kind.short() == "gemm")
        .map(|t| t.stream)
        .collect();
    assert_eq!(streams.len(), 8);
    let (_, p) = plan(Op::GemmRs, "tile-copy-ring", 4, 4);
    let TaskKind::TileGemm(g) = &p.ranks[3].tasks[0].kind else {
        panic!("first task is the tile GEMM")
    };
    let order: Vec<usize> = g.order().collect();
    assert_eq!(order, vec![0, 1, 2, 3]);
    assert_eq!(g.signal, Some(0));
    // Flags: counters 0..4, arrivals 4 + q (the last rank never hears from itself).
    assert_eq!(p.signal_words(), vec![8, 8, 8, 7]);
    assert!(validate(&e).is_ok());
}

/// `expand_origins` maps every expanded task back to the task it came from:
/// one entry per expanded task, in order, every original task covered, a
/// tile GEMM's block tasks on it and every other task unchanged.
#[test]
fn expand_origins_map_blocks_back_to_their_tile_gemm() {
    for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
        for gpus in [2, 4] {
            let problem = Problem::new(op, gpus * 1024, 256, 256, gpus).expect("problem");
            for s in tiles(op) {
                let Ok(p) = lower(&problem, &s) else { continue };
                let e = expand(&p);
                let origins = expand_origins(&p);
                for (r, rp) in p.ranks.iter().enumerate() {
                    let o = &origins[r];
                    assert_eq!(o.len(), e.ranks[r].tasks.len(), "{}", p.name);
                    assert!(o.windows(2).all(|w| w[0] <= w[1] && w[1] - w[0] <= 1));
                    assert_eq!(o.first().copied(), (!rp.tasks.is_empty()).then_some(0));
                    assert_eq!(o.last().copied(), rp.tasks.len().checked_sub(1));
                    for (t, &i) in e.ranks[r].tasks.iter().zip(o) {
                        match &rp.tasks[i].kind {
                            TaskKind::TileGemm(_) => {
                                assert!(t.label.contains(&rp.tasks[i].label), "{}", t.label)
                            }
                            k => assert_eq!(&t.kind, k),
                        }
                    }
                }
            }
        }
    }
}
