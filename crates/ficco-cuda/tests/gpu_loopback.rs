//! Loopback GPU tests: P ranks on one GPU (`GpuBackend::open_loopback`).
//! Every copy-engine schedule of the enumerated design space (with and
//! without controls) of every operator runs at P = 2 and P = 4 on small
//! shapes, outputs poisoned first, and is checked against the sequential
//! reference (itself run in its copy form and checked against the host);
//! NCCL schedules are skipped with the loopback reason; every `tile`
//! schedule (one persistent GEMM per rank, fed or drained by copy engines
//! through flags) runs exactly on shapes it fits; a missing signal ends the
//! run through the watchdog, also when a tile GEMM's kernel waits on it.
//! Needs one GPU, so every test is `#[ignore]`d and fails where it runs
//! without one (see `ficco_testkit` for the policy). Run with `--include-ignored
//! --test-threads=1 --nocapture` (`bench/gpu-tests.sh`).
#![allow(clippy::needless_range_loop)]

use common::{b2f, copy_schedules, no_gpu, rand, rel_err};
use ficco_core::plan::lower::{comm_only, gemm_only, lower};
use ficco_core::plan::{BufferRole, Plan, TaskKind};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::run::{skip_reason, Backend};
use ficco_core::space::{enumerate, Engine, Granularity, Schedule, SpaceOptions};
use ficco_cuda::{CudaError, GpuBackend, MeasureConfig, RunOpts};
use ficco_testkit as common;
use std::time::Instant;

/// The loopback backend of `ranks` ranks; fails `test` where there is no
/// usable GPU.
fn open(test: &str, ranks: usize) -> GpuBackend {
    match GpuBackend::open_loopback(ranks) {
        Ok(b) => b,
        Err(
            e @ (CudaError::LibraryMissing { .. }
            | CudaError::LibraryUnusable { .. }
            | CudaError::NoGpu(_)
            | CudaError::DriverInit { .. }),
        ) => no_gpu(test, &e.to_string()),
        Err(CudaError::NotEnoughGpus { .. }) => no_gpu(test, "no GPU found"),
        Err(e) => panic!("{test}: open_loopback failed on a GPU machine: {e}"),
    }
}

/// Small shapes per operator and rank count (M splits into P x 8 chunks).
fn shape(op: Op, p: usize) -> (usize, usize, usize) {
    match op {
        Op::AgGemm => (p * 64, 192, 256),
        Op::GemmRs => (p * 128, 256, 128),
        Op::GemmAr => (p * 64, 128, 384),
        Op::Concurrent => (p * 128, 256, 256),
        // Tokens; routed by `gpu_moe.rs`'s own shapes.
        Op::A2aGemm | Op::GemmA2a => (p * 64, 128, 128),
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn every_copy_schedule_is_exact_in_loopback() {
    let test = "every_copy_schedule_is_exact_in_loopback";
    let mut failures = vec![];
    let (mut passed, mut misfit) = (0, 0);
    // (fine8, [direct µs, graph µs]) per schedule.
    let mut launches: Vec<(bool, [f64; 2])> = vec![];
    for p in [2, 4] {
        let mut be = open(test, p);
        be.config = MeasureConfig {
            warmup: 2,
            iters: 5,
            ..MeasureConfig::default()
        };
        eprintln!("device: {}", be.device());
        assert!(be.device().contains("loopback"));
        for op in Op::ALL {
            let (m, k, n) = shape(op, p);
            let problem = Problem::new(op, m, k, n, p).expect("problem");
            let seq = lower(&problem, &Schedule::SEQ).expect("seq");
            be.prepare(&seq).expect("prepare the copy-form reference");
            // The reference itself, timed (it runs in its copy form).
            let r = be.measure(&seq, true, false).expect("seq in copy form");
            assert!(r.correct, "{}: seq against itself", problem.label());
            // What explore measures besides: gemm-only and comm-only (in copy form).
            let g = be
                .measure(&gemm_only(&problem), false, false)
                .expect("gemm-only");
            let c = be
                .measure(&comm_only(&problem), false, false)
                .expect("comm-only (copy form)");
            eprintln!(
                "REF P={p} {}: seq {:.3} ms launch {:.1} us, gemm-only {:.3} ms, comm-only {:.3} ms",
                problem.label(),
                r.time_ms,
                r.launch_us.unwrap_or(f64::NAN),
                g.time_ms,
                c.time_ms
            );
            for s in copy_schedules(op) {
                let plan = match lower(&problem, &s) {
                    Ok(plan) => plan,
                    Err(_) => {
                        misfit += 1;
                        continue;
                    }
                };
                // The same plan issued directly and replayed from graphs,
                // side by side: both exact, and their launch costs.
                let mut launch = [f64::NAN; 2];
                for (k, graphs) in [false, true].into_iter().enumerate() {
                    be.run_opts.graphs = graphs;
                    let t0 = Instant::now();
                    match be.measure(&plan, true, false) {
                        Ok(r) if r.correct && r.max_rel_err.is_some_and(|e| e <= 1e-2) => {
                            passed += 1;
                            launch[k] = r.launch_us.unwrap_or(f64::NAN);
                            let graphed = be.last_graphed == Some(true);
                            // Green-context and tile plans are issued directly by design.
                            let graphable = plan.resources.green_sms.is_none()
                                && s.granularity != ficco_core::space::Granularity::Tile;
                            if graphs && !graphed && graphable {
                                failures.push(format!(
                                    "P={p} {} {}: graph capture failed: {}",
                                    problem.label(),
                                    s.name(),
                                    be.last_graph_error.as_deref().unwrap_or("?")
                                ));
                            }
                            eprintln!(
                                "PASS P={p} {} {:<28} {} err {:.1e} time {:.3} ms launch {:.1} us ({:.0} ms wall)",
                                problem.label(),
                                s.name(),
                                if graphed { "graph " } else { "direct" },
                                r.max_rel_err.unwrap_or(f64::NAN),
                                r.time_ms,
                                launch[k],
                                t0.elapsed().as_secs_f64() * 1e3
                            );
                        }
                        Ok(r) => failures.push(format!(
                            "P={p} {} {} (graphs {graphs}): wrong output, err {:?}",
                            problem.label(),
                            s.name(),
                            r.max_rel_err
                        )),
                        Err(e) => failures.push(format!(
                            "P={p} {} {} (graphs {graphs}): {e}",
                            problem.label(),
                            s.name()
                        )),
                    }
                }
                eprintln!(
                    "LAUNCH P={p} op={} schedule={} direct_us={:.1} graph_us={:.1}",
                    op.name(),
                    s.name(),
                    launch[0],
                    launch[1]
                );
                launches.push((s.granularity.chunks() >= 8, launch));
            }
            be.run_opts.graphs = true;
            // One NCCL schedule: skipped with the loopback reason.
            if let Some(s) = enumerate(op, SpaceOptions::default())
                .into_iter()
                .find(|s| s.engine == Engine::Nccl && !s.is_seq())
            {
                if let Ok(plan) = lower(&problem, &s) {
                    let e = be
                        .measure(&plan, true, false)
                        .expect_err("NCCL in loopback");
                    let reason = skip_reason(&e).expect("a Skip");
                    assert!(reason.contains("NCCL cannot run several ranks on one GPU"));
                }
            }
        }
    }
    eprintln!(
        "loopback copy schedules: {passed} runs passed, {} failed, {misfit} do not fit",
        failures.len()
    );
    let median = |fine8: bool, k: usize| {
        let mut v: Vec<f64> = launches
            .iter()
            .filter(|(f, l)| *f == fine8 && l[k].is_finite())
            .map(|(_, l)| l[k])
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    eprintln!(
        "LAUNCH-SUMMARY host launch per rank, median us: other schedules direct {:.1} graph {:.1}; fine8 direct {:.1} graph {:.1}",
        median(false, 0),
        median(false, 1),
        median(true, 0),
        median(true, 1)
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(passed > 0);
}

/// Host GEMM of bf16 inputs in f32, row-major, [m,k] x [k,n].
fn host_gemm(a: &[u16], b: &[u16], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for q in 0..k {
            let x = b2f(a[i * k + q]);
            for j in 0..n {
                c[i * n + j] += x * b2f(b[q * n + j]);
            }
        }
    }
    c
}

fn role(plan: &Plan, r: usize, role: BufferRole) -> usize {
    plan.ranks[r].buffer_with(role).expect("buffer")
}

/// The loopback reference (the sequential plan with its collective as
/// copies and reduces) matches a host computation of each operator.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn copy_form_reference_matches_host() {
    let test = "copy_form_reference_matches_host";
    for p in [2, 4] {
        let mut be = open(test, p);
        for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
            let (m, k, n) = (p * 16, 64, 48);
            let problem = Problem::new(op, m, k, n, p).expect("problem");
            let seq = lower(&problem, &Schedule::SEQ).expect("seq");
            let mut init = vec![];
            let (mut a, mut b) = (vec![], vec![]);
            for r in 0..p {
                let rp = &seq.ranks[r];
                let mut bufs = vec![None; rp.buffers.len()];
                let ia = role(&seq, r, BufferRole::InputA);
                let ib = role(&seq, r, BufferRole::InputB);
                let ba = &rp.buffers[ia];
                let bb = &rp.buffers[ib];
                a.push(rand(ba.rows * ba.cols, 100 + r as u64));
                b.push(rand(bb.rows * bb.cols, 200 + r as u64));
                bufs[ia] = Some(a[r].clone());
                bufs[ib] = Some(b[r].clone());
                init.push(bufs);
            }
            let out = be.run_host(&seq, &init).expect("run the copy-form seq");
            let rows = m / p;
            for r in 0..p {
                let expect: Vec<f32> = match op {
                    Op::AgGemm => {
                        let gathered: Vec<u16> = a.concat();
                        host_gemm(&gathered, &b[r], m, k, n)
                    }
                    _ => {
                        let mut sum = vec![0f32; m * n];
                        for q in 0..p {
                            for (s, x) in sum.iter_mut().zip(host_gemm(&a[q], &b[q], m, k, n)) {
                                *s += x;
                            }
                        }
                        if op == Op::GemmRs {
                            sum[r * rows * n..(r + 1) * rows * n].to_vec()
                        } else {
                            sum
                        }
                    }
                };
                let o = role(&seq, r, BufferRole::Output);
                let got: Vec<f32> = out[r][o].iter().map(|&h| b2f(h)).collect();
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

/// A dependency whose producer never signals ends the run within the
/// watchdog bound with `Hang` naming the rank and point; the backend then
/// runs the same plan correctly (nothing was left running).
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn watchdog_ends_a_missing_signal() {
    let test = "watchdog_ends_a_missing_signal";
    let mut be = open(test, 2);
    // gemm-rs on copy engines: each rank pushes its partials into the
    // peer's slots, and the peer's reduce depends on those pushes.
    let problem = Problem::new(Op::GemmRs, 128, 64, 64, 2).expect("problem");
    let s: Schedule = "shard-copy-ring".parse().expect("schedule");
    let plan = lower(&problem, &s).expect("plan");
    // The first cross-rank dependency: drop its producer's signal.
    let (consumer, producer) = plan
        .ranks
        .iter()
        .enumerate()
        .find_map(|(r, rp)| {
            rp.tasks
                .iter()
                .flat_map(|t| t.deps.iter())
                .find(|d| d.rank != r)
                .map(|d| (r, (d.rank, d.index)))
        })
        .expect("a cross-rank dependency");
    let bound_ms = 2000;
    let init: Vec<Vec<Option<Vec<u16>>>> = plan
        .ranks
        .iter()
        .map(|rp| vec![None; rp.buffers.len()])
        .collect();
    for graphs in [false, true] {
        be.run_opts = RunOpts {
            watchdog_ms: bound_ms,
            drop_signal: Some(producer),
            graphs,
            ..RunOpts::default()
        };
        let t0 = Instant::now();
        let res = be.run_host(&plan, &init);
        let took = t0.elapsed().as_secs_f64() * 1e3;
        eprintln!(
            "watchdog (graphs {graphs}): {took:.0} ms (bound {bound_ms} ms): {res:?}",
            res = res.as_ref().err()
        );
        match res {
            Err(CudaError::Hang {
                rank,
                point,
                waited_ms,
            }) => {
                assert_eq!(rank, consumer, "{point}");
                assert!(point.contains(&format!("rank {}", producer.0)), "{point}");
                assert!(waited_ms >= bound_ms);
            }
            other => panic!("expected Hang, got {other:?}"),
        }
        assert!(took < (bound_ms + 3000) as f64, "took {took} ms");
    }
    be.run_opts = RunOpts::default();
    be.run_host(&plan, &init)
        .expect("the backend runs again after a released hang");
}

/// Every `tile` schedule (controls included), named once.
fn tile_schedules(op: Op) -> Vec<Schedule> {
    let mut out: Vec<Schedule> = vec![];
    for controls in [false, true] {
        let opts = SpaceOptions {
            controls,
            sm_count: 132,
            nccl_sms: 16,
        };
        for s in enumerate(op, opts) {
            if s.granularity == Granularity::Tile && !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// Every `tile` schedule of ag-gemm, gemm-rs and gemm-ar at P = 2 and 4
/// (K = N = 256), on shards of 256 and 512 rows (one chunk, one flag per
/// shard: `tile_chunks` wants chunks of at least 512 rows) and of 2048 rows
/// (4 chunks of 512). Each runs issued directly and replayed from graphs
/// (the checked iteration is then a graph launch), exact against the
/// copy-form sequential reference.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn every_tile_schedule_is_exact_in_loopback() {
    let test = "every_tile_schedule_is_exact_in_loopback";
    let mut failures = vec![];
    let (mut passed, mut misfit, mut ran) = (0, 0, 0);
    for p in [2, 4] {
        let mut be = open(test, p);
        be.config = MeasureConfig {
            warmup: 2,
            iters: 3,
            ..MeasureConfig::default()
        };
        for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
            for rows in [256, 512, 2048] {
                let problem = Problem::new(op, p * rows, 256, 256, p).expect("problem");
                let seq = lower(&problem, &Schedule::SEQ).expect("seq");
                be.prepare(&seq).expect("prepare the copy-form reference");
                for s in tile_schedules(op) {
                    let plan = match lower(&problem, &s) {
                        Ok(plan) => plan,
                        Err(_) => {
                            misfit += 1;
                            continue;
                        }
                    };
                    ran += 1;
                    let capturable = plan.resources.green_sms.is_none()
                        && !plan
                            .has_task(|k| matches!(k, TaskKind::TileGemm(g) if g.wait.is_some()));
                    for graphs in [false, true] {
                        be.run_opts.graphs = graphs;
                        let t0 = Instant::now();
                        match be.measure(&plan, true, false) {
                            Ok(r) if r.correct && r.max_rel_err.is_some_and(|e| e <= 1e-2) => {
                                passed += 1;
                                // Replayed from a graph where asked for, unless a
                                // tile GEMM waits on flags (issued directly: see
                                // the executor's `graphs()`).
                                let graphed = be.last_graphed == Some(true);
                                if graphed != (graphs && capturable) {
                                    failures.push(format!(
                                        "P={p} {} {} (graphs {graphs}): replayed from a graph: \
                                         {graphed}, expected {}",
                                        problem.label(),
                                        s.name(),
                                        graphs && capturable
                                    ));
                                }
                                eprintln!(
                                    "PASS P={p} {} {:<28} {} err {:.1e} time {:.3} ms ({:.0} ms wall)",
                                    problem.label(),
                                    s.name(),
                                    if graphed { "graph " } else { "direct" },
                                    r.max_rel_err.unwrap_or(f64::NAN),
                                    r.time_ms,
                                    t0.elapsed().as_secs_f64() * 1e3
                                );
                            }
                            Ok(r) => failures.push(format!(
                                "P={p} {} {} (graphs {graphs}): wrong output, err {:?}",
                                problem.label(),
                                s.name(),
                                r.max_rel_err
                            )),
                            Err(e) => failures.push(format!(
                                "P={p} {} {} (graphs {graphs}): {e}",
                                problem.label(),
                                s.name()
                            )),
                        }
                    }
                }
            }
        }
        be.run_opts.graphs = true;
    }
    eprintln!(
        "loopback tile schedules: {ran} plans, {passed} runs passed, {} failed, {misfit} do not fit \
         (-acc on 4 GPUs)",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // 96 plans on the space as of this writing: ring and all, with and
    // without -hi, for the three operators, and -acc for gemm-rs and gemm-ar
    // on 2 GPUs, at three shapes.
    assert!(ran > 0);
    assert_eq!(passed, 2 * ran);
}

/// A tile GEMM whose block flag is never signalled spins in its kernel:
/// the watchdog names the GEMM and the flag, releases every flag (the
/// kernel's wait reads the release value) and the backend runs the plan
/// again correctly.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn watchdog_ends_a_tile_gemm_waiting_on_a_missing_flag() {
    let test = "watchdog_ends_a_tile_gemm_waiting_on_a_missing_flag";
    let mut be = open(test, 2);
    let problem = Problem::new(Op::AgGemm, 512, 256, 256, 2).expect("problem");
    let s: Schedule = "tile-copy-ring".parse().expect("schedule");
    let plan = lower(&problem, &s).expect("plan");
    // Rank 1's Signal to rank 0 after its push of its shard into rank 0
    // (the waiter is rank 0: the watchdog reads ranks in order, and a
    // finished rank's cleared flags read as unset).
    let dropped = plan.ranks[1]
        .tasks
        .iter()
        .position(|t| t.kind.short() == "signal" && t.label.contains("push r0"))
        .expect("a push's signal");
    let init: Vec<Vec<Option<Vec<u16>>>> = plan
        .ranks
        .iter()
        .map(|rp| vec![None; rp.buffers.len()])
        .collect();
    let bound_ms = 2000;
    for graphs in [false, true] {
        be.run_opts = RunOpts {
            watchdog_ms: bound_ms,
            drop_signal: Some((1, dropped)),
            graphs,
            ..RunOpts::default()
        };
        let t0 = Instant::now();
        let res = be.run_host(&plan, &init);
        let took = t0.elapsed().as_secs_f64() * 1e3;
        eprintln!(
            "tile watchdog (graphs {graphs}): {took:.0} ms (bound {bound_ms} ms): {res:?}",
            res = res.as_ref().err()
        );
        match res {
            Err(CudaError::Hang { rank, point, .. }) => {
                assert_eq!(rank, 0, "{point}");
                assert!(point.contains("tile-gemm"), "{point}");
            }
            other => panic!("expected Hang, got {other:?}"),
        }
        assert!(took < (bound_ms + 3000) as f64, "took {took} ms");
    }
    be.run_opts = RunOpts::default();
    be.prepare(&lower(&problem, &Schedule::SEQ).expect("seq"))
        .expect("prepare the copy-form reference");
    let r = be
        .measure(&plan, true, false)
        .expect("runs after the release");
    assert!(r.correct, "wrong output after a released hang");
}
