//! Wiring of the hardware profile, the predictor and the GPU measurer: the
//! only place the CLI touches the simulator and the GPU backend.

use anyhow::{anyhow, Result};
use ficco_core::plan::Plan;
use ficco_core::run::timeline::Timeline;
use ficco_core::run::{MeasureError, Measured, Measurer};
use ficco_core::sim::profile::HwProfile;
use ficco_cuda::GpuBackend;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

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

/// The GPU measurer: one `GpuBackend` per GPU count (NCCL communicators
/// span exactly the plan's ranks), opened on first use. The largest count is
/// opened at once, so a machine without GPUs is detected before any work.
pub fn gpu_measurer(gpus: usize) -> Result<Box<dyn Measurer>> {
    let first = GpuBackend::open(gpus).map_err(|e| anyhow!("GPU backend not available: {e}"))?;
    let mut by_count = BTreeMap::new();
    by_count.insert(gpus, first);
    Ok(Box::new(PerGpuCount {
        by_count,
        current: gpus,
    }))
}

struct PerGpuCount {
    by_count: BTreeMap<usize, GpuBackend>,
    current: usize,
}

impl PerGpuCount {
    fn select(&mut self, gpus: usize) -> Result<&mut GpuBackend, MeasureError> {
        self.current = gpus;
        Ok(match self.by_count.entry(gpus) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(GpuBackend::open(gpus)?),
        })
    }
}

impl Measurer for PerGpuCount {
    fn backend(&self) -> &str {
        "gpu"
    }

    fn device(&self) -> String {
        self.by_count
            .get(&self.current)
            .map(|b| b.device())
            .unwrap_or_default()
    }

    fn prepare(&mut self, seq: &Plan) -> Result<(), MeasureError> {
        self.select(seq.problem.gpus)?.prepare(seq)
    }

    fn measure(
        &mut self,
        plan: &Plan,
        check: bool,
        timeline: bool,
    ) -> Result<Measured, MeasureError> {
        self.select(plan.problem.gpus)?
            .measure(plan, check, timeline)
    }
}
