//! Workloads: the operators ficco overlaps and their per-rank shapes. Three
//! are communication-dependent, a GEMM whose input or output goes through a
//! collective on P GPUs (`ag-gemm`: all-gather, then GEMM; `gemm-rs`: GEMM,
//! then reduce-scatter; `gemm-ar`: GEMM, then all-reduce), and one is not:
//! `concurrent`, independent GEMMs beside a collective. Two are the expert
//! parallelism of a mixture-of-experts layer (`a2a-gemm`: dispatch by
//! all-to-all, then the experts' grouped GEMM; `gemm-a2a`: the grouped GEMM,
//! then all-to-all back), with the token routing of
//! [`crate::problem::routing`]. This is the "what must be computed" layer;
//! nothing here knows about schedules or hardware.

use crate::error::{Error, Result};
use crate::problem::routing::{route, MoeSpec, Routing};
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
    /// `gemms` independent GEMMs [M, K] x [K, N] on every rank, beside one
    /// collective of `bytes` (see [`SideCollective`]); both results are kept.
    #[serde(rename = "concurrent")]
    Concurrent,
    /// MoE dispatch: each rank's routed rows [T/P·top_k, K] (sorted by
    /// expert) go to their experts' ranks by all-to-all; each rank then runs
    /// its E/P experts' GEMMs (B: E/P stacked [K, N] weights) over the rows
    /// it received, out = [received rows, N] (source-major).
    #[serde(rename = "a2a-gemm")]
    A2aGemm,
    /// MoE combine: each rank's expert GEMMs over the rows it holds
    /// ([received rows, K], source-major), then all-to-all back to the rows'
    /// home ranks: out = [T/P·top_k, N] in the home rank's expert order.
    #[serde(rename = "gemm-a2a")]
    GemmA2a,
}

impl Op {
    /// The communication-dependent operators.
    pub const ALL: [Op; 3] = [Op::AgGemm, Op::GemmRs, Op::GemmAr];

    /// The expert-parallel (mixture-of-experts) operators.
    pub const MOE: [Op; 2] = [Op::A2aGemm, Op::GemmA2a];

    /// Every operator, in the order the documentation lists them.
    pub const EVERY: [Op; 6] = [
        Op::AgGemm,
        Op::GemmRs,
        Op::GemmAr,
        Op::A2aGemm,
        Op::GemmA2a,
        Op::Concurrent,
    ];

    /// Whether this is an expert-parallel operator (it has a routing).
    pub fn is_moe(self) -> bool {
        matches!(self, Op::A2aGemm | Op::GemmA2a)
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::AgGemm => "ag-gemm",
            Op::GemmRs => "gemm-rs",
            Op::GemmAr => "gemm-ar",
            Op::Concurrent => "concurrent",
            Op::A2aGemm => "a2a-gemm",
            Op::GemmA2a => "gemm-a2a",
        }
    }

    /// The collective of the sequential reference (`None` for `concurrent`,
    /// whose collective is part of the problem: [`Problem::collective`], and
    /// for the MoE operators, whose all-to-all is grouped send/recv).
    pub fn collective(self) -> Option<Collective> {
        match self {
            Op::AgGemm => Some(Collective::AllGather),
            Op::GemmRs => Some(Collective::ReduceScatter),
            Op::GemmAr => Some(Collective::AllReduce),
            Op::Concurrent | Op::A2aGemm | Op::GemmA2a => None,
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
        Op::EVERY
            .into_iter()
            .find(|op| op.name() == s)
            .ok_or_else(|| Error::UnknownOp(s.to_string()))
    }
}

#[cfg(test)]
mod op_name_tests {
    use super::*;

    #[test]
    fn every_operator_is_named_in_the_error_list() {
        let names: Vec<&str> = Op::EVERY.iter().map(|o| o.name()).collect();
        assert_eq!(names, crate::error::OP_NAMES);
        for n in crate::error::OP_NAMES {
            assert_eq!(n.parse::<Op>().map(Op::name), Ok(n));
        }
        let e = "ag-gem".parse::<Op>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown operator 'ag-gem' (expected one of: ag-gemm, gemm-rs, gemm-ar, a2a-gemm, \
             gemm-a2a, concurrent); did you mean 'ag-gemm'?"
        );
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
    pub const ALL: [Collective; 3] = [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllReduce,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllReduce => "all-reduce",
        }
    }
}

impl FromStr for Collective {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Collective::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                Error::Shape(format!(
                    "unknown collective '{s}' (expected all-reduce, all-gather or reduce-scatter)"
                ))
            })
    }
}

/// The collective of a `concurrent` problem. `bytes` follows nccl-tests'
/// "size": the buffer of every rank for all-reduce, the gathered output for
/// all-gather (each rank contributes bytes / P), the input for
/// reduce-scatter (each rank keeps bytes / P). Buffers are bf16 rows of N
/// elements, so bytes / 2 must be a multiple of N x P.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SideCollective {
    /// Independent GEMMs on the compute stream.
    pub gemms: usize,
    pub collective: Collective,
    pub bytes: usize,
}

/// One operator instance: the global GEMM is [M, K] x [K, N] on `gpus` ranks (bf16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Problem {
    pub op: Op,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub gpus: usize,
    /// `concurrent` only: the GEMM count and the collective beside them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<SideCollective>,
    /// `a2a-gemm` and `gemm-a2a` only: experts, top-k, skew and seed of the
    /// routing (m is then the token count T).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSpec>,
}

/// Bytes per element: bf16 is the only type for now.
pub const ELEM_BYTES: usize = 2;

/// The largest GPU count ficco takes: 72, the largest NVLink domain (GB200
/// NVL72). The design space and the simulator model one NVLink domain in
/// which every GPU reaches every other over NVSwitch; beyond it GPUs talk
/// over the network, which ficco does not model.
pub const MAX_GPUS: usize = 72;

/// The most independent GEMMs of a `concurrent` problem (each is a task of
/// every rank's plan).
pub const MAX_SIDE_GEMMS: usize = 1024;

/// The largest buffer ficco takes, in bytes (1 PiB): far above any GPU's
/// memory, and low enough that no size derived from it (partials, bus bytes
/// over [`MAX_GPUS`] ranks) overflows 64-bit arithmetic.
pub const MAX_BUFFER_BYTES: usize = 1 << 50;

/// `a x b x ELEM_BYTES` checked against overflow and [`MAX_BUFFER_BYTES`].
fn buffer_bytes(what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .and_then(|e| e.checked_mul(ELEM_BYTES))
        .filter(|&bytes| bytes <= MAX_BUFFER_BYTES)
        .ok_or_else(|| {
            Error::Shape(format!(
                "{what} = {a} x {b} bf16 elements is larger than the {} TiB ficco supports per buffer",
                MAX_BUFFER_BYTES >> 40
            ))
        })
}

/// The error for a GPU count above [`MAX_GPUS`] (shared by every command).
pub fn check_gpu_count(gpus: usize) -> Result<()> {
    if gpus > MAX_GPUS {
        return Err(Error::Shape(format!(
            "gpus = {gpus} is more than {MAX_GPUS}, the largest NVLink domain (NVL72) ficco models; \
             give --gpus between 2 and {MAX_GPUS}"
        )));
    }
    Ok(())
}

impl Problem {
    /// Checks the sizes any schedule needs; schedule-specific fit is checked at lowering.
    pub fn new(op: Op, m: usize, k: usize, n: usize, gpus: usize) -> Result<Self> {
        if op == Op::Concurrent {
            return Err(Error::Shape(
                "--op concurrent also needs --gemms, --collective and --bytes".into(),
            ));
        }
        if op.is_moe() {
            return Err(Error::Shape(format!(
                "--op {op} also needs --experts and --top-k (and takes --skew and --seed)"
            )));
        }
        let p = Problem {
            op,
            m,
            k,
            n,
            gpus,
            side: None,
            moe: None,
        };
        p.validate()?;
        Ok(p)
    }

    /// `gemms` GEMMs [m, k] x [k, n] beside `collective` of `bytes` on `gpus` ranks.
    pub fn concurrent(
        gemms: usize,
        m: usize,
        k: usize,
        n: usize,
        collective: Collective,
        bytes: usize,
        gpus: usize,
    ) -> Result<Self> {
        let p = Problem {
            op: Op::Concurrent,
            m,
            k,
            n,
            gpus,
            side: Some(SideCollective {
                gemms,
                collective,
                bytes,
            }),
            moe: None,
        };
        p.validate()?;
        Ok(p)
    }

    /// An expert-parallel problem: `tokens` tokens over `gpus` ranks routed
    /// by `spec`, expert weights [k, n] (`op` is `a2a-gemm` or `gemm-a2a`).
    pub fn moe(
        op: Op,
        tokens: usize,
        k: usize,
        n: usize,
        gpus: usize,
        spec: MoeSpec,
    ) -> Result<Self> {
        if !op.is_moe() {
            return Err(Error::Shape(format!(
                "{op} takes no experts (only a2a-gemm and gemm-a2a do)"
            )));
        }
        let p = Problem {
            op,
            m: tokens,
            k,
            n,
            gpus,
            side: None,
            moe: Some(spec),
        };
        p.validate()?;
        Ok(p)
    }

    /// The routing of an expert-parallel problem (computed from its spec:
    /// the same counts every time), `None` for the other operators.
    pub fn routing(&self) -> Option<Routing> {
        let spec = self.moe.as_ref()?;
        (self.op.is_moe() && self.gpus > 0).then(|| route(self.m, self.gpus, spec))
    }

    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("m", self.m), ("k", self.k), ("n", self.n)] {
            if v == 0 {
                return Err(Error::Shape(format!("{name} must be positive, got 0")));
            }
        }
        check_gpu_count(self.gpus)?;
        buffer_bytes("m x k", self.m, self.k)?;
        buffer_bytes("k x n", self.k, self.n)?;
        buffer_bytes("m x n", self.m, self.n)?;
        if self.op == Op::Concurrent {
            return self.validate_concurrent();
        }
        if self.op.is_moe() {
            return self.validate_moe();
        }
        if self.moe.is_some() {
            return Err(Error::Shape(format!(
                "{} takes no experts (only a2a-gemm and gemm-a2a do)",
                self.op
            )));
        }
        if self.side.is_some() {
            return Err(Error::Shape(format!(
                "{} takes no side collective (only concurrent does)",
                self.op
            )));
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

    fn validate_moe(&self) -> Result<()> {
        let Some(spec) = self.moe else {
            return Err(Error::Shape(format!(
                "{} needs experts and top-k (and takes a skew and a seed)",
                self.op
            )));
        };
        if self.side.is_some() {
            return Err(Error::Shape(format!(
                "{} takes no side collective (only concurrent does)",
                self.op
            )));
        }
        if self.gpus < 2 {
            return Err(Error::Shape(format!(
                "gpus must be at least 2 for expert parallelism, got {}",
                self.gpus
            )));
        }
        if self.m % self.gpus != 0 {
            return Err(Error::Shape(format!(
                "tokens = {} is not divisible by the GPU count {}",
                self.m, self.gpus
            )));
        }
        spec.validate(self.gpus)?;
        // Routed rows of all ranks together bound every buffer's rows.
        let rows = self.m.checked_mul(spec.top_k).ok_or_else(|| {
            Error::Shape(format!(
                "tokens x top-k = {} x {} overflows",
                self.m, spec.top_k
            ))
        })?;
        buffer_bytes("routed rows x k", rows, self.k)?;
        buffer_bytes("routed rows x n", rows, self.n)?;
        buffer_bytes(
            "local experts x k x n",
            spec.experts / self.gpus * self.k,
            self.n,
        )?;
        Ok(())
    }

    fn validate_concurrent(&self) -> Result<()> {
        let Some(side) = self.side else {
            return Err(Error::Shape(
                "a concurrent problem needs gemms, a collective and bytes".into(),
            ));
        };
        if self.gpus < 2 {
            return Err(Error::Shape(format!(
                "gpus must be at least 2 for a collective, got {}",
                self.gpus
            )));
        }
        if side.gemms == 0 || side.gemms > MAX_SIDE_GEMMS {
            return Err(Error::Shape(format!(
                "gemms must be between 1 and {MAX_SIDE_GEMMS}, got {}",
                side.gemms
            )));
        }
        if side.bytes > MAX_BUFFER_BYTES {
            return Err(Error::Shape(format!(
                "bytes = {} is larger than the {} TiB ficco supports per buffer",
                side.bytes,
                MAX_BUFFER_BYTES >> 40
            )));
        }
        // n x gpus x 2 fits: n x k x 2 <= MAX_BUFFER_BYTES and gpus <= MAX_GPUS.
        let unit = ELEM_BYTES * self.n * self.gpus;
        if side.bytes == 0 || side.bytes % unit != 0 {
            return Err(Error::Shape(format!(
                "bytes = {} must be a positive multiple of 2 x n x gpus = {unit} \
                 (the collective's buffers are bf16 rows of n elements, split over the ranks)",
                side.bytes
            )));
        }
        Ok(())
    }

    /// Rows of one rank's shard of M.
    pub fn shard_rows(&self) -> usize {
        self.m / self.gpus
    }

    /// GEMMs on each rank (1 for the dependent operators).
    pub fn gemm_count(&self) -> usize {
        self.side.map_or(1, |s| s.gemms)
    }

    /// Floating-point operations of all the GEMMs on one rank (for the MoE
    /// operators, the busiest rank's: the most rows received).
    pub fn gemm_flops(&self) -> f64 {
        if let Some(r) = self.routing() {
            let rows = (0..self.gpus).map(|q| r.received(q)).max().unwrap_or(0);
            return 2.0 * rows as f64 * self.k as f64 * self.n as f64;
        }
        2.0 * self.m as f64 * self.k as f64 * self.n as f64 * self.gemm_count() as f64
    }

    /// The collective of the sequential reference.
    pub fn collective(&self) -> Collective {
        match (self.op.collective(), self.side) {
            (Some(c), _) => c,
            (None, Some(s)) => s.collective,
            // Unreachable for validated problems; all-reduce is a harmless default.
            (None, None) => Collective::AllReduce,
        }
    }

    /// Payload of the reference collective per rank, in bytes (NCCL's
    /// "size"; for the MoE operators, the all-to-all bytes of the busiest
    /// rank: the larger of what it sends to and receives from its peers).
    pub fn comm_bytes(&self) -> usize {
        match self.op {
            Op::AgGemm => self.m * self.k * ELEM_BYTES,
            Op::GemmRs | Op::GemmAr => self.m * self.n * ELEM_BYTES,
            Op::Concurrent => self.side.map_or(0, |s| s.bytes),
            Op::A2aGemm | Op::GemmA2a => {
                let Some(r) = self.routing() else { return 0 };
                let cols = if self.op == Op::A2aGemm {
                    self.k
                } else {
                    self.n
                };
                (0..self.gpus)
                    .map(|q| {
                        let out: usize = (0..self.gpus)
                            .filter(|&d| d != q)
                            .map(|d| r.pair(q, d))
                            .sum();
                        let inc: usize = (0..self.gpus)
                            .filter(|&s| s != q)
                            .map(|s| r.pair(s, q))
                            .sum();
                        out.max(inc)
                    })
                    .max()
                    .unwrap_or(0)
                    * cols
                    * ELEM_BYTES
            }
        }
    }

    /// `concurrent`: rows (of n elements) of the collective's (input, output) buffers per rank.
    pub fn side_rows(&self) -> (usize, usize) {
        let total = self.comm_bytes() / ELEM_BYTES / self.n;
        match self.collective() {
            Collective::AllReduce => (total, total),
            Collective::AllGather => (total / self.gpus, total),
            Collective::ReduceScatter => (total, total / self.gpus),
        }
    }

    /// Short label like "ag-gemm m=8192 k=8192 n=2560 P=4".
    pub fn label(&self) -> String {
        if let (Some(s), true) = (self.moe, self.op.is_moe()) {
            return format!(
                "{} tokens={} k={} n={} P={} experts={} top-{} skew={} seed={}",
                self.op, self.m, self.k, self.n, self.gpus, s.experts, s.top_k, s.skew, s.seed
            );
        }
        match self.side {
            Some(s) => format!(
                "concurrent {}x gemm m={} k={} n={} + {} {} MiB P={}",
                s.gemms,
                self.m,
                self.k,
                self.n,
                s.collective.name(),
                s.bytes as f64 / (1u64 << 20) as f64,
                self.gpus
            ),
            None => format!(
                "{} m={} k={} n={} P={}",
                self.op, self.m, self.k, self.n, self.gpus
            ),
        }
    }
}

/// A named problem, as in a suite file or a model preset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub name: String,
    pub problem: Problem,
}
