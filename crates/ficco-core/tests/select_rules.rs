//! The selectors away from the measured suite: eight GPUs (no measurements
//! yet, so the simulator is the only check), and tiny, huge and awkward
//! shapes.

use ficco_core::choose::select::{self, Selector};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::{Engine, Schedule};

fn hw() -> HwProfile {
    HwProfile::builtin("h200-nvlink").unwrap()
}

#[test]
fn rules_are_sensible_on_eight_gpus() {
    let hw = hw();
    let suite = ficco_core::problem::suite::parse(
        include_str!("../../../suites/llama3-p8.toml"),
        "llama3-p8.toml",
    )
    .unwrap();
    let mut overlapped = 0;
    for sc in &suite.scenarios {
        let p = sc.problem;
        let sel = select::select_rules(&p, &hw).unwrap();
        let s = sel.schedule;
        if s.is_seq() {
            // Rule 1: only where 7 (14 for gemm-ar) copy latencies exceed
            // what overlap could save.
            let x = select::rule_inputs(&p, &hw);
            let rounds = if p.op == Op::GemmAr { 14.0 } else { 7.0 };
            assert!(
                x.t_comp_ms.min(x.t_comm_ms) < rounds * x.copy_latency_ms,
                "{}",
                sc.name
            );
            continue;
        }
        overlapped += 1;
        assert!(s.misfit(&p).is_none(), "{}: {s}", sc.name);
        assert_eq!(s.engine, Engine::Copy, "{}: {s}", sc.name);
        // The fused reduce only pays on two GPUs (rule 3).
        assert!(!s.fused_reduce, "{}: {s}", sc.name);
        // Predicted faster than the sequential reference.
        let seq = select::predict_ms(&p, &Schedule::SEQ, &hw).unwrap();
        assert!(sel.predicted_ms < seq, "{}: {sel:?} vs seq {seq}", sc.name);
    }
    assert!(overlapped >= 24, "{overlapped}");
}

#[test]
fn tiny_huge_and_awkward_shapes_get_a_fitting_schedule() {
    let hw = hw();
    for op in Op::ALL {
        for gpus in [2, 4, 8] {
            for (m, k, n) in [
                (gpus, 1, 1),
                (gpus * 3, 64, 64),
                (gpus * 128 + gpus, 4096, 4096),
                (gpus * 1000, 12288, 5120),
                (1 << 20, 16384, 53248),
            ] {
                let p = Problem::new(op, m, k, n, gpus).unwrap();
                for sel in Selector::ALL {
                    let s = select::select(&p, &hw, sel).unwrap();
                    let parsed = s.schedule;
                    assert!(
                        parsed.is_seq() || parsed.misfit(&p).is_none(),
                        "{} {sel}: {s:?}",
                        p.label()
                    );
                    assert!(s.predicted_ms.is_finite() && s.predicted_ms > 0.0);
                }
                let r = select::select_rules(&p, &hw).unwrap().schedule;
                if m == gpus {
                    assert_eq!(r, Schedule::SEQ, "{}", p.label());
                }
                if m == 1 << 20 {
                    // Enormous GEMMs: always overlapped, never split below a wave.
                    assert!(!r.is_seq(), "{}", p.label());
                }
            }
        }
    }
}
