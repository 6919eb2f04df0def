//! The lowering of the communication-dependent operators (ag-gemm, gemm-rs,
//! gemm-ar): one step-by-step builder for every granularity, engine and
//! order (see the parent module's doc for the data flow of each operator).

use super::parts::{buffer, compute_and_comm_streams, push_task, resources_of, stream};
use crate::plan::{
    BufId, BufferRole, NcclOp, Plan, RankPlan, RankView, StreamRole, TaskId, TaskKind, View,
};
use crate::problem::workload::{Op, Problem};
use crate::space::{Engine, Granularity, Order, Priority, Schedule};

/// Lowers a dependent operator's schedule (shape and fit already checked).
pub(super) fn lower(problem: &Problem, schedule: &Schedule) -> Plan {
    let mut b = Builder::new(problem, schedule);
    if schedule.is_seq() {
        b.seq();
    } else {
        match (problem.op, schedule.engine) {
            (Op::AgGemm, Engine::Copy) => b.ag_copy(),
            (Op::AgGemm, Engine::Nccl) => b.ag_nccl(),
            (Op::GemmRs, Engine::Nccl) if schedule.order == Order::All => b.rs_nccl_all(),
            (Op::GemmRs, _) | (Op::GemmAr, Engine::Copy) => b.rs_pairwise(),
            (Op::GemmAr, Engine::Nccl) => b.ar_nccl(),
            // Lowered by their own modules.
            (Op::Concurrent | Op::A2aGemm | Op::GemmA2a, _) => {}
        }
    }
    b.finish(schedule.name(), Some(*schedule))
}

/// Named buffers of one lowering; every rank has the same layout.
#[derive(Clone, Copy)]
struct Bufs {
    a: BufId,
    b: BufId,
    out: BufId,
    /// ag-gemm: gathered A [M, K]; gemm-rs/ar: local partials [M, N].
    work: BufId,
    /// gemm-rs/ar: per-source receive slots [M, N] (slot q = rows q*R..).
    recv: BufId,
}

struct Builder {
    p: Problem,
    s: Schedule,
    ranks: Vec<RankPlan>,
    bufs: Bufs,
    /// Per rank: GEMMs issued so far (to alternate compute streams).
    gemms: Vec<usize>,
    next_group: usize,
    compute_streams: usize,
    comm_streams: usize,
    /// Index of the reduce stream, when the lowering has one.
    reduce_stream: Option<usize>,
}

impl Builder {
    fn new(p: &Problem, s: &Schedule) -> Self {
        let (m, k, n, r) = (p.m, p.k, p.n, p.shard_rows());
        let copy = s.engine == Engine::Copy && !s.is_seq();
        let compute_streams = if s.is_seq() { 1 } else { s.compute_streams };
        let comm_streams = if copy && s.order == Order::All {
            p.gpus - 1
        } else {
            1
        };
        let pairwise = !s.is_seq()
            && (p.op == Op::GemmRs && !(s.engine == Engine::Nccl && s.order == Order::All)
                || p.op == Op::GemmAr && s.engine == Engine::Copy);
        // A fused reduce on two GPUs receives straight into the output.
        let fused_direct = pairwise && s.fused_reduce && p.gpus == 2;
        let needs_reduce = pairwise && !fused_direct;
        let comm_priority = if s.is_seq() {
            Priority::Normal
        } else {
            s.comm_priority
        };
        let mut streams = compute_and_comm_streams(compute_streams, comm_streams, comm_priority);
        let reduce_stream = needs_reduce.then(|| {
            // Reduces gate the transfers after them (gemm-ar's broadcast) and
            // the plan's tail; at normal priority they starve behind the next
            // GEMM's blocks (measured on H200), so they go first.
            streams.push(stream("reduce", StreamRole::Compute, Priority::High));
            streams.len() - 1
        });
        let buffers = match p.op {
            // Lowered by crate::plan::lower::{concurrent, moe}; never built here.
            Op::Concurrent | Op::A2aGemm | Op::GemmA2a => vec![],
            // Copies push each shard into the peers' gathered A.
            Op::AgGemm => vec![
                buffer("a", BufferRole::InputA, r, k, false),
                buffer("b", BufferRole::InputB, k, n, false),
                buffer("c", BufferRole::Output, m, n, false),
                buffer(super::GATHERED_A, BufferRole::Scratch, m, k, copy),
            ],
            Op::GemmRs | Op::GemmAr => {
                let out_rows = if p.op == Op::GemmRs { r } else { m };
                let mut v = vec![
                    buffer("a", BufferRole::InputA, m, k, false),
                    buffer("b", BufferRole::InputB, k, n, false),
                    buffer(
                        "out",
                        BufferRole::Output,
                        out_rows,
                        n,
                        copy && (p.op == Op::GemmAr || fused_direct),
                    ),
                ];
                if p.op == Op::GemmRs || pairwise {
                    v.push(buffer("part", BufferRole::Scratch, m, n, false));
                }
                if needs_reduce {
                    v.push(buffer("recv", BufferRole::Scratch, m, n, copy));
                }
                v
            }
        };
        let bufs = Bufs {
            a: 0,
            b: 1,
            out: 2,
            work: 3,
            recv: 4,
        };
        let ranks = (0..p.gpus)
            .map(|_| RankPlan {
                buffers: buffers.clone(),
                streams: streams.clone(),
                tasks: vec![],
            })
            .collect();
        Builder {
            p: *p,
            s: *s,
            ranks,
            bufs,
            gemms: vec![0; p.gpus],
            next_group: 0,
            compute_streams,
            comm_streams,
            reduce_stream,
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

    fn shard(&self) -> usize {
        self.p.shard_rows()
    }

    fn chunk(&self) -> usize {
        self.shard() / self.s.granularity.chunks()
    }

    fn chunks(&self) -> usize {
        self.s.granularity.chunks()
    }

    fn view(&self, buf: BufId, row: usize, rows: usize) -> View {
        let b = &self.ranks[0].buffers[buf];
        View {
            buf,
            row,
            col: 0,
            rows,
            cols: b.cols,
        }
    }

    fn whole(&self, buf: BufId) -> View {
        let b = &self.ranks[0].buffers[buf];
        View::whole(buf, b.rows, b.cols)
    }

    /// Comm stream index for peer offset `s` (1..P).
    fn comm_stream(&self, s: usize) -> usize {
        self.compute_streams + if self.comm_streams == 1 { 0 } else { s - 1 }
    }

    fn push(
        &mut self,
        rank: usize,
        stream: usize,
        label: String,
        kind: TaskKind,
        deps: Vec<TaskId>,
    ) -> TaskId {
        push_task(&mut self.ranks, rank, stream, label, kind, deps)
    }

    /// A GEMM of `a` rows into `c`, on the next compute stream of the rotation.
    fn gemm(&mut self, rank: usize, label: String, a: View, c: View, deps: Vec<TaskId>) -> TaskId {
        self.gemm_into(rank, label, a, c, false, deps)
    }

    /// As [`Self::gemm`]; with `accumulate`, c += a @ b.
    fn gemm_into(
        &mut self,
        rank: usize,
        label: String,
        a: View,
        c: View,
        accumulate: bool,
        deps: Vec<TaskId>,
    ) -> TaskId {
        let stream = self.gemms[rank] % self.compute_streams;
        self.gemms[rank] += 1;
        let kind = TaskKind::Gemm {
            a,
            b: self.whole(self.bufs.b),
            c,
            sm_target: self.s.gemm_sm_target(),
            accumulate,
            occupancy: self.s.occupancy,
        };
        self.push(rank, stream, label, kind, deps)
    }

    fn nccl(
        &mut self,
        group: usize,
        rank: usize,
        stream: usize,
        label: String,
        op: NcclOp,
        deps: Vec<TaskId>,
    ) -> TaskId {
        self.push(rank, stream, label, TaskKind::Nccl { group, op }, deps)
    }

    fn group(&mut self) -> usize {
        self.next_group += 1;
        self.next_group - 1
    }

    fn seq(&mut self) {
        let bb = self.bufs;
        let g = self.group();
        let comm = self.compute_streams;
        for r in 0..self.gpus() {
            match self.p.op {
                Op::AgGemm => {
                    let op = NcclOp::AllGather {
                        send: self.whole(bb.a),
                        recv: self.whole(bb.work),
                    };
                    let t = self.nccl(g, r, comm, "all-gather".into(), op, vec![]);
                    self.gemm(
                        r,
                        "gemm".into(),
                        self.whole(bb.work),
                        self.whole(bb.out),
                        vec![t],
                    );
                }
                Op::GemmRs => {
                    let t = self.gemm(
                        r,
                        "gemm".into(),
                        self.whole(bb.a),
                        self.whole(bb.work),
                        vec![],
                    );
                    let op = NcclOp::ReduceScatter {
                        send: self.whole(bb.work),
                        recv: self.whole(bb.out),
                    };
                    self.nccl(g, r, comm, "reduce-scatter".into(), op, vec![t]);
                }
                Op::GemmAr => {
                    let out = self.whole(bb.out);
                    let t = self.gemm(r, "gemm".into(), self.whole(bb.a), out, vec![]);
                    let op = NcclOp::AllReduce {
                        send: out,
                        recv: out,
                    };
                    self.nccl(g, r, comm, "all-reduce".into(), op, vec![t]);
                }
                Op::Concurrent | Op::A2aGemm | Op::GemmA2a => {}
            }
        }
    }

    /// Peer order of step s for rank r: receive from / push to (r + s) mod P.
    fn peer(&self, r: usize, s: usize) -> usize {
        (r + s) % self.gpus()
    }

    /// (step, chunk) pairs in the schedule's order: ring is peer-major, all is chunk-major.
    fn steps(&self) -> Vec<(usize, usize)> {
        let (p, c) = (self.gpus(), self.chunks());
        match self.s.order {
            Order::Ring => (1..p).flat_map(|s| (0..c).map(move |j| (s, j))).collect(),
            Order::All => (0..c).flat_map(|j| (1..p).map(move |s| (s, j))).collect(),
        }
    }

    fn local_ag_gemm(&mut self, r: usize) {
        let bb = self.bufs;
        let (sr, a) = (self.shard(), self.whole(bb.a));
        let c = self.view(bb.out, r * sr, sr);
        self.gemm(r, "gemm local".into(), a, c, vec![]);
    }

    /// ag-gemm on the copy engines: at step s rank q pushes chunk j of its
    /// shard into the gathered A of rank (q - s) mod P, so each rank receives
    /// from (r + s) mod P at step s; the receiver's GEMM of that chunk waits
    /// for the push (a flag). Pushes, not pulls: at P = 4, copy-engine pulls
    /// from peers issued directly (not from a CUDA graph) stalled in most
    /// runs on H100 while pushes never did (`docs/signals.md`).
    fn ag_copy(&mut self) {
        let bb = self.bufs;
        let (p, sr, h) = (self.gpus(), self.shard(), self.chunk());
        for r in 0..p {
            self.local_ag_gemm(r);
        }
        // pushed[r][(s, j)]: the push that brings rank r chunk j of (r + s) mod P.
        let mut pushed = vec![std::collections::HashMap::new(); p];
        for q in 0..p {
            for (s, j) in self.steps() {
                let r = (q + p - s) % p;
                let src = RankView {
                    rank: q,
                    view: self.view(bb.a, j * h, h),
                };
                let dst = RankView {
                    rank: r,
                    view: self.view(bb.work, q * sr + j * h, h),
                };
                let cs = self.comm_stream(s);
                let t = self.push(
                    q,
                    cs,
                    format!("push r{r}.c{j}"),
                    TaskKind::Copy { src, dst },
                    vec![],
                );
                pushed[r].insert((s, j), t);
            }
        }
        for (r, pushed) in pushed.iter().enumerate() {
            let mut arrived = vec![];
            for (s, j) in self.steps() {
                let q = self.peer(r, s);
                let t = pushed[&(s, j)];
                let dst_view = self.view(bb.work, q * sr + j * h, h);
                if self.bulk() {
                    arrived.push((dst_view.row, t));
                } else {
                    let out = self.view(bb.out, q * sr + j * h, h);
                    self.gemm(r, format!("gemm q{q}.c{j}"), dst_view, out, vec![t]);
                }
            }
            self.bulk_ag_gemms(r, &arrived);
        }
    }

    fn bulk(&self) -> bool {
        self.s.granularity == Granularity::Bulk
    }

    /// Row ranges of every peer shard of rank r, as at most two contiguous
    /// blocks: the rows after r's shard first (the ring's first peers), then before.
    fn peer_blocks(&self, r: usize) -> Vec<(usize, usize)> {
        let (sr, m) = (self.shard(), self.p.m);
        [((r + 1) * sr, m), (0, r * sr)]
            .into_iter()
            .filter(|(a, b)| a < b)
            .map(|(a, b)| (a, b - a))
            .collect()
    }

    /// ag-gemm, bulk: one GEMM per peer block, after every transfer into it.
    fn bulk_ag_gemms(&mut self, r: usize, arrived: &[(usize, TaskId)]) {
        if !self.bulk() {
            return;
        }
        let bb = self.bufs;
        for (row, rows) in self.peer_blocks(r) {
            let deps = arrived
                .iter()
                .filter(|(at, _)| (row..row + rows).contains(at))
                .map(|&(_, t)| t)
                .collect();
            let a = self.view(bb.work, row, rows);
            let c = self.view(bb.out, row, rows);
            self.gemm(r, format!("gemm rows{row}+{rows}"), a, c, deps);
        }
    }

    // Rank indices address per-rank tables and self at once.
    #[allow(clippy::needless_range_loop)]
    fn ag_nccl(&mut self) {
        let bb = self.bufs;
        let (p, sr, h, c) = (self.gpus(), self.shard(), self.chunk(), self.chunks());
        let comm = self.comm_stream(1);
        for r in 0..p {
            self.local_ag_gemm(r);
        }
        // One rendezvous per ring step and chunk, or per chunk with every peer.
        let rounds: Vec<Vec<(usize, usize)>> = match self.s.order {
            Order::Ring => self.steps().into_iter().map(|sj| vec![sj]).collect(),
            Order::All => (0..c).map(|j| (1..p).map(|s| (s, j)).collect()).collect(),
        };
        let mut arrived: Vec<Vec<(usize, TaskId)>> = vec![vec![]; p];
        for round in rounds {
            let g = self.group();
            for r in 0..p {
                let mut sends = vec![];
                let mut recvs = vec![];
                for &(s, j) in &round {
                    sends.push(((r + p - s) % p, self.view(bb.a, j * h, h)));
                    let q = self.peer(r, s);
                    recvs.push((q, self.view(bb.work, q * sr + j * h, h)));
                }
                let label = match round.as_slice() {
                    [(s, j)] => format!("send-recv s{s}.c{j}"),
                    _ => format!("send-recv all.c{}", round[0].1),
                };
                let t = self.nccl(
                    g,
                    r,
                    comm,
                    label,
                    NcclOp::SendRecv {
                        sends,
                        recvs: recvs.clone(),
                    },
                    vec![],
                );
                for (q, v) in recvs {
                    if self.bulk() {
                        arrived[r].push((v.row, t));
                        continue;
                    }
                    let j = (v.row - q * sr) / h;
                    let out = self.view(bb.out, v.row, h);
                    self.gemm(r, format!("gemm q{q}.c{j}"), v, out, vec![t]);
                }
            }
        }
        for (r, arrived) in arrived.iter().enumerate() {
            self.bulk_ag_gemms(r, arrived);
        }
    }

    /// gemm-rs (any engine except nccl-all) and gemm-ar over copy engines:
    /// partials for each peer are sent pairwise, then reduced per chunk.
    /// Rows of rank r's output that hold its own block's chunk j.
    fn own_out(&self, r: usize, j: usize) -> View {
        let (sr, h) = (self.shard(), self.chunk());
        let row = if self.p.op == Op::GemmRs {
            j * h
        } else {
            r * sr + j * h
        };
        self.view(self.bufs.out, row, h)
    }

    /// Where rank `r` receives chunk j of peer `from`'s partial: its recv
    /// slot, or, with a fused reduce on two GPUs, straight into the output
    /// (the own GEMM then adds its partial there).
    fn landing(&self, r: usize, from: usize, j: usize) -> View {
        let (sr, h) = (self.shard(), self.chunk());
        if self.s.fused_reduce && self.gpus() == 2 {
            self.own_out(r, j)
        } else {
            self.view(self.bufs.recv, from * sr + j * h, h)
        }
    }

    // Rank and chunk indices address several per-rank tables at once.
    #[allow(clippy::needless_range_loop)]
    fn rs_pairwise(&mut self) {
        let bb = self.bufs;
        let (p, sr, h, c) = (self.gpus(), self.shard(), self.chunk(), self.chunks());
        let copy = self.s.engine == Engine::Copy;
        // arrivals[r][j]: tasks that deliver chunk j of some peer's partial into r's recv.
        let mut arrivals: Vec<Vec<Vec<TaskId>>> = vec![vec![vec![]; c]; p];
        let steps = self.steps();
        // bulk: every peer's partial first, in at most two GEMMs.
        let mut bulk: Vec<Vec<(usize, usize, TaskId)>> = vec![vec![]; p];
        if self.bulk() {
            for (r, blocks) in bulk.iter_mut().enumerate() {
                for (row, rows) in self.peer_blocks(r) {
                    let a = self.view(bb.a, row, rows);
                    let part = self.view(bb.work, row, rows);
                    let t = self.gemm(r, format!("gemm rows{row}+{rows}"), a, part, vec![]);
                    blocks.push((row, rows, t));
                }
            }
        }
        for &(s, j) in &steps {
            let g = (!copy).then(|| self.group());
            for r in 0..p {
                let d = self.peer(r, s);
                let part = self.view(bb.work, d * sr + j * h, h);
                let covering = bulk[r]
                    .iter()
                    .find(|(row, rows, _)| (*row..row + rows).contains(&(d * sr)))
                    .map(|&(_, _, t)| t);
                let gm = match covering {
                    Some(t) => t,
                    None => {
                        let a = self.view(bb.a, d * sr + j * h, h);
                        self.gemm(r, format!("gemm d{d}.c{j}"), a, part, vec![])
                    }
                };
                let cs = self.comm_stream(s);
                if let Some(g) = g {
                    let from = (r + p - s) % p;
                    let op = NcclOp::SendRecv {
                        sends: vec![(d, part)],
                        recvs: vec![(from, self.landing(r, from, j))],
                    };
                    let t = self.nccl(g, r, cs, format!("send-recv s{s}.c{j}"), op, vec![gm]);
                    arrivals[r][j].push(t);
                } else {
                    let dst = RankView {
                        rank: d,
                        view: self.landing(d, r, j),
                    };
                    let src = RankView {
                        rank: r,
                        view: part,
                    };
                    let t = self.push(
                        r,
                        cs,
                        format!("push d{d}.c{j}"),
                        TaskKind::Copy { src, dst },
                        vec![gm],
                    );
                    arrivals[d][j].push(t);
                }
            }
        }
        let reduce_stream = self.reduce_stream.unwrap_or(0);
        // finals[r][j]: the task after which r's output chunk j is complete.
        let mut finals = vec![vec![]; p];
        for r in 0..p {
            for j in 0..c {
                let a = self.view(bb.a, r * sr + j * h, h);
                let out = self.own_out(r, j);
                if self.s.fused_reduce {
                    // Peers' partials first (summed by a reduce when there are
                    // several, else they landed in the output), then the own
                    // partial added by the GEMM epilogue.
                    let mut deps = arrivals[r][j].clone();
                    if p > 2 {
                        let srcs = (0..p)
                            .filter(|&q| q != r)
                            .map(|q| self.view(bb.recv, q * sr + j * h, h))
                            .collect();
                        let kind = TaskKind::Reduce { srcs, dst: out };
                        deps =
                            vec![self.push(r, reduce_stream, format!("reduce c{j}"), kind, deps)];
                    }
                    let t = self.gemm_into(r, format!("gemm own.c{j} +="), a, out, true, deps);
                    finals[r].push((t, out));
                } else {
                    let own = self.view(bb.recv, r * sr + j * h, h);
                    let t = self.gemm(r, format!("gemm own.c{j}"), a, own, vec![]);
                    arrivals[r][j].push(t);
                }
            }
        }
        if !self.s.fused_reduce {
            for r in 0..p {
                for j in 0..c {
                    let srcs = (0..p)
                        .map(|q| self.view(bb.recv, q * sr + j * h, h))
                        .collect();
                    let dst = self.own_out(r, j);
                    let deps = arrivals[r][j].clone();
                    let kind = TaskKind::Reduce { srcs, dst };
                    let t = self.push(r, reduce_stream, format!("reduce c{j}"), kind, deps);
                    finals[r].push((t, dst));
                }
            }
        }
        let reduced = finals;
        if self.p.op == Op::GemmAr {
            // All-gather phase: push each reduced chunk into every peer's output.
            for r in 0..p {
                for (s, j) in self.steps() {
                    let d = self.peer(r, s);
                    let (t, view) = reduced[r][j];
                    let src = RankView { rank: r, view };
                    let dst = RankView { rank: d, view };
                    let cs = self.comm_stream(s);
                    self.push(
                        r,
                        cs,
                        format!("bcast d{d}.c{j}"),
                        TaskKind::Copy { src, dst },
                        vec![t],
                    );
                }
            }
        }
    }

    /// gemm-rs over NCCL, order all: chunk j of every block goes into a
    /// chunk-major slab that one reduce-scatter sums.
    fn rs_nccl_all(&mut self) {
        let bb = self.bufs;
        let (p, sr, h, c) = (self.gpus(), self.shard(), self.chunk(), self.chunks());
        let comm = self.comm_stream(1);
        for j in 0..c {
            let g = self.group();
            for r in 0..p {
                let slab = self.view(bb.work, j * p * h, p * h);
                let mut deps = vec![];
                // Own block last, so peers' blocks are ready first.
                for s in 1..=p {
                    let d = self.peer(r, s);
                    let a = self.view(bb.a, d * sr + j * h, h);
                    let part = self.view(bb.work, j * p * h + d * h, h);
                    deps.push(self.gemm(r, format!("gemm d{d}.c{j}"), a, part, vec![]));
                }
                let op = NcclOp::ReduceScatter {
                    send: slab,
                    recv: self.view(bb.out, j * h, h),
                };
                self.nccl(g, r, comm, format!("reduce-scatter c{j}"), op, deps);
            }
        }
    }

    /// gemm-ar over NCCL: all-reduce each chunk in place once its GEMM is done.
    fn ar_nccl(&mut self) {
        let bb = self.bufs;
        let (p, h) = (self.gpus(), self.chunk());
        let comm = self.comm_stream(1);
        for i in 0..p * self.chunks() {
            let g = self.group();
            for r in 0..p {
                let a = self.view(bb.a, i * h, h);
                let out = self.view(bb.out, i * h, h);
                let t = self.gemm(r, format!("gemm c{i}"), a, out, vec![]);
                let op = NcclOp::AllReduce {
                    send: out,
                    recv: out,
                };
                self.nccl(g, r, comm, format!("all-reduce c{i}"), op, vec![t]);
            }
        }
    }
}
