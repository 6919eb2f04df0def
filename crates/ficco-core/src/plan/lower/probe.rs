//! Probe plans: the small plans that calibration (`ficco characterize`,
//! [`crate::sim::calibrate`]) runs to measure what the cost model needs. They
//! lower no schedule; each is built straight from the shapes it measures.
//!
//! * [`chunked_gemm`]: one GEMM cut into pieces along M, N or K, run back to
//!   back on one stream of GPU 0 (decomposition loss).
//! * [`gemms_beside_traffic`]: GEMMs on one stream and transfers (an NCCL
//!   collective, ring send/recv or copy-engine pulls) on a second stream of
//!   every GPU (contention loss; with no GEMMs, communication curves).
//! * [`peer_pulls`]: GPU 0 pulls from several peers at once (copy ingress).
//!
//! A plan names the [`Problem`] it is for. A probe is the work of a
//! `concurrent` problem, GEMMs [m, k] x [k, n] on every rank beside
//! communication, so it names that: its real GEMM shape, GEMM count and GPU
//! count, its collective (all-gather for ring send/recv and peer pulls: each
//! rank receives a peer's whole block, a piece of a ring all-gather) and the
//! bytes of one transfer (0 without one). A probe without GEMMs names
//! m = k = n = 1 and `gemms` = 0. The problem describes the probe and is not
//! meant to be lowered (it need not pass [`Problem::validate`]): executors
//! take the GPU count from it, and nothing is prepared for it, so a probe's
//! inputs are random.

use super::parts::{buffer, stream};
use crate::plan::{
    BufferRole, NcclOp, Plan, RankPlan, RankView, Resources, StreamRole, Task, TaskId, TaskKind,
    View,
};
use crate::problem::workload::{Collective, Op, Problem, SideCollective, ELEM_BYTES};
use crate::space::Priority;
use serde::{Deserialize, Serialize};

/// A kind of traffic a probe moves.
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

/// The `concurrent` problem a probe names (see the module doc).
fn probe_problem(
    gpus: usize,
    (m, k, n): (usize, usize, usize),
    gemms: usize,
    traffic: Traffic,
    bytes: usize,
) -> Problem {
    let (m, k, n) = if gemms == 0 { (1, 1, 1) } else { (m, k, n) };
    Problem {
        op: Op::Concurrent,
        m,
        k,
        n,
        gpus,
        side: Some(SideCollective {
            gemms,
            collective: traffic.collective().unwrap_or(Collective::AllGather),
            bytes,
        }),
        moe: None,
    }
}

fn plan(name: String, problem: Problem, ranks: Vec<RankPlan>) -> Plan {
    Plan {
        problem,
        name,
        schedule: None,
        resources: Resources::default(),
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

fn gemm_task(label: String, a: View, b: View, c: View) -> Task {
    Task {
        label,
        stream: 0,
        kind: TaskKind::Gemm {
            a,
            b,
            c,
            sm_target: None,
            accumulate: false,
            occupancy: None,
        },
        deps: vec![],
    }
}

fn gemm_buffers(m: usize, k: usize, n: usize) -> Vec<crate::plan::Buffer> {
    vec![
        buffer("a", BufferRole::InputA, m, k, false),
        buffer("b", BufferRole::InputB, k, n, false),
        buffer("c", BufferRole::Output, m, n, false),
    ]
}

/// GEMM `m x k x n` cut into `chunks` pieces along `split` (chunks = 1: whole),
/// on GPU 0 of `gpus`, one stream; the other GPUs idle. A K split computes
/// partial products only: every piece overwrites the same output.
pub fn chunked_gemm(
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
        tasks.push(gemm_task(format!("gemm {}{i}", split.name()), a, b, out));
    }
    let r0 = RankPlan {
        buffers: gemm_buffers(m, k, n),
        streams: vec![stream("compute", StreamRole::Compute, Priority::Normal)],
        tasks,
    };
    let mut ranks = vec![r0];
    ranks.extend((1..gpus).map(|_| empty_rank()));
    plan(
        format!("decomp {m}x{k}x{n} {}x{c}", split.name()),
        probe_problem(gpus, (m, k, n), 1, Traffic::AllGather, 0),
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

/// The NCCL size (or bytes per copy) a [`gemms_beside_traffic`] probe of
/// `bytes` really moves on `gpus` GPUs, bytes.
pub fn actual_bytes(traffic: Traffic, bytes: usize, gpus: usize) -> usize {
    comm_elems(traffic, bytes, gpus).1 * ELEM_BYTES
}

/// Every rank: `n_gemm` GEMMs `m x k x n` on stream 0 and `n_comm` transfers
/// of `traffic` (NCCL size or per-copy bytes `bytes`) on stream 1; the tasks
/// of the stream listed first (`comm_first`) are issued first. Copies: rank r
/// pulls from rank r+1.
pub fn gemms_beside_traffic(
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
                buffers.extend(gemm_buffers(m, k, n));
                streams.push(stream("compute", StreamRole::Compute, Priority::Normal));
                for i in 0..n_gemm {
                    gemm_tasks.push(gemm_task(
                        format!("gemm {i}"),
                        View::whole(0, m, k),
                        View::whole(1, k, n),
                        View::whole(2, m, n),
                    ));
                }
            }
            if n_comm > 0 {
                let sb = buffers.len();
                buffers.push(buffer("send", BufferRole::InputX, 1, send_e, peer));
                buffers.push(buffer("recv", BufferRole::Scratch, 1, recv_e, peer));
                let s = streams.len();
                streams.push(stream("comm", StreamRole::Comm, Priority::Normal));
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
    let moved = if n_comm > 0 {
        actual_bytes(traffic, bytes, gpus)
    } else {
        0
    };
    plan(
        format!(
            "{n_gemm} gemm {m}x{k}x{n} + {n_comm} {} {bytes} B",
            traffic.name()
        ),
        probe_problem(gpus, gemm, n_gemm, traffic, moved),
        ranks,
    )
}

/// GPU 0 pulls `bytes` from each of GPUs 1..=peers at once (one stream per peer).
pub fn peer_pulls(gpus: usize, peers: usize, bytes: usize) -> Plan {
    let e = (bytes / ELEM_BYTES).max(1);
    let peers = peers.clamp(1, gpus - 1);
    let mut ranks = vec![];
    let mut r0 = empty_rank();
    for j in 1..=peers {
        r0.buffers
            .push(buffer(&format!("dst{j}"), BufferRole::Scratch, 1, e, true));
        r0.streams.push(stream(
            &format!("pull{j}"),
            StreamRole::Comm,
            Priority::Normal,
        ));
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
                .push(buffer("src", BufferRole::InputX, 1, e, true));
        }
        ranks.push(rp);
    }
    plan(
        format!("pull {bytes} B from {peers} peers"),
        probe_problem(gpus, (1, 1, 1), 0, Traffic::Copy, e * ELEM_BYTES),
        ranks,
    )
}
