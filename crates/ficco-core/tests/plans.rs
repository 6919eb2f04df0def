//! Every schedule of the design space, lowered for random small shapes, is a
//! valid plan whose exact interpretation equals the sequential reference.

use ficco_core::plan::interp::{interpret, reference, Inputs};
use ficco_core::plan::lower::{comm_only, gemm_only, lower};
use ficco_core::plan::validate::validate;
use ficco_core::plan::TaskKind;
use ficco_core::problem::workload::{Collective, Op, Problem};
use ficco_core::space::{enumerate, GemmEngine, Schedule, SpaceOptions};
use proptest::prelude::*;

fn space() -> SpaceOptions {
    SpaceOptions {
        controls: true,
        sm_count: 132,
        nccl_sms: 16,
    }
}

fn check_all(problem: &Problem, seed: u64) -> Result<usize, TestCaseError> {
    let inputs = Inputs::random(problem, seed);
    let want = reference(problem, &inputs);
    let mut ran = 0;
    for s in enumerate(problem.op, space()) {
        if s.misfit(problem).is_some() {
            prop_assert!(lower(problem, &s).is_err());
            continue;
        }
        let plan = lower(problem, &s).map_err(|e| TestCaseError::fail(format!("{s}: {e}")))?;
        validate(&plan)
            .map_err(|e| TestCaseError::fail(format!("{} {s}: {e}", problem.label())))?;
        let got =
            interpret(&plan, &inputs).map_err(|e| TestCaseError::fail(format!("{s}: {e}")))?;
        prop_assert_eq!(&got, &want, "{} {}", problem.label(), s);
        ran += 1;
    }
    Ok(ran)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn every_schedule_matches_the_reference(
        op in prop::sample::select(Op::ALL.to_vec()),
        gpus in 2usize..=4,
        rows_per_chunk in 1usize..=2,
        chunk_mult in prop::sample::select(vec![1usize, 2, 4, 8]),
        k in 1usize..=5,
        n in 1usize..=5,
        seed in any::<u64>(),
    ) {
        let m = gpus * chunk_mult * rows_per_chunk;
        let problem = Problem::new(op, m, k, n, gpus).unwrap();
        check_all(&problem, seed)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// `concurrent`: GEMM results and the collective, every schedule, every collective.
    #[test]
    fn every_concurrent_schedule_matches_the_reference(
        collective in prop::sample::select(Collective::ALL.to_vec()),
        gpus in 2usize..=4,
        gemms in 1usize..=3,
        m in 1usize..=4,
        k in 1usize..=4,
        n in 1usize..=4,
        blocks in 1usize..=3,
        seed in any::<u64>(),
    ) {
        let bytes = 2 * n * gpus * blocks;
        let problem = Problem::concurrent(gemms, m, k, n, collective, bytes, gpus).unwrap();
        let ran = check_all(&problem, seed)?;
        // ficco's own GEMM needs N and K multiples of 8 (these have n, k <= 4);
        // everything else runs.
        let own = enumerate(Op::Concurrent, space()).iter().filter(|s| s.gemm == GemmEngine::Own).count();
        prop_assert_eq!(ran + own, enumerate(Op::Concurrent, space()).len());
    }
}

#[test]
fn concurrent_own_gemm_schedules_fit_aligned_shapes() {
    let problem =
        Problem::concurrent(1, 5, 8, 16, Collective::AllReduce, 2 * 16 * 2 * 2, 2).unwrap();
    let s: Schedule = "shard-nccl-ring-occ2-cta8-hi".parse().unwrap();
    let plan = lower(&problem, &s).unwrap();
    validate(&plan).unwrap();
    assert_eq!(plan.resources.nccl_ctas, Some(8));
    assert_eq!(plan.resources.gemm, GemmEngine::Own);
    let inputs = Inputs::random(&problem, 3);
    assert_eq!(
        interpret(&plan, &inputs).unwrap(),
        reference(&problem, &inputs)
    );
}

#[test]
fn concurrent_rejects_bad_sizes_with_reasons() {
    let err = Problem::concurrent(2, 64, 64, 64, Collective::AllReduce, 1000, 4).unwrap_err();
    assert!(err.to_string().contains("multiple of"), "{err}");
    let err = Problem::concurrent(0, 64, 64, 64, Collective::AllReduce, 2 * 64 * 4, 4).unwrap_err();
    assert!(err.to_string().contains("gemms"), "{err}");
    assert!(Problem::new(Op::Concurrent, 64, 64, 64, 4).is_err());
}

/// The GEMM engine changes where GEMMs run, never what a plan does: an
/// own-engine schedule lowers to its cuBLASLt twin's plan with the engine
/// (and the SM budget or stage count) in its resources and GEMM tasks.
#[test]
fn own_engine_plans_are_their_cublaslt_twins() {
    for op in Op::ALL {
        let problem = Problem::new(op, 64, 16, 24, 4).unwrap();
        let mut twins = 0;
        for s in enumerate(op, space()) {
            if s.gemm != GemmEngine::Own || s.green_sms.is_some() {
                continue;
            }
            let plan = lower(&problem, &s).unwrap();
            assert_eq!(plan.resources.gemm, GemmEngine::Own, "{s}");
            let cub = Schedule {
                gemm: GemmEngine::Cublas,
                sm_target: None,
                occupancy: None,
                ..s
            };
            let mut twin = lower(&problem, &cub).unwrap();
            twin.resources.gemm = GemmEngine::Own;
            for t in twin.ranks.iter_mut().flat_map(|r| &mut r.tasks) {
                if let TaskKind::Gemm {
                    sm_target,
                    occupancy,
                    ..
                } = &mut t.kind
                {
                    *sm_target = s.sm_target;
                    *occupancy = s.occupancy;
                }
            }
            assert!(plan.same_work(&twin), "{s} vs {cub}");
            twins += 1;
        }
        assert!(twins > 10, "{op}: {twins}");
    }
}

#[test]
fn all_fine_chunks_run_when_m_divides() {
    for op in Op::ALL {
        for gpus in [2, 3, 4, 8] {
            let problem = Problem::new(op, gpus * 8, 8, 8, gpus).unwrap();
            let ran = check_all(&problem, 7).unwrap();
            // `tile` needs 128-row blocks (tests/tile.rs runs it).
            let tiles = enumerate(op, space())
                .iter()
                .filter(|s| s.granularity == ficco_core::space::Granularity::Tile)
                .count();
            assert_eq!(
                ran + tiles,
                enumerate(op, space()).len(),
                "{}",
                problem.label()
            );
        }
    }
}

#[test]
fn reference_plans_are_valid() {
    let mut problems: Vec<Problem> = Op::ALL
        .into_iter()
        .map(|op| Problem::new(op, 16, 4, 4, 4).unwrap())
        .collect();
    for c in Collective::ALL {
        problems.push(Problem::concurrent(3, 16, 4, 4, c, 2 * 4 * 4 * 2, 4).unwrap());
    }
    for problem in problems {
        validate(&gemm_only(&problem)).unwrap();
        validate(&comm_only(&problem)).unwrap();
    }
}

#[test]
fn seq_is_one_collective_and_one_gemm_per_rank() {
    for op in Op::ALL {
        let problem = Problem::new(op, 16, 4, 4, 4).unwrap();
        let plan = lower(&problem, &Schedule::SEQ).unwrap();
        for rp in &plan.ranks {
            assert_eq!(rp.tasks.len(), 2);
        }
    }
}

fn plan(op: Op, name: &str) -> ficco_core::plan::Plan {
    let problem = Problem::new(op, 16, 4, 4, 2).unwrap();
    lower(&problem, &name.parse::<Schedule>().unwrap()).unwrap()
}

fn first_with(p: &ficco_core::plan::Plan, kind: &str) -> usize {
    p.ranks[0]
        .tasks
        .iter()
        .position(|t| t.kind.short() == kind)
        .unwrap()
}

#[test]
fn validation_rejects_a_read_before_its_write() {
    // Drop the GEMM's dependency on the copy that fills its input rows.
    let mut p = plan(Op::AgGemm, "shard-copy-ring");
    let g = p.ranks[0]
        .tasks
        .iter()
        .rposition(|t| t.kind.short() == "gemm")
        .unwrap();
    p.ranks[0].tasks[g].deps.clear();
    let err = validate(&p).unwrap_err().to_string();
    assert!(
        err.contains("race") || err.contains("no task writes before"),
        "{err}"
    );
}

#[test]
fn validation_rejects_a_cycle() {
    let mut p = plan(Op::GemmRs, "fine2-copy-ring");
    let copy = first_with(&p, "copy");
    let gemm = first_with(&p, "gemm");
    // The GEMM feeding the copy now also waits for the copy.
    p.ranks[0].tasks[gemm].deps.push(ficco_core::plan::TaskId {
        rank: 0,
        index: copy,
    });
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("cycle"), "{err}");
}

#[test]
fn validation_rejects_unordered_writers() {
    // Two compute streams, and a reduce that no longer waits for rank 1's push.
    let mut p = plan(Op::GemmRs, "shard-copy-ring-2s");
    let red = first_with(&p, "reduce");
    p.ranks[0].tasks[red].deps.retain(|d| d.rank == 0);
    let err = validate(&p).unwrap_err().to_string();
    assert!(
        err.contains("race") || err.contains("no task writes before"),
        "{err}"
    );
}

#[test]
fn validation_rejects_mismatched_nccl_calls() {
    let mut p = plan(Op::GemmAr, "fine2-nccl-ring");
    let last = p.ranks[1]
        .tasks
        .iter()
        .rposition(|t| t.kind.short() == "all-reduce")
        .unwrap();
    p.ranks[1].tasks.remove(last);
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("same calls in the same order"), "{err}");
}

#[test]
fn interpreter_exposes_a_wrong_plan() {
    // A plan that reduces only its own partial is valid memory-wise but wrong.
    let problem = Problem::new(Op::GemmRs, 8, 3, 2, 2).unwrap();
    let mut p = lower(&problem, &"shard-copy-ring".parse::<Schedule>().unwrap()).unwrap();
    for rp in &mut p.ranks {
        for t in &mut rp.tasks {
            if let ficco_core::plan::TaskKind::Reduce { srcs, .. } = &mut t.kind {
                srcs.truncate(1);
            }
        }
    }
    let inputs = Inputs::random(&problem, 3);
    let got = interpret(&p, &inputs).unwrap();
    assert_ne!(got, reference(&problem, &inputs));
}

/// With one peer, `ring` and `all`, and `shard` and `bulk`, are the same
/// schedule: they must lower to one plan (explore then measures it once);
/// with more peers they differ.
#[test]
fn ring_and_all_shard_and_bulk_are_one_plan_exactly_when_there_is_one_peer() {
    for op in Op::ALL {
        for gpus in [2usize, 4, 8] {
            let p = Problem::new(op, 8192, 8192, 8192, gpus).unwrap();
            let plan = |name: &str| lower(&p, &name.parse().unwrap()).unwrap();
            for gran in ["shard", "bulk", "fine4"] {
                let (a, b) = (
                    plan(&format!("{gran}-copy-ring")),
                    plan(&format!("{gran}-copy-all")),
                );
                assert_eq!(a.same_work(&b), gpus == 2, "{op:?} {gran} P={gpus}");
            }
            let (a, b) = (plan("shard-copy-ring"), plan("bulk-copy-ring"));
            assert_eq!(a.same_work(&b), gpus == 2, "{op:?} shard/bulk P={gpus}");
            assert!(!a.same_work(&plan("fine2-copy-ring")));
        }
    }
}

/// The work digest agrees with `same_work` on every pair of plans of the
/// design space (twins share it; all others differ), with and without the
/// controls, at 2, 4 and 8 GPUs.
#[test]
fn work_digests_agree_with_same_work() {
    let mut twins = 0;
    for gpus in [2, 4, 8] {
        for op in Op::ALL {
            let p = Problem::new(op, 1024 * gpus, 512, 256, gpus).unwrap();
            let opts = SpaceOptions {
                controls: true,
                ..SpaceOptions::default()
            };
            let plans: Vec<_> = enumerate(op, opts)
                .iter()
                .filter_map(|s| lower(&p, s).ok())
                .collect();
            let digests: Vec<u64> = plans.iter().map(|p| p.work_digest()).collect();
            for i in 0..plans.len() {
                for j in i + 1..plans.len() {
                    let same = plans[i].same_work(&plans[j]);
                    twins += usize::from(same);
                    assert_eq!(
                        digests[i] == digests[j],
                        same,
                        "{} {} vs {}",
                        p.label(),
                        plans[i].name,
                        plans[j].name
                    );
                }
            }
        }
    }
    assert!(twins > 0, "no twins at P=2");
}
