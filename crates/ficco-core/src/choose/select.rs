//! Schedule selection without measuring: two selectors over the base design
//! space (no resource-control variants).
//!
//! - [`Selector::Model`]: simulate the candidate schedules on the hardware
//!   profile ([`crate::sim`]) and take the fastest, preferring the simpler of
//!   near ties. It considers `seq` and the copy-engine schedules with one
//!   compute stream only: NCCL-beside-GEMM and two-GEMM contention are where
//!   the simulator is least trustworthy (see [`select_model_among`]).
//! - [`Selector::Rules`]: seven FiCCO-style rules over quantities a user can
//!   compute by hand from the cost model and the shape ([`RuleInputs`]): the
//!   compute-to-communication ratio T_comp / T_comm, the GPU count, waves of
//!   128x128 output tiles of a step's GEMM, the per-copy fixed cost, and
//!   whether the reduction can be fused into a GEMM. Each rule, and why it
//!   holds, is documented on [`rules`].
//!
//! The rules were derived on llama3-8b and scored on llama3-70b held out, on
//! the 4x H200 sweep with the fused-reduce schedules
//! (`ficco evaluate --measured bench/data/2026-11-21-h200x4-run4/... --holdout
//! llama3-70b`), and checked on run 3 and on a separate 2-GPU machine; every
//! threshold is a physical one (a GPU count, one full wave, T_comp = T_comm),
//! none is tuned to a shape. [`DEFAULT_SELECTOR`] is the one that scored
//! better held out, and it is what `explore` reports as `selected`.

use crate::error::{Error, Result};
use crate::plan::lower;
use crate::problem::workload::{Op, Problem};
use crate::sim;
use crate::sim::cost;
use crate::sim::profile::HwProfile;
use crate::space::{enumerate, Engine, Granularity, Order, Schedule, SpaceOptions};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Selector {
    /// Simulate the candidates, take the fastest (simplest of near ties).
    Model,
    /// The documented rules of [`rules`].
    Rules,
}

/// The selector `explore` uses for `selected` (the better one held out:
/// on run 4, rules 90% and model 66.7% of the held-out llama3-70b scenarios).
pub const DEFAULT_SELECTOR: Selector = Selector::Rules;

impl Selector {
    pub const ALL: [Selector; 2] = [Selector::Model, Selector::Rules];

    pub fn name(self) -> &'static str {
        match self {
            Selector::Model => "model",
            Selector::Rules => "rules",
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Selector {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Selector::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| Error::Io(format!("unknown selector '{s}' (expected model or rules)")))
    }
}

/// A selector's choice for one problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// Canonical schedule name.
    pub schedule: String,
    pub selector: Selector,
    /// The simulator's time of the chosen schedule, ms.
    pub predicted_ms: f64,
    /// Why, in one line (the rules that fired, or the model's margin).
    pub reason: String,
}

/// Edge of the square output tiles the rules count waves in.
pub const RULE_TILE: usize = 128;

/// The quantities the rules look at: the cost model's times of the two
/// halves of the sequential reference, and counts from the shape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RuleInputs {
    /// The whole GEMM alone, ms.
    pub t_comp_ms: f64,
    /// The reference collective alone, ms.
    pub t_comm_ms: f64,
    /// T_comp / T_comm.
    pub ratio: f64,
    /// Rows of one rank's shard, M / P.
    pub shard_rows: usize,
    /// Rows of a half-shard chunk, M / P / 2.
    pub chunk_rows: usize,
    /// 128-wide output tiles across N: ceil(N / 128).
    pub tile_cols: usize,
    /// SMs of the device.
    pub sm_count: usize,
    /// [`RuleInputs::waves`] of one shard's GEMM (c = 1).
    pub shard_waves: f64,
    /// [`RuleInputs::waves`] of a half-shard chunk's GEMM (c = 2): the
    /// decomposition-loss signature (below one full wave a chunk GEMM leaves
    /// SMs idle for its whole run).
    pub chunk_waves: f64,
    pub gpus: usize,
    /// Fixed cost of one copy-engine transfer, ms.
    pub copy_latency_ms: f64,
    /// Whether the design space offers fused-reduce (`-acc`) schedules
    /// (true for the current space; false when scoring data measured before
    /// they existed).
    pub fused_reduce: bool,
}

impl RuleInputs {
    /// Output tiles (128 x 128) per SM of the GEMM of one chunk when a shard
    /// is cut into `chunks`: ceil(M/P/chunks / 128) * ceil(N / 128) / SMs.
    /// At 1.0 every SM gets exactly one tile.
    pub fn waves(&self, chunks: usize) -> f64 {
        let rows = self.shard_rows / chunks.max(1);
        (rows.div_ceil(RULE_TILE) * self.tile_cols) as f64 / self.sm_count as f64
    }
}

/// Computes [`RuleInputs`] for `p` on `hw`.
pub fn rule_inputs(p: &Problem, hw: &HwProfile) -> RuleInputs {
    let t_comp_ms = cost::problem_gemm_ms(hw, p);
    let t_comm_ms = cost::problem_comm_ms(hw, p);
    let mut x = RuleInputs {
        t_comp_ms,
        t_comm_ms,
        ratio: t_comp_ms / t_comm_ms,
        shard_rows: p.shard_rows(),
        chunk_rows: p.shard_rows() / 2,
        tile_cols: p.n.div_ceil(RULE_TILE),
        sm_count: hw.sm_count.max(1),
        shard_waves: 0.0,
        chunk_waves: 0.0,
        gpus: p.gpus,
        copy_latency_ms: hw.copy_engine.latency_us * 1e-3,
        fused_reduce: true,
    };
    x.shard_waves = x.waves(1);
    x.chunk_waves = x.waves(2);
    x
}

/// The candidate schedules of `p`: the base design space (seq included)
/// that fits the shape.
pub fn candidates(p: &Problem) -> Vec<Schedule> {
    enumerate(p.op, SpaceOptions::default())
        .into_iter()
        .filter(|s| s.is_seq() || s.misfit(p).is_none())
        .collect()
}

/// Simulated time of `s` on `p`, ms.
pub fn predict_ms(p: &Problem, s: &Schedule, hw: &HwProfile) -> Result<f64> {
    let plan = lower::lower(p, s)?;
    Ok(sim::simulate(&plan, hw)?.total_ms)
}

/// Predictions within this fraction of the fastest are near ties for the
/// model selector, which then takes the simplest of them (a few % is well
/// inside the simulator's error: 7-8% median on the measured sweeps).
pub const MODEL_MARGIN: f64 = 0.03;

/// Whether the model selector considers `s`: `seq` and copy-engine
/// schedules with one compute stream. On H200 the GEMMs are persistent
/// kernels that keep every SM, so NCCL kernels and a second GEMM stream
/// serialize with or slow the GEMMs in ways the simulator's global
/// contention factors get wrong (its picks there were the worst misses).
pub fn in_model_space(s: &Schedule) -> bool {
    s.is_seq() || (s.engine == Engine::Copy && s.compute_streams == 1)
}

/// How elaborate `s` is, for breaking near ties: fewer pipeline steps
/// first (seq, shard, bulk, fine2, fine4, ...), then ring before all, then
/// unfused before fused, then one stream before two.
fn complexity(s: &Schedule) -> (usize, usize, bool, usize) {
    let chunks = s.granularity.chunks();
    let steps = if s.is_seq() {
        0
    } else if s.granularity == Granularity::Bulk {
        2
    } else if chunks == 1 {
        1
    } else {
        1 + chunks
    };
    (
        steps,
        usize::from(s.order == Order::All),
        s.fused_reduce,
        s.compute_streams,
    )
}

/// The model selector over `among` (every candidate when empty): simulate
/// the schedules of [`in_model_space`] (all of `among` if none is), then,
/// of those predicted within [`MODEL_MARGIN`] of the fastest, take the one
/// of least [`complexity`].
pub fn select_model_among(p: &Problem, hw: &HwProfile, among: &[Schedule]) -> Result<Selection> {
    p.validate()?;
    let all;
    let among = if among.is_empty() {
        all = candidates(p);
        &all[..]
    } else {
        among
    };
    let fitting: Vec<Schedule> = among
        .iter()
        .filter(|s| s.is_seq() || s.misfit(p).is_none())
        .copied()
        .collect();
    let restricted: Vec<Schedule> = fitting
        .iter()
        .filter(|s| in_model_space(s))
        .copied()
        .collect();
    let pool = if restricted.is_empty() {
        &fitting
    } else {
        &restricted
    };
    let mut times: Vec<(f64, Schedule)> = Vec::new();
    for s in pool {
        times.push((predict_ms(p, s, hw)?, *s));
    }
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (fastest, fastest_s) = *times
        .first()
        .ok_or_else(|| Error::Shape(format!("no schedule fits {}", p.label())))?;
    let (t, s) = *times
        .iter()
        .filter(|(t, _)| *t <= fastest * (1.0 + MODEL_MARGIN))
        .min_by(|a, b| {
            complexity(&a.1)
                .cmp(&complexity(&b.1))
                .then(a.0.total_cmp(&b.0))
        })
        .expect("the fastest is within the margin");
    let reason = if times.len() == 1 {
        "the only schedule that fits".to_string()
    } else if s == fastest_s {
        let (t2, s2) = times[1];
        format!(
            "fastest of {} simulated schedules ({:.4} ms; next {} {:.4} ms)",
            times.len(),
            t,
            s2.name(),
            t2
        )
    } else {
        format!(
            "simplest of the {} simulated schedules within {:.0}% of the fastest ({:.4} ms; fastest {} {:.4} ms)",
            times.len(),
            100.0 * MODEL_MARGIN,
            t,
            fastest_s.name(),
            fastest
        )
    };
    Ok(Selection {
        schedule: s.name(),
        selector: Selector::Model,
        predicted_ms: t,
        reason,
    })
}

/// The model selector: simulate the candidates, take the fastest (the
/// simplest of near ties).
pub fn select_model(p: &Problem, hw: &HwProfile) -> Result<Selection> {
    select_model_among(p, hw, &[])
}

/// The rule selector. The rules, in order (the first that decides a choice
/// wins); P is the GPU count, T_comp the whole GEMM alone, T_comm the
/// reference collective alone, and "waves" the 128x128 output tiles of a
/// step's GEMM per SM ([`RuleInputs::waves`]).
///
/// 1. **Too small to overlap: `seq`.** The most any overlap can save is
///    min(T_comp, T_comm). A copy-engine schedule pays each transfer's fixed
///    cost on the critical path: P−1 rounds for ag-gemm and gemm-rs, 2(P−1)
///    for gemm-ar (push partials, then broadcast the reduced chunks). When
///    min(T_comp, T_comm) is below rounds × the copy latency, run `seq`.
/// 2. **Copy engines.** On H200 the GEMMs are persistent kernels that keep
///    every SM until they end, so SM-based NCCL transfers cannot run beside
///    them (they serialize with the GEMMs), while DMA copies overlap and take
///    no SMs.
/// 3. **Two GPUs with a reduction: fuse it, `fineC-copy-ring[-2s]-acc`.**
///    On 2 GPUs the peer's partial lands straight in the output and the own
///    block's GEMM adds into it (C += A·B), so no reduce kernel trails the
///    last GEMM and nothing is read back from a receive buffer; chunk j of
///    the own block only waits for the peer's chunk j. This is for gemm-ar
///    always (its broadcast phase needs chunks anyway, rule 5), and for
///    gemm-rs while T_comp < 2·T_comm: the own block's GEMM (half the work)
///    cannot hide the push of the peer's half. Once it can, `shard` already
///    hides everything but a short reduce, and fusing buys less than chunking
///    costs. C is the finest of 2, 4, 8 whose chunk GEMM still fills every SM
///    (waves(C) ≥ 1): finer chunks shrink the exposed last transfer until the
///    chunk GEMMs leave SMs idle. Not on P > 2: the P−1 peer partials still
///    need a reduce before the own GEMM can add them, so the reduce stays on
///    the critical path and the own GEMM now waits for it.
/// 4. **`bulk` when the local GEMM hides the whole collective.** For ag-gemm
///    and gemm-rs on P > 2 GPUs with T_comp ≥ P·T_comm, the local (own)
///    block's GEMM, T_comp/P, covers every transfer by itself, so cutting the
///    peers' rows into P−1 GEMMs buys no overlap and only adds wave
///    quantization and per-GEMM costs: coalesce them. (On 2 GPUs there is one
///    peer block and `bulk` is `shard`; gemm-ar needs chunks, rule 5.)
/// 5. **`fine2` when communication dominates, and for gemm-ar, while the
///    half-shard chunk fills every SM.** When T_comp < T_comm the pipeline's
///    exposed ends (first transfer, last GEMM and reduce) are what halving
///    the step shortens; gemm-ar also broadcasts each reduced chunk, and with
///    one step per shard the whole broadcast is exposed after the last GEMM.
///    Halving pays only while a half-shard chunk GEMM keeps at least one full
///    wave (waves(2) ≥ 1); below that the SMs it leaves idle cost more than
///    the overlap gained. Otherwise `shard`.
/// 6. **Order `all` for a communication-bound ag-gemm, else `ring`.** ag-gemm
///    pulls peers' shards; when T_comp < T_comm the local GEMM cannot hide a
///    one-peer-at-a-time ring, and pulling from every peer at once uses all
///    copy engines and links. gemm-rs and gemm-ar push partials that are
///    produced one peer at a time; pushing into every peer at once makes the
///    receivers' links and reduces contend (measured at P=4: up to 31%
///    slower, rarely faster), so they keep `ring`.
/// 7. **A second compute stream only for many short GEMMs.** With `fine4`
///    or `fine8` (rule 3: at least 4 GEMMs per shard), or an ag-gemm whose
///    per-peer shard GEMM has less than one wave of tiles (waves(1) < 1, it
///    occupies only part of the SMs), each GEMM's tail (its partial last wave
///    and the launch gap) leaves SMs idle; alternating two compute streams
///    lets the next GEMM start on them. Otherwise one stream: two big
///    persistent GEMMs only slow each other, and in gemm-rs and gemm-ar a
///    second stream runs the own block beside the peers' partials and delays
///    their transfers (measured up to 55% slower with `shard`, rarely faster
///    with `fine2`).
pub fn rules(p: &Problem, x: &RuleInputs) -> (Schedule, String) {
    let gpus = p.gpus;
    let (ag, rs, ar) = (p.op == Op::AgGemm, p.op == Op::GemmRs, p.op == Op::GemmAr);
    // Rule 1.
    let copy_rounds = if ar { 2 * (gpus - 1) } else { gpus - 1 };
    let max_saving = x.t_comp_ms.min(x.t_comm_ms);
    if max_saving < copy_rounds as f64 * x.copy_latency_ms {
        return (
            Schedule::SEQ,
            format!(
                "rule 1: min(T_comp, T_comm) = {:.4} ms < {copy_rounds} copy rounds x {:.4} ms fixed cost",
                max_saving, x.copy_latency_ms
            ),
        );
    }
    let fits = |c: usize| p.m % (gpus * c) == 0;
    let comm_bound = x.ratio < 1.0;
    // Rule 3.
    let fuse = x.fused_reduce && gpus == 2 && (ar || (rs && x.ratio < 2.0)) && fits(2);
    if fuse {
        let chunks = [4, 8]
            .into_iter()
            .filter(|&c| fits(c) && x.waves(c) >= 1.0)
            .max()
            .unwrap_or(2);
        let name = format!(
            "fine{chunks}-copy-ring{}-acc",
            if chunks >= 4 { "-2s" } else { "" }
        );
        let why = format!(
            "rules 2, 3, 7: 2 GPUs, {}; fused reduce in {chunks} chunks per shard ({:.2} waves each){}",
            if ar {
                "gemm-ar".to_string()
            } else {
                format!("gemm-rs with T_comp/T_comm = {:.2} < 2", x.ratio)
            },
            x.waves(chunks),
            if chunks >= 4 { "; 2 compute streams" } else { "" }
        );
        return (parse(&name), why);
    }
    // Rules 4 and 5.
    let (gran, gran_why) = if gpus > 2 && (ag || rs) && x.ratio >= gpus as f64 {
        (
            "bulk",
            format!("T_comp/T_comm = {:.2} >= P -> bulk", x.ratio),
        )
    } else if (comm_bound || ar) && fits(2) && x.waves(2) >= 1.0 {
        (
            "fine2",
            format!(
                "{}; half-shard chunk {:.2} waves -> fine2",
                if comm_bound {
                    format!("T_comp/T_comm = {:.2} (comm-bound)", x.ratio)
                } else {
                    "gemm-ar".to_string()
                },
                x.waves(2)
            ),
        )
    } else {
        (
            "shard",
            format!(
                "T_comp/T_comm = {:.2}, half-shard chunk {:.2} waves -> shard",
                x.ratio,
                x.waves(2)
            ),
        )
    };
    // Rule 6.
    let order = if ag && comm_bound { "all" } else { "ring" };
    // Rule 7.
    let two = ag && gran == "shard" && x.waves(1) < 1.0;
    let name = format!("{gran}-copy-{order}{}", if two { "-2s" } else { "" });
    let why = format!(
        "rules 2, 4-7: copy engines; {gran_why}; order {order}{}",
        if two {
            format!("; shard GEMM {:.2} waves -> 2 compute streams", x.waves(1))
        } else {
            String::new()
        }
    );
    (parse(&name), why)
}

/// A schedule name the rules build; they only build valid ones.
fn parse(name: &str) -> Schedule {
    name.parse()
        .unwrap_or_else(|e| panic!("rules built an invalid schedule name: {e}"))
}

/// The rule selector (see [`rules`]) limited to the design space of `among`
/// (the whole space when empty): without fused-reduce schedules in it, rule 3
/// is off.
pub fn select_rules_among(p: &Problem, hw: &HwProfile, among: &[Schedule]) -> Result<Selection> {
    p.validate()?;
    let mut x = rule_inputs(p, hw);
    if !among.is_empty() {
        x.fused_reduce = among.iter().any(|s| s.fused_reduce);
    }
    let (s, reason) = rules(p, &x);
    // A shape the chosen schedule cannot split falls back to seq.
    let (s, reason) = match s.misfit(p) {
        Some(why) if !s.is_seq() => (Schedule::SEQ, format!("{reason}; but {why}: seq")),
        _ => (s, reason),
    };
    Ok(Selection {
        schedule: s.name(),
        selector: Selector::Rules,
        predicted_ms: predict_ms(p, &s, hw)?,
        reason,
    })
}

/// The rule selector (see [`rules`]).
pub fn select_rules(p: &Problem, hw: &HwProfile) -> Result<Selection> {
    select_rules_among(p, hw, &[])
}

/// Runs `selector` on `p`.
pub fn select(p: &Problem, hw: &HwProfile, selector: Selector) -> Result<Selection> {
    match selector {
        Selector::Model => select_model(p, hw),
        Selector::Rules => select_rules(p, hw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hw() -> HwProfile {
        HwProfile::builtin("h200-nvlink").unwrap()
    }

    fn rule_pick(op: Op, m: usize, k: usize, n: usize, gpus: usize) -> String {
        let p = Problem::new(op, m, k, n, gpus).unwrap();
        select_rules(&p, &hw()).unwrap().schedule
    }

    #[test]
    fn selectors_return_fitting_names() {
        let hw = hw();
        for op in Op::ALL {
            for (m, gpus) in [(2048, 2), (8192, 4), (12, 4), (6, 2), (24, 8), (8, 8)] {
                let p = Problem::new(op, m, 4096, 4096, gpus).unwrap();
                for sel in Selector::ALL {
                    let s = select(&p, &hw, sel).unwrap();
                    let parsed: Schedule = s.schedule.parse().unwrap();
                    assert!(parsed.is_seq() || parsed.misfit(&p).is_none(), "{s:?}");
                    assert!(s.predicted_ms > 0.0);
                    assert_eq!(s.selector, sel);
                }
            }
        }
    }

    #[test]
    fn each_rule_decides_where_documented() {
        // Rule 1: a tiny all-reduce on 4 GPUs cannot pay 6 copy latencies.
        assert_eq!(rule_pick(Op::GemmAr, 2048, 1024, 4096, 4), "seq");
        // Rule 5: comm-bound gemm-ar with a half-shard chunk of 3.9 waves.
        assert_eq!(
            rule_pick(Op::GemmAr, 16384, 1024, 4096, 4),
            "fine2-copy-ring"
        );
        // Rules 6 and 7: comm-bound ag-gemm, shard GEMM of 0.4 waves.
        assert_eq!(
            rule_pick(Op::AgGemm, 2048, 4096, 1536, 4),
            "shard-copy-all-2s"
        );
        // Rule 3: 2 GPUs, comm-limited gemm-rs; 4 chunks keep 1.9 waves.
        assert_eq!(
            rule_pick(Op::GemmRs, 8192, 2048, 4096, 2),
            "fine4-copy-ring-2s-acc"
        );
        // ... gemm-ar always, as fine as one full wave allows (8 x 3.9 waves).
        assert_eq!(
            rule_pick(Op::GemmAr, 16384, 4096, 8192, 2),
            "fine8-copy-ring-2s-acc"
        );
        assert_eq!(
            rule_pick(Op::GemmAr, 2048, 1024, 4096, 2),
            "fine2-copy-ring-acc"
        );
        // ... but not gemm-rs once the own block's GEMM hides the push.
        assert_eq!(
            rule_pick(Op::GemmRs, 8192, 4096, 8192, 2),
            "shard-copy-ring"
        );
        // Rule 4: the local GEMM hides the whole all-gather on 4 GPUs.
        assert_eq!(
            rule_pick(Op::AgGemm, 8192, 8192, 14336, 4),
            "bulk-copy-ring"
        );
        // ... never on 2 GPUs, where bulk is shard.
        assert_eq!(
            rule_pick(Op::AgGemm, 8192, 8192, 14336, 2),
            "shard-copy-ring"
        );
    }

    #[test]
    fn without_fused_schedules_rule_3_is_off() {
        let hw = hw();
        let p = Problem::new(Op::GemmAr, 8192, 2048, 4096, 2).unwrap();
        let x = rule_inputs(&p, &hw);
        assert!(x.fused_reduce);
        assert_eq!(rules(&p, &x).0.name(), "fine4-copy-ring-2s-acc");
        let unfused: Vec<Schedule> = candidates(&p)
            .into_iter()
            .filter(|s| !s.fused_reduce)
            .collect();
        let s = select_rules_among(&p, &hw, &unfused).unwrap();
        assert_eq!(s.schedule, "fine2-copy-ring");
    }

    #[test]
    fn waves_count_128_tiles_per_sm() {
        let hw = hw();
        let p = Problem::new(Op::GemmRs, 8192, 2048, 4096, 2).unwrap();
        let x = rule_inputs(&p, &hw);
        // Shard 4096 rows x 4096 cols = 32 x 32 tiles on 132 SMs.
        assert!((x.shard_waves - 1024.0 / 132.0).abs() < 1e-12);
        assert!((x.chunk_waves - 512.0 / 132.0).abs() < 1e-12);
        assert!((x.waves(8) - 128.0 / 132.0).abs() < 1e-12);
        assert_eq!(x.chunk_rows, 2048);
    }

    #[test]
    fn model_prefers_the_simpler_of_near_ties() {
        let hw = hw();
        let p = Problem::new(Op::AgGemm, 8192, 8192, 2560, 4).unwrap();
        let s = select_model(&p, &hw).unwrap();
        let pick: Schedule = s.schedule.parse().unwrap();
        assert!(in_model_space(&pick), "{s:?}");
        let t_best = candidates(&p)
            .iter()
            .filter(|s| in_model_space(s))
            .map(|s| predict_ms(&p, s, &hw).unwrap())
            .fold(f64::INFINITY, f64::min);
        assert!(s.predicted_ms <= t_best * (1.0 + MODEL_MARGIN) + 1e-12);
        // Only NCCL schedules offered: the model still answers among them.
        let nccl: Vec<Schedule> = candidates(&p)
            .into_iter()
            .filter(|s| !s.is_seq() && s.engine == Engine::Nccl)
            .collect();
        let s = select_model_among(&p, &hw, &nccl).unwrap();
        assert!(s.schedule.contains("-nccl-"), "{s:?}");
    }

    #[test]
    fn selector_names_parse() {
        assert_eq!("model".parse::<Selector>().unwrap(), Selector::Model);
        assert!("best".parse::<Selector>().is_err());
    }
}
