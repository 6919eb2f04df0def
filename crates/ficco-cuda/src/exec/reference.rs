//! The loopback form of a reference plan: NCCL refuses two ranks on one
//! GPU, so in loopback the sequential reference (and comm-only) run their
//! collectives as copy-engine copies plus ficco's reduce kernel, through the
//! same executor and signals as every other plan:
//!
//! * all-gather: rank r pulls every rank's `send` into its block of `recv`;
//! * reduce-scatter: rank r pulls block r of every peer's `send` into a
//!   scratch slab, then reduces the P blocks (in rank order) into `recv`;
//! * all-reduce: the same over the whole `send`; in place (`send == recv`)
//!   rank r's reduce also waits until every peer has pulled r's `send`;
//! * grouped send/recv (the MoE all-to-all): rank r pulls each of its
//!   receives from the matching send of the peer (the k-th receive from q
//!   matches q's k-th send to r, as NCCL matches them); what came after the
//!   call waits for r's pulls and for the peers' pulls of r's sends (so r's
//!   send buffers are free again, as after NCCL's call).
//!
//! Every member of a collective waits for every member's dependencies (the
//! rendezvous NCCL gives). Sums run in rank order on every rank, so all-reduce
//! results agree bit for bit across ranks.

use crate::error::{CudaError, Result};
use ficco_core::plan::{Buffer, BufferRole, NcclOp, Plan, RankView, Task, TaskId, TaskKind, View};

/// The pulls that replace rank r's receives of a grouped send/recv: for
/// each receive (peer, view), the matching send view of the peer.
fn pulls(
    plan: &Plan,
    r: usize,
    recvs: &[(usize, View)],
    group: usize,
) -> Result<Vec<(usize, View, View)>> {
    let mut out = vec![];
    for (k, (q, view)) in recvs.iter().enumerate() {
        let nth = recvs[..k].iter().filter(|(x, _)| x == q).count();
        let sends = plan.ranks[*q]
            .tasks
            .iter()
            .find_map(|t| match &t.kind {
                TaskKind::Nccl {
                    group: g,
                    op: NcclOp::SendRecv { sends, .. },
                } if *g == group => Some(sends),
                _ => None,
            })
            .ok_or_else(|| CudaError::Plan(format!("rank {q} lacks NCCL group {group}")))?;
        let (_, send) = sends
            .iter()
            .filter(|(x, _)| *x == r)
            .nth(nth)
            .ok_or_else(|| CudaError::Plan(format!("group {group}: no send from {q} to {r}")))?;
        out.push((*q, *send, *view));
    }
    Ok(out)
}

/// `plan` with every collective and grouped send/recv replaced as described
/// in the module doc. Plans without NCCL tasks come back unchanged.
pub fn copy_reference(plan: &Plan) -> Result<Plan> {
    let p = plan.ranks.len();
    // Pass 1: the new index of every old task's first replacement and how
    // many there are (0 for a send/recv with nothing to receive).
    let mut first = vec![];
    let mut count = vec![];
    let mut group_task: std::collections::HashMap<(usize, usize), usize> = Default::default();
    for (r, rp) in plan.ranks.iter().enumerate() {
        let (mut f, mut c) = (vec![], vec![]);
        let mut next = 0;
        for (i, t) in rp.tasks.iter().enumerate() {
            let n = match &t.kind {
                TaskKind::Nccl { group, op } => {
                    group_task.insert((r, *group), i);
                    match op {
                        NcclOp::SendRecv { recvs, .. } => recvs.len(),
                        // All-gather: P copies; the others: P-1 copies and a reduce.
                        _ => p,
                    }
                }
                _ => 1,
            };
            f.push(next);
            c.push(n);
            next += n;
        }
        first.push(f);
        count.push(c);
    }
    // The new tasks after which old task d is complete.
    let map_one = |d: &TaskId| -> Result<Vec<TaskId>> {
        let (at, n) = (first[d.rank][d.index], count[d.rank][d.index]);
        let id = |rank, index| TaskId { rank, index };
        match &plan.ranks[d.rank].tasks[d.index].kind {
            TaskKind::Nccl {
                group,
                op: NcclOp::SendRecv { .. },
            } => {
                let mut out: Vec<TaskId> = (at..at + n).map(|i| id(d.rank, i)).collect();
                // The peers' pulls out of this rank's sends.
                for q in (0..p).filter(|&q| q != d.rank) {
                    let Some(&i) = group_task.get(&(q, *group)) else {
                        continue;
                    };
                    if let TaskKind::Nccl {
                        op: NcclOp::SendRecv { recvs, .. },
                        ..
                    } = &plan.ranks[q].tasks[i].kind
                    {
                        for (j, (from, _)) in recvs.iter().enumerate() {
                            if *from == d.rank {
                                out.push(id(q, first[q][i] + j));
                            }
                        }
                    }
                }
                Ok(out)
            }
            _ => Ok(vec![id(d.rank, at + n - 1)]),
        }
    };
    let map = |deps: &[TaskId]| -> Result<Vec<TaskId>> {
        let mut out = vec![];
        for d in deps {
            for m in map_one(d)? {
                if !out.contains(&m) {
                    out.push(m);
                }
            }
        }
        Ok(out)
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
            let deps: Vec<TaskId> = map(&t.deps)?;
            let TaskKind::Nccl { group, op } = &t.kind else {
                tasks.push(Task { deps, ..t.clone() });
                continue;
            };
            // The rendezvous: every member's dependencies.
            let mut rdv: Vec<TaskId> = vec![];
            for q in 0..p {
                for m in map(&member(q, *group)?.deps)? {
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
                NcclOp::SendRecv { recvs, .. } => {
                    for (q, send, view) in pulls(plan, r, recvs, *group)? {
                        tasks.push(copy(
                            format!("a2a-ref from {q}"),
                            RankView {
                                rank: q,
                                view: send,
                            },
                            view,
                            rdv.clone(),
                        ));
                    }
                }
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

    /// The MoE all-to-all (grouped send/recv with empty entries and ranks
    /// that receive nothing) in copy form: valid, no NCCL task left, and the
    /// sequential plans compute the operators exactly.
    #[test]
    fn copy_reference_of_moe_all_to_all_is_exact() {
        use ficco_core::problem::routing::{MoeSpec, Skew};
        for gpus in [2, 4] {
            for op in Op::MOE {
                for (tokens, skew) in [(gpus * 32, Skew::NONE), (gpus, Skew::HEAVY)] {
                    let spec = MoeSpec::new(2 * gpus, 2, skew, 11);
                    let problem = Problem::moe(op, tokens, 6, 5, gpus, spec).expect("problem");
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
                        let inputs = Inputs::random(&problem, 3);
                        let got = interpret(&c, &inputs).expect("interpret");
                        assert_eq!(got, reference(&problem, &inputs), "{}", problem.label());
                    }
                }
            }
        }
    }
}
