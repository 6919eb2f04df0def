//! `ficco characterize` on a machine without GPUs: exit 2, one line naming
//! the missing library; argument errors come first.

use std::process::Command;

fn ficco(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ficco"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run ficco")
}

#[test]
fn characterize_without_gpu_is_one_line_naming_the_library() {
    let o = ficco(&["characterize", "--quick"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if o.status.success() {
        // A machine with GPUs: the tables are printed.
        assert!(String::from_utf8_lossy(&o.stdout).contains("# Decomposition loss"));
        return;
    }
    assert_eq!(o.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("library") || lines[0].contains("GPU"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn characterize_argument_errors() {
    let o = ficco(&["characterize", "--gpus", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("error:"), "{err}");
    let o = ficco(&["characterize", "--out", "/nonexistent-dir/x.toml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent-dir"), "{err}");
    let o = ficco(&["characterize", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for flag in ["--gpus", "--out", "--json", "--quick"] {
        assert!(out.contains(flag), "{out}");
    }
}

#[test]
fn measured_profile_of_the_h200_run_loads_in_explore() {
    let o = ficco(&[
        "explore",
        "--op",
        "ag-gemm",
        "--m",
        "8192",
        "--k",
        "8192",
        "--n",
        "2560",
        "--gpus",
        "4",
        "--backend",
        "sim",
        "--hw",
        "bench/data/2026-11-21-characterize/h200-char.toml",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("hardware: h200-char"), "{out}");
}
