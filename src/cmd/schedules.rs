//! `ficco schedules`: the design space of an operator, one canonical name per line.

use crate::args::{gpu_count, load_hw, DEFAULT_HW};
use crate::output::print;
use anyhow::{bail, Result};
use clap::Args;
use ficco_core::problem::workload::Op;
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::{enumerate, SpaceOptions};
use ficco_core::Error;

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct SchedulesArgs {
    /// Operator: ag-gemm, gemm-rs, gemm-ar, a2a-gemm, gemm-a2a or concurrent.
    #[arg(long)]
    op: String,
    /// Number of GPUs.
    #[arg(long)]
    gpus: i64,
    /// Include resource-control variants (comm priority, GEMM SM targets).
    #[arg(long)]
    controls: bool,
    /// Hardware profile (for SM targets): a built-in name or a TOML path.
    #[arg(long, default_value = DEFAULT_HW)]
    hw: String,
}

/// The design-space options a profile implies.
pub fn space(controls: bool, hw: &HwProfile) -> SpaceOptions {
    SpaceOptions {
        controls,
        sm_count: hw.sm_count,
        nccl_sms: hw.nccl_sms,
    }
}

pub fn run(args: SchedulesArgs) -> Result<()> {
    let op: Op = args.op.parse()?;
    let gpus = gpu_count(args.gpus)?;
    if gpus < 2 {
        bail!(Error::Shape(format!(
            "gpus must be at least 2 for a communication-dependent operator, got {gpus}"
        )));
    }
    let hw = load_hw(&args.hw)?;
    // Schedules that cannot run on this many GPUs whatever the shape are not listed.
    let all: Vec<_> = enumerate(op, space(args.controls, &hw))
        .into_iter()
        .filter(|s| s.gpus_misfit(gpus).is_none())
        .collect();
    let w = all.iter().map(|s| s.name().len()).max().unwrap_or(0);
    let mut text = format!(
        "# {} schedules of {op} on {gpus} GPUs (hardware profile '{}')\n# {:<w$}  description\n",
        all.len(),
        hw.name,
        "name",
    );
    for s in &all {
        text += &format!("{:<w$}  {}\n", s.name(), s.describe(gpus));
    }
    print(&text)
}
