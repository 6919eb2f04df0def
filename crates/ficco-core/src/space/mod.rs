//! The design space: one `Schedule` is one point of it, with a canonical short
//! name that parses back to the same schedule.
//!
//! Grammar: `seq`, or `GRAN-ENGINE-ORDER[-2s][-acc][-own][-smN][-gcN][-occS][-ctaN][-hi]` where
//! GRAN is `shard`, `fineC` (C chunks per shard), `bulk` (communication
//! per shard, but the GEMMs over peers' rows coalesced into at most two calls)
//! or `tile` (one persistent launch of ficco's own GEMM for the whole
//! operator, its row blocks gated and drained by flags in device memory;
//! copy engines only; `-own` is implied and not written),
//! ENGINE is `nccl` or `copy`,
//! ORDER is `ring` or `all`, `-2s` alternates GEMMs over two compute streams,
//! `-acc` fuses the reduction into the own block's GEMM (C += A·B: peers'
//! partials are summed first, then the own partial is added by the GEMM
//! epilogue, so no reduce kernel trails the last GEMM),
//! `-own` runs every GEMM on ficco's own Hopper kernel (`ficco_cuda::hgemm`)
//! instead of cuBLASLt ([`GemmEngine`]), `-smN` runs every GEMM on ficco's
//! kernel with at most N persistent CTAs (its SM budget hook: the other SMs
//! stay free), `-gcN` runs compute streams on a green context of N SMs and
//! communication on a green context of the rest, `-occS` runs the GEMMs on
//! ficco's kernel with S pipeline stages (its occupancy hook: fewer stages
//! leave shared memory free beside each GEMM CTA for a communication
//! kernel's blocks; occupancy shaping, arXiv 2606.09200), `-ctaN` creates
//! the NCCL communicators with `maxCTAs = N`, and `-hi` gives communication
//! streams the device's greatest priority.
//!
//! `-smN` and `-occS` imply ficco's kernel, so `-own` is written only when
//! neither is there (and a name with `-own` and one of them is rejected: one
//! schedule, one name). Without `-own`, `-smN` or `-occS` GEMMs run on
//! cuBLASLt, told the green context's SM count under `-gcN`.
//!
//! The expert-parallel operators (`a2a-gemm`, `gemm-a2a`) use the same
//! grammar: `shard` is one step per source (dispatch) or destination
//! (combine) rank's block of routed rows, `fineC` cuts every block into C
//! chunks, `bulk` moves blocks per peer but computes the peers' blocks in
//! one grouped GEMM; they have no reduction to fuse (`-acc`) and no shaped
//! grouped GEMM (`-occS`).
//!
//! The `concurrent` operator (independent GEMMs beside a collective) has
//! `seq` (back to back), `shard-nccl-ring` (the collective on NCCL beside the
//! GEMMs) and `shard-copy-ring|all` (the collective on copy engines: pulls,
//! pushes and a reduce kernel), each with any of the controls.

mod describe;
mod enumerate;

pub use enumerate::{
    enumerate, SpaceOptions, CONTROL_NCCL_CTAS, CONTROL_OCCUPANCY, GREEN_SM_GRANULE,
};

use crate::error::{Error, Result};
use crate::problem::workload::{Op, Problem};
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
    /// Tile-level overlap: one persistent GEMM launch covers the whole
    /// operator; copy engines move chunks of rows and flags in device memory
    /// gate each block of GEMM rows on its arrival (ag-gemm) or announce each
    /// finished output block to the copy streams that drain it (gemm-rs,
    /// gemm-ar). The chunk size is derived from the shape
    /// ([`crate::plan::lower::tile_chunks`]). Copy engines only.
    Tile,
}

impl Granularity {
    /// Chunks per shard (1 for `shard` and `seq`; for `tile` the shape
    /// decides, see [`crate::plan::lower::tile_chunks`], and this is 1).
    pub fn chunks(self) -> usize {
        match self {
            Granularity::Seq | Granularity::Shard | Granularity::Bulk | Granularity::Tile => 1,
            Granularity::Fine(c) => c,
        }
    }

    /// The name's part: `seq`, `shard`, `bulk`, `fineC` or `tile`.
    pub fn name(self) -> String {
        match self {
            Granularity::Seq => "seq".to_string(),
            Granularity::Tile => "tile".to_string(),
            Granularity::Shard => "shard".to_string(),
            Granularity::Bulk => "bulk".to_string(),
            Granularity::Fine(c) => format!("fine{c}"),
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

impl Engine {
    /// The name's part: `nccl` or `copy`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Nccl => "nccl",
            Engine::Copy => "copy",
        }
    }
}

/// Which peers a step talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Order {
    /// Step s talks to one peer, staggered per rank ((r + s) mod P) so no peer is a hotspot.
    Ring,
    /// Each step talks to all peers at once, using every NVLink.
    All,
}

impl Order {
    /// The name's part: `ring` or `all`.
    pub fn name(self) -> &'static str {
        match self {
            Order::Ring => "ring",
            Order::All => "all",
        }
    }
}

/// Which library computes the GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum GemmEngine {
    /// cuBLASLt with the autotuned algorithm (the default).
    #[default]
    Cublas,
    /// ficco's own Hopper (sm_90a) kernel: TMA, wgmma, a persistent grid,
    /// with the SM budget and occupancy hooks `-smN` and `-occS` use.
    Own,
}

impl GemmEngine {
    /// A short word for tables and descriptions: `cublaslt` or `own`.
    pub fn name(self) -> &'static str {
        match self {
            GemmEngine::Cublas => "cublaslt",
            GemmEngine::Own => "own",
        }
    }
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
    /// Which library computes the GEMMs (`-own`; implied by `-smN` and `-occS`).
    #[serde(default)]
    pub gemm: GemmEngine,
    /// SM budget of ficco's GEMM kernel (at most this many persistent CTAs), if any.
    pub sm_target: Option<usize>,
    /// Green context of this many SMs for compute streams (the rest for communication).
    #[serde(default)]
    pub green_sms: Option<usize>,
    /// GEMMs on ficco's kernel with this many pipeline stages (occupancy shaping).
    #[serde(default)]
    pub occupancy: Option<usize>,
    /// NCCL communicators created with `maxCTAs` = this.
    #[serde(default)]
    pub nccl_ctas: Option<usize>,
    pub comm_priority: Priority,
}

/// Serde for a schedule as its canonical name (`#[serde(with =
/// "crate::space::by_name")]`), where JSON shows schedules as names.
pub mod by_name {
    use super::Schedule;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Schedule, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(&s.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Schedule, D::Error> {
        let name = String::deserialize(de)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// N and K of a GEMM on ficco's own kernel must be multiples of this (TMA
/// needs 16-byte rows; M is free).
pub const OWN_GEMM_ALIGN: usize = 8;

/// Fewest pipeline stages of `-occS` (ficco's kernel needs two to overlap
/// loads with math).
pub const MIN_OWN_STAGES: usize = 2;
/// Most pipeline stages of `-occS` (four 48 KiB stages of the wide tile fill
/// the 227 KiB a Hopper CTA may use).
pub const MAX_OWN_STAGES: usize = 4;

/// Chunk counts of `fine(c)` in the enumerated space.
pub const FINE_CHUNKS: [usize; 3] = [2, 4, 8];

/// Rows of one M-block of ficco's Hopper GEMM: `tile` chunks are whole
/// blocks, so no GEMM tile straddles two flags (a shard must hold whole
/// blocks for `tile` to fit a problem).
pub const TILE_BLOCK_ROWS: usize = 128;

impl Schedule {
    /// The sequential reference schedule.
    pub const SEQ: Schedule = Schedule {
        granularity: Granularity::Seq,
        engine: Engine::Nccl,
        order: Order::Ring,
        compute_streams: 1,
        fused_reduce: false,
        gemm: GemmEngine::Cublas,
        sm_target: None,
        green_sms: None,
        occupancy: None,
        nccl_ctas: None,
        comm_priority: Priority::Normal,
    };

    /// `GRAN-ENGINE-ORDER` with no options.
    pub const fn base(granularity: Granularity, engine: Engine, order: Order) -> Schedule {
        Schedule {
            granularity,
            engine,
            order,
            ..Schedule::SEQ
        }
    }

    /// `-2s` with `2`: GEMMs alternate over this many compute streams.
    pub const fn with_compute_streams(self, compute_streams: usize) -> Schedule {
        Schedule {
            compute_streams,
            ..self
        }
    }

    /// `-acc`: the reduction fused into the own block's GEMM.
    pub const fn with_fused_reduce(self) -> Schedule {
        Schedule {
            fused_reduce: true,
            ..self
        }
    }

    /// `-own`: every GEMM on ficco's own kernel.
    pub const fn with_own_gemm(self) -> Schedule {
        Schedule {
            gemm: GemmEngine::Own,
            ..self
        }
    }

    /// `-smN`: every GEMM on ficco's kernel with at most N persistent CTAs.
    pub const fn with_sm_target(self, sms: usize) -> Schedule {
        Schedule {
            sm_target: Some(sms),
            gemm: GemmEngine::Own,
            ..self
        }
    }

    /// `-gcN`: compute on a green context of N SMs, communication on the rest.
    pub const fn with_green_sms(self, sms: usize) -> Schedule {
        Schedule {
            green_sms: Some(sms),
            ..self
        }
    }

    /// `-occS`: GEMMs on ficco's kernel with S pipeline stages.
    pub const fn with_occupancy(self, stages: usize) -> Schedule {
        Schedule {
            occupancy: Some(stages),
            gemm: GemmEngine::Own,
            ..self
        }
    }

    /// `-ctaN`: NCCL communicators created with `maxCTAs = N`.
    pub const fn with_nccl_ctas(self, ctas: usize) -> Schedule {
        Schedule {
            nccl_ctas: Some(ctas),
            ..self
        }
    }

    /// `-hi` with [`Priority::High`]: the priority of communication streams.
    pub const fn with_comm_priority(self, comm_priority: Priority) -> Schedule {
        Schedule {
            comm_priority,
            ..self
        }
    }

    /// The SM count GEMMs are held to: `-smN` (ficco's kernel's SM budget),
    /// and under a green context at most its SM count. Persistent GEMMs
    /// (cuBLASLt's and ficco's) size their grids for the whole device; on a
    /// green context of N SMs such a grid runs in two waves (measured 1.7x
    /// slower on H200) unless told the SM count: cuBLASLt gets it as its SM
    /// count target, ficco's kernel as its SM budget.
    pub fn gemm_sm_target(&self) -> Option<usize> {
        match (self.sm_target, self.green_sms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether any resource control (GEMM engine, SM budget, green context,
    /// shaping, NCCL CTAs, priority) is set.
    pub fn has_controls(&self) -> bool {
        self.gemm == GemmEngine::Own
            || self.sm_target.is_some()
            || self.green_sms.is_some()
            || self.occupancy.is_some()
            || self.nccl_ctas.is_some()
            || self.comm_priority == Priority::High
    }

    /// The same schedule without resource controls.
    pub fn without_controls(&self) -> Schedule {
        Schedule {
            gemm: GemmEngine::Cublas,
            sm_target: None,
            green_sms: None,
            occupancy: None,
            nccl_ctas: None,
            comm_priority: Priority::Normal,
            ..*self
        }
    }

    pub fn is_seq(&self) -> bool {
        self.granularity == Granularity::Seq
    }

    /// The canonical short name (see the module doc).
    pub fn name(&self) -> String {
        if self.is_seq() {
            return "seq".to_string();
        }
        let mut s = format!(
            "{}-{}-{}",
            self.granularity.name(),
            self.engine.name(),
            self.order.name()
        );
        if self.compute_streams == 2 {
            s.push_str("-2s");
        }
        if self.fused_reduce {
            s.push_str("-acc");
        }
        if self.gemm == GemmEngine::Own && self.sm_target.is_none() && self.occupancy.is_none() {
            s.push_str("-own");
        }
        if let Some(sm) = self.sm_target {
            s.push_str(&format!("-sm{sm}"));
        }
        if let Some(n) = self.green_sms {
            s.push_str(&format!("-gc{n}"));
        }
        if let Some(b) = self.occupancy {
            s.push_str(&format!("-occ{b}"));
        }
        if let Some(n) = self.nccl_ctas {
            s.push_str(&format!("-cta{n}"));
        }
        if self.comm_priority == Priority::High {
            s.push_str("-hi");
        }
        s
    }

    /// Whether this schedule exists for `op` at all (independent of sizes).
    pub fn applies_to(&self, op: Op) -> bool {
        if op == Op::Concurrent {
            // One collective beside the GEMMs: nothing to chunk, fuse or
            // alternate; NCCL has one collective call, so no order.
            if self.is_seq() {
                return true;
            }
            return self.granularity == Granularity::Shard
                && self.compute_streams == 1
                && !self.fused_reduce
                && !(self.engine == Engine::Nccl && self.order == Order::All)
                && !(self.engine == Engine::Copy && self.nccl_ctas.is_some());
        }
        // Copy engines make no NCCL calls whose CTAs could be limited.
        if self.engine == Engine::Copy && self.nccl_ctas.is_some() {
            return false;
        }
        if op.is_moe() {
            // No reduction to fuse; ficco's own kernel has no grouped tile
            // scheduler yet, so grouped GEMMs stay on cuBLASLt (which also
            // rules out `-smN` and `-occS`, which imply the own kernel).
            return !self.fused_reduce
                && self.gemm == GemmEngine::Cublas
                && self.granularity != Granularity::Tile;
        }
        // `tile` is one launch of ficco's Hopper GEMM fed and drained by copy
        // engines: no NCCL, no second GEMM stream, no shaped kernel.
        if self.granularity == Granularity::Tile {
            return self.engine == Engine::Copy
                && self.compute_streams == 1
                && self.occupancy.is_none()
                // Always ficco's kernel: an explicit `-own` would name the same plan twice.
                && (self.gemm == GemmEngine::Cublas || self.sm_target.is_some())
                && !(self.fused_reduce && op == Op::AgGemm);
        }
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

    /// Why this schedule is outside the design space of `op` on a device of
    /// `space.sm_count` SMs, or `None` when it is inside. Names are parsed
    /// without a device; this is where their options meet one:
    ///
    /// * `fineC` needs C in [`FINE_CHUNKS`] (the chunk counts the space
    ///   enumerates; other counts are not modelled or tested);
    /// * `-smN` needs 1 ≤ N ≤ the SM count; `-gcN` a multiple of
    ///   [`GREEN_SM_GRANULE`] below the SM count (the rest runs communication);
    /// * `-ctaN` needs NCCL (copy-engine schedules make no NCCL calls) and
    ///   N ≤ the SM count; `-occS` needs [`MIN_OWN_STAGES`] ≤ S ≤ [`MAX_OWN_STAGES`];
    /// * and the schedule must exist for `op` ([`Schedule::applies_to`]).
    pub fn outside(&self, op: Op, space: SpaceOptions) -> Option<String> {
        if self.engine == Engine::Copy && self.nccl_ctas.is_some() {
            return Some("-ctaN: copy-engine schedules make no NCCL calls to limit".to_string());
        }
        if !self.applies_to(op) {
            return Some(format!("{op} has no such schedule"));
        }
        if let Granularity::Fine(c) = self.granularity {
            if !FINE_CHUNKS.contains(&c) {
                return Some(format!(
                    "fine{c}: the chunk count must be one of {FINE_CHUNKS:?}"
                ));
            }
        }
        let sms = space.sm_count;
        if let Some(n) = self.sm_target {
            if n == 0 || n > sms {
                return Some(format!(
                    "-sm{n}: the SM target must be 1 to {sms} (the device's SMs)"
                ));
            }
        }
        if let Some(n) = self.green_sms {
            if n % GREEN_SM_GRANULE != 0 || n == 0 || n >= sms {
                return Some(format!(
                    "-gc{n}: the green context must be a multiple of {GREEN_SM_GRANULE} SMs below {sms} (the device's SMs)"
                ));
            }
        }
        if let Some(n) = self.nccl_ctas {
            if self.engine == Engine::Copy {
                return Some(format!(
                    "-cta{n}: copy-engine schedules make no NCCL calls to limit"
                ));
            }
            if n > sms {
                return Some(format!("-cta{n}: at most {sms} CTAs (the device's SMs)"));
            }
        }
        if let Some(b) = self.occupancy {
            if !(MIN_OWN_STAGES..=MAX_OWN_STAGES).contains(&b) {
                return Some(format!(
                    "-occ{b}: ficco's GEMM runs {MIN_OWN_STAGES} to {MAX_OWN_STAGES} pipeline stages"
                ));
            }
        }
        None
    }

    /// Why this schedule cannot run on `gpus` GPUs whatever the shape, or
    /// `None`: `tile -acc` runs on 2 GPUs only (with more, the own block
    /// would wait for a reduce kernel that the persistent GEMM's waiting
    /// blocks leave no SMs for).
    pub fn gpus_misfit(&self, gpus: usize) -> Option<String> {
        (self.granularity == Granularity::Tile && self.fused_reduce && gpus != 2).then(|| {
            format!(
                "tile -acc runs on 2 GPUs only: with {gpus} the own block would wait for a reduce \
                 kernel that the persistent GEMM's waiting blocks leave no SMs for"
            )
        })
    }

    /// Why this schedule cannot run `problem`, or `None` when it fits.
    pub fn misfit(&self, problem: &Problem) -> Option<String> {
        if !self.applies_to(problem.op) {
            return Some(format!("{} has no {} schedule", problem.op, self.name()));
        }
        let p = problem.gpus;
        if self.granularity == Granularity::Tile {
            let rows = TILE_BLOCK_ROWS;
            if problem.m % (p * rows) != 0 {
                return Some(format!(
                    "tile needs shards of whole {rows}-row GEMM blocks: m = {} is not divisible by gpus x {rows} = {}",
                    problem.m,
                    p * rows
                ));
            }
        }
        if let Some(why) = self.gpus_misfit(p) {
            return Some(why);
        }
        let c = self.granularity.chunks();
        // `concurrent` runs whole GEMMs, and the MoE operators cut blocks of
        // any size (chunks may be uneven or empty); the dependent operators split M.
        let split = problem.op != Op::Concurrent && !problem.op.is_moe();
        if split && problem.m % (p * c) != 0 {
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
        if self.occupancy == Some(0) {
            return Some("-occ0: ficco's GEMM needs at least 2 pipeline stages".into());
        }
        if self.gemm == GemmEngine::Own {
            let (n, k) = (problem.n, problem.k);
            if n % OWN_GEMM_ALIGN != 0 || k % OWN_GEMM_ALIGN != 0 {
                return Some(format!(
                    "ficco's own GEMM needs N and K multiples of {OWN_GEMM_ALIGN} (n = {n}, k = {k})"
                ));
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
        if name.contains(',') || name.contains(char::is_whitespace) {
            return Err(bad(
                "that is several names: a schedule name has no ',' or space; give the names one at a time",
            ));
        }
        let mut parts = name.split('-');
        let granularity = match parts.next() {
            Some("shard") => Granularity::Shard,
            Some("tile") => Granularity::Tile,
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
                    "expected 'seq' or a name starting with shard-, bulk-, fineC- or tile-",
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
        let mut s = Schedule::base(granularity, engine, order);
        let count = |opt: &str, prefix: &str, what: &str| -> Result<usize> {
            match opt[prefix.len()..].parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(bad(&format!(
                    "'{prefix}N' needs a positive {what}, e.g. {prefix}8"
                ))),
            }
        };
        // Options must come in canonical order so that names are unique.
        let mut stage = 0;
        let mut own = false;
        for opt in parts {
            if opt == "2s" && stage < 1 {
                s.compute_streams = 2;
                stage = 1;
            } else if opt == "acc" && stage < 2 {
                s.fused_reduce = true;
                stage = 2;
            } else if opt == "own" && stage < 3 {
                own = true;
                s.gemm = GemmEngine::Own;
                stage = 3;
            } else if opt.starts_with("sm") && stage < 4 {
                s = s.with_sm_target(count(opt, "sm", "SM count")?);
                stage = 4;
            } else if opt.starts_with("gc") && stage < 5 {
                s.green_sms = Some(count(opt, "gc", "SM count")?);
                stage = 5;
            } else if opt.starts_with("occ") && stage < 6 {
                s = s.with_occupancy(count(opt, "occ", "pipeline stage count")?);
                stage = 6;
            } else if opt.starts_with("cta") && stage < 7 {
                s.nccl_ctas = Some(count(opt, "cta", "CTA count")?);
                stage = 7;
            } else if opt == "hi" && stage < 8 {
                s.comm_priority = Priority::High;
                stage = 8;
            } else {
                return Err(bad(
                    "options after the order are, in this order: -2s, -acc, -own, -smN, -gcN, -occS, -ctaN, -hi",
                ));
            }
        }
        if own && (s.sm_target.is_some() || s.occupancy.is_some()) {
            return Err(bad(
                "-smN and -occS already run ficco's own GEMM: drop -own",
            ));
        }
        Ok(s)
    }
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
        for op in Op::ALL.into_iter().chain([Op::Concurrent]).chain(Op::MOE) {
            let all = enumerate(op, opts);
            assert!(all.len() > 20, "{op}: {}", all.len());
            assert!(all.iter().all(|s| s.applies_to(op)), "{op}");
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
        let c: Schedule = "shard-nccl-ring-gc112-occ2-cta8-hi".parse().unwrap();
        assert_eq!(c.green_sms, Some(112));
        assert_eq!(c.occupancy, Some(2));
        assert_eq!(c.nccl_ctas, Some(8));
        assert!(c.has_controls());
        assert_eq!(c.without_controls().name(), "shard-nccl-ring");
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
            "shard-nccl-ring-cta0",
            "shard-nccl-ring-hi-cta8",
            "shard-nccl-ring-occ",
            "shard-nccl-ring-gcx",
            "shard-copy-ring-own-sm66",
            "shard-copy-ring-own-occ2",
            "shard-copy-ring-sm66-own",
            "shard-copy-ring-own-own",
            "shard-copy-ring-own-acc",
        ] {
            let err = bad.parse::<Schedule>().unwrap_err();
            assert!(matches!(err, Error::BadSchedule { .. }), "{bad}: {err}");
            assert!(err.to_string().contains(&format!("'{bad}'")), "{err}");
        }
    }

    #[test]
    fn builders_match_names() {
        let s = Schedule::base(Granularity::Fine(4), Engine::Copy, Order::Ring)
            .with_compute_streams(2)
            .with_fused_reduce();
        assert_eq!(s.name(), "fine4-copy-ring-2s-acc");
        let c = Schedule::base(Granularity::Shard, Engine::Nccl, Order::Ring)
            .with_sm_target(116)
            .with_green_sms(112)
            .with_occupancy(1)
            .with_nccl_ctas(8)
            .with_comm_priority(Priority::High);
        assert_eq!(c.name(), "shard-nccl-ring-sm116-gc112-occ1-cta8-hi");
        assert_eq!(c.name().parse::<Schedule>().unwrap(), c);
    }

    #[test]
    fn the_gemm_engine_is_in_the_name() {
        let s: Schedule = "fine4-copy-ring-2s-acc-own-gc64-hi".parse().unwrap();
        assert_eq!(s.gemm, GemmEngine::Own);
        assert_eq!(
            (s.sm_target, s.green_sms, s.occupancy),
            (None, Some(64), None)
        );
        assert_eq!(s.name(), "fine4-copy-ring-2s-acc-own-gc64-hi");
        // -smN and -occS imply the own engine and say so without -own.
        let s: Schedule = "shard-nccl-ring-sm116".parse().unwrap();
        assert_eq!((s.gemm, s.sm_target), (GemmEngine::Own, Some(116)));
        assert_eq!(s.name(), "shard-nccl-ring-sm116");
        let s = Schedule::base(Granularity::Bulk, Engine::Copy, Order::All).with_occupancy(2);
        assert_eq!(s.gemm, GemmEngine::Own);
        assert_eq!(s.name(), "bulk-copy-all-occ2");
        assert_eq!(s.name().parse::<Schedule>().unwrap(), s);
        // The engine is a control: plain overlap is cuBLASLt.
        let own = Schedule::base(Granularity::Shard, Engine::Copy, Order::Ring).with_own_gemm();
        assert!(own.has_controls());
        assert_eq!(own.without_controls().gemm, GemmEngine::Cublas);
        assert_eq!(own.without_controls().name(), "shard-copy-ring");
        assert_eq!(Schedule::SEQ.gemm, GemmEngine::Cublas);
    }

    #[test]
    fn own_engine_fit_and_stage_range() {
        let space = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 16,
        };
        let p = Problem::new(Op::AgGemm, 8, 12, 16, 2).unwrap();
        let own: Schedule = "shard-copy-ring-own".parse().unwrap();
        let why = own.misfit(&p).unwrap();
        assert!(
            why.contains("multiples of 8") && why.contains("k = 12"),
            "{why}"
        );
        // cuBLASLt takes the same shape; any M is fine for ficco's kernel.
        assert!(own.without_controls().misfit(&p).is_none());
        let p = Problem::new(Op::AgGemm, 6, 8, 16, 2).unwrap();
        assert!(own.misfit(&p).is_none());
        for (name, ok) in [
            ("shard-copy-ring-occ1", false),
            ("shard-copy-ring-occ2", true),
            ("shard-copy-ring-occ4", true),
            ("shard-copy-ring-occ5", false),
        ] {
            let s: Schedule = name.parse().unwrap();
            let why = s.outside(Op::AgGemm, space);
            assert_eq!(why.is_none(), ok, "{name}: {why:?}");
            if let Some(w) = why {
                assert!(w.contains("2 to 4 pipeline stages"), "{w}");
            }
        }
    }

    #[test]
    fn by_name_serializes_the_name() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Row {
            #[serde(with = "by_name")]
            schedule: Schedule,
        }
        let row = Row {
            schedule: "bulk-copy-all-hi".parse().unwrap(),
        };
        let text = serde_json::to_string(&row).unwrap();
        assert_eq!(text, r#"{"schedule":"bulk-copy-all-hi"}"#);
        assert_eq!(serde_json::from_str::<Row>(&text).unwrap(), row);
        assert!(serde_json::from_str::<Row>(r#"{"schedule":"warp-drive"}"#).is_err());
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

    #[test]
    fn a_list_is_not_a_name() {
        for list in ["shard-copy-ring,fine2-copy-all", "seq, shard-copy-ring"] {
            let e = list.parse::<Schedule>().unwrap_err().to_string();
            assert!(e.contains("that is several names"), "{e}");
        }
    }
}
