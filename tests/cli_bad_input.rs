//! Issue 18: the bad inputs a new user ran into, each with its exit status
//! and message.

use std::path::PathBuf;
use std::time::Instant;

mod support;
use support::{assert_fails, ficco, stderr, stdout};

fn tmp(name: &str) -> PathBuf {
    support::tmp("bad-input", name)
}

fn shape(gpus: &str) -> Vec<&str> {
    vec![
        "--op", "ag-gemm", "--m", "73728", "--k", "64", "--n", "64", "--gpus", gpus,
    ]
}

#[test]
fn gpu_count_is_bounded_and_commands_agree() {
    let want = "more than 72, the largest NVLink domain";
    assert_fails(
        &["schedules", "--op", "ag-gemm", "--gpus", "4294967296"],
        want,
    );
    assert_fails(&["schedules", "--op", "ag-gemm", "--gpus", "128"], want);
    let a = assert_fails(
        &[&["explore"], &shape("128")[..], &["--backend", "sim"]].concat(),
        want,
    );
    let b = assert_fails(
        &[&["select", "--no-cache"], &shape("128")[..]].concat(),
        want,
    );
    assert_eq!(stderr(&a), stderr(&b), "explore and select say the same");
    let o = ficco(&["schedules", "--op", "ag-gemm", "--gpus", "72"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn p64_one_family_is_fast() {
    // Debug build, 2 cores in CI: one schedule family at P = 64 (the
    // release build runs the whole space in about 2 s of CPU).
    let t = Instant::now();
    let o = ficco(&[
        "explore",
        "--op",
        "ag-gemm",
        "--m",
        "65536",
        "--k",
        "8192",
        "--n",
        "8192",
        "--gpus",
        "64",
        "--backend",
        "sim",
        "--schedule",
        "fine8-copy-ring",
        "--schedule",
        "fine8-nccl-ring",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("fine8-copy-ring"));
    let secs = t.elapsed().as_secs_f64();
    assert!(secs < 60.0, "P=64 took {secs:.1} s");
}

#[test]
fn overflowing_and_oversized_shapes_are_errors() {
    assert_fails(
        &[
            "explore",
            "--model",
            "llama3-405b",
            "--tokens",
            "4611686018427387904",
            "--gpus",
            "8",
            "--backend",
            "sim",
        ],
        "larger than the 1024 TiB ficco supports per buffer",
    );
    assert_fails(
        &[
            "select",
            "--no-cache",
            "--op",
            "gemm-ar",
            "--m",
            "9223372036854775807",
            "--k",
            "9223372036854775807",
            "--n",
            "2",
            "--gpus",
            "2",
        ],
        "invalid shape",
    );
    assert_fails(
        &[
            "explore",
            "--model",
            "llama3-405b",
            "--tokens",
            "4194304",
            "--gpus",
            "8",
            "--backend",
            "sim",
        ],
        "more than the 141 GB of hardware profile 'h200-nvlink' (memory_gb)",
    );
}

fn two_scenario_suite(name: &str) -> PathBuf {
    let path = tmp(&format!("{name}.toml"));
    std::fs::write(
        &path,
        "[[scenario]]\nname = \"../../escaped/evil\"\nop = \"ag-gemm\"\nm = 1024\nk = 256\nn = 256\ngpus = 2\n\
         [[scenario]]\nname = \"plain\"\nop = \"ag-gemm\"\nm = 1024\nk = 256\nn = 256\ngpus = 2\n",
    )
    .unwrap();
    path
}

#[test]
fn scenario_names_become_safe_file_names_and_are_printed() {
    let suite = two_scenario_suite("names");
    let dir = tmp("out");
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("x.svg");
    let o = ficco(&[
        "explore",
        "--suite",
        suite.to_str().unwrap(),
        "--backend",
        "sim",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let evil = dir.join("x.____escaped_evil.svg");
    assert!(evil.exists(), "{}", stderr(&o));
    assert!(dir.join("x.plain.svg").exists());
    assert!(stderr(&o).contains(&format!("ficco: wrote {}", evil.display())));
}

#[test]
fn unwritable_files_still_print_the_table_then_fail() {
    let suite = two_scenario_suite("unwritable");
    let o = assert_fails(
        &[
            "explore",
            "--suite",
            suite.to_str().unwrap(),
            "--backend",
            "sim",
            "--trace",
            "/nonexistent-dir/t.json",
        ],
        "cannot write '/nonexistent-dir/t.plain.json'",
    );
    assert!(stdout(&o).contains("# ficco explore: plain"));
}

#[test]
fn trace_to_stdout_and_one_path_for_both() {
    let o = ficco(&[
        "explore",
        "--op",
        "ag-gemm",
        "--m",
        "1024",
        "--k",
        "256",
        "--n",
        "256",
        "--gpus",
        "2",
        "--backend",
        "sim",
        "--trace",
        "-",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("trace JSON on stdout");
    assert!(v["traceEvents"].is_array());
    assert!(!std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("-")
        .exists());
    let same = tmp("same");
    let same = same.to_str().unwrap();
    assert_fails(
        &[
            "explore",
            "--op",
            "ag-gemm",
            "--m",
            "1024",
            "--k",
            "256",
            "--n",
            "256",
            "--gpus",
            "2",
            "--backend",
            "sim",
            "--trace",
            same,
            "--svg",
            same,
        ],
        "--trace and --svg name the same file",
    );
}

fn report(dir: &str) -> serde_json::Value {
    let o = ficco(&[
        "explore",
        "--op",
        "ag-gemm",
        "--m",
        "1024",
        "--k",
        "256",
        "--n",
        "256",
        "--gpus",
        "2",
        "--backend",
        "sim",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{dir}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn write_json(name: &str, v: &serde_json::Value) -> String {
    let p = tmp(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn evaluate_measured_rejects_nonsense() {
    let good = report("good");
    let mut neg = good.clone();
    for r in neg["schedules"].as_array_mut().unwrap() {
        r["time_ms"] = serde_json::json!(-1.0);
    }
    let neg = write_json("neg.json", &neg);
    assert_fails(
        &["evaluate", "--measured", &neg],
        "schedule 'seq': time_ms = -1 is not a positive time",
    );
    let mut null = good.clone();
    for r in null["schedules"].as_array_mut().unwrap() {
        r["time_ms"] = serde_json::Value::Null;
    }
    let null = write_json("null.json", &null);
    assert_fails(&["evaluate", "--measured", &null], "no measured time in");
    let g = write_json("good.json", &good);
    assert_fails(
        &["evaluate", "--measured", &format!("{g},{g}")],
        "appears twice",
    );
    assert_fails(
        &["evaluate", "--measured", &format!("{g},")],
        "--measured has an empty file name",
    );
    let empty = write_json("empty.json", &serde_json::json!({"scenarios": []}));
    assert_fails(
        &["evaluate", "--measured", &empty],
        "has no scenario (its \"scenarios\" list is empty)",
    );
    let mut unknown = good.clone();
    unknown["schedules"][1]["name"] = serde_json::json!("warp-drive");
    let unknown = write_json("unknown.json", &unknown);
    let o = ficco(&["evaluate", "--measured", &unknown]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("unknown schedule 'warp-drive' left out"));
}

#[test]
fn schedule_names_outside_the_space_are_rejected() {
    for (name, want) in [
        ("shard-nccl-ring-sm999", "the SM target must be 1 to 132"),
        ("shard-nccl-ring-gc999", "multiple of 8 SMs below 132"),
        (
            "shard-copy-ring-cta8",
            "copy-engine schedules make no NCCL calls",
        ),
        ("fine3-copy-ring", "must be one of [2, 4, 8]"),
        ("fine1024-copy-ring", "must be one of [2, 4, 8]"),
    ] {
        assert_fails(
            &[
                "explore",
                "--op",
                "ag-gemm",
                "--m",
                "8192",
                "--k",
                "256",
                "--n",
                "256",
                "--gpus",
                "4",
                "--backend",
                "sim",
                "--schedule",
                name,
            ],
            want,
        );
    }
}

#[test]
fn schedule_restriction_does_not_switch_selectors_silently() {
    let o = ficco(&[
        "explore",
        "--op",
        "ag-gemm",
        "--m",
        "8192",
        "--k",
        "1024",
        "--n",
        "1024",
        "--gpus",
        "4",
        "--backend",
        "sim",
        "--schedule",
        "fine4-nccl-ring",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("selector picks") && stdout(&o).contains("did not run here"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn messages_say_what_to_do() {
    assert_fails(&["select"], "say which problem: --op OP");
    assert_fails(&["tune"], "say which problem: --op OP");
    assert_fails(
        &[&["tune", "--top", "0"], &shape("2")[..]].concat(),
        "--top must be positive (how many",
    );
    let o = ficco(&[&["tune", "--top", "0"], &shape("2")[..]].concat());
    assert!(!stderr(&o).contains("invalid shape"), "{}", stderr(&o));
    let suite = tmp("typo.toml");
    std::fs::write(
        &suite,
        "[[senario]]\nname = \"a\"\nop = \"ag-gemm\"\nm = 1024\nk = 64\nn = 64\ngpus = 2\n",
    )
    .unwrap();
    assert_fails(
        &[
            "explore",
            "--suite",
            suite.to_str().unwrap(),
            "--backend",
            "sim",
        ],
        "unknown table [[senario]]",
    );
    let o = assert_fails(
        &[
            "explore",
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
            "--backend",
            "sim",
        ],
        "--op concurrent needs --collective",
    );
    assert!(!stderr(&o).contains("Problem::"), "{}", stderr(&o));
    let profile = tmp("extreme.toml");
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/ficco-core/profiles/h200-nvlink.toml"),
    )
    .unwrap()
    .replace("hbm_gbs = 4800.0", "hbm_gbs = 1e-300");
    std::fs::write(&profile, text).unwrap();
    let o = assert_fails(
        &[
            &[
                "explore",
                "--backend",
                "sim",
                "--hw",
                profile.to_str().unwrap(),
            ],
            &shape("2")[..],
        ]
        .concat(),
        "hbm_gbs must be positive, between",
    );
    assert!(!stderr(&o).contains("deadlock"));
}

#[test]
fn evaluate_on_the_simulator_says_simulating() {
    let suite = two_scenario_suite("sim-evaluate");
    let o = ficco(&[
        "evaluate",
        "--suite",
        suite.to_str().unwrap(),
        "--backend",
        "sim",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ficco: simulating plain"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("measuring"), "{}", stderr(&o));
}
