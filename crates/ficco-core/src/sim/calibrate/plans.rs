//! The steps of a characterization run and their probe plans: which
//! measurements a [`CharOptions`] asks for (one [`CalibrationJob`] per progress step),
//! the probe plan each measurement runs, and reading a victim's task times
//! back from a measured timeline. The GPU crate's measuring loop runs these.

use super::{CharOptions, Traffic, MIB};
use crate::plan::lower::probe::{self, SplitDim};
use crate::plan::Plan;
use crate::run::timeline::Timeline;
use std::collections::HashMap;

/// One unit of work (one progress step).
#[derive(Debug, Clone, PartialEq)]
pub enum CalibrationJob {
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

impl CalibrationJob {
    /// GPUs the job runs on when the run uses `top`.
    pub fn gpus(&self, top: usize) -> usize {
        match self {
            CalibrationJob::Curve { gpus, .. } => *gpus,
            _ => top,
        }
    }
    /// What the progress line says.
    pub fn label(&self) -> String {
        match self {
            CalibrationJob::Decomp { shape: (m, k, n) } => format!("decomposition {m}x{k}x{n}"),
            CalibrationJob::Contention {
                gemm: (m, k, n),
                traffic,
                bytes,
            } => format!(
                "contention {m}x{k}x{n} / {} {} MiB",
                traffic.name(),
                bytes / MIB
            ),
            CalibrationJob::Curve { gpus, traffic } => format!("{} on {gpus} GPUs", traffic.name()),
            CalibrationJob::Pull { peers } => format!("copy pull from {peers} peer(s)"),
        }
    }
}

/// Every step of a run, in order.
pub fn jobs(o: &CharOptions) -> Vec<CalibrationJob> {
    let mut out: Vec<CalibrationJob> = o
        .decomp_shapes()
        .into_iter()
        .map(|shape| CalibrationJob::Decomp { shape })
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
                    out.push(CalibrationJob::Contention {
                        gemm,
                        traffic,
                        bytes,
                    });
                }
            }
        }
        for peers in 1..o.gpus {
            out.push(CalibrationJob::Pull { peers });
        }
        for gpus in (2..=o.gpus).rev() {
            for traffic in Traffic::NCCL {
                out.push(CalibrationJob::Curve { gpus, traffic });
            }
        }
    }
    out
}

/// Number of progress steps a run reports.
pub fn steps(o: &CharOptions) -> usize {
    jobs(o).len()
}

/// Durations of the tasks on `stream` of every rank, dropping each rank's first.
pub fn victim_durations(tl: &Timeline, stream: usize) -> Vec<f64> {
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

impl CalibrationJob {
    /// (warm-up, timed) iterations of the job's plans.
    pub fn iters(&self, quick: bool) -> (usize, usize) {
        match (self, quick) {
            (CalibrationJob::Decomp { .. }, true) => (2, 6),
            (CalibrationJob::Decomp { .. }, false) => (3, 10),
            (CalibrationJob::Contention { .. }, _) => (1, 2),
            (CalibrationJob::Curve { .. } | CalibrationJob::Pull { .. }, true) => (3, 10),
            (CalibrationJob::Curve { .. } | CalibrationJob::Pull { .. }, false) => (5, 20),
        }
    }
}

/// Victim tasks per rank in a contention measurement.
pub const VICTIMS: usize = 6;

/// The cuts of the decomposition grid measured for `shape`: every split
/// dimension and piece count whose pieces divide it evenly into at least 16.
pub fn decomp_cuts(o: &CharOptions, (m, k, n): (usize, usize, usize)) -> Vec<(SplitDim, usize)> {
    let mut out = vec![];
    for d in SplitDim::ALL {
        for &c in o.decomp_chunks() {
            let dim = match d {
                SplitDim::M => m,
                SplitDim::N => n,
                SplitDim::K => k,
            };
            if dim % c != 0 || dim / c < 16 {
                continue;
            }
            out.push((d, c));
        }
    }
    out
}

/// The GEMM cut into `chunks` pieces along `split` (1: the whole GEMM).
pub fn decomp_plan(
    gpus: usize,
    shape: (usize, usize, usize),
    split: SplitDim,
    chunks: usize,
) -> Plan {
    probe::chunked_gemm(gpus, shape, split, chunks)
}

/// The victim alone: [`VICTIMS`] GEMMs (`gemm_victim`) or transfers on their
/// stream, the other stream idle. The victim's stream is stream 0.
pub fn alone_plan(
    gpus: usize,
    gemm_victim: bool,
    gemm: (usize, usize, usize),
    traffic: Traffic,
    bytes: usize,
) -> Plan {
    if gemm_victim {
        probe::gemms_beside_traffic(gpus, gemm, VICTIMS, traffic, bytes, 0, false)
    } else {
        probe::gemms_beside_traffic(gpus, gemm, 0, traffic, bytes, VICTIMS, false)
    }
}

/// The victim beside the other stream, kept busy for longer than the
/// victim's whole run: `alone_victim_ms` and `alone_other_ms` are the
/// per-task times alone. The other stream's tasks are issued first. Returns
/// the plan and the victim's stream.
pub fn contention_plan(
    gpus: usize,
    victim: super::Victim,
    gemm: (usize, usize, usize),
    traffic: Traffic,
    bytes: usize,
    alone_victim_ms: f64,
    alone_other_ms: f64,
) -> (Plan, usize) {
    let cover = (((VICTIMS + 2) as f64 * alone_victim_ms / alone_other_ms.max(1e-6)).ceil()
        as usize)
        .clamp(2, 400);
    match victim {
        // GEMM victim: comm issued first on stream 1, GEMMs on stream 0.
        super::Victim::Gemm => (
            probe::gemms_beside_traffic(gpus, gemm, VICTIMS, traffic, bytes, cover, true),
            0,
        ),
        // Comm victim: GEMMs issued first on stream 0, comm on stream 1.
        super::Victim::Comm => (
            probe::gemms_beside_traffic(gpus, gemm, cover, traffic, bytes, VICTIMS, false),
            1,
        ),
    }
}

/// One point of an NCCL curve: one transfer of NCCL size `bytes` on every rank.
pub fn curve_plan(gpus: usize, traffic: Traffic, bytes: usize) -> Plan {
    probe::gemms_beside_traffic(gpus, (gpus, 1, 1), 0, traffic, bytes, 1, true)
}

/// One point of a copy-ingress curve: GPU 0 pulls `bytes` from each of
/// `peers` peers at once.
pub fn pull_plan(gpus: usize, peers: usize, bytes: usize) -> Plan {
    probe::peer_pulls(gpus, peers, bytes)
}

/// Bytes per peer a pull of `bytes` really moves (whole bf16 elements).
pub fn pull_bytes(bytes: usize) -> usize {
    (bytes / crate::problem::workload::ELEM_BYTES).max(1) * crate::problem::workload::ELEM_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

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
