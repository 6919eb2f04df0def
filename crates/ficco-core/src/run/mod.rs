//! The seam that runs plans: one [`Backend`] trait with two implementations,
//! the simulator ([`crate::sim::Simulator`]) and the GPU executor
//! (`ficco_cuda::GpuBackends`). Both take the same [`Plan`] and give the
//! same [`Measured`] with the same [`timeline::Timeline`], so predicted and
//! measured results line up row by row. Tests implement it with mocks.

pub mod timeline;

use crate::plan::Plan;
use crate::run::timeline::Timeline;

/// What measuring one plan on hardware gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Median over timed iterations, maximum over ranks, in ms.
    pub time_ms: f64,
    /// Max over ranks of ||out - ref|| / ||ref||; `None` when not checked
    /// (reference-only plans such as gemm-only or comm-only).
    pub max_rel_err: Option<f64>,
    /// False when the output was wrong: NaN left from poisoning, error over
    /// tolerance, or ranks that must agree that do not. A wrong plan's time
    /// must not be reported as if it were right.
    pub correct: bool,
    /// Per-task measured timeline, when asked for.
    pub timeline: Option<Timeline>,
    /// Host-side cost of launching the plan once, µs (median over timed
    /// iterations, maximum over ranks); `None` where nothing is launched.
    pub launch_us: Option<f64>,
    /// The fastest and the slowest timed iteration (each the maximum over
    /// ranks), in ms, beside the median `time_ms`; `None` where nothing
    /// iterates (the simulator).
    pub range_ms: Option<(f64, f64)>,
}

/// Warm-up and timed iterations of each measurement (`--warmup`, `--iters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iterations {
    /// Untimed iterations first.
    pub warmup: usize,
    /// Timed iterations (at least 1); the median is reported.
    pub timed: usize,
}

/// Error type of backends (a backend's own typed error, boxed).
pub type BackendError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A backend's answer that a plan cannot run there by design (not a
/// failure), e.g. NCCL schedules when every rank is on one GPU (loopback).
/// Reports list the schedule as skipped with this reason as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}

/// The skip reason of a backend error, when it is a [`Skip`].
pub fn skip_reason(e: &BackendError) -> Option<&str> {
    e.downcast_ref::<Skip>().map(|s| s.0.as_str())
}

/// Runs plans: simulated or on hardware.
pub trait Backend {
    /// Short backend name for reports ("sim", "gpu").
    fn name(&self) -> &str;
    /// True when running a plan again gives the same time (the simulator):
    /// then nothing is re-timed.
    fn deterministic(&self) -> bool {
        false
    }
    /// Device description for reports, e.g. "4x NVIDIA H200".
    fn device(&self) -> String;
    /// Prepares fresh random inputs and the sequential reference outputs for
    /// `plan.problem`; later `measure` calls on plans of the same problem are
    /// checked against it. `seq` is the lowered sequential plan.
    fn prepare(&mut self, seq: &Plan) -> Result<(), BackendError>;
    /// Checks (when `check`) and times `plan`; records a per-task timeline when `timeline`.
    fn measure(
        &mut self,
        plan: &Plan,
        check: bool,
        timeline: bool,
    ) -> Result<Measured, BackendError>;
    /// Sets the iterations of later measurements; a backend that does not
    /// iterate (the simulator) ignores them, and says so by returning false.
    fn set_iterations(&mut self, _iterations: Iterations) -> bool {
        false
    }
}
