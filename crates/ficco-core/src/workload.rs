//! Workloads: the communication-dependent operators of MISSION.md and their
//! per-rank shapes. This is the "what must be computed" layer; nothing here
//! knows about schedules or hardware.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A communication-dependent operator. P is the number of GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Op {
    /// A shard [M/P, K] per rank, B [K, N]; out = AllGather(A) @ B = [M, N].
    #[serde(rename = "ag-gemm")]
    AgGemm,
    /// A [M, K], B [K, N] per rank; out = ReduceScatter(A @ B) = [M/P, N].
    #[serde(rename = "gemm-rs")]
    GemmRs,
    /// A [M, K], B [K, N] per rank; out = AllReduce(A @ B) = [M, N].
    #[serde(rename = "gemm-ar")]
    GemmAr,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::AgGemm, Op::GemmRs, Op::GemmAr];

    pub fn name(self) -> &'static str {
        match self {
            Op::AgGemm => "ag-gemm",
            Op::GemmRs => "gemm-rs",
            Op::GemmAr => "gemm-ar",
        }
    }

    /// The collective of the sequential reference.
    pub fn collective(self) -> Collective {
        match self {
            Op::AgGemm => Collective::AllGather,
            Op::GemmRs => Collective::ReduceScatter,
            Op::GemmAr => Collective::AllReduce,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Op::ALL
            .into_iter()
            .find(|op| op.name() == s)
            .ok_or_else(|| Error::UnknownOp(s.to_string()))
    }
}

/// NCCL collectives used by references and schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    AllGather,
    ReduceScatter,
    AllReduce,
}

impl Collective {
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllReduce => "all-reduce",
        }
    }
}

/// One operator instance: the global GEMM is [M, K] x [K, N] on `gpus` ranks (bf16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Problem {
    pub op: Op,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub gpus: usize,
}

/// Bytes per element: bf16 is the only type for now.
pub const ELEM_BYTES: usize = 2;

impl Problem {
    /// Checks the sizes any schedule needs; schedule-specific fit is checked at lowering.
    pub fn new(op: Op, m: usize, k: usize, n: usize, gpus: usize) -> Result<Self> {
        let p = Problem { op, m, k, n, gpus };
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("m", self.m), ("k", self.k), ("n", self.n)] {
            if v == 0 {
                return Err(Error::Shape(format!("{name} must be positive, got 0")));
            }
        }
        if self.gpus < 2 {
            return Err(Error::Shape(format!(
                "gpus must be at least 2 for a communication-dependent operator, got {}",
                self.gpus
            )));
        }
        if self.m < self.gpus {
            return Err(Error::Shape(format!(
                "m = {} is smaller than the GPU count {}: no schedule can split it",
                self.m, self.gpus
            )));
        }
        if self.m % self.gpus != 0 {
            return Err(Error::Shape(format!(
                "m = {} is not divisible by the GPU count {}",
                self.m, self.gpus
            )));
        }
        Ok(())
    }

    /// Rows of one rank's shard of M.
    pub fn shard_rows(&self) -> usize {
        self.m / self.gpus
    }

    /// Floating-point operations of the whole GEMM on one rank.
    pub fn gemm_flops(&self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }

    /// Payload of the reference collective per rank, in bytes (NCCL's "size").
    pub fn comm_bytes(&self) -> usize {
        match self.op {
            Op::AgGemm => self.m * self.k * ELEM_BYTES,
            Op::GemmRs | Op::GemmAr => self.m * self.n * ELEM_BYTES,
        }
    }

    /// Short label like "ag-gemm m=8192 k=8192 n=2560 P=4".
    pub fn label(&self) -> String {
        format!(
            "{} m={} k={} n={} P={}",
            self.op, self.m, self.k, self.n, self.gpus
        )
    }
}

/// A named problem, as in a suite file or a model preset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub name: String,
    pub problem: Problem,
}
