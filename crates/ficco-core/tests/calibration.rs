//! Calibration of the `h200-nvlink` profile against the 60 scenarios measured
//! on 4x H200 (`data/anchor-h200x4.jsonl`): the cost model's GEMM, collective
//! and sequential times must each have a median absolute relative error of at
//! most 10% and a worst one of at most 30%.
//!
//! Run with `--nocapture` to see the table.

use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::cost;
use ficco_core::sim::profile::HwProfile;
use ficco_core::stats::median;
use serde::Deserialize;

const ANCHOR: &str = include_str!("../data/anchor-h200x4.jsonl");

#[derive(Deserialize)]
struct Row {
    name: String,
    op: Op,
    m: usize,
    k: usize,
    n: usize,
    gpus: usize,
    compute_ms: f64,
    comm_ms: f64,
    seq_ms: f64,
}

fn rows() -> Vec<(String, Problem, [f64; 3])> {
    ANCHOR
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let r: Row = serde_json::from_str(l).expect("anchor line parses");
            let p = Problem::new(r.op, r.m, r.k, r.n, r.gpus).unwrap();
            (r.name, p, [r.compute_ms, r.comm_ms, r.seq_ms])
        })
        .collect()
}

#[test]
fn h200_profile_matches_the_anchor() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let rows = rows();
    assert_eq!(rows.len(), 60);
    let mut errs: [Vec<f64>; 3] = Default::default();
    println!(
        "{:<34} {:>8} {:>8} {:>6} | {:>7} {:>7} {:>6} | {:>7} {:>7} {:>6}",
        "scenario", "gemm", "model", "err", "comm", "model", "err", "seq", "model", "err"
    );
    for (name, p, measured) in &rows {
        let model = [
            cost::problem_gemm_ms(&hw, p),
            cost::problem_comm_ms(&hw, p),
            cost::problem_seq_ms(&hw, p),
        ];
        let mut line = format!("{name:<34}");
        for j in 0..3 {
            let e = model[j] / measured[j] - 1.0;
            errs[j].push(e.abs());
            line.push_str(&format!(
                " {:>8.3} {:>8.3} {:>+5.1}% |",
                measured[j],
                model[j],
                100.0 * e
            ));
        }
        println!("{line}");
    }
    let mut failures = Vec::new();
    for (j, what) in ["gemm", "comm", "seq"].iter().enumerate() {
        let med = median(&errs[j]).expect("60 errors");
        let worst = errs[j].iter().cloned().fold(0.0, f64::max);
        println!(
            "{what:>5}: median |err| {:.1}%, worst {:.1}%",
            100.0 * med,
            100.0 * worst
        );
        if med > 0.10 || worst > 0.30 {
            failures.push(format!("{what}: median {med:.3}, worst {worst:.3}"));
        }
    }
    assert!(
        failures.is_empty(),
        "calibration out of bounds: {failures:?}"
    );
}

/// `ficco characterize`'s pure half ([`ficco_core::sim::calibrate`]), on
/// synthetic measurements (no GPU needed): fits recover known parameters, the
/// written profile loads back, and every probe plan is valid.
mod characterize {
    use ficco_core::plan::lower::probe::{chunked_gemm, gemms_beside_traffic, peer_pulls};
    use ficco_core::plan::validate::validate;
    use ficco_core::plan::Plan;
    use ficco_core::problem::workload::Collective;
    use ficco_core::run::timeline::{Span, Timeline};
    use ficco_core::sim::calibrate::*;
    use ficco_core::sim::cost;
    use ficco_core::sim::profile::HwProfile;

    fn base() -> HwProfile {
        HwProfile::builtin("h200-nvlink").unwrap()
    }

    /// The hardware the synthetic data comes from.
    fn truth() -> HwProfile {
        let mut hw = base();
        hw.gemm.sustained_tflops = 650.0;
        hw.gemm.k_overhead = 400.0;
        hw
    }

    fn synthetic_decomposition(hw: &HwProfile) -> Vec<DecompShape> {
        let mut out = vec![];
        for (m, k, n) in [(2048, 8192, 2048), (8192, 2048, 8192), (4096, 4096, 14336)] {
            let whole = cost::gemm_ms(hw, m, k, n, hw.sm_count);
            let mut s = DecompShape {
                m,
                k,
                n,
                whole_ms: whole,
                whole_tflops: 2.0 * (m * k * n) as f64 / whole / 1e9,
                splits: vec![],
            };
            for split in SplitDim::ALL {
                for c in [2, 4, 8, 16] {
                    let (pm, pk, pn) = s.piece(split, c);
                    let t = c as f64 * cost::gemm_ms(hw, pm, pk, pn, hw.sm_count);
                    s.splits.push(DecompSplit {
                        split,
                        chunks: c,
                        time_ms: t,
                        ratio: t / whole,
                    });
                }
            }
            out.push(s);
        }
        out
    }

    /// (traffic, gpus, peers, bw GB/s, latency us) of the synthetic machine.
    const LINES: [(Traffic, usize, usize, f64, f64); 8] = [
        (Traffic::AllGather, 4, 3, 300.0, 30.0),
        (Traffic::ReduceScatter, 4, 3, 280.0, 35.0),
        (Traffic::AllReduce, 4, 3, 330.0, 40.0),
        (Traffic::AllGather, 2, 1, 220.0, 20.0),
        (Traffic::SendRecv, 4, 3, 360.0, 12.0),
        (Traffic::Copy, 4, 1, 380.0, 5.0),
        (Traffic::Copy, 4, 2, 395.0, 6.0),
        (Traffic::Copy, 4, 3, 405.0, 7.0),
    ];

    fn synthetic_curves() -> Vec<CurvePoint> {
        let mut out = vec![];
        for (traffic, gpus, peers, bw, lat) in LINES {
            for mib in [1usize, 4, 16, 64, 256] {
                let bytes = mib << 20;
                let x = match traffic {
                    Traffic::Copy => (bytes * peers) as f64,
                    t => bytes as f64 * t.bus_factor(gpus),
                };
                let t = lat * 1e-3 + x / (bw * 1e6);
                out.push(CurvePoint {
                    traffic,
                    gpus,
                    peers,
                    bytes,
                    time_ms: t,
                    algbw_gbs: bytes as f64 / t / 1e6,
                    busbw_gbs: x / t / 1e6,
                });
            }
        }
        out
    }

    fn point(victim: Victim, traffic: Traffic, slowdown: f64) -> ContentionPoint {
        ContentionPoint {
            victim,
            traffic,
            gpus: 4,
            gemm: [8192, 8192, 8192],
            comm_bytes: 64 << 20,
            alone_ms: 1.0,
            together_ms: slowdown,
            slowdown,
            samples: 20,
        }
    }

    fn synthetic() -> Characterization {
        Characterization {
            device: "4x Synthetic GPU".into(),
            options: CharOptions {
                gpus: 4,
                quick: false,
            },
            sm_count: 132,
            copy_engines: 3,
            decomposition: synthetic_decomposition(&truth()),
            contention: vec![
                point(Victim::Gemm, Traffic::AllGather, 1.25),
                point(Victim::Gemm, Traffic::AllReduce, 1.30),
                point(Victim::Gemm, Traffic::ReduceScatter, 1.20),
                point(Victim::Gemm, Traffic::Copy, 1.04),
                point(Victim::Comm, Traffic::AllGather, 1.15),
                point(Victim::Comm, Traffic::AllReduce, 1.10),
                point(Victim::Comm, Traffic::Copy, 0.98),
            ],
            curves: synthetic_curves(),
            elapsed_s: 1.0,
            fit: None,
        }
    }

    #[test]
    fn linear_fit_recovers_latency_and_bandwidth() {
        let pts: Vec<(f64, f64)> = [1e6, 4e6, 16e6, 64e6, 256e6]
            .iter()
            .map(|&x| (x, 0.025 + x / 300e6))
            .collect();
        let f = fit_linear(&pts).unwrap();
        assert!((f.gbs() - 300.0).abs() < 1e-6, "{f:?}");
        assert!((f.latency_us() - 25.0).abs() < 1e-6, "{f:?}");
        assert!(f.rms_rel_err < 1e-9);
        // A negative intercept is clamped to zero.
        let f = fit_linear(&[(1.0, 0.5), (2.0, 1.5)]).unwrap();
        assert_eq!(f.latency_ms, 0.0);
        assert!(fit_linear(&[(1.0, 1.0)]).is_none());
    }

    #[test]
    fn gemm_fit_recovers_sustained_and_overhead() {
        let samples = gemm_samples(&synthetic_decomposition(&truth()));
        let f = fit_gemm(&base(), &samples).unwrap();
        assert!((f.sustained_tflops - 650.0).abs() < 3.0, "{f:?}");
        assert!((f.k_overhead - 400.0).abs() < 15.0, "{f:?}");
        assert!(f.rms_log_err_fit < 0.01, "{f:?}");
        assert!(f.rms_log_err_fit < f.rms_log_err_base, "{f:?}");
    }

    #[test]
    fn fitted_profile_recovers_parameters_and_round_trips() {
        let mut ch = synthetic();
        let (hw, fit) = fit_profile(&base(), &ch, "synthetic-char");
        hw.check().unwrap();
        assert_eq!(hw.name, "synthetic-char");
        assert!((hw.gemm.sustained_tflops - 650.0).abs() < 3.0);
        let ag4 = hw.collective(Collective::AllGather, 4);
        assert!((ag4.bus_gbs - 300.0).abs() < 0.2, "{ag4:?}");
        assert!((ag4.latency_us - 30.0).abs() < 0.2, "{ag4:?}");
        let ag2 = hw.collective(Collective::AllGather, 2);
        assert!((ag2.bus_gbs - 220.0).abs() < 0.2, "{ag2:?}");
        let ar4 = hw.collective(Collective::AllReduce, 4);
        assert!((ar4.bus_gbs - 330.0).abs() < 0.2 && (ar4.latency_us - 40.0).abs() < 0.2);
        // Not measured at P = 2: kept from the base profile.
        assert_eq!(
            hw.collective(Collective::AllReduce, 2),
            base().collective(Collective::AllReduce, 2)
        );
        assert!((hw.nccl.p2p_bus_gbs - 360.0).abs() < 0.2);
        assert!((hw.nccl.p2p_latency_us - 12.0).abs() < 0.2);
        assert!((hw.copy_engine.bw_gbs - 380.0).abs() < 0.2);
        assert!((hw.copy_engine.latency_us - 5.0).abs() < 0.2);
        assert!((hw.nvlink.usable_gbs - 405.0).abs() < 0.2);
        // Contention: medians; copy slowdown below 1 is clamped to 1.
        assert_eq!(fit.gemm_slowdown_nccl_raw, Some(1.25));
        assert!(hw.contention.gemm_slowdown_nccl >= 1.0);
        assert!(hw.contention.gemm_slowdown_nccl <= 1.25 + 1e-9);
        assert_eq!(hw.contention.gemm_slowdown_copy, 1.04);
        assert_eq!(hw.contention.nccl_slowdown_gemm, 1.125);
        assert_eq!(hw.contention.copy_slowdown_gemm, 1.0);

        ch.fit = Some(fit);
        let text = profile_toml(&hw, &ch).unwrap();
        assert!(text.starts_with("# Hardware profile written by `ficco characterize`"));
        let dir = std::env::temp_dir().join(format!("ficco-char-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("synthetic-char.toml");
        std::fs::write(&path, &text).unwrap();
        let loaded = HwProfile::load(path.to_str().unwrap()).unwrap();
        assert_eq!(loaded, hw);
        std::fs::remove_dir_all(&dir).ok();

        // The JSON reads back (floats to within printing precision).
        let json = serde_json::to_string(&ch).unwrap();
        let back: Characterization = serde_json::from_str(&json).unwrap();
        assert_eq!(back.curves.len(), ch.curves.len());
        assert_eq!(back.decomposition.len(), ch.decomposition.len());
        assert_eq!(back.contention, ch.contention);
        assert!(back.fit.is_some());

        let t = tables(&ch);
        for want in [
            "# Decomposition loss",
            "# Contention loss",
            "# all-gather on 4 GPUs",
            "# copy on 4 GPUs, pull into GPU 0 from 3 peer(s) at once",
            "(GB/s)",
            "# Fitted",
        ] {
            assert!(t.contains(want), "{want}\n{t}");
        }
    }

    /// Probe plans run through the executor, which runs only what the one
    /// validator accepts: structure, NCCL contiguity, matching calls, no
    /// cycle, reads ordered after writes (traffic sources are inputs), no race.
    fn ok(p: &Plan) {
        validate(p).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    }

    #[test]
    fn every_probe_plan_is_valid() {
        for g in [2, 3, 4] {
            for d in SplitDim::ALL {
                for c in [1, 2, 4, 16] {
                    ok(&chunked_gemm(g, (256, 128, 512), d, c));
                }
            }
            for t in Traffic::NCCL.into_iter().chain([Traffic::Copy]) {
                ok(&gemms_beside_traffic(
                    g,
                    (256, 128, 64),
                    3,
                    t,
                    1 << 16,
                    5,
                    true,
                ));
                ok(&gemms_beside_traffic(
                    g,
                    (256, 128, 64),
                    0,
                    t,
                    3 << 16,
                    1,
                    false,
                ));
                ok(&plans::curve_plan(g, t, 3 << 16));
                for gemm_victim in [true, false] {
                    ok(&plans::alone_plan(
                        g,
                        gemm_victim,
                        (256, 128, 64),
                        t,
                        1 << 16,
                    ));
                }
                for v in [Victim::Gemm, Victim::Comm] {
                    let (p, s) = plans::contention_plan(g, v, (256, 128, 64), t, 1 << 16, 1.0, 0.5);
                    ok(&p);
                    assert_eq!(
                        p.ranks[0].tasks.iter().filter(|x| x.stream == s).count(),
                        plans::VICTIMS
                    );
                }
            }
            for peers in 1..g {
                ok(&peer_pulls(g, peers, 1 << 16));
            }
        }
    }

    #[test]
    fn probe_plans_name_what_they_run() {
        let p = gemms_beside_traffic(
            4,
            (4096, 1024, 2048),
            6,
            Traffic::AllReduce,
            64 << 20,
            3,
            true,
        );
        assert_eq!(p.name, "6 gemm 4096x1024x2048 + 3 all-reduce 67108864 B");
        assert_eq!(p.problem.gpus, 4);
        assert_eq!((p.problem.m, p.problem.k, p.problem.n), (4096, 1024, 2048));
        let side = p.problem.side.unwrap();
        assert_eq!(side.gemms, 6);
        assert_eq!(side.collective, Collective::AllReduce);
        assert_eq!(side.bytes, 64 << 20);
        assert_eq!(
            p.problem.label(),
            "concurrent 6x gemm m=4096 k=1024 n=2048 + all-reduce 64 MiB P=4"
        );
        let d = chunked_gemm(3, (512, 256, 128), SplitDim::K, 4);
        assert_eq!(d.name, "decomp 512x256x128 Kx4");
        assert_eq!(d.ranks.len(), 3);
        assert_eq!(d.ranks[0].tasks.len(), 4);
        assert!(d.ranks[1..].iter().all(|r| r.tasks.is_empty()));
        let pull = peer_pulls(4, 3, 1 << 20);
        assert_eq!(pull.problem.side.unwrap().gemms, 0);
        assert_eq!(pull.ranks[0].streams.len(), 3);
    }

    #[test]
    fn decomposition_cuts_divide_evenly() {
        let o = CharOptions {
            gpus: 4,
            quick: false,
        };
        let cuts = plans::decomp_cuts(&o, (2048, 8192, 14336));
        // 14336 / 16 = 896: every N cut fits; every cut divides evenly into at least 16.
        assert_eq!(cuts.len(), 12);
        let cuts = plans::decomp_cuts(&o, (48, 8192, 2048));
        assert!(!cuts.contains(&(SplitDim::M, 4)) && cuts.contains(&(SplitDim::M, 2)));
        assert!(!cuts.contains(&(SplitDim::M, 16)));
    }

    #[test]
    fn victim_durations_drop_each_ranks_first_task() {
        let span = |rank, stream, task, start_ms, end_ms| Span {
            rank,
            stream,
            task,
            label: String::new(),
            kind: "gemm".into(),
            start_ms,
            end_ms,
        };
        let tl = Timeline {
            name: "t".into(),
            spans: vec![
                span(0, 0, 1, 1.0, 3.0),
                span(0, 0, 0, 0.0, 1.0),
                span(0, 0, 2, 3.0, 6.0),
                span(0, 1, 3, 0.0, 9.0),
                span(1, 0, 0, 0.0, 5.0),
            ],
            total_ms: 9.0,
        };
        let mut d = victim_durations(&tl, 0);
        d.sort_by(f64::total_cmp);
        assert_eq!(d, vec![2.0, 3.0, 5.0]);
        assert_eq!(ficco_core::stats::median(&d), Some(3.0));
    }

    #[test]
    fn curve_points_count_every_byte_moved() {
        let p = CurvePoint::measured(Traffic::AllGather, 4, 3, 4_000_000, 0.01);
        assert!((p.algbw_gbs - 400.0).abs() < 1e-9);
        assert!((p.busbw_gbs - 300.0).abs() < 1e-9);
        let c = CurvePoint::measured(Traffic::Copy, 4, 2, 1_000_000, 0.01);
        assert_eq!(c.algbw_gbs, c.busbw_gbs);
        assert!((c.algbw_gbs - 200.0).abs() < 1e-9);
    }
}
