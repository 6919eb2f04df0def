//! Lowering: a schedule of a problem becomes a plan per rank.
//!
//! Every lowering splits M only (rows of A, C and the output), so every view
//! is a block of full rows and every transfer is contiguous. With P ranks,
//! R = M/P rows per shard and c chunks per shard, a chunk is h = R/c rows.
//!
//! * `ag-gemm`: the local shard's GEMM runs first, straight from the input,
//!   while peers' chunks arrive in the gathered buffer `ag`; each arriving
//!   chunk gets its own GEMM. Each rank's copy engines push its shard to every peer.
//! * `gemm-rs`: each rank computes its partial for peer d's rows and sends it
//!   (copy engines push into d's `recv` slot for this rank), computes its own
//!   block last, then sums the P slots per chunk with a reduce kernel. NCCL
//!   with order `all` instead computes chunk j of every block into a
//!   chunk-major slab and reduce-scatters the slab.
//! * `gemm-ar`: NCCL all-reduces each chunk as soon as its GEMM is done; copy
//!   engines do gemm-rs's push + reduce and then push each reduced chunk to
//!   every peer.
//! * `tile` (any of the three): one persistent GEMM per rank whose row
//!   blocks are gated and drained by device flags (`tile.rs`).
//! * `a2a-gemm` / `gemm-a2a` (expert parallelism, see `moe`): blocks of
//!   routed rows of variable size go to (or come back from) their experts'
//!   ranks, and each rank's experts run as grouped GEMMs over the blocks
//!   that have arrived (or before their blocks leave).
//!
//! Tasks are created step by step for all ranks at once, so a dependency on
//! another rank always names a task created earlier: issuing tasks in plan
//! order on every rank can never wait for a task that is issued later.

mod concurrent;
mod dependent;
mod moe;
mod parts;
pub mod probe;
mod tile;

pub use crate::space::TILE_BLOCK_ROWS;
/// The name of ag-gemm's gathered-A buffer (`[m, k]`; a rank's own shard
/// rows are filled only where the plan copies them there), which an
/// operator call may ask for ([`crate::plan::Buffer::name`]).
pub const GATHERED_A: &str = "ag";
pub use tile::{tile_chunks, TILE_MAX_CHUNKS, TILE_MIN_CHUNK_ROWS};

use crate::error::{Error, Result};
use crate::plan::{BufferRole, Plan, RankPlan, Resources, StreamRole, Task, TaskKind, View};
use crate::problem::workload::{Op, Problem};
use crate::space::{Priority, Schedule};

/// Lowers `schedule` for `problem`. Fails with `DoesNotFit` when the schedule cannot run the shape.
pub fn lower(problem: &Problem, schedule: &Schedule) -> Result<Plan> {
    problem.validate()?;
    if let Some(reason) = schedule.misfit(problem) {
        return Err(Error::DoesNotFit {
            schedule: schedule.name(),
            reason,
        });
    }
    if problem.op == Op::Concurrent {
        return Ok(concurrent::lower(problem, schedule));
    }
    if problem.op.is_moe() {
        return moe::lower(problem, schedule);
    }
    if schedule.granularity == crate::space::Granularity::Tile {
        return Ok(tile::lower(problem, schedule));
    }
    Ok(dependent::lower(problem, schedule))
}

/// The GEMM of the whole problem alone (T_comp): [M, K] x [K, N] on every rank.
pub fn gemm_only(problem: &Problem) -> Plan {
    if problem.op == Op::Concurrent {
        return concurrent::gemm_only(problem);
    }
    if problem.op.is_moe() {
        return moe::gemm_only(problem);
    }
    let (m, k, n) = (problem.m, problem.k, problem.n);
    let ranks = (0..problem.gpus)
        .map(|_| RankPlan {
            buffers: vec![
                buffer("a", BufferRole::InputA, m, k, false),
                buffer("b", BufferRole::InputB, k, n, false),
                buffer("c", BufferRole::Output, m, n, false),
            ],
            streams: vec![stream("compute0", StreamRole::Compute, Priority::Normal)],
            tasks: vec![Task {
                label: "gemm".into(),
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
            }],
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

/// The reference collective of the whole problem alone (T_comm), over NCCL.
pub fn comm_only(problem: &Problem) -> Plan {
    if problem.op.is_moe() {
        return moe::comm_only(problem);
    }
    let (m, r) = (problem.m, problem.shard_rows());
    let cols = match problem.op {
        Op::AgGemm => problem.k,
        Op::GemmRs | Op::GemmAr | Op::Concurrent | Op::A2aGemm | Op::GemmA2a => problem.n,
    };
    let (in_rows, out_rows) = match problem.op {
        Op::AgGemm => (r, m),
        Op::GemmRs => (m, r),
        Op::GemmAr => (m, m),
        Op::Concurrent | Op::A2aGemm | Op::GemmA2a => problem.side_rows(),
    };
    let send = View::whole(0, in_rows, cols);
    let recv = View::whole(1, out_rows, cols);
    let op = collective_op(problem.collective(), send, recv);
    let ranks = (0..problem.gpus)
        .map(|_| RankPlan {
            buffers: vec![
                buffer("in", BufferRole::InputA, in_rows, cols, false),
                buffer("out", BufferRole::Output, out_rows, cols, false),
            ],
            streams: vec![stream("comm", StreamRole::Comm, Priority::Normal)],
            tasks: vec![Task {
                label: op.short().into(),
                stream: 0,
                kind: TaskKind::Nccl {
                    group: 0,
                    op: op.clone(),
                },
                deps: vec![],
            }],
        })
        .collect();
    Plan {
        problem: *problem,
        name: "comm-only".into(),
        schedule: None,
        resources: Resources::default(),
        ranks,
    }
}

pub(crate) use parts::{buffer, collective_op, stream};
