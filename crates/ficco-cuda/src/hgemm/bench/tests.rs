//! Tests of `gemm-bench`'s host side (no GPU): the shapes it derives from
//! the core, the summary's arithmetic, the best-schedule pick and the table.

use super::*;
use crate::hgemm::TileN;

#[test]
fn llama3_bench_shapes_come_from_the_core() {
    let text = include_str!("../../../../../suites/llama3.toml");
    let suite = ficco_core::problem::suite::parse(text, "llama3.toml").unwrap();
    let shapes = bench_shapes(&suite.scenarios);
    assert_eq!((shapes[0].m, shapes[0].kind), (SQUARE, "square"));
    assert!(shapes.iter().any(|s| s.kind.contains("whole")));
    assert!(shapes.iter().any(|s| s.kind.contains("chunk")));
    // ag-gemm 2048 x 4096 x 3072 at P=2: whole 2048 rows, fine8 128 rows.
    let find = |m, n, k| shapes.iter().find(|s| (s.m, s.n, s.k) == (m, n, k));
    assert!(find(2048, 3072, 4096).unwrap().kind.contains("whole"));
    let fine8 = find(128, 3072, 4096).unwrap();
    assert!(fine8
        .uses
        .contains(&"llama3-8b.qkv.t2048.p2 fine8".to_string()));
    let mut seen = std::collections::HashSet::new();
    for s in &shapes {
        assert!(s.n % 8 == 0 && s.k % 8 == 0, "{s:?}");
        assert!(seen.insert((s.m, s.n, s.k)), "duplicate {s:?}");
    }
}

#[test]
fn summary_math() {
    let row = |r: f64, kind| ShapeRow {
        m: 1,
        n: 8,
        k: 8,
        kind,
        uses: 2,
        first_use: "x whole".into(),
        splits: 1,
        tile_n: TileN::N256,
        ficco_ms: r,
        tuned_ms: 1.0,
        default_ms: 1.0,
        ficco_tflops: 0.0,
        tuned_tflops: 0.0,
        default_tflops: 0.0,
        ratio_tuned: r,
        ratio_default: r,
        rel_err: 0.0,
        default_rel_err: 0.0,
        variants: vec![],
        best: "256/1".into(),
        best_ms: r,
        best_ratio_tuned: r,
        auto: "256/1".into(),
        auto_ms: r,
        auto_ratio_tuned: r,
        auto_rel_err: 0.0,
    };
    let s = summarize(&[row(0.5, "whole"), row(2.0, "chunk")]);
    assert!((s.geomean_ratio_tuned - 1.0).abs() < 1e-12);
    assert_eq!(s.worst_ratio_tuned, 2.0);
    assert_eq!(s.chunk_time_ratio, 2.0);
    assert_eq!(s.square_tflops, None);
    let s = summarize(&[row(2.0, "chunk"), row(1.0, "whole+chunk")]);
    assert_eq!(s.chunk_time_ratio, 1.5);
    assert_eq!(s.best_differs, 0);
    assert_eq!((s.auto_differs, s.auto_chunk_time_ratio), (0, 1.5));
    // The autotuned pick 4x faster on the chunk shape: its columns follow it.
    let mut tuned = row(2.0, "chunk");
    tuned.auto = "128/4t".into();
    tuned.auto_ms = 0.5;
    tuned.auto_ratio_tuned = 0.5;
    let s = summarize(&[tuned, row(1.0, "whole")]);
    assert_eq!(s.auto_differs, 1);
    assert_eq!(s.auto_chunk_time_ratio, 0.5);
    assert!((s.auto_geomean_ratio_tuned - 0.5f64.sqrt()).abs() < 1e-12);
    assert_eq!((s.auto_worst_ratio_tuned, s.worst_ratio_tuned), (1.0, 2.0));
    // A variant twice as fast on the chunk shape: the best columns follow it.
    let mut fast = row(2.0, "chunk");
    fast.best = "128/2".into();
    fast.best_ms = 1.0;
    fast.best_ratio_tuned = 1.0;
    let s = summarize(&[fast, row(1.0, "whole+chunk")]);
    assert_eq!(s.chunk_time_ratio, 1.5);
    assert_eq!(s.best_chunk_time_ratio, 1.0);
    assert_eq!(s.best_geomean_ratio_tuned, 1.0);
    assert_eq!(s.worst_ratio_tuned, 2.0);
    assert_eq!(s.best_worst_ratio_tuned, 1.0);
    assert_eq!(s.best_differs, 1);
}

#[test]
fn best_schedule_skips_failed_and_wrong_variants() {
    let v = |tile, splits, ms: Option<f64>, err: Option<f64>| VariantRow {
        tile_n: tile,
        splits,
        tail_only: splits == 2,
        ms,
        ratio_tuned: None,
        rel_err: err,
        error: ms.is_none().then(|| "rejected".to_string()),
    };
    let vs = [
        v(TileN::N128, 1, None, None),
        v(TileN::N128, 2, Some(0.5), Some(0.3)),
        v(TileN::N256, 2, Some(0.8), Some(1e-4)),
        v(TileN::N256, 3, Some(0.9), Some(1e-4)),
    ];
    assert_eq!(
        best_schedule(TileN::N256, 1, 1.0, &vs),
        ("256/2t".to_string(), 0.8)
    );
    assert_eq!(
        best_schedule(TileN::N256, 1, 0.7, &vs),
        ("256/1".to_string(), 0.7)
    );
}

#[test]
fn the_table_reads_like_nccl_tests() {
    let row = ShapeRow {
        m: 8192,
        n: 8192,
        k: 8192,
        kind: "square",
        uses: 3,
        first_use: "8192^3".into(),
        splits: 1,
        tile_n: TileN::N256,
        ficco_ms: 1.5,
        tuned_ms: 1.6,
        default_ms: 1.6,
        ficco_tflops: 733.0,
        tuned_tflops: 687.2,
        default_tflops: 687.2,
        ratio_tuned: 0.9375,
        ratio_default: 0.9375,
        rel_err: 1e-4,
        default_rel_err: 0.0,
        variants: vec![VariantRow {
            tile_n: TileN::N128,
            splits: 1,
            tail_only: false,
            ms: Some(1.55),
            ratio_tuned: Some(1.55 / 1.6),
            rel_err: Some(1e-4),
            error: None,
        }],
        best: "256/1".into(),
        best_ms: 1.5,
        best_ratio_tuned: 0.9375,
        auto: "128/2".into(),
        auto_ms: 1.4,
        auto_ratio_tuned: 0.875,
        auto_rel_err: 1e-4,
    };
    let hook = HookRow {
        m: 8192,
        n: 8192,
        k: 8192,
        setting: HOOKS_3_TO_6.into(),
        ms: 1.6,
        tflops: 687.0,
        cost: 0.092,
        rel_err: 0.0,
        error: None,
    };
    let failed = HookRow {
        setting: HOOKS_3_TO_6_REGISTER.into(),
        error: Some("ficco hgemm: rejected".into()),
        ..hook.clone()
    };
    let rows = vec![row];
    let report = Report {
        device: "NVIDIA H200".into(),
        sms: 132,
        clusters: 66,
        compile: super::super::CompileInfo {
            ms: 10.4,
            cache: super::super::CacheOutcome::Hit,
            path: None,
            nvrtc: (13, 0),
        },
        config: BenchConfig::default(),
        suite: "suites/llama3.toml".into(),
        summary: summarize(&rows),
        rows,
        hooks: vec![hook, failed],
    };
    let t = table(&report);
    for want in [
        "# device: NVIDIA H200, 132 SMs, 66 clusters of 2 resident; ficco cubin: 10.4 ms (disk cache hit), NVRTC 13.0",
        "  8192   8192   8192      square   256/1",
        "   1.5000   733.0    1.6000   687.2",
        "8192^3 (+2)",
        "# 8192^3: ficco 733 TFLOP/s, cuBLASLt autotuned 687, default 687 (target >= 760)",
        "geomean ficco/cuBLASLt 0.938",
        "# hooks 3-6 (flags set): +9.2% at 8192x8192x8192 (target <= 3%)",
        "hooks 3-6 register failed: ficco hgemm: rejected",
        "1.0e-4    0.0e0   256/1  0.938   128/2  0.875  8192^3 (+2)",
        "# ficco autotuned (the executor's pick; differs from the chooser's on 1): geomean 0.875",
    ] {
        assert!(t.contains(want), "{want:?} not in\n{t}");
    }
    // Every line is a comment, a data row of the same columns, or a failed setting.
    let data: Vec<&str> = t.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(data.len(), 3, "{t}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["rows"][0]["first_use"], "8192^3");
    assert_eq!(json["summary"]["square_tflops"][0], 733.0);
    assert_eq!(json["compile"]["cache"], "Hit");
    assert_eq!(json["rows"][0]["variants"][0]["tile_n"], "N128");
    assert_eq!(json["rows"][0]["best"], "256/1");
    assert_eq!(json["summary"]["best_differs"], 0);
    assert_eq!(json["rows"][0]["auto"], "128/2");
    assert_eq!(json["summary"]["auto_geomean_ratio_tuned"], 0.875);
}
