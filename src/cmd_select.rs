//! `ficco select`, `ficco evaluate` and `ficco tune`: choosing a schedule
//! without measuring, scoring the choice against measurements, and caching
//! measured winners.

use crate::backend;
use crate::{one_line, positive, print, BackendChoice};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use ficco_core::choose::evaluate::{evaluate, Evaluation};
use ficco_core::choose::explore::{explore, schedules_for, ExploreOptions};
use ficco_core::choose::select::{self, Selector, DEFAULT_SELECTOR};
use ficco_core::choose::tune::{self, Lookup, TuneCache, TuneEntry, TuneKey};
use ficco_core::plan::lower;
use ficco_core::problem::models;
use ficco_core::problem::suite;
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::report::{ScenarioReport, SuiteReport};
use ficco_core::run::Measurer;
use ficco_core::space::{Schedule, SpaceOptions};
use ficco_core::Error;
use serde_json::json;
use std::path::PathBuf;

/// One problem: --op --m --k --n --gpus, or --model --tokens --gpus (several layers).
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct ProblemArgs {
    /// Operator: ag-gemm, gemm-rs or gemm-ar (with --m --k --n --gpus).
    #[arg(long, conflicts_with = "model", requires_all = ["m", "k", "n", "gpus"])]
    op: Option<String>,
    /// Rows of the global GEMM (tokens).
    #[arg(long, requires = "op")]
    m: Option<i64>,
    /// Inner dimension of the per-rank GEMM.
    #[arg(long, requires = "op")]
    k: Option<i64>,
    /// Columns of the per-rank GEMM.
    #[arg(long, requires = "op")]
    n: Option<i64>,
    /// Number of GPUs.
    #[arg(long)]
    gpus: Option<i64>,
    /// Model preset (llama3-8b, llama3-70b, ...): every layer of it (with --tokens --gpus).
    #[arg(long, requires_all = ["tokens", "gpus"])]
    model: Option<String>,
    /// Tokens (batch x sequence) for --model.
    #[arg(long, requires = "model")]
    tokens: Option<i64>,
}

impl ProblemArgs {
    /// (name, problem) pairs.
    fn problems(&self) -> Result<Vec<(String, Problem)>> {
        let gpus = positive("gpus", self.gpus.unwrap_or(0))?;
        if let Some(op) = &self.op {
            let op: Op = op.parse()?;
            let p = Problem::new(
                op,
                positive("m", self.m.unwrap_or(0))?,
                positive("k", self.k.unwrap_or(0))?,
                positive("n", self.n.unwrap_or(0))?,
                gpus,
            )?;
            return Ok(vec![(p.label(), p)]);
        }
        if let Some(name) = &self.model {
            let tokens = positive("tokens", self.tokens.unwrap_or(0))?;
            let spec = models::preset(name)?;
            return Ok(spec
                .scenarios(tokens, gpus)?
                .into_iter()
                .map(|s| (s.name, s.problem))
                .collect());
        }
        bail!("say which problem: --op OP --m M --k K --n N --gpus P, or --model NAME --tokens T --gpus P")
    }
}

#[derive(Args, Debug)]
pub struct SelectArgs {
    #[command(flatten)]
    problem: ProblemArgs,
    /// Hardware profile: a built-in name or a TOML path.
    #[arg(long, default_value = crate::DEFAULT_HW)]
    hw: String,
    /// Which selector: rules (the default, better on held-out measurements) or model.
    #[arg(long)]
    selector: Option<String>,
    /// Tuning cache consulted first (default: $XDG_CACHE_HOME/ficco/tune.json).
    #[arg(long, value_name = "FILE")]
    cache: Option<PathBuf>,
    /// Ignore the tuning cache.
    #[arg(long)]
    no_cache: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// "ficco VERSION; driver D; nccl N; cublaslt C" and the device of `gpus`
/// GPUs, or `None` when no GPU is visible.
fn device_and_software(gpus: usize) -> Option<(String, String)> {
    let info = ficco_cuda::info();
    let name = info.gpus.first()?.name.clone();
    if info.gpus.len() < gpus {
        return None;
    }
    let v = |x: Option<String>| x.unwrap_or_else(|| "none".into());
    let software = format!(
        "ficco {}; driver {}; nccl {}; cublaslt {}",
        env!("CARGO_PKG_VERSION"),
        v(info.driver_version.map(|x| x.to_string())),
        v(info.nccl_version.map(|x| x.to_string())),
        v(info.cublaslt_version.map(|x| x.to_string())),
    );
    Some((format!("{gpus}x {name}"), software))
}

pub fn cmd_select(args: SelectArgs) -> Result<()> {
    let selector: Selector = match &args.selector {
        Some(s) => s.parse()?,
        None => DEFAULT_SELECTOR,
    };
    let problems = args.problem.problems()?;
    let hw = backend::load_hw(&args.hw)?;
    let cache = if args.no_cache {
        None
    } else {
        let path = args.cache.clone().unwrap_or_else(tune::default_path);
        let (c, warn) = TuneCache::load(&path);
        if let Some(w) = warn {
            eprintln!("ficco: warning: {w}");
        }
        (!c.entries.is_empty()).then_some(c)
    };
    let mut out = vec![];
    let mut text = String::new();
    for (name, p) in &problems {
        let mut hit = None;
        if let Some(c) = &cache {
            match device_and_software(p.gpus) {
                Some((device, software)) => match c.lookup(&TuneKey::new(p, &device, &software)) {
                    Lookup::Hit(e) => hit = Some(e),
                    Lookup::Stale(w) => eprintln!("ficco: warning: {w}"),
                    Lookup::Miss => {}
                },
                None => {
                    if c.entries.iter().any(|e| e.key.problem == *p) {
                        eprintln!(
                            "ficco: warning: ignoring tuning entries for {}: no GPU here to check that they match this device",
                            p.label()
                        );
                    }
                }
            }
        }
        let (schedule, source, predicted, reason) = match hit {
            Some(e) => {
                let s: Schedule = e.schedule.parse()?;
                let pred = select::predict_ms(p, &s, &hw)?;
                let why = format!(
                    "measured winner in the tuning cache ({:.4} ms on {})",
                    e.time_ms, e.key.device
                );
                (e.schedule, "cache".to_string(), pred, why)
            }
            None => {
                let s = select::select(p, &hw, selector)?;
                (
                    s.schedule.name(),
                    selector.name().to_string(),
                    s.predicted_ms,
                    s.reason,
                )
            }
        };
        text += &format!("{name}: {schedule}  ({source}; predicted {predicted:.4} ms; {reason})\n");
        out.push(json!({
            "scenario": name, "op": p.op, "m": p.m, "k": p.k, "n": p.n, "gpus": p.gpus,
            "schedule": schedule, "selector": source, "predicted_ms": predicted, "reason": reason,
            "hardware": hw.name,
        }));
    }
    if args.json {
        let v = if out.len() == 1 {
            out.pop().unwrap()
        } else {
            json!({ "selections": out })
        };
        print(&(serde_json::to_string_pretty(&v)? + "\n"))
    } else {
        print(&text)
    }
}

#[derive(Args, Debug)]
pub struct EvaluateArgs {
    /// Suite TOML to measure as the oracle (every valid schedule, on GPUs).
    #[arg(long, conflicts_with = "measured")]
    suite: Option<PathBuf>,
    /// Saved explore JSON to score offline (comma-separated files).
    #[arg(long, value_delimiter = ',', value_name = "FILE.json")]
    measured: Vec<PathBuf>,
    /// With --suite: gpu (measure), auto or sim (the simulator is then its own oracle).
    #[arg(long, value_enum, default_value_t = BackendChoice::Gpu)]
    backend: BackendChoice,
    /// Hardware profile for the selectors and the simulator.
    #[arg(long, default_value = crate::DEFAULT_HW)]
    hw: String,
    /// Also score the scenarios whose name starts with this (e.g. llama3-70b) apart.
    #[arg(long, value_name = "MODEL_PREFIX")]
    holdout: Option<String>,
    /// Write the evaluation as JSON to this file ('-' for stdout instead of the table).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// With --suite: also write every measured schedule, in `explore --json`'s
    /// suite schema (what `--measured` and `bench/anchor.py report` read).
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
}

fn read_reports(files: &[PathBuf]) -> Result<Vec<ScenarioReport>> {
    let mut out = vec![];
    for f in files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Error::Io(format!("cannot read '{}': {e}", f.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Io(format!("'{}' is not JSON: {e}", f.display())))?;
        let reports: Vec<ScenarioReport> = if v.get("scenarios").is_some() {
            serde_json::from_value::<SuiteReport>(v)
                .map(|s| s.scenarios)
                .map_err(|e| {
                    Error::Io(format!("'{}' is not an explore report: {e}", f.display()))
                })?
        } else {
            vec![serde_json::from_value(v).map_err(|e| {
                Error::Io(format!("'{}' is not an explore report: {e}", f.display()))
            })?]
        };
        out.extend(reports);
    }
    if out.is_empty() {
        bail!("no scenario in {}", files.len());
    }
    Ok(out)
}

fn measure_suite(
    args: &EvaluateArgs,
    path: &std::path::Path,
    hw: &backend::Hw,
) -> Result<Vec<ScenarioReport>> {
    let suite = suite::load(path)?;
    if suite.scenarios.is_empty() {
        bail!(Error::Suite(format!(
            "'{}': no scenario ficco can run",
            path.display()
        )));
    }
    let max_gpus = suite
        .scenarios
        .iter()
        .map(|s| s.problem.gpus)
        .max()
        .unwrap_or(0);
    let mut measurer: Option<Box<dyn Measurer>> = match args.backend {
        BackendChoice::Sim => None,
        BackendChoice::Gpu => Some(backend::gpu_measurer(max_gpus)?),
        BackendChoice::Auto => match backend::gpu_measurer(max_gpus) {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!(
                    "ficco: {}; evaluating against the simulator itself",
                    one_line(&e.to_string())
                );
                None
            }
        },
    };
    let predict = |plan: &ficco_core::plan::Plan| backend::predict(plan, hw);
    let mut opts = ExploreOptions::new(&hw.name);
    opts.select_hw = Some(hw.clone());
    let space = SpaceOptions::default();
    let mut reports = vec![];
    for sc in &suite.scenarios {
        eprintln!("ficco: measuring {}", sc.name);
        let schedules = schedules_for(sc.problem.op, space, &[]);
        let ex = explore(
            sc,
            &schedules,
            &predict,
            measurer.as_deref_mut().map(|m| m as &mut dyn Measurer),
            &opts,
        )
        .with_context(|| format!("scenario '{}'", sc.name))?;
        reports.push(ex.report);
    }
    Ok(reports)
}

pub fn cmd_evaluate(args: EvaluateArgs) -> Result<()> {
    let hw = backend::load_hw(&args.hw)?;
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
        (None, false) => read_reports(&args.measured)?,
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
            bail!("--holdout '{h}' matches no scenario");
        }
    }
    let text = serde_json::to_string_pretty(&ev)? + "\n";
    match &args.json {
        Some(p) if p.as_os_str() == "-" => return print(&text),
        Some(p) => std::fs::write(p, &text)
            .map_err(|e| Error::Io(format!("cannot write '{}': {e}", p.display())))?,
        None => {}
    }
    print(&ev.table())
}

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
    #[arg(long, default_value = crate::DEFAULT_HW)]
    hw: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn cmd_tune(args: TuneArgs) -> Result<()> {
    let top = positive("top", args.top)?;
    let problems = args.problem.problems()?;
    let hw = backend::load_hw(&args.hw)?;
    let path = args.cache.clone().unwrap_or_else(tune::default_path);
    let max_gpus = problems.iter().map(|(_, p)| p.gpus).max().unwrap_or(0);
    let mut m = backend::gpu_measurer(max_gpus)
        .map_err(|e| anyhow!("tune measures on GPUs and none is usable: {e}"))?;
    let (mut cache, warn) = TuneCache::load(&path);
    if let Some(w) = warn {
        eprintln!("ficco: warning: {w} (it will be rewritten)");
    }
    let mut out = vec![];
    let mut text = String::new();
    for (name, p) in &problems {
        // Rank every candidate by prediction; measure the top k and seq.
        let mut ranked: Vec<(f64, Schedule)> = select::candidates(p)
            .into_iter()
            .filter(|s| !s.is_seq())
            .map(|s| Ok((select::predict_ms(p, &s, &hw)?, s)))
            .collect::<Result<_>>()?;
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        let rules = select::select_rules(p, &hw)?.schedule;
        let mut chosen: Vec<Schedule> = vec![Schedule::SEQ];
        if !rules.is_seq() {
            chosen.push(rules);
        }
        for (_, s) in ranked {
            if chosen.len() > top {
                break;
            }
            if !chosen.contains(&s) {
                chosen.push(s);
            }
        }
        let seq_plan = lower::lower(p, &Schedule::SEQ)?;
        m.prepare(&seq_plan)
            .map_err(|e| anyhow!("preparing {name}: {e}"))?;
        let mut measured = vec![];
        for s in &chosen {
            let plan = lower::lower(p, s)?;
            match m.measure(&plan, true, false) {
                Ok(x) if x.correct => measured.push((s.name(), x.time_ms)),
                Ok(_) => eprintln!(
                    "ficco: warning: {} gave a wrong result; not a candidate",
                    s.name()
                ),
                Err(e) => eprintln!(
                    "ficco: warning: {} failed: {}",
                    s.name(),
                    one_line(&e.to_string())
                ),
            }
        }
        let (best, t) = measured
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .cloned()
            .ok_or_else(|| anyhow!("{name}: no candidate could be measured"))?;
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
