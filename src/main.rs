//! The `ficco` command line: thin commands over ficco-core and ficco-cuda.
//!
//! Flags are parsed and turned into validated scenarios and schedules before
//! anything runs; every error is printed as one line `error: ...` on stderr
//! with exit status 2.

mod backend;
mod cmd_characterize;
mod cmd_select;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use ficco_core::choose::explore::{explore, schedules_for, ExploreOptions, Explored};
use ficco_core::problem::models::{self, ModelSpec};
use ficco_core::problem::suite;
use ficco_core::problem::workload::{Op, Problem, Scenario};
use ficco_core::report::{self, ScenarioReport, SuiteReport, TracePanel};
use ficco_core::run::Measurer;
use ficco_core::space::{enumerate, Schedule, SpaceOptions};
use ficco_core::Error;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

pub(crate) const DEFAULT_HW: &str = "h200-nvlink";

#[derive(Parser, Debug)]
#[command(
    name = "ficco",
    version,
    about = "Fine-grained compute-communication overlap on multi-GPU NVLink nodes",
    allow_negative_numbers = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the design space of schedules for an operator, one canonical name per line.
    Schedules(SchedulesArgs),
    /// Predict (and, on GPUs, measure) every schedule of a scenario, a model or a suite.
    Explore(Box<ExploreArgs>),
    /// Describe the GPUs, their links and the CUDA libraries found.
    Info(InfoArgs),
    /// Pick a schedule without measuring (tuning cache, then the rule or model selector).
    Select(Box<cmd_select::SelectArgs>),
    /// Score the selectors and the simulator against measurements (a suite on GPUs, or saved JSON).
    Evaluate(Box<cmd_select::EvaluateArgs>),
    /// Measure the top predicted schedules on GPUs and cache the winner for `select`.
    Tune(Box<cmd_select::TuneArgs>),
    /// Measure decomposition loss, contention and communication curves on the GPUs; fit a hardware profile.
    Characterize(cmd_characterize::CharacterizeArgs),
}

#[derive(Args, Debug)]
struct InfoArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
struct SchedulesArgs {
    /// Operator: ag-gemm, gemm-rs, gemm-ar or concurrent.
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BackendChoice {
    /// GPUs when available, else the simulator.
    Auto,
    /// The simulator with a hardware profile.
    Sim,
    /// Measure on GPUs (error when there are none).
    Gpu,
}

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
struct ExploreArgs {
    /// Operator of a single scenario: ag-gemm, gemm-rs, gemm-ar (with --m --k --n --gpus) or
    /// concurrent (also --gemms --collective --bytes).
    #[arg(long, conflicts_with_all = ["model", "suite", "hidden"], requires_all = ["m", "k", "n", "gpus"])]
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
    #[arg(long, conflicts_with = "suite")]
    gpus: Option<i64>,
    /// concurrent: independent GEMMs per GPU beside the collective.
    #[arg(long, requires = "op", default_value_t = 1)]
    gemms: i64,
    /// concurrent: the collective (all-reduce, all-gather or reduce-scatter).
    #[arg(long, requires = "op")]
    collective: Option<String>,
    /// concurrent: the collective's size in bytes (nccl-tests' "size").
    #[arg(long, requires = "op")]
    bytes: Option<i64>,
    /// Model preset (llama3-8b, llama3-70b, llama3-405b, mixtral-8x7b); needs --tokens and --gpus.
    #[arg(long, conflicts_with_all = ["suite", "hidden"], requires_all = ["tokens", "gpus"])]
    model: Option<String>,
    /// Tokens (batch x sequence) for --model or a custom model.
    #[arg(long)]
    tokens: Option<i64>,
    /// Custom model: hidden size (with --ffn --kv --tokens --gpus).
    #[arg(long, conflicts_with = "suite", requires_all = ["ffn", "kv", "tokens", "gpus"])]
    hidden: Option<i64>,
    /// Custom model: FFN size.
    #[arg(long, requires = "hidden")]
    ffn: Option<i64>,
    /// Custom model: kv heads x head dim.
    #[arg(long, requires = "hidden")]
    kv: Option<i64>,
    /// Suite TOML file (e.g. suites/llama3.toml).
    #[arg(long)]
    suite: Option<PathBuf>,
    /// Where to run: auto (GPUs if present, else simulate), sim or gpu.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
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
    /// Restrict to these schedules (repeatable); seq is always included.
    #[arg(long = "schedule", value_name = "NAME")]
    schedules: Vec<String>,
}

fn main() {
    // A bug must still end as one line and exit status 2, never a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error (a bug in ficco){at}: {}",
            one_line(&msg)
        );
        std::process::exit(2);
    }));
    // Systems with only libnccl.so.2 (the pip wheel) get a private
    // libnccl.so link; this re-executes the program once when needed.
    if let Err(e) = ficco_cuda::nccl_soname_shim() {
        eprintln!("ficco: {}", one_line(&e.to_string()));
    }
    if let Err(e) = run() {
        let msg = e
            .chain()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(": ");
        eprintln!("error: {}", one_line(&msg));
        std::process::exit(2);
    }
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn run() -> Result<()> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            e.print()?;
            return Ok(());
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            bail!("a command is required: schedules, explore, info, characterize, select, evaluate or tune (see 'ficco --help')");
        }
        Err(e) => {
            // clap's message is a paragraph, then usage and a hint: keep the paragraph.
            let rendered = e.render().to_string();
            let paragraph = rendered
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            bail!("{}", paragraph.trim_start_matches("error: "));
        }
    };
    match cli.command {
        Command::Schedules(args) => cmd_schedules(args),
        Command::Explore(args) => cmd_explore(*args),
        Command::Info(args) => cmd_info(args),
        Command::Select(args) => cmd_select::cmd_select(*args),
        Command::Evaluate(args) => cmd_select::cmd_evaluate(*args),
        Command::Tune(args) => cmd_select::cmd_tune(*args),
        Command::Characterize(args) => cmd_characterize::cmd_characterize(args),
    }
}

fn cmd_info(args: InfoArgs) -> Result<()> {
    let info = ficco_cuda::info();
    if args.json {
        print(&(serde_json::to_string_pretty(&info)? + "\n"))
    } else {
        print(&format!("{info}\n"))
    }
}

/// Writes to stdout; a closed pipe (`ficco ... | head`) is not an error.
pub(crate) fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to stdout"),
    }
}

pub(crate) fn positive(name: &str, v: i64) -> Result<usize> {
    if v <= 0 {
        return Err(Error::Shape(format!("{name} must be positive, got {v}")).into());
    }
    Ok(usize::try_from(v)?)
}

fn space(controls: bool, hw: &backend::Hw) -> SpaceOptions {
    SpaceOptions {
        controls,
        sm_count: hw.sm_count,
        nccl_sms: hw.nccl_sms,
    }
}

fn cmd_schedules(args: SchedulesArgs) -> Result<()> {
    let op: Op = args.op.parse()?;
    let gpus = positive("gpus", args.gpus)?;
    if gpus < 2 {
        bail!(Error::Shape(format!(
            "gpus must be at least 2 for a communication-dependent operator, got {gpus}"
        )));
    }
    let hw = backend::load_hw(&args.hw)?;
    let all = enumerate(op, space(args.controls, &hw));
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

/// The scenarios the flags ask for, validated.
fn scenarios(args: &ExploreArgs) -> Result<Vec<Scenario>> {
    if let Some(path) = &args.suite {
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
    let gpus = args.gpus.map(|g| positive("gpus", g)).transpose()?;
    if let Some(op) = &args.op {
        let op: Op = op.parse()?;
        let (m, k, n) = (
            positive("m", args.m.unwrap_or(0))?,
            positive("k", args.k.unwrap_or(0))?,
            positive("n", args.n.unwrap_or(0))?,
        );
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
            Problem::new(op, m, k, n, gpus.unwrap_or(0))?
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
    Ok(model.scenarios(tokens, gpus.unwrap_or(0))?)
}

/// `out.json` → `out.SCENARIO.json` when several scenarios each write a file.
fn per_scenario_path(path: &Path, scenario: &str, several: bool) -> PathBuf {
    if !several {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{scenario}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{scenario}"),
    };
    path.with_file_name(name)
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|e| Error::Io(format!("cannot write '{}': {e}", path.display())).into())
}

fn write_timelines(args: &ExploreArgs, ex: &Explored, several: bool) -> Result<()> {
    let Some(seq) = &ex.seq else { return Ok(()) };
    let seq_names = report::stream_names(&seq.plan);
    let seq_panel = TracePanel {
        title: "seq",
        timeline: &seq.timeline,
        stream_names: &seq_names,
    };
    let best_title;
    let best_names;
    let mut panels = vec![];
    if let Some(best) = ex.best.as_ref().filter(|b| b.plan.name != "seq") {
        best_title = format!("best {}", best.plan.name);
        best_names = report::stream_names(&best.plan);
        panels.push(TracePanel {
            title: &best_title,
            timeline: &best.timeline,
            stream_names: &best_names,
        });
    }
    let scenario = &ex.report.scenario;
    if let Some(path) = &args.trace {
        // Best first (pid = rank), seq after (pid = 1000 + rank).
        let mut trace_panels = panels.clone();
        trace_panels.push(seq_panel);
        let trace = report::chrome_trace(&trace_panels);
        write_file(
            &per_scenario_path(path, scenario, several),
            &serde_json::to_string(&trace)?,
        )?;
    }
    if let Some(path) = &args.svg {
        let mut svg_panels = vec![seq_panel];
        svg_panels.extend(panels);
        write_file(
            &per_scenario_path(path, scenario, several),
            &report::svg_gantt(&svg_panels),
        )?;
    }
    Ok(())
}

fn cmd_explore(args: ExploreArgs) -> Result<()> {
    let scenarios = scenarios(&args)?;
    let only: Vec<Schedule> = args
        .schedules
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let hw = backend::load_hw(&args.hw)?;
    let max_gpus = scenarios.iter().map(|s| s.problem.gpus).max().unwrap_or(0);
    let mut measurer: Option<Box<dyn Measurer>> = match args.backend {
        BackendChoice::Sim => None,
        BackendChoice::Gpu => Some(
            backend::gpu_measurer(max_gpus)
                .map_err(|e| anyhow::anyhow!("{e} (or run with --backend sim to simulate)"))?,
        ),
        BackendChoice::Auto => match backend::gpu_measurer(max_gpus) {
            Ok(m) => Some(m),
            Err(e) => {
                let reason = one_line(&e.to_string());
                let reason = reason
                    .strip_prefix("GPU backend not available: ")
                    .unwrap_or(&reason);
                // The list of file names searched belongs to --backend gpu's error, not this note.
                let reason = reason.split(" (searched:").next().unwrap_or(reason);
                eprintln!(
                    "ficco: no GPU backend available ({reason}); simulating with hardware profile '{}'",
                    hw.name
                );
                None
            }
        },
    };
    let space = space(args.controls, &hw);
    let predict = |plan: &ficco_core::plan::Plan| backend::predict(plan, &hw);
    let mut opts = ExploreOptions::new(&hw.name);
    opts.select_hw = Some(hw.clone());
    opts.timelines = args.trace.is_some() || args.svg.is_some();
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
    for sc in &scenarios {
        bar.set_message(sc.name.clone());
        let schedules = schedules_for(sc.problem.op, space, &only);
        let ex = explore(
            sc,
            &schedules,
            &predict,
            measurer.as_deref_mut().map(|m| m as &mut dyn Measurer),
            &opts,
        )
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
        write_timelines(&args, &ex, several)?;
        reports.push(ex.report);
        bar.inc(1);
    }
    bar.finish_and_clear();

    if args.json {
        let text = if several {
            serde_json::to_string_pretty(&SuiteReport { scenarios: reports })?
        } else {
            serde_json::to_string_pretty(&reports[0])?
        };
        return print(&(text + "\n"));
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
    print(&text)
}
