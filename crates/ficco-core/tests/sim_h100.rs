//! The `h100-nvlink` profile against `ficco soak` on 4 H100s
//! (`data/soak-h100x4-b405ac2.json`: every schedule of the llama3-8b and
//! llama3-70b layers at 2048 and 16384 tokens, on 4 and on 2 GPUs).
//!
//! The profile is `h200-nvlink`'s model (the same die, NVLink and NCCL)
//! with H100's memory, and its three GEMM values refit on the llama3-70b
//! rows only (`bench/fit_profile.py`); the llama3-8b rows are held out.
//! Scored as `ficco evaluate` scores: the mean absolute percentage error of
//! the prediction over every measured schedule the simulator runs. Before
//! (the profile derived from public specs, never calibrated): llama3-70b
//! 16.9% at P = 4 and 8.6% at P = 2, llama3-8b (held out) 25.9% and 14.4%.
//! After: 8.6%, 6.9%, 10.5% and 7.7%. The held-out P = 4 error sits in the
//! 2048-token shapes (0.1-0.4 ms, 12-16% each); every schedule family's
//! geomean predicted / measured is within 0.89-1.06.
//!
//! The soak keeps the faster of two runs of a few iterations per schedule,
//! and the runs differ by up to 30%: these errors are near the data's own
//! spread.

use ficco_core::choose::select::predict_ms;
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::Schedule;
use serde::Deserialize;

mod common;
use common::Row;

#[derive(Deserialize)]
struct Fixture {
    scenarios: Vec<Row>,
}

/// MAPE of `hw` over the soak's rows of `model` on `gpus` GPUs, and how
/// many measured times it covers.
fn mape(hw: &HwProfile, model: &str, gpus: usize) -> (f64, usize) {
    let f: Fixture = serde_json::from_str(include_str!("data/soak-h100x4-b405ac2.json")).unwrap();
    let (mut sum, mut n) = (0.0, 0);
    for r in f
        .scenarios
        .iter()
        .filter(|r| r.gpus == gpus && r.scenario.starts_with(&format!("{model}.")))
    {
        let op: Op = r.op.parse().unwrap();
        let p = Problem::new(op, r.m, r.k, r.n, r.gpus).unwrap();
        for (name, &t) in &r.times_ms {
            let s: Schedule = name.parse().unwrap();
            // Schedules the simulator does not run (none in this soak
            // today) are not scored, as `ficco evaluate` skips them.
            if let Ok(pred) = predict_ms(&p, &s, hw) {
                sum += (pred / t - 1.0).abs();
                n += 1;
            }
        }
    }
    (sum / n as f64, n)
}

#[test]
fn h100_profile_predicts_the_h100_soak() {
    let hw = HwProfile::builtin("h100-nvlink").unwrap();
    // (model, P, bound): what the profile reaches, rounded up, so that a
    // regression fails; llama3-8b was never fitted on.
    for (model, gpus, bound) in [
        ("llama3-70b", 4, 0.087),
        ("llama3-70b", 2, 0.070),
        ("llama3-8b", 4, 0.106),
        ("llama3-8b", 2, 0.077),
    ] {
        let (e, n) = mape(&hw, model, gpus);
        println!("{model} P = {gpus}: {n} times, MAPE {:.1}%", 100.0 * e);
        assert!(n >= 500, "{model} P = {gpus}: only {n} times scored");
        assert!(e <= bound, "{model} P = {gpus}: MAPE {e:.4} > {bound}");
    }
}

#[test]
fn h100_profile_differs_from_h200_only_in_memory_and_gemm() {
    let h100 = HwProfile::builtin("h100-nvlink").unwrap();
    let h200 = HwProfile::builtin("h200-nvlink").unwrap();
    assert_eq!((h100.hbm_gbs, h100.memory_gb), (3350.0, Some(80.0)));
    // The links, copy engines, NCCL, reduce kernels and contention are the
    // same hardware and library: h200-nvlink's calibration.
    assert_eq!(
        format!(
            "{:?}{:?}{:?}{:?}{:?}",
            h100.nvlink, h100.copy_engine, h100.nccl, h100.reduce, h100.contention
        ),
        format!(
            "{:?}{:?}{:?}{:?}{:?}",
            h200.nvlink, h200.copy_engine, h200.nccl, h200.reduce, h200.contention
        )
    );
}
