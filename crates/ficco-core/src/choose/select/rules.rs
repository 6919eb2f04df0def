//! The rule selector: eight documented rules over quantities computed from
//! the cost model and the shape ([`RuleInputs`]); each rule and why it holds
//! is on [`rules`], and the expert-parallel operators' rules on
//! [`moe_rules`]. The rules build typed [`Schedule`]s.

use super::{predict_ms, Selection, Selector};
use crate::error::Result;
use crate::problem::workload::{Op, Problem};
use crate::sim::cost;
use crate::sim::profile::HwProfile;
use crate::space::{Engine, Granularity, Order, Schedule};
use serde::{Deserialize, Serialize};

/// Whether rule 8 may pick `tile`. Off: on 4 GPUs `tile` lost where rule 8
/// picked it. In the 4-H100 soak of every schedule (`b405ac2`,
/// `bench/data/2026-11-26-h100x4-hang3/3-after-fix-soak`) rule 8 took 5
/// of the 20 llama3 scenarios at P = 4, and there `tile` ran 1.02-1.36x
/// seq in 3 and 0.87-0.98x in 2, against 0.77-0.97x for `shard-copy-ring`
/// in the 4 of them where any schedule beat seq (issue 30 has the same on
/// 4 H200s: `tile-copy-all` 1.04x seq on gemm-ar 8192 x 2048 x 8192, the
/// simulator 40% optimistic on it). The rule stays, for a calibrated
/// simulator to turn back on.
pub const RULES_PICK_TILE: bool = false;

/// Rule 1's margin for a reduction (gemm-rs, gemm-ar) on more than 2 GPUs:
/// overlap must be able to save this many times its copy rounds' fixed
/// cost. Such a schedule also runs a reduce kernel per chunk on the
/// critical path, and its P−1 pushes contend at the receivers. Measured
/// on 4 H100s (the soak above): every overlapped schedule lost to `seq`
/// where min(T_comp, T_comm) was 0.033 ms (llama3-8b's attention outputs
/// at 2048 tokens, gemm-rs and gemm-ar), and `shard-copy-ring` won from
/// 0.076 ms (0.95x seq, llama3-8b's gemm-rs MLP down; 0.97x for
/// llama3-70b's gemm-ar at 0.111 ms). With the profiles' 0.006 ms copy
/// latency the threshold falls between: 0.045 ms for gemm-rs (3 rounds)
/// and 0.090 ms for gemm-ar (6 rounds) at P = 4.
pub const REDUCE_ROUNDS_MARGIN: f64 = 2.5;

/// Rule 3: at most this many fused chunks per shard. Measured on 4 H200s
/// (`ffd6dd6`, the llama3 suite at P = 2,
/// `bench/data/2026-11-26-h200x4-rules/05-llama3-p2`): `fine4` ran faster
/// than `fine8` in all four scenarios where rule 3 had picked `fine8`
/// (gemm-ar and gemm-rs, by 0.2-3.3% of seq): eight chunks pay eight
/// transfers' and GEMM tails' fixed costs for a last transfer that is
/// already short at four.
pub const FUSE_MAX_CHUNKS: usize = 4;

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
    /// Rows of one rank's shard, M / P (for the MoE operators, of one
    /// source-to-expert-rank block on average, T·top_k / P²).
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
    /// Whether the design space offers `tile` schedules (false when scoring
    /// data measured before they existed).
    #[serde(default)]
    pub tile: bool,
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
    let shard_rows = match p.moe {
        Some(spec) if p.op.is_moe() => p.m * spec.top_k / (p.gpus * p.gpus).max(1),
        _ => p.shard_rows(),
    };
    let mut x = RuleInputs {
        t_comp_ms,
        t_comm_ms,
        ratio: t_comp_ms / t_comm_ms,
        shard_rows,
        chunk_rows: shard_rows / 2,
        tile_cols: p.n.div_ceil(RULE_TILE),
        sm_count: hw.sm_count.max(1),
        shard_waves: 0.0,
        chunk_waves: 0.0,
        gpus: p.gpus,
        copy_latency_ms: hw.copy_engine.latency_us * 1e-3,
        fused_reduce: true,
        tile: RULES_PICK_TILE,
    };
    x.shard_waves = x.waves(1);
    x.chunk_waves = x.waves(2);
    x
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
///    min(T_comp, T_comm) is below rounds × the copy latency, run `seq`;
///    for gemm-rs and gemm-ar on P > 2 GPUs, below
///    [`REDUCE_ROUNDS_MARGIN`] times that (a reduce kernel per chunk, and
///    contending pushes, measured on 4 H100s).
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
///    costs. C is the finest of 2 and 4 whose chunk GEMM still fills every SM
///    (waves(C) ≥ 1): finer chunks shrink the exposed last transfer until the
///    chunk GEMMs leave SMs idle; when even a half-shard chunk is less than
///    one tile row (M/P/2 < 128 rows, a few hundred tokens), one step per
///    shard (`shard-copy-ring-acc`): every half-shard GEMM would compute
///    whole 128-row tiles of which it keeps a fraction (the simulator put
///    `fine2` 1.2-1.6x above `seq` for llama3-70b's gemm-ar at 128-256
///    tokens). At most `FUSE_MAX_CHUNKS` chunks (measured: eight lose to
///    four). Not on P > 2: the P−1
///    peer partials still need a reduce before the own GEMM can add them, so
///    the reduce stays on the critical path and the own GEMM now waits for it.
/// 4. **`bulk` when the local GEMM hides the whole collective.** For ag-gemm
///    and gemm-rs on P > 2 GPUs with T_comp ≥ P·T_comm, the local (own)
///    block's GEMM, T_comp/P, covers every transfer by itself, so cutting the
///    peers' rows into P−1 GEMMs buys no overlap and only adds wave
///    quantization and per-GEMM costs: coalesce them. (On 2 GPUs there is one
///    peer block and `bulk` is `shard`; gemm-ar needs chunks, rule 5.)
/// 5. **`fine2` on 2 GPUs when communication dominates, and for gemm-ar,
///    while the half-shard chunk fills every SM.** When T_comp < T_comm the pipeline's
///    exposed ends (first transfer, last GEMM and reduce) are what halving
///    the step shortens; gemm-ar also broadcasts each reduced chunk, and with
///    one step per shard the whole broadcast is exposed after the last GEMM.
///    Halving pays only while a half-shard chunk GEMM keeps at least one full
///    wave (waves(2) ≥ 1); below that the SMs it leaves idle cost more than
///    the overlap gained. Otherwise `shard`. Not on P > 2: there a shard is
///    already M/P rows and each of its P−1 steps (2(P−1) for gemm-ar) pays a
///    transfer's and a GEMM's fixed cost; halving doubles those. Measured on
///    4 H200s (`ffd6dd6`, llama3 at P = 4): `shard-copy-ring` ran at or
///    below `fine2-copy-ring` in all 7 scenarios where this rule had picked
///    `fine2` (gemm-ar 0.76-0.95x seq against 0.77-1.00x).
/// 6. **Order `all` for a communication-bound ag-gemm on 2 GPUs, else
///    `ring`.** ag-gemm pulls peers' shards; when T_comp < T_comm the local
///    GEMM cannot hide a one-peer-at-a-time ring, and pulling from every peer
///    at once uses all copy engines and links. Not on P > 2: on 4 H100s
///    `all` ran 1.13-1.40x seq for the comm-bound llama3 QKV projections
///    (T_comp/T_comm 0.7-0.8) where `ring` ran 0.59-0.90x (the soak of
///    [`RULES_PICK_TILE`]). gemm-rs and gemm-ar push partials that are
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
    if p.op.is_moe() {
        return moe_rules(p, x);
    }
    let gpus = p.gpus;
    let (ag, rs, ar) = (p.op == Op::AgGemm, p.op == Op::GemmRs, p.op == Op::GemmAr);
    // Rule 1.
    let copy_rounds = if ar { 2 * (gpus - 1) } else { gpus - 1 };
    let max_saving = x.t_comp_ms.min(x.t_comm_ms);
    let margin = if gpus > 2 && (rs || ar) {
        REDUCE_ROUNDS_MARGIN
    } else {
        1.0
    };
    if max_saving < margin * copy_rounds as f64 * x.copy_latency_ms {
        return (
            Schedule::SEQ,
            format!(
                "rule 1: min(T_comp, T_comm) = {:.4} ms < {margin} x {copy_rounds} copy rounds x {:.4} ms fixed cost",
                max_saving, x.copy_latency_ms
            ),
        );
    }
    let fits = |c: usize| p.m % (gpus * c) == 0;
    let comm_bound = x.ratio < 1.0;
    // Rule 3.
    let fuse = x.fused_reduce && gpus == 2 && (ar || (rs && x.ratio < 2.0)) && fits(2);
    if fuse {
        let chunks = if fits(FUSE_MAX_CHUNKS) && x.waves(FUSE_MAX_CHUNKS) >= 1.0 {
            FUSE_MAX_CHUNKS
        } else if x.chunk_rows >= RULE_TILE {
            2
        } else {
            1
        };
        let streams = if chunks >= 4 { 2 } else { 1 };
        let gran = if chunks == 1 {
            Granularity::Shard
        } else {
            Granularity::Fine(chunks)
        };
        let s = Schedule::base(gran, Engine::Copy, Order::Ring)
            .with_compute_streams(streams)
            .with_fused_reduce();
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
        return (s, why);
    }
    // Rule 8.
    let tile_rows = crate::plan::lower::TILE_BLOCK_ROWS;
    let tile =
        x.tile && gpus > 2 && (ar || (rs && x.waves(1) < 2.0)) && p.m % (gpus * tile_rows) == 0;
    if tile {
        let order = if ar { Order::All } else { Order::Ring };
        let s = Schedule::base(Granularity::Tile, Engine::Copy, order);
        let why = format!(
            "rules 2, 8: {gpus} GPUs, {}; one tile GEMM, order {}",
            if ar {
                "gemm-ar".to_string()
            } else {
                format!("gemm-rs with a {:.2}-wave shard GEMM (< 2)", x.waves(1))
            },
            order.name()
        );
        return (s, why);
    }
    // Rules 4 and 5.
    let (gran, gran_why) = if gpus > 2 && (ag || rs) && x.ratio >= gpus as f64 {
        (
            Granularity::Bulk,
            format!("T_comp/T_comm = {:.2} >= P -> bulk", x.ratio),
        )
    } else if gpus == 2 && (comm_bound || ar) && fits(2) && x.waves(2) >= 1.0 {
        (
            Granularity::Fine(2),
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
            Granularity::Shard,
            format!(
                "T_comp/T_comm = {:.2}, half-shard chunk {:.2} waves -> shard",
                x.ratio,
                x.waves(2)
            ),
        )
    };
    // Rule 6.
    let order = if ag && comm_bound && gpus == 2 {
        Order::All
    } else {
        Order::Ring
    };
    // Rule 7.
    let two = ag && gran == Granularity::Shard && x.waves(1) < 1.0;
    let s = Schedule::base(gran, Engine::Copy, order).with_compute_streams(if two { 2 } else { 1 });
    let why = format!(
        "rules 2, 4-7: copy engines; {gran_why}; order {}{}",
        order.name(),
        if two {
            format!("; shard GEMM {:.2} waves -> 2 compute streams", x.waves(1))
        } else {
            String::new()
        }
    );
    (s, why)
}

/// The rules for the expert-parallel operators (`a2a-gemm`, `gemm-a2a`).
/// T_comp is the busiest rank's grouped GEMM and T_comm the busiest rank's
/// all-to-all, so routing skew enters through both; "block" is the rows one
/// source exchanges with one expert rank (T·top_k / P² on average), and
/// waves count a step's GEMM as in [`RuleInputs::waves`].
///
/// 1. **Too small to overlap: `seq`.** As rule 1 of [`rules`], with P−1
///    copy rounds (one block per peer).
/// 2. **Copy engines**, as rule 2 of [`rules`]: the grouped GEMMs are
///    persistent kernels that hold every SM, and DMA copies take none.
/// 3. **`bulk` when one block's GEMM hides the whole all-to-all**
///    (T_comp ≥ P·T_comm, P > 2). Dispatch runs the own block (≈ T_comp/P)
///    while every peer block arrives, combine computes the peers' blocks
///    first and sends them under the own block's GEMM; then one grouped
///    GEMM over all peer blocks is cheaper than P−1 small ones (one launch,
///    one tail wave).
/// 4. **`fine2` when communication dominates** (T_comp < T_comm) and a
///    half-block chunk still fills every SM (waves(2) ≥ 1): the exposed
///    first transfer (dispatch) or last transfer (combine) is what halving
///    shortens. Otherwise `shard`, one step per peer block.
/// 5. **Order `all` for a communication-bound dispatch, else `ring`.**
///    Dispatch pulls blocks that all exist from the start: pulling from every
///    peer at once uses every copy engine and link. Combine pushes blocks as
///    they are computed, one peer at a time; pushing into every peer at once
///    only makes the receivers' links contend (as gemm-rs, rule 6 of [`rules`]).
/// 6. **One compute stream.** A grouped GEMM already pools the tiles of all
///    its experts, so its tail is one wave whatever the expert count; a
///    second stream would only run two of them against each other.
pub fn moe_rules(p: &Problem, x: &RuleInputs) -> (Schedule, String) {
    let gpus = p.gpus;
    let dispatch = p.op == Op::A2aGemm;
    // Rule 1.
    let rounds = gpus - 1;
    let max_saving = x.t_comp_ms.min(x.t_comm_ms);
    if max_saving < rounds as f64 * x.copy_latency_ms {
        return (
            Schedule::SEQ,
            format!(
                "moe rule 1: min(T_comp, T_comm) = {:.4} ms < {rounds} copy rounds x {:.4} ms fixed cost",
                max_saving, x.copy_latency_ms
            ),
        );
    }
    let comm_bound = x.ratio < 1.0;
    // Rules 3 and 4.
    let (gran, gran_why) = if gpus > 2 && x.ratio >= gpus as f64 {
        (
            Granularity::Bulk,
            format!("T_comp/T_comm = {:.2} >= P -> bulk", x.ratio),
        )
    } else if comm_bound && x.waves(2) >= 1.0 {
        (
            Granularity::Fine(2),
            format!(
                "T_comp/T_comm = {:.2} (comm-bound); half-block chunk {:.2} waves -> fine2",
                x.ratio,
                x.waves(2)
            ),
        )
    } else {
        (
            Granularity::Shard,
            format!(
                "T_comp/T_comm = {:.2}, half-block chunk {:.2} waves -> shard (per-peer steps)",
                x.ratio,
                x.waves(2)
            ),
        )
    };
    // Rule 5.
    let order = if dispatch && comm_bound {
        Order::All
    } else {
        Order::Ring
    };
    let s = Schedule::base(gran, Engine::Copy, order);
    let why = format!(
        "moe rules 2-6: copy engines; {gran_why}; order {}; one compute stream",
        order.name()
    );
    (s, why)
}

/// The rule selector (see [`rules`]) limited to the design space of `among`
/// (the whole space when empty): without fused-reduce schedules in it, rule 3
/// is off.
pub fn select_rules_among(p: &Problem, hw: &HwProfile, among: &[Schedule]) -> Result<Selection> {
    p.validate()?;
    let mut x = rule_inputs(p, hw);
    if !among.is_empty() {
        x.fused_reduce = among.iter().any(|s| s.fused_reduce);
        x.tile = x.tile && among.iter().any(|s| s.granularity == Granularity::Tile);
    }
    let seq_ms = predict_ms(p, &Schedule::SEQ, hw)?;
    // The rules' pick; when the simulator predicts it slower than seq and it
    // is rule 8's `tile`, the pick of the other rules; else seq.
    let mut vetoed = vec![];
    let mut tries = vec![x];
    if x.tile {
        tries.push(RuleInputs { tile: false, ..x });
    }
    for x in tries {
        let (s, reason) = rules(p, &x);
        // A shape the chosen schedule cannot split falls back to seq.
        let (s, reason) = match s.misfit(p) {
            Some(why) if !s.is_seq() => (Schedule::SEQ, format!("{reason}; but {why}: seq")),
            _ => (s, reason),
        };
        let predicted_ms = if s.is_seq() {
            seq_ms
        } else {
            predict_ms(p, &s, hw)?
        };
        if predicted_ms <= seq_ms {
            let reason = if vetoed.is_empty() {
                reason
            } else {
                format!("{}; then {reason}", vetoed.join("; "))
            };
            return Ok(Selection {
                schedule: s,
                selector: Selector::Rules,
                predicted_ms,
                reason,
            });
        }
        if vetoed.iter().any(|v: &String| v.starts_with(&s.name())) {
            continue;
        }
        vetoed.push(format!(
            "{} ({reason}) is predicted at {predicted_ms:.4} ms > seq {seq_ms:.4} ms",
            s.name()
        ));
    }
    Ok(Selection {
        schedule: Schedule::SEQ,
        selector: Selector::Rules,
        predicted_ms: seq_ms,
        reason: format!("{}: seq", vetoed.join("; ")),
    })
}

/// The rule selector (see [`rules`]).
pub fn select_rules(p: &Problem, hw: &HwProfile) -> Result<Selection> {
    select_rules_among(p, hw, &[])
}
