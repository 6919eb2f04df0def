//! Report outputs: the exact JSON schema, the table, the trace, the SVG and the summary.

use ficco_core::problem::workload::{Op, Problem, Scenario};
use ficco_core::report::{
    chrome_trace, summarize, svg_gantt, Reference, ScenarioReport, ScheduleResult, SuiteReport,
    TracePanel,
};
use ficco_core::run::timeline::{Span, Timeline};

fn report(
    name: &str,
    gpus: usize,
    seq: f64,
    comp: f64,
    comm: f64,
    times: &[(&str, f64)],
) -> ScenarioReport {
    let sc = Scenario {
        name: name.into(),
        problem: Problem::new(Op::GemmRs, 64, 32, 16, gpus).unwrap(),
    };
    let mut r = ScenarioReport::new(&sc, "sim", "h200-nvlink", Reference::new(seq, comp, comm));
    r.schedules
        .push(ScheduleResult::ran("seq", seq, seq, None, false));
    for &(n, t) in times {
        r.schedules.push(ScheduleResult::ran(n, t, t, None, false));
    }
    r.schedules.push(ScheduleResult::skipped(
        "fine8-copy-all",
        "m = 64 is not divisible",
    ));
    r.finish();
    r
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn json_schema_is_exact() {
    let r = report("x", 4, 2.0, 1.2, 0.8, &[("shard-copy-all", 1.5)]);
    let v = serde_json::to_value(&r).unwrap();
    let mut want = vec![
        "scenario",
        "op",
        "m",
        "k",
        "n",
        "gpus",
        "backend",
        "hardware",
        "reference",
        "schedules",
        "best",
        "selected",
        "selector",
    ];
    want.sort();
    assert_eq!(keys(&v), want);
    assert_eq!(v["op"], "gemm-rs");
    assert_eq!(
        keys(&v["reference"]),
        ["comm_ms", "compute_ms", "ideal_ms", "sequential_ms"]
    );
    for row in v["schedules"].as_array().unwrap() {
        assert_eq!(
            keys(row),
            [
                "efficiency",
                "max_rel_err",
                "name",
                "predicted_ms",
                "skipped",
                "speedup",
                "time_ms"
            ]
        );
        assert!(row["max_rel_err"].is_null());
    }
    let skipped = &v["schedules"][2];
    assert!(skipped["time_ms"].is_null() && skipped["predicted_ms"].is_null());
    assert_eq!(skipped["skipped"], "m = 64 is not divisible");
    assert_eq!(v["best"], "shard-copy-all");
    assert_eq!(v["selected"], "shard-copy-all");
    // Round trip, and the several-scenario wrapper.
    let back: ScenarioReport = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
    let suite = serde_json::to_value(SuiteReport {
        scenarios: vec![r.clone(), r],
    })
    .unwrap();
    assert_eq!(keys(&suite), ["scenarios"]);
}

#[test]
fn efficiency_is_null_when_seq_is_ideal() {
    let r = report("flat", 2, 1.0, 1.0, 0.2, &[("shard-copy-all", 0.9)]);
    assert!(r.schedules.iter().all(|s| s.efficiency.is_none()));
    assert!((r.row("shard-copy-all").unwrap().speedup.unwrap() - 1.0 / 0.9).abs() < 1e-12);
}

#[test]
fn table_follows_nccl_tests_conventions() {
    let r = report(
        "llama3-8b.qkv.t2048.p4",
        4,
        2.0,
        1.2,
        0.8,
        &[("shard-copy-all", 1.5)],
    );
    let t = r.table();
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].starts_with("# ") && lines[0].contains("llama3-8b.qkv.t2048.p4"));
    assert!(t.contains("# backend: sim   hardware: h200-nvlink   dtype: bf16"));
    assert!(t.contains("(ms)"), "units line:\n{t}");
    // The simulator's table: its time is the prediction, and nothing was
    // checked, so no predicted, rel_err or #wrong column (issue 31).
    assert!(t.contains("# times are the simulator's predictions"), "{t}");
    for absent in ["predicted", "rel_err", "#wrong"] {
        assert!(!t.contains(absent), "{absent}:\n{t}");
    }
    let rows: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert_eq!(rows.len(), 3, "{t}");
    let cols: Vec<&str> = rows[1].split_whitespace().collect();
    assert_eq!(cols, ["shard-copy-all", "1.5000", "1.333", "0.62"]);
    assert!(rows[2].contains("skipped: m = 64 is not divisible"));
    assert!(t.contains("# best: shard-copy-all"));
    assert!(t.contains("# ideal: 1.2000 ms   seq: 2.0000 ms"));
    assert!(t.lines().all(|l| l == l.trim_end()));
}

#[test]
fn wrong_rows_are_marked_and_not_best() {
    let sc = Scenario {
        name: "w".into(),
        problem: Problem::new(Op::AgGemm, 64, 32, 16, 2).unwrap(),
    };
    let mut r = ScenarioReport::new(&sc, "gpu", "2x H200", Reference::new(2.0, 1.0, 0.5));
    r.schedules
        .push(ScheduleResult::ran("seq", 2.0, 2.1, Some(0.0), false));
    r.schedules.push(ScheduleResult::ran(
        "shard-copy-all",
        1.0,
        1.1,
        Some(0.4),
        true,
    ));
    r.schedules.push(ScheduleResult::ran(
        "fine2-copy-all",
        1.5,
        1.2,
        Some(1e-3),
        false,
    ));
    r.finish();
    assert_eq!(r.best.as_deref(), Some("fine2-copy-all"));
    assert_eq!(r.selected.as_deref(), Some("shard-copy-all"));
    let t = r.table();
    let wrong_row = t
        .lines()
        .find(|l| l.contains("shard-copy-all") && !l.starts_with('#'))
        .unwrap();
    assert!(wrong_row.trim_end().ends_with('1'), "{wrong_row}");
    assert!(t.contains("#wrong: 1"));
    // The measured table keeps every column.
    assert!(t.contains("predicted") && t.contains("rel_err"), "{t}");
    assert!(
        t.contains("# selected (model): shard-copy-all  1.0000 ms, its output was wrong"),
        "{t}"
    );
}

#[test]
fn suite_summary_aggregates_per_gpu_count() {
    let reports = vec![
        report("a", 2, 2.0, 1.0, 0.5, &[("s", 1.5)]), // gain 0.5 of 1.0
        report("b", 2, 4.0, 3.0, 1.0, &[("s", 3.0)]), // gain 1.0 of 1.0
        report("c", 4, 2.0, 1.0, 0.5, &[("s", 1.0)]), // gain 1.0 of 1.0
    ];
    let s = summarize(&reports);
    assert_eq!(s.scenarios, 3);
    let best = &s.choices[0];
    assert_eq!(best.choice, "best");
    assert_eq!(best.by_gpus.len(), 2);
    assert_eq!(best.by_gpus[0].gpus, 2);
    assert!((best.by_gpus[0].aggregated_efficiency.unwrap() - 1.5 / 2.0).abs() < 1e-12);
    assert!((best.by_gpus[1].aggregated_efficiency.unwrap() - 1.0).abs() < 1e-12);
    let geo_ideal = (1.5f64 * 1.0 * 1.0).powf(1.0 / 3.0);
    assert!((best.geomean_over_ideal.unwrap() - geo_ideal).abs() < 1e-12);
    let geo_speedup = (2.0 / 1.5 * 4.0 / 3.0 * 2.0f64).powf(1.0 / 3.0);
    assert!((best.geomean_speedup.unwrap() - geo_speedup).abs() < 1e-12);
    assert_eq!(best.slower_than_seq, 0);
    let t = s.table();
    assert!(t.lines().all(|l| l.starts_with('#')));
    assert!(t.contains("agg_E(P=2)") && t.contains("0.750"));
}

fn timeline(name: &str, spans: &[(usize, usize, &str, f64, f64)]) -> Timeline {
    Timeline {
        name: name.into(),
        spans: spans
            .iter()
            .enumerate()
            .map(|(i, &(rank, stream, kind, a, b))| Span {
                rank,
                stream,
                task: i,
                label: format!("{kind} <{i}>"),
                kind: kind.into(),
                start_ms: a,
                end_ms: b,
            })
            .collect(),
        total_ms: 0.0,
    }
    .finish()
}

#[test]
fn trace_and_svg_show_both_timelines() {
    let seq = timeline(
        "seq",
        &[
            (0, 1, "all-gather", 0.0, 0.4),
            (0, 0, "gemm", 0.4, 1.0),
            (1, 0, "gemm", 0.4, 1.0),
        ],
    );
    let best = timeline(
        "fine2-copy-all",
        &[
            (0, 1, "copy", 0.0, 0.2),
            (0, 0, "gemm", 0.1, 0.7),
            (1, 0, "gemm", 0.1, 0.7),
        ],
    );
    let names = vec![
        vec!["compute0".to_string(), "comm".to_string()],
        vec!["compute0".to_string(), "comm".to_string()],
    ];
    let panels = [
        TracePanel {
            title: "best fine2-copy-all",
            timeline: &best,
            stream_names: &names,
        },
        TracePanel {
            title: "seq",
            timeline: &seq,
            stream_names: &names,
        },
    ];
    let trace = chrome_trace(&panels);
    let text = serde_json::to_string(&trace).unwrap();
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = back["traceEvents"].as_array().unwrap();
    let x: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(x.len(), 6);
    let first = x[0];
    assert_eq!(first["pid"], 0);
    assert_eq!(first["tid"], 1);
    assert_eq!(first["name"], "copy <0>");
    assert_eq!(first["ts"], 0.0);
    assert!((first["dur"].as_f64().unwrap() - 200.0).abs() < 1e-9);
    assert!(x
        .iter()
        .any(|e| e["pid"] == 1000 && e["name"] == "all-gather <0>"));
    assert!(events.iter().any(|e| e["ph"] == "M"
        && e["name"] == "process_name"
        && e["args"]["name"] == "seq: rank 1"
        && e["pid"] == 1001));
    assert!(events
        .iter()
        .any(|e| e["name"] == "thread_name" && e["args"]["name"] == "comm"));

    let svg = svg_gantt(&[panels[1], panels[0]]);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    assert!(svg.contains("&lt;0&gt;"), "labels are escaped");
    assert!(!svg.contains("<0>"));
    for kind in ["gemm", "copy", "all-gather"] {
        assert!(
            svg.contains(&format!(">{kind}</text>")),
            "legend has {kind}"
        );
    }
    assert!(svg.contains(">seq (1.0000 ms)</text>"));
    assert!(
        svg.contains(">0.8</text>") && svg.contains(">ms</text>"),
        "ticks in ms"
    );
}

/// Issue 31: measured rows show the range of their timed iterations beside
/// the median; the simulator's and older saved reports have no range.
#[test]
fn measured_tables_show_the_iterations_range() {
    let sc = Scenario {
        name: "r".into(),
        problem: Problem::new(Op::AgGemm, 64, 32, 16, 2).unwrap(),
    };
    let mut r = ScenarioReport::new(&sc, "gpu", "2x H200", Reference::new(2.0, 1.0, 0.5));
    r.schedules.push(ScheduleResult {
        min_ms: Some(1.9),
        max_ms: Some(2.3),
        ..ScheduleResult::ran("seq", 2.0, 2.1, Some(0.0), false)
    });
    r.schedules.push(ScheduleResult {
        min_ms: Some(1.25),
        max_ms: Some(1.5),
        ..ScheduleResult::ran("shard-copy-all", 1.3, 1.1, Some(1e-3), false)
    });
    r.finish();
    let t = r.table();
    assert!(
        t.contains("# time is the median of the timed iterations"),
        "{t}"
    );
    let head = t.lines().find(|l| l.starts_with("# schedule")).unwrap();
    assert_eq!(
        head.split_whitespace().collect::<Vec<_>>(),
        [
            "#",
            "schedule",
            "time",
            "min",
            "max",
            "predicted",
            "speedup",
            "E",
            "rel_err",
            "#wrong"
        ]
    );
    let row = t
        .lines()
        .find(|l| l.starts_with("  shard-copy-all"))
        .unwrap();
    assert_eq!(
        row.split_whitespace().take(5).collect::<Vec<_>>(),
        ["shard-copy-all", "1.3000", "1.2500", "1.5000", "1.1000"]
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["schedules"][1]["min_ms"], 1.25);
    // Without ranges (saved before they existed): the columns as before.
    for row in &mut r.schedules {
        row.min_ms = None;
        row.max_ms = None;
    }
    let t = r.table();
    assert!(!t.contains(" min ") && !t.contains("median"), "{t}");
    let v = serde_json::to_value(&r).unwrap();
    assert!(v["schedules"][1].get("min_ms").is_none());
}
