//! The `ficco` command line: thin commands over ficco-core and ficco-cuda.
//! `args` holds the arguments several commands share, `cmd/` one file per
//! command, `output` stdout and the files commands write.
//!
//! Flags are parsed and turned into validated scenarios and schedules before
//! anything runs; every error is printed as one line `error: ...` on stderr
//! with exit status 2.

mod args;
mod cmd;
mod output;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use output::one_line;

#[derive(Parser, Debug)]
#[command(
    name = "ficco",
    version,
    about = "Fine-grained compute-communication overlap on multi-GPU NVLink nodes",
    allow_negative_numbers = true
)]
struct Cli {
    /// `ficco --verbose COMMAND`, as earlier versions took it; the commands
    /// that use it (those that load the CUDA libraries) list it themselves.
    #[arg(long, hide = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the design space of schedules for an operator, one canonical name per line.
    Schedules(cmd::schedules::SchedulesArgs),
    /// Predict (and, on GPUs, measure) every schedule of a scenario, a model or a suite.
    #[command(mut_arg("op", |a| a.help(
        "Operator: ag-gemm, gemm-rs, gemm-ar (with --m --k --n --gpus), a2a-gemm or gemm-a2a \
         (also --experts --top-k), or concurrent (also --gemms --collective --bytes)"
    )))]
    Explore(Box<cmd::explore::ExploreArgs>),
    /// Describe the GPUs, their links and the CUDA libraries found.
    Info(cmd::info::InfoArgs),
    /// Pick a schedule without measuring (tuning cache, then the rule or model selector).
    Select(Box<cmd::select::SelectArgs>),
    /// Score the selectors and the simulator against measurements (a suite on GPUs, or saved JSON).
    Evaluate(Box<cmd::evaluate::EvaluateArgs>),
    /// Measure the top predicted schedules on GPUs and cache the winner for `select`.
    Tune(Box<cmd::tune::TuneArgs>),
    /// Measure decomposition loss, contention and communication curves on the GPUs; fit a hardware profile.
    Characterize(cmd::characterize::CharacterizeArgs),
    /// Benchmark ficco's own Hopper GEMM against cuBLASLt on one GPU (every GEMM shape of a suite's schedules).
    GemmBench(cmd::gemm_bench::GemmBenchArgs),
    /// Run every schedule many times on GPUs, graphs on and off, and count hangs and wrong results.
    Soak(Box<cmd::soak::SoakArgs>),
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
        eprintln!("ficco: warning: {}", one_line(&e.to_string()));
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

impl Command {
    /// `--verbose` and `--no-graph`, where the command has them.
    fn gpu_flags(&self) -> args::GpuRunArgs {
        let verbose = |v: args::VerboseArg| args::GpuRunArgs {
            verbose: v,
            no_graph: false,
        };
        match self {
            Command::Schedules(_) | Command::Select(_) => args::GpuRunArgs::default(),
            Command::Explore(a) => a.gpu,
            Command::Evaluate(a) => a.gpu,
            Command::Tune(a) => a.gpu,
            Command::Info(a) => verbose(a.verbose),
            Command::Characterize(a) => verbose(a.verbose),
            Command::GemmBench(a) => verbose(a.verbose),
            Command::Soak(a) => verbose(a.verbose),
        }
    }
}

fn run() -> Result<()> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            e.print()?;
            return Ok(());
        }
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                    | clap::error::ErrorKind::MissingSubcommand
            ) =>
        {
            bail!("a command is required: schedules, explore, info, characterize, select, evaluate, tune, gemm-bench or soak (see 'ficco --help')");
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
    let flags = cli.command.gpu_flags();
    if flags.no_graph {
        // Read by the GPU executor's run options; set before any thread starts.
        std::env::set_var(ficco_cuda::GRAPHS_ENV, "0");
    }
    // Every FICCO_* variable, read once, here: a bad value stops the command
    // before any work, naming the variable.
    ficco_core::settings::Settings::get()?;
    cmd::set_verbose(cli.verbose || flags.verbose.verbose);
    match cli.command {
        Command::Schedules(args) => cmd::schedules::run(args),
        Command::Explore(args) => cmd::explore::run(*args),
        Command::Info(args) => cmd::info::run(args),
        Command::Select(args) => cmd::select::run(*args),
        Command::Evaluate(args) => cmd::evaluate::run(*args),
        Command::Tune(args) => cmd::tune::run(*args),
        Command::Soak(args) => cmd::soak::run(*args),
        Command::Characterize(args) => cmd::characterize::run(args),
        Command::GemmBench(args) => cmd::gemm_bench::run(args),
    }
}
