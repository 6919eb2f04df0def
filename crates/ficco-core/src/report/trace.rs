//! Timelines as a Chrome / Perfetto trace: [`TracePanel`] (one timeline with
//! a title and stream names), [`stream_names`] of a plan, and
//! [`chrome_trace`]. The SVG exporter ([`super::svg`]) draws the same panels.

use crate::run::timeline::Timeline;
use serde_json::{json, Value};

/// One timeline to draw, with a title and the stream names of each rank
/// (`stream_names[rank][stream]`; missing names fall back to "stream S").
#[derive(Debug, Clone, Copy)]
pub struct TracePanel<'a> {
    pub title: &'a str,
    pub timeline: &'a Timeline,
    pub stream_names: &'a [Vec<String>],
}

impl TracePanel<'_> {
    pub(super) fn stream_name(&self, rank: usize, stream: usize) -> String {
        self.stream_names
            .get(rank)
            .and_then(|r| r.get(stream))
            .cloned()
            .unwrap_or_else(|| format!("stream {stream}"))
    }

    /// (rank, stream) rows present in the timeline or named, sorted.
    pub(super) fn rows(&self) -> Vec<(usize, usize)> {
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
