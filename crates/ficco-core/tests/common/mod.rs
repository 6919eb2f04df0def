//! Measured data the integration tests share: one row per scenario with
//! every schedule's measured time, and the 4x H200 anchor sweeps
//! (`data/sweeps-h200x4-ffd6dd6.json`, `bench/sweep_fixture.py`).

// Each test crate that includes this module uses part of it.
#![allow(dead_code)]

use serde::Deserialize;
use std::collections::BTreeMap;

/// One measured scenario: its shape and every schedule's time (ms).
#[derive(Deserialize, Clone)]
pub struct Row {
    pub scenario: String,
    pub op: String,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub gpus: usize,
    pub times_ms: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
pub struct Sweeps {
    pub sweeps: Vec<Sweep>,
}

/// One anchor sweep: every schedule measured, and PyTorch's sequential and
/// ideal times from the same device call.
#[derive(Deserialize)]
pub struct Sweep {
    pub label: String,
    pub scenarios: Vec<SweepRow>,
}

#[derive(Deserialize)]
pub struct SweepRow {
    #[serde(flatten)]
    pub row: Row,
    pub torch_seq_ms: f64,
    pub torch_ideal_ms: f64,
}

/// The 4x H200 sweeps of the seventh session (commit ffd6dd6): llama3 and
/// the validation set (`suites/validation.toml`), each at P = 4 and P = 2.
pub fn h200_sweeps() -> Sweeps {
    serde_json::from_str(include_str!("../data/sweeps-h200x4-ffd6dd6.json"))
        .expect("the stored sweeps parse")
}
