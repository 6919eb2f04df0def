//! The rule selector against stored GPU measurements of the whole design
//! space: it never picks a schedule measured slower than `seq`.
//!
//! `data/soak-h100x4-b405ac2.json` is `ficco soak` on 4 H100s at commit
//! `b405ac2` (every schedule of every llama3-8b and llama3-70b layer at 2048
//! and 16384 tokens, on 4 and on 2 of the GPUs; the fastest of two runs of a
//! few iterations each, `bench/soak_fixture.py`). The P = 4 rules (tile off,
//! `ring` order, rule 1's margin for reductions) were derived from its P = 4
//! half, so there the test is exact: no pick slower than `seq` at all. Its
//! P = 2 half and the older 4-H200 runs 3 and 4 (2026-11-21, an executor
//! before the hang fixes) are data the rules were not derived from; there a
//! pick may be up to [`NOISE`] above `seq`, the spread of repeated
//! measurements (the two runs of one schedule in the soak differ by up to
//! 30%, `llama3-70b.mlp_down.t16384.p2`). The `concurrent` operator is
//! chosen by the model selector (`explore`); its picks are checked on the
//! two 4-H200 runs of the concurrent suite.

use ficco_core::choose::select;
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::report::{ScenarioReport, SuiteReport};
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::Schedule;
use serde::Deserialize;
use std::collections::BTreeMap;

mod common;
use common::Row;

/// A pick may be this much slower than `seq` on data the rules were not
/// derived from.
const NOISE: f64 = 1.05;

#[derive(Deserialize)]
struct Fixture {
    scenarios: Vec<Row>,
}

/// The measured time of every schedule of a stored report's scenario.
fn measured(s: &ScenarioReport) -> BTreeMap<String, f64> {
    s.schedules
        .iter()
        .filter_map(|x| Some((x.name.clone(), x.time_ms?)))
        .collect()
}

/// (scenario, the rule pick's time / seq's) of every row, picking among
/// the measured schedules.
fn pick_over_seq(rows: &[Row], hw: &HwProfile) -> Vec<(String, usize, String, f64)> {
    rows.iter()
        .map(|r| {
            let op: Op = r.op.parse().unwrap();
            let p = Problem::new(op, r.m, r.k, r.n, r.gpus).unwrap();
            let among: Vec<Schedule> = r.times_ms.keys().map(|s| s.parse().unwrap()).collect();
            let pick = select::select_rules_among(&p, hw, &among).unwrap();
            let name = pick.schedule.name();
            let t = r.times_ms[&name];
            (r.scenario.clone(), r.gpus, name, t / r.times_ms["seq"])
        })
        .collect()
}

#[test]
fn rule_picks_are_never_measured_slower_than_seq_in_the_h100_soak() {
    let f: Fixture = serde_json::from_str(include_str!("data/soak-h100x4-b405ac2.json")).unwrap();
    assert_eq!(f.scenarios.len(), 40);
    let hw = HwProfile::builtin("h100-nvlink").unwrap();
    let picks = pick_over_seq(&f.scenarios, &hw);
    for (scenario, gpus, name, ratio) in &picks {
        let limit = if *gpus == 4 { 1.0 } else { NOISE };
        assert!(*ratio <= limit, "{scenario}: {name} is {ratio:.3}x seq");
    }
    // And at P = 4 the picks are close to the best: geomean within 2%.
    let p4: Vec<_> = f.scenarios.iter().filter(|r| r.gpus == 4).collect();
    let log_sum: f64 = p4
        .iter()
        .map(|r| {
            let p = picks.iter().find(|x| x.0 == r.scenario).unwrap();
            let best = r.times_ms.values().cloned().fold(f64::INFINITY, f64::min);
            (r.times_ms[&p.2] / best).ln()
        })
        .sum();
    let geomean = (log_sum / p4.len() as f64).exp();
    assert!(geomean <= 1.02, "geomean pick/best {geomean:.3}");
}

#[test]
fn rule_picks_are_never_measured_slower_than_seq_in_the_older_h200_runs() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    for text in [
        include_str!("../../../bench/data/2026-11-21-h200x4-run3/ficco-p4.json"),
        include_str!("../../../bench/data/2026-11-21-h200x4-run4/ficco-p4.json"),
    ] {
        let report: SuiteReport = serde_json::from_str(text).unwrap();
        let rows: Vec<Row> = report
            .scenarios
            .iter()
            .map(|s| Row {
                scenario: s.scenario.clone(),
                op: s.problem.op.to_string(),
                m: s.problem.m,
                k: s.problem.k,
                n: s.problem.n,
                gpus: s.problem.gpus,
                times_ms: measured(s),
            })
            .collect();
        for (scenario, _, name, ratio) in pick_over_seq(&rows, &hw) {
            assert!(ratio <= NOISE, "{scenario}: {name} is {ratio:.3}x seq");
        }
    }
}

#[test]
fn concurrent_picks_are_never_measured_slower_than_seq() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    for text in [
        include_str!("../../../bench/data/2026-11-21-h200x4-concurrent/concurrent.json"),
        include_str!("../../../bench/data/2026-11-21-h200x4-concurrent-run2/concurrent.json"),
    ] {
        let report: SuiteReport = serde_json::from_str(text).unwrap();
        assert_eq!(report.scenarios.len(), 5);
        for s in &report.scenarios {
            let times = measured(s);
            let among: Vec<Schedule> = times.keys().map(|n| n.parse().unwrap()).collect();
            let pick = select::select_model_among(&s.problem, &hw, &among).unwrap();
            let name = pick.schedule.name();
            let ratio = times[&name] / times["seq"];
            assert!(ratio <= 1.0, "{}: {name} is {ratio:.3}x seq", s.scenario);
        }
    }
}

/// `data/sweeps-h200x4-ffd6dd6.json` (`bench/sweep_fixture.py`): the llama3
/// suite and the held-out validation set (`suites/validation.toml`), each at
/// P = 4 and P = 2, every schedule measured beside PyTorch on 4 H200s
/// (`bench/data/2026-11-26-h200x4-rules`). The rules of issue 30's second
/// round (no `fine2` on P > 2, at most 4 fused chunks) were derived from the
/// llama3 half; the validation half was chosen before it was measured and
/// played no part in them. (A third change, fusing gemm-rs on 2 GPUs up to
/// T_comp/T_comm = 5, raised E on llama3 at P = 2 from 0.79 to 0.82 but not
/// on the validation set, and lost at every llama3 gemm-rs of the older
/// run 4: dropped.)
///
/// The fastest measured schedule of each scenario reaches E 0.954 / 0.862
/// / 0.856 / 1.007 on these sweeps (llama3 P = 4 / P = 2, validation P = 4 /
/// P = 2; printed with `--nocapture`): issue 30's E ≥ 0.95 at P = 2 is
/// above what any pick reaches on llama3 here, and its 0.85 at P = 4 on the
/// validation set leaves 0.006 of slack.
///
/// Asserted: the aggregated E of the rule pick (against PyTorch's reference,
/// as `score_tune.py` computes it) on each sweep, and that every pick
/// measured slower than `seq` is a compute-bound ag-gemm (T_comp/T_comm ≥ 5
/// in the cost model: at most T_comm/T_comp of the time to win, within the
/// power-capped GEMM's own spread) and at most 11% slower. That is the
/// known miss of the "never slower than seq" target.
#[test]
fn rule_picks_on_the_h200_sweeps() {
    let f = common::h200_sweeps();
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let floor = BTreeMap::from([
        ("llama3-p4", 0.90),
        ("llama3-p2", 0.78),
        ("validation-p4", 0.79),
        ("validation-p2", 0.89),
    ]);
    assert_eq!(f.sweeps.len(), floor.len());
    for sweep in &f.sweeps {
        let rows: Vec<Row> = sweep.scenarios.iter().map(|s| s.row.clone()).collect();
        let picks = pick_over_seq(&rows, &hw);
        let (mut seq, mut ideal, mut pick, mut best) = (0.0, 0.0, 0.0, 0.0);
        for (s, (_, _, name, ratio)) in sweep.scenarios.iter().zip(&picks) {
            seq += s.torch_seq_ms;
            ideal += s.torch_ideal_ms;
            pick += s.row.times_ms[name];
            best += s
                .row
                .times_ms
                .values()
                .copied()
                .fold(f64::INFINITY, f64::min);
            if *ratio > 1.0 {
                let op: Op = s.row.op.parse().unwrap();
                let p = Problem::new(op, s.row.m, s.row.k, s.row.n, s.row.gpus).unwrap();
                let x = select::rule_inputs(&p, &hw);
                assert!(
                    op == Op::AgGemm && x.ratio >= 5.0 && *ratio <= 1.11,
                    "{}: {name} is {ratio:.3}x seq (T_comp/T_comm {:.2})",
                    s.row.scenario,
                    x.ratio
                );
            }
        }
        let e = (seq - pick) / (seq - ideal);
        // What picking the fastest measured schedule of every scenario
        // reaches: the ceiling of any selector on this data.
        let oracle = (seq - best) / (seq - ideal);
        eprintln!(
            "{}: rule pick E {e:.3}, best measured E {oracle:.3}",
            sweep.label
        );
        assert!(e <= oracle + 1e-9);
        let want = floor[sweep.label.as_str()];
        assert!(e >= want, "{}: aggregated E {e:.3} < {want}", sweep.label);
    }
}
