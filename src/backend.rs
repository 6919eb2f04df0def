//! Wiring of the hardware profile, the predictor and the GPU measurer: the
//! only place the CLI touches the simulator and the GPU backend.

use anyhow::{anyhow, Result};
use ficco_core::measure::Measurer;
use ficco_core::plan::Plan;
use ficco_core::profile::HwProfile;
use ficco_core::timeline::Timeline;

/// The hardware profile: a built-in name or a TOML file path.
pub type Hw = HwProfile;

/// Loads `--hw`.
pub fn load_hw(spec: &str) -> Result<Hw> {
    Ok(HwProfile::load(spec)?)
}

/// The simulator's prediction of a plan.
pub fn predict(plan: &Plan, hw: &Hw) -> ficco_core::Result<Timeline> {
    ficco_core::sim::simulate(plan, hw)
}

pub fn gpu_measurer(_gpus: usize) -> Result<Box<dyn Measurer>> {
    Err(anyhow!(
        "GPU backend not available: the CUDA executor is not wired into this build yet"
    ))
}
