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
