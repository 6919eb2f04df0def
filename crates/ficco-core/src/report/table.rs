//! The nccl-tests style table of one scenario's report: a `#` header, a
//! units line, one row per schedule and a `#` footer with the best and the
//! selected schedule (and why they differ, when they do).
//!
//! The simulator's table has no `predicted`, `rel_err` or `#wrong` column:
//! its time is the prediction, and no output was computed to check.

use super::{ms, opt, ScenarioReport};
use std::fmt::Write as _;

impl ScenarioReport {
    /// The nccl-tests style table: `#` header, units line, one row per
    /// schedule, `#` footer.
    pub fn table(&self) -> String {
        let r = &self.reference;
        let mut s = String::new();
        let _ = writeln!(s, "# ficco explore: {}", self.scenario);
        let label = self.problem().label();
        if label != self.scenario {
            let _ = writeln!(s, "# problem: {label}");
        }
        if let Some(rt) = self.problem().routing() {
            let _ = writeln!(s, "# routing: {}", rt.summary());
        }
        // The simulator has nothing to compare its time with: the time is
        // the prediction, and nothing was checked.
        let sim = self.backend == "sim";
        // Measurements with their iterations' range (reports saved before
        // ranges existed have none: their table is as it was).
        let ranged = !sim && self.schedules.iter().any(|r| r.min_ms.is_some());
        let _ = writeln!(
            s,
            "# backend: {}   hardware: {}   dtype: bf16",
            self.backend, self.hardware
        );
        if sim {
            let _ = writeln!(
                s,
                "# times are the simulator's predictions: no GPU ran them, so no output was checked"
            );
        }
        let _ = writeln!(
            s,
            "# reference: seq {}  compute {}  comm {}  ideal {}  (ms)",
            ms(r.sequential_ms),
            ms(r.compute_ms),
            ms(r.comm_ms),
            ms(r.ideal_ms)
        );
        let _ = writeln!(
            s,
            "# E = (seq - time) / (seq - ideal), ideal = max(compute, comm); comm is the NCCL collective,"
        );
        let _ = writeln!(
            s,
            "#   so E > 1 where copy engines move the data faster than NCCL does (see README)"
        );
        let _ = writeln!(s, "#");
        let w = self
            .schedules
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(8)
            .max(8);
        if sim {
            let _ = writeln!(
                s,
                "# {:<w$} {:>10} {:>8} {:>7}",
                "schedule", "time", "speedup", "E"
            );
            let _ = writeln!(s, "# {:<w$} {:>10} {:>8} {:>7}", "", "(ms)", "(x)", "");
        } else if ranged {
            let _ = writeln!(
                s,
                "# time is the median of the timed iterations (each the slowest rank's); min and max their range"
            );
            let _ = writeln!(
                s,
                "# {:<w$} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9}  #wrong",
                "schedule", "time", "min", "max", "predicted", "speedup", "E", "rel_err"
            );
            let _ = writeln!(
                s,
                "# {:<w$} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9}",
                "", "(ms)", "(ms)", "(ms)", "(ms)", "(x)", "", ""
            );
        } else {
            let _ = writeln!(
                s,
                "# {:<w$} {:>10} {:>10} {:>8} {:>7} {:>9}  #wrong",
                "schedule", "time", "predicted", "speedup", "E", "rel_err"
            );
            let _ = writeln!(
                s,
                "# {:<w$} {:>10} {:>10} {:>8} {:>7} {:>9}",
                "", "(ms)", "(ms)", "(x)", "", ""
            );
        }
        for row in &self.schedules {
            let twin = row
                .same_plan_as
                .as_deref()
                .map(|t| format!("  (same plan as {t})"))
                .unwrap_or_default();
            if sim {
                let last = match &row.skipped {
                    Some(reason) => format!("skipped: {reason}"),
                    None => twin,
                };
                let _ = writeln!(
                    s,
                    "  {:<w$} {:>10} {:>8} {:>7}  {last}",
                    row.name,
                    opt(row.time_ms, ms),
                    opt(row.speedup, |x| format!("{x:.3}")),
                    opt(row.efficiency, |x| format!("{x:.2}")),
                );
                continue;
            }
            let range = if ranged {
                let r = if row.skipped.is_some() {
                    ["-".to_string(), "-".to_string()]
                } else {
                    [opt(row.min_ms, ms), opt(row.max_ms, ms)]
                };
                format!(" {:>10} {:>10}", r[0], r[1])
            } else {
                String::new()
            };
            if let Some(reason) = &row.skipped {
                let _ = writeln!(
                    s,
                    "  {:<w$} {:>10}{range} {:>10} {:>8} {:>7} {:>9}  skipped: {reason}",
                    row.name, "-", "-", "-", "-", ""
                );
                continue;
            }
            let wrong = if row.max_rel_err.is_some() || row.wrong {
                if row.wrong {
                    "1"
                } else {
                    "0"
                }
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "  {:<w$} {:>10}{range} {:>10} {:>8} {:>7} {:>9}  {}{twin}",
                row.name,
                opt(row.time_ms, ms),
                opt(row.predicted_ms, ms),
                opt(row.speedup, |x| format!("{x:.3}")),
                opt(row.efficiency, |x| format!("{x:.2}")),
                row.max_rel_err
                    .map(|e| format!("{e:.1e}"))
                    .unwrap_or_default(),
                wrong
            );
        }
        let best = self.best.as_deref().and_then(|b| self.row(b));
        match best {
            Some(b) => {
                let _ = writeln!(
                    s,
                    "# best: {}  {} ms  speedup {}  E {}",
                    b.name,
                    opt(b.time_ms, ms),
                    opt(b.speedup, |x| format!("{x:.3}")),
                    opt(b.efficiency, |x| format!("{x:.2}"))
                );
            }
            None => {
                let _ = writeln!(s, "# best: none (no schedule ran correctly)");
            }
        }
        let selector = self.selector.as_deref().unwrap_or("model");
        let selected = self.selected.as_deref().and_then(|n| self.row(n));
        match (selected, best) {
            (Some(sel), Some(b)) if sel.name != b.name => {
                let slower = match (sel.time_ms, b.time_ms) {
                    _ if sel.wrong => ", its output was wrong".to_string(),
                    (Some(t), Some(tb)) if tb > 0.0 && t >= tb => {
                        format!(", {:.1}% slower than best", 100.0 * (t / tb - 1.0))
                    }
                    _ => String::new(),
                };
                let _ = writeln!(
                    s,
                    "# selected ({selector}): {}  {} ms{slower}",
                    sel.name,
                    opt(sel.time_ms, ms)
                );
                let _ = writeln!(s, "#   ({})", why_not_best(selector));
            }
            _ => {
                let _ = writeln!(
                    s,
                    "# selected ({selector}): {}",
                    self.selected.as_deref().unwrap_or("none")
                );
            }
        }
        if let Some(note) = &self.selection_note {
            let _ = writeln!(s, "#   ({note})");
        }
        let wrong = self.schedules.iter().filter(|r| r.wrong).count();
        let skipped = self
            .schedules
            .iter()
            .filter(|r| r.skipped.is_some())
            .count();
        if sim {
            let _ = writeln!(
                s,
                "# ideal: {} ms   seq: {} ms   skipped: {skipped}",
                ms(r.ideal_ms),
                ms(r.sequential_ms)
            );
        } else {
            let _ = writeln!(
                s,
                "# ideal: {} ms   seq: {} ms   #wrong: {wrong}   skipped: {skipped}",
                ms(r.ideal_ms),
                ms(r.sequential_ms)
            );
        }
        if let Some((median, max)) = self.launch_us() {
            let _ = writeln!(
                s,
                "# host launch per operator: median {median:.1} us, max {max:.1} us over schedules"
            );
        }
        // Rows with an empty last column would end in spaces.
        s.lines().map(str::trim_end).collect::<Vec<_>>().join("\n") + "\n"
    }
}

/// Why the selector's pick is not the best schedule of the table.
fn why_not_best(selector: &str) -> &'static str {
    match selector {
        "rules" => {
            "the rules choose from the shape alone, as `ficco select` does without running \
             anything; best is the fastest that ran here"
        }
        _ => {
            "the model chooses the best predicted, as `ficco select --selector model` does; \
             best is the fastest that ran here"
        }
    }
}
