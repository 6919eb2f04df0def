//! Lowering: a schedule of a problem becomes a plan per rank.
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::schedule::Schedule;
use crate::workload::Problem;

/// Lowers `schedule` for `problem`. Fails with `DoesNotFit` when the schedule cannot run the shape.
pub fn lower(problem: &Problem, schedule: &Schedule) -> Result<Plan> {
    let _ = (problem, schedule);
    Err(Error::InvalidPlan("not yet".into()))
}
