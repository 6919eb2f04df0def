//! Arguments shared by several commands: one operator shape, one problem
//! (a shape or a model preset), the backend choice and the hardware profile.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use ficco_core::problem::models;
use ficco_core::problem::workload::{check_gpu_count, Op, Problem};
use ficco_core::sim::profile::HwProfile;
use ficco_core::Error;

/// The built-in hardware profile used when `--hw` is not given.
pub const DEFAULT_HW: &str = "h200-nvlink";

/// One operator shape: --op --m --k --n (with --gpus, declared beside it).
#[derive(Args, Debug, Clone)]
#[command(allow_negative_numbers = true)]
pub struct ShapeArgs {
    /// Operator: ag-gemm, gemm-rs, gemm-ar (with --m --k --n --gpus), or concurrent (explore).
    #[arg(long, requires_all = ["m", "k", "n", "gpus"])]
    pub op: Option<String>,
    /// Rows of the global GEMM (tokens).
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

/// One problem: --op --m --k --n --gpus, or --model --tokens --gpus (several layers).
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct ProblemArgs {
    #[command(flatten)]
    pub shape: ShapeArgs,
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
            let p = Problem::new(op, m, k, n, gpus)?;
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
