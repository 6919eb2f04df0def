//! Golden outputs: the whole shipped suites simulated with `--json`, and the
//! `schedules` listings, byte-identical to the files under `tests/golden/`.
//!
//! They pin behaviour across refactors. A change that is meant to alter the
//! output regenerates them with `FICCO_BLESS=1 cargo test --test golden` and
//! the diff is reviewed like code.

use std::path::PathBuf;
use std::process::Command;

fn ficco(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ficco"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run ficco");
    assert!(
        out.status.success(),
        "ficco {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn check(name: &str, got: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("FICCO_BLESS").is_some() {
        std::fs::write(&path, got).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path).expect("read golden file");
    if want != got {
        let line = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
        panic!(
            "{name} differs from the golden file at line {}:\n  want: {:?}\n  got:  {:?}\n\
             (regenerate with FICCO_BLESS=1 if the change is intended)",
            line + 1,
            want.lines().nth(line),
            got.lines().nth(line)
        );
    }
}

#[test]
fn llama3_suite_json_is_unchanged() {
    let got = ficco(&[
        "explore",
        "--suite",
        "suites/llama3.toml",
        "--json",
        "--backend",
        "sim",
    ]);
    check("llama3.json", &got);
}

#[test]
fn concurrent_suite_json_is_unchanged() {
    let got = ficco(&[
        "explore",
        "--suite",
        "suites/concurrent.toml",
        "--json",
        "--backend",
        "sim",
    ]);
    check("concurrent.json", &got);
}

#[test]
fn schedule_listings_are_unchanged() {
    let mut got = String::new();
    for op in ["ag-gemm", "gemm-rs", "gemm-ar", "concurrent"] {
        for p in ["2", "4", "8"] {
            got.push_str(&format!("## {op} {p}\n"));
            got.push_str(&ficco(&["schedules", "--op", op, "--gpus", p]));
            got.push_str(&format!("## {op} {p} controls\n"));
            got.push_str(&ficco(&[
                "schedules",
                "--op",
                op,
                "--gpus",
                p,
                "--controls",
            ]));
        }
    }
    check("schedules.txt", &got);
}
