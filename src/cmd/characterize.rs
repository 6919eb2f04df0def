//! `ficco characterize`: measures decomposition loss, contention loss and
//! communication curves on the GPUs, prints nccl-tests-like tables, and writes
//! the raw measurements (JSON) and a fitted hardware profile (TOML).

use crate::args::VerboseArg;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use ficco_core::sim::calibrate::{fit_profile, profile_toml, steps, tables, CharOptions};
use ficco_core::sim::profile::HwProfile;
use ficco_cuda::characterize::characterize;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct CharacterizeArgs {
    /// GPUs to use (0..P); curves are measured for every count 2..=P. Default: all.
    #[arg(long)]
    pub gpus: Option<i64>,
    /// Write the fitted hardware profile here (loads with `ficco explore --hw FILE`).
    #[arg(long, value_name = "PROFILE.toml")]
    pub out: Option<PathBuf>,
    /// Print JSON (every raw measurement and the fit) instead of the tables;
    /// with FILE, write it there and print the tables too.
    #[arg(long, value_name = "FILE.json", num_args = 0..=1)]
    pub json: Option<Option<PathBuf>>,
    /// Smaller grids and fewer iterations (about a minute on 4x H200).
    #[arg(long)]
    pub quick: bool,
    /// Built-in profile whose values are kept where nothing is measured.
    #[arg(long, default_value = "h200-nvlink")]
    pub base: String,
    #[command(flatten)]
    pub verbose: VerboseArg,
}

pub fn run(args: CharacterizeArgs) -> Result<()> {
    let base = HwProfile::load(&args.base)?;
    // Fail before any GPU work on unwritable outputs.
    let json_file = args.json.clone().flatten().filter(|p| p.as_os_str() != "-");
    for p in args.out.iter().chain(json_file.iter()) {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.is_dir() {
                bail!(
                    "cannot write '{}': no directory '{}'",
                    p.display(),
                    dir.display()
                );
            }
        }
    }
    ficco_cuda::loader::require().map_err(|e| {
        let hint = super::tried_hint(&e)
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        anyhow!("GPU backend not available: {}{hint}", super::gpu_reason(&e))
    })?;
    let found = ficco_cuda::info().gpus.len();
    let gpus = match args.gpus {
        None => found,
        Some(g) if g < 1 => bail!("gpus must be positive, got {g}"),
        Some(g) => g as usize,
    };
    if gpus == 0 {
        bail!("GPU backend not available: no CUDA GPU found");
    }
    if gpus > found {
        bail!("{gpus} GPUs requested but only {found} present");
    }
    let opts = CharOptions {
        gpus,
        quick: args.quick,
    };
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(steps(&opts) as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} {bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let log = !std::io::stderr().is_terminal();
    let mut ch = characterize(&opts, &mut |done, total, what| {
        bar.set_position(done as u64);
        bar.set_message(what.to_string());
        if log {
            eprintln!("[{done}/{total}] {what}");
        }
    })
    .map_err(|e| anyhow!("characterize failed: {e}"))?;
    bar.finish_and_clear();

    let name = args
        .out
        .as_ref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "characterized".into());
    let (hw, fit) = fit_profile(&base, &ch, &name);
    ch.fit = Some(fit);
    let text = profile_toml(&hw, &ch).map_err(|e| anyhow!("cannot write the profile: {e}"))?;
    // The written profile must load back.
    HwProfile::from_toml(&text).map_err(|e| anyhow!("fitted profile does not check: {e}"))?;
    if let Some(p) = &args.out {
        std::fs::write(p, &text).with_context(|| format!("cannot write '{}'", p.display()))?;
    }
    let json = serde_json::to_string_pretty(&ch)? + "\n";
    if let Some(p) = &json_file {
        std::fs::write(p, &json).with_context(|| format!("cannot write '{}'", p.display()))?;
    }
    if args.json.is_some() && json_file.is_none() {
        return crate::output::print(&json);
    }
    crate::output::print(&tables(&ch))
}
