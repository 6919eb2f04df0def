//! Timelines: what ran where and when. The simulator predicts one and the GPU
//! executor measures one; both are this type, so they line up row by row.

use serde::{Deserialize, Serialize};

/// One task's execution interval, in milliseconds from the plan's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub rank: usize,
    pub stream: usize,
    /// Index of the task in its rank's plan.
    pub task: usize,
    pub label: String,
    /// "gemm", "copy", "all-gather", "send-recv", "reduce", ...
    pub kind: String,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// A whole plan's execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Timeline {
    /// Plan name (schedule name or reference name).
    pub name: String,
    pub spans: Vec<Span>,
    /// End of the last task over all ranks (the plan's time).
    pub total_ms: f64,
}

impl Timeline {
    /// Recomputes `total_ms` from the spans.
    pub fn finish(mut self) -> Self {
        self.total_ms = self.spans.iter().map(|s| s.end_ms).fold(0.0, f64::max);
        self
    }
}
