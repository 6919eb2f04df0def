//! Results and every way they leave ficco: the data model ([`model`]) and
//! its exporters, the JSON below ([`json`]), an nccl-tests style table
//! ([`table`]), the suite summary ([`summary`]), a Chrome/Perfetto trace
//! ([`trace`]), an SVG Gantt timeline ([`svg`]) and the control ablation of
//! `concurrent` reports ([`ablation`](mod@ablation)).
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
//! Metrics. The reference times of a scenario are T_seq (the collective and
//! the GEMM back to back, no overlap), T_comp (the GEMM alone), T_comm (the
//! collective alone) and T_ideal = max(T_comp, T_comm), the time of perfect
//! overlap. A schedule taking T has speedup T_seq / T and overlap efficiency
//! E = (T_seq − T) / (T_seq − T_ideal): 1 when it reaches T_ideal, 0 when it
//! is no faster than back to back, negative when slower. E is null where
//! T_seq − T_ideal is too small for it to mean anything ([`efficiency`]).

pub mod ablation;
pub mod json;
pub mod model;
pub mod summary;
pub mod svg;
pub mod table;
pub mod trace;

pub use ablation::{ablation, ablation_table, AblationRow};
pub use json::to_json;
pub use model::{efficiency, Reference, ScenarioReport, ScheduleResult, SuiteReport};
pub use summary::{summarize, ChoiceSummary, GpuEfficiency, SuiteSummary};
pub use svg::{kind_color, svg_gantt};
pub use trace::{chrome_trace, stream_names, TracePanel, TRACE_PID_STRIDE};

/// A time in ms as the table and the SVG print it.
fn ms(x: f64) -> String {
    format!("{x:.4}")
}

/// `f(x)`, or "-" for a missing value.
fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "-".into())
}
