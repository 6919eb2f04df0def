//! The `tile` lowering: one persistent GEMM launch per rank
//! ([`TaskKind::TileGemm`]) for the whole operator, fed (ag-gemm) or drained
//! (gemm-rs, gemm-ar) by copy engines, every hand-over a flag in device
//! memory. With P ranks, R = M/P rows per shard cut into c chunks of h rows
//! ([`tile_chunks`]), the GEMM's row blocks are the chunks: block `q·c + j`
//! holds chunk j of shard q (rows q·R + j·h ..).
//!
//! * **ag-gemm.** Each rank copies its own shard into the gathered A on a
//!   `local` stream and pushes its shard to its peers on the comm stream(s)
//!   (ring: rank r receives from peer r+1 first, one peer at a time; all: a
//!   stream per peer), each chunk followed by a Signal of its block's flag
//!   on the receiving rank. One tile
//!   GEMM over the gathered A waits per block on that flag and takes blocks
//!   from its own shard on (the own shard lands first, then the peers in
//!   ring order: the kernel's rotated M order). The GEMM is launched only
//!   after the own shard's copies (a dependency, not only their flags): a
//!   copy within one GPU runs on SMs, which the persistent GEMM's spinning
//!   CTAs can hold (measured: it then never runs; see `docs/signals.md` and
//!   [`crate::plan::spin`]). The pushes from peers run on their copy
//!   engines, so the GEMM may wait for them in flight.
//! * **gemm-rs.** One tile GEMM computes every rank's partial into `part`,
//!   starting with the block of peer r+1 (served first) and ending with the
//!   own block; each block's counter is flag `b`. A comm stream waits on the
//!   counter of each (peer, chunk) and pushes it into the peer's `recv` slot,
//!   then signals the peer's arrival flag `B + r·c + j` (B = P·c). The owner
//!   reduces chunk j on its reduce stream once its own block and every
//!   peer's chunk j have arrived. With `-acc` (2 GPUs only) the peer's chunk
//!   lands straight in the output, and the own block's tiles wait for it
//!   (flag `B + b`) and add into it in the epilogue (destination hook);
//!   the peer blocks' wait flags are set before the launch.
//! * **gemm-ar.** gemm-rs's form into the full output, then each reduced
//!   chunk is pushed to every peer as soon as it is done (after its reduce
//!   kernel, or with `-acc` after its block's counter).
//!
//! Why not `-acc` on more than 2 GPUs: the own block would wait for a reduce
//! kernel of the peers' partials, and the persistent GEMM's waiting CTAs
//! hold every SM that kernel needs.

use super::parts::{buffer, compute_and_comm_streams, push_task, resources_of, stream};
use crate::plan::{
    BufferRole, Plan, RankPlan, RankView, StreamRole, TaskId, TaskKind, TileGemm, View,
};
use crate::problem::workload::{Op, Problem};
use crate::space::{Order, Priority, Schedule, TILE_BLOCK_ROWS};

/// Fewest rows of a `tile` chunk: 512 rows are 8 MiB of bf16 at K or N =
/// 8192, about 21 µs on one copy engine, so the copy's fixed cost (7-12 µs
/// on H200) does not dominate the chunk.
pub const TILE_MIN_CHUNK_ROWS: usize = 512;

/// Most chunks per shard of `tile`.
pub const TILE_MAX_CHUNKS: usize = 8;

/// Chunks per shard of `tile` for `problem`: the most of 8, 4, 2 whose
/// chunks are whole GEMM blocks of at least [`TILE_MIN_CHUNK_ROWS`] rows,
/// else 1 (one flag per shard).
pub fn tile_chunks(problem: &Problem) -> usize {
    let r = problem.shard_rows();
    [TILE_MAX_CHUNKS, 4, 2]
        .into_iter()
        .find(|&c| r % (c * TILE_BLOCK_ROWS) == 0 && r / c >= TILE_MIN_CHUNK_ROWS)
        .unwrap_or(1)
}

struct Tiler {
    p: Problem,
    s: Schedule,
    ranks: Vec<RankPlan>,
    /// Chunks per shard and rows per chunk.
    c: usize,
    h: usize,
    comm_streams: usize,
}

const COMPUTE: usize = 0;

/// Lowers a `tile` schedule (fit already checked).
pub(super) fn lower(problem: &Problem, schedule: &Schedule) -> Plan {
    let mut t = Tiler::new(problem, schedule);
    match problem.op {
        Op::AgGemm => t.ag(),
        Op::GemmRs | Op::GemmAr => t.rs(),
        // Never lowered here (`tile` applies to neither `concurrent` nor the
        // expert-parallel operators).
        Op::Concurrent | Op::A2aGemm | Op::GemmA2a => {}
    }
    Plan {
        problem: *problem,
        name: schedule.name(),
        schedule: Some(*schedule),
        resources: resources_of(schedule),
        ranks: t.ranks,
    }
}

impl Tiler {
    fn new(p: &Problem, s: &Schedule) -> Self {
        let (m, k, n, r) = (p.m, p.k, p.n, p.shard_rows());
        let c = tile_chunks(p);
        let comm_streams = if s.order == Order::All { p.gpus - 1 } else { 1 };
        let mut streams = compute_and_comm_streams(1, comm_streams, s.comm_priority);
        let acc = s.fused_reduce;
        let buffers = match p.op {
            Op::AgGemm => {
                streams.push(stream("local", StreamRole::Comm, s.comm_priority));
                vec![
                    buffer("a", BufferRole::InputA, r, k, false),
                    buffer("b", BufferRole::InputB, k, n, false),
                    buffer("c", BufferRole::Output, m, n, false),
                    buffer(super::GATHERED_A, BufferRole::Scratch, m, k, true),
                ]
            }
            _ => {
                let out_rows = if p.op == Op::GemmRs { r } else { m };
                let mut v = vec![
                    buffer("a", BufferRole::InputA, m, k, false),
                    buffer("b", BufferRole::InputB, k, n, false),
                    buffer(
                        "out",
                        BufferRole::Output,
                        out_rows,
                        n,
                        acc || p.op == Op::GemmAr,
                    ),
                    buffer("part", BufferRole::Scratch, m, n, false),
                ];
                if !acc {
                    // Reduces gate the broadcast and the plan's tail: high
                    // priority, as in the other lowerings.
                    streams.push(stream("reduce", StreamRole::Compute, Priority::High));
                    v.push(buffer("recv", BufferRole::Scratch, m, n, true));
                }
                v
            }
        };
        let ranks = (0..p.gpus)
            .map(|_| RankPlan {
                buffers: buffers.clone(),
                streams: streams.clone(),
                tasks: vec![],
            })
            .collect();
        Tiler {
            p: *p,
            s: *s,
            ranks,
            c,
            h: r / c,
            comm_streams,
        }
    }

    fn gpus(&self) -> usize {
        self.p.gpus
    }

    fn shard(&self) -> usize {
        self.p.shard_rows()
    }

    /// Blocks of the whole GEMM: P·c.
    fn blocks(&self) -> usize {
        self.gpus() * self.c
    }

    /// The block of chunk j of shard q.
    fn block(&self, q: usize, j: usize) -> usize {
        q * self.c + j
    }

    fn view(&self, buf: usize, row: usize, rows: usize) -> View {
        let b = &self.ranks[0].buffers[buf];
        View {
            buf,
            row,
            col: 0,
            rows,
            cols: b.cols,
        }
    }

    fn whole(&self, buf: usize) -> View {
        let b = &self.ranks[0].buffers[buf];
        View::whole(buf, b.rows, b.cols)
    }

    /// Rows of shard q's chunk j in a full-height buffer.
    fn chunk(&self, buf: usize, q: usize, j: usize) -> View {
        self.view(buf, q * self.shard() + j * self.h, self.h)
    }

    fn peer(&self, r: usize, s: usize) -> usize {
        (r + s) % self.gpus()
    }

    /// (peer offset, chunk) in the order's sequence: ring is peer-major,
    /// all chunk-major (each peer offset on its own stream).
    fn steps(&self) -> Vec<(usize, usize)> {
        let (p, c) = (self.gpus(), self.c);
        match self.s.order {
            Order::Ring => (1..p).flat_map(|s| (0..c).map(move |j| (s, j))).collect(),
            Order::All => (0..c).flat_map(|j| (1..p).map(move |s| (s, j))).collect(),
        }
    }

    fn comm_stream(&self, s: usize) -> usize {
        1 + if self.comm_streams == 1 { 0 } else { s - 1 }
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

    fn signal(
        &mut self,
        rank: usize,
        stream: usize,
        to_rank: usize,
        flag: usize,
        what: &str,
    ) -> TaskId {
        self.push(
            rank,
            stream,
            format!("signal r{to_rank}.f{flag} {what}"),
            TaskKind::Signal { to_rank, flag },
            vec![],
        )
    }

    fn wait(&mut self, rank: usize, stream: usize, flag: usize, what: &str) {
        self.push(
            rank,
            stream,
            format!("wait f{flag} {what}"),
            TaskKind::Wait { flag },
            vec![],
        );
    }

    fn copy(&mut self, rank: usize, stream: usize, label: String, src: RankView, dst: RankView) {
        self.push(rank, stream, label, TaskKind::Copy { src, dst }, vec![]);
    }

    fn tile_gemm(&mut self, rank: usize, label: &str, deps: Vec<TaskId>, g: TileGemm) {
        self.push(
            rank,
            COMPUTE,
            label.to_string(),
            TaskKind::TileGemm(g),
            deps,
        );
    }

    /// ag-gemm: flags 0..B are the blocks' arrival flags. Each rank copies
    /// its own shard and launches its GEMM, then pushes its shard to every
    /// peer and sets the peer's arrival flag (pushes, not pulls: see
    /// `Builder::ag_copy` in `dependent.rs`).
    fn ag(&mut self) {
        let (a, b, out, ag) = (0, 1, 2, 3);
        let local = self.comm_streams + 1;
        let p = self.gpus();
        for q in 0..p {
            let mut own_done = vec![];
            for j in 0..self.c {
                let src = RankView {
                    rank: q,
                    view: self.view(a, j * self.h, self.h),
                };
                let dst = RankView {
                    rank: q,
                    view: self.chunk(ag, q, j),
                };
                self.copy(q, local, format!("own c{j}"), src, dst);
                let f = self.block(q, j);
                own_done = vec![self.signal(q, local, q, f, &format!("< own c{j}"))];
            }
            self.tile_gemm(
                q,
                "tile-gemm",
                own_done,
                TileGemm {
                    a: self.whole(ag),
                    b: self.whole(b),
                    c: self.whole(out),
                    block_rows: self.h,
                    first_block: self.block(q, 0),
                    wait: Some(0),
                    signal: None,
                    dest: vec![],
                    dest_add: false,
                    sm_target: self.s.gemm_sm_target(),
                },
            );
            for (s, j) in self.steps() {
                let r = (q + p - s) % p;
                let cs = self.comm_stream(s);
                let src = RankView {
                    rank: q,
                    view: self.view(a, j * self.h, self.h),
                };
                let dst = RankView {
                    rank: r,
                    view: self.chunk(ag, q, j),
                };
                self.copy(q, cs, format!("push r{r}.c{j}"), src, dst);
                let f = self.block(q, j);
                self.signal(q, cs, r, f, &format!("< push r{r}.c{j}"));
            }
        }
    }

    /// Rows of rank r's output that hold its reduced chunk j.
    fn own_out(&self, r: usize, j: usize) -> View {
        let out = 2;
        if self.p.op == Op::GemmRs {
            self.view(out, j * self.h, self.h)
        } else {
            self.chunk(out, r, j)
        }
    }

    // Rank indices address per-rank tables and self at once.
    #[allow(clippy::needless_range_loop)]
    /// gemm-rs and gemm-ar: flags 0..B are the blocks' counters; B.. are
    /// arrival flags (`B + q·c + j`: chunk j from rank q, or with `-acc` the
    /// wait flag of block `q·c + j`).
    fn rs(&mut self) {
        let (a, b, part, recv) = (0, 1, 3, 4);
        let (p, c, big) = (self.gpus(), self.c, self.blocks());
        let acc = self.s.fused_reduce;
        let reduce_stream = self.comm_streams + 1;
        for r in 0..p {
            let d1 = self.peer(r, 1);
            let mut dest = vec![];
            if acc {
                // Peer blocks need nothing: their wait flags are set before the launch.
                for q in (0..p).filter(|&q| q != r) {
                    for j in 0..c {
                        let f = big + self.block(q, j);
                        self.signal(r, COMPUTE, r, f, &format!("< ready d{q}.c{j}"));
                    }
                }
                dest = (0..big)
                    .map(|blk| (blk / c == r).then(|| self.own_out(r, blk % c)))
                    .collect();
            }
            self.tile_gemm(
                r,
                if acc { "tile-gemm +=" } else { "tile-gemm" },
                vec![],
                TileGemm {
                    a: self.whole(a),
                    b: self.whole(b),
                    c: self.whole(part),
                    block_rows: self.h,
                    first_block: self.block(d1, 0),
                    wait: acc.then_some(big),
                    signal: Some(0),
                    dest,
                    dest_add: acc,
                    sm_target: self.s.gemm_sm_target(),
                },
            );
            // Push each peer's chunk once its block is stored.
            for (s, j) in self.steps() {
                let d = self.peer(r, s);
                let cs = self.comm_stream(s);
                self.wait(r, cs, self.block(d, j), &format!("> push d{d}.c{j}"));
                let landing = if acc {
                    self.own_out(d, j)
                } else {
                    self.chunk(recv, r, j)
                };
                let src = RankView {
                    rank: r,
                    view: self.chunk(part, d, j),
                };
                let dst = RankView {
                    rank: d,
                    view: landing,
                };
                self.copy(r, cs, format!("push d{d}.c{j}"), src, dst);
                let f = big
                    + if acc {
                        self.block(d, j)
                    } else {
                        self.block(r, j)
                    };
                self.signal(r, cs, d, f, &format!("< push d{d}.c{j}"));
            }
        }
        // finals[r][j]: what completes rank r's reduced chunk j, for the
        // broadcast: a reduce task (an event), or with -acc the block's counter.
        let mut finals: Vec<Vec<Option<TaskId>>> = vec![vec![None; c]; p];
        if !acc {
            for (r, fin) in finals.iter_mut().enumerate() {
                for (j, slot) in fin.iter_mut().enumerate() {
                    let own = self.block(r, j);
                    self.wait(r, reduce_stream, own, &format!("> reduce c{j}"));
                    let mut srcs = vec![self.chunk(part, r, j)];
                    for s in 1..p {
                        let q = self.peer(r, s);
                        self.wait(
                            r,
                            reduce_stream,
                            big + self.block(q, j),
                            &format!("> reduce c{j}"),
                        );
                        srcs.push(self.chunk(recv, q, j));
                    }
                    let dst = self.own_out(r, j);
                    *slot = Some(self.push(
                        r,
                        reduce_stream,
                        format!("reduce c{j}"),
                        TaskKind::Reduce { srcs, dst },
                        vec![],
                    ));
                }
            }
        }
        if self.p.op != Op::GemmAr {
            return;
        }
        for r in 0..p {
            for (s, j) in self.steps() {
                let d = self.peer(r, s);
                let cs = self.comm_stream(s);
                let view = self.own_out(r, j);
                let deps = match finals[r][j] {
                    Some(t) => vec![t],
                    None => {
                        // -acc: the own block's counter.
                        self.wait(r, cs, self.block(r, j), &format!("> bcast d{d}.c{j}"));
                        vec![]
                    }
                };
                self.push(
                    r,
                    cs,
                    format!("bcast d{d}.c{j}"),
                    TaskKind::Copy {
                        src: RankView { rank: r, view },
                        dst: RankView { rank: d, view },
                    },
                    deps,
                );
            }
        }
    }
}
