//! Schedules on ficco's own GEMM engine (`-own`, `-smN`, `-occS`) through the
//! executor, checked against the sequential reference (cuBLASLt) on fresh
//! random inputs with poisoned outputs. Loopback (P ranks on one GPU, copy
//! engines) so that one H200 runs it; shapes with chunks of 64-128 rows and a
//! deep K make ficco's kernel split K, so two compute streams (`-2s`) would
//! race on one split-K workspace if the executor shared it. Needs one Hopper
//! GPU, so every test is `#[ignore]`d and fails where it runs without one
//! (see `ficco_testkit` for the policy). Run with `--include-ignored
//! --test-threads=1 --nocapture` (`bench/gpu-tests.sh`).

use common::no_gpu;
use ficco_core::plan::lower::lower;
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::run::{skip_reason, Backend};
use ficco_core::space::{GemmEngine, Schedule};
use ficco_cuda::{CudaError, GpuBackend, MeasureConfig};
use ficco_testkit as common;

fn open(test: &str, ranks: usize) -> GpuBackend {
    match GpuBackend::open_loopback(ranks) {
        Ok(b) => b,
        Err(e @ (CudaError::LibraryMissing { .. } | CudaError::NoGpu(_))) => {
            no_gpu(test, &e.to_string())
        }
        Err(CudaError::NotEnoughGpus { .. }) => no_gpu(test, "no GPU found"),
        Err(e) => panic!("{test}: open_loopback failed on a GPU machine: {e}"),
    }
}

/// Runs `names` of every operator at P = 2 and 4; returns (passed, skipped,
/// failures). A skip (the backend's typed reason) is not a failure.
fn run_all(test: &str, names: &dyn Fn(Op) -> Vec<Schedule>) -> (usize, usize, Vec<String>) {
    let mut failures = vec![];
    let (mut passed, mut skipped) = (0, 0);
    for p in [2, 4] {
        let mut be = open(test, p);
        be.config = MeasureConfig {
            warmup: 1,
            iters: 3,
            ..MeasureConfig::default()
        };
        // (m, k, n): fine8 chunks of 64-96 rows at P = 2 and 4 (split K);
        // N not a multiple of the 256-column tile.
        for (op, (m, k, n)) in [
            (Op::AgGemm, (p * 8 * 64, 4096, 1024)),
            (Op::GemmRs, (p * 8 * 96, 2048, 1536)),
            (Op::GemmAr, (p * 8 * 64, 3072, 1280)),
        ] {
            let problem = Problem::new(op, m, k, n, p).expect("problem");
            let seq = lower(&problem, &Schedule::SEQ).expect("seq");
            be.prepare(&seq).expect("prepare");
            for s in names(op) {
                assert_eq!(s.gemm, GemmEngine::Own, "{s}");
                let plan = lower(&problem, &s).unwrap_or_else(|e| panic!("{s}: {e}"));
                assert_eq!(plan.resources.gemm, GemmEngine::Own);
                match be.measure(&plan, true, false) {
                    Ok(r) if r.correct && r.max_rel_err.is_some_and(|e| e <= 1e-2) => {
                        passed += 1;
                        eprintln!(
                            "PASS P={p} {} {:<32} err {:.1e} time {:.3} ms",
                            problem.label(),
                            s.name(),
                            r.max_rel_err.unwrap_or(f64::NAN),
                            r.time_ms
                        );
                    }
                    Ok(r) => failures.push(format!(
                        "P={p} {} {s}: wrong output, err {:?}",
                        problem.label(),
                        r.max_rel_err
                    )),
                    Err(e) => match skip_reason(&e) {
                        Some(why) => {
                            skipped += 1;
                            eprintln!("SKIP P={p} {} {s}: {why}", problem.label());
                        }
                        None => failures.push(format!("P={p} {} {s}: {e}", problem.label())),
                    },
                }
            }
        }
    }
    (passed, skipped, failures)
}

/// Own-engine schedules of `op` worth running: every option ficco's kernel
/// takes (accumulate, two streams, SM budget, stages, green context).
fn own_schedules(op: Op) -> Vec<Schedule> {
    let mut names = vec![
        "shard-copy-ring-own",
        "bulk-copy-all-own",
        "fine2-copy-ring-2s-own",
        "fine4-copy-all-2s-own",
        "fine8-copy-ring-own",
        "shard-copy-ring-sm66",
        "fine2-copy-ring-2s-sm100",
        "fine4-copy-ring-occ2",
        "fine2-copy-all-sm17-occ3",
    ];
    if op != Op::AgGemm {
        names.extend([
            "fine2-copy-ring-acc-own",
            "fine4-copy-ring-2s-acc-own",
            "shard-copy-ring-acc-sm66-occ2",
        ]);
    }
    names
        .into_iter()
        .map(|n| n.parse().expect("a valid name"))
        .collect()
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn own_engine_schedules_match_the_reference() {
    let test = "own_engine_schedules_match_the_reference";
    let (passed, skipped, failures) = run_all(test, &own_schedules);
    eprintln!(
        "own-engine schedules: {passed} passed, {skipped} skipped, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(skipped, 0, "copy-engine schedules run in loopback");
}

/// Under a green context ficco's kernel gets the compute partition's SMs as
/// its SM budget and launches in that context.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn own_engine_under_a_green_context() {
    let test = "own_engine_under_a_green_context";
    let names = |_: Op| -> Vec<Schedule> {
        ["shard-copy-ring-own-gc64", "fine2-copy-ring-2s-sm48-gc64"]
            .into_iter()
            .map(|n| n.parse().expect("a valid name"))
            .collect()
    };
    let (passed, skipped, failures) = run_all(test, &names);
    eprintln!(
        "green: {passed} passed, {skipped} skipped, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A stage count outside the kernel's range is a typed error from the
/// executor (the name parses; the design space rejects it; a hand-lowered
/// plan still cannot launch it), never a hang or a wrong result.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn a_bad_stage_count_is_an_error() {
    let test = "a_bad_stage_count_is_an_error";
    let mut be = open(test, 2);
    let problem = Problem::new(Op::AgGemm, 512, 256, 256, 2).expect("problem");
    let seq = lower(&problem, &Schedule::SEQ).expect("seq");
    be.prepare(&seq).expect("prepare");
    let s: Schedule = "shard-copy-ring-occ9".parse().expect("name");
    let plan = lower(&problem, &s).expect("lowering takes any stage count");
    let e = be.measure(&plan, true, false).expect_err("9 stages");
    assert!(e.to_string().contains("stages"), "{e}");
}
