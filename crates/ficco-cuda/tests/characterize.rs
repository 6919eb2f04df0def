//! The characterization's fitting, on synthetic measurements (no GPU needed):
//! fits recover known parameters and the written profile loads back.

use ficco_core::problem::workload::Collective;
use ficco_core::sim::cost;
use ficco_core::sim::profile::HwProfile;
use ficco_cuda::characterize::*;

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
