//! `ficco gemm-bench`: the shapes come from the core's lowering (`--list`,
//! no GPU needed); without a GPU the benchmark is one error line and exit 2.

use std::process::Command;

fn ficco(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ficco"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run ficco")
}

#[test]
fn without_a_gpu_the_bench_is_one_error_line() {
    let o = ficco(&[
        "gemm-bench",
        "--max-shapes",
        "1",
        "--no-hooks",
        "--iters",
        "2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if o.status.success() {
        // A machine with a GPU: the table with its summary.
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("# 8192^3: ficco"), "{out}");
        return;
    }
    assert_eq!(o.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("error: gemm-bench needs a GPU"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn the_shapes_are_every_gemm_of_the_suite_schedules() {
    let o = ficco(&["gemm-bench", "--list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        out.starts_with(&format!("# {} GEMM shapes", rows.len())),
        "{out}"
    );
    // 8192^3 first, then whole and chunk GEMMs, each (M, N, K) once.
    assert_eq!(rows[0][..4], ["8192", "8192", "8192", "square"]);
    let mut seen = std::collections::HashSet::new();
    for r in &rows {
        assert!(seen.insert((r[0], r[1], r[2])), "duplicate {r:?}");
    }
    let has = |m: &str, n: &str, k: &str, use_: &str| {
        rows.iter()
            .any(|r| r[..3] == [m, n, k] && r[5..].join(" ").contains(use_))
    };
    // llama3-8b qkv at P=2: the whole gathered GEMM and its fine8 chunk.
    assert!(
        has("2048", "3072", "4096", "llama3-8b.qkv.t2048.p2 whole"),
        "{out}"
    );
    assert!(
        has("128", "3072", "4096", "llama3-8b.qkv.t2048.p2 fine8"),
        "{out}"
    );
    assert!(rows.iter().any(|r| r[3] == "chunk"));
    assert!(rows.len() > 100, "{}", rows.len());
    // A suite of one scenario: its whole GEMM and its chunks only.
    let dir = std::env::temp_dir().join(format!("ficco-gemm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let suite = dir.join("one.toml");
    std::fs::write(
        &suite,
        "[[scenario]]\nname = \"one\"\nop = \"gemm-rs\"\nm = 4096\nk = 1024\nn = 2048\ngpus = 4\n",
    )
    .unwrap();
    let o = ficco(&["gemm-bench", "--list", "--suite", suite.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("  4096   2048   1024       whole"), "{out}");
    // fine8 at P=4: 4096 / 4 / 8 = 128 rows.
    assert!(out.contains("   128   2048   1024       chunk"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn argument_errors_come_first() {
    for args in [
        vec!["gemm-bench", "--iters", "0"],
        vec!["gemm-bench", "--max-shapes", "0"],
        vec!["gemm-bench", "--suite", "/nonexistent/suite.toml"],
        vec!["gemm-bench", "--save", "/nonexistent-dir/x.json"],
        vec!["gemm-bench", "--json", "--save", "x.json"],
    ] {
        let o = ficco(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            !err.contains("needs a GPU") || args[1] == "--save",
            "{args:?}: {err}"
        );
    }
    let o = ficco(&["gemm-bench", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--json",
        "--save",
        "--suite",
        "--list",
        "--no-hooks",
        "--iters",
    ] {
        assert!(out.contains(flag), "{out}");
    }
}

#[test]
fn grouped_lists_the_moe_presets_expert_gemms() {
    let o = ficco(&["gemm-bench", "--grouped", "--list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    // 3 models x 2 token counts x 2 skews x 2 expert layers.
    assert_eq!(rows.len(), 24, "{out}");
    assert!(out.starts_with("# 24 grouped GEMM cases"), "{out}");
    // scenario, rank, N, K, experts, empty, rows, max: Mixtral's up
    // projection, every expert on one GPU, 4096 tokens x top-2.
    assert_eq!(
        rows[0][..7],
        [
            "mixtral-8x7b.moe_up.t4096.p1.none",
            "0",
            "28672",
            "4096",
            "8",
            "0",
            "8192"
        ]
    );
    assert!(
        out.contains("qwen3-30b-a3b.moe_down.t16384.p1.heavy"),
        "{out}"
    );
    // On 4 GPUs: the busiest rank's 64 / 4 DeepSeek experts.
    let o = ficco(&["gemm-bench", "--grouped", "--gpus", "4", "--list"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let ds = out
        .lines()
        .find(|l| l.contains("deepseek-v2-lite.moe_up.t4096.p4.heavy"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(ds.split_whitespace().nth(4), Some("16"), "{ds}");
    // Without a GPU the grouped bench is one error line too.
    let o = ficco(&[
        "gemm-bench",
        "--grouped",
        "--max-shapes",
        "1",
        "--iters",
        "2",
    ]);
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: gemm-bench needs a GPU"), "{err}");
    }
    for args in [
        vec!["gemm-bench", "--gpus", "2"],
        vec!["gemm-bench", "--grouped", "--gpus", "3", "--list"],
        vec!["gemm-bench", "--grouped", "--gpus", "0", "--list"],
    ] {
        let o = ficco(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
}
