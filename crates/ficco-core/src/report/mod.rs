//! Results and their outputs: the JSON schema, an nccl-tests style table, a
//! Chrome/Perfetto trace, an SVG Gantt timeline, and the suite summary.
//!
//! One scenario's JSON is exactly
//!
//! ```json
//! {"scenario": "...", "op": "ag-gemm", "m": 2048, "k": 4096, "n": 3072, "gpus": 2,
//!  "backend": "sim", "hardware": "h200",
//!  "reference": {"sequential_ms": 0.8, "compute_ms": 0.7, "comm_ms": 0.1, "ideal_ms": 0.7},
//!  "schedules": [{"name": "seq", "time_ms": 0.8, "predicted_ms": 0.8, "speedup": 1.0,
//!                 "efficiency": 0.0, "max_rel_err": null, "skipped": null}],
//!  "best": "seq", "selected": "seq", "selector": "rules"}
//! ```
//!
//! and several scenarios are `{"scenarios": [...]}`. A schedule whose measured
//! output was wrong keeps its times and error and gets one more key,
//! `"wrong": true`; it is never `best`.
//!
//! Metrics (MISSION.md): speedup T_seq / T; overlap efficiency
//! E = (T_seq − T) / (T_seq − T_ideal) with T_ideal = max(T_comp, T_comm),
//! null where T_seq − T_ideal is too small for E to mean anything.

use crate::problem::workload::{Op, Problem, Scenario, SideCollective};
use crate::run::timeline::Timeline;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

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
    /// Host-side cost of launching this schedule once (µs, no CUDA graphs);
    /// GPU backend only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_us: Option<f64>,
    /// This schedule lowers to exactly the plan of the named, earlier row
    /// (e.g. `ring` and `all` with one peer): it was measured once, under
    /// that name, and this row repeats that measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_plan_as: Option<String>,
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
    pub op: Op,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub gpus: usize,
    /// `concurrent` only: the GEMM count and the collective beside them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<SideCollective>,
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
        let p = scenario.problem;
        ScenarioReport {
            scenario: scenario.name.clone(),
            op: p.op,
            m: p.m,
            k: p.k,
            n: p.n,
            gpus: p.gpus,
            side: p.side,
            backend: backend.into(),
            hardware: hardware.into(),
            reference,
            schedules: vec![],
            best: None,
            selected: None,
            selector: None,
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

    pub fn problem(&self) -> Problem {
        Problem {
            op: self.op,
            m: self.m,
            k: self.k,
            n: self.n,
            gpus: self.gpus,
            side: self.side,
        }
    }

    /// Median and maximum over the measured schedules of the host-side
    /// launch cost (µs), when the backend reported it.
    pub fn launch_us(&self) -> Option<(f64, f64)> {
        let mut v: Vec<f64> = self
            .schedules
            .iter()
            .filter(|r| r.same_plan_as.is_none())
            .filter_map(|r| r.launch_us)
            .filter(|x| x.is_finite())
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some((v[v.len() / 2], v[v.len() - 1]))
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
                "# host launch per operator (no CUDA graphs): median {median:.1} us, max {max:.1} us over schedules"
            );
        }
        // Rows with an empty last column would end in spaces.
        s.lines().map(str::trim_end).collect::<Vec<_>>().join("\n") + "\n"
    }
}

fn ms(x: f64) -> String {
    format!("{x:.4}")
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "-".into())
}

/// A short description of a schedule for listings, e.g.
/// "4 chunks per shard (32 steps), copy engines, all peers at once, 2 compute streams".
pub fn describe(s: &crate::space::Schedule, gpus: usize) -> String {
    use crate::space::{Engine, Granularity, Order, Priority};
    let gran = match s.granularity {
        Granularity::Seq => {
            return "sequential reference: the whole collective, then the GEMM (or the reverse)"
                .into()
        }
        Granularity::Shard => format!("one step per shard ({gpus} steps)"),
        Granularity::Bulk => "transfers per shard, peer GEMMs coalesced (<= 3 GEMMs)".to_string(),
        Granularity::Fine(c) => format!("{c} chunks per shard ({} steps)", c * gpus),
    };
    let engine = match s.engine {
        Engine::Nccl => "NCCL kernels",
        Engine::Copy => "copy engines (no SMs)",
    };
    let order = match s.order {
        Order::Ring => "one peer per step, staggered",
        Order::All => "all peers at once",
    };
    let mut d = format!("{gran}, {engine}, {order}");
    if s.compute_streams == 2 {
        d += ", 2 compute streams";
    }
    if let Some(sm) = s.sm_target {
        d += &format!(", GEMM SM target {sm}");
    }
    if s.comm_priority == Priority::High {
        d += ", high comm priority";
    }
    d
}

// ---------------------------------------------------------------- summary

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
            Some((rep.gpus, r.sequential_ms, t, r.ideal_ms))
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
        s
    }
}

// ---------------------------------------------------------------- timelines

/// One timeline to draw, with a title and the stream names of each rank
/// (`stream_names[rank][stream]`; missing names fall back to "stream S").
#[derive(Debug, Clone, Copy)]
pub struct TracePanel<'a> {
    pub title: &'a str,
    pub timeline: &'a Timeline,
    pub stream_names: &'a [Vec<String>],
}

impl TracePanel<'_> {
    fn stream_name(&self, rank: usize, stream: usize) -> String {
        self.stream_names
            .get(rank)
            .and_then(|r| r.get(stream))
            .cloned()
            .unwrap_or_else(|| format!("stream {stream}"))
    }

    /// (rank, stream) rows present in the timeline or named, sorted.
    fn rows(&self) -> Vec<(usize, usize)> {
        let mut rows: Vec<(usize, usize)> = self
            .timeline
            .spans
            .iter()
            .map(|s| (s.rank, s.stream))
            .collect();
        for (r, names) in self.stream_names.iter().enumerate() {
            rows.extend((0..names.len()).map(|s| (r, s)));
        }
        rows.sort_unstable();
        rows.dedup();
        rows
    }
}

/// Stream names of every rank of a plan, for [`TracePanel`].
pub fn stream_names(plan: &crate::plan::Plan) -> Vec<Vec<String>> {
    plan.ranks
        .iter()
        .map(|r| r.streams.iter().map(|s| s.name.clone()).collect())
        .collect()
}

/// Process ids of panel `i` start at `i * TRACE_PID_STRIDE` (pid = rank for the first panel).
pub const TRACE_PID_STRIDE: usize = 1000;

/// Chrome / Perfetto trace JSON (`traceEvents`, complete events `ph: "X"`,
/// ts and dur in µs). Panel i's rank r is pid `i * 1000 + r`, streams are
/// tids, and process names carry the panel title.
pub fn chrome_trace(panels: &[TracePanel]) -> Value {
    let mut events = vec![];
    for (i, panel) in panels.iter().enumerate() {
        let base = i * TRACE_PID_STRIDE;
        let mut ranks: Vec<usize> = panel.rows().iter().map(|r| r.0).collect();
        ranks.dedup();
        for &rank in &ranks {
            let pid = base + rank;
            events.push(
                json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                "args": {"name": format!("{}: rank {rank}", panel.title)}}),
            );
            events.push(
                json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                "args": {"sort_index": pid}}),
            );
        }
        for (rank, stream) in panel.rows() {
            events.push(json!({"name": "thread_name", "ph": "M", "pid": base + rank,
                "tid": stream, "args": {"name": panel.stream_name(rank, stream)}}));
        }
        for s in &panel.timeline.spans {
            events.push(json!({
                "name": s.label, "cat": s.kind, "ph": "X",
                "pid": base + s.rank, "tid": s.stream,
                "ts": s.start_ms * 1e3, "dur": (s.end_ms - s.start_ms).max(0.0) * 1e3,
                "args": {"task": s.task, "kind": s.kind, "plan": panel.timeline.name},
            }));
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

/// Fill color of a task kind in the SVG.
pub fn kind_color(kind: &str) -> &'static str {
    match kind {
        "gemm" => "#4e79a7",
        "copy" => "#f28e2b",
        "all-gather" => "#59a14f",
        "reduce-scatter" => "#b07aa1",
        "all-reduce" => "#e15759",
        "send-recv" => "#76b7b2",
        "reduce" => "#9c755f",
        _ => "#bab0ac",
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A tick step of 1, 2 or 5 times a power of ten giving about `n` ticks over `range`.
fn tick_step(range: f64, n: f64) -> f64 {
    if range.is_nan() || range <= 0.0 {
        return 1.0;
    }
    let raw = range / n;
    let pow = 10f64.powf(raw.log10().floor());
    let m = raw / pow;
    pow * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// An SVG Gantt chart: one panel per timeline, one row per rank and stream,
/// all panels on the same time axis (ticks in ms), colored by task kind, with
/// a legend.
pub fn svg_gantt(panels: &[TracePanel]) -> String {
    const WIDTH: f64 = 1200.0;
    const LEFT: f64 = 150.0;
    const RIGHT: f64 = 20.0;
    const ROW: f64 = 18.0;
    const TITLE: f64 = 22.0;
    const AXIS: f64 = 26.0;
    const LEGEND: f64 = 30.0;
    let t_max = panels
        .iter()
        .map(|p| {
            p.timeline
                .spans
                .iter()
                .map(|s| s.end_ms)
                .fold(p.timeline.total_ms, f64::max)
        })
        .fold(0.0, f64::max);
    let t_max = if t_max > 0.0 { t_max } else { 1.0 };
    let step = tick_step(t_max, 8.0);
    let axis_end = (t_max / step).ceil() * step;
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + t / axis_end * plot_w;
    let decimals = (-step.log10().floor()).max(0.0) as usize;

    let mut body = String::new();
    let mut y = 10.0;
    let mut kinds: Vec<String> = vec![];
    for panel in panels {
        let rows = panel.rows();
        let _ = writeln!(
            body,
            r#"<text x="10" y="{:.1}" font-weight="bold">{} ({} ms)</text>"#,
            y + 15.0,
            xml_escape(panel.title),
            ms(panel.timeline.total_ms)
        );
        y += TITLE;
        let top = y;
        for (i, &(rank, stream)) in rows.iter().enumerate() {
            let ry = top + i as f64 * ROW;
            if i % 2 == 0 {
                let _ = writeln!(
                    body,
                    r##"<rect x="{LEFT}" y="{ry:.1}" width="{plot_w}" height="{ROW}" fill="#f4f4f4"/>"##
                );
            }
            let _ = writeln!(
                body,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">r{rank} {}</text>"#,
                LEFT - 6.0,
                ry + 13.0,
                xml_escape(&panel.stream_name(rank, stream))
            );
        }
        for s in &panel.timeline.spans {
            let Some(i) = rows.iter().position(|&r| r == (s.rank, s.stream)) else {
                continue;
            };
            if !kinds.contains(&s.kind) {
                kinds.push(s.kind.clone());
            }
            let x0 = x(s.start_ms);
            let w = (x(s.end_ms) - x0).max(0.5);
            let _ = writeln!(
                body,
                r##"<rect x="{x0:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="{}" stroke="#fff" stroke-width="0.5"><title>{} [{}] r{} {:.4}–{:.4} ms</title></rect>"##,
                top + i as f64 * ROW + 2.0,
                ROW - 4.0,
                kind_color(&s.kind),
                xml_escape(&s.label),
                xml_escape(&s.kind),
                s.rank,
                s.start_ms,
                s.end_ms
            );
        }
        y = top + rows.len() as f64 * ROW;
        // Axis under each panel.
        let _ = writeln!(
            body,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/>"##,
            LEFT + plot_w
        );
        let ticks = (axis_end / step).round() as usize;
        for t in 0..=ticks {
            let tv = t as f64 * step;
            let tx = x(tv);
            let _ = writeln!(
                body,
                r##"<line x1="{tx:.2}" y1="{top:.1}" x2="{tx:.2}" y2="{:.1}" stroke="#ccc" stroke-width="0.5"/><text x="{tx:.2}" y="{:.1}" text-anchor="middle" font-size="10">{tv:.decimals$}</text>"##,
                y + 4.0,
                y + 15.0
            );
        }
        let _ = writeln!(
            body,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10">ms</text>"#,
            LEFT + plot_w,
            y + 24.0
        );
        y += AXIS;
    }
    // Legend.
    let ly = y + 8.0;
    for (i, kind) in kinds.iter().enumerate() {
        let lx = LEFT + i as f64 * 120.0;
        let _ = writeln!(
            body,
            r#"<rect x="{lx:.1}" y="{ly:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            kind_color(kind),
            lx + 16.0,
            ly + 10.0,
            xml_escape(kind)
        );
    }
    let height = y + LEGEND;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH} {height:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n"
    )
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

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(0.8, 8.0), 0.1);
        assert_eq!(tick_step(3.0, 8.0), 0.5);
        assert_eq!(tick_step(13.0, 8.0), 2.0);
    }
}

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
    if r.op != Op::Concurrent {
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
    let singles: [(&str, Has); 5] = [
        ("+ comm priority high", &|s| {
            s.comm_priority == Priority::High
        }),
        ("+ cuBLASLt SM target", &|s| s.sm_target.is_some()),
        ("+ green context", &|s| s.green_sms.is_some()),
        ("+ occupancy shaping", &|s| s.occupancy.is_some()),
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

/// How many resource controls `s` sets.
fn controls_set(s: &crate::space::Schedule) -> usize {
    [
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
