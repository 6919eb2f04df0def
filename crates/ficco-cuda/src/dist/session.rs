//! [`Session`]: one process's rank of a job, the runtime behind
//! `ficco explore --procs N`, `torchrun ... ficco explore` and the Python
//! ops. It joins the rendezvous, drives this process's GPU (or GPU 0 for
//! every rank, in loopback), keeps the plan buffers and signal flags in
//! memory shared with the node's other ranks, and runs plans: whole
//! measurements ([`Session::backend`]) or one operator on the caller's
//! device memory ([`Session::run_op`]).

use crate::backend::GpuBackend;
use crate::error::{CudaError, Result};
use ficco_core::problem::workload::Op;
use std::time::Duration;

use super::LaunchEnv;

/// How a process joins its job.
#[derive(Debug, Clone)]
pub struct SessionOpts {
    /// Every rank on GPU 0 (several processes on one GPU). `None`: loopback
    /// exactly when this node has more ranks than GPUs.
    pub loopback: Option<bool>,
    /// Bound of every rendezvous wait.
    pub timeout: Duration,
}

impl Default for SessionOpts {
    fn default() -> Self {
        SessionOpts {
            loopback: None,
            timeout: super::timeout_from_env(),
        }
    }
}

/// One call of an operator on device memory the caller owns (a PyTorch
/// tensor's storage), all bf16, row-major and contiguous, on this rank's
/// device. Shapes follow `ficco_core::problem::workload::Problem` (P ranks):
///
/// | op | `a` | `b` | `out` |
/// |---|---|---|---|
/// | `ag-gemm` | `[m/P, k]` this rank's shard | `[k, n]` | `[m, n]` = all_gather(a) @ b |
/// | `gemm-rs` | `[m, k]` | `[k, n]` | `[m/P, n]` = reduce_scatter(a @ b), rank r's rows |
/// | `gemm-ar` | `[m, k]` | `[k, n]` | `[m, n]` = all_reduce(a @ b) |
#[derive(Debug, Clone)]
pub struct OpCall<'a> {
    pub op: Op,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// A schedule name (`ficco schedules`), or `None` for the tuning cache's
    /// winner, else the rule selector's pick.
    pub schedule: Option<&'a str>,
    /// Device addresses of the operands.
    pub a: u64,
    pub b: u64,
    pub out: u64,
    /// The caller's stream (`CUstream`, 0 for the legacy default stream):
    /// the operator starts after the work queued on it and the caller's
    /// later work on it starts after the operator.
    pub stream: u64,
}

/// What a call ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpDone {
    /// The schedule that ran (its canonical name).
    pub schedule: String,
}

/// One process's rank of a job.
pub struct Session {
    backend: GpuBackend,
}

impl Session {
    /// Joins the job that `env` describes (see [`LaunchEnv::from_env`]):
    /// rendezvous, this rank's GPU (`LOCAL_RANK`, or 0 in loopback), the
    /// shared signal memory. Every rank of the job calls it.
    pub fn join(env: LaunchEnv, opts: SessionOpts) -> Result<Self> {
        let _ = (env, opts);
        Err(CudaError::Plan("Session::join: not built yet".into()))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        0
    }

    /// Ranks in the job.
    pub fn world(&self) -> usize {
        1
    }

    /// Whether every rank runs on one GPU.
    pub fn loopback(&self) -> bool {
        self.backend.is_loopback()
    }

    /// Whether every rank is on this node (copy and tile schedules need it).
    pub fn single_node(&self) -> bool {
        true
    }

    /// The CUDA device ordinal this rank drives.
    pub fn device(&self) -> usize {
        0
    }

    /// The measuring backend of this rank (every rank calls the same
    /// `prepare`/`measure` sequence; rank 0 gets the job's results).
    pub fn backend(&mut self) -> &mut GpuBackend {
        &mut self.backend
    }

    /// Runs one operator on the caller's memory (see [`OpCall`]); every
    /// rank of the job calls it with the same op, shapes and schedule.
    pub fn run_op(&mut self, call: &OpCall<'_>) -> Result<OpDone> {
        let _ = call;
        Err(CudaError::Plan("Session::run_op: not built yet".into()))
    }

    /// Leaves the job (a last barrier, then the store closes).
    pub fn close(self) -> Result<()> {
        Ok(())
    }
}
