//! Issue 31: what a new user still tripped on, each with the behaviour it
//! now has: flags that contradict each other fail, messages name what was
//! meant, the simulator's table shows only what the simulator knows, and
//! help text offers flags only where they mean something.

mod support;
use support::{assert_fails, ficco, stderr, stdout};

const SHAPE: [&str; 10] = [
    "--op", "ag-gemm", "--m", "8192", "--k", "8192", "--n", "2560", "--gpus", "4",
];

fn explore(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["explore", "--backend", "sim"]
        .iter()
        .chain(SHAPE.iter())
        .map(|s| s.to_string())
        .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

// Item 2: flags that contradict each other.

#[test]
fn json_and_a_file_on_stdout_contradict() {
    for flag in ["--svg", "--trace"] {
        let args = explore(&["--json", flag, "-"]);
        let o = assert_fails(
            &strs(&args),
            &format!("--json and {flag} - both write to stdout"),
        );
        assert!(o.stdout.is_empty(), "{flag}: {}", stdout(&o));
    }
}

#[test]
fn procs_must_match_the_gpu_count() {
    let args = explore(&["--procs", "3"]);
    let o = assert_fails(
        &strs(&args),
        "--procs 3 runs 3 ranks, one per GPU, but the problem is on 4 GPUs: give --procs 4",
    );
    // Nothing ran: no rank printed a notice or a table.
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    assert!(!stderr(&o).contains("ficco: "), "{}", stderr(&o));
}

#[test]
fn a_job_without_gpus_says_so_once() {
    // `auto` on a machine without a usable GPU: every rank falls back to the
    // simulator, and only rank 0 says so.
    let mut args = vec!["explore", "--procs", "4"];
    args.extend(SHAPE);
    let o = ficco(&args);
    if !stderr(&o).contains("no GPU backend available") {
        eprintln!("SKIPPED: a_job_without_gpus_says_so_once: this machine has GPUs");
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).matches("no GPU backend available").count(),
        1,
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o).matches("# ficco explore:").count(), 1);
}

// Item 3: messages.

#[test]
fn an_unknown_operator_lists_every_operator_and_the_one_meant() {
    let o = assert_fails(
        &["schedules", "--op", "ag-gem", "--gpus", "4"],
        "unknown operator 'ag-gem' (expected one of: ag-gemm, gemm-rs, gemm-ar, a2a-gemm, gemm-a2a, concurrent); did you mean 'ag-gemm'?",
    );
    assert!(o.stdout.is_empty());
    assert_fails(
        &[
            "explore", "--op", "gemmrs", "--m", "8", "--k", "8", "--n", "8", "--gpus", "2",
        ],
        "did you mean 'gemm-rs'?",
    );
    assert_fails(
        &[
            "explore",
            "--model",
            "llama3-70",
            "--tokens",
            "8",
            "--gpus",
            "2",
        ],
        "did you mean 'llama3-70b'?",
    );
}

#[test]
fn a_mistyped_suite_operator_is_an_error_not_a_future_feature() {
    let path = support::tmp("newcomer", "typo-op.toml");
    std::fs::write(
        &path,
        "[[scenario]]\nname = \"a\"\nop = \"ag-gemmm\"\nm = 1024\nk = 64\nn = 64\ngpus = 2\n\
         [[scenario]]\nname = \"b\"\nop = \"gemm-rs\"\nm = 1024\nk = 64\nn = 64\ngpus = 2\n",
    )
    .unwrap();
    let o = assert_fails(
        &[
            "explore",
            "--suite",
            path.to_str().unwrap(),
            "--backend",
            "sim",
        ],
        "scenario 'a': unknown operator 'ag-gemmm'",
    );
    assert!(
        stderr(&o).contains("did you mean 'ag-gemm'?"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("not supported yet"), "{}", stderr(&o));
    // A name far from every operator may be a newer ficco's: skipped, said so.
    std::fs::write(
        &path,
        "[[scenario]]\nname = \"a\"\nop = \"moe-fused\"\nm = 1024\nk = 64\nn = 64\ngpus = 2\n\
         [[scenario]]\nname = \"b\"\nop = \"gemm-rs\"\nm = 1024\nk = 64\nn = 64\ngpus = 2\n",
    )
    .unwrap();
    let o = ficco(&[
        "explore",
        "--suite",
        path.to_str().unwrap(),
        "--backend",
        "sim",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "ficco: skipped [[scenario]] 'a': operator 'moe-fused' is not one this version of ficco knows"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn schedule_lists_are_split_and_a_list_in_a_name_says_so() {
    let one = ficco(&strs(&explore(&[
        "--json",
        "--schedule",
        "shard-copy-ring",
        "--schedule",
        "fine2-copy-all",
    ])));
    assert_eq!(one.status.code(), Some(0), "{}", stderr(&one));
    let list = ficco(&strs(&explore(&[
        "--json",
        "--schedule",
        "shard-copy-ring,fine2-copy-all",
    ])));
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    assert_eq!(stdout(&list), stdout(&one));
    // Where one name is expected (Python's check_schedule), a list says
    // what it is: ficco_core's parser.
    let o = assert_fails(
        &strs(&explore(&["--schedule", "shard-copy-ring fine2-copy-all"])),
        "that is several names",
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn a_bad_profile_file_says_where_on_one_line() {
    let path = support::tmp("newcomer", "bad-profile.toml");
    std::fs::write(&path, "name = \"x\"\nsm_count = \n").unwrap();
    let args = explore(&["--hw", path.to_str().unwrap()]);
    let o = assert_fails(&strs(&args), "bad-profile.toml': line 2, column 12: ");
    let err = stderr(&o);
    assert!(
        !err.contains(" | "),
        "the source excerpt is left out: {err}"
    );
    let o = assert_fails(&strs(&explore(&["--hw", "nonexistent"])), "hardware profile: 'nonexistent' is neither a built-in profile (h200-nvlink, h100-nvlink) nor a TOML file");
    assert_eq!(stderr(&o).matches("profile").count(), 2, "{}", stderr(&o));
}

// Item 4: the simulator's table.

#[test]
fn the_simulator_table_has_only_what_the_simulator_knows() {
    let o = ficco(&strs(&explore(&[])));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("# times are the simulator's predictions: no GPU ran them"),
        "{out}"
    );
    let head = out
        .lines()
        .find(|l| l.starts_with("# schedule"))
        .expect("header");
    assert_eq!(
        head.split_whitespace().collect::<Vec<_>>(),
        ["#", "schedule", "time", "speedup", "E"]
    );
    for absent in ["predicted", "rel_err", "#wrong"] {
        assert!(!out.contains(absent), "{absent}:\n{out}");
    }
    let seq = out
        .lines()
        .find(|l| l.starts_with("  seq "))
        .expect("seq row");
    assert_eq!(seq.split_whitespace().count(), 4, "{seq}");
}

#[test]
fn a_selection_unlike_the_best_says_why() {
    let out = stdout(&ficco(&strs(&explore(&[]))));
    let best = out
        .lines()
        .find_map(|l| l.strip_prefix("# best: "))
        .and_then(|l| l.split_whitespace().next())
        .expect("best");
    let line = out
        .lines()
        .find(|l| l.starts_with("# selected (rules): "))
        .expect("selected");
    let selected = line.split_whitespace().nth(3).expect("name");
    assert_ne!(
        selected, best,
        "this shape's rules pick is not the best:\n{out}"
    );
    assert!(line.contains("% slower than best"), "{line}");
    assert!(
        out.contains("#   (the rules choose from the shape alone, as `ficco select` does"),
        "{out}"
    );
}

#[test]
fn evaluate_on_the_simulator_does_not_claim_measurements() {
    let suite = support::tmp("newcomer", "one.toml");
    std::fs::write(
        &suite,
        "[[scenario]]\nname = \"a\"\nop = \"ag-gemm\"\nm = 8192\nk = 8192\nn = 2560\ngpus = 4\n",
    )
    .unwrap();
    let o = ficco(&[
        "evaluate",
        "--suite",
        suite.to_str().unwrap(),
        "--backend",
        "sim",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("of the simulated best"), "{out}");
    assert!(
        !out.contains("measured best") && !out.contains("MAPE"),
        "{out}"
    );
    assert!(out.contains("# simulator error: not scored"), "{out}");
}

#[test]
fn a_suite_beyond_the_ideal_says_why() {
    let o = ficco(&["explore", "--suite", "suites/moe.toml", "--backend", "sim"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let best = out
        .lines()
        .find(|l| l.starts_with("#  best "))
        .expect("summary");
    // geo(T/ideal); 0.782 before the simulator's P = 4 terms (h200-nvlink).
    assert!(best.split_whitespace().any(|x| x == "0.827"), "{best}");
    assert!(
        out.contains("#  (agg_E > 1 or geo(T/ideal) < 1: faster than the ideal, whose comm is the NCCL collective; copy engines move the same bytes faster"),
        "{out}"
    );
}

// Item 5: help text.

fn help(cmd: &str) -> String {
    let o = ficco(&[cmd, "--help"]);
    assert_eq!(o.status.code(), Some(0), "{cmd}: {}", stderr(&o));
    stdout(&o)
}

#[test]
fn flags_appear_only_where_they_mean_something() {
    for cmd in ["schedules", "select"] {
        let h = help(cmd);
        assert!(
            !h.contains("--no-graph") && !h.contains("--verbose"),
            "{cmd}:\n{h}"
        );
    }
    for cmd in ["info", "characterize", "gemm-bench"] {
        let h = help(cmd);
        assert!(
            h.contains("--verbose") && !h.contains("--no-graph"),
            "{cmd}:\n{h}"
        );
    }
    for cmd in ["explore", "evaluate", "tune"] {
        let h = help(cmd);
        assert!(
            h.contains("--verbose") && h.contains("--no-graph"),
            "{cmd}:\n{h}"
        );
    }
    // Every backend in the explore --backend line, loopback too.
    let h = help("explore");
    let line = h
        .lines()
        .skip_while(|l| !l.contains("--backend"))
        .nth(1)
        .unwrap_or_default();
    for b in ["auto", "sim", "gpu", "loopback"] {
        assert!(line.contains(b), "{b}: {line}");
    }
    // select's --op offers only what select takes; explore's adds concurrent.
    let op = |h: &str| {
        h.lines()
            .skip_while(|l| !l.contains("--op <OP>"))
            .take(2)
            .collect::<String>()
    };
    assert!(
        !op(&help("select")).contains("concurrent"),
        "{}",
        help("select")
    );
    assert!(
        op(&help("explore")).contains("concurrent"),
        "{}",
        help("explore")
    );
    assert_fails(
        &[
            "select",
            "--no-cache",
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
        ],
        "explore its controls with `ficco explore --op concurrent`",
    );
}

#[test]
fn json_alone_prints_json_on_every_command() {
    let suite = support::tmp("newcomer", "json.toml");
    std::fs::write(
        &suite,
        "[[scenario]]\nname = \"a\"\nop = \"ag-gemm\"\nm = 8192\nk = 8192\nn = 2560\ngpus = 4\n",
    )
    .unwrap();
    let o = ficco(&[
        "evaluate",
        "--suite",
        suite.to_str().unwrap(),
        "--backend",
        "sim",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(v["simulated"], true);
    // --json FILE still writes the file and prints the table.
    let file = support::tmp("newcomer", "eval.json");
    let o = ficco(&[
        "evaluate",
        "--suite",
        suite.to_str().unwrap(),
        "--backend",
        "sim",
        "--json",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("# ficco evaluate"), "{}", stdout(&o));
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved, v);
    for cmd in [
        "explore",
        "info",
        "select",
        "tune",
        "evaluate",
        "characterize",
        "gemm-bench",
    ] {
        let h = help(cmd);
        let line = h
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--json"))
            .take(2)
            .collect::<String>();
        assert!(line.contains("Print JSON"), "{cmd}: {line}");
    }
}

// Item 6: scale.

#[test]
fn a_size_the_gpus_do_not_divide_names_sizes_they_do() {
    assert_fails(
        &[
            "explore", "--op", "ag-gemm", "--m", "65536", "--k", "8192", "--n", "8192", "--gpus",
            "72", "--backend", "sim",
        ],
        "m = 65536 is not divisible by the GPU count 72: the nearest multiples of 72 are 65520 and 65592",
    );
}

// Item 7: the README shows what ficco prints.

fn readme() -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md")
}

/// The code block of the README that starts with `first`.
fn readme_block(first: &str) -> Vec<String> {
    let text = readme();
    let start = text
        .find(&format!("```\n{first}"))
        .unwrap_or_else(|| panic!("no README block starting with {first:?}"));
    text[start + 4..]
        .lines()
        .take_while(|l| !l.starts_with("```"))
        .map(str::to_string)
        .collect()
}

/// Every line of `shown` but `...` is a line of `got`, in the same order.
fn shown_in_order(shown: &[String], got: &str) {
    let mut lines = got.lines();
    for want in shown.iter().filter(|l| l.trim() != "...") {
        assert!(
            lines.any(|l| l == want),
            "README line not printed (or out of order): {want:?}\n--- printed:\n{got}"
        );
    }
}

#[test]
fn the_readme_first_screen_is_what_the_main_job_prints() {
    let text = readme();
    let first_block = text.find("\n```\n").expect("an output block");
    let first_screen: String = text[..first_block].lines().take(40).collect();
    assert!(
        first_screen.contains("explore --model llama3-70b --tokens 8192 --gpus 4"),
        "the main job is on the first screen"
    );
    let o = ficco(&[
        "explore",
        "--model",
        "llama3-70b",
        "--tokens",
        "8192",
        "--gpus",
        "4",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    if !stderr(&o).contains("no GPU backend available") {
        eprintln!("SKIPPED: the README shows the simulator's output; this machine has GPUs");
        return;
    }
    let shown = readme_block("ficco: no GPU backend available");
    assert!(shown.len() > 20, "{shown:?}");
    let got = format!("{}{}", stderr(&o), stdout(&o));
    shown_in_order(&shown, &got);
    // The block starts within the first 80 lines of the README.
    let at = text[..text.find("```\nficco: no GPU backend").unwrap()]
        .lines()
        .count();
    assert!(at < 80, "the output starts at line {at}");
}

#[test]
fn the_readme_schedule_listing_is_what_schedules_prints() {
    let shown = readme_block("# ");
    let o = ficco(&["schedules", "--op", "ag-gemm", "--gpus", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let got = stdout(&o);
    assert!(
        shown[0].starts_with("# 43 schedules of ag-gemm on 4 GPUs"),
        "{shown:?}"
    );
    for (want, got) in shown.iter().zip(got.lines()) {
        assert_eq!(want, got);
    }
}

#[test]
fn shipped_files_cite_only_files_in_the_repository() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in [
        "suites",
        "examples",
        "bench",
        "crates/ficco-cuda/tests",
        "crates/ficco-core/tests",
    ] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = e.unwrap().path();
            if !path.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                !text.contains("MISSION.md"),
                "{} cites MISSION.md, which is not in the repository",
                path.display()
            );
        }
    }
}

// Item 5 (what nccl-tests and hyperfine users miss): iterations as flags.

#[test]
fn iterations_are_flags_of_explore_and_tune() {
    for cmd in ["explore", "tune"] {
        let h = help(cmd);
        assert!(
            h.contains("--iters <N>") && h.contains("--warmup <N>"),
            "{cmd}:\n{h}"
        );
    }
    assert_fails(
        &strs(&explore(&["--iters", "0"])),
        "--iters must be at least 1 (the timed iterations), got 0",
    );
    assert_fails(
        &strs(&explore(&["--warmup", "-1"])),
        "--warmup must be zero or positive, got -1",
    );
    let o = ficco(&strs(&explore(&["--iters", "50", "--warmup", "10"])));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "ficco: --iters and --warmup apply to GPU measurements; the simulator (sim) does not iterate"
        ),
        "{}",
        stderr(&o)
    );
}
