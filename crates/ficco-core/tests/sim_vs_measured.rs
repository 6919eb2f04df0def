//! The simulator and the selectors against every measured schedule time of
//! run 3 on 4x H200 (`bench/data/2026-11-21-h200x4-run3`, 60 scenarios of
//! `suites/llama3.toml`, 2268 valid rows).
//!
//! Reached with the `h200-nvlink` profile (global parameters only): simulator
//! MAPE 9.0% (median 7.2%, p90 18.7%, worst 53%; it was 14.9% / 11.5% /
//! 31.4% / 136% before issue 5). The rule selector, derived on llama3-8b
//! only, picks within 5% of the measured best in 100% of llama3-8b and 83.3%
//! of the held-out llama3-70b scenarios (91.7% overall, worst slowdown
//! 1.128); the model selector reaches 50% overall. The held-out target of
//! 90% is NOT met; the bounds below are what is reached.
//!
//! Reproduce: `ficco evaluate --measured
//! bench/data/2026-11-21-h200x4-run3/ficco-p2.json,bench/data/2026-11-21-h200x4-run3/ficco-p4.json
//! --holdout llama3-70b`.

use ficco_core::evaluate::evaluate;
use ficco_core::profile::HwProfile;
use ficco_core::report::{ScenarioReport, SuiteReport};
use ficco_core::select::{Selector, DEFAULT_SELECTOR};

const P2: &str = include_str!("../../../bench/data/2026-11-21-h200x4-run3/ficco-p2.json");
const P4: &str = include_str!("../../../bench/data/2026-11-21-h200x4-run3/ficco-p4.json");

fn reports() -> Vec<ScenarioReport> {
    [P2, P4]
        .iter()
        .flat_map(|t| serde_json::from_str::<SuiteReport>(t).unwrap().scenarios)
        .collect()
}

#[test]
fn simulator_mape_over_measured_schedules_is_at_most_10_percent() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let ev = evaluate(&reports(), &hw, Some("llama3-70b")).unwrap();
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
fn rule_selector_accuracy_on_the_suite_and_held_out() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let ev = evaluate(&reports(), &hw, Some("llama3-70b")).unwrap();
    let rules_all = ev.score("all", Selector::Rules).unwrap();
    let rules_held = ev.score("holdout", Selector::Rules).unwrap();
    let rules_fit = ev.score("rest", Selector::Rules).unwrap();
    let model_all = ev.score("all", Selector::Model).unwrap();
    let model_held = ev.score("holdout", Selector::Model).unwrap();
    assert!(rules_fit.accuracy >= 0.999, "{rules_fit:?}");
    assert!(rules_all.accuracy >= 0.9, "{rules_all:?}");
    assert!(rules_held.accuracy >= 0.83, "{rules_held:?}");
    assert!(rules_all.worst_slowdown <= 1.13, "{rules_all:?}");
    assert!(rules_all.mean_slowdown <= 1.02, "{rules_all:?}");
    assert_eq!(rules_all.unmeasured, 0);
    // Rules beat the model held out, so they are the default.
    assert!(rules_held.accuracy > model_held.accuracy);
    assert!(rules_all.worst_slowdown < model_all.worst_slowdown);
    assert_eq!(DEFAULT_SELECTOR, Selector::Rules);
}
