//! `ficco tune`: measures the rule pick and the top predicted schedules on
//! the GPUs (`ficco_core::choose::autotune`) and caches the winner for `select`.

use crate::args::{load_hw, GpuRunArgs, ProblemArgs, DEFAULT_HW};
use crate::output::{one_line, print};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use ficco_core::choose::autotune;
use ficco_core::choose::tune::{self, TuneCache, TuneEntry, TuneKey};
use ficco_core::Error;
use ficco_cuda::info::device_and_software;
use serde_json::json;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TuneArgs {
    #[command(flatten)]
    problem: ProblemArgs,
    /// Measure this many of the best-predicted candidates (plus seq).
    #[arg(long, default_value_t = 4)]
    top: i64,
    /// Tuning cache to update (default: $XDG_CACHE_HOME/ficco/tune.json).
    #[arg(long, value_name = "FILE")]
    cache: Option<PathBuf>,
    /// Hardware profile used to rank the candidates.
    #[arg(long, default_value = DEFAULT_HW)]
    hw: String,
    /// Print JSON instead of the lines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub gpu: GpuRunArgs,
    #[command(flatten)]
    pub iter: crate::args::IterArgs,
}

pub fn run(args: TuneArgs) -> Result<()> {
    if args.top <= 0 {
        bail!(
            "--top must be positive (how many of the best predicted schedules to measure), got {}",
            args.top
        );
    }
    let top = args.top as usize;
    let problems = args.problem.problems()?;
    let hw = load_hw(&args.hw)?;
    for (_, p) in &problems {
        hw.check_fits(p)?;
    }
    let path = args.cache.clone().unwrap_or_else(tune::default_path);
    let max_gpus = problems.iter().map(|(_, p)| p.gpus).max().unwrap_or(0);
    let mut m = ficco_cuda::open(ficco_cuda::BackendChoice::Gpu, max_gpus, &hw)
        .map_err(|e| {
            let hint = super::tried_hint(&e)
                .map(|h| format!(" ({h})"))
                .unwrap_or_default();
            anyhow!(
                "tune measures on GPUs and none is usable: {}{hint}",
                super::gpu_reason(&e)
            )
        })?
        .backend;
    args.iter.apply(m.as_mut())?;
    let (mut cache, warn) = TuneCache::load(&path);
    if let Some(w) = warn {
        eprintln!("ficco: warning: {w} (it will be rewritten)");
    }
    let mut out = vec![];
    let mut text = String::new();
    for (name, p) in &problems {
        let t = autotune::tune(p, &hw, top, m.as_mut())?;
        for w in &t.warnings {
            eprintln!("ficco: warning: {}", one_line(w));
        }
        let (best, t, measured) = (t.best, t.time_ms, t.measured);
        let (device, software) = device_and_software(p.gpus)
            .unwrap_or_else(|| (m.device(), format!("ficco {}", env!("CARGO_PKG_VERSION"))));
        let entry = TuneEntry {
            key: TuneKey::new(p, &device, &software),
            schedule: best.clone(),
            time_ms: t,
            measured: measured.clone(),
        };
        text += &format!(
            "{name}: {best}  {t:.4} ms  (measured {} candidates on {device})\n",
            measured.len()
        );
        out.push(serde_json::to_value(&entry)?);
        cache.insert(entry);
    }
    cache.save(&path).map_err(|e| {
        Error::Io(format!(
            "cannot write the tuning cache '{}': {e}",
            path.display()
        ))
    })?;
    text += &format!("# cache: {}\n", path.display());
    if args.json {
        print(&(serde_json::to_string_pretty(&json!({"cache": path, "entries": out}))? + "\n"))
    } else {
        print(&text)
    }
}
