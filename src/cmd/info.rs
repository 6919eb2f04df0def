//! `ficco info`: the GPUs, their links and the CUDA libraries found.

use crate::output::print;
use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let info = ficco_cuda::info();
    if args.json {
        print(&(serde_json::to_string_pretty(&info)? + "\n"))
    } else {
        print(&format!("{info}\n"))
    }
}
