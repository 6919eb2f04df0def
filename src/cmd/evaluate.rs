//! `ficco evaluate`: scores the selectors and the simulator against
//! measurements: a suite measured now (every valid schedule is the oracle),
//! or saved explore JSON.

use super::open_backend;
use crate::args::{load_hw, BackendArg, GpuRunArgs, DEFAULT_HW};
use crate::output::print;
use anyhow::{bail, Context, Result};
use clap::Args;
use ficco_core::choose::evaluate::{evaluate, Evaluation};
use ficco_core::choose::explore::{explore, schedules_for, ExploreOptions};
use ficco_core::problem::suite;
use ficco_core::report::{ScenarioReport, SuiteReport};
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::Simulator;
use ficco_core::space::{Schedule, SpaceOptions};
use ficco_core::Error;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct EvaluateArgs {
    /// Suite TOML to measure as the oracle (every valid schedule, on GPUs).
    #[arg(long, conflicts_with = "measured")]
    suite: Option<PathBuf>,
    /// Saved explore JSON to score offline (comma-separated files).
    #[arg(long, value_name = "FILE.json")]
    measured: Vec<String>,
    /// With --suite: gpu (measure), auto, loopback (every rank on GPU 0), or sim (the simulator is then its own oracle).
    #[arg(long, value_enum, default_value_t = BackendArg::Gpu)]
    backend: BackendArg,
    /// Hardware profile for the selectors and the simulator.
    #[arg(long, default_value = DEFAULT_HW)]
    hw: String,
    /// Also score the scenarios whose name starts with this (e.g. llama3-70b) apart.
    #[arg(long, value_name = "MODEL_PREFIX")]
    holdout: Option<String>,
    /// Print JSON instead of the table; with FILE, write it there and print the table too.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    json: Option<Option<PathBuf>>,
    /// With --suite: also write every measured schedule, in `explore --json`'s
    /// suite schema (what `--measured` and `bench/anchor.py report` read).
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    #[command(flatten)]
    pub gpu: GpuRunArgs,
}

/// Reads `--measured` files and checks what the evaluation relies on: a
/// valid problem, positive finite times, each scenario once. Unknown
/// schedule names and scenarios without a measured time are warned about
/// and left out; nothing measured at all is an error.
fn read_reports(files: &[PathBuf]) -> Result<Vec<ScenarioReport>> {
    let mut out: Vec<ScenarioReport> = vec![];
    let mut seen: std::collections::HashMap<String, String> = Default::default();
    for f in files {
        if f.as_os_str().is_empty() {
            bail!("--measured has an empty file name (a trailing or doubled comma?)");
        }
        let file = f.display().to_string();
        let text = std::fs::read_to_string(f)
            .map_err(|e| Error::Io(format!("cannot read '{file}': {e}")))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Io(format!("'{file}' is not JSON: {e}")))?;
        let reports: Vec<ScenarioReport> = if v.get("scenarios").is_some() {
            serde_json::from_value::<SuiteReport>(v)
                .map(|s| s.scenarios)
                .map_err(|e| Error::Io(format!("'{file}' is not an explore report: {e}")))?
        } else {
            vec![serde_json::from_value(v)
                .map_err(|e| Error::Io(format!("'{file}' is not an explore report: {e}")))?]
        };
        if reports.is_empty() {
            bail!("'{file}' has no scenario (its \"scenarios\" list is empty)");
        }
        for rep in reports {
            let sc = &rep.scenario;
            rep.problem()
                .validate()
                .with_context(|| format!("'{file}' scenario '{sc}'"))?;
            if let Some(first) = seen.insert(sc.clone(), file.clone()) {
                bail!("scenario '{sc}' appears twice (in '{first}' and '{file}'): each scenario must be measured once");
            }
            for r in &rep.schedules {
                if let Some(t) = r.time_ms {
                    if !(t.is_finite() && t > 0.0) {
                        bail!(
                            "'{file}' scenario '{sc}' schedule '{}': time_ms = {t} is not a positive time",
                            r.name
                        );
                    }
                }
                if r.name.parse::<Schedule>().is_err() {
                    eprintln!(
                        "ficco: warning: '{file}' scenario '{sc}': unknown schedule '{}' left out",
                        r.name
                    );
                }
            }
            if !rep.schedules.iter().any(|r| r.is_valid()) {
                eprintln!(
                    "ficco: warning: '{file}' scenario '{sc}' has no measured time; left out"
                );
                continue;
            }
            out.push(rep);
        }
    }
    if out.is_empty() {
        bail!(
            "no measured time in {}: every scenario's times are null or it ran no schedule",
            files
                .iter()
                .map(|f| format!("'{}'", f.display()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(out)
}

fn measure_suite(
    args: &EvaluateArgs,
    path: &std::path::Path,
    hw: &HwProfile,
) -> Result<Vec<ScenarioReport>> {
    let suite = suite::load(path)?;
    if suite.scenarios.is_empty() {
        bail!(Error::Suite(format!(
            "'{}': no scenario ficco can run",
            path.display()
        )));
    }
    for sc in &suite.scenarios {
        hw.check_fits(&sc.problem)?;
    }
    // Before minutes of measuring, not after.
    if let Some(h) = &args.holdout {
        if !suite
            .scenarios
            .iter()
            .any(|s| s.name.starts_with(h.as_str()))
        {
            bail!(holdout_matches_nothing(h));
        }
    }
    let max_gpus = suite
        .scenarios
        .iter()
        .map(|s| s.problem.gpus)
        .max()
        .unwrap_or(0);
    let mut backend = open_backend(args.backend, max_gpus, hw, None)?;
    let sim = Simulator::new(hw.clone());
    let predict = |plan: &ficco_core::plan::Plan| sim.predict_total(plan);
    let opts = ExploreOptions {
        select_hw: Some(hw.clone()),
        // The simulator backend and the predictor are one profile's.
        measure_is_prediction: backend.name() == "sim",
        ..Default::default()
    };
    let space = SpaceOptions::default();
    let mut reports = vec![];
    for sc in &suite.scenarios {
        let verb = if backend.name() == "sim" {
            "simulating"
        } else {
            "measuring"
        };
        eprintln!("ficco: {verb} {}", sc.name);
        let schedules = schedules_for(sc.problem.op, space, &[]);
        let ex = explore(sc, &schedules, &predict, backend.as_mut(), &opts)
            .with_context(|| format!("scenario '{}'", sc.name))?;
        reports.push(ex.report);
    }
    Ok(reports)
}

fn holdout_matches_nothing(h: &str) -> String {
    format!("--holdout '{h}' matches no scenario: give a prefix of a scenario name (e.g. llama3-70b), or leave it out")
}

pub fn run(args: EvaluateArgs) -> Result<()> {
    let hw = load_hw(&args.hw)?;
    if args.save.is_some() && args.suite.is_none() {
        bail!("--save writes what --suite measures; with --measured the measurements are already saved");
    }
    let reports = match (&args.suite, args.measured.is_empty()) {
        (Some(path), true) => {
            let reports = measure_suite(&args, path, &hw)?;
            if let Some(p) = &args.save {
                let text = serde_json::to_string_pretty(&SuiteReport {
                    scenarios: reports.clone(),
                })? + "\n";
                std::fs::write(p, text)
                    .map_err(|e| Error::Io(format!("cannot write '{}': {e}", p.display())))?;
            }
            reports
        }
        (None, false) => {
            // Split here rather than in clap, so that an empty name ("a.json,")
            // gets a message that says so.
            let files: Vec<PathBuf> = args
                .measured
                .iter()
                .flat_map(|m| m.split(','))
                .map(PathBuf::from)
                .collect();
            read_reports(&files)?
        }
        _ => bail!(
            "say what to evaluate: --suite FILE (measure) or --measured FILE.json[,FILE2.json]"
        ),
    };
    let ev: Evaluation = evaluate(&reports, &hw, args.holdout.as_deref())?;
    if let Some(h) = &args.holdout {
        if !ev
            .scenarios
            .iter()
            .any(|s| s.scenario.starts_with(h.as_str()))
        {
            bail!(holdout_matches_nothing(h));
        }
    }
    let text = serde_json::to_string_pretty(&ev)? + "\n";
    match &args.json {
        Some(None) => return print(&text),
        Some(Some(p)) if p.as_os_str() == "-" => return print(&text),
        Some(Some(p)) => std::fs::write(p, &text)
            .map_err(|e| Error::Io(format!("cannot write '{}': {e}", p.display())))?,
        None => {}
    }
    print(&ev.table())
}
