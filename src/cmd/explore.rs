//! `ficco explore`: every schedule of a scenario, a model or a suite, run
//! through a backend (the GPUs, or the simulator), as a table or JSON, with
//! optional trace and SVG files.

use super::open_backend;
use super::schedules::space;
use crate::args::{
    gpu_count, load_hw, positive, BackendArg, GpuRunArgs, MoeArgs, ShapeArgs, DEFAULT_HW,
};
use crate::output::{print, write_timelines};
use anyhow::{bail, Context, Result};
use clap::Args;
use ficco_core::choose::explore::{check_named, explore, schedules_for, ExploreOptions};
use ficco_core::problem::models::{self, ModelSpec};
use ficco_core::problem::suite;
use ficco_core::problem::workload::{Op, Problem, Scenario};
use ficco_core::report::{self, ScenarioReport, SuiteReport};
use ficco_core::sim::Simulator;
use ficco_core::space::Schedule;
use ficco_core::Error;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct ExploreArgs {
    #[command(flatten)]
    shape: ShapeArgs,
    #[command(flatten)]
    moe: MoeArgs,
    /// Number of GPUs.
    #[arg(long, conflicts_with = "suite")]
    gpus: Option<i64>,
    /// concurrent: independent GEMMs per GPU beside the collective.
    #[arg(long, default_value_t = 1)]
    gemms: i64,
    /// concurrent: the collective (all-reduce, all-gather or reduce-scatter).
    #[arg(long)]
    collective: Option<String>,
    /// concurrent: the collective's size in bytes (nccl-tests' "size").
    #[arg(long)]
    bytes: Option<i64>,
    /// Model preset (llama3-8b, llama3-70b, llama3-405b, mixtral-8x7b, qwen3-30b-a3b, deepseek-v2-lite); needs --tokens and --gpus. MoE models add their expert-parallel layers (--skew sets the routing imbalance).
    #[arg(long, conflicts_with_all = ["op", "suite", "hidden"], requires_all = ["tokens", "gpus"])]
    model: Option<String>,
    /// Tokens (batch x sequence) for --model or a custom model.
    #[arg(long)]
    tokens: Option<i64>,
    /// Custom model: hidden size (with --ffn --kv --tokens --gpus).
    #[arg(long, conflicts_with_all = ["op", "suite"], requires_all = ["ffn", "kv", "tokens", "gpus"])]
    hidden: Option<i64>,
    /// Custom model: FFN size.
    #[arg(long, requires = "hidden")]
    ffn: Option<i64>,
    /// Custom model: kv heads x head dim.
    #[arg(long, requires = "hidden")]
    kv: Option<i64>,
    /// Suite TOML file (e.g. suites/llama3.toml).
    #[arg(long, conflicts_with = "op")]
    suite: Option<PathBuf>,
    /// Where to run: auto (GPUs if present, else simulate), sim, gpu, or loopback (every rank on GPU 0).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Hardware profile for the simulator: a built-in name or a TOML path.
    #[arg(long, default_value = DEFAULT_HW)]
    hw: String,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Write a Chrome/Perfetto trace of the best schedule and seq.
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline comparing seq and the best schedule.
    #[arg(long, value_name = "FILE.svg")]
    svg: Option<PathBuf>,
    /// Include resource-control variants in the design space.
    #[arg(long)]
    controls: bool,
    /// Restrict to these schedules (repeat the flag, or separate names with
    /// commas); seq is always included.
    #[arg(long = "schedule", value_name = "NAME", value_delimiter = ',')]
    schedules: Vec<String>,
    /// Run as N processes, one rank each (the launcher variables torchrun
    /// sets; rank 0 prints the report). Under torchrun leave it out: the
    /// ranks find their place in the environment.
    #[arg(long, value_name = "N")]
    procs: Option<i64>,
    #[command(flatten)]
    pub gpu: GpuRunArgs,
    #[command(flatten)]
    pub iter: crate::args::IterArgs,
}

/// The scenarios the flags ask for, validated.
fn scenarios(args: &ExploreArgs) -> Result<Vec<Scenario>> {
    if let Some(path) = &args.suite {
        let m = &args.moe;
        if m.experts.is_some() || m.top_k.is_some() || m.skew.is_some() || m.seed.is_some() {
            bail!(Error::Shape(
                "--experts, --top-k, --skew and --seed do not apply to --suite: a suite file gives each scenario's routing".into()
            ));
        }
        let suite = suite::load(path)?;
        for s in &suite.skipped {
            eprintln!("ficco: skipped [[{}]] '{}': {}", s.kind, s.name, s.reason);
        }
        if suite.scenarios.is_empty() {
            bail!(Error::Suite(format!(
                "'{}': no scenario ficco can run",
                path.display()
            )));
        }
        return Ok(suite.scenarios);
    }
    let gpus = args.gpus.map(gpu_count).transpose()?;
    if let Some((op, m, k, n)) = args.shape.shape()? {
        let problem = if op == Op::Concurrent {
            let collective = args.collective.as_deref().ok_or_else(|| {
                Error::Shape("--op concurrent needs --collective (all-reduce, all-gather or reduce-scatter) and --bytes".into())
            })?;
            Problem::concurrent(
                positive("gemms", args.gemms)?,
                m,
                k,
                n,
                collective.parse()?,
                positive("bytes", args.bytes.unwrap_or(0))?,
                gpus.unwrap_or(0),
            )?
        } else {
            if args.collective.is_some() || args.bytes.is_some() {
                bail!(Error::Shape(format!(
                    "--collective and --bytes belong to --op concurrent, not {op}"
                )));
            }
            args.moe.problem(op, m, k, n, gpus.unwrap_or(0))?
        };
        return Ok(vec![Scenario {
            name: problem.label(),
            problem,
        }]);
    }
    let model = if let Some(name) = &args.model {
        models::preset(name)?
    } else if let Some(h) = args.hidden {
        ModelSpec::custom(
            None,
            positive("hidden", h)?,
            positive("ffn", args.ffn.unwrap_or(0))?,
            positive("kv", args.kv.unwrap_or(0))?,
        )?
    } else {
        bail!("say what to explore: --op OP --m M --k K --n N --gpus P, --model NAME --tokens T --gpus P, --hidden H --ffn F --kv KV --tokens T --gpus P, or --suite FILE");
    };
    let tokens = positive("tokens", args.tokens.unwrap_or(0))?;
    args.moe.model_scenarios(&model, tokens, gpus.unwrap_or(0))
}

/// `--procs N` runs one rank per process: the problem must be one of N
/// GPUs (a suite may hold others; they are skipped).
fn check_procs(n: usize, scenarios: &[Scenario]) -> Result<()> {
    if scenarios.iter().any(|s| s.problem.gpus == n) {
        return Ok(());
    }
    let mut gpus: Vec<usize> = scenarios.iter().map(|s| s.problem.gpus).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let gpus = gpus
        .iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(" or ");
    bail!("--procs {n} runs {n} ranks, one per GPU, but the problem is on {gpus} GPUs: give --procs {gpus} (the same count as --gpus), or leave --procs out")
}

pub fn run(args: ExploreArgs) -> Result<()> {
    let job = super::procs::job_env()?;
    if let (Some(t), Some(s)) = (&args.trace, &args.svg) {
        if t == s {
            bail!(
                "--trace and --svg name the same file '{}': give each its own",
                t.display()
            );
        }
    }
    let to_stdout: Vec<&str> = [("--trace", &args.trace), ("--svg", &args.svg)]
        .into_iter()
        .filter(|(_, p)| p.as_ref().is_some_and(|p| p.as_os_str() == "-"))
        .map(|(flag, _)| flag)
        .collect();
    if args.json {
        if let Some(flag) = to_stdout.first() {
            bail!("--json and {flag} - both write to stdout: give {flag} a file name, or leave out one of them");
        }
    }
    let stdout_files = to_stdout.len();
    let scenarios = scenarios(&args)?;
    if stdout_files > 0 && (scenarios.len() > 1 || stdout_files > 1) {
        bail!(
            "'-' (stdout) takes the trace or the SVG of one scenario; give file names for several"
        );
    }
    if let Some(n) = args.procs {
        if job.is_some() {
            bail!("--procs starts the ranks itself, but this process already is a rank of a job (RANK is set): leave --procs out under torchrun");
        }
        let n = positive("procs", n)?;
        check_procs(n, &scenarios)?;
        return super::procs::spawn(n);
    }
    // Rank 0 of a job prints the report and writes the files; the others
    // only run their part.
    let reporter = job.as_ref().is_none_or(|e| e.rank == 0);
    let only: Vec<Schedule> = args
        .schedules
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let hw = load_hw(&args.hw)?;
    for sc in &scenarios {
        hw.check_fits(&sc.problem)?;
    }
    let max_gpus = scenarios.iter().map(|s| s.problem.gpus).max().unwrap_or(0);
    let mut backend = open_backend(args.backend, max_gpus, &hw, job)?;
    args.iter.apply(backend.as_mut())?;
    let space = space(args.controls, &hw);
    let sim = Simulator::new(hw.clone());
    let timelines = args.trace.is_some() || args.svg.is_some();
    // Spans only where a trace or an SVG draws them.
    let predict = |plan: &ficco_core::plan::Plan| {
        if timelines {
            sim.predict(plan)
        } else {
            sim.predict_total(plan)
        }
    };
    let opts = ExploreOptions {
        select_hw: Some(hw.clone()),
        // The simulator backend and the predictor are one profile's.
        measure_is_prediction: backend.name() == "sim",
        timelines,
        ..Default::default()
    };
    let several = scenarios.len() > 1;

    let bar = if several && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(scenarios.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut reports: Vec<ScenarioReport> = vec![];
    let mut write_errors: Vec<String> = vec![];
    for sc in &scenarios {
        bar.set_message(sc.name.clone());
        check_named(sc.problem.op, space, &only)?;
        let schedules = schedules_for(sc.problem.op, space, &only);
        let ex = explore(sc, &schedules, &predict, backend.as_mut(), &opts)
            .with_context(|| format!("scenario '{}'", sc.name))?;
        if only.iter().all(|s| {
            ex.report
                .row(&s.name())
                .is_some_and(|r| r.skipped.is_some())
        }) && !only.is_empty()
            && !several
        {
            let why: Vec<String> = ex
                .report
                .schedules
                .iter()
                .filter_map(|r| Some(format!("{}: {}", r.name, r.skipped.as_ref()?)))
                .collect();
            bail!(Error::DoesNotFit {
                schedule: args.schedules.join(", "),
                reason: why.join("; "),
            });
        }
        // A file that cannot be written fails the command, but only after the table.
        let written = if reporter {
            write_timelines(args.trace.as_deref(), args.svg.as_deref(), &ex, several)
        } else {
            Ok(())
        };
        if let Err(e) = written {
            write_errors.push(format!("scenario '{}': {e:#}", sc.name));
        }
        reports.push(ex.report);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if !reporter {
        return Ok(());
    }

    let fail_writes = |write_errors: Vec<String>| -> Result<()> {
        if write_errors.is_empty() {
            return Ok(());
        }
        bail!("{}", write_errors.join("; "))
    };
    if stdout_files > 0 {
        // The file went to stdout: no table after it.
        return fail_writes(write_errors);
    }
    if args.json {
        let text = if several {
            serde_json::to_string_pretty(&SuiteReport { scenarios: reports })?
        } else {
            serde_json::to_string_pretty(&reports[0])?
        };
        print(&(text + "\n"))?;
        return fail_writes(write_errors);
    }
    let mut text = String::new();
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            text.push('\n');
        }
        text += &r.table();
        if let Some(rows) = report::ablation(r) {
            text += &report::ablation_table(&rows);
        }
    }
    if several {
        text.push('\n');
        text += &report::summarize(&reports).table();
    }
    print(&text)?;
    fail_writes(write_errors)
}
