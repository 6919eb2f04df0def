//! The design space: one `Schedule` is one point of it, with a canonical short
//! name that parses back to the same schedule.
//!
//! Grammar: `seq`, or `GRAN-ENGINE-ORDER[-2s][-acc][-smN][-gcN][-occB][-ctaN][-hi]` where
//! GRAN is `shard`, `fineC` (C chunks per shard), `bulk` (communication
//! per shard, but the GEMMs over peers' rows coalesced into at most two calls)
//! or `tile` (one persistent GEMM launch for the whole operator, its row
//! blocks gated and drained by flags in device memory; copy engines only),
//! ENGINE is `nccl` or `copy`,
//! ORDER is `ring` or `all`, `-2s` alternates GEMMs over two compute streams,
//! `-acc` fuses the reduction into the own block's GEMM (C += A·B: peers'
//! partials are summed first, then the own partial is added by the GEMM
//! epilogue, so no reduce kernel trails the last GEMM),
//! `-smN` asks cuBLASLt for an SM count target of N for every GEMM, `-gcN`
//! runs compute streams on a green context of N SMs and communication on a
//! green context of the rest, `-occB` runs the GEMMs on ficco's own
//! tensor-core kernel with extra shared memory at launch so that at most B
//! blocks fit per SM (occupancy shaping, arXiv 2606.09200), `-ctaN` creates
//! the NCCL communicators with `maxCTAs = N`, and `-hi` gives communication
//! streams the device's greatest priority.
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
    /// Green context of this many SMs for compute streams (the rest for communication).
    #[serde(default)]
    pub green_sms: Option<usize>,
    /// GEMMs on ficco's shaped kernel, at most this many blocks per SM.
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

/// Tile edge (M and N) of ficco's shaped GEMM kernel.
pub const SHAPED_TILE: usize = 128;
/// K step of ficco's shaped GEMM kernel.
pub const SHAPED_K: usize = 32;

/// Most blocks per SM of `-occB` (Hopper runs at most 32 blocks per SM).
pub const MAX_OCCUPANCY: usize = 32;

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

    /// `-smN`: cuBLASLt SM count target N for every GEMM.
    pub const fn with_sm_target(self, sms: usize) -> Schedule {
        Schedule {
            sm_target: Some(sms),
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

    /// `-occB`: GEMMs on ficco's shaped kernel, at most B blocks per SM.
    pub const fn with_occupancy(self, blocks_per_sm: usize) -> Schedule {
        Schedule {
            occupancy: Some(blocks_per_sm),
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

    /// The cuBLASLt SM count target GEMMs run with: `-smN`, and under a green
    /// context at most its SM count. cuBLASLt sizes persistent grids for the
    /// whole device; on a green context of N SMs such a grid runs in two
    /// waves (measured 1.7x slower on H200) unless told the SM count.
    pub fn gemm_sm_target(&self) -> Option<usize> {
        match (self.sm_target, self.green_sms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether any resource control (SM target, green context, shaping,
    /// NCCL CTAs, priority) is set.
    pub fn has_controls(&self) -> bool {
        self.sm_target.is_some()
            || self.green_sms.is_some()
            || self.occupancy.is_some()
            || self.nccl_ctas.is_some()
            || self.comm_priority == Priority::High
    }

    /// The same schedule without resource controls.
    pub fn without_controls(&self) -> Schedule {
        Schedule {
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
        // `tile` is one launch of ficco's Hopper GEMM fed and drained by copy
        // engines: no NCCL, no second GEMM stream, no shaped kernel.
        if self.granularity == Granularity::Tile {
            return self.engine == Engine::Copy
                && self.compute_streams == 1
                && self.occupancy.is_none()
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
    ///   N ≤ the SM count; `-occB` needs 1 ≤ B ≤ [`MAX_OCCUPANCY`];
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
            if b > MAX_OCCUPANCY {
                return Some(format!("-occ{b}: at most {MAX_OCCUPANCY} blocks per SM"));
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
            let rows = crate::plan::lower::TILE_BLOCK_ROWS;
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
        // `concurrent` runs whole GEMMs; the dependent operators split M.
        let split = problem.op != Op::Concurrent;
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
        if let Some(b) = self.occupancy {
            let (m, n, k) = (problem.m, problem.n, problem.k);
            let rows = if split {
                problem.m / (p * c)
            } else {
                problem.m
            };
            if b == 0 || n % SHAPED_TILE != 0 || k % SHAPED_K != 0 || rows % SHAPED_TILE != 0 {
                return Some(format!(
                    "ficco's shaped GEMM needs M pieces and N multiples of {SHAPED_TILE} and K of {SHAPED_K} \
                     (m = {m} in pieces of {rows}, n = {n}, k = {k}) and at least 1 block per SM"
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
        for opt in parts {
            if opt == "2s" && stage < 1 {
                s.compute_streams = 2;
                stage = 1;
            } else if opt == "acc" && stage < 2 {
                s.fused_reduce = true;
                stage = 2;
            } else if opt.starts_with("sm") && stage < 3 {
                s.sm_target = Some(count(opt, "sm", "SM count")?);
                stage = 3;
            } else if opt.starts_with("gc") && stage < 4 {
                s.green_sms = Some(count(opt, "gc", "SM count")?);
                stage = 4;
            } else if opt.starts_with("occ") && stage < 5 {
                s.occupancy = Some(count(opt, "occ", "block count per SM")?);
                stage = 5;
            } else if opt.starts_with("cta") && stage < 6 {
                s.nccl_ctas = Some(count(opt, "cta", "CTA count")?);
                stage = 6;
            } else if opt == "hi" && stage < 7 {
                s.comm_priority = Priority::High;
                stage = 7;
            } else {
                return Err(bad(
                    "options after the order are, in this order: -2s, -acc, -smN, -gcN, -occB, -ctaN, -hi",
                ));
            }
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
        for op in Op::ALL.into_iter().chain([Op::Concurrent]) {
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
}
