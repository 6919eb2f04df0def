//! The simulator as a [`Backend`]: running a plan is predicting it on a
//! hardware profile.

use crate::plan::Plan;
use crate::run::timeline::Timeline;
use crate::run::{Backend, BackendError, Measured};
use crate::sim::profile::HwProfile;

/// The simulator with one hardware profile.
#[derive(Debug, Clone)]
pub struct Simulator {
    pub hw: HwProfile,
}

impl Simulator {
    pub fn new(hw: HwProfile) -> Self {
        Simulator { hw }
    }

    /// The predicted timeline of `plan`.
    pub fn predict(&self, plan: &Plan) -> crate::Result<Timeline> {
        crate::sim::simulate(plan, &self.hw)
    }

    /// The predicted time of `plan` as a timeline without spans: what
    /// [`Simulator::predict`] gives, less the per-task spans (where only
    /// the time is wanted, at large GPU counts it is the cheaper call).
    pub fn predict_total(&self, plan: &Plan) -> crate::Result<Timeline> {
        Ok(Timeline {
            name: plan.name.clone(),
            spans: vec![],
            total_ms: crate::sim::simulate_ms(plan, &self.hw)?,
        })
    }
}

impl Backend for Simulator {
    fn name(&self) -> &str {
        "sim"
    }

    fn deterministic(&self) -> bool {
        true
    }

    fn device(&self) -> String {
        self.hw.name.clone()
    }

    fn prepare(&mut self, _seq: &Plan) -> Result<(), BackendError> {
        Ok(())
    }

    fn measure(
        &mut self,
        plan: &Plan,
        _check: bool,
        timeline: bool,
    ) -> Result<Measured, BackendError> {
        let tl = self.predict(plan)?;
        Ok(Measured {
            time_ms: tl.total_ms,
            max_rel_err: None,
            correct: true,
            timeline: timeline.then_some(tl),
            launch_us: None,
            range_ms: None,
        })
    }
}
