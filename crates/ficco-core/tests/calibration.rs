//! Calibration of the `h200-nvlink` profile against the 60 scenarios measured
//! on 4x H200 (`data/anchor-h200x4.jsonl`): the cost model's GEMM, collective
//! and sequential times must each have a median absolute relative error of at
//! most 10% and a worst one of at most 30%.
//!
//! Run with `--nocapture` to see the table.

use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::cost;
use ficco_core::sim::profile::HwProfile;
use ficco_core::stats::median;
use serde::Deserialize;

const ANCHOR: &str = include_str!("../data/anchor-h200x4.jsonl");

#[derive(Deserialize)]
struct Row {
    name: String,
    op: Op,
    m: usize,
    k: usize,
    n: usize,
    gpus: usize,
    compute_ms: f64,
    comm_ms: f64,
    seq_ms: f64,
}

fn rows() -> Vec<(String, Problem, [f64; 3])> {
    ANCHOR
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let r: Row = serde_json::from_str(l).expect("anchor line parses");
            let p = Problem::new(r.op, r.m, r.k, r.n, r.gpus).unwrap();
            (r.name, p, [r.compute_ms, r.comm_ms, r.seq_ms])
        })
        .collect()
}

#[test]
fn h200_profile_matches_the_anchor() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let rows = rows();
    assert_eq!(rows.len(), 60);
    let mut errs: [Vec<f64>; 3] = Default::default();
    println!(
        "{:<34} {:>8} {:>8} {:>6} | {:>7} {:>7} {:>6} | {:>7} {:>7} {:>6}",
        "scenario", "gemm", "model", "err", "comm", "model", "err", "seq", "model", "err"
    );
    for (name, p, measured) in &rows {
        let model = [
            cost::problem_gemm_ms(&hw, p),
            cost::problem_comm_ms(&hw, p),
            cost::problem_seq_ms(&hw, p),
        ];
        let mut line = format!("{name:<34}");
        for j in 0..3 {
            let e = model[j] / measured[j] - 1.0;
            errs[j].push(e.abs());
            line.push_str(&format!(
                " {:>8.3} {:>8.3} {:>+5.1}% |",
                measured[j],
                model[j],
                100.0 * e
            ));
        }
        println!("{line}");
    }
    let mut failures = Vec::new();
    for (j, what) in ["gemm", "comm", "seq"].iter().enumerate() {
        let med = median(&errs[j]).expect("60 errors");
        let worst = errs[j].iter().cloned().fold(0.0, f64::max);
        println!(
            "{what:>5}: median |err| {:.1}%, worst {:.1}%",
            100.0 * med,
            100.0 * worst
        );
        if med > 0.10 || worst > 0.30 {
            failures.push(format!("{what}: median {med:.3}, worst {worst:.3}"));
        }
    }
    assert!(
        failures.is_empty(),
        "calibration out of bounds: {failures:?}"
    );
}
