//! The CLI on one GPU in loopback: `explore --backend loopback` measures the
//! copy-engine schedules (labelled loopback, NCCL ones skipped), and a run
//! with a missing signal ends within the watchdog bound with a non-zero exit
//! and the stuck rank named. Without a GPU each test prints `SKIPPED:` (or
//! fails under `FICCO_REQUIRE_GPU=1`). `FICCO_BIN` names the binary when the
//! test executable runs on another machine than the one it was built on.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Instant;

fn ficco(args: &[&str], env: &[(&str, &str)]) -> Output {
    let (bin, dir) = match std::env::var_os("FICCO_BIN") {
        Some(b) => (PathBuf::from(b), std::env::current_dir().expect("cwd")),
        None => (
            PathBuf::from(env!("CARGO_BIN_EXE_ficco")),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ),
    };
    let mut c = Command::new(bin);
    c.args(args).current_dir(dir);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run ficco")
}

/// True (after printing why) when there is no GPU and the test may skip.
fn no_gpu(test: &str, o: &Output) -> bool {
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.success() || !err.contains("GPU backend not available") {
        return false;
    }
    if std::env::var("FICCO_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: FICCO_REQUIRE_GPU=1 but no GPU backend: {err}");
    }
    eprintln!("SKIPPED: {test}: {}", err.trim());
    true
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
fn explore_in_loopback_measures_copy_schedules() {
    let o = ficco(PROBLEM, &[]);
    if no_gpu("explore_in_loopback_measures_copy_schedules", &o) {
        return;
    }
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
    if no_gpu("a_missing_signal_ends_the_process_within_the_bound", &o) {
        return;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("exit {:?} after {took:.0} ms: {err}", o.status.code());
    assert!(!o.status.success(), "a hung run must fail");
    assert!(err.contains("run hung: rank 0"), "{err}");
    assert!(err.contains("rank 1"), "{err}");
    // Open, compile and warm-up take a few seconds; the hang itself ends
    // within the bound plus the drain.
    assert!(took < (bound_ms + 20_000) as f64, "took {took} ms");
}

/// `explore --procs P --backend loopback`: P processes, every rank on GPU 0,
/// buffers and flags in memory the processes share; rank 0 prints one
/// report in which the copy schedules ran and matched the reference.
#[test]
fn explore_as_processes_checks_copy_schedules_against_the_reference() {
    for procs in ["2", "4"] {
        for op in ["ag-gemm", "gemm-rs", "gemm-ar"] {
            let args = [
                "explore",
                "--procs",
                procs,
                "--backend",
                "loopback",
                "--op",
                op,
                "--m",
                "1024",
                "--k",
                "512",
                "--n",
                "768",
                "--gpus",
                procs,
                "--json",
                "--schedule",
                "shard-copy-ring",
                "--schedule",
                "fine2-copy-all",
            ];
            let o = ficco(&args, &[("FICCO_WATCHDOG_MS", "8000")]);
            if no_gpu("explore_as_processes_checks_copy_schedules", &o) {
                return;
            }
            let out = String::from_utf8_lossy(&o.stdout);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{op} P={procs}: {err}");
            let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON report");
            let device = v["hardware"].as_str().unwrap_or_default();
            assert!(device.contains("as processes"), "{device}");
            for name in ["shard-copy-ring", "fine2-copy-all"] {
                let row = v["schedules"]
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
}

/// A rank that dies in the middle of a run: every other rank ends with an
/// error within the bound (its watchdog releases the waits on the dead
/// rank, the store names it), and `--procs` reports the failure.
#[test]
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
    if no_gpu("a_rank_that_dies_ends_the_job_within_the_bound", &o) {
        return;
    }
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
