//! The nccl-tests style table of one scenario's report: a `#` header, a
//! units line, one row per schedule and a `#` footer with the best and the
//! selected schedule.

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
        let _ = writeln!(
            s,
            "# backend: {}   hardware: {}",
            self.backend, self.hardware
        );
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
        for row in &self.schedules {
            if let Some(reason) = &row.skipped {
                let _ = writeln!(
                    s,
                    "  {:<w$} {:>10} {:>10} {:>8} {:>7} {:>9}  skipped: {reason}",
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
            let twin = row
                .same_plan_as
                .as_deref()
                .map(|t| format!("  (same plan as {t})"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  {:<w$} {:>10} {:>10} {:>8} {:>7} {:>9}  {}{twin}",
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
        let _ = writeln!(
            s,
            "# selected ({}): {}",
            self.selector.as_deref().unwrap_or("model"),
            self.selected.as_deref().unwrap_or("none")
        );
        if let Some(note) = &self.selection_note {
            let _ = writeln!(s, "#   ({note})");
        }
        let wrong = self.schedules.iter().filter(|r| r.wrong).count();
        let skipped = self
            .schedules
            .iter()
            .filter(|r| r.skipped.is_some())
            .count();
        let _ = writeln!(
            s,
            "# ideal: {} ms   seq: {} ms   #wrong: {wrong}   skipped: {skipped}",
            ms(r.ideal_ms),
            ms(r.sequential_ms)
        );
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
