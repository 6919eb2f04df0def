//! The suite summary: aggregated overlap efficiency per GPU count, geometric
//! means of T / T_ideal and of the speedup, and the scenarios slower than
//! `seq`, for the best measured schedule and for ficco's selection.

use super::{opt, ScenarioReport};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Aggregated efficiency of one GPU count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuEfficiency {
    pub gpus: usize,
    pub scenarios: usize,
    /// Σ(T_seq − T) / Σ(T_seq − T_ideal); null when the denominator is not positive.
    pub aggregated_efficiency: Option<f64>,
}

/// The suite figures for one way of choosing a schedule per scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceSummary {
    /// "best" (fastest measured) or "selected" (ficco's pick without measuring).
    pub choice: String,
    /// Scenarios that had such a schedule.
    pub scenarios: usize,
    pub by_gpus: Vec<GpuEfficiency>,
    /// Geometric mean of T / T_ideal.
    pub geomean_over_ideal: Option<f64>,
    /// Geometric mean of T_seq / T.
    pub geomean_speedup: Option<f64>,
    /// Scenarios where T > T_seq.
    pub slower_than_seq: usize,
}

/// The summary of a suite run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteSummary {
    pub scenarios: usize,
    pub choices: Vec<ChoiceSummary>,
}

fn geomean(xs: &[f64]) -> Option<f64> {
    let xs: Vec<f64> = xs.iter().copied().filter(|x| *x > 0.0).collect();
    (!xs.is_empty()).then(|| (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
}

fn summarize_choice(
    reports: &[ScenarioReport],
    choice: &str,
    pick: impl Fn(&ScenarioReport) -> Option<&str>,
) -> ChoiceSummary {
    // (gpus, T_seq, T, T_ideal)
    let rows: Vec<(usize, f64, f64, f64)> = reports
        .iter()
        .filter_map(|rep| {
            let t = rep.row(pick(rep)?)?.time_ms?;
            let r = rep.reference;
            Some((rep.problem.gpus, r.sequential_ms, t, r.ideal_ms))
        })
        .collect();
    let mut by: BTreeMap<usize, (usize, f64, f64)> = BTreeMap::new();
    for &(g, seq, t, ideal) in &rows {
        let e = by.entry(g).or_default();
        e.0 += 1;
        e.1 += seq - t;
        e.2 += seq - ideal;
    }
    ChoiceSummary {
        choice: choice.to_string(),
        scenarios: rows.len(),
        by_gpus: by
            .into_iter()
            .map(|(gpus, (n, num, den))| GpuEfficiency {
                gpus,
                scenarios: n,
                aggregated_efficiency: (den > 0.0).then(|| num / den),
            })
            .collect(),
        geomean_over_ideal: geomean(
            &rows
                .iter()
                .filter(|r| r.3 > 0.0)
                .map(|r| r.2 / r.3)
                .collect::<Vec<_>>(),
        ),
        geomean_speedup: geomean(
            &rows
                .iter()
                .filter(|r| r.2 > 0.0)
                .map(|r| r.1 / r.2)
                .collect::<Vec<_>>(),
        ),
        slower_than_seq: rows.iter().filter(|r| r.2 > r.1).count(),
    }
}

/// Suite figures for the best schedule and for ficco's selection.
pub fn summarize(reports: &[ScenarioReport]) -> SuiteSummary {
    SuiteSummary {
        scenarios: reports.len(),
        choices: vec![
            summarize_choice(reports, "best", |r| r.best.as_deref()),
            summarize_choice(reports, "selected", |r| r.selected.as_deref()),
        ],
    }
}

impl SuiteSummary {
    /// `#` comment lines in the style of nccl-tests' footer.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# suite summary: {} scenarios", self.scenarios);
        let gpus: Vec<usize> = self
            .choices
            .first()
            .map(|c| c.by_gpus.iter().map(|g| g.gpus).collect())
            .unwrap_or_default();
        let mut head = format!("#  {:<9}", "choice");
        for g in &gpus {
            head += &format!(" {:>10}", format!("agg_E(P={g})"));
        }
        head += &format!(
            " {:>12} {:>12} {:>15}",
            "geo(T/ideal)", "geo(speedup)", "slower_than_seq"
        );
        let _ = writeln!(s, "{head}");
        for c in &self.choices {
            let mut line = format!("#  {:<9}", c.choice);
            for g in &gpus {
                let e = c
                    .by_gpus
                    .iter()
                    .find(|x| x.gpus == *g)
                    .and_then(|x| x.aggregated_efficiency);
                line += &format!(" {:>10}", opt(e, |x| format!("{x:.3}")));
            }
            line += &format!(
                " {:>12} {:>12} {:>15}",
                opt(c.geomean_over_ideal, |x| format!("{x:.3}")),
                opt(c.geomean_speedup, |x| format!("{x:.3}")),
                format!("{}/{}", c.slower_than_seq, c.scenarios)
            );
            let _ = writeln!(s, "{line}");
        }
        let beyond_ideal = self.choices.iter().any(|c| {
            c.geomean_over_ideal.is_some_and(|g| g < 1.0)
                || c.by_gpus
                    .iter()
                    .any(|g| g.aggregated_efficiency.is_some_and(|e| e > 1.0))
        });
        if beyond_ideal {
            let _ = writeln!(
                s,
                "#  (agg_E > 1 or geo(T/ideal) < 1: faster than the ideal, whose comm is the NCCL \
                 collective; copy engines move the same bytes faster, see the README)"
            );
        }
        s
    }
}
