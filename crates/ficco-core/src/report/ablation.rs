//! The control ablation of a `concurrent` report: back to back, plain
//! overlap, each resource control alone on top of it, and the best
//! combination, as the resource-aware overlap paper shows it.

use super::{ScenarioReport, ScheduleResult};
use crate::problem::workload::Op;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One row of a control ablation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AblationRow {
    /// What the row shows, e.g. "back to back", "overlap", "+ -hi", "best combination".
    pub setting: String,
    /// The schedule measured for it.
    pub schedule: String,
    pub time_ms: f64,
    pub predicted_ms: Option<f64>,
    /// 1 − time / T_seq.
    pub reduction: f64,
    /// time / T_ideal.
    pub vs_ideal: f64,
}

/// The ablation of a `concurrent` report, as the resource-aware paper shows
/// it: back to back, plain overlap (`shard-nccl-ring`), each control alone on
/// top of it (the copy engine counts as one: the faster of `shard-copy-ring`
/// and `-all`), and the best combination. Rows that did not run (or were
/// wrong) are left out; `None` for other operators.
pub fn ablation(r: &ScenarioReport) -> Option<Vec<AblationRow>> {
    use crate::space::{Engine, Priority, Schedule};
    if r.problem.op != Op::Concurrent {
        return None;
    }
    let ok = |row: &&ScheduleResult| row.skipped.is_none() && row.time_ms.is_some() && !row.wrong;
    let parsed: Vec<(&ScheduleResult, Schedule)> = r
        .schedules
        .iter()
        .filter(ok)
        .filter_map(|row| Some((row, row.name.parse::<Schedule>().ok()?)))
        .collect();
    let seq = r.reference.sequential_ms;
    let ideal = r.reference.ideal_ms;
    let mk = |setting: &str, row: &ScheduleResult| -> Option<AblationRow> {
        let t = row.time_ms?;
        Some(AblationRow {
            setting: setting.to_string(),
            schedule: row.name.clone(),
            time_ms: t,
            predicted_ms: row.predicted_ms,
            reduction: 1.0 - t / seq,
            vs_ideal: t / ideal,
        })
    };
    let find = |pred: &dyn Fn(&Schedule) -> bool| {
        parsed
            .iter()
            .filter(|(_, s)| pred(s))
            .min_by(|a, b| {
                a.0.time_ms
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&b.0.time_ms.unwrap_or(f64::INFINITY))
            })
            .map(|(row, _)| *row)
    };
    let mut out = vec![];
    out.extend(find(&|s| s.is_seq()).and_then(|row| mk("back to back", row)));
    let plain = |s: &Schedule| !s.is_seq() && s.engine == Engine::Nccl;
    out.extend(find(&|s| plain(s) && !s.has_controls()).and_then(|row| mk("overlap (NCCL)", row)));
    type Has<'a> = &'a dyn Fn(&Schedule) -> bool;
    let singles: [(&str, Has); 6] = [
        ("+ comm priority high", &|s| {
            s.comm_priority == Priority::High
        }),
        ("+ ficco's own GEMM", &only_own),
        ("+ own GEMM, SM budget", &|s| s.sm_target.is_some()),
        ("+ green context", &|s| s.green_sms.is_some()),
        ("+ own GEMM, fewer stages", &|s| s.occupancy.is_some()),
        ("+ NCCL CTA limit", &|s| s.nccl_ctas.is_some()),
    ];
    for (label, has) in singles {
        let alone = |s: &Schedule| plain(s) && has(s) && controls_set(s) == 1;
        out.extend(find(&alone).and_then(|row| mk(label, row)));
    }
    out.extend(
        find(&|s| !s.is_seq() && s.engine == Engine::Copy && !s.has_controls())
            .and_then(|row| mk("copy engines instead of NCCL", row)),
    );
    out.extend(find(&|s| !s.is_seq()).and_then(|row| mk("best combination", row)));
    Some(out)
}

/// `-own` alone: ficco's GEMM with no SM budget or stage count (which imply it).
fn only_own(s: &crate::space::Schedule) -> bool {
    s.gemm == crate::space::GemmEngine::Own && s.sm_target.is_none() && s.occupancy.is_none()
}

/// How many resource controls `s` sets.
fn controls_set(s: &crate::space::Schedule) -> usize {
    [
        only_own(s),
        s.sm_target.is_some(),
        s.green_sms.is_some(),
        s.occupancy.is_some(),
        s.nccl_ctas.is_some(),
        s.comm_priority == crate::space::Priority::High,
    ]
    .into_iter()
    .filter(|&b| b)
    .count()
}

/// The ablation as `#` comment lines.
pub fn ablation_table(rows: &[AblationRow]) -> String {
    let mut s = String::from(
        "# ablation (each control alone on top of overlap, then the best combination)\n",
    );
    let _ = writeln!(
        s,
        "#  {:<30} {:<32} {:>9} {:>9} {:>9} {:>8}",
        "setting", "schedule", "time_ms", "pred_ms", "saved", "T/Tideal"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "   {:<30} {:<32} {:>9.4} {:>9} {:>8.1}% {:>8.3}",
            r.setting,
            r.schedule,
            r.time_ms,
            r.predicted_ms.map_or("-".into(), |p| format!("{p:.4}")),
            100.0 * r.reduction,
            r.vs_ideal
        );
    }
    s
}
