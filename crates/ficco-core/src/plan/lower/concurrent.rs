//! Lowering of the `concurrent` operator: `gemms` independent GEMMs on a
//! compute stream beside one collective on communication streams, on every
//! rank (data-parallel or FSDP gradient sync during backward).
//!
//! Every rank's output buffer holds the GEMM results (block g of M rows is
//! GEMM g) followed by the rank's part of the collective, so one buffer is
//! checked against [`crate::plan::interp::reference`]. The collective's buffers
//! are bf16 rows of N elements; with T rows in all and P ranks, a block is
//! B = T / P rows.
//!
//! * `seq`: the GEMMs, then the collective after the last one (back to back).
//! * `shard-nccl-ring`: one NCCL collective on its own stream, issued first
//!   so its kernel is resident before the GEMMs fill the SMs.
//! * `shard-copy-ring|all`: the collective on copy engines. all-gather pushes
//!   its block to every peer; reduce-scatter pushes block d of the input to rank
//!   d's receive slot, then a reduce kernel (high priority, on a
//!   communication stream) sums the P blocks; all-reduce is that
//!   reduce-scatter followed by pushing the reduced block to every peer.
//!   `ring` uses one copy stream (peers one after another, staggered per
//!   rank), `all` one stream per peer.
//!
//! Controls (`-own`, `-smN`, `-gcN`, `-occS`, `-ctaN`, `-hi`) become GEMM task
//! fields, stream priorities and the plan's [`Resources`].

use super::parts::{
    buffer, collective_op, compute_and_comm_streams, push_task, resources_of, stream,
};
use crate::plan::{
    BufferRole, Plan, RankPlan, RankView, Resources, StreamRole, StreamSpec, TaskId, TaskKind, View,
};
use crate::problem::workload::{Collective, Problem};
use crate::space::{Engine, Order, Priority, Schedule};

const A: usize = 0;
const B: usize = 1;
const X: usize = 2;
const OUT: usize = 3;
const RECV: usize = 4;

/// Lowers a fitting schedule (checked by the caller) of a `concurrent` problem.
pub(crate) fn lower(p: &Problem, s: &Schedule) -> Plan {
    let copy = s.engine == Engine::Copy && !s.is_seq();
    let coll = p.collective();
    let reduces = copy && coll != Collective::AllGather;
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
    let mut streams = compute_and_comm_streams(1, comm_streams, prio);
    if reduces {
        // The reduce is part of the collective: it runs beside the GEMMs
        // (communication side of a green split) and first when SMs free up.
        streams.push(stream("reduce", StreamRole::Comm, Priority::High));
    }
    let mut plan = skeleton(p, streams, copy, reduces);
    plan.name = s.name();
    plan.schedule = Some(*s);
    plan.resources = resources_of(s);
    let g = p.gemm_count();
    let comm = 1;
    if s.is_seq() {
        let last = push_gemms(&mut plan, p, s, vec![]);
        for r in 0..p.gpus {
            let deps = last.iter().filter(|t| t.rank == r).copied().collect();
            push_nccl(&mut plan, p, r, comm, deps);
        }
    } else if !copy {
        for r in 0..p.gpus {
            push_nccl(&mut plan, p, r, comm, vec![]);
        }
        push_gemms(&mut plan, p, s, vec![]);
    } else {
        copy_collective(&mut plan, p, comm_streams);
        push_gemms(&mut plan, p, s, vec![]);
    }
    debug_assert_eq!(plan.ranks[0].buffers[OUT].rows, g * p.m + p.side_rows().1);
    plan
}

/// The GEMMs alone (T_comp).
pub(crate) fn gemm_only(p: &Problem) -> Plan {
    let streams = vec![stream("compute0", StreamRole::Compute, Priority::Normal)];
    let mut plan = skeleton(p, streams, false, false);
    plan.name = "gemm-only".into();
    // Only the GEMM results: no collective buffers.
    for rp in &mut plan.ranks {
        rp.buffers.truncate(OUT + 1);
        rp.buffers[X].rows = 0;
        rp.buffers[OUT].rows = p.gemm_count() * p.m;
    }
    push_gemms(&mut plan, p, &Schedule::SEQ, vec![]);
    plan
}

fn skeleton(p: &Problem, streams: Vec<StreamSpec>, copy: bool, reduces: bool) -> Plan {
    let (in_rows, out_rows) = p.side_rows();
    let g = p.gemm_count();
    // Every copy collective pushes (peers write `out` or `recv`, never read `x`).
    let peers_write_out = copy && p.collective() != Collective::ReduceScatter;
    let mut buffers = vec![
        buffer("a", BufferRole::InputA, p.m, p.k, false),
        buffer("b", BufferRole::InputB, p.k, p.n, false),
        buffer("x", BufferRole::InputX, in_rows, p.n, false),
        buffer(
            "out",
            BufferRole::Output,
            g * p.m + out_rows,
            p.n,
            peers_write_out,
        ),
    ];
    if reduces {
        buffers.push(buffer("recv", BufferRole::Scratch, in_rows, p.n, true));
    }
    let ranks = (0..p.gpus)
        .map(|_| RankPlan {
            buffers: buffers.clone(),
            streams: streams.clone(),
            tasks: vec![],
        })
        .collect();
    Plan {
        problem: *p,
        name: String::new(),
        schedule: None,
        resources: Resources::default(),
        ranks,
    }
}

fn view(plan: &Plan, buf: usize, row: usize, rows: usize) -> View {
    View {
        buf,
        row,
        col: 0,
        rows,
        cols: plan.ranks[0].buffers[buf].cols,
    }
}

fn push(
    plan: &mut Plan,
    rank: usize,
    stream: usize,
    label: String,
    kind: TaskKind,
    deps: Vec<TaskId>,
) -> TaskId {
    push_task(&mut plan.ranks, rank, stream, label, kind, deps)
}

/// Every rank's GEMMs on stream 0; returns each rank's last GEMM.
fn push_gemms(plan: &mut Plan, p: &Problem, s: &Schedule, deps: Vec<TaskId>) -> Vec<TaskId> {
    let mut last = vec![];
    for r in 0..p.gpus {
        let mut t = None;
        for i in 0..p.gemm_count() {
            let kind = TaskKind::Gemm {
                a: View::whole(A, p.m, p.k),
                b: View::whole(B, p.k, p.n),
                c: view(plan, OUT, i * p.m, p.m),
                sm_target: s.gemm_sm_target(),
                accumulate: false,
                occupancy: s.occupancy,
            };
            t = Some(push(plan, r, 0, format!("gemm {i}"), kind, deps.clone()));
        }
        last.extend(t);
    }
    last
}

fn push_nccl(plan: &mut Plan, p: &Problem, r: usize, stream: usize, deps: Vec<TaskId>) -> TaskId {
    let (in_rows, out_rows) = p.side_rows();
    let send = view(plan, X, 0, in_rows);
    let recv = view(plan, OUT, p.gemm_count() * p.m, out_rows);
    let op = collective_op(p.collective(), send, recv);
    let label = op.short().to_string();
    push(
        plan,
        r,
        stream,
        label,
        TaskKind::Nccl { group: 0, op },
        deps,
    )
}

/// The collective on copy engines (see the module doc).
// Rank and peer indices address per-rank tables of several kinds.
#[allow(clippy::needless_range_loop)]
fn copy_collective(plan: &mut Plan, p: &Problem, comm_streams: usize) {
    let n = p.gpus;
    let (in_rows, _) = p.side_rows();
    let base = p.gemm_count() * p.m;
    let stream_of = |step: usize| 1 + if comm_streams == 1 { 0 } else { step - 1 };
    let copy = |plan: &mut Plan,
                r: usize,
                step: usize,
                label: String,
                src: RankView,
                dst: RankView,
                deps: Vec<TaskId>| {
        push(
            plan,
            r,
            stream_of(step),
            label,
            TaskKind::Copy { src, dst },
            deps,
        )
    };
    let rv = |rank: usize, view: View| RankView { rank, view };
    match p.collective() {
        Collective::AllGather => {
            // x is one block [B, n]; out holds P blocks after the GEMM results.
            for r in 0..n {
                let own = view(plan, OUT, base + r * in_rows, in_rows);
                let x = view(plan, X, 0, in_rows);
                copy(plan, r, 1, "copy own".into(), rv(r, x), rv(r, own), vec![]);
            }
            // At step s rank q pushes x to rank (q - s) mod P: each rank
            // receives from (r + s) mod P (pushes, not pulls: see
            // `docs/signals.md`).
            for step in 1..n {
                for q in 0..n {
                    let r = (q + n - step) % n;
                    let src = view(plan, X, 0, in_rows);
                    let dst = view(plan, OUT, base + q * in_rows, in_rows);
                    copy(
                        plan,
                        q,
                        step,
                        format!("push d{r}"),
                        rv(q, src),
                        rv(r, dst),
                        vec![],
                    );
                }
            }
        }
        Collective::ReduceScatter | Collective::AllReduce => {
            let ar = p.collective() == Collective::AllReduce;
            let blk = in_rows / n;
            let mut arrivals: Vec<Vec<TaskId>> = vec![vec![]; n];
            for step in 1..n {
                for r in 0..n {
                    let d = (r + step) % n;
                    let src = view(plan, X, d * blk, blk);
                    let dst = view(plan, RECV, r * blk, blk);
                    let t = copy(
                        plan,
                        r,
                        step,
                        format!("push d{d}"),
                        rv(r, src),
                        rv(d, dst),
                        vec![],
                    );
                    arrivals[d].push(t);
                }
            }
            let reduce_stream = 1 + comm_streams;
            let mut reduced = vec![];
            for r in 0..n {
                let srcs = (0..n)
                    .map(|q| {
                        if q == r {
                            view(plan, X, r * blk, blk)
                        } else {
                            view(plan, RECV, q * blk, blk)
                        }
                    })
                    .collect();
                let dst = view(plan, OUT, base + if ar { r * blk } else { 0 }, blk);
                let t = push(
                    plan,
                    r,
                    reduce_stream,
                    "reduce".into(),
                    TaskKind::Reduce { srcs, dst },
                    arrivals[r].clone(),
                );
                reduced.push((t, dst));
            }
            if ar {
                for step in 1..n {
                    for r in 0..n {
                        let d = (r + step) % n;
                        let (t, v) = reduced[r];
                        copy(
                            plan,
                            r,
                            step,
                            format!("bcast d{d}"),
                            rv(r, v),
                            rv(d, v),
                            vec![t],
                        );
                    }
                }
            }
        }
    }
}
