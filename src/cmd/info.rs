//! `ficco info`: the GPUs, their links and the CUDA libraries: for each the
//! file and version, or why ficco cannot use it (not found, does not load,
//! lacks a function, wrong version). Exit status 0 whatever it finds: it
//! reports the machine; `--verbose` adds the file names tried.

use crate::args::VerboseArg;
use crate::output::print;
use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print JSON instead of the tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub verbose: VerboseArg,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let info = ficco_cuda::info();
    if args.json {
        return print(&(serde_json::to_string_pretty(&info)? + "\n"));
    }
    if super::verbose() {
        return print(&format!("{info:#}"));
    }
    let mut text = info.to_string();
    if info.libraries.all().iter().any(|l| !l.found) {
        text.push_str("# --verbose lists the file names tried\n");
    }
    print(&text)
}
