//! The result data model: the reference times of a scenario, one row per
//! schedule, a scenario's report and a suite's, and the overlap efficiency.
//! These types are the JSON schema of `ficco explore --json` (see the
//! [module doc](super)); the exporters beside this module only read them.

use crate::problem::workload::{Problem, Scenario};
use serde::{Deserialize, Serialize};

/// The reference times of a scenario, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// T_seq: the collective, then the GEMM (or the reverse).
    pub sequential_ms: f64,
    /// T_comp: the whole GEMM alone.
    pub compute_ms: f64,
    /// T_comm: the whole collective alone.
    pub comm_ms: f64,
    /// T_ideal = max(T_comp, T_comm).
    pub ideal_ms: f64,
}

impl Reference {
    pub fn new(sequential_ms: f64, compute_ms: f64, comm_ms: f64) -> Self {
        Reference {
            sequential_ms,
            compute_ms,
            comm_ms,
            ideal_ms: compute_ms.max(comm_ms),
        }
    }
}

/// One schedule's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleResult {
    /// Canonical schedule name.
    pub name: String,
    /// Measured time (ms); in the sim backend, equal to `predicted_ms`. Null when skipped.
    pub time_ms: Option<f64>,
    /// The simulator's prediction (ms). Null when skipped.
    pub predicted_ms: Option<f64>,
    /// T_seq / time_ms.
    pub speedup: Option<f64>,
    /// E = (T_seq − time_ms) / (T_seq − T_ideal).
    pub efficiency: Option<f64>,
    /// Max over ranks of the relative error of the output; null when not measured.
    pub max_rel_err: Option<f64>,
    /// Why the schedule did not run, or null.
    pub skipped: Option<String>,
    /// The measured output was wrong (only serialized when true).
    #[serde(default, skip_serializing_if = "is_false")]
    pub wrong: bool,
    /// Host-side cost of launching this schedule once (µs, per rank; whether
    /// from CUDA graphs the report's device line says);
    /// GPU backend only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_us: Option<f64>,
    /// This schedule lowers to exactly the plan of the named, earlier row
    /// (e.g. `ring` and `all` with one peer): it was measured once, under
    /// that name, and this row repeats that measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_plan_as: Option<String>,
    /// The fastest and the slowest timed iteration (ms), beside the median
    /// `time_ms`; measured backends only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<f64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl ScheduleResult {
    /// A row for a schedule that did not run.
    pub fn skipped(name: impl Into<String>, reason: impl Into<String>) -> Self {
        ScheduleResult {
            name: name.into(),
            time_ms: None,
            predicted_ms: None,
            speedup: None,
            efficiency: None,
            max_rel_err: None,
            skipped: Some(reason.into()),
            wrong: false,
            launch_us: None,
            same_plan_as: None,
            min_ms: None,
            max_ms: None,
        }
    }

    /// A row that ran; derived columns are filled by [`ScenarioReport::finish`].
    pub fn ran(
        name: impl Into<String>,
        time_ms: f64,
        predicted_ms: f64,
        max_rel_err: Option<f64>,
        wrong: bool,
    ) -> Self {
        ScheduleResult {
            name: name.into(),
            time_ms: Some(time_ms),
            predicted_ms: Some(predicted_ms),
            speedup: None,
            efficiency: None,
            max_rel_err,
            skipped: None,
            wrong,
            launch_us: None,
            same_plan_as: None,
            min_ms: None,
            max_ms: None,
        }
    }

    /// Ran and, where measured, was right.
    pub fn is_valid(&self) -> bool {
        self.skipped.is_none() && !self.wrong && self.time_ms.is_some_and(f64::is_finite)
    }
}

/// E = (T_seq − T) / (T_seq − T_ideal), or `None` when T_seq − T_ideal is
/// not positive beyond rounding (E would be meaningless).
pub fn efficiency(t_seq: f64, t: f64, t_ideal: f64) -> Option<f64> {
    let denom = t_seq - t_ideal;
    let tiny = 1e-6 * t_seq.abs().max(f64::MIN_POSITIVE);
    if denom.is_nan() || denom <= tiny || !t.is_finite() {
        return None;
    }
    Some((t_seq - t) / denom)
}

/// Everything ficco found for one scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioReport {
    pub scenario: String,
    /// The problem, as its own keys at the top level (`op`, `m`, `k`, `n`,
    /// `gpus`, and `side` for `concurrent`).
    #[serde(flatten)]
    pub problem: Problem,
    /// "sim" or "gpu".
    pub backend: String,
    /// Hardware profile name (sim) or device description (gpu).
    pub hardware: String,
    pub reference: Reference,
    pub schedules: Vec<ScheduleResult>,
    /// The fastest correct schedule that ran, by `time_ms`.
    pub best: Option<String>,
    /// The schedule ficco picks without measuring: by default the rule
    /// selector's pick ([`crate::choose::select`]), else the best by `predicted_ms`.
    pub selected: Option<String>,
    /// Which selector chose `selected`: "rules" or "model" (absent in
    /// reports written before selectors existed).
    #[serde(default)]
    pub selector: Option<String>,
    /// Why `selected` is not the default selector's pick: it picked a
    /// schedule that did not run here (e.g. outside `--schedule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection_note: Option<String>,
}

/// Several scenarios' reports: `{"scenarios": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteReport {
    pub scenarios: Vec<ScenarioReport>,
}

fn min_by_key<'a>(
    rows: impl Iterator<Item = &'a ScheduleResult>,
    key: impl Fn(&ScheduleResult) -> Option<f64>,
) -> Option<String> {
    rows.filter_map(|r| key(r).filter(|t| t.is_finite()).map(|t| (t, r)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, r)| r.name.clone())
}

impl ScenarioReport {
    /// A report with no schedule rows yet.
    pub fn new(
        scenario: &Scenario,
        backend: impl Into<String>,
        hardware: impl Into<String>,
        reference: Reference,
    ) -> Self {
        ScenarioReport {
            scenario: scenario.name.clone(),
            problem: scenario.problem,
            backend: backend.into(),
            hardware: hardware.into(),
            reference,
            schedules: vec![],
            best: None,
            selected: None,
            selector: None,
            selection_note: None,
        }
    }

    /// Sets `selected` to `name` chosen by `selector`, when that schedule ran.
    /// Returns whether it did.
    pub fn set_selection(&mut self, name: &str, selector: &str) -> bool {
        let ran = self.row(name).is_some_and(|r| r.skipped.is_none());
        if ran {
            self.selected = Some(name.to_string());
            self.selector = Some(selector.to_string());
        }
        ran
    }

    /// The problem (a copy of the `problem` field).
    pub fn problem(&self) -> Problem {
        self.problem
    }

    /// Median and maximum over the measured schedules of the host-side
    /// launch cost (µs), when the backend reported it.
    pub fn launch_us(&self) -> Option<(f64, f64)> {
        let v: Vec<f64> = self
            .schedules
            .iter()
            .filter(|r| r.same_plan_as.is_none())
            .filter_map(|r| r.launch_us)
            .filter(|x| x.is_finite())
            .collect();
        if v.is_empty() {
            return None;
        }
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((crate::stats::median(&v)?, max))
    }

    /// Fills the derived columns (speedup, E) and `best` / `selected`.
    pub fn finish(&mut self) {
        let r = self.reference;
        for row in &mut self.schedules {
            match row.time_ms.filter(|_| row.skipped.is_none()) {
                Some(t) => {
                    row.speedup = (t > 0.0).then(|| r.sequential_ms / t);
                    row.efficiency = efficiency(r.sequential_ms, t, r.ideal_ms);
                }
                None => {
                    row.speedup = None;
                    row.efficiency = None;
                }
            }
        }
        self.best = min_by_key(self.schedules.iter().filter(|r| r.is_valid()), |r| {
            r.time_ms
        });
        self.selected = min_by_key(self.schedules.iter().filter(|r| r.skipped.is_none()), |r| {
            r.predicted_ms
        });
        self.selector = self.selected.as_ref().map(|_| "model".to_string());
    }

    pub fn row(&self, name: &str) -> Option<&ScheduleResult> {
        self.schedules.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficiency_edges() {
        assert_eq!(efficiency(2.0, 1.0, 1.0), Some(1.0));
        assert_eq!(efficiency(2.0, 2.0, 1.0), Some(0.0));
        assert_eq!(efficiency(2.0, 3.0, 1.0), Some(-1.0));
        assert_eq!(efficiency(1.0, 1.0, 1.0), None);
        assert_eq!(efficiency(1.0, 0.9, 1.2), None);
    }
}
