//! The simulator and the selectors against every measured schedule time on
//! 4x H200: run 3 (`bench/data/2026-11-21-h200x4-run3`, 60 scenarios of
//! `suites/llama3.toml`, 2268 valid rows, the base design space) and run 4
//! (`...-run4`, the same scenarios with the fused-reduce `-acc` schedules,
//! 3228 rows), and the P=2 sweep of a separate 2x H200 machine
//! (`bench/data/2026-11-21-h200x2`, 30 scenarios).
//!
//! The simulator (`h200-nvlink` profile, global parameters only) is scored
//! by its error over every valid row; the selectors (rules derived on
//! llama3-8b, llama3-70b held out) by their accuracy, a pick within 5% of
//! the measured best. What each data set scores is in `bench/RESULTS.md`
//! ("Issue 5: simulator calibration and schedule selection"); the bounds
//! below are what is reached, so that a regression fails.
//!
//! Reproduce: `ficco evaluate --measured
//! bench/data/2026-11-21-h200x4-run4/ficco-p2.json,bench/data/2026-11-21-h200x4-run4/ficco-p4.json
//! --holdout llama3-70b` (likewise for run 3 and the 2x H200 file).

use ficco_core::choose::evaluate::{evaluate, Evaluation};
use ficco_core::choose::select::{Selector, DEFAULT_SELECTOR};
use ficco_core::report::{ScenarioReport, SuiteReport};
use ficco_core::sim::profile::HwProfile;
use std::sync::OnceLock;

const RUN3: [&str; 2] = [
    include_str!("../../../bench/data/2026-11-21-h200x4-run3/ficco-p2.json"),
    include_str!("../../../bench/data/2026-11-21-h200x4-run3/ficco-p4.json"),
];
const RUN4: [&str; 2] = [
    include_str!("../../../bench/data/2026-11-21-h200x4-run4/ficco-p2.json"),
    include_str!("../../../bench/data/2026-11-21-h200x4-run4/ficco-p4.json"),
];
const X2: [&str; 1] = [include_str!(
    "../../../bench/data/2026-11-21-h200x2/ficco-p2.json"
)];

fn reports(files: &[&str]) -> Vec<ScenarioReport> {
    files
        .iter()
        .flat_map(|t| serde_json::from_str::<SuiteReport>(t).unwrap().scenarios)
        .collect()
}

/// One evaluation per data set, shared by the tests (CI has two cores).
fn eval(files: &[&str], cell: &'static OnceLock<Evaluation>) -> &'static Evaluation {
    cell.get_or_init(|| {
        let hw = HwProfile::builtin("h200-nvlink").unwrap();
        evaluate(&reports(files), &hw, Some("llama3-70b")).unwrap()
    })
}

fn run3() -> &'static Evaluation {
    static E: OnceLock<Evaluation> = OnceLock::new();
    eval(&RUN3, &E)
}

fn run4() -> &'static Evaluation {
    static E: OnceLock<Evaluation> = OnceLock::new();
    eval(&RUN4, &E)
}

fn x2() -> &'static Evaluation {
    static E: OnceLock<Evaluation> = OnceLock::new();
    eval(&X2, &E)
}

fn acc(ev: &Evaluation, subset: &str, sel: Selector) -> f64 {
    ev.score(subset, sel).unwrap().accuracy
}

#[test]
fn simulator_mape_over_measured_schedules_is_at_most_10_percent() {
    let ev = run3();
    println!("{}", ev.table());
    let all = &ev.subsets[0];
    assert_eq!(all.scenarios, 60);
    assert_eq!(all.sim.rows, 2268);
    assert!(all.sim.mape <= 0.10, "MAPE {}", all.sim.mape);
    assert!(all.sim.median <= 0.08, "median {}", all.sim.median);
    assert!(all.sim.p90 <= 0.20, "p90 {}", all.sim.p90);
    // Held out or not, the simulator is equally good (global parameters).
    for sub in &ev.subsets {
        assert!(sub.sim.mape <= 0.10, "{}: {}", sub.subset, sub.sim.mape);
    }
}

#[test]
fn rule_selector_on_the_fused_reduce_design_space() {
    let ev = run4();
    println!("{}", ev.table());
    assert_eq!(ev.subsets[0].scenarios, 60);
    assert_eq!(ev.subsets[0].sim.rows, 3228);
    let all = ev.score("all", Selector::Rules).unwrap();
    let held = ev.score("holdout", Selector::Rules).unwrap();
    let fit = ev.score("rest", Selector::Rules).unwrap();
    // 50/60, 26/30 held out, 24/30 where the first P = 2 rules were
    // derived. The rules now come from measurements of today's executor
    // (`select_measured.rs`): the 4-H100 soak, then issue 30's 4-H200
    // sweeps (no `fine2` on P > 2, at most 4 fused chunks). Run 4 predates
    // the executor's hang fixes (copies pulled then) and ficco's own GEMM's
    // later sessions; each of those changes gave up one or two picks here
    // (55/60 before them).
    assert!(all.accuracy >= 50.0 / 60.0 - 1e-9, "{all:?}");
    assert!(held.accuracy >= 26.0 / 30.0 - 1e-9, "{held:?}");
    assert!(fit.accuracy >= 24.0 / 30.0 - 1e-9, "{fit:?}");
    assert!(all.worst_slowdown <= 1.10, "{all:?}");
    assert!(all.mean_slowdown <= 1.021, "{all:?}");
    assert_eq!(all.unmeasured, 0);
    // The rules pick fused-reduce schedules where they win.
    let fused = ev
        .scenarios
        .iter()
        .flat_map(|s| &s.picks)
        .filter(|p| p.selector == Selector::Rules && p.schedule.ends_with("-acc"))
        .count();
    assert!(fused >= 10, "{fused}");
}

#[test]
fn rule_selector_on_the_base_design_space_and_another_machine() {
    // Run 3 has no -acc rows: the fused rule is off there.
    let ev = run3();
    println!("{}", ev.table());
    // 54/60 (55/60 before `fine2` left P > 2: run 3 predates today's
    // executor, see the run 4 test).
    assert!(acc(ev, "all", Selector::Rules) >= 54.0 / 60.0 - 1e-9);
    assert!(acc(ev, "holdout", Selector::Rules) >= 28.0 / 30.0 - 1e-9);
    assert!(acc(ev, "rest", Selector::Rules) >= 26.0 / 30.0 - 1e-9);
    assert_eq!(ev.score("all", Selector::Rules).unwrap().unmeasured, 0);
    let ev = x2();
    println!("{}", ev.table());
    assert!(acc(ev, "all", Selector::Rules) >= 0.9 - 1e-9);
    assert!(acc(ev, "rest", Selector::Rules) >= 1.0 - 1e-9);
    assert!(ev.score("all", Selector::Rules).unwrap().worst_slowdown <= 1.13);
}

#[test]
fn rules_beat_the_model_held_out_so_they_are_the_default() {
    for ev in [run4(), run3(), x2()] {
        let rules = ev.score("holdout", Selector::Rules).unwrap();
        let model = ev.score("holdout", Selector::Model).unwrap();
        assert!(rules.accuracy > model.accuracy, "{rules:?} {model:?}");
    }
    // The model selector (copy engines, one stream, simplest within 3%).
    assert!(acc(run4(), "all", Selector::Model) >= 0.70 - 1e-9);
    assert!(acc(run4(), "holdout", Selector::Model) >= 20.0 / 30.0 - 1e-9);
    assert!(acc(run3(), "all", Selector::Model) >= 0.80 - 1e-9);
    assert_eq!(DEFAULT_SELECTOR, Selector::Rules);
}
