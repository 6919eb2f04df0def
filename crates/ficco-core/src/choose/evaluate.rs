//! Scoring the selectors and the simulator against measured explore reports
//! (the oracle): `ficco evaluate`.
//!
//! For every scenario the measured best is the fastest valid row. Each
//! selector ([`crate::choose::select`]) picks a schedule within the design space that
//! was measured (the model selector among the measured rows, re-simulated
//! with the given profile; the rules without their fused-reduce rule when no
//! `-acc` schedule was measured); its slowdown is T_pick / T_best, and it is
//! *accurate* when the slowdown is at most 1 + [`TOLERANCE`]. The simulator's error is |predicted / measured − 1|
//! over every valid row, re-simulated with the given profile.

use crate::choose::select::{self, Selector};
use crate::error::Result;
use crate::report::ScenarioReport;
use crate::sim::profile::HwProfile;
use crate::space::Schedule;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// A pick within this fraction of the measured best counts as accurate.
pub const TOLERANCE: f64 = 0.05;

/// One selector's pick in one scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pick {
    pub selector: Selector,
    pub schedule: String,
    /// Measured time of the pick, ms (null when it was not measured).
    pub time_ms: Option<f64>,
    /// time_ms / best_ms.
    pub slowdown: Option<f64>,
    pub accurate: bool,
}

/// One scenario's evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioEval {
    pub scenario: String,
    pub best: String,
    pub best_ms: f64,
    pub picks: Vec<Pick>,
}

/// A selector's score over a set of scenarios.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectorScore {
    pub selector: Selector,
    pub scenarios: usize,
    /// Fraction of scenarios whose pick is within [`TOLERANCE`] of the best.
    pub accuracy: f64,
    pub mean_slowdown: f64,
    pub worst_slowdown: f64,
    pub worst_scenario: String,
    /// Scenarios whose pick had no measured time (counted inaccurate).
    pub unmeasured: usize,
}

/// The simulator's error over measured rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimError {
    pub rows: usize,
    /// Mean |predicted / measured − 1|.
    pub mape: f64,
    pub median: f64,
    pub p90: f64,
    pub worst: f64,
    /// "scenario schedule" of the worst row.
    pub worst_case: String,
}

/// Scores of one subset of scenarios.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubsetScore {
    /// "all", "holdout" (scenarios whose name starts with the prefix) or
    /// "rest" (the others).
    pub subset: String,
    pub scenarios: usize,
    pub selectors: Vec<SelectorScore>,
    pub sim: SimError,
}

/// What [`evaluate`] found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub hardware: String,
    /// The reports were simulated, not measured (`evaluate --backend sim`):
    /// the "best" is the simulated best, and the simulator's error against
    /// itself is not scored (only serialized when true).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
    pub tolerance: f64,
    pub holdout: Option<String>,
    pub subsets: Vec<SubsetScore>,
    pub scenarios: Vec<ScenarioEval>,
}

/// Evaluates both selectors and the simulator (`hw`) on measured `reports`;
/// with `holdout`, also on the scenarios whose name starts with it and on the rest.
pub fn evaluate(
    reports: &[ScenarioReport],
    hw: &HwProfile,
    holdout: Option<&str>,
) -> Result<Evaluation> {
    let mut evals = Vec::new();
    // Per scenario: (abs error, "scenario schedule") of each valid row.
    let mut errors: Vec<Vec<(f64, String)>> = Vec::new();
    for rep in reports {
        // Valid rows, with their time (a valid row has one).
        let valid: Vec<_> = rep
            .schedules
            .iter()
            .filter(|r| r.is_valid())
            .filter_map(|r| Some((r, r.time_ms?)))
            .collect();
        let Some(&(best, best_ms)) = valid.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
            continue;
        };
        let p = rep.problem();
        let mut errs = Vec::new();
        let mut measured: Vec<Schedule> = Vec::new();
        for &(r, ms) in &valid {
            let Ok(s) = r.name.parse::<Schedule>() else {
                continue;
            };
            measured.push(s);
            if r.same_plan_as.is_some() {
                continue; // one plan's measurement, counted once
            }
            let pred = select::predict_ms(&p, &s, hw)?;
            errs.push((
                (pred / ms - 1.0).abs(),
                format!("{} {}", rep.scenario, r.name),
            ));
        }
        let model = select::select_model_among(&p, hw, &measured)?;
        let rules = select::select_rules_among(&p, hw, &measured)?;
        let picks = [model, rules]
            .into_iter()
            .map(|sel| {
                let name = sel.schedule.name();
                let time_ms = rep
                    .row(&name)
                    .filter(|r| r.is_valid())
                    .and_then(|r| r.time_ms);
                let slowdown = time_ms.map(|t| t / best_ms);
                Pick {
                    selector: sel.selector,
                    schedule: name,
                    time_ms,
                    slowdown,
                    accurate: slowdown.is_some_and(|s| s <= 1.0 + TOLERANCE),
                }
            })
            .collect();
        evals.push(ScenarioEval {
            scenario: rep.scenario.clone(),
            best: best.name.clone(),
            best_ms,
            picks,
        });
        errors.push(errs);
    }
    let mut subsets = vec![subset("all", &evals, &errors, |_| true)];
    if let Some(h) = holdout {
        subsets.push(subset("holdout", &evals, &errors, |n| n.starts_with(h)));
        subsets.push(subset("rest", &evals, &errors, |n| !n.starts_with(h)));
    }
    Ok(Evaluation {
        hardware: hw.name.clone(),
        simulated: !reports.is_empty() && reports.iter().all(|r| r.backend == "sim"),
        tolerance: TOLERANCE,
        holdout: holdout.map(str::to_string),
        subsets,
        scenarios: evals,
    })
}

fn subset(
    name: &str,
    evals: &[ScenarioEval],
    errors: &[Vec<(f64, String)>],
    keep: impl Fn(&str) -> bool,
) -> SubsetScore {
    let idx: Vec<usize> = (0..evals.len())
        .filter(|&i| keep(&evals[i].scenario))
        .collect();
    let selectors = Selector::ALL
        .iter()
        .map(|&sel| {
            let mut n = 0;
            let mut acc = 0;
            let mut unmeasured = 0;
            let mut sum = 0.0;
            let mut worst = (0.0f64, String::new());
            for &i in &idx {
                let Some(p) = evals[i].picks.iter().find(|p| p.selector == sel) else {
                    continue;
                };
                n += 1;
                acc += usize::from(p.accurate);
                match p.slowdown {
                    Some(s) => {
                        sum += s;
                        if s > worst.0 {
                            worst = (s, evals[i].scenario.clone());
                        }
                    }
                    None => unmeasured += 1,
                }
            }
            let measured = (n - unmeasured).max(1);
            SelectorScore {
                selector: sel,
                scenarios: n,
                accuracy: if n == 0 { 0.0 } else { acc as f64 / n as f64 },
                mean_slowdown: sum / measured as f64,
                worst_slowdown: worst.0,
                worst_scenario: worst.1,
                unmeasured,
            }
        })
        .collect();
    let mut errs: Vec<&(f64, String)> = idx.iter().flat_map(|&i| errors[i].iter()).collect();
    errs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = errs.len();
    let q = |f: f64| -> f64 {
        if n == 0 {
            0.0
        } else {
            errs[((n as f64 * f) as usize).min(n - 1)].0
        }
    };
    SubsetScore {
        subset: name.to_string(),
        scenarios: idx.len(),
        selectors,
        sim: SimError {
            rows: n,
            mape: if n == 0 {
                0.0
            } else {
                errs.iter().map(|e| e.0).sum::<f64>() / n as f64
            },
            median: q(0.5),
            p90: q(0.9),
            worst: errs.last().map_or(0.0, |e| e.0),
            worst_case: errs.last().map_or(String::new(), |e| e.1.clone()),
        },
    }
}

impl Evaluation {
    /// The selector score of `selector` in `subset`.
    pub fn score(&self, subset: &str, selector: Selector) -> Option<&SelectorScore> {
        self.subsets
            .iter()
            .find(|s| s.subset == subset)?
            .selectors
            .iter()
            .find(|s| s.selector == selector)
    }

    /// A `#`-commented summary table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let oracle = if self.simulated {
            "simulated"
        } else {
            "measured"
        };
        let _ = writeln!(
            s,
            "# ficco evaluate: {} scenarios, profile {}, accurate = within {:.0}% of the {oracle} best",
            self.scenarios.len(),
            self.hardware,
            100.0 * self.tolerance
        );
        if self.simulated {
            let _ = writeln!(
                s,
                "# no GPU measured these: the simulator is the oracle, so this scores the selectors against it"
            );
        }
        let _ = writeln!(
            s,
            "# {:<8} {:>9} {:<9} {:>9} {:>10} {:>10}  worst scenario",
            "subset", "scenarios", "selector", "accuracy", "mean_slow", "worst_slow"
        );
        for sub in &self.subsets {
            for sel in &sub.selectors {
                let _ = writeln!(
                    s,
                    "  {:<8} {:>9} {:<9} {:>8.1}% {:>10.3} {:>10.3}  {}",
                    sub.subset,
                    sel.scenarios,
                    sel.selector.name(),
                    100.0 * sel.accuracy,
                    sel.mean_slowdown,
                    sel.worst_slowdown,
                    sel.worst_scenario
                );
            }
        }
        if self.simulated {
            let _ = writeln!(
                s,
                "# simulator error: not scored (it would be compared with itself); measure with --backend gpu or score saved measurements with --measured"
            );
            return s;
        }
        let _ = writeln!(
            s,
            "# {:<8} {:>6} {:>7} {:>7} {:>7} {:>7}  worst row",
            "subset", "rows", "MAPE", "median", "p90", "worst"
        );
        for sub in &self.subsets {
            let e = &sub.sim;
            let _ = writeln!(
                s,
                "  {:<8} {:>6} {:>6.1}% {:>6.1}% {:>6.1}% {:>6.1}%  {}",
                sub.subset,
                e.rows,
                100.0 * e.mape,
                100.0 * e.median,
                100.0 * e.p90,
                100.0 * e.worst,
                e.worst_case
            );
        }
        s
    }
}
