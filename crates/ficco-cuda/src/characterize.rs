//! `ficco characterize`: measures what the cost model needs on the machine at
//! hand and fits a hardware profile to it.
//!
//! Three families of measurements, all as small [`Plan`]s run by [`GpuBackend`]:
//!
//! - **Decomposition loss**: a GEMM cut into `c` pieces along M, N or K, the
//!   pieces run back to back on one stream of GPU 0 (the other GPUs idle), as
//!   a ratio to the whole GEMM. A K split yields partial products that would
//!   still need a sum; only the pieces are timed (every piece overwrites the
//!   same output).
//! - **Contention loss**: GEMMs on one stream while NCCL collectives or
//!   copy-engine pulls run on a second stream of every GPU, and the reverse.
//!   The victim runs several tasks while the other stream is kept busy for
//!   longer than the victim's whole run; the victim's per-task durations come
//!   from the measured timeline (first task of each rank dropped, median of
//!   the rest) and are divided by the same median with the victim alone.
//! - **Communication curves**: time vs size of NCCL all-gather, reduce-scatter,
//!   all-reduce and ring send/recv for every GPU count 2..=P, and copy-engine
//!   pulls into GPU 0 from 1..P-1 peers at once (one stream per peer).
//!
//! The fitting ([`fit_linear`], [`fit_gemm`], [`fit_profile`]) is pure math
//! and runs without a GPU.

use crate::backend::GpuBackend;
use crate::error::{CudaError, Result};
use ficco_core::plan::{
    Buffer, BufferRole, NcclOp, Plan, RankPlan, RankView, StreamRole, StreamSpec, Task, TaskId,
    TaskKind, View,
};
use ficco_core::problem::workload::{Collective, Op, Problem, ELEM_BYTES};
use ficco_core::run::timeline::Timeline;
use ficco_core::sim::cost;
use ficco_core::sim::profile::{CollectiveParams, Contention, HwProfile};
use ficco_core::space::Priority;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Write as _;

const MIB: usize = 1 << 20;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CharOptions {
    /// Largest GPU count (curves are taken for every count 2..=gpus).
    pub gpus: usize,
    /// Smaller grids and fewer iterations (about a third of the time).
    pub quick: bool,
}

impl CharOptions {
    /// GEMM shapes (m, k, n) of the decomposition grid.
    pub fn decomp_shapes(&self) -> Vec<(usize, usize, usize)> {
        let (ms, ks, ns): (&[usize], &[usize], &[usize]) = if self.quick {
            (&[2048, 8192], &[8192], &[2048, 8192])
        } else {
            (&[2048, 8192, 16384], &[2048, 8192], &[2048, 8192, 14336])
        };
        let mut out = vec![];
        for &m in ms {
            for &k in ks {
                for &n in ns {
                    out.push((m, k, n));
                }
            }
        }
        out
    }

    /// Piece counts c > 1 of the decomposition grid.
    pub fn decomp_chunks(&self) -> &'static [usize] {
        if self.quick {
            &[2, 4, 8]
        } else {
            &[2, 4, 8, 16]
        }
    }

    /// NCCL "sizes" (nccl-tests convention) and per-peer copy sizes, bytes.
    pub fn curve_sizes(&self) -> Vec<usize> {
        if self.quick {
            vec![MIB, 16 * MIB, 256 * MIB]
        } else {
            vec![
                MIB / 4,
                MIB,
                4 * MIB,
                16 * MIB,
                64 * MIB,
                256 * MIB,
                512 * MIB,
            ]
        }
    }

    /// GEMM shapes of the contention measurements.
    pub fn contention_gemms(&self) -> Vec<(usize, usize, usize)> {
        if self.quick {
            vec![(8192, 8192, 8192)]
        } else {
            vec![(4096, 4096, 4096), (8192, 8192, 8192)]
        }
    }

    /// Communication sizes of the contention measurements, bytes.
    pub fn contention_sizes(&self) -> Vec<usize> {
        if self.quick {
            vec![64 * MIB]
        } else {
            vec![16 * MIB, 128 * MIB]
        }
    }
}

/// A kind of traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Traffic {
    AllGather,
    ReduceScatter,
    AllReduce,
    /// Grouped NCCL send/recv, ring: each rank sends to r+1 and receives from r-1.
    SendRecv,
    /// Copy-engine peer copies (`cuMemcpyPeerAsync`), pulled by the receiver.
    Copy,
}

impl Traffic {
    pub const NCCL: [Traffic; 4] = [
        Traffic::AllGather,
        Traffic::ReduceScatter,
        Traffic::AllReduce,
        Traffic::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Traffic::AllGather => "all-gather",
            Traffic::ReduceScatter => "reduce-scatter",
            Traffic::AllReduce => "all-reduce",
            Traffic::SendRecv => "send-recv",
            Traffic::Copy => "copy",
        }
    }

    pub fn collective(self) -> Option<Collective> {
        match self {
            Traffic::AllGather => Some(Collective::AllGather),
            Traffic::ReduceScatter => Some(Collective::ReduceScatter),
            Traffic::AllReduce => Some(Collective::AllReduce),
            _ => None,
        }
    }

    /// nccl-tests' bus bandwidth factor over the algorithm bandwidth.
    pub fn bus_factor(self, gpus: usize) -> f64 {
        let f = (gpus - 1) as f64 / gpus as f64;
        match self {
            Traffic::AllGather | Traffic::ReduceScatter => f,
            Traffic::AllReduce => 2.0 * f,
            Traffic::SendRecv | Traffic::Copy => 1.0,
        }
    }
}

/// The dimension a GEMM is cut along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitDim {
    M,
    N,
    /// Partial products over K slices; the sum they would need is not timed.
    K,
}

impl SplitDim {
    pub const ALL: [SplitDim; 3] = [SplitDim::M, SplitDim::N, SplitDim::K];
    pub fn name(self) -> &'static str {
        match self {
            SplitDim::M => "M",
            SplitDim::N => "N",
            SplitDim::K => "K",
        }
    }
}

/// One cut of a GEMM: `chunks` pieces along `split`, run back to back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecompSplit {
    pub split: SplitDim,
    pub chunks: usize,
    /// All pieces, ms (median).
    pub time_ms: f64,
    /// time_ms / whole_ms.
    pub ratio: f64,
}

/// One GEMM shape of the decomposition grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecompShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// The whole GEMM, ms (median).
    pub whole_ms: f64,
    pub whole_tflops: f64,
    pub splits: Vec<DecompSplit>,
}

impl DecompShape {
    /// Shape of one piece of a cut.
    pub fn piece(&self, split: SplitDim, chunks: usize) -> (usize, usize, usize) {
        match split {
            SplitDim::M => (self.m / chunks, self.k, self.n),
            SplitDim::N => (self.m, self.k, self.n / chunks),
            SplitDim::K => (self.m, self.k / chunks, self.n),
        }
    }
}

/// Which side suffers in a contention measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Victim {
    /// GEMM slowdown while `traffic` runs beside it.
    Gemm,
    /// `traffic` slowdown while GEMMs run beside it.
    Comm,
}

/// One contention measurement on all `gpus` GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentionPoint {
    pub victim: Victim,
    pub traffic: Traffic,
    pub gpus: usize,
    /// GEMM shape [m, k, n] on every rank.
    pub gemm: [usize; 3],
    /// NCCL size (nccl-tests convention) or bytes per copy.
    pub comm_bytes: usize,
    /// Median victim task alone, ms.
    pub alone_ms: f64,
    /// Median victim task with the other stream busy, ms.
    pub together_ms: f64,
    /// together / alone.
    pub slowdown: f64,
    /// Victim tasks the median is over.
    pub samples: usize,
}

/// One point of a communication curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    pub traffic: Traffic,
    /// Ranks of the communicator (copies: GPUs opened).
    pub gpus: usize,
    /// Copies: peers pulled from at once into GPU 0 (NCCL: gpus - 1).
    pub peers: usize,
    /// NCCL size (nccl-tests: gathered bytes for all-gather, input bytes for
    /// reduce-scatter, buffer bytes for all-reduce), bytes each rank sends for
    /// send/recv, bytes per peer for copies.
    pub bytes: usize,
    pub time_ms: f64,
    /// bytes (x peers for copies) / time, GB/s.
    pub algbw_gbs: f64,
    /// nccl-tests bus bandwidth, GB/s (copies and send/recv: = algbw).
    pub busbw_gbs: f64,
}

/// Everything one run measured, and what was fitted to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Characterization {
    pub device: String,
    pub options: CharOptions,
    pub sm_count: usize,
    pub copy_engines: usize,
    pub decomposition: Vec<DecompShape>,
    pub contention: Vec<ContentionPoint>,
    pub curves: Vec<CurvePoint>,
    /// Wall time of the measurements, s.
    pub elapsed_s: f64,
    #[serde(default)]
    pub fit: Option<FitSummary>,
}

// ---------------------------------------------------------------- fitting

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

/// Median of a list (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
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
        (!v.is_empty()).then(|| median(&v))
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
        gemm_slowdown_nccl: at_least_1(
            (!net.is_empty()).then(|| median(&net)),
            hw.contention.gemm_slowdown_nccl,
        ),
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

/// The profile as TOML that [`HwProfile::load`] reads back, with a comment header.
pub fn profile_toml(hw: &HwProfile, ch: &Characterization) -> std::result::Result<String, String> {
    let body = toml::to_string(hw).map_err(|e| e.to_string())?;
    let mut head = String::new();
    let _ = writeln!(
        head,
        "# Hardware profile written by `ficco characterize` on {} ({:.0} s of measurements).",
        ch.device, ch.elapsed_s
    );
    if let Some(f) = &ch.fit {
        let _ = writeln!(
            head,
            "# Fitted over the built-in '{}'; fields not measured keep its values.",
            f.base
        );
        if let Some(g) = &f.gemm {
            let _ = writeln!(
                head,
                "# GEMM fit over {} samples: RMS log error {:.3} (base profile {:.3}).",
                g.samples, g.rms_log_err_fit, g.rms_log_err_base
            );
        }
        let _ = writeln!(
            head,
            "# gemm_slowdown_nccl excludes the nccl_sms SMs the simulator takes away (raw median {}).",
            f.gemm_slowdown_nccl_raw
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(head + &body)
}

// ---------------------------------------------------------------- tables

/// nccl-tests-like text tables of everything measured.
pub fn tables(ch: &Characterization) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# ficco characterize on {}{} ({:.1} s)",
        ch.device,
        if ch.options.quick { ", quick" } else { "" },
        ch.elapsed_s
    );
    let _ = writeln!(t, "#\n# Decomposition loss: c pieces back to back on GPU 0, time / whole GEMM (K: partial products only, their sum not timed)");
    let chunks: Vec<usize> = {
        let mut c: Vec<usize> = ch
            .decomposition
            .iter()
            .flat_map(|s| s.splits.iter().map(|x| x.chunks))
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let mut h = format!(
        "# {:>6} {:>6} {:>6} {:>5} {:>9} {:>7}",
        "M", "K", "N", "split", "whole", "TFLOP/s"
    );
    for c in &chunks {
        h += &format!(" {:>6}", format!("c={c}"));
    }
    let _ = writeln!(t, "{h}");
    let mut u = format!(
        "# {:>6} {:>6} {:>6} {:>5} {:>9} {:>7}",
        "", "", "", "", "(ms)", ""
    );
    for _ in &chunks {
        u += &format!(" {:>6}", "(x)");
    }
    let _ = writeln!(t, "{u}");
    for s in &ch.decomposition {
        for d in SplitDim::ALL {
            let mut line = format!(
                "  {:>6} {:>6} {:>6} {:>5} {:>9.4} {:>7.0}",
                s.m,
                s.k,
                s.n,
                d.name(),
                s.whole_ms,
                s.whole_tflops
            );
            for c in &chunks {
                match s.splits.iter().find(|x| x.split == d && x.chunks == *c) {
                    Some(x) => line += &format!(" {:>6.3}", x.ratio),
                    None => line += &format!(" {:>6}", "-"),
                }
            }
            let _ = writeln!(t, "{line}");
        }
    }
    let _ = writeln!(
        t,
        "#\n# Contention loss: median victim task beside the other stream / alone"
    );
    let _ = writeln!(
        t,
        "# {:>6} {:>15} {:>4} {:>17} {:>10} {:>9} {:>9} {:>8}",
        "victim", "traffic", "P", "gemm MxKxN", "comm", "alone", "beside", "slowdown"
    );
    let _ = writeln!(
        t,
        "# {:>6} {:>15} {:>4} {:>17} {:>10} {:>9} {:>9} {:>8}",
        "", "", "", "", "(B)", "(ms)", "(ms)", "(x)"
    );
    for c in &ch.contention {
        let _ = writeln!(
            t,
            "  {:>6} {:>15} {:>4} {:>17} {:>10} {:>9.4} {:>9.4} {:>8.3}",
            match c.victim {
                Victim::Gemm => "gemm",
                Victim::Comm => "comm",
            },
            c.traffic.name(),
            c.gpus,
            format!("{}x{}x{}", c.gemm[0], c.gemm[1], c.gemm[2]),
            c.comm_bytes,
            c.alone_ms,
            c.together_ms,
            c.slowdown
        );
    }
    let mut keys: Vec<(Traffic, usize, usize)> = vec![];
    for p in &ch.curves {
        if !keys.contains(&(p.traffic, p.gpus, p.peers)) {
            keys.push((p.traffic, p.gpus, p.peers));
        }
    }
    for (tr, g, pe) in keys {
        let _ = writeln!(
            t,
            "#\n# {} on {} GPUs{}",
            tr.name(),
            g,
            if tr == Traffic::Copy {
                format!(", pull into GPU 0 from {pe} peer(s) at once")
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            t,
            "# {:>12} {:>10} {:>9} {:>9}",
            "size", "time", "algbw", "busbw"
        );
        let _ = writeln!(
            t,
            "# {:>12} {:>10} {:>9} {:>9}",
            "(B)", "(us)", "(GB/s)", "(GB/s)"
        );
        for p in ch
            .curves
            .iter()
            .filter(|p| p.traffic == tr && p.gpus == g && p.peers == pe)
        {
            let _ = writeln!(
                t,
                "  {:>12} {:>10.1} {:>9.1} {:>9.1}",
                p.bytes,
                p.time_ms * 1e3,
                p.algbw_gbs,
                p.busbw_gbs
            );
        }
    }
    if let Some(f) = &ch.fit {
        let _ = writeln!(
            t,
            "#\n# Fitted (time = latency + bytes / bw; collectives on bus bytes)"
        );
        let _ = writeln!(
            t,
            "# {:>15} {:>4} {:>5} {:>9} {:>9} {:>8}",
            "traffic", "P", "peers", "bw", "latency", "rms err"
        );
        let _ = writeln!(
            t,
            "# {:>15} {:>4} {:>5} {:>9} {:>9} {:>8}",
            "", "", "", "(GB/s)", "(us)", "(rel)"
        );
        for c in &f.curves {
            let _ = writeln!(
                t,
                "  {:>15} {:>4} {:>5} {:>9.1} {:>9.1} {:>8.3}",
                c.traffic.name(),
                c.gpus,
                c.peers,
                c.bw_gbs,
                c.latency_us,
                c.rms_rel_err
            );
        }
        if let Some(g) = &f.gemm {
            let _ = writeln!(
                t,
                "# GEMM: sustained {:.1} TFLOP/s, k_overhead {:.1} (RMS log error {:.3}; base profile {:.3}; {} samples)",
                g.sustained_tflops, g.k_overhead, g.rms_log_err_fit, g.rms_log_err_base, g.samples
            );
        }
        let c = &f.contention;
        let _ = writeln!(
            t,
            "# contention: gemm_slowdown_nccl {:.3} (raw {}), gemm_slowdown_copy {:.3}, nccl_slowdown_gemm {:.3}, copy_slowdown_gemm {:.3}",
            c.gemm_slowdown_nccl,
            f.gemm_slowdown_nccl_raw.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into()),
            c.gemm_slowdown_copy,
            c.nccl_slowdown_gemm,
            c.copy_slowdown_gemm
        );
    }
    t
}

// ---------------------------------------------------------------- plans

fn buffer(name: &str, role: BufferRole, rows: usize, cols: usize, peer_visible: bool) -> Buffer {
    Buffer {
        name: name.into(),
        role,
        rows,
        cols,
        peer_visible,
    }
}

fn stream(name: &str, role: StreamRole) -> StreamSpec {
    StreamSpec {
        name: name.into(),
        role,
        priority: Priority::Normal,
    }
}

fn problem(m: usize, k: usize, n: usize, gpus: usize) -> Problem {
    Problem {
        side: None,
        op: Op::GemmAr,
        m,
        k,
        n,
        gpus,
    }
}

fn plan(name: String, prob: Problem, ranks: Vec<RankPlan>) -> Plan {
    Plan {
        problem: prob,
        name,
        schedule: None,
        resources: Default::default(),
        ranks,
    }
}

fn empty_rank() -> RankPlan {
    RankPlan {
        buffers: vec![],
        streams: vec![],
        tasks: vec![],
    }
}

/// GEMM `m x k x n` cut into `chunks` pieces along `split` (chunks = 1: whole),
/// on GPU 0 of `gpus`, one stream.
pub fn decomp_plan(
    gpus: usize,
    (m, k, n): (usize, usize, usize),
    split: SplitDim,
    chunks: usize,
) -> Plan {
    let c = chunks.max(1);
    let mut tasks = vec![];
    for i in 0..c {
        let (a, b, out) = match split {
            SplitDim::M => {
                let r = m / c;
                (
                    View::whole(0, m, k).rows(i * r, r),
                    View::whole(1, k, n),
                    View::whole(2, m, n).rows(i * r, r),
                )
            }
            SplitDim::N => {
                let w = n / c;
                (
                    View::whole(0, m, k),
                    View {
                        buf: 1,
                        row: 0,
                        col: i * w,
                        rows: k,
                        cols: w,
                    },
                    View {
                        buf: 2,
                        row: 0,
                        col: i * w,
                        rows: m,
                        cols: w,
                    },
                )
            }
            SplitDim::K => {
                let d = k / c;
                (
                    View {
                        buf: 0,
                        row: 0,
                        col: i * d,
                        rows: m,
                        cols: d,
                    },
                    View::whole(1, k, n).rows(i * d, d),
                    View::whole(2, m, n),
                )
            }
        };
        tasks.push(Task {
            label: format!("gemm {}{i}", split.name()),
            stream: 0,
            kind: TaskKind::Gemm {
                a,
                b,
                c: out,
                sm_target: None,
                accumulate: false,
                occupancy: None,
            },
            deps: vec![],
        });
    }
    let r0 = RankPlan {
        buffers: vec![
            buffer("a", BufferRole::InputA, m, k, false),
            buffer("b", BufferRole::InputB, k, n, false),
            buffer("c", BufferRole::Output, m, n, false),
        ],
        streams: vec![stream("compute", StreamRole::Compute)],
        tasks,
    };
    let mut ranks = vec![r0];
    ranks.extend((1..gpus).map(|_| empty_rank()));
    plan(
        format!("decomp {m}x{k}x{n} {}x{c}", split.name()),
        problem(m, k, n, gpus),
        ranks,
    )
}

/// Elements per rank and in total for a traffic of NCCL size `bytes` on `gpus`.
fn comm_elems(traffic: Traffic, bytes: usize, gpus: usize) -> (usize, usize) {
    let e = (bytes / ELEM_BYTES).max(gpus);
    match traffic {
        Traffic::AllGather | Traffic::ReduceScatter => {
            let per = e / gpus;
            (per, per * gpus)
        }
        _ => (e, e),
    }
}

/// The NCCL size a plan of `comm_elems` really moves, bytes.
pub fn actual_bytes(traffic: Traffic, bytes: usize, gpus: usize) -> usize {
    comm_elems(traffic, bytes, gpus).1 * ELEM_BYTES
}

/// Every rank: `n_gemm` GEMMs `m x k x n` on stream 0 and `n_comm` transfers
/// of `traffic` (NCCL size or per-copy bytes `bytes`) on stream 1; the tasks
/// of the stream listed first (`comm_first`) are issued first. Copies: rank r
/// pulls from rank r+1.
pub fn mixed_plan(
    gpus: usize,
    gemm: (usize, usize, usize),
    n_gemm: usize,
    traffic: Traffic,
    bytes: usize,
    n_comm: usize,
    comm_first: bool,
) -> Plan {
    let (m, k, n) = gemm;
    let (per, total) = comm_elems(traffic, bytes, gpus);
    let (send_e, recv_e) = match traffic {
        Traffic::AllGather => (per, total),
        Traffic::ReduceScatter => (total, per),
        _ => (total, total),
    };
    let peer = traffic == Traffic::Copy;
    let ranks = (0..gpus)
        .map(|r| {
            let mut buffers = vec![];
            let mut streams = vec![];
            let mut gemm_tasks = vec![];
            let mut comm_tasks = vec![];
            if n_gemm > 0 {
                buffers.push(buffer("a", BufferRole::InputA, m, k, false));
                buffers.push(buffer("b", BufferRole::InputB, k, n, false));
                buffers.push(buffer("c", BufferRole::Output, m, n, false));
                streams.push(stream("compute", StreamRole::Compute));
                for i in 0..n_gemm {
                    gemm_tasks.push(Task {
                        label: format!("gemm {i}"),
                        stream: 0,
                        kind: TaskKind::Gemm {
                            a: View::whole(0, m, k),
                            b: View::whole(1, k, n),
                            c: View::whole(2, m, n),
                            sm_target: None,
                            accumulate: false,
                            occupancy: None,
                        },
                        deps: vec![],
                    });
                }
            }
            if n_comm > 0 {
                let sb = buffers.len();
                buffers.push(buffer("send", BufferRole::Scratch, 1, send_e, peer));
                buffers.push(buffer("recv", BufferRole::Scratch, 1, recv_e, peer));
                let s = streams.len();
                streams.push(stream("comm", StreamRole::Comm));
                let send = View::whole(sb, 1, send_e);
                let recv = View::whole(sb + 1, 1, recv_e);
                for i in 0..n_comm {
                    let kind = match traffic {
                        Traffic::AllGather => TaskKind::Nccl {
                            group: i,
                            op: NcclOp::AllGather { send, recv },
                        },
                        Traffic::ReduceScatter => TaskKind::Nccl {
                            group: i,
                            op: NcclOp::ReduceScatter { send, recv },
                        },
                        Traffic::AllReduce => TaskKind::Nccl {
                            group: i,
                            op: NcclOp::AllReduce { send, recv },
                        },
                        Traffic::SendRecv => TaskKind::Nccl {
                            group: i,
                            op: NcclOp::SendRecv {
                                sends: vec![((r + 1) % gpus, send)],
                                recvs: vec![((r + gpus - 1) % gpus, recv)],
                            },
                        },
                        Traffic::Copy => TaskKind::Copy {
                            // Same layout on every rank: the peer's "send" is buffer sb too.
                            src: RankView {
                                rank: (r + 1) % gpus,
                                view: send,
                            },
                            dst: RankView {
                                rank: r,
                                view: recv,
                            },
                        },
                    };
                    comm_tasks.push(Task {
                        label: format!("{} {i}", traffic.name()),
                        stream: s,
                        kind,
                        deps: vec![],
                    });
                }
            }
            let tasks = if comm_first {
                comm_tasks.into_iter().chain(gemm_tasks).collect()
            } else {
                gemm_tasks.into_iter().chain(comm_tasks).collect()
            };
            RankPlan {
                buffers,
                streams,
                tasks,
            }
        })
        .collect();
    plan(
        format!(
            "{n_gemm} gemm {m}x{k}x{n} + {n_comm} {} {bytes} B",
            traffic.name()
        ),
        problem(m.max(gpus), k, n, gpus),
        ranks,
    )
}

/// GPU 0 pulls `bytes` from each of GPUs 1..=peers at once (one stream per peer).
pub fn pull_plan(gpus: usize, peers: usize, bytes: usize) -> Plan {
    let e = (bytes / ELEM_BYTES).max(1);
    let peers = peers.clamp(1, gpus - 1);
    let mut ranks = vec![];
    let mut r0 = empty_rank();
    for j in 1..=peers {
        r0.buffers
            .push(buffer(&format!("dst{j}"), BufferRole::Scratch, 1, e, true));
        r0.streams
            .push(stream(&format!("pull{j}"), StreamRole::Comm));
        r0.tasks.push(Task {
            label: format!("pull from {j}"),
            stream: j - 1,
            kind: TaskKind::Copy {
                src: RankView {
                    rank: j,
                    view: View::whole(0, 1, e),
                },
                dst: RankView {
                    rank: 0,
                    view: View::whole(j - 1, 1, e),
                },
            },
            deps: Vec::<TaskId>::new(),
        });
    }
    ranks.push(r0);
    for j in 1..gpus {
        let mut rp = empty_rank();
        if j <= peers {
            rp.buffers
                .push(buffer("src", BufferRole::Scratch, 1, e, true));
        }
        ranks.push(rp);
    }
    plan(
        format!("pull {bytes} B from {peers} peers"),
        problem(gpus, 1, 1, gpus),
        ranks,
    )
}

// ---------------------------------------------------------------- running

/// One unit of work (one progress step).
#[derive(Debug, Clone, PartialEq)]
enum Job {
    Decomp {
        shape: (usize, usize, usize),
    },
    Contention {
        gemm: (usize, usize, usize),
        traffic: Traffic,
        bytes: usize,
    },
    Curve {
        gpus: usize,
        traffic: Traffic,
    },
    Pull {
        peers: usize,
    },
}

impl Job {
    fn gpus(&self, top: usize) -> usize {
        match self {
            Job::Curve { gpus, .. } => *gpus,
            _ => top,
        }
    }
    fn label(&self) -> String {
        match self {
            Job::Decomp { shape: (m, k, n) } => format!("decomposition {m}x{k}x{n}"),
            Job::Contention {
                gemm: (m, k, n),
                traffic,
                bytes,
            } => format!(
                "contention {m}x{k}x{n} / {} {} MiB",
                traffic.name(),
                bytes / MIB
            ),
            Job::Curve { gpus, traffic } => format!("{} on {gpus} GPUs", traffic.name()),
            Job::Pull { peers } => format!("copy pull from {peers} peer(s)"),
        }
    }
}

fn jobs(o: &CharOptions) -> Vec<Job> {
    let mut out: Vec<Job> = o
        .decomp_shapes()
        .into_iter()
        .map(|shape| Job::Decomp { shape })
        .collect();
    if o.gpus >= 2 {
        for gemm in o.contention_gemms() {
            for bytes in o.contention_sizes() {
                for traffic in [
                    Traffic::AllGather,
                    Traffic::ReduceScatter,
                    Traffic::AllReduce,
                    Traffic::Copy,
                ] {
                    out.push(Job::Contention {
                        gemm,
                        traffic,
                        bytes,
                    });
                }
            }
        }
        for peers in 1..o.gpus {
            out.push(Job::Pull { peers });
        }
        for gpus in (2..=o.gpus).rev() {
            for traffic in Traffic::NCCL {
                out.push(Job::Curve { gpus, traffic });
            }
        }
    }
    out
}

/// Number of progress steps [`characterize`] reports.
pub fn steps(o: &CharOptions) -> usize {
    jobs(o).len()
}

/// Durations of the tasks on `stream` of every rank, dropping each rank's first.
fn victim_durations(tl: &Timeline, stream: usize) -> Vec<f64> {
    let mut by_rank: HashMap<usize, Vec<(usize, f64)>> = HashMap::new();
    for s in tl.spans.iter().filter(|s| s.stream == stream) {
        by_rank
            .entry(s.rank)
            .or_default()
            .push((s.task, s.end_ms - s.start_ms));
    }
    let mut out = vec![];
    for (_, mut v) in by_rank {
        v.sort_by_key(|x| x.0);
        let skip = usize::from(v.len() > 1);
        out.extend(v.into_iter().skip(skip).map(|x| x.1));
    }
    out
}

/// (victim is the GEMM, GEMM shape, traffic, bytes).
type AloneKey = (bool, (usize, usize, usize), Traffic, usize);

struct Runner<'a> {
    o: &'a CharOptions,
    be: GpuBackend,
    /// (victim is gemm, gemm, traffic, bytes) -> per-task alone ms.
    alone: HashMap<AloneKey, f64>,
}

impl Runner<'_> {
    fn iters(&mut self, warmup: usize, iters: usize) {
        self.be.config.warmup = warmup;
        self.be.config.iters = iters;
    }

    fn time(&mut self, p: &Plan) -> Result<f64> {
        Ok(self.be.measure_plan(p, false, false)?.time_ms)
    }

    fn victim_ms(&mut self, p: &Plan, stream: usize) -> Result<(f64, usize)> {
        let m = self.be.measure_plan(p, false, true)?;
        let tl = m
            .timeline
            .ok_or_else(|| CudaError::Plan("no timeline measured".into()))?;
        let d = victim_durations(&tl, stream);
        Ok((median(&d), d.len()))
    }

    fn decomp(&mut self, shape: (usize, usize, usize)) -> Result<DecompShape> {
        let g = self.be.gpus();
        if self.o.quick {
            self.iters(2, 6);
        } else {
            self.iters(3, 10);
        }
        let whole = self.time(&decomp_plan(g, shape, SplitDim::M, 1))?;
        let (m, k, n) = shape;
        let mut splits = vec![];
        for d in SplitDim::ALL {
            for &c in self.o.decomp_chunks() {
                let dim = match d {
                    SplitDim::M => m,
                    SplitDim::N => n,
                    SplitDim::K => k,
                };
                if dim % c != 0 || dim / c < 16 {
                    continue;
                }
                let t = self.time(&decomp_plan(g, shape, d, c))?;
                splits.push(DecompSplit {
                    split: d,
                    chunks: c,
                    time_ms: t,
                    ratio: t / whole,
                });
            }
        }
        Ok(DecompShape {
            m,
            k,
            n,
            whole_ms: whole,
            whole_tflops: 2.0 * (m * k * n) as f64 / whole / 1e9,
            splits,
        })
    }

    /// Alone per-task time of the victim, cached.
    fn alone(
        &mut self,
        gemm_victim: bool,
        gemm: (usize, usize, usize),
        traffic: Traffic,
        bytes: usize,
    ) -> Result<f64> {
        let key = if gemm_victim {
            (true, gemm, Traffic::Copy, 0)
        } else {
            (false, (0, 0, 0), traffic, bytes)
        };
        if let Some(v) = self.alone.get(&key) {
            return Ok(*v);
        }
        let g = self.be.gpus();
        let p = if gemm_victim {
            mixed_plan(g, gemm, 6, traffic, bytes, 0, false)
        } else {
            mixed_plan(g, gemm, 0, traffic, bytes, 6, false)
        };
        let (t, _) = self.victim_ms(&p, 0)?;
        self.alone.insert(key, t);
        Ok(t)
    }

    fn contention(
        &mut self,
        gemm: (usize, usize, usize),
        traffic: Traffic,
        bytes: usize,
    ) -> Result<Vec<ContentionPoint>> {
        let g = self.be.gpus();
        self.iters(1, 2);
        let tg = self.alone(true, gemm, traffic, bytes)?;
        let tc = self.alone(false, gemm, traffic, bytes)?;
        let victims = 6usize;
        let cover = |t_victim: f64, t_other: f64| {
            (((victims + 2) as f64 * t_victim / t_other.max(1e-6)).ceil() as usize).clamp(2, 400)
        };
        let mut out = vec![];
        // GEMM victim: comm issued first on stream 1, GEMMs on stream 0.
        let p = mixed_plan(g, gemm, victims, traffic, bytes, cover(tg, tc), true);
        let (t, s) = self.victim_ms(&p, 0)?;
        out.push(ContentionPoint {
            victim: Victim::Gemm,
            traffic,
            gpus: g,
            gemm: [gemm.0, gemm.1, gemm.2],
            comm_bytes: actual_bytes(traffic, bytes, g),
            alone_ms: tg,
            together_ms: t,
            slowdown: t / tg,
            samples: s,
        });
        // Comm victim: GEMMs issued first on stream 0, comm on stream 1.
        let p = mixed_plan(g, gemm, cover(tc, tg), traffic, bytes, victims, false);
        let (t, s) = self.victim_ms(&p, 1)?;
        out.push(ContentionPoint {
            victim: Victim::Comm,
            traffic,
            gpus: g,
            gemm: [gemm.0, gemm.1, gemm.2],
            comm_bytes: actual_bytes(traffic, bytes, g),
            alone_ms: tc,
            together_ms: t,
            slowdown: t / tc,
            samples: s,
        });
        Ok(out)
    }

    fn curve(&mut self, traffic: Traffic) -> Result<Vec<CurvePoint>> {
        let g = self.be.gpus();
        if self.o.quick {
            self.iters(3, 10);
        } else {
            self.iters(5, 20);
        }
        let mut out = vec![];
        for bytes in self.o.curve_sizes() {
            let p = mixed_plan(g, (g, 1, 1), 0, traffic, bytes, 1, true);
            let t = self.time(&p)?;
            let b = actual_bytes(traffic, bytes, g);
            let alg = b as f64 / t / 1e6;
            out.push(CurvePoint {
                traffic,
                gpus: g,
                peers: g - 1,
                bytes: b,
                time_ms: t,
                algbw_gbs: alg,
                busbw_gbs: alg * traffic.bus_factor(g),
            });
        }
        Ok(out)
    }

    fn pull(&mut self, peers: usize) -> Result<Vec<CurvePoint>> {
        let g = self.be.gpus();
        if self.o.quick {
            self.iters(3, 10);
        } else {
            self.iters(5, 20);
        }
        let mut out = vec![];
        for bytes in self.o.curve_sizes() {
            let b = (bytes / ELEM_BYTES).max(1) * ELEM_BYTES;
            let t = self.time(&pull_plan(g, peers, b))?;
            let alg = (b * peers) as f64 / t / 1e6;
            out.push(CurvePoint {
                traffic: Traffic::Copy,
                gpus: g,
                peers,
                bytes: b,
                time_ms: t,
                algbw_gbs: alg,
                busbw_gbs: alg,
            });
        }
        Ok(out)
    }
}

/// Opens `opts.gpus` GPUs and measures everything (see the module doc);
/// `progress(done, total, what)` is called before each step and at the end.
/// The result has no fit yet ([`fit_profile`]).
pub fn characterize(
    opts: &CharOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Characterization> {
    let start = std::time::Instant::now();
    let all = jobs(opts);
    let total = all.len();
    let first = GpuBackend::open(opts.gpus)?;
    let device = {
        let gi = first.info().gpus.first();
        format!(
            "{}x {}",
            opts.gpus,
            gi.map(|g| g.name.clone()).unwrap_or_else(|| "GPU".into())
        )
    };
    let sm_count = first.info().gpus.first().map(|g| g.sms).unwrap_or(0);
    let copy_engines = first
        .info()
        .gpus
        .first()
        .map(|g| g.copy_engines)
        .unwrap_or(0);
    let mut runner = Runner {
        o: opts,
        be: first,
        alone: HashMap::new(),
    };
    let mut ch = Characterization {
        device,
        options: opts.clone(),
        sm_count,
        copy_engines,
        decomposition: vec![],
        contention: vec![],
        curves: vec![],
        elapsed_s: 0.0,
        fit: None,
    };
    for (i, job) in all.iter().enumerate() {
        progress(i, total, &job.label());
        let g = job.gpus(opts.gpus);
        if runner.be.gpus() != g {
            // One set of communicators at a time: drop the old one first.
            let old = std::mem::replace(&mut runner.be, GpuBackend::open(g)?);
            drop(old);
            runner.alone.clear();
        }
        match job {
            Job::Decomp { shape } => ch.decomposition.push(runner.decomp(*shape)?),
            Job::Contention {
                gemm,
                traffic,
                bytes,
            } => ch
                .contention
                .extend(runner.contention(*gemm, *traffic, *bytes)?),
            Job::Curve { traffic, .. } => ch.curves.extend(runner.curve(*traffic)?),
            Job::Pull { peers } => ch.curves.extend(runner.pull(*peers)?),
        }
    }
    progress(total, total, "done");
    ch.elapsed_s = start.elapsed().as_secs_f64();
    Ok(ch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::precheck;

    fn ok(p: &Plan) {
        let ptrs: Vec<Vec<crate::mem::DevicePtr>> = p
            .ranks
            .iter()
            .map(|rp| vec![crate::mem::DevicePtr(1 << 20); rp.buffers.len()])
            .collect();
        precheck(p, &ptrs).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    }

    #[test]
    fn every_plan_passes_precheck() {
        for g in [2, 3, 4] {
            for d in SplitDim::ALL {
                for c in [1, 2, 4, 16] {
                    ok(&decomp_plan(g, (256, 128, 512), d, c));
                }
            }
            for t in Traffic::NCCL.into_iter().chain([Traffic::Copy]) {
                ok(&mixed_plan(g, (256, 128, 64), 3, t, 1 << 16, 5, true));
                ok(&mixed_plan(g, (256, 128, 64), 0, t, 3 << 16, 1, false));
            }
            for peers in 1..g {
                ok(&pull_plan(g, peers, 1 << 16));
            }
        }
    }

    #[test]
    fn job_counts() {
        let q = CharOptions {
            gpus: 4,
            quick: true,
        };
        let f = CharOptions {
            gpus: 4,
            quick: false,
        };
        assert!(steps(&q) < steps(&f));
        assert_eq!(
            steps(&CharOptions {
                gpus: 1,
                quick: false
            }),
            18
        );
    }
}
