//! The model selector: simulate the candidates on the hardware profile and
//! take the fastest, the simplest of near ties.

use super::{candidates, predict_ms, Selection, Selector};
use crate::error::{Error, Result};
use crate::problem::workload::{Collective, Op, Problem};
use crate::sim::profile::HwProfile;
use crate::space::{Engine, Granularity, Order, Schedule};

/// Predictions within this fraction of the fastest are near ties for the
/// model selector, which then takes the simplest of them (a few % is well
/// inside the simulator's median error on the measured sweeps, see
/// `bench/RESULTS.md`).
pub const MODEL_MARGIN: f64 = 0.03;

/// Whether the model selector considers `s`: `seq` and copy-engine
/// schedules with one compute stream. On H200 the GEMMs are persistent
/// kernels that keep every SM, so NCCL kernels and a second GEMM stream
/// serialize with or slow the GEMMs in ways the simulator's global
/// contention factors get wrong (its picks there were the worst misses).
pub fn in_model_space(s: &Schedule) -> bool {
    s.is_seq() || (s.engine == Engine::Copy && s.compute_streams == 1)
}

/// Whether the model selector may pick `s` for `p` at all: not a
/// copy-engine reduction (all-reduce, reduce-scatter) beside `concurrent`
/// GEMMs in order `all` on more than 2 GPUs. The simulator put it first for
/// the data-parallel gradient syncs; measured on 4 H200s it ran 1.00-1.51x
/// `seq` (`dp.balanced.p4`, `dp.comm_heavy.p4`, both runs of 2026-11-21)
/// where `ring` ran 0.65-0.87x: every rank pushing into every peer at once
/// contends at the receivers, as the dependent reductions do (rule 6).
pub fn model_may_pick(p: &Problem, s: &Schedule) -> bool {
    let reduces = matches!(
        p.side.map(|c| c.collective),
        Some(Collective::AllReduce | Collective::ReduceScatter)
    );
    !(p.op == Op::Concurrent
        && reduces
        && p.gpus > 2
        && s.engine == Engine::Copy
        && s.order == Order::All)
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
/// of least `complexity` (fewer steps, ring, unfused, one stream).
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
        .filter(|s| model_may_pick(p, s))
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
    // The fastest is always within the margin, so this finds one.
    let (t, s) = times
        .iter()
        .filter(|(t, _)| *t <= fastest * (1.0 + MODEL_MARGIN))
        .min_by(|a, b| {
            complexity(&a.1)
                .cmp(&complexity(&b.1))
                .then(a.0.total_cmp(&b.0))
        })
        .copied()
        .unwrap_or((fastest, fastest_s));
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
        schedule: s,
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
