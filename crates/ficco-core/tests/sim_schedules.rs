//! Every enumerated schedule of a few suite shapes, lowered and simulated on
//! the calibrated `h200-nvlink` profile: no errors, positive times, the `seq`
//! plan agrees with the cost model and the anchor, and overlap pays where it
//! should.

use ficco_core::plan::lower::{comm_only, gemm_only, lower};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::cost;
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::simulate;
use ficco_core::space::{enumerate, Schedule, SpaceOptions};

fn hw() -> HwProfile {
    HwProfile::builtin("h200-nvlink").unwrap()
}

fn space(hw: &HwProfile) -> SpaceOptions {
    SpaceOptions {
        controls: true,
        sm_count: hw.sm_count,
        nccl_sms: hw.nccl_sms,
    }
}

/// (problem, measured seq ms) from the anchor.
fn shapes() -> Vec<(Problem, f64)> {
    vec![
        (
            Problem::new(Op::AgGemm, 8192, 8192, 2560, 4).unwrap(),
            0.802,
        ),
        (
            Problem::new(Op::GemmRs, 8192, 2048, 8192, 4).unwrap(),
            0.759,
        ),
        (
            Problem::new(Op::GemmAr, 8192, 2048, 8192, 4).unwrap(),
            1.032,
        ),
        (
            Problem::new(Op::AgGemm, 2048, 4096, 3072, 2).unwrap(),
            0.138,
        ),
        (
            Problem::new(Op::GemmRs, 16384, 4096, 8192, 2).unwrap(),
            2.082,
        ),
        (
            Problem::new(Op::GemmAr, 2048, 1024, 4096, 4).unwrap(),
            0.135,
        ),
    ]
}

/// Simulated times of every fitting schedule, `seq` first.
fn simulate_all(p: &Problem, hw: &HwProfile) -> Vec<(Schedule, f64)> {
    let mut out = Vec::new();
    for s in enumerate(p.op, space(hw)) {
        if s.misfit(p).is_some() {
            continue;
        }
        let plan = lower(p, &s).unwrap();
        let tl = simulate(&plan, hw).unwrap_or_else(|e| panic!("{} {s}: {e}", p.label()));
        assert!(
            tl.total_ms > 0.0 && tl.total_ms.is_finite(),
            "{} {s}",
            p.label()
        );
        assert_eq!(tl.spans.len(), plan.task_count());
        for sp in &tl.spans {
            assert!(
                sp.start_ms.is_finite() && sp.end_ms >= sp.start_ms,
                "{} {s}: {sp:?}",
                p.label()
            );
        }
        out.push((s, tl.total_ms));
    }
    out
}

#[test]
fn every_schedule_simulates_and_seq_matches_the_anchor() {
    let hw = hw();
    for (p, anchor_seq) in shapes() {
        let all = simulate_all(&p, &hw);
        assert!(all.len() > 10, "{}: {}", p.label(), all.len());
        let (s0, seq) = all[0];
        assert!(s0.is_seq());
        let formula = cost::problem_seq_ms(&hw, &p);
        assert!(
            (seq / formula - 1.0).abs() < 1e-6,
            "{}: simulated seq {seq} vs cost model {formula}",
            p.label()
        );
        assert!(
            (seq / anchor_seq - 1.0).abs() < 0.15,
            "{}: simulated seq {seq} vs anchor {anchor_seq}",
            p.label()
        );
        let g = simulate(&gemm_only(&p), &hw).unwrap().total_ms;
        assert!((g / cost::problem_gemm_ms(&hw, &p) - 1.0).abs() < 1e-6);
        let c = simulate(&comm_only(&p), &hw).unwrap().total_ms;
        assert!(
            (c / cost::problem_comm_ms(&hw, &p) - 1.0).abs() < 1e-6,
            "{c}"
        );
        // Every schedule does the whole GEMM's work on each rank, in chunks
        // that are no more efficient than the whole, so none beats gemm-only
        // by more than a little (two streams can fill a wave-quantization tail).
        // The collective is no bound: copy engines can beat NCCL.
        let ideal = g.max(c);
        for &(s, t) in &all {
            assert!(t > 0.95 * g, "{} {s}: {t} < gemm-only {g}", p.label());
        }
        let mut sorted = all.clone();
        sorted.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
        println!(
            "{}: seq {seq:.3} (anchor {anchor_seq:.3}), ideal {ideal:.3}, best {} {:.3}, worst {} {:.3}",
            p.label(),
            sorted[0].0,
            sorted[0].1,
            sorted[sorted.len() - 1].0,
            sorted[sorted.len() - 1].1
        );
    }
}

#[test]
fn overlap_beats_seq_on_the_mission_shape() {
    let hw = hw();
    let p = Problem::new(Op::AgGemm, 8192, 8192, 2560, 4).unwrap();
    let all = simulate_all(&p, &hw);
    let seq = all[0].1;
    let (best, t) = all[1..]
        .iter()
        .cloned()
        .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap())
        .unwrap();
    for (s, t) in &all {
        println!("{s:<28} {t:.3}");
    }
    assert!(t < 0.9 * seq, "best {best} {t} vs seq {seq}");
}

#[test]
fn simulated_seq_plan_equals_the_cost_model_on_every_anchor_scenario() {
    let hw = hw();
    for line in include_str!("../data/anchor-h200x4.jsonl").lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let get = |k: &str| v[k].as_u64().unwrap() as usize;
        let op: Op = v["op"].as_str().unwrap().parse().unwrap();
        let p = Problem::new(op, get("m"), get("k"), get("n"), get("gpus")).unwrap();
        let t = simulate(&lower(&p, &Schedule::SEQ).unwrap(), &hw)
            .unwrap()
            .total_ms;
        let want = cost::problem_seq_ms(&hw, &p);
        assert!(
            (t / want - 1.0).abs() < 1e-6,
            "{}: {t} vs {want}",
            p.label()
        );
        let measured = v["seq_ms"].as_f64().unwrap();
        assert!(
            (t / measured - 1.0).abs() < 0.3,
            "{}: {t} vs {measured}",
            p.label()
        );
    }
}
