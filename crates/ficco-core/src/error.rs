//! The one error type of the core. Every variant names the problem and, where
//! it helps, what to do; the CLI prints it on one line.

use thiserror::Error;

/// Every operator's name, in the order the documentation lists them.
pub const OP_NAMES: [&str; 6] = [
    "ag-gemm",
    "gemm-rs",
    "gemm-ar",
    "a2a-gemm",
    "gemm-a2a",
    "concurrent",
];

/// Errors a user's input or a plan can cause in the pure core.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("invalid shape: {0}")]
    Shape(String),
    #[error("unknown operator '{0}' (expected one of: {known}){hint}", known = OP_NAMES.join(", "), hint = crate::suggest::did_you_mean(.0, OP_NAMES))]
    UnknownOp(String),
    #[error("unknown model '{name}' (known: {known}){}", crate::suggest::did_you_mean(name, known.split(", ")))]
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

/// A TOML parse error of `text` on one line: where (line and column) and
/// what, without the source excerpt toml quotes over several lines.
pub(crate) fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}
