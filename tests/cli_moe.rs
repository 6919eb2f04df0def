//! The expert-parallel operators on the command line: `--op a2a-gemm|gemm-a2a`
//! with the routing flags, models with MoE layers (`--skew`), the MoE suite,
//! the design-space listing, and one-line errors for bad routing values.

mod support;
use support::{assert_fails, ficco, stderr, stdout};

const SIM: [&str; 2] = ["--backend", "sim"];

fn explore(args: &[&str]) -> (String, String) {
    let mut all = vec!["explore"];
    all.extend_from_slice(args);
    all.extend_from_slice(&SIM);
    let o = ficco(&all);
    assert!(o.status.success(), "{all:?}: {}", stderr(&o));
    (stdout(&o), stderr(&o))
}

#[test]
fn op_a2a_gemm_table_shows_routing_and_every_schedule() {
    let (out, _) = explore(&[
        "--op",
        "a2a-gemm",
        "--m",
        "8192",
        "--k",
        "4096",
        "--n",
        "28672",
        "--gpus",
        "4",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--skew",
        "heavy",
        "--seed",
        "5",
    ]);
    assert!(
        out.contains("a2a-gemm tokens=8192 k=4096 n=28672 P=4 experts=8 top-2 skew=heavy seed=5"),
        "{out}"
    );
    let routing = out
        .lines()
        .find(|l| l.starts_with("# routing: rows received per rank "))
        .expect("routing line");
    // Four ranks' received rows add up to tokens x top-k.
    let rows: usize = routing
        .trim_start_matches("# routing: rows received per rank ")
        .split(';')
        .next()
        .unwrap()
        .split('/')
        .map(|x| x.trim().parse::<usize>().unwrap())
        .sum();
    assert_eq!(rows, 8192 * 2);
    for s in [
        "seq ",
        "shard-copy-ring ",
        "bulk-nccl-all ",
        "fine8-copy-all-2s ",
    ] {
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(s)),
            "{s}: {out}"
        );
    }
    assert!(out.contains("# selected (rules): "), "{out}");
    assert!(out.contains("   skipped: 0\n"), "{out}");
}

#[test]
fn skew_changes_the_reference_and_is_reproducible() {
    let run = |skew: &str, seed: &str| {
        let (out, _) = explore(&[
            "--op",
            "gemm-a2a",
            "--m",
            "4096",
            "--k",
            "1408",
            "--n",
            "2048",
            "--gpus",
            "2",
            "--experts",
            "64",
            "--top-k",
            "6",
            "--skew",
            skew,
            "--seed",
            seed,
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["op"], "gemm-a2a");
        assert_eq!(v["moe"]["experts"], 64);
        assert_eq!(v["moe"]["skew"], skew);
        v["reference"]["sequential_ms"].as_f64().unwrap()
    };
    let none = run("none", "1");
    assert_eq!(none, run("none", "1"), "seeded: the same routing twice");
    let heavy = run("heavy", "1");
    assert!(
        heavy > none,
        "heavy skew loads one rank more: {heavy} vs {none}"
    );
}

#[test]
fn models_with_moe_layers_add_those_scenarios() {
    let (out, _) = explore(&[
        "--model",
        "mixtral-8x7b",
        "--tokens",
        "8192",
        "--gpus",
        "4",
        "--skew",
        "moderate",
    ]);
    for name in [
        "mixtral-8x7b.qkv.t8192.p4",
        "mixtral-8x7b.mlp_down.t8192.p4",
        "mixtral-8x7b.moe_up.t8192.p4.moderate",
        "mixtral-8x7b.moe_down.t8192.p4.moderate",
    ] {
        assert!(
            out.contains(&format!("# ficco explore: {name}\n")),
            "{name}: {out}"
        );
    }
    assert!(out.contains("# suite summary: 7 scenarios"), "{out}");
    let (out, _) = explore(&[
        "--model",
        "qwen3-30b-a3b",
        "--tokens",
        "4096",
        "--gpus",
        "4",
    ]);
    assert!(out.contains("qwen3-30b-a3b.moe_up.t4096.p4.none"), "{out}");
    assert!(out.contains("experts=128 top-8"), "{out}");
    assert!(out.contains("# suite summary: 2 scenarios"), "{out}");
    // A GPU count that does not divide the experts keeps the TP layers and says so.
    let (out, err) = explore(&[
        "--model",
        "mixtral-8x7b",
        "--tokens",
        "4096",
        "--gpus",
        "16",
    ]);
    assert!(!out.contains("moe_up"), "{out}");
    assert!(
        err.contains("8 experts cannot be spread evenly over 16 GPUs"),
        "{err}"
    );
}

#[test]
fn moe_suite_runs() {
    let (out, _) = explore(&["--suite", "suites/moe.toml", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let sc = v["scenarios"].as_array().expect("scenarios");
    assert_eq!(sc.len(), 72);
    for s in sc {
        let rows = s["schedules"].as_array().unwrap();
        assert!(
            rows.iter().all(|r| r["skipped"].is_null()),
            "{}",
            s["scenario"]
        );
        assert!(s["best"].is_string(), "{}", s["scenario"]);
    }
}

#[test]
fn schedules_lists_the_moe_space() {
    for op in ["a2a-gemm", "gemm-a2a"] {
        let o = ficco(&["schedules", "--op", op, "--gpus", "4"]);
        let out = stdout(&o);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            out.starts_with(&format!("# 41 schedules of {op} on 4 GPUs")),
            "{out}"
        );
        assert!(!out.contains("-acc"), "{out}");
    }
}

#[test]
fn select_takes_moe_problems() {
    let o = ficco(&[
        "select",
        "--op",
        "a2a-gemm",
        "--m",
        "16384",
        "--k",
        "4096",
        "--n",
        "28672",
        "--gpus",
        "4",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--no-cache",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("bulk-copy-ring"), "{}", stdout(&o));
}

#[test]
fn bad_routing_values_fail_in_one_line() {
    let op = [
        "explore",
        "--backend",
        "sim",
        "--op",
        "a2a-gemm",
        "--m",
        "4096",
        "--k",
        "64",
        "--n",
        "64",
        "--gpus",
        "4",
    ];
    fn with<'a>(op: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = op.to_vec();
        v.extend_from_slice(extra);
        v
    }
    assert_fails(
        &with(&op, &["--experts", "8", "--top-k", "2", "--skew", "-0.5"]),
        "skew must be",
    );
    assert_fails(
        &with(&op, &["--experts", "8", "--top-k", "2", "--skew", "5"]),
        "between 0 and 4",
    );
    assert_fails(
        &with(&op, &["--experts", "8", "--top-k", "2", "--skew", "lots"]),
        "skew must be",
    );
    assert_fails(
        &with(&op, &["--experts", "8", "--top-k", "9"]),
        "top-k must be between 1 and the expert count 8",
    );
    assert_fails(
        &with(&op, &["--experts", "8", "--top-k", "0"]),
        "top-k must be positive",
    );
    assert_fails(
        &with(&op, &["--experts", "6", "--top-k", "2"]),
        "not a multiple of the GPU count 4",
    );
    assert_fails(
        &with(&op, &["--experts", "-8", "--top-k", "2"]),
        "experts must be positive",
    );
    assert_fails(
        &with(&op, &["--experts", "8", "--top-k", "2", "--seed", "-1"]),
        "seed must be",
    );
    assert_fails(&with(&op, &[]), "needs --experts E and --top-k K");
    assert_fails(
        &[
            "explore",
            "--backend",
            "sim",
            "--op",
            "a2a-gemm",
            "--m",
            "4098",
            "--k",
            "64",
            "--n",
            "64",
            "--gpus",
            "4",
            "--experts",
            "8",
            "--top-k",
            "2",
        ],
        "not divisible by the GPU count",
    );
    assert_fails(
        &[
            "explore",
            "--backend",
            "sim",
            "--op",
            "ag-gemm",
            "--m",
            "4096",
            "--k",
            "64",
            "--n",
            "64",
            "--gpus",
            "4",
            "--skew",
            "heavy",
        ],
        "belong to a2a-gemm and gemm-a2a",
    );
    assert_fails(
        &[
            "explore",
            "--backend",
            "sim",
            "--model",
            "llama3-8b",
            "--tokens",
            "4096",
            "--gpus",
            "4",
            "--skew",
            "heavy",
        ],
        "has no experts",
    );
    assert_fails(
        &[
            "explore",
            "--backend",
            "sim",
            "--suite",
            "suites/moe.toml",
            "--skew",
            "heavy",
        ],
        "do not apply to --suite",
    );
    assert_fails(
        &[
            "explore",
            "--backend",
            "sim",
            "--op",
            "a2a-gemm",
            "--m",
            "4096",
            "--k",
            "64",
            "--n",
            "64",
            "--gpus",
            "4",
            "--experts",
            "8",
            "--top-k",
            "2",
            "--schedule",
            "shard-copy-ring-acc",
        ],
        "has no such schedule",
    );
}
