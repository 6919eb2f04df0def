//! GPU tests of the expert-parallel operators (`a2a-gemm`, `gemm-a2a`) on
//! one GPU:
//!
//! * loopback (P ranks on one GPU): every copy-engine MoE schedule (with and
//!   without controls) at P = 2 and 4, with uniform and heavy routing skew,
//!   outputs poisoned first, checked against the sequential reference (its
//!   all-to-all run as copy-engine pulls); NCCL schedules are skipped with
//!   the loopback reason;
//! * the loopback reference itself against a host computation of the
//!   operator from its routing;
//! * a measurement of the executor's grouped GEMM (ficco's grouped kernel on
//!   Hopper by default, the loop of cuBLASLt calls, one per expert, under
//!   `FICCO_GROUPED=loop`) on a skewed batch (8 experts, hidden 4096,
//!   FFN 14336, 16384 rows, one expert empty) against the same experts as
//!   separate GEMM tasks over two streams and one dense GEMM of all rows.
//!
//! Needs one GPU, so every test is `#[ignore]`d and fails where it runs
//! without one (see `ficco_testkit` for the policy). Run with `--include-ignored
//! --test-threads=1 --nocapture` (`bench/gpu-tests.sh`).
#![allow(clippy::needless_range_loop)]

use common::{b2f, copy_schedules, no_gpu, rand, rel_err};
use ficco_core::plan::interp::{reference, Inputs, Matrix};
use ficco_core::plan::lower::{comm_only, gemm_only, lower};
use ficco_core::plan::{
    Buffer, BufferRole, GemmGroup, Plan, RankPlan, StreamRole, StreamSpec, Task, TaskKind, View,
};
use ficco_core::problem::routing::{MoeSpec, Skew};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::run::{skip_reason, Backend};
use ficco_core::space::{Priority, Schedule};
use ficco_cuda::{CudaError, GpuBackend, MeasureConfig};
use ficco_testkit as common;

fn open_loopback(test: &str, ranks: usize) -> GpuBackend {
    match GpuBackend::open_loopback(ranks) {
        Ok(b) => b,
        Err(e @ (CudaError::LibraryMissing { .. } | CudaError::NoGpu(_))) => {
            no_gpu(test, &e.to_string())
        }
        Err(CudaError::NotEnoughGpus { .. }) => no_gpu(test, "no GPU found"),
        Err(e) => panic!("{test}: open_loopback failed on a GPU machine: {e}"),
    }
}

/// A small MoE problem: 64 tokens per rank, 2 experts per rank, top-2.
fn problem(op: Op, p: usize, skew: Skew) -> Problem {
    let (k, n) = if op == Op::A2aGemm {
        (128, 192)
    } else {
        (192, 128)
    };
    Problem::moe(op, p * 64, k, n, p, MoeSpec::new(2 * p, 2, skew, 7)).expect("problem")
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn every_moe_copy_schedule_is_exact_in_loopback() {
    let test = "every_moe_copy_schedule_is_exact_in_loopback";
    let mut failures = vec![];
    let mut passed = 0;
    for p in [2, 4] {
        let mut be = open_loopback(test, p);
        be.config = MeasureConfig {
            warmup: 2,
            iters: 5,
            ..MeasureConfig::default()
        };
        for op in Op::MOE {
            for skew in [Skew::NONE, Skew::HEAVY] {
                let problem = problem(op, p, skew);
                let rt = problem.routing().expect("routing");
                eprintln!("{}: {}", problem.label(), rt.summary());
                let seq = lower(&problem, &Schedule::SEQ).expect("seq");
                be.prepare(&seq).expect("prepare the copy-form reference");
                let r = be.measure(&seq, true, false).expect("seq in copy form");
                assert!(r.correct, "{}: seq against itself", problem.label());
                be.measure(&gemm_only(&problem), false, false)
                    .expect("gemm-only");
                be.measure(&comm_only(&problem), false, false)
                    .expect("comm-only (copy form)");
                for s in copy_schedules(op) {
                    let plan = lower(&problem, &s).expect("every MoE schedule fits");
                    match be.measure(&plan, true, false) {
                        Ok(r) if r.correct && r.max_rel_err.is_some_and(|e| e <= 1e-2) => {
                            passed += 1;
                            eprintln!(
                                "PASS P={p} {} {:<24} err {:.1e} time {:.3} ms",
                                problem.label(),
                                s.name(),
                                r.max_rel_err.unwrap_or(f64::NAN),
                                r.time_ms
                            );
                        }
                        Ok(r) => failures.push(format!(
                            "P={p} {} {}: wrong output, err {:?}",
                            problem.label(),
                            s.name(),
                            r.max_rel_err
                        )),
                        Err(e) => {
                            failures.push(format!("P={p} {} {}: {e}", problem.label(), s.name()))
                        }
                    }
                }
                let nccl: Schedule = "shard-nccl-ring".parse().expect("name");
                let e = be
                    .measure(&lower(&problem, &nccl).expect("nccl"), true, false)
                    .expect_err("NCCL in loopback");
                let reason = skip_reason(&e).expect("a Skip");
                assert!(reason.contains("NCCL cannot run several ranks on one GPU"));
            }
        }
    }
    eprintln!(
        "loopback MoE copy schedules: {passed} passed, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(passed > 0);
}

/// The loopback reference of both MoE operators matches the operator's
/// definition computed on the host from the same bf16 inputs and routing.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn moe_copy_form_reference_matches_host() {
    let test = "moe_copy_form_reference_matches_host";
    for p in [2, 4] {
        let mut be = open_loopback(test, p);
        for op in Op::MOE {
            let problem = problem(op, p, Skew::HEAVY);
            let seq = lower(&problem, &Schedule::SEQ).expect("seq");
            let mut init = vec![];
            let (mut a, mut b) = (vec![], vec![]);
            for r in 0..p {
                let rp = &seq.ranks[r];
                let mut bufs = vec![None; rp.buffers.len()];
                for (role, seed, store) in [
                    (BufferRole::InputA, 100, &mut a),
                    (BufferRole::InputB, 200, &mut b),
                ] {
                    let i = rp.buffer_with(role).expect("input");
                    let buf = &rp.buffers[i];
                    let data = rand(buf.rows * buf.cols, seed + r as u64);
                    bufs[i] = Some(data.clone());
                    store.push((buf.rows, buf.cols, data));
                }
                init.push(bufs);
            }
            let out = be.run_host(&seq, &init).expect("run the copy-form seq");
            let mat = |(rows, cols, d): &(usize, usize, Vec<u16>)| Matrix {
                rows: *rows,
                cols: *cols,
                data: d.iter().map(|&h| b2f(h) as f64).collect(),
            };
            let inputs = Inputs {
                a: a.iter().map(mat).collect(),
                b: b.iter().map(mat).collect(),
                x: vec![],
            };
            let want = reference(&problem, &inputs);
            for r in 0..p {
                let o = seq.ranks[r]
                    .buffer_with(BufferRole::Output)
                    .expect("output");
                let got: Vec<f32> = out[r][o].iter().map(|&h| b2f(h)).collect();
                let expect: Vec<f32> = want[r].data.iter().map(|&x| x as f32).collect();
                let e = rel_err(&got, &expect);
                eprintln!(
                    "reference P={p} {} rank {r}: rel err {e:.2e}",
                    problem.label()
                );
                assert!(e < 1e-2, "P={p} {} rank {r}: rel err {e}", problem.label());
            }
        }
    }
}

/// A skewed MoE batch for the grouped GEMM: expert row counts (one expert
/// empty, one with 4,384 rows), 16,384 rows in all.
const SKEWED_COUNTS: [usize; 8] = [3000, 500, 1200, 0, 2500, 800, 4000, 4384];

/// One rank's plan of `tasks` over x [16384, 4096], w [8·4096, 14336], y [16384, 14336].
fn bench_plan(name: &str, tasks: Vec<Task>, streams: usize) -> Plan {
    let (rows, h, f) = (SKEWED_COUNTS.iter().sum::<usize>(), 4096, 14336);
    let buf = |name: &str, role, rows, cols| Buffer {
        name: name.into(),
        role,
        rows,
        cols,
        peer_visible: false,
    };
    Plan {
        problem: Problem {
            op: Op::A2aGemm,
            m: rows,
            k: h,
            n: f,
            gpus: 1,
            side: None,
            moe: None,
        },
        name: name.into(),
        schedule: None,
        resources: Default::default(),
        ranks: vec![RankPlan {
            buffers: vec![
                buf("x", BufferRole::InputA, rows, h),
                buf("w", BufferRole::InputB, 8 * h, f),
                buf("y", BufferRole::Output, rows, f),
            ],
            streams: (0..streams)
                .map(|i| StreamSpec {
                    name: format!("compute{i}"),
                    role: StreamRole::Compute,
                    priority: Priority::Normal,
                })
                .collect(),
            tasks,
        }],
    }
}

/// The experts' groups of SKEWED_COUNTS (the empty expert left out).
fn mission_groups() -> Vec<GemmGroup> {
    let (rows, h, f) = (SKEWED_COUNTS.iter().sum::<usize>(), 4096, 14336);
    let mut at = 0;
    let mut out = vec![];
    for (e, &n) in SKEWED_COUNTS.iter().enumerate() {
        if n > 0 {
            out.push(GemmGroup {
                a: View::whole(0, rows, h).rows(at, n),
                b: View::whole(1, 8 * h, f).rows(e * h, h),
                c: View::whole(2, rows, f).rows(at, n),
            });
        }
        at += n;
    }
    out
}

/// Grouped GEMM (the executor's grouped route: `FICCO_GROUPED`) vs the same experts as
/// separate GEMM tasks alternating over two streams, vs one dense GEMM of
/// all 16384 rows (one expert's weights: the same FLOPs, no grouping).
/// Prints TFLOP/s of each; for scale, the target the grouped kernel was
/// built against: torch._grouped_mm at 738 TFLOP/s (2.607 ms) on this
/// batch, and a loop of per-expert matmuls at 624 (3.086 ms).
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn grouped_gemm_vs_cublaslt_loop_and_dense() {
    let test = "grouped_gemm_vs_cublaslt_loop_and_dense";
    let mut be = match GpuBackend::open(1) {
        Ok(b) => b,
        Err(e @ (CudaError::LibraryMissing { .. } | CudaError::NoGpu(_))) => {
            no_gpu(test, &e.to_string())
        }
        Err(CudaError::NotEnoughGpus { .. }) => no_gpu(test, "no GPU found"),
        Err(e) => panic!("{test}: open failed on a GPU machine: {e}"),
    };
    be.config = MeasureConfig {
        warmup: 5,
        iters: 20,
        ..MeasureConfig::default()
    };
    let groups = mission_groups();
    let grouped = bench_plan(
        "grouped",
        vec![Task {
            label: "grouped-gemm".into(),
            stream: 0,
            kind: TaskKind::GroupedGemm {
                groups: groups.clone(),
                sm_target: None,
            },
            deps: vec![],
        }],
        1,
    );
    let separate = bench_plan(
        "separate-2s",
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| Task {
                label: format!("gemm e{i}"),
                stream: i % 2,
                kind: TaskKind::Gemm {
                    a: g.a,
                    b: g.b,
                    c: g.c,
                    sm_target: None,
                    accumulate: false,
                    occupancy: None,
                },
                deps: vec![],
            })
            .collect(),
        2,
    );
    let rows: usize = SKEWED_COUNTS.iter().sum();
    let dense = bench_plan(
        "dense",
        vec![Task {
            label: "gemm".into(),
            stream: 0,
            kind: TaskKind::Gemm {
                a: View::whole(0, rows, 4096),
                b: View::whole(1, 8 * 4096, 14336).rows(0, 4096),
                c: View::whole(2, rows, 14336),
                sm_target: None,
                accumulate: false,
                occupancy: None,
            },
            deps: vec![],
        }],
        1,
    );
    let flops = 2.0 * rows as f64 * 4096.0 * 14336.0;
    let mut times = vec![];
    for plan in [&grouped, &separate, &dense] {
        let t = be.measure(plan, false, false).expect(&plan.name).time_ms;
        eprintln!(
            "BENCH {:<12} {:.3} ms  {:.0} TFLOP/s",
            plan.name,
            t,
            flops / (t * 1e-3) / 1e12
        );
        assert!(t.is_finite() && t > 0.0);
        times.push(t);
    }
    // The grouped GEMM does the dense GEMM's FLOPs over 7 experts: never
    // faster than about the dense GEMM, and not pathologically slower.
    assert!(times[0] > 0.8 * times[2], "{times:?}");
    assert!(times[0] < 3.0 * times[2], "{times:?}");
    // The same task on the cuBLASLt loop, for comparison (the default route
    // above is ficco's grouped kernel on Hopper).
    be.run_opts.grouped = ficco_core::settings::Grouped::Loop;
    let looped = be.measure(&grouped, false, false);
    be.run_opts.grouped = ficco_core::settings::Grouped::default();
    let t = looped.expect("grouped on the cuBLASLt loop").time_ms;
    eprintln!(
        "BENCH {:<12} {:.3} ms  {:.0} TFLOP/s",
        "grouped-loop",
        t,
        flops / (t * 1e-3) / 1e12
    );
    assert!(t > 0.8 * times[2] && t < 3.0 * times[2], "{t} vs {times:?}");
}
