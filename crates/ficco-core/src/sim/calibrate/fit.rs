//! Fitting a hardware profile to a characterization: least-squares lines
//! for the communication curves, a grid search for the GEMM model's
//! sustained rate and per-tile overhead, medians for the contention factors.
//! Pure math; no GPU.

use super::{Characterization, CurvePoint, DecompShape, Traffic, Victim};
use crate::sim::cost;
use crate::sim::profile::{CollectiveParams, Contention, HwProfile};
use crate::stats::median;
use serde::{Deserialize, Serialize};

/// `time = latency + x / bw`, fitted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    /// Intercept, ms.
    pub latency_ms: f64,
    /// Slope, ms per byte.
    pub ms_per_byte: f64,
    /// Root-mean-square relative error of the fit over the points.
    pub rms_rel_err: f64,
    pub points: usize,
}

impl LinearFit {
    pub fn latency_us(&self) -> f64 {
        self.latency_ms * 1e3
    }
    /// GB/s (1e9 bytes per second).
    pub fn gbs(&self) -> f64 {
        1.0 / self.ms_per_byte / 1e6
    }
    pub fn predict_ms(&self, x: f64) -> f64 {
        self.latency_ms + x * self.ms_per_byte
    }
}

/// Least squares of `t = a + b x` weighted by `1 / t^2` (relative errors, so
/// small and large sizes count alike), with `a >= 0`, `b > 0`. `None` with
/// fewer than two points or no positive slope.
pub fn fit_linear(points: &[(f64, f64)]) -> Option<LinearFit> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(x, t)| x.is_finite() && t.is_finite() && *x >= 0.0 && *t > 0.0)
        .collect();
    if pts.len() < 2 {
        return None;
    }
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, t) in &pts {
        let w = 1.0 / (t * t);
        sw += w;
        sx += w * x;
        sy += w * t;
        sxx += w * x * x;
        sxy += w * x * t;
    }
    let det = sw * sxx - sx * sx;
    let (mut a, mut b) = if det.abs() > 0.0 {
        ((sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det)
    } else {
        (0.0, f64::NAN)
    };
    if a.is_nan() || a < 0.0 || !b.is_finite() {
        a = 0.0;
        b = sxy / sxx;
    }
    if !(b.is_finite() && b > 0.0) {
        return None;
    }
    let rms = (pts
        .iter()
        .map(|&(x, t)| ((a + b * x) / t - 1.0).powi(2))
        .sum::<f64>()
        / pts.len() as f64)
        .sqrt();
    Some(LinearFit {
        latency_ms: a,
        ms_per_byte: b,
        rms_rel_err: rms,
        points: pts.len(),
    })
}

/// One timed run of GEMMs: `count` GEMMs of `(m, k, n)` back to back took `time_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GemmSample {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub count: usize,
    pub time_ms: f64,
}

/// The GEMM samples of a decomposition grid (wholes and every cut).
pub fn gemm_samples(shapes: &[DecompShape]) -> Vec<GemmSample> {
    let mut out = vec![];
    for s in shapes {
        out.push(GemmSample {
            m: s.m,
            k: s.k,
            n: s.n,
            count: 1,
            time_ms: s.whole_ms,
        });
        for c in &s.splits {
            let (m, k, n) = s.piece(c.split, c.chunks);
            out.push(GemmSample {
                m,
                k,
                n,
                count: c.chunks,
                time_ms: c.time_ms,
            });
        }
    }
    out.retain(|s| s.time_ms > 0.0 && s.time_ms.is_finite());
    out
}

/// Root-mean-square of log(model / measured) over the samples under `hw`'s GEMM model.
pub fn gemm_rms_log_err(hw: &HwProfile, samples: &[GemmSample]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let sum: f64 = samples
        .iter()
        .map(|s| {
            let model = s.count as f64 * cost::gemm_ms(hw, s.m, s.k, s.n, hw.sm_count);
            (model / s.time_ms).ln().powi(2)
        })
        .sum();
    (sum / samples.len() as f64).sqrt()
}

/// Result of the GEMM fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GemmFit {
    pub sustained_tflops: f64,
    pub k_overhead: f64,
    /// RMS of log(model / measured) with the base profile's parameters.
    pub rms_log_err_base: f64,
    /// The same with the fitted parameters.
    pub rms_log_err_fit: f64,
    pub samples: usize,
}

/// Fits `gemm.sustained_tflops` and `gemm.k_overhead` of [`cost::gemm_cost`]
/// (tile shapes, split-K, launch and HBM roofline kept from `base`) to the
/// samples by a coarse-to-fine grid search on the RMS log error.
pub fn fit_gemm(base: &HwProfile, samples: &[GemmSample]) -> Option<GemmFit> {
    if samples.is_empty() {
        return None;
    }
    let mut hw = base.clone();
    let mut eval = |s: f64, k: f64| {
        hw.gemm.sustained_tflops = s;
        hw.gemm.k_overhead = k;
        gemm_rms_log_err(&hw, samples)
    };
    let peak = base.bf16_peak_tflops.max(base.gemm.sustained_tflops);
    let (mut best_s, mut best_k, mut best) = (
        base.gemm.sustained_tflops,
        base.gemm.k_overhead,
        f64::INFINITY,
    );
    let mut search = |s_lo: f64, s_hi: f64, s_step: f64, k_lo: f64, k_hi: f64, k_step: f64| {
        let mut s = s_lo.max(1.0);
        while s <= s_hi + 1e-9 {
            let mut k = k_lo.max(0.0);
            while k <= k_hi + 1e-9 {
                let e = eval(s, k);
                if e < best {
                    (best_s, best_k, best) = (s, k, e);
                }
                k += k_step;
            }
            s += s_step;
        }
        (best_s, best_k)
    };
    let (s0, k0) = search(0.2 * peak, peak, 10.0, 0.0, 2000.0, 25.0);
    let (s1, k1) = search(s0 - 10.0, s0 + 10.0, 1.0, k0 - 25.0, k0 + 25.0, 2.5);
    let (s2, k2) = search(s1 - 1.0, s1 + 1.0, 0.1, k1 - 2.5, k1 + 2.5, 0.5);
    Some(GemmFit {
        sustained_tflops: s2,
        k_overhead: k2,
        rms_log_err_base: gemm_rms_log_err(base, samples),
        rms_log_err_fit: best,
        samples: samples.len(),
    })
}

/// One fitted line of a communication curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurveFit {
    pub traffic: Traffic,
    pub gpus: usize,
    pub peers: usize,
    /// For collectives: bus bandwidth (x = bus bytes per rank); send/recv:
    /// bytes per rank; copies: aggregate bytes into GPU 0.
    pub bw_gbs: f64,
    pub latency_us: f64,
    pub rms_rel_err: f64,
}

/// What the fit produced, for the JSON and the tables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitSummary {
    pub base: String,
    pub gemm: Option<GemmFit>,
    pub curves: Vec<CurveFit>,
    /// Raw medians of the contention measurements (time multipliers).
    pub gemm_slowdown_nccl_raw: Option<f64>,
    pub gemm_slowdown_copy_raw: Option<f64>,
    pub nccl_slowdown_gemm_raw: Option<f64>,
    pub copy_slowdown_gemm_raw: Option<f64>,
    /// What the profile got (gemm_slowdown_nccl net of the `nccl_sms` SMs the
    /// simulator already takes away from the GEMM; all clamped to >= 1).
    pub contention: Contention,
}

/// Fits one curve: x is bus bytes per rank (collectives) or bytes moved.
pub fn fit_curve(points: &[&CurvePoint]) -> Option<CurveFit> {
    let first = points.first()?;
    let xs: Vec<(f64, f64)> = points
        .iter()
        .map(|p| {
            let x = match p.traffic {
                Traffic::Copy => (p.bytes * p.peers) as f64,
                t => p.bytes as f64 * t.bus_factor(p.gpus),
            };
            (x, p.time_ms)
        })
        .collect();
    let f = fit_linear(&xs)?;
    Some(CurveFit {
        traffic: first.traffic,
        gpus: first.gpus,
        peers: first.peers,
        bw_gbs: f.gbs(),
        latency_us: f.latency_us(),
        rms_rel_err: f.rms_rel_err,
    })
}

/// Fits every (traffic, gpus, peers) curve.
pub fn fit_curves(curves: &[CurvePoint]) -> Vec<CurveFit> {
    let mut keys: Vec<(Traffic, usize, usize)> = vec![];
    for p in curves {
        let k = (p.traffic, p.gpus, p.peers);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .filter_map(|(t, g, pe)| {
            let pts: Vec<&CurvePoint> = curves
                .iter()
                .filter(|p| p.traffic == t && p.gpus == g && p.peers == pe)
                .collect();
            fit_curve(&pts)
        })
        .collect()
}

/// Starts from `base` and overwrites every parameter the measurements
/// determine: GEMM sustained TFLOP/s and per-tile overhead, NCCL per-(collective,
/// P) bus bandwidth and latency, send/recv, copy engine, usable NVLink
/// bandwidth (the best aggregate copy ingress) and the contention factors.
pub fn fit_profile(base: &HwProfile, ch: &Characterization, name: &str) -> (HwProfile, FitSummary) {
    let mut hw = base.clone();
    hw.name = name.to_string();
    hw.description = format!(
        "measured by `ficco characterize{}` on {} (fitted over the built-in '{}')",
        if ch.options.quick { " --quick" } else { "" },
        ch.device,
        base.name
    );
    if ch.sm_count > hw.nccl_sms {
        hw.sm_count = ch.sm_count;
    }
    if ch.copy_engines > 0 {
        hw.copy_engine.count = ch.copy_engines;
    }
    let gemm = fit_gemm(base, &gemm_samples(&ch.decomposition));
    if let Some(g) = gemm {
        if g.rms_log_err_fit <= g.rms_log_err_base {
            hw.gemm.sustained_tflops = round(g.sustained_tflops, 1);
            hw.gemm.k_overhead = round(g.k_overhead, 1);
        }
    }
    let curves = fit_curves(&ch.curves);
    for f in &curves {
        if !(f.bw_gbs.is_finite() && f.bw_gbs > 0.0) {
            continue;
        }
        match f.traffic.collective() {
            Some(kind) => {
                let entry = CollectiveParams {
                    kind,
                    gpus: f.gpus,
                    bus_gbs: round(f.bw_gbs, 1),
                    latency_us: round(f.latency_us, 1),
                };
                match hw
                    .nccl
                    .collective
                    .iter_mut()
                    .find(|p| p.kind == kind && p.gpus == f.gpus)
                {
                    Some(p) => *p = entry,
                    None => hw.nccl.collective.push(entry),
                }
            }
            None if f.traffic == Traffic::SendRecv && f.gpus == ch.options.gpus => {
                hw.nccl.p2p_bus_gbs = round(f.bw_gbs, 1);
                hw.nccl.p2p_latency_us = round(f.latency_us, 1);
            }
            None if f.traffic == Traffic::Copy && f.peers == 1 => {
                hw.copy_engine.bw_gbs = round(f.bw_gbs, 1);
                hw.copy_engine.latency_us = round(f.latency_us, 1);
            }
            None => {}
        }
    }
    hw.nccl
        .collective
        .sort_by_key(|p| (p.kind as usize, p.gpus));
    // Usable NVLink ingress: the best aggregate of concurrent pulls.
    let usable = curves
        .iter()
        .filter(|f| f.traffic == Traffic::Copy)
        .map(|f| f.bw_gbs)
        .fold(0.0, f64::max);
    if usable > 0.0 {
        hw.nvlink.usable_gbs = round(usable, 1);
    }

    let raw = |victim: Victim, nccl: bool| {
        let v: Vec<f64> = ch
            .contention
            .iter()
            .filter(|c| c.victim == victim && (c.traffic != Traffic::Copy) == nccl)
            .map(|c| c.slowdown)
            .collect();
        median(&v)
    };
    // The simulator runs a GEMM beside NCCL on sm_count - nccl_sms SMs and
    // then applies gemm_slowdown_nccl: take the SM loss out of the measured ratio.
    let net: Vec<f64> = ch
        .contention
        .iter()
        .filter(|c| c.victim == Victim::Gemm && c.traffic != Traffic::Copy)
        .map(|c| {
            let [m, k, n] = c.gemm;
            let full = cost::gemm_ms(&hw, m, k, n, hw.sm_count);
            let less = cost::gemm_ms(&hw, m, k, n, hw.sm_count - hw.nccl_sms);
            c.slowdown * full / less
        })
        .collect();
    let at_least_1 = |v: Option<f64>, dflt: f64| round(v.unwrap_or(dflt).max(1.0), 3);
    let contention = Contention {
        gemm_slowdown_nccl: at_least_1(median(&net), hw.contention.gemm_slowdown_nccl),
        gemm_slowdown_copy: at_least_1(raw(Victim::Gemm, false), hw.contention.gemm_slowdown_copy),
        nccl_slowdown_gemm: at_least_1(raw(Victim::Comm, true), hw.contention.nccl_slowdown_gemm),
        copy_slowdown_gemm: at_least_1(raw(Victim::Comm, false), hw.contention.copy_slowdown_gemm),
        // Not characterized here: keep the base profile's (fitted on measured schedules).
        gemm_slowdown_gemm: hw.contention.gemm_slowdown_gemm,
    };
    hw.contention = contention.clone();
    let summary = FitSummary {
        base: base.name.clone(),
        gemm,
        curves,
        gemm_slowdown_nccl_raw: raw(Victim::Gemm, true),
        gemm_slowdown_copy_raw: raw(Victim::Gemm, false),
        nccl_slowdown_gemm_raw: raw(Victim::Comm, true),
        copy_slowdown_gemm_raw: raw(Victim::Comm, false),
        contention,
    };
    (hw, summary)
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}
