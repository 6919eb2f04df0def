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

// TODO(lead): temporary stubs so the cli branch builds against the agreed
// signatures; main's lower.rs replaces this whole file at merge.
/// The GEMM of the whole problem alone (T_comp).
pub fn gemm_only(problem: &Problem) -> Plan {
    Plan {
        problem: *problem,
        name: "gemm-only".into(),
        schedule: None,
        ranks: vec![],
    }
}

/// The reference collective of the whole problem alone (T_comm).
pub fn comm_only(problem: &Problem) -> Plan {
    Plan {
        problem: *problem,
        name: "comm-only".into(),
        schedule: None,
        ranks: vec![],
    }
}
