//! The one error type of the core. Every variant names the problem and, where
//! it helps, what to do; the CLI prints it on one line.

use thiserror::Error;

/// Errors a user's input or a plan can cause in the pure core.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("invalid shape: {0}")]
    Shape(String),
    #[error("unknown operator '{0}' (expected one of: ag-gemm, gemm-rs, gemm-ar)")]
    UnknownOp(String),
    #[error("unknown model '{name}' (known: {known})")]
    UnknownModel { name: String, known: String },
    #[error("bad schedule name '{name}': {reason}")]
    BadSchedule { name: String, reason: String },
    #[error("schedule '{schedule}' does not fit this problem: {reason}")]
    DoesNotFit { schedule: String, reason: String },
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    #[error("hardware profile: {0}")]
    Profile(String),
    #[error("suite: {0}")]
    Suite(String),
    #[error("{0}")]
    Io(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
