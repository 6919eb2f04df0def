//! What `schedule="auto"` runs for one operator call in a model: an
//! overlapped schedule only where its gain covers what the call itself
//! costs, else the sequential reference (the NCCL collective and the GEMM,
//! which the Python layer runs as PyTorch does).
//!
//! A call costs more than the plan's time in the harness: it copies the
//! operands that a peer reads (or writes) into ficco's shared buffers and
//! the output out, waits at a barrier at its start and end, and, for plans
//! that only run on the synchronizing path (grouped GEMMs, whose tables
//! live in per-rank slots), synchronizes the host and passes store
//! barriers. The gain is the tuning cache's measured `seq - schedule` where
//! tuning measured both, else the simulator's, discounted by
//! [`PREDICTED_TRUST`] (the simulator is up to 40% optimistic at P=4,
//! issue 30).

use crate::plan::validate::buffer_use;
use crate::plan::{BufferRole, Plan, TaskKind};
use crate::sim::profile::HwProfile;
use serde::{Deserialize, Serialize};

/// Device time of a fast call's own steps besides its copies (the barrier
/// waits, signals and flag clears on the control stream, the fork and join
/// of the plan's streams), in ms.
pub const FAST_CALL_MS: f64 = 0.02;

/// Time of a call on the synchronizing path besides the plan (a caller
/// stream synchronize, the flag reset, two store barriers and a host
/// synchronize): about 1 ms per call at P=4 (issue 28's block at 2048
/// tokens).
pub const FULL_CALL_MS: f64 = 1.0;

/// The share of a predicted gain that counts: the simulator's gains are
/// not measurements.
pub const PREDICTED_TRUST: f64 = 0.6;

/// Whether `plan` runs on the stream-ordered (fast) call path: every plan
/// but those with grouped GEMMs (MoE, not an operator call), whose tensor
/// maps live in a per-rank slot that another plan's set-up overwrites. A
/// tile GEMM takes its flags, counters and operands as launch arguments;
/// its destination table (`-acc`) is kept per call shape and address set.
pub fn fast_path(plan: &Plan) -> bool {
    !plan.has_task(|k| matches!(k, TaskKind::GroupedGemm { .. }))
}

/// Bytes a call of `plan` copies on the slowest rank: each operand that a
/// peer's task touches, or (an input) that a task writes, goes through
/// ficco's shared buffers (unless it was allocated there by
/// `ficco.torch.empty`).
pub fn copy_bytes(plan: &Plan) -> usize {
    let uses = buffer_use(plan);
    plan.ranks
        .iter()
        .zip(&uses)
        .map(|(rp, u)| {
            rp.buffers
                .iter()
                .zip(u)
                .filter(|(b, u)| match b.role {
                    BufferRole::Scratch => false,
                    BufferRole::Output => u.remote,
                    _ => u.remote || u.written,
                })
                .map(|(b, _)| b.bytes())
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0)
}

/// What a call of `plan` costs beyond the plan's own time, in ms: its
/// copies (each reads and writes HBM) and its fixed steps.
pub fn call_cost_ms(plan: &Plan, hw: &HwProfile) -> f64 {
    let fixed = if fast_path(plan) {
        FAST_CALL_MS
    } else {
        FULL_CALL_MS
    };
    let copies = 2.0 * copy_bytes(plan) as f64 / (hw.hbm_gbs.max(1.0) * 1e6);
    fixed + copies
}

/// Where a gain comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    /// The tuning cache measured both the schedule and `seq` here.
    Measured,
    /// The simulator's prediction, discounted by [`PREDICTED_TRUST`].
    Predicted,
}

/// The decision for one call shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallDecision {
    /// What runs: the candidate's canonical name, or `seq`.
    pub schedule: String,
    /// The overlapped schedule considered (the tuning cache's winner, else
    /// the rule pick).
    pub candidate: String,
    pub basis: Basis,
    /// `seq`'s time and the candidate's, measured or predicted (ms).
    pub seq_ms: f64,
    pub candidate_ms: f64,
    /// The gain that counts (measured, or predicted times the trust) and
    /// the call's own cost (ms).
    pub gain_ms: f64,
    pub cost_ms: f64,
}

impl CallDecision {
    /// Whether the sequential reference runs.
    pub fn is_seq(&self) -> bool {
        self.schedule == "seq"
    }

    /// One line for logs and the example's table.
    pub fn summary(&self) -> String {
        format!(
            "{} (candidate {}: {:?} gain {:.3} ms vs call cost {:.3} ms)",
            self.schedule, self.candidate, self.basis, self.gain_ms, self.cost_ms
        )
    }
}

/// Decides between `candidate` (its lowered `plan`) and `seq`: the
/// candidate runs only if its gain over `seq` covers the call's cost.
/// `measured`: (seq ms, candidate ms) from tuning, when it measured both;
/// `predicted`: the same from the simulator.
pub fn decide(
    plan: &Plan,
    hw: &HwProfile,
    measured: Option<(f64, f64)>,
    predicted: (f64, f64),
) -> CallDecision {
    let (basis, (seq_ms, candidate_ms), trust) = match measured {
        Some(m) => (Basis::Measured, m, 1.0),
        None => (Basis::Predicted, predicted, PREDICTED_TRUST),
    };
    let gain_ms = (seq_ms - candidate_ms) * trust;
    let cost_ms = call_cost_ms(plan, hw);
    let candidate = plan.name.clone();
    let overlapped = candidate != "seq" && gain_ms > cost_ms;
    CallDecision {
        schedule: if overlapped {
            candidate.clone()
        } else {
            "seq".into()
        },
        candidate,
        basis,
        seq_ms,
        candidate_ms,
        gain_ms,
        cost_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::lower::lower;
    use crate::problem::workload::{Op, Problem};
    use crate::space::Schedule;

    fn hw() -> HwProfile {
        HwProfile::builtin(crate::sim::profile::DEFAULT_PROFILE).expect("profile")
    }

    fn plan(op: Op, m: usize, k: usize, n: usize, s: &str) -> Plan {
        let p = Problem::new(op, m, k, n, 4).expect("problem");
        lower(&p, &s.parse::<Schedule>().expect("schedule")).expect("lowers")
    }

    #[test]
    fn a_gain_below_the_call_cost_runs_seq() {
        let pl = plan(Op::AgGemm, 8192, 8192, 2560, "shard-copy-ring");
        let cost = call_cost_ms(&pl, &hw());
        let d = decide(&pl, &hw(), Some((1.0, 1.0 - cost / 2.0)), (1.0, 0.5));
        assert!(d.is_seq(), "{d:?}");
        assert_eq!(d.basis, Basis::Measured);
        let d = decide(&pl, &hw(), Some((1.0, 1.0 - 2.0 * cost)), (1.0, 1.0));
        assert_eq!(d.schedule, "shard-copy-ring", "{d:?}");
    }

    #[test]
    fn predicted_gains_count_at_the_trust_share() {
        let pl = plan(Op::AgGemm, 8192, 8192, 2560, "shard-copy-ring");
        let cost = call_cost_ms(&pl, &hw());
        // A predicted gain just above the cost does not count in full.
        let g = cost * 1.2;
        let d = decide(&pl, &hw(), None, (1.0, 1.0 - g));
        assert!(d.is_seq(), "{d:?}");
        assert!((d.gain_ms - g * PREDICTED_TRUST).abs() < 1e-12);
        let d = decide(&pl, &hw(), None, (1.0, 1.0 - 2.0 * cost / PREDICTED_TRUST));
        assert!(!d.is_seq(), "{d:?}");
    }

    #[test]
    fn plans_on_the_synchronizing_path_cost_a_millisecond() {
        // Every operator schedule is fast, `tile` (and `-acc`) included.
        let p2 = Problem::new(Op::GemmRs, 2048, 2048, 8192, 2).expect("problem");
        let acc = lower(
            &p2,
            &"tile-copy-ring-acc".parse::<Schedule>().expect("schedule"),
        )
        .expect("lowers");
        assert!(fast_path(&acc));
        for s in ["tile-copy-ring", "tile-copy-all", "shard-nccl-ring"] {
            let pl = plan(Op::GemmRs, 2048, 2048, 8192, s);
            assert!(fast_path(&pl), "{s}");
            assert!(call_cost_ms(&pl, &hw()) < FULL_CALL_MS, "{s}");
        }
        // Grouped GEMMs (MoE) are not.
        let spec =
            crate::problem::routing::MoeSpec::new(8, 2, crate::problem::routing::Skew::NONE, 1);
        let moe = Problem::moe(Op::A2aGemm, 256, 64, 32, 4, spec).expect("problem");
        let grouped = lower(
            &moe,
            &"shard-nccl-all".parse::<Schedule>().expect("schedule"),
        )
        .expect("lowers");
        assert!(!fast_path(&grouped));
        assert!(call_cost_ms(&grouped, &hw()) >= FULL_CALL_MS);
    }

    #[test]
    fn copies_count_the_operands_peers_touch() {
        // ag-gemm pushing shards: this rank's copies read its own shard and
        // write the peers' scratch, so the caller's tensors are used in
        // place: nothing is copied.
        let (m, k, n) = (8192, 8192, 2560);
        assert_eq!(copy_bytes(&plan(Op::AgGemm, m, k, n, "shard-copy-ring")), 0);
        // gemm-ar on copy engines: peers push into this rank's output,
        // which is ficco's buffer, copied out after the call.
        let ar = plan(Op::GemmAr, m, k, n, "fine2-copy-all");
        assert_eq!(copy_bytes(&ar), m * n * 2);
        assert!(call_cost_ms(&ar, &hw()) > FAST_CALL_MS);
    }
}
