//! The lowering of the expert-parallel operators, `a2a-gemm` (dispatch) and
//! `gemm-a2a` (combine), over the routing of [`crate::problem::routing`].
//!
//! Buffers of rank q (sizes differ per rank: the routing is uneven):
//!
//! | op | `a` (input) | `b` (input) | `out` | scratch |
//! |---|---|---|---|---|
//! | a2a-gemm | routed rows [sent, K], by expert | E/P experts' [K, N] stacked | [received, N], source-major | `recv` [received, K] |
//! | gemm-a2a | expert rows [received, K], source-major | as above | [sent, N], by expert | `part` [received, N] |
//!
//! A *block* is what one source rank r exchanges with one expert rank q:
//! rows of q's experts, in expert order, one *segment* per expert (empty
//! segments are left out, and empty blocks move nothing). Its GEMM is a
//! [`TaskKind::GroupedGemm`] with one group per segment, each against its
//! expert's rows of `b`. The own block (r = q) never moves: dispatch's GEMM
//! reads it straight from `a`, combine's writes it straight into `out`.
//!
//! * `seq`: one NCCL grouped send/recv of every block (the all-to-all with
//!   split sizes), then one grouped GEMM over every segment (dispatch), or
//!   the reverse (combine).
//! * `shard` (per-source steps): dispatch runs the own block's GEMM first,
//!   then each peer block's GEMM as soon as that block has arrived; combine
//!   computes each peer's block and sends it while the next is computed,
//!   with its own block last, under the last transfer.
//! * `fineC`: each block cut into C chunks of rows (uneven where the block
//!   does not divide; a chunk may cut through a segment), one step each.
//! * `bulk`: transfers per block, but dispatch runs one grouped GEMM over
//!   every peer block after they all arrived (the own block's GEMM hides
//!   the transfers); combine computes every peer block in one grouped GEMM
//!   first, then sends the blocks and computes its own.
//! * Engines and orders as for the tensor-parallel operators: copy engines
//!   push each block (dispatch and combine), on one stream (`ring`,
//!   peer (q + s) mod P at step s) or one stream per peer (`all`); NCCL makes
//!   one grouped send/recv per step (`ring`) or per chunk with every peer
//!   (`all`), on every rank even where its lists are empty, so that every
//!   rank makes the same calls.

use super::parts::{buffer, compute_and_comm_streams, push_task, resources_of, stream};
use crate::error::Result;
use crate::plan::{
    BufId, BufferRole, GemmGroup, NcclOp, Plan, RankPlan, RankView, Resources, StreamRole, TaskId,
    TaskKind, View,
};
use crate::problem::routing::Routing;
use crate::problem::workload::{Op, Problem};
use crate::space::{Engine, Granularity, Order, Priority, Schedule};

const A: BufId = 0;
const B: BufId = 1;
const OUT: BufId = 2;
/// `recv` (dispatch) or `part` (combine).
const WORK: BufId = 3;

/// The routing of `p`, or no rows at all for a problem without one (only
/// reachable through an unvalidated problem: every plan is then empty).
fn routing_of(p: &Problem) -> Routing {
    p.routing().unwrap_or_else(|| Routing {
        gpus: p.gpus,
        experts: p.gpus.max(1),
        counts: vec![vec![0; p.gpus.max(1)]; p.gpus],
    })
}

/// Lowers an expert-parallel schedule (shape and fit already checked).
pub(super) fn lower(problem: &Problem, schedule: &Schedule) -> Result<Plan> {
    let mut b = Builder::new(problem, schedule);
    if schedule.is_seq() {
        b.seq();
    } else if b.dispatch {
        b.dispatch();
    } else {
        b.combine();
    }
    Ok(b.finish(schedule.name(), Some(*schedule)))
}

/// The grouped GEMM of every rank alone (T_comp): every segment it would
/// receive, from one input buffer.
pub(super) fn gemm_only(problem: &Problem) -> Plan {
    let rt = routing_of(problem);
    let (k, n) = (problem.k, problem.n);
    let l = rt.local_experts();
    let ranks = (0..problem.gpus)
        .map(|q| {
            let rows = rt.received(q);
            let mut groups = vec![];
            for r in 0..problem.gpus {
                let (first, _) = rt.recv_block(q, r);
                for (e, off, len) in rt.segments(r, q) {
                    groups.push(GemmGroup {
                        a: View::whole(0, rows, k).rows(first + off, len),
                        b: View::whole(1, l * k, n).rows(e * k, k),
                        c: View::whole(2, rows, n).rows(first + off, len),
                    });
                }
            }
            let tasks = if groups.is_empty() {
                vec![]
            } else {
                vec![crate::plan::Task {
                    label: "grouped-gemm".into(),
                    stream: 0,
                    kind: TaskKind::GroupedGemm {
                        groups,
                        sm_target: None,
                    },
                    deps: vec![],
                }]
            };
            RankPlan {
                buffers: vec![
                    buffer("x", BufferRole::InputA, rows, k, false),
                    buffer("b", BufferRole::InputB, l * k, n, false),
                    buffer("c", BufferRole::Output, rows, n, false),
                ],
                streams: vec![stream("compute0", StreamRole::Compute, Priority::Normal)],
                tasks,
            }
        })
        .collect();
    Plan {
        problem: *problem,
        name: "gemm-only".into(),
        schedule: None,
        resources: Resources::default(),
        ranks,
    }
}

/// The all-to-all of every rank alone (T_comm), over NCCL: one grouped
/// send/recv of every peer block, and the own block copied locally (as
/// NCCL's all-to-all does), so the output is whole.
pub(super) fn comm_only(problem: &Problem) -> Plan {
    let rt = routing_of(problem);
    let p = problem.gpus;
    let cols = if problem.op == Op::A2aGemm {
        problem.k
    } else {
        problem.n
    };
    // Dispatch moves send-side rows to receive-side rows; combine the reverse.
    let (src_rows, dst_rows): (Vec<usize>, Vec<usize>) = (0..p)
        .map(|q| (rt.sent(q), rt.received(q)))
        .map(|(s, r)| {
            if problem.op == Op::A2aGemm {
                (s, r)
            } else {
                (r, s)
            }
        })
        .unzip();
    let src_block = |q: usize, d: usize| {
        if problem.op == Op::A2aGemm {
            rt.send_block(q, d)
        } else {
            rt.recv_block(q, d)
        }
    };
    let dst_block = |q: usize, r: usize| {
        if problem.op == Op::A2aGemm {
            rt.recv_block(q, r)
        } else {
            rt.send_block(q, r)
        }
    };
    let mut ranks: Vec<RankPlan> = (0..p)
        .map(|q| RankPlan {
            buffers: vec![
                buffer("in", BufferRole::InputA, src_rows[q], cols, false),
                buffer("out", BufferRole::Output, dst_rows[q], cols, false),
            ],
            streams: vec![stream("comm", StreamRole::Comm, Priority::Normal)],
            tasks: vec![],
        })
        .collect();
    for q in 0..p {
        let view = |buf: BufId, rows: usize, (first, len): (usize, usize)| {
            View::whole(buf, rows, cols).rows(first, len)
        };
        let sends = (0..p)
            .filter(|&d| d != q && src_block(q, d).1 > 0)
            .map(|d| (d, view(0, src_rows[q], src_block(q, d))))
            .collect();
        let recvs = (0..p)
            .filter(|&r| r != q && dst_block(q, r).1 > 0)
            .map(|r| (r, view(1, dst_rows[q], dst_block(q, r))))
            .collect();
        push_task(
            &mut ranks,
            q,
            0,
            "all-to-all".into(),
            TaskKind::Nccl {
                group: 0,
                op: NcclOp::SendRecv { sends, recvs },
            },
            vec![],
        );
        if src_block(q, q).1 > 0 {
            let src = RankView {
                rank: q,
                view: view(0, src_rows[q], src_block(q, q)),
            };
            let dst = RankView {
                rank: q,
                view: view(1, dst_rows[q], dst_block(q, q)),
            };
            push_task(
                &mut ranks,
                q,
                0,
                "local copy".into(),
                TaskKind::Copy { src, dst },
                vec![],
            );
        }
    }
    Plan {
        problem: *problem,
        name: "comm-only".into(),
        schedule: None,
        resources: Resources::default(),
        ranks,
    }
}

/// Rows [lo, hi) of chunk j when `len` rows are cut into c chunks.
fn chunk(len: usize, c: usize, j: usize) -> (usize, usize) {
    (j * len / c, (j + 1) * len / c)
}

struct Builder {
    p: Problem,
    s: Schedule,
    rt: Routing,
    /// a2a-gemm (else gemm-a2a).
    dispatch: bool,
    ranks: Vec<RankPlan>,
    /// Per rank: GEMMs issued so far (to alternate compute streams).
    gemms: Vec<usize>,
    next_group: usize,
    compute_streams: usize,
    comm_streams: usize,
}

impl Builder {
    fn new(p: &Problem, s: &Schedule) -> Self {
        let rt = routing_of(p);
        let dispatch = p.op == Op::A2aGemm;
        let copy = s.engine == Engine::Copy && !s.is_seq();
        let compute_streams = if s.is_seq() { 1 } else { s.compute_streams };
        let comm_streams = if copy && s.order == Order::All {
            p.gpus - 1
        } else {
            1
        };
        let prio = if s.is_seq() {
            Priority::Normal
        } else {
            s.comm_priority
        };
        let streams = compute_and_comm_streams(compute_streams, comm_streams, prio);
        let (k, n, l) = (p.k, p.n, rt.local_experts());
        let ranks = (0..p.gpus)
            .map(|q| {
                let (sent, recv) = (rt.sent(q), rt.received(q));
                let buffers = if dispatch {
                    vec![
                        buffer("a", BufferRole::InputA, sent, k, false),
                        buffer("b", BufferRole::InputB, l * k, n, false),
                        buffer("out", BufferRole::Output, recv, n, false),
                        // Peers push their blocks into it.
                        buffer("recv", BufferRole::Scratch, recv, k, copy),
                    ]
                } else {
                    vec![
                        buffer("a", BufferRole::InputA, recv, k, false),
                        buffer("b", BufferRole::InputB, l * k, n, false),
                        // Peers push their blocks into it.
                        buffer("out", BufferRole::Output, sent, n, copy),
                        buffer("part", BufferRole::Scratch, recv, n, false),
                    ]
                };
                RankPlan {
                    buffers,
                    streams: streams.clone(),
                    tasks: vec![],
                }
            })
            .collect();
        Builder {
            p: *p,
            s: *s,
            rt,
            dispatch,
            ranks,
            gemms: vec![0; p.gpus],
            next_group: 0,
            compute_streams,
            comm_streams,
        }
    }

    fn finish(self, name: String, schedule: Option<Schedule>) -> Plan {
        Plan {
            problem: self.p,
            name,
            schedule,
            resources: resources_of(&self.s),
            ranks: self.ranks,
        }
    }

    fn gpus(&self) -> usize {
        self.p.gpus
    }

    fn chunks(&self) -> usize {
        self.s.granularity.chunks()
    }

    fn bulk(&self) -> bool {
        self.s.granularity == Granularity::Bulk
    }

    /// Rows [row, row + rows) of rank q's buffer `buf`.
    fn view(&self, q: usize, buf: BufId, row: usize, rows: usize) -> View {
        let b = &self.ranks[q].buffers[buf];
        View::whole(buf, b.rows, b.cols).rows(row, rows)
    }

    /// Comm stream index for peer offset `s` (1..P).
    fn comm_stream(&self, s: usize) -> usize {
        self.compute_streams + if self.comm_streams == 1 { 0 } else { s - 1 }
    }

    fn group(&mut self) -> usize {
        self.next_group += 1;
        self.next_group - 1
    }

    /// Rows of the block source r exchanges with expert rank q.
    fn block(&self, r: usize, q: usize) -> usize {
        self.rt.pair(r, q)
    }

    /// The GEMM groups of rows [lo, hi) of the block from source r on expert
    /// rank q: one per segment those rows touch. Dispatch reads the own
    /// block from `a` and peers' from `recv`, and writes `out`; combine
    /// reads `a` and writes the own block into `out` (its final place) and
    /// peers' into `part`.
    fn groups(&self, q: usize, r: usize, lo: usize, hi: usize) -> Vec<GemmGroup> {
        let k = self.p.k;
        let (recv_first, _) = self.rt.recv_block(q, r);
        let own_first = self.rt.send_block(q, q).0;
        let mut out = vec![];
        for (e, off, len) in self.rt.segments(r, q) {
            let (a0, a1) = (off.max(lo), (off + len).min(hi));
            if a0 >= a1 {
                continue;
            }
            let rows = a1 - a0;
            let (a, c) = if self.dispatch {
                let a = if r == q {
                    self.view(q, A, own_first + a0, rows)
                } else {
                    self.view(q, WORK, recv_first + a0, rows)
                };
                (a, self.view(q, OUT, recv_first + a0, rows))
            } else {
                let c = if r == q {
                    self.view(q, OUT, own_first + a0, rows)
                } else {
                    self.view(q, WORK, recv_first + a0, rows)
                };
                (self.view(q, A, recv_first + a0, rows), c)
            };
            out.push(GemmGroup {
                a,
                b: self.view(q, B, e * k, k),
                c,
            });
        }
        out
    }

    /// A grouped GEMM on the next compute stream of the rotation, or `None`
    /// when there is nothing to compute.
    fn gemm(
        &mut self,
        q: usize,
        label: String,
        groups: Vec<GemmGroup>,
        deps: Vec<TaskId>,
    ) -> Option<TaskId> {
        if groups.is_empty() {
            return None;
        }
        let stream = self.gemms[q] % self.compute_streams;
        self.gemms[q] += 1;
        let kind = TaskKind::GroupedGemm {
            groups,
            sm_target: self.s.gemm_sm_target(),
        };
        Some(push_task(&mut self.ranks, q, stream, label, kind, deps))
    }

    fn push(
        &mut self,
        q: usize,
        stream: usize,
        label: String,
        kind: TaskKind,
        deps: Vec<TaskId>,
    ) -> TaskId {
        push_task(&mut self.ranks, q, stream, label, kind, deps)
    }

    /// (step, chunk) pairs in the schedule's order: ring is peer-major, all is chunk-major.
    fn steps(&self) -> Vec<(usize, usize)> {
        let (p, c) = (self.gpus(), self.chunks());
        match self.s.order {
            Order::Ring => (1..p).flat_map(|s| (0..c).map(move |j| (s, j))).collect(),
            Order::All => (0..c).flat_map(|j| (1..p).map(move |s| (s, j))).collect(),
        }
    }

    /// NCCL rendezvous: one per step (ring) or per chunk with every peer (all).
    fn rounds(&self) -> Vec<Vec<(usize, usize)>> {
        let (p, c) = (self.gpus(), self.chunks());
        match self.s.order {
            Order::Ring => self.steps().into_iter().map(|sj| vec![sj]).collect(),
            Order::All => (0..c).map(|j| (1..p).map(|s| (s, j)).collect()).collect(),
        }
    }

    /// Every segment of every block rank q holds, own block included.
    fn all_groups(&self, q: usize, peers_only: bool) -> Vec<GemmGroup> {
        (0..self.gpus())
            .filter(|&r| !(peers_only && r == q))
            .flat_map(|r| self.groups(q, r, 0, self.block(r, q)))
            .collect()
    }

    fn seq(&mut self) {
        let p = self.gpus();
        let comm = self.compute_streams;
        let g = self.group();
        for q in 0..p {
            let gm = if self.dispatch {
                None
            } else {
                self.gemm(q, "grouped-gemm".into(), self.all_groups(q, false), vec![])
            };
            let mut sends = vec![];
            let mut recvs = vec![];
            for d in (0..p).filter(|&d| d != q) {
                // Dispatch sends a's block for d and receives d's into recv;
                // combine sends part's block of d and receives into out.
                let (out_block, in_block) = if self.dispatch {
                    (self.rt.send_block(q, d), self.rt.recv_block(q, d))
                } else {
                    (self.rt.recv_block(q, d), self.rt.send_block(q, d))
                };
                let (src_buf, dst_buf) = if self.dispatch {
                    (A, WORK)
                } else {
                    (WORK, OUT)
                };
                if out_block.1 > 0 {
                    sends.push((d, self.view(q, src_buf, out_block.0, out_block.1)));
                }
                if in_block.1 > 0 {
                    recvs.push((d, self.view(q, dst_buf, in_block.0, in_block.1)));
                }
            }
            let t = self.push(
                q,
                comm,
                "all-to-all".into(),
                TaskKind::Nccl {
                    group: g,
                    op: NcclOp::SendRecv { sends, recvs },
                },
                gm.into_iter().collect(),
            );
            if self.dispatch {
                self.gemm(q, "grouped-gemm".into(), self.all_groups(q, false), vec![t]);
            }
        }
    }

    /// a2a-gemm: own block's GEMM first, then each peer block (chunk) as it arrives.
    // Rank indices address per-rank tables and the builder at once.
    #[allow(clippy::needless_range_loop)]
    fn dispatch(&mut self) {
        let p = self.gpus();
        let c = self.chunks();
        for q in 0..p {
            let own = self.groups(q, q, 0, self.block(q, q));
            self.gemm(q, "gemm own".into(), own, vec![]);
        }
        // Per rank: transfers that bulk's one peer GEMM waits for.
        let mut arrived: Vec<Vec<TaskId>> = vec![vec![]; p];
        if self.s.engine == Engine::Copy {
            // At step s rank r pushes its block for q = (r - s) mod P, so q
            // receives from (q + s) mod P at step s; q's GEMM of it waits for
            // the push (pushes, not pulls: see `docs/signals.md`).
            let mut pushed = std::collections::HashMap::new();
            for r in 0..p {
                for (s, j) in self.steps() {
                    let q = (r + p - s) % p;
                    let (lo, hi) = chunk(self.block(r, q), c, j);
                    if lo == hi {
                        continue;
                    }
                    let src = RankView {
                        rank: r,
                        view: self.view(r, A, self.rt.send_block(r, q).0 + lo, hi - lo),
                    };
                    let dst = RankView {
                        rank: q,
                        view: self.view(q, WORK, self.rt.recv_block(q, r).0 + lo, hi - lo),
                    };
                    let cs = self.comm_stream(s);
                    let t = self.push(
                        r,
                        cs,
                        format!("push d{q}.c{j}"),
                        TaskKind::Copy { src, dst },
                        vec![],
                    );
                    pushed.insert((q, s, j), t);
                }
            }
            for q in 0..p {
                for (s, j) in self.steps() {
                    let r = (q + s) % p;
                    let Some(&t) = pushed.get(&(q, s, j)) else {
                        continue;
                    };
                    let (lo, hi) = chunk(self.block(r, q), c, j);
                    if self.bulk() {
                        arrived[q].push(t);
                    } else {
                        let groups = self.groups(q, r, lo, hi);
                        self.gemm(q, format!("gemm q{r}.c{j}"), groups, vec![t]);
                    }
                }
            }
        } else {
            let comm = self.comm_stream(1);
            for round in self.rounds() {
                let g = self.group();
                for q in 0..p {
                    let mut sends = vec![];
                    let mut recvs = vec![];
                    for &(s, j) in &round {
                        let d = (q + p - s) % p;
                        let (lo, hi) = chunk(self.block(q, d), c, j);
                        if lo < hi {
                            let first = self.rt.send_block(q, d).0;
                            sends.push((d, self.view(q, A, first + lo, hi - lo)));
                        }
                        let r = (q + s) % p;
                        let (lo, hi) = chunk(self.block(r, q), c, j);
                        if lo < hi {
                            let first = self.rt.recv_block(q, r).0;
                            recvs.push((r, j, lo, hi, self.view(q, WORK, first + lo, hi - lo)));
                        }
                    }
                    let label = match round.as_slice() {
                        [(s, j)] => format!("send-recv s{s}.c{j}"),
                        _ => format!("send-recv all.c{}", round[0].1),
                    };
                    let op = NcclOp::SendRecv {
                        sends,
                        recvs: recvs.iter().map(|x| (x.0, x.4)).collect(),
                    };
                    let t = self.push(q, comm, label, TaskKind::Nccl { group: g, op }, vec![]);
                    for (r, j, lo, hi, _) in recvs {
                        if self.bulk() {
                            arrived[q].push(t);
                        } else {
                            let groups = self.groups(q, r, lo, hi);
                            self.gemm(q, format!("gemm q{r}.c{j}"), groups, vec![t]);
                        }
                    }
                }
            }
        }
        if self.bulk() {
            for (q, deps) in arrived.into_iter().enumerate() {
                let groups = self.all_groups(q, true);
                self.gemm(q, "gemm peers".into(), groups, deps);
            }
        }
    }

    /// gemm-a2a: each peer block (chunk) computed and sent back, own block last.
    fn combine(&mut self) {
        let p = self.gpus();
        let c = self.chunks();
        // bulk: every peer block in one grouped GEMM first.
        let mut bulk: Vec<Option<TaskId>> = vec![None; p];
        if self.bulk() {
            for (q, slot) in bulk.iter_mut().enumerate() {
                let groups = self.all_groups(q, true);
                *slot = self.gemm(q, "gemm peers".into(), groups, vec![]);
            }
        }
        // The GEMM of chunk j of the block rank q holds for peer d.
        let compute =
            |b: &mut Self, q: usize, d: usize, j: usize, lo: usize, hi: usize| match bulk[q] {
                Some(t) => Some(t),
                None => {
                    let groups = b.groups(q, d, lo, hi);
                    b.gemm(q, format!("gemm d{d}.c{j}"), groups, vec![])
                }
            };
        if self.s.engine == Engine::Copy {
            for q in 0..p {
                for (s, j) in self.steps() {
                    let d = (q + s) % p;
                    let (lo, hi) = chunk(self.block(d, q), c, j);
                    if lo == hi {
                        continue;
                    }
                    let gm = compute(self, q, d, j, lo, hi);
                    let src = RankView {
                        rank: q,
                        view: self.view(q, WORK, self.rt.recv_block(q, d).0 + lo, hi - lo),
                    };
                    let dst = RankView {
                        rank: d,
                        view: self.view(d, OUT, self.rt.send_block(d, q).0 + lo, hi - lo),
                    };
                    let cs = self.comm_stream(s);
                    self.push(
                        q,
                        cs,
                        format!("push d{d}.c{j}"),
                        TaskKind::Copy { src, dst },
                        gm.into_iter().collect(),
                    );
                }
            }
        } else {
            let comm = self.comm_stream(1);
            for round in self.rounds() {
                let g = self.group();
                for q in 0..p {
                    let mut sends = vec![];
                    let mut recvs = vec![];
                    let mut deps = vec![];
                    for &(s, j) in &round {
                        let d = (q + s) % p;
                        let (lo, hi) = chunk(self.block(d, q), c, j);
                        if lo < hi {
                            deps.extend(compute(self, q, d, j, lo, hi));
                            let first = self.rt.recv_block(q, d).0;
                            sends.push((d, self.view(q, WORK, first + lo, hi - lo)));
                        }
                        let from = (q + p - s) % p;
                        let (lo, hi) = chunk(self.block(q, from), c, j);
                        if lo < hi {
                            let first = self.rt.send_block(q, from).0;
                            recvs.push((from, self.view(q, OUT, first + lo, hi - lo)));
                        }
                    }
                    let label = match round.as_slice() {
                        [(s, j)] => format!("send-recv s{s}.c{j}"),
                        _ => format!("send-recv all.c{}", round[0].1),
                    };
                    let op = NcclOp::SendRecv { sends, recvs };
                    self.push(q, comm, label, TaskKind::Nccl { group: g, op }, deps);
                }
            }
        }
        for q in 0..p {
            let own = self.groups(q, q, 0, self.block(q, q));
            self.gemm(q, "gemm own".into(), own, vec![]);
        }
    }
}
