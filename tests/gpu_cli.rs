//! The CLI on one GPU in loopback: `explore --backend loopback` measures the
//! copy-engine schedules (labelled loopback, NCCL ones skipped), and a run
//! with a missing signal ends within the watchdog bound with a non-zero exit
//! and the stuck rank named. Every test needs a GPU, so it is `#[ignore]`d
//! and fails where it runs without one (see `ficco_testkit` for the policy); run
//! with `--include-ignored` (`bench/gpu-tests.sh`). `FICCO_BIN` names the
//! binary when the test executable runs on another machine than the one it
//! was built on.
//!
//! One test soaks schedules on 4 GPUs (`_4gpus`, left out where there are
//! fewer). Every other rank here runs on GPU 0, so `ficco` sees only that GPU
//! (`CUDA_VISIBLE_DEVICES`): on 4 GPUs each `ficco` process otherwise
//! started the driver on all four and opened a context on each (`info`),
//! and this binary took 175 s on 4 H100s against 60 s on one H200.

use ficco_testkit as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

fn ficco(args: &[&str], env: &[(&str, &str)]) -> Output {
    ficco_on(args, env, true)
}

/// `ficco` with `args`; on GPU 0 only (`first_only`) or on every GPU.
fn ficco_on(args: &[&str], env: &[(&str, &str)], first_only: bool) -> Output {
    let (bin, dir) = match std::env::var_os("FICCO_BIN") {
        Some(b) => (PathBuf::from(b), std::env::current_dir().expect("cwd")),
        None => (
            PathBuf::from(env!("CARGO_BIN_EXE_ficco")),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ),
    };
    let mut c = Command::new(bin);
    c.args(args).current_dir(dir);
    if first_only {
        let (var, first) = common::first_gpu_only();
        c.env(var, first);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run ficco")
}

/// Fails `test` where `ficco` found no GPU backend.
fn check_gpu(test: &str, o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() && err.contains("GPU backend not available") {
        common::no_gpu(test, err.trim());
    }
}

const PROBLEM: &[&str] = &[
    "explore",
    "--backend",
    "loopback",
    "--op",
    "gemm-rs",
    "--m",
    "1024",
    "--k",
    "512",
    "--n",
    "512",
    "--gpus",
    "2",
];

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn explore_in_loopback_measures_copy_schedules() {
    let o = ficco(PROBLEM, &[]);
    check_gpu("explore_in_loopback_measures_copy_schedules", &o);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{out}\n{err}");
    assert!(o.status.success(), "{err}");
    assert!(out.contains("loopback"), "loopback label missing:\n{out}");
    assert!(out.contains("shard-copy-ring"), "{out}");
    assert!(
        out.contains("NCCL cannot run several ranks on one GPU"),
        "NCCL schedules must be listed as skipped:\n{out}"
    );
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn a_missing_signal_ends_the_process_within_the_bound() {
    let bound_ms = 2000;
    let t0 = Instant::now();
    // Rank 1's first task feeds rank 0 in every gemm-rs plan: drop its signals.
    let o = ficco(
        PROBLEM,
        &[
            ("FICCO_TEST_DROP_SIGNAL", "1,0"),
            ("FICCO_WATCHDOG_MS", "2000"),
        ],
    );
    let took = t0.elapsed().as_secs_f64() * 1e3;
    check_gpu("a_missing_signal_ends_the_process_within_the_bound", &o);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("exit {:?} after {took:.0} ms: {err}", o.status.code());
    assert!(!o.status.success(), "a hung run must fail");
    assert!(err.contains("run hung: rank 0"), "{err}");
    assert!(err.contains("rank 1"), "{err}");
    // Open, compile and warm-up take a few seconds; the hang itself ends
    // within the bound plus the drain.
    assert!(took < (bound_ms + 20_000) as f64, "took {took} ms");
}

/// One scenario per dependent operator, on `procs` GPUs: the suite file
/// [`explore_as_processes_checks_copy_schedules_against_the_reference`] runs.
fn write_suite(dir: &Path, procs: usize) -> PathBuf {
    let mut text = String::new();
    for op in ["ag-gemm", "gemm-rs", "gemm-ar"] {
        text += &format!(
            "[[scenario]]\nname = \"{op}.p{procs}\"\nop = \"{op}\"\nm = 1024\nk = 512\nn = 768\ngpus = {procs}\n\n"
        );
    }
    let path = dir.join(format!("procs-p{procs}.toml"));
    std::fs::write(&path, text).expect("write the suite");
    path
}

/// `explore --procs P --backend loopback`: P processes, every rank on GPU 0,
/// buffers and flags in memory the processes share; rank 0 prints one
/// report in which the copy schedules ran and matched the reference, for
/// each operator. One job per P runs the three operators as one suite:
/// they used to be a job each, six jobs of 2 or 4 processes that each
/// start the driver, open the GPU and load the kernels.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn explore_as_processes_checks_copy_schedules_against_the_reference() {
    let test = "explore_as_processes_checks_copy_schedules_against_the_reference";
    let dir = std::env::temp_dir().join(format!("ficco-gpu-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    for procs in [2, 4] {
        let suite = write_suite(&dir, procs);
        let procs_arg = procs.to_string();
        let args = [
            "explore",
            "--procs",
            &procs_arg,
            "--backend",
            "loopback",
            "--suite",
            suite.to_str().expect("a UTF-8 path"),
            "--json",
            "--schedule",
            "shard-copy-ring",
            "--schedule",
            "fine2-copy-all",
        ];
        let o = ficco(&args, &[("FICCO_WATCHDOG_MS", "8000")]);
        check_gpu(test, &o);
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "P={procs}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON report");
        let reports = v["scenarios"].as_array().expect("a suite report");
        assert_eq!(reports.len(), 3, "P={procs}: three scenarios:\n{out}");
        let mut ops: Vec<&str> = reports.iter().filter_map(|r| r["op"].as_str()).collect();
        ops.sort_unstable();
        assert_eq!(ops, ["ag-gemm", "gemm-ar", "gemm-rs"], "P={procs}:\n{out}");
        for report in reports {
            let op = report["op"].as_str().unwrap_or_default();
            let device = report["hardware"].as_str().unwrap_or_default();
            assert!(device.contains("as processes"), "{device}");
            for name in ["shard-copy-ring", "fine2-copy-all"] {
                let row = report["schedules"]
                    .as_array()
                    .and_then(|rows| rows.iter().find(|r| r["name"] == name))
                    .unwrap_or_else(|| panic!("{op} P={procs}: no row {name}:\n{out}"));
                assert!(row["skipped"].is_null(), "{op} P={procs} {name}: {row}");
                let e = row["max_rel_err"].as_f64().expect("checked");
                assert!(e < 1e-2, "{op} P={procs} {name}: error {e}");
            }
            eprintln!("{op} P={procs}: ok ({device})");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that dies in the middle of a run: every other rank ends with an
/// error within the bound (its watchdog releases the waits on the dead
/// rank, the store names it), and `--procs` reports the failure.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn a_rank_that_dies_ends_the_job_within_the_bound() {
    let t0 = Instant::now();
    let o = ficco(
        &[
            "explore",
            "--procs",
            "4",
            "--backend",
            "loopback",
            "--op",
            "ag-gemm",
            "--m",
            "1024",
            "--k",
            "512",
            "--n",
            "512",
            "--gpus",
            "4",
            "--schedule",
            "shard-copy-ring",
        ],
        &[
            ("FICCO_TEST_KILL_RANK", "2"),
            ("FICCO_WATCHDOG_MS", "2000"),
            ("FICCO_DIST_TIMEOUT_MS", "8000"),
        ],
    );
    check_gpu("a_rank_that_dies_ends_the_job_within_the_bound", &o);
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{err}\n(took {took:?})");
    assert!(!o.status.success());
    assert!(err.contains("rank 2"), "{err}");
    assert!(
        err.contains("the job of 4 processes failed"),
        "the launcher names the failure: {err}"
    );
    assert!(took.as_secs() < 60, "took {took:?}");
}

/// Issue 26, hang 3: on 4 GPUs, the first gemm-rs copy schedule with a fused
/// reduce (`-acc`, an accumulating GEMM) issued directly stalled for good
/// after the same shapes had run without it: cuBLASLt loaded the
/// accumulating kernel inside the run, holding its lock while it waited for
/// a device that waited for the other ranks' threads, which waited for the
/// lock. Every form of every GEMM is now run once before the threads start.
#[test]
#[ignore = "needs 4 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn a_direct_soak_of_the_ring_copy_schedules_ends_4gpus() {
    let dir = std::env::temp_dir().join(format!("ficco-gpu-cli-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let out = dir.join("soak.jsonl");
    let t0 = Instant::now();
    let o = ficco_on(
        &[
            "soak",
            "--gpus",
            "4",
            "--models",
            "llama3-8b",
            "--tokens",
            "2048",
            "--graphs",
            "off",
            "--only",
            "copy-ring",
            "--iters",
            "3",
            "--out",
            out.to_str().expect("utf-8 path"),
        ],
        &[("FICCO_WATCHDOG_MS", "2000")],
        false,
    );
    check_gpu("a_direct_soak_of_the_ring_copy_schedules_ends_4gpus", &o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let runs = std::fs::read_to_string(&out).expect("soak output");
    let acc = runs.lines().filter(|l| l.contains("-acc\"")).count();
    assert!(acc >= 2, "the -acc schedules ran: {runs}");
    for l in runs.lines() {
        assert!(l.contains("\"result\":\"ok\""), "{l}");
    }
    assert!(t0.elapsed().as_secs() < 100, "took {:?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
