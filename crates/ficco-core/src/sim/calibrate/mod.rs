//! Calibration: what `ficco characterize` measures on a machine, and the
//! pure half of it (everything but running plans on GPUs).
//!
//! Three families of measurements, all as small probe plans
//! ([`crate::plan::lower::probe`]) run by a GPU backend:
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
//!   the rest: [`victim_durations`]) and are divided by the same median with
//!   the victim alone.
//! - **Communication curves**: time vs size of NCCL all-gather, reduce-scatter,
//!   all-reduce and ring send/recv for every GPU count 2..=P, and copy-engine
//!   pulls into GPU 0 from 1..P-1 peers at once (one stream per peer).
//!
//! | module | role |
//! |---|---|
//! | this one | what to measure ([`CharOptions`]) and the measurement data types (serde) |
//! | [`plans`] | the steps of a run and the probe plan of each measurement |
//! | [`fit`] | fitting a [`HwProfile`] to the measurements |
//! | [`profile_out`] | the fitted profile as TOML |
//! | [`mod@tables`] | nccl-tests-like text tables of a run |
//!
//! The measuring loop itself lives in the GPU crate (`ficco_cuda::characterize`).

pub mod fit;
pub mod plans;
pub mod profile_out;
pub mod tables;

pub use crate::plan::lower::probe::{SplitDim, Traffic};
pub use fit::{
    fit_curve, fit_curves, fit_gemm, fit_linear, fit_profile, gemm_rms_log_err, gemm_samples,
    CurveFit, FitSummary, GemmFit, GemmSample, LinearFit,
};
pub use plans::{jobs, steps, victim_durations, CalibrationJob};
pub use profile_out::profile_toml;
pub use tables::tables;

#[cfg(doc)]
use crate::sim::profile::HwProfile;
use serde::{Deserialize, Serialize};

/// One mebibyte.
pub const MIB: usize = 1 << 20;

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

impl Traffic {
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

impl CurvePoint {
    /// A point measured at `time_ms`: the algorithm bandwidth counts every
    /// byte moved (copies: `bytes` from each of `peers` peers), the bus
    /// bandwidth applies [`Traffic::bus_factor`].
    pub fn measured(
        traffic: Traffic,
        gpus: usize,
        peers: usize,
        bytes: usize,
        time_ms: f64,
    ) -> Self {
        let moved = if traffic == Traffic::Copy {
            bytes * peers
        } else {
            bytes
        };
        let alg = moved as f64 / time_ms / 1e6;
        CurvePoint {
            traffic,
            gpus,
            peers,
            bytes,
            time_ms,
            algbw_gbs: alg,
            busbw_gbs: alg * traffic.bus_factor(gpus),
        }
    }
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
