//! The `ficco` binary end to end: exit codes, one-line errors, JSON schema,
//! schedule listings, trace and SVG files.

use std::path::PathBuf;

mod support;
use support::{assert_fails, ficco, stderr, stdout};

fn tmp(name: &str) -> PathBuf {
    support::tmp("cli-test", name)
}

const SHAPE: [&str; 10] = [
    "--op", "ag-gemm", "--m", "8192", "--k", "8192", "--n", "2560", "--gpus", "4",
];

#[test]
fn bad_input_is_one_line_and_exit_2() {
    fn e<'a>(rest: &[&'a str]) -> Vec<&'a str> {
        [&["explore"], rest].concat()
    }
    assert_fails(
        &e(&[
            "--op", "ag-gemm", "--m", "0", "--k", "8", "--n", "8", "--gpus", "2",
        ]),
        "m must be positive",
    );
    assert_fails(
        &e(&[
            "--op", "ag-gemm", "--m", "-8", "--k", "8", "--n", "8", "--gpus", "2",
        ]),
        "m must be positive, got -8",
    );
    assert_fails(
        &e(&[
            "--op", "ag-gemm", "--m", "8", "--k", "8", "--n", "8", "--gpus", "0",
        ]),
        "gpus must be positive",
    );
    assert_fails(
        &e(&[
            "--op", "gemm-xx", "--m", "8", "--k", "8", "--n", "8", "--gpus", "2",
        ]),
        "unknown operator 'gemm-xx'",
    );
    assert_fails(
        &e(&[
            "--op", "gemm-rs", "--m", "2", "--k", "8", "--n", "8", "--gpus", "4",
        ]),
        "smaller than the GPU count",
    );
    assert_fails(
        &e(&[
            "--op",
            "concurrent",
            "--m",
            "64",
            "--k",
            "64",
            "--n",
            "64",
            "--gpus",
            "2",
        ]),
        "needs --collective",
    );
    assert_fails(
        &e(&[
            "--op",
            "concurrent",
            "--m",
            "64",
            "--k",
            "64",
            "--n",
            "64",
            "--gpus",
            "2",
            "--collective",
            "all-to-all",
            "--bytes",
            "1048576",
        ]),
        "unknown collective 'all-to-all'",
    );
    assert_fails(
        &e(&[
            "--op",
            "concurrent",
            "--m",
            "64",
            "--k",
            "64",
            "--n",
            "64",
            "--gpus",
            "2",
            "--collective",
            "all-reduce",
            "--bytes",
            "1000",
        ]),
        "must be a positive multiple of",
    );
    assert_fails(
        &e(&[
            "--op",
            "gemm-rs",
            "--m",
            "64",
            "--k",
            "64",
            "--n",
            "64",
            "--gpus",
            "2",
            "--collective",
            "all-reduce",
        ]),
        "belong to --op concurrent",
    );
    assert_fails(
        &e(&["--model", "gpt-9", "--tokens", "2048", "--gpus", "2"]),
        "unknown model 'gpt-9'",
    );
    assert_fails(
        &e(&["--model", "llama3-8b", "--tokens", "0", "--gpus", "2"]),
        "tokens must be positive",
    );
    assert_fails(
        &e(&["--suite", "/no/such/suite.toml"]),
        "/no/such/suite.toml",
    );
    assert_fails(
        &e(&[&SHAPE[..], &["--hw", "tpu-v9"]].concat()),
        "hardware profile: 'tpu-v9' is neither a built-in profile",
    );
    assert_fails(
        &e(&[&SHAPE[..], &["--schedule", "fine-copy-all"]].concat()),
        "bad schedule name 'fine-copy-all'",
    );
    assert_fails(
        &e(&[&SHAPE[..], &["--backend", "gpu"]].concat()),
        "GPU backend not available",
    );
    assert_fails(&e(&["--op", "ag-gemm", "--m", "8"]), "required arguments");
    assert_fails(&e(&[]), "say what to explore");
    assert_fails(
        &["schedules", "--op", "nope", "--gpus", "2"],
        "unknown operator 'nope'",
    );
    assert_fails(
        &["schedules", "--op", "ag-gemm", "--gpus", "1"],
        "at least 2",
    );
    assert_fails(&["frobnicate"], "frobnicate");
    assert_fails(&[], "a command is required");
}

#[test]
fn invalid_suite_file_is_an_error_naming_it() {
    let path = tmp("bad.toml");
    std::fs::write(&path, "[[scenario]]\nname = 'x'\nop = 'ag-gemm'\nm = 8\n").unwrap();
    assert_fails(&["explore", "--suite", path.to_str().unwrap()], "bad.toml");
}

#[test]
fn auto_backend_says_it_simulates() {
    let o = ficco(&[&["explore"], &SHAPE[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    let note: Vec<&str> = err.lines().collect();
    assert_eq!(note.len(), 1, "{err}");
    assert!(
        note[0].starts_with("ficco: no GPU backend available (")
            && note[0].ends_with("); simulating with hardware profile 'h200-nvlink'"),
        "{err}"
    );
    let out = stdout(&o);
    assert!(out.starts_with("# ficco explore"), "{out}");
    assert!(out.contains("# best: "), "{out}");
    // --backend sim is silent.
    let o = ficco(&[&["explore", "--backend", "sim"], &SHAPE[..]].concat());
    assert_eq!(o.status.code(), Some(0));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

fn sorted_keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn explore_json_has_the_exact_schema() {
    let o = ficco(&[&["explore", "--backend", "sim", "--json"], &SHAPE[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(
        sorted_keys(&v),
        [
            "backend",
            "best",
            "gpus",
            "hardware",
            "k",
            "m",
            "n",
            "op",
            "reference",
            "scenario",
            "schedules",
            "selected",
            "selector"
        ]
    );
    assert_eq!(v["selector"], "rules");
    assert_eq!(v["op"], "ag-gemm");
    assert_eq!((v["m"].as_u64(), v["gpus"].as_u64()), (Some(8192), Some(4)));
    assert_eq!(v["backend"], "sim");
    assert_eq!(
        sorted_keys(&v["reference"]),
        ["comm_ms", "compute_ms", "ideal_ms", "sequential_ms"]
    );
    let rows = v["schedules"].as_array().unwrap();
    assert!(rows.len() > 10);
    assert_eq!(rows[0]["name"], "seq");
    for row in rows {
        assert_eq!(
            sorted_keys(row),
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
        assert!(row["max_rel_err"].is_null(), "sim has no error");
        if row["skipped"].is_null() {
            assert_eq!(
                row["time_ms"], row["predicted_ms"],
                "sim: time = prediction"
            );
        } else {
            assert!(row["time_ms"].is_null());
        }
    }
    let best = v["best"].as_str().unwrap();
    assert!(rows.iter().any(|r| r["name"] == best));
    assert!(v["selected"].is_string());
}

#[test]
fn model_and_suite_json_wrap_scenarios() {
    let o = ficco(&[
        "explore",
        "--backend",
        "sim",
        "--json",
        "--model",
        "llama3-8b",
        "--tokens",
        "2048",
        "--gpus",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(sorted_keys(&v), ["scenarios"]);
    let names: Vec<&str> = v["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "llama3-8b.qkv.t2048.p2",
            "llama3-8b.attn_out.t2048.p2",
            "llama3-8b.mlp_up.t2048.p2",
            "llama3-8b.mlp_down.t2048.p2",
            "llama3-8b.attn_out_ar.t2048.p2"
        ]
    );
    assert_eq!(v["scenarios"][0]["n"], 3072);

    // Custom sizes equal to llama3-8b give the same shapes.
    let o = ficco(&[
        "explore",
        "--backend",
        "sim",
        "--json",
        "--hidden",
        "4096",
        "--ffn",
        "14336",
        "--kv",
        "1024",
        "--tokens",
        "2048",
        "--gpus",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for (a, b) in v["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .zip(c["scenarios"].as_array().unwrap())
    {
        assert_eq!(
            (&a["m"], &a["k"], &a["n"], &a["op"]),
            (&b["m"], &b["k"], &b["n"], &b["op"])
        );
    }

    let o = ficco(&[
        "explore",
        "--backend",
        "sim",
        "--suite",
        "suites/llama3.toml",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("skipped"), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.matches("# ficco explore: ").count(), 60);
    assert!(out.contains("# suite summary: 60 scenarios"), "{out}");

    // The concurrent suite: every scenario with its ablation.
    let o = ficco(&[
        "explore",
        "--backend",
        "sim",
        "--suite",
        "suites/concurrent.toml",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.matches("# ablation").count(), 5, "{out}");
    for setting in [
        "back to back",
        "overlap (NCCL)",
        "+ green context",
        "+ NCCL CTA limit",
        "best combination",
    ] {
        let rows = out
            .lines()
            .filter(|l| l.trim_start().starts_with(setting))
            .count();
        assert_eq!(rows, 5, "{setting}: {out}");
    }
}

#[test]
fn schedules_listing_round_trips() {
    for (op, controls) in [("ag-gemm", false), ("gemm-rs", true), ("gemm-ar", true)] {
        let mut args = vec!["schedules", "--op", op, "--gpus", "4"];
        if controls {
            args.push("--controls");
        }
        let o = ficco(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        let names: Vec<&str> = out
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert!(names.len() > 20, "{out}");
        assert_eq!(names[0], "seq");
        for name in &names {
            let s: ficco_core::space::Schedule = name.parse().unwrap();
            assert_eq!(&s.name(), name);
        }
        assert!(
            out.lines()
                .filter(|l| !l.starts_with('#'))
                .all(|l| l.split_whitespace().count() > 1),
            "descriptions"
        );
        if controls {
            assert!(names.iter().any(|n| n.ends_with("-hi")));
        }
        // Every listed name is accepted by explore --schedule.
        let o = ficco(&[
            "explore",
            "--backend",
            "sim",
            "--json",
            "--op",
            op,
            "--m",
            "4096",
            "--k",
            "512",
            "--n",
            "512",
            "--gpus",
            "4",
            "--schedule",
            names[names.len() - 1],
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let rows = v["schedules"].as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1]["name"], names[names.len() - 1]);
    }
}

#[test]
fn trace_and_svg_files_are_valid() {
    let trace = tmp("t.json");
    let svg = tmp("t.svg");
    let o = ficco(
        &[
            &[
                "explore",
                "--backend",
                "sim",
                "--trace",
                trace.to_str().unwrap(),
                "--svg",
                svg.to_str().unwrap(),
            ],
            &SHAPE[..],
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("trace is JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert!(!x.is_empty());
    for e in &x {
        assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0);
        assert!(e["pid"].is_u64() && e["tid"].is_u64() && e["name"].is_string());
    }
    // Both the best schedule (pid = rank) and seq (pid = 1000 + rank) are there.
    assert!(x.iter().any(|e| e["pid"].as_u64().unwrap() < 1000));
    assert!(x.iter().any(|e| e["pid"].as_u64().unwrap() >= 1000));
    assert!(events.iter().any(|e| e["name"] == "process_name"));
    assert!(events.iter().any(|e| e["name"] == "thread_name"));

    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(s.trim_end().ends_with("</svg>"));
    assert!(s.contains(">seq (") && s.contains(">best "), "two panels");
    assert!(s.contains(">ms</text>"));

    // Several scenarios: one file per scenario.
    let o = ficco(&[
        "explore",
        "--backend",
        "sim",
        "--model",
        "llama3-8b",
        "--tokens",
        "2048",
        "--gpus",
        "2",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(tmp("t.llama3-8b.qkv.t2048.p2.svg").exists());

    // An unwritable path is a one-line error.
    assert_fails(
        &[
            &["explore", "--backend", "sim", "--svg", "/no/such/dir/x.svg"],
            &SHAPE[..],
        ]
        .concat(),
        "cannot write '/no/such/dir/x.svg'",
    );
}

/// `--procs N` runs N processes (one rank each, the launcher variables
/// torchrun sets); rank 0 prints the one report. With the simulator this
/// runs anywhere: the report appears once and equals the single-process one.
#[test]
fn procs_runs_ranks_as_processes_and_rank_zero_prints_once() {
    let one = ficco(&[&["explore", "--backend", "sim", "--json"][..], &SHAPE].concat());
    let four = ficco(
        &[
            &["explore", "--backend", "sim", "--json", "--procs", "4"][..],
            &SHAPE,
        ]
        .concat(),
    );
    assert!(four.status.success(), "{}", stderr(&four));
    assert_eq!(stdout(&four).matches("\"scenario\"").count(), 1);
    assert_eq!(stdout(&four), stdout(&one));
}

#[test]
fn procs_and_launcher_variables_are_checked() {
    assert_fails(
        &[&["explore", "--procs", "0"][..], &SHAPE].concat(),
        "procs must be positive",
    );
    // A half-set launcher environment names what is missing.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ficco"))
        .args([&["explore", "--backend", "sim"][..], &SHAPE].concat())
        .env("RANK", "0")
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run ficco");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("WORLD_SIZE") && err.contains("one rank of a job"),
        "{err}"
    );
}
