//! The loopback form of a reference plan: NCCL refuses two ranks on one
//! GPU, so in loopback the sequential reference (and comm-only) run their
//! collectives as copy-engine copies plus ficco's reduce kernel, through the
//! same executor and signals as every other plan:
//!
//! * all-gather: rank r pulls every rank's `send` into its block of `recv`;
//! * reduce-scatter: rank r pulls block r of every peer's `send` into a
//!   scratch slab, then reduces the P blocks (in rank order) into `recv`;
//! * all-reduce: the same over the whole `send`; in place (`send == recv`)
//!   rank r's reduce also waits until every peer has pulled r's `send`.
//!
//! Every member of a collective waits for every member's dependencies (the
//! rendezvous NCCL gives). Sums run in rank order on every rank, so all-reduce
//! results agree bit for bit across ranks.

use crate::error::{CudaError, Result};
use ficco_core::plan::{Buffer, BufferRole, NcclOp, Plan, RankView, Task, TaskId, TaskKind, View};

/// `plan` with every collective replaced as described in the module doc.
/// Plans without NCCL tasks come back unchanged; grouped send/recv is refused.
pub fn copy_reference(plan: &Plan) -> Result<Plan> {
    let p = plan.ranks.len();
    // Pass 1: the new index of every old task's first and last replacement.
    let mut first = vec![];
    let mut last = vec![];
    let mut group_task: std::collections::HashMap<(usize, usize), usize> = Default::default();
    for (r, rp) in plan.ranks.iter().enumerate() {
        let (mut f, mut l) = (vec![], vec![]);
        let mut next = 0;
        for (i, t) in rp.tasks.iter().enumerate() {
            let n = match &t.kind {
                TaskKind::Nccl { group, op } => {
                    if matches!(op, NcclOp::SendRecv { .. }) {
                        return Err(CudaError::Skipped(
                            "grouped send/recv has no copy-engine reference (loopback)".into(),
                        ));
                    }
                    group_task.insert((r, *group), i);
                    // All-gather: P copies; the others: P-1 copies and a reduce.
                    p
                }
                _ => 1,
            };
            f.push(next);
            next += n;
            l.push(next - 1);
        }
        first.push(f);
        last.push(l);
    }
    let map = |d: &TaskId| TaskId {
        rank: d.rank,
        index: last[d.rank][d.index],
    };
    let member = |q: usize, g: usize| -> Result<&Task> {
        group_task
            .get(&(q, g))
            .map(|&i| &plan.ranks[q].tasks[i])
            .ok_or_else(|| CudaError::Plan(format!("rank {q} lacks NCCL group {g}")))
    };
    let mut out = plan.clone();
    for (r, rp) in plan.ranks.iter().enumerate() {
        let mut tasks = vec![];
        let mut buffers: Vec<Buffer> = rp.buffers.clone();
        for t in &rp.tasks {
            let deps: Vec<TaskId> = t.deps.iter().map(map).collect();
            let TaskKind::Nccl { group, op } = &t.kind else {
                tasks.push(Task { deps, ..t.clone() });
                continue;
            };
            // The rendezvous: every member's dependencies.
            let mut rdv: Vec<TaskId> = vec![];
            for q in 0..p {
                for d in &member(q, *group)?.deps {
                    let m = map(d);
                    if !rdv.contains(&m) {
                        rdv.push(m);
                    }
                }
            }
            let send_of = |q: usize| -> Result<View> {
                match &member(q, *group)?.kind {
                    TaskKind::Nccl {
                        op:
                            NcclOp::AllGather { send, .. }
                            | NcclOp::ReduceScatter { send, .. }
                            | NcclOp::AllReduce { send, .. },
                        ..
                    } => Ok(*send),
                    _ => Err(CudaError::Plan(format!("rank {q}: group {group} differs"))),
                }
            };
            let copy = |label: String, src: RankView, dst: View, deps: Vec<TaskId>| Task {
                label,
                stream: t.stream,
                kind: TaskKind::Copy {
                    src,
                    dst: RankView { rank: r, view: dst },
                },
                deps,
            };
            let mut add_scratch = |rows: usize, cols: usize| {
                buffers.push(Buffer {
                    name: format!("ref-scratch{}", buffers.len()),
                    role: BufferRole::Scratch,
                    rows,
                    cols,
                    peer_visible: false,
                });
                buffers.len() - 1
            };
            match op {
                NcclOp::AllGather { recv, .. } => {
                    for q in 0..p {
                        let send = send_of(q)?;
                        let dst = recv.rows(q * send.rows, send.rows);
                        tasks.push(copy(
                            format!("ag-ref from {q}"),
                            RankView {
                                rank: q,
                                view: send,
                            },
                            dst,
                            rdv.clone(),
                        ));
                    }
                }
                NcclOp::ReduceScatter { recv, .. } | NcclOp::AllReduce { recv, .. } => {
                    let rs = matches!(op, NcclOp::ReduceScatter { .. });
                    let rows = recv.rows;
                    let sb = add_scratch(p * rows, recv.cols);
                    let block = |q: usize| View {
                        buf: sb,
                        row: q * rows,
                        col: 0,
                        rows,
                        cols: recv.cols,
                    };
                    // What rank r needs of rank q's send.
                    let part = |q: usize| -> Result<View> {
                        let s = send_of(q)?;
                        Ok(if rs { s.rows(r * rows, rows) } else { s })
                    };
                    let mut srcs = vec![];
                    for q in 0..p {
                        if q == r {
                            srcs.push(part(r)?);
                            continue;
                        }
                        tasks.push(copy(
                            format!("{}-ref from {q}", if rs { "rs" } else { "ar" }),
                            RankView {
                                rank: q,
                                view: part(q)?,
                            },
                            block(q),
                            rdv.clone(),
                        ));
                        srcs.push(block(q));
                    }
                    let mut rdeps = rdv.clone();
                    let send = send_of(r)?;
                    if send.overlaps(recv) {
                        // In place: every peer must have pulled r's send first.
                        for q in (0..p).filter(|&q| q != r) {
                            let i = group_task[&(q, *group)];
                            rdeps.push(TaskId {
                                rank: q,
                                index: first[q][i] + if r < q { r } else { r - 1 },
                            });
                        }
                    }
                    tasks.push(Task {
                        label: format!("{}-ref reduce", if rs { "rs" } else { "ar" }),
                        stream: t.stream,
                        kind: TaskKind::Reduce { srcs, dst: *recv },
                        deps: rdeps,
                    });
                }
                NcclOp::SendRecv { .. } => unreachable!("refused in pass 1"),
            }
        }
        out.ranks[r].tasks = tasks;
        out.ranks[r].buffers = buffers;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::copy_reference;
    use ficco_core::plan::interp::{interpret, reference, Inputs};
    use ficco_core::plan::lower::{comm_only, lower};
    use ficco_core::plan::validate::validate;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::Schedule;

    /// The copy form of every sequential and comm-only plan is valid, has no
    /// NCCL task left, and the sequential one computes the operator exactly
    /// (CPU interpreter, integer data).
    #[test]
    fn copy_reference_of_seq_and_comm_only_is_valid() {
        for gpus in [2, 4, 8] {
            for op in Op::ALL {
                let problem = Problem::new(op, 512, 256, 384, gpus).expect("problem");
                for plan in [
                    lower(&problem, &Schedule::SEQ).expect("seq"),
                    comm_only(&problem),
                ] {
                    let c = copy_reference(&plan).expect("copy form");
                    validate(&c)
                        .unwrap_or_else(|e| panic!("{} {}: {e}", problem.label(), plan.name));
                    assert!(c.ranks.iter().all(|rp| rp
                        .tasks
                        .iter()
                        .all(|t| !matches!(t.kind, ficco_core::plan::TaskKind::Nccl { .. }))));
                    if plan.name == "comm-only" {
                        continue;
                    }
                    let inputs = Inputs::random(&problem, 7);
                    let got = interpret(&c, &inputs).expect("interpret");
                    assert_eq!(got, reference(&problem, &inputs), "{}", problem.label());
                }
            }
        }
    }
}
