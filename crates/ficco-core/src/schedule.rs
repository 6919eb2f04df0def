//! The design space: one `Schedule` is one point of it, with a canonical short
//! name that parses back to the same schedule.
//!
//! Grammar: `seq`, or `GRAN-ENGINE-ORDER[-2s][-smN][-hi]` where
//! GRAN is `shard`, `fineC` (C chunks per shard) or `bulk` (communication
//! per shard, but the GEMMs over peers' rows coalesced into at most two calls), ENGINE is `nccl` or `copy`,
//! ORDER is `ring` or `all`, `-2s` alternates GEMMs over two compute streams,
//! `-acc` fuses the reduction into the own block's GEMM (C += A·B: peers'
//! partials are summed first, then the own partial is added by the GEMM
//! epilogue, so no reduce kernel trails the last GEMM),
//! `-smN` asks cuBLASLt for an SM count target of N for every GEMM, and `-hi`
//! gives communication streams the device's greatest priority.

use crate::error::{Error, Result};
use crate::workload::{Op, Problem};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How finely the operator is decomposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Granularity {
    /// The sequential reference: one collective, one GEMM, no overlap.
    Seq,
    /// One step per peer shard (c = 1).
    Shard,
    /// Each shard split into c chunks (FiCCO), c >= 2.
    Fine(usize),
    /// Communication per shard, but the GEMMs over all peers' rows coalesced
    /// into at most two calls (the rows before and after the local shard):
    /// the local shard's GEMM hides the transfers, and the big GEMM avoids
    /// the wave-quantization loss of P small ones.
    Bulk,
}

impl Granularity {
    /// Chunks per shard (1 for `shard` and `seq`).
    pub fn chunks(self) -> usize {
        match self {
            Granularity::Seq | Granularity::Shard | Granularity::Bulk => 1,
            Granularity::Fine(c) => c,
        }
    }
}

/// Which hardware moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Engine {
    /// SM-based NCCL kernels (collectives or grouped send/recv).
    Nccl,
    /// DMA copy engines: peer-to-peer memcpy over NVLink, no SMs.
    Copy,
}

/// Which peers a step talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Order {
    /// Step s talks to one peer, staggered per rank ((r + s) mod P) so no peer is a hotspot.
    Ring,
    /// Each step talks to all peers at once, using every NVLink.
    All,
}

/// Stream priority of communication streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Priority {
    #[default]
    Normal,
    High,
}

/// One point of the design space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schedule {
    pub granularity: Granularity,
    pub engine: Engine,
    pub order: Order,
    /// Compute streams GEMMs alternate over (1 or 2).
    pub compute_streams: usize,
    /// gemm-rs / gemm-ar with pairwise transfers: add the own partial in the
    /// GEMM epilogue (beta = 1) instead of a trailing reduce kernel.
    #[serde(default)]
    pub fused_reduce: bool,
    /// cuBLASLt SM count target for every GEMM, if any.
    pub sm_target: Option<usize>,
    pub comm_priority: Priority,
}

/// Chunk counts of `fine(c)` in the enumerated space.
pub const FINE_CHUNKS: [usize; 3] = [2, 4, 8];

impl Schedule {
    /// The sequential reference schedule.
    pub const SEQ: Schedule = Schedule {
        granularity: Granularity::Seq,
        engine: Engine::Nccl,
        order: Order::Ring,
        compute_streams: 1,
        fused_reduce: false,
        sm_target: None,
        comm_priority: Priority::Normal,
    };

    pub fn is_seq(&self) -> bool {
        self.granularity == Granularity::Seq
    }

    /// The canonical short name (see the module doc).
    pub fn name(&self) -> String {
        let gran = match self.granularity {
            Granularity::Seq => return "seq".to_string(),
            Granularity::Shard => "shard".to_string(),
            Granularity::Bulk => "bulk".to_string(),
            Granularity::Fine(c) => format!("fine{c}"),
        };
        let engine = match self.engine {
            Engine::Nccl => "nccl",
            Engine::Copy => "copy",
        };
        let order = match self.order {
            Order::Ring => "ring",
            Order::All => "all",
        };
        let mut s = format!("{gran}-{engine}-{order}");
        if self.compute_streams == 2 {
            s.push_str("-2s");
        }
        if self.fused_reduce {
            s.push_str("-acc");
        }
        if let Some(sm) = self.sm_target {
            s.push_str(&format!("-sm{sm}"));
        }
        if self.comm_priority == Priority::High {
            s.push_str("-hi");
        }
        s
    }

    /// Whether this schedule exists for `op` at all (independent of sizes).
    pub fn applies_to(&self, op: Op) -> bool {
        // gemm-ar over NCCL has only per-chunk all-reduce; "all" would be the same plan.
        let ar_nccl = op == Op::GemmAr && self.engine == Engine::Nccl;
        if ar_nccl && self.order == Order::All {
            return false;
        }
        // Bulk coalesces per-peer GEMMs; the collective-per-chunk lowerings
        // (gemm-rs nccl-all, gemm-ar nccl) have none to coalesce.
        let rs_nccl_all =
            op == Op::GemmRs && self.engine == Engine::Nccl && self.order == Order::All;
        if self.granularity == Granularity::Bulk && (ar_nccl || rs_nccl_all) {
            return false;
        }
        // Only the pairwise lowerings end with a reduce to fuse.
        !(self.fused_reduce && (op == Op::AgGemm || ar_nccl || rs_nccl_all))
    }

    /// Why this schedule cannot run `problem`, or `None` when it fits.
    pub fn misfit(&self, problem: &Problem) -> Option<String> {
        if !self.applies_to(problem.op) {
            return Some(format!("{} has no {} schedule", problem.op, self.name()));
        }
        let p = problem.gpus;
        let c = self.granularity.chunks();
        if problem.m % (p * c) != 0 {
            return Some(format!(
                "m = {} is not divisible by gpus x chunks = {} x {}",
                problem.m, p, c
            ));
        }
        if let Some(sm) = self.sm_target {
            if sm == 0 {
                return Some("an SM target of 0 leaves the GEMM no SMs".into());
            }
        }
        None
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Schedule {
    type Err = Error;
    fn from_str(name: &str) -> Result<Self> {
        let bad = |reason: &str| Error::BadSchedule {
            name: name.to_string(),
            reason: reason.to_string(),
        };
        if name == "seq" {
            return Ok(Schedule::SEQ);
        }
        let mut parts = name.split('-');
        let granularity = match parts.next() {
            Some("shard") => Granularity::Shard,
            Some("bulk") => Granularity::Bulk,
            Some(g) if g.starts_with("fine") => {
                let c: usize = g[4..]
                    .parse()
                    .map_err(|_| bad("granularity 'fineC' needs a chunk count, e.g. fine4"))?;
                if c < 2 {
                    return Err(bad("fine needs at least 2 chunks (fine1 is 'shard')"));
                }
                Granularity::Fine(c)
            }
            _ => {
                return Err(bad(
                    "expected 'seq' or a name starting with shard- or fineC-",
                ))
            }
        };
        let engine = match parts.next() {
            Some("nccl") => Engine::Nccl,
            Some("copy") => Engine::Copy,
            _ => return Err(bad("second part must be the engine: nccl or copy")),
        };
        let order = match parts.next() {
            Some("ring") => Order::Ring,
            Some("all") => Order::All,
            _ => return Err(bad("third part must be the order: ring or all")),
        };
        let mut s = Schedule {
            granularity,
            engine,
            order,
            compute_streams: 1,
            fused_reduce: false,
            sm_target: None,
            comm_priority: Priority::Normal,
        };
        // Options must come in canonical order so that names are unique.
        let mut stage = 0;
        for opt in parts {
            if opt == "2s" && stage < 1 {
                s.compute_streams = 2;
                stage = 1;
            } else if opt == "acc" && stage < 2 {
                s.fused_reduce = true;
                stage = 2;
            } else if let Some(n) = opt.strip_prefix("sm").filter(|_| stage < 3) {
                let n: usize = n
                    .parse()
                    .map_err(|_| bad("'smN' needs an SM count, e.g. sm120"))?;
                if n == 0 {
                    return Err(bad("an SM target must be positive"));
                }
                s.sm_target = Some(n);
                stage = 3;
            } else if opt == "hi" && stage < 4 {
                s.comm_priority = Priority::High;
                stage = 4;
            } else {
                return Err(bad(
                    "options after the order are, in this order: -2s, -acc, -smN, -hi",
                ));
            }
        }
        Ok(s)
    }
}

/// Which optional controls the enumeration includes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceOptions {
    /// Add variants with comm priority `hi` and, for NCCL engines, a GEMM SM
    /// target that leaves `nccl_sms` SMs free.
    pub controls: bool,
    /// SMs of the device (for SM targets).
    pub sm_count: usize,
    /// SMs NCCL kernels occupy (the SM target leaves these free).
    pub nccl_sms: usize,
}

/// Every schedule of the design space that applies to `op`, `seq` first.
/// Size-dependent fit is not checked here: see [`Schedule::misfit`].
pub fn enumerate(op: Op, opts: SpaceOptions) -> Vec<Schedule> {
    let mut out = vec![Schedule::SEQ];
    let grans = [Granularity::Shard, Granularity::Bulk]
        .into_iter()
        .chain(FINE_CHUNKS.iter().map(|&c| Granularity::Fine(c)));
    for granularity in grans {
        for engine in [Engine::Nccl, Engine::Copy] {
            for order in [Order::Ring, Order::All] {
                for (compute_streams, fused_reduce) in
                    [(1, false), (2, false), (1, true), (2, true)]
                {
                    let base = Schedule {
                        granularity,
                        engine,
                        order,
                        compute_streams,
                        fused_reduce,
                        sm_target: None,
                        comm_priority: Priority::Normal,
                    };
                    if !base.applies_to(op) {
                        continue;
                    }
                    out.push(base);
                    if opts.controls {
                        out.push(Schedule {
                            comm_priority: Priority::High,
                            ..base
                        });
                        if engine == Engine::Nccl && opts.sm_count > opts.nccl_sms {
                            let sm = Some(opts.sm_count - opts.nccl_sms);
                            out.push(Schedule {
                                sm_target: sm,
                                ..base
                            });
                            out.push(Schedule {
                                sm_target: sm,
                                comm_priority: Priority::High,
                                ..base
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_enumerated_name_round_trips() {
        let opts = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 16,
        };
        for op in Op::ALL {
            let all = enumerate(op, opts);
            assert!(all.len() > 30, "{op}: {}", all.len());
            let mut names = std::collections::HashSet::new();
            for s in all {
                let name = s.name();
                assert_eq!(name.parse::<Schedule>().unwrap(), s, "{name}");
                assert!(names.insert(name.clone()), "duplicate name {name}");
            }
        }
    }

    #[test]
    fn names_look_as_documented() {
        let s: Schedule = "fine4-copy-all-2s-sm116-hi".parse().unwrap();
        assert_eq!(s.granularity, Granularity::Fine(4));
        assert_eq!(s.engine, Engine::Copy);
        assert_eq!(s.order, Order::All);
        assert_eq!(s.compute_streams, 2);
        assert_eq!(s.sm_target, Some(116));
        assert_eq!(s.comm_priority, Priority::High);
        assert_eq!(Schedule::SEQ.name(), "seq");
    }

    #[test]
    fn bad_names_say_why() {
        for bad in [
            "",
            "par",
            "fine",
            "fine1-copy-all",
            "fineX-copy-all",
            "shard-dma-all",
            "shard-copy-tree",
            "shard-copy-all-hi-2s",
            "shard-copy-all-sm0",
            "shard-copy-all-x",
        ] {
            let err = bad.parse::<Schedule>().unwrap_err();
            assert!(matches!(err, Error::BadSchedule { .. }), "{bad}: {err}");
            assert!(err.to_string().contains(&format!("'{bad}'")), "{err}");
        }
    }

    #[test]
    fn misfit_explains_divisibility() {
        let p = Problem::new(Op::AgGemm, 48, 64, 64, 4).unwrap();
        let s: Schedule = "fine8-copy-ring".parse().unwrap();
        let why = s.misfit(&p).unwrap();
        assert!(why.contains("not divisible"), "{why}");
        assert!("fine2-copy-ring"
            .parse::<Schedule>()
            .unwrap()
            .misfit(&p)
            .is_none());
    }
}
