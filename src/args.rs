//! Arguments shared by several commands: one operator shape, one problem
//! (a shape or a model preset), the backend choice and the hardware profile.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use ficco_core::problem::models::{self, ModelSpec};
use ficco_core::problem::routing::{MoeSpec, Skew, DEFAULT_SEED};
use ficco_core::problem::workload::{check_gpu_count, Op, Problem, Scenario};
use ficco_core::run::Iterations;
use ficco_core::sim::profile::HwProfile;
use ficco_core::Error;

/// `--verbose`, on the commands that load the CUDA libraries.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct VerboseArg {
    /// Say more where something is missing: the file names tried for a CUDA library not found.
    #[arg(long)]
    pub verbose: bool,
}

/// `--verbose` and `--no-graph`, on the commands that measure plans on GPUs.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct GpuRunArgs {
    #[command(flatten)]
    pub verbose: VerboseArg,
    /// Issue every GPU iteration call by call instead of replaying it from a
    /// CUDA graph (graphs are the default where capture works).
    #[arg(long)]
    pub no_graph: bool,
}

/// `--iters` and `--warmup`: the iterations of each GPU measurement (as
/// nccl-tests' `-n` and `-w`).
#[derive(Args, Debug, Clone, Copy, Default)]
#[command(allow_negative_numbers = true)]
pub struct IterArgs {
    /// Timed iterations of each GPU measurement (default 20): the table's time
    /// is their median, min and max their range. The simulator does not iterate.
    #[arg(long, value_name = "N")]
    pub iters: Option<i64>,
    /// Untimed warm-up iterations before them (default 5).
    #[arg(long, value_name = "N")]
    pub warmup: Option<i64>,
}

impl IterArgs {
    /// The iterations asked for, when either flag was given (the other at
    /// its default).
    pub fn iterations(&self) -> Result<Option<Iterations>> {
        if self.iters.is_none() && self.warmup.is_none() {
            return Ok(None);
        }
        let timed = match self.iters.unwrap_or(20) {
            n if n < 1 => bail!("--iters must be at least 1 (the timed iterations), got {n}"),
            n => usize::try_from(n)?,
        };
        let warmup = match self.warmup.unwrap_or(5) {
            w if w < 0 => bail!("--warmup must be zero or positive, got {w}"),
            w => usize::try_from(w)?,
        };
        Ok(Some(Iterations { warmup, timed }))
    }

    /// Sets them on `backend`, saying on stderr where they do nothing.
    pub fn apply(&self, backend: &mut dyn ficco_core::run::Backend) -> Result<()> {
        if let Some(it) = self.iterations()? {
            if !backend.set_iterations(it) {
                eprintln!(
                    "ficco: --iters and --warmup apply to GPU measurements; the simulator ({}) does not iterate",
                    backend.name()
                );
            }
        }
        Ok(())
    }
}

/// The built-in hardware profile used when `--hw` is not given.
pub const DEFAULT_HW: &str = ficco_core::sim::profile::DEFAULT_PROFILE;

/// One operator shape: --op --m --k --n (with --gpus, declared beside it).
#[derive(Args, Debug, Clone)]
#[command(allow_negative_numbers = true)]
pub struct ShapeArgs {
    /// Operator: ag-gemm, gemm-rs, gemm-ar (with --m --k --n --gpus), or a2a-gemm or gemm-a2a (also --experts --top-k).
    #[arg(long, requires_all = ["m", "k", "n", "gpus"])]
    pub op: Option<String>,
    /// Rows of the global GEMM (tokens; for a2a-gemm and gemm-a2a the token count over all GPUs).
    #[arg(long, requires = "op")]
    pub m: Option<i64>,
    /// Inner dimension of the per-rank GEMM.
    #[arg(long, requires = "op")]
    pub k: Option<i64>,
    /// Columns of the per-rank GEMM.
    #[arg(long, requires = "op")]
    pub n: Option<i64>,
}

impl ShapeArgs {
    /// The operator and its validated (m, k, n), when --op was given.
    pub fn shape(&self) -> Result<Option<(Op, usize, usize, usize)>> {
        let Some(op) = &self.op else { return Ok(None) };
        Ok(Some((
            op.parse()?,
            positive("m", self.m.unwrap_or(0))?,
            positive("k", self.k.unwrap_or(0))?,
            positive("n", self.n.unwrap_or(0))?,
        )))
    }
}

/// The routing of the expert-parallel operators (a2a-gemm, gemm-a2a) and of
/// a model's MoE layers: --experts --top-k (operators only), --skew --seed.
#[derive(Args, Debug, Clone, Default)]
#[command(allow_negative_numbers = true)]
pub struct MoeArgs {
    /// a2a-gemm / gemm-a2a: experts over all GPUs (a multiple of --gpus).
    #[arg(long)]
    pub experts: Option<i64>,
    /// a2a-gemm / gemm-a2a: experts each token is routed to (1 to --experts).
    #[arg(long = "top-k")]
    pub top_k: Option<i64>,
    /// Routing imbalance of a2a-gemm / gemm-a2a or a model's MoE layers: none (default), moderate, heavy, or a Zipf exponent from 0 to 4.
    #[arg(long)]
    pub skew: Option<String>,
    /// Seed of the routing draw (default 1).
    #[arg(long)]
    pub seed: Option<i64>,
}

impl MoeArgs {
    fn skew(&self) -> Result<Skew> {
        Ok(match &self.skew {
            Some(s) => s.parse()?,
            None => Skew::NONE,
        })
    }

    fn seed(&self) -> Result<u64> {
        match self.seed {
            None => Ok(DEFAULT_SEED),
            Some(v) => u64::try_from(v).map_err(|_| {
                Error::Shape(format!("seed must be zero or positive, got {v}")).into()
            }),
        }
    }

    /// The problem of `--op` with this routing: a2a-gemm and gemm-a2a need
    /// --experts and --top-k; the other operators take none of these flags.
    pub fn problem(&self, op: Op, m: usize, k: usize, n: usize, gpus: usize) -> Result<Problem> {
        if !op.is_moe() {
            if self.experts.is_some()
                || self.top_k.is_some()
                || self.skew.is_some()
                || self.seed.is_some()
            {
                bail!(Error::Shape(format!(
                    "--experts, --top-k, --skew and --seed belong to a2a-gemm and gemm-a2a, not {op}"
                )));
            }
            return Ok(Problem::new(op, m, k, n, gpus)?);
        }
        let (Some(experts), Some(top_k)) = (self.experts, self.top_k) else {
            bail!(Error::Shape(format!(
                "--op {op} needs --experts E and --top-k K (and takes --skew and --seed)"
            )));
        };
        let spec = MoeSpec::new(
            positive("experts", experts)?,
            positive("top-k", top_k)?,
            self.skew()?,
            self.seed()?,
        );
        Ok(Problem::moe(op, m, k, n, gpus, spec)?)
    }

    /// Every layer of `model` for `tokens` on `gpus`, its MoE layers routed
    /// with --skew and --seed. Says on stderr when the MoE layers are left out.
    pub fn model_scenarios(
        &self,
        model: &ModelSpec,
        tokens: usize,
        gpus: usize,
    ) -> Result<Vec<Scenario>> {
        if self.experts.is_some() || self.top_k.is_some() {
            bail!(Error::Shape(format!(
                "--experts and --top-k come from the model ({} has {} experts, top-{})",
                model.name, model.experts, model.top_k
            )));
        }
        if model.experts <= 1 && (self.skew.is_some() || self.seed.is_some()) {
            bail!(Error::Shape(format!(
                "--skew and --seed set the routing of MoE layers, and {} has no experts",
                model.name
            )));
        }
        let scenarios = model.scenarios_routed(tokens, gpus, self.skew()?, self.seed()?)?;
        if let Some(why) = model.moe_misfit(gpus) {
            eprintln!("ficco: {why}");
        }
        Ok(scenarios)
    }
}

/// One problem: --op --m --k --n --gpus, or --model --tokens --gpus (several layers).
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct ProblemArgs {
    #[command(flatten)]
    pub shape: ShapeArgs,
    #[command(flatten)]
    pub moe: MoeArgs,
    /// Number of GPUs.
    #[arg(long)]
    pub gpus: Option<i64>,
    /// Model preset (llama3-8b, llama3-70b, ...): every layer of it (with --tokens --gpus).
    #[arg(long, conflicts_with = "op", requires_all = ["tokens", "gpus"])]
    pub model: Option<String>,
    /// Tokens (batch x sequence) for --model.
    #[arg(long, requires = "model")]
    pub tokens: Option<i64>,
}

impl ProblemArgs {
    /// (name, problem) pairs.
    pub fn problems(&self) -> Result<Vec<(String, Problem)>> {
        if self.shape.op.is_none() && self.model.is_none() {
            bail!("say which problem: --op OP --m M --k K --n N --gpus P, or --model NAME --tokens T --gpus P");
        }
        let gpus = gpu_count(self.gpus.unwrap_or(0))?;
        if let Some((op, m, k, n)) = self.shape.shape()? {
            if op == Op::Concurrent {
                bail!("--op concurrent (GEMMs beside an independent collective) has no schedule to select or tune: explore its controls with `ficco explore --op concurrent`");
            }
            let p = self.moe.problem(op, m, k, n, gpus)?;
            return Ok(vec![(p.label(), p)]);
        }
        if let Some(name) = &self.model {
            let tokens = positive("tokens", self.tokens.unwrap_or(0))?;
            let spec = models::preset(name)?;
            return Ok(self
                .moe
                .model_scenarios(&spec, tokens, gpus)?
                .into_iter()
                .map(|s| (s.name, s.problem))
                .collect());
        }
        bail!("say which problem: --op OP --m M --k K --n N --gpus P, or --model NAME --tokens T --gpus P")
    }
}

/// `--backend`: where plans run.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendArg {
    /// GPUs when available, else the simulator.
    Auto,
    /// The simulator with a hardware profile.
    Sim,
    /// Measure on GPUs (error when there are none).
    Gpu,
    /// Every rank on GPU 0 (loopback): copy-engine schedules run and are
    /// checked on one GPU, NCCL schedules are skipped, times are labelled
    /// loopback.
    Loopback,
}

impl From<BackendArg> for ficco_cuda::BackendChoice {
    fn from(b: BackendArg) -> Self {
        match b {
            BackendArg::Auto => ficco_cuda::BackendChoice::Auto,
            BackendArg::Sim => ficco_cuda::BackendChoice::Sim,
            BackendArg::Gpu => ficco_cuda::BackendChoice::Gpu,
            BackendArg::Loopback => ficco_cuda::BackendChoice::Loopback,
        }
    }
}

/// Loads `--hw`: a built-in profile name or a TOML file path.
pub fn load_hw(spec: &str) -> Result<HwProfile> {
    Ok(HwProfile::load(spec)?)
}

/// A size flag (a dimension or a count of the problem) that must be positive.
pub fn positive(name: &str, v: i64) -> Result<usize> {
    if v <= 0 {
        return Err(Error::Shape(format!("{name} must be positive, got {v}")).into());
    }
    Ok(usize::try_from(v)?)
}

/// The GPU count of `--gpus`: positive and at most `MAX_GPUS` (72).
pub fn gpu_count(v: i64) -> Result<usize> {
    let gpus = positive("gpus", v)?;
    check_gpu_count(gpus)?;
    Ok(gpus)
}
