//! Plan-building parts shared by every lowering: buffers, streams, tasks
//! (same-stream dependencies dropped), the NCCL call of a collective, and a
//! schedule's resources.

use crate::plan::{
    Buffer, BufferRole, NcclOp, RankPlan, Resources, StreamRole, StreamSpec, Task, TaskId,
    TaskKind, View,
};
use crate::problem::workload::Collective;
use crate::space::{Priority, Schedule};

/// Appends a task to `rank`'s plan and returns its id. Same-stream
/// predecessors are ordered already, so they are dropped from `deps`.
pub(crate) fn push_task(
    ranks: &mut [RankPlan],
    rank: usize,
    stream: usize,
    label: String,
    kind: TaskKind,
    deps: Vec<TaskId>,
) -> TaskId {
    let tasks = &mut ranks[rank].tasks;
    let deps = deps
        .into_iter()
        .filter(|d| !(d.rank == rank && tasks[d.index].stream == stream))
        .collect();
    tasks.push(Task {
        label,
        stream,
        kind,
        deps,
    });
    TaskId {
        rank,
        index: tasks.len() - 1,
    }
}

/// The NCCL call of `collective` from `send` into `recv`.
pub(crate) fn collective_op(collective: Collective, send: View, recv: View) -> NcclOp {
    match collective {
        Collective::AllGather => NcclOp::AllGather { send, recv },
        Collective::ReduceScatter => NcclOp::ReduceScatter { send, recv },
        Collective::AllReduce => NcclOp::AllReduce { send, recv },
    }
}

/// The resources a schedule asks for.
pub(crate) fn resources_of(s: &Schedule) -> Resources {
    Resources {
        green_sms: s.green_sms,
        nccl_ctas: s.nccl_ctas,
        gemm: s.gemm,
        b_transposed: false,
    }
}

pub(crate) fn buffer(
    name: &str,
    role: BufferRole,
    rows: usize,
    cols: usize,
    peer_visible: bool,
) -> Buffer {
    Buffer {
        name: name.into(),
        role,
        rows,
        cols,
        peer_visible,
    }
}

pub(crate) fn stream(name: &str, role: StreamRole, priority: Priority) -> StreamSpec {
    StreamSpec {
        name: name.into(),
        role,
        priority,
    }
}

/// `compute` compute streams (`compute0`, ...) at normal priority, then
/// `comm` communication streams (`comm`, or `comm0`, ... when several) at
/// `comm_priority`: the stream list of every lowering.
pub(crate) fn compute_and_comm_streams(
    compute: usize,
    comm: usize,
    comm_priority: Priority,
) -> Vec<StreamSpec> {
    let mut out: Vec<StreamSpec> = (0..compute)
        .map(|i| {
            stream(
                &format!("compute{i}"),
                StreamRole::Compute,
                Priority::Normal,
            )
        })
        .collect();
    for i in 0..comm {
        let name = if comm == 1 {
            "comm".to_string()
        } else {
            format!("comm{i}")
        };
        out.push(stream(&name, StreamRole::Comm, comm_priority));
    }
    out
}
