//! An exact CPU interpreter of plans, for proving schedules correct.
//!
//! It runs a plan on small matrices of integer-valued f64, so every sum is
//! exact whatever its order: a schedule is right exactly when its output
//! equals the sequential reference bit for bit. Tasks run one at a time in a
//! happens-before order (which includes Signal → Wait through flags; both are
//! no-ops on memory); an NCCL rendezvous runs as one step for all ranks.
//! Memory nothing has written is NaN, so a read of it shows in the output.
//!
//! Tile GEMMs run block by block ([`crate::plan::tile::expand`]). Every
//! element remembers the task that last wrote it, and a read is an error
//! ("read before arrival") when that writer is not ordered before the reader,
//! or when the reader ran before any write of the element and a write not
//! ordered after the reader comes later: whichever order the run picks, a
//! block that reads rows whose flag does not cover them is caught.

use crate::error::{Error, Result};
use crate::plan::validate::{accesses, HappensBefore};
use crate::plan::{BufferRole, NcclOp, Plan, TaskId, TaskKind, View};
use crate::problem::workload::{Op, Problem};
use std::collections::HashSet;

/// A row-major matrix of f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Matrix {
    pub fn filled(rows: usize, cols: usize, v: f64) -> Self {
        Matrix {
            rows,
            cols,
            data: vec![v; rows * cols],
        }
    }

    fn at(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }

    /// self @ other, exact for small integers.
    pub fn matmul(&self, other: &Matrix) -> Matrix {
        let mut out = Matrix::filled(self.rows, other.cols, 0.0);
        for i in 0..self.rows {
            for k in 0..self.cols {
                let a = self.at(i, k);
                for j in 0..other.cols {
                    out.data[i * other.cols + j] += a * other.at(k, j);
                }
            }
        }
        out
    }
}

/// Per-rank operands of a problem.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// A of each rank: [M/P, K] for ag-gemm, [M, K] otherwise.
    pub a: Vec<Matrix>,
    /// B of each rank: [K, N].
    pub b: Vec<Matrix>,
    /// `concurrent`: the collective's input of each rank (empty otherwise).
    pub x: Vec<Matrix>,
}

/// splitmix64: enough randomness for test data, no dependency needed.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Inputs {
    /// Random integers in [-4, 4] (never all zero), from `seed`.
    pub fn random(problem: &Problem, seed: u64) -> Self {
        let mut st = seed;
        let mut mat = |rows, cols| {
            let data = (0..rows * cols)
                .map(|_| (next(&mut st) % 9) as f64 - 4.0)
                .collect();
            Matrix { rows, cols, data }
        };
        if let Some(rt) = problem.routing() {
            // Routed rows (dispatch) or expert rows (combine), and the
            // rank's experts' weights stacked.
            let a = (0..problem.gpus)
                .map(|q| {
                    let rows = if problem.op == Op::A2aGemm {
                        rt.sent(q)
                    } else {
                        rt.received(q)
                    };
                    mat(rows, problem.k)
                })
                .collect();
            let b = (0..problem.gpus)
                .map(|_| mat(rt.local_experts() * problem.k, problem.n))
                .collect();
            return Inputs { a, b, x: vec![] };
        }
        let a_rows = match problem.op {
            Op::AgGemm => problem.shard_rows(),
            Op::GemmRs | Op::GemmAr | Op::Concurrent | Op::A2aGemm | Op::GemmA2a => problem.m,
        };
        let a = (0..problem.gpus).map(|_| mat(a_rows, problem.k)).collect();
        let b = (0..problem.gpus)
            .map(|_| mat(problem.k, problem.n))
            .collect();
        let x = match problem.op {
            Op::Concurrent => {
                let rows = problem.side_rows().0;
                (0..problem.gpus).map(|_| mat(rows, problem.n)).collect()
            }
            _ => vec![],
        };
        Inputs { a, b, x }
    }
}

/// The operator's definition, computed directly: each rank's expected output.
pub fn reference(problem: &Problem, inputs: &Inputs) -> Vec<Matrix> {
    let (p, r) = (problem.gpus, problem.shard_rows());
    match problem.op {
        Op::AgGemm => {
            let mut gathered = Matrix::filled(problem.m, problem.k, 0.0);
            for (q, a) in inputs.a.iter().enumerate() {
                gathered.data[q * r * problem.k..(q + 1) * r * problem.k].copy_from_slice(&a.data);
            }
            inputs.b.iter().map(|b| gathered.matmul(b)).collect()
        }
        Op::GemmRs | Op::GemmAr => {
            let mut sum = Matrix::filled(problem.m, problem.n, 0.0);
            for (a, b) in inputs.a.iter().zip(&inputs.b) {
                for (s, x) in sum.data.iter_mut().zip(a.matmul(b).data) {
                    *s += x;
                }
            }
            if problem.op == Op::GemmAr {
                return vec![sum; p];
            }
            (0..p)
                .map(|q| Matrix {
                    rows: r,
                    cols: problem.n,
                    data: sum.data[q * r * problem.n..(q + 1) * r * problem.n].to_vec(),
                })
                .collect()
        }
        Op::Concurrent => concurrent_reference(problem, inputs),
        Op::A2aGemm | Op::GemmA2a => moe_reference(problem, inputs),
    }
}

/// Rows [row, row + rows) of a matrix.
fn rows_of(m: &Matrix, row: usize, rows: usize) -> Matrix {
    Matrix {
        rows,
        cols: m.cols,
        data: m.data[row * m.cols..(row + rows) * m.cols].to_vec(),
    }
}

/// The MoE operators from their definition, row by row of the routing:
/// every routed row times its expert's weights, placed where the operator
/// puts it (dispatch: the expert rank's source-major rows; combine: the
/// home rank's expert-sorted rows).
fn moe_reference(problem: &Problem, inputs: &Inputs) -> Vec<Matrix> {
    let Some(rt) = problem.routing() else {
        return vec![];
    };
    let (p, k, n) = (problem.gpus, problem.k, problem.n);
    let dispatch = problem.op == Op::A2aGemm;
    let mut outs: Vec<Matrix> = (0..p)
        .map(|q| {
            let rows = if dispatch { rt.received(q) } else { rt.sent(q) };
            Matrix::filled(rows, n, 0.0)
        })
        .collect();
    for r in 0..p {
        for e in 0..rt.experts {
            let rows = rt.counts[r][e];
            if rows == 0 {
                continue;
            }
            let q = rt.owner(e);
            let l = e - rt.experts_of(q).start;
            let w = rows_of(&inputs.b[q], l * k, k);
            // Offset of expert e's rows within the block r -> q.
            let in_block = rt.send_offset(r, e) - rt.send_block(r, q).0;
            let recv_row = rt.recv_block(q, r).0 + in_block;
            let send_row = rt.send_offset(r, e);
            let (x, home, at) = if dispatch {
                (rows_of(&inputs.a[r], send_row, rows), q, recv_row)
            } else {
                (rows_of(&inputs.a[q], recv_row, rows), r, send_row)
            };
            let y = x.matmul(&w);
            outs[home].data[at * n..(at + rows) * n].copy_from_slice(&y.data);
        }
    }
    outs
}

/// `concurrent`: every rank's output is its GEMM results (each A @ B, one
/// block of M rows per GEMM) followed by its part of the collective.
fn concurrent_reference(problem: &Problem, inputs: &Inputs) -> Vec<Matrix> {
    let p = problem.gpus;
    let (_, out_rows) = problem.side_rows();
    let n = problem.n;
    // The collective's result per rank, [out_rows, n].
    let mut sum = vec![0.0; inputs.x.first().map_or(0, |x| x.data.len())];
    for x in &inputs.x {
        for (s, v) in sum.iter_mut().zip(&x.data) {
            *s += v;
        }
    }
    let side: Vec<Vec<f64>> = match problem.collective() {
        crate::problem::workload::Collective::AllReduce => vec![sum; p],
        crate::problem::workload::Collective::ReduceScatter => (0..p)
            .map(|q| sum[q * out_rows * n..(q + 1) * out_rows * n].to_vec())
            .collect(),
        crate::problem::workload::Collective::AllGather => {
            let gathered: Vec<f64> = inputs.x.iter().flat_map(|x| x.data.clone()).collect();
            vec![gathered; p]
        }
    };
    (0..p)
        .map(|q| {
            let c = inputs.a[q].matmul(&inputs.b[q]);
            let mut data = Vec::with_capacity((problem.gemm_count() * problem.m + out_rows) * n);
            for _ in 0..problem.gemm_count() {
                data.extend_from_slice(&c.data);
            }
            data.extend_from_slice(&side[q]);
            Matrix {
                rows: problem.gemm_count() * problem.m + out_rows,
                cols: n,
                data,
            }
        })
        .collect()
}

/// Memory of every rank: one matrix per buffer.
struct Memory(Vec<Vec<Matrix>>);

/// What is known about one element: who wrote it last, or who read it
/// before anything wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mark {
    Fresh,
    ReadUnwritten(TaskId),
    Written(TaskId),
}

/// Per rank, per buffer, per element: its [`Mark`] (inputs start written by
/// nobody: they are there before the plan runs).
struct Marks {
    marks: Vec<Vec<Vec<Mark>>>,
    inputs: Vec<Vec<bool>>,
}

impl Marks {
    fn elems(v: &View, cols: usize) -> impl Iterator<Item = usize> + '_ {
        (0..v.rows).flat_map(move |i| {
            let start = (v.row + i) * cols + v.col;
            start..start + v.cols
        })
    }

    /// Checks a read of `v` on `rank` by `reader`.
    fn read(
        &mut self,
        plan: &Plan,
        hb: &HappensBefore,
        rank: usize,
        v: &View,
        reader: TaskId,
    ) -> Result<()> {
        if self.inputs[rank][v.buf] {
            return Ok(());
        }
        let cols = plan.ranks[rank].buffers[v.buf].cols;
        let marks = &mut self.marks[rank][v.buf];
        let mut checked: HashSet<TaskId> = HashSet::new();
        for e in Self::elems(v, cols) {
            match marks[e] {
                Mark::Fresh => marks[e] = Mark::ReadUnwritten(reader),
                Mark::ReadUnwritten(_) => {}
                Mark::Written(w) => {
                    if w != reader && checked.insert(w) && !hb.before(w, reader) {
                        return Err(before_arrival(plan, rank, v, e / cols, reader, w));
                    }
                }
            }
        }
        Ok(())
    }

    /// Records a write of `v` on `rank` by `writer`.
    fn write(
        &mut self,
        plan: &Plan,
        hb: &HappensBefore,
        rank: usize,
        v: &View,
        writer: TaskId,
    ) -> Result<()> {
        let cols = plan.ranks[rank].buffers[v.buf].cols;
        let marks = &mut self.marks[rank][v.buf];
        for e in Self::elems(v, cols) {
            if let Mark::ReadUnwritten(reader) = marks[e] {
                if reader != writer && !hb.before(reader, writer) {
                    return Err(before_arrival(plan, rank, v, e / cols, reader, writer));
                }
            }
            marks[e] = Mark::Written(writer);
        }
        Ok(())
    }
}

fn before_arrival(
    plan: &Plan,
    rank: usize,
    v: &View,
    row: usize,
    reader: TaskId,
    writer: TaskId,
) -> Error {
    let label = |id: TaskId| plan.task(id).map_or("?", |t| t.label.as_str()).to_string();
    Error::InvalidPlan(format!(
        "read before arrival: rank {} task {} '{}' reads row {row} of rank {rank} buffer '{}' \
         that rank {} task {} '{}' writes, and the two are not ordered",
        reader.rank,
        reader.index,
        label(reader),
        plan.ranks[rank].buffers[v.buf].name,
        writer.rank,
        writer.index,
        label(writer)
    ))
}

impl Memory {
    fn read(&self, rank: usize, v: &View) -> Matrix {
        let b = &self.0[rank][v.buf];
        let mut out = Matrix::filled(v.rows, v.cols, 0.0);
        for i in 0..v.rows {
            let src = (v.row + i) * b.cols + v.col;
            out.data[i * v.cols..(i + 1) * v.cols].copy_from_slice(&b.data[src..src + v.cols]);
        }
        out
    }

    fn write(&mut self, rank: usize, v: &View, m: &Matrix) {
        let b = &mut self.0[rank][v.buf];
        for i in 0..v.rows {
            let dst = (v.row + i) * b.cols + v.col;
            b.data[dst..dst + v.cols].copy_from_slice(&m.data[i * v.cols..(i + 1) * v.cols]);
        }
    }
}

fn add(acc: &mut Matrix, x: &Matrix) {
    for (a, b) in acc.data.iter_mut().zip(&x.data) {
        *a += b;
    }
}

/// Runs `plan` on `inputs`; returns each rank's output buffer. The plan must
/// be valid ([`crate::plan::validate::validate`]); this only rechecks ordering.
pub fn interpret(plan: &Plan, inputs: &Inputs) -> Result<Vec<Matrix>> {
    let expanded;
    let plan = if crate::plan::tile::has_tiles(plan) {
        expanded = crate::plan::tile::expand(plan);
        &expanded
    } else {
        plan
    };
    let hb = HappensBefore::build(plan, crate::plan::graph::Graph::new(plan)?)?;
    let mut marks = Marks {
        marks: plan
            .ranks
            .iter()
            .map(|rp| {
                rp.buffers
                    .iter()
                    .map(|b| vec![Mark::Fresh; b.rows * b.cols])
                    .collect()
            })
            .collect(),
        inputs: plan
            .ranks
            .iter()
            .map(|rp| {
                rp.buffers
                    .iter()
                    .map(|b| {
                        matches!(
                            b.role,
                            BufferRole::InputA | BufferRole::InputB | BufferRole::InputX
                        )
                    })
                    .collect()
            })
            .collect(),
    };
    let mut mem = Memory(
        plan.ranks
            .iter()
            .enumerate()
            .map(|(r, rp)| {
                rp.buffers
                    .iter()
                    .map(|b| {
                        let given = match b.role {
                            BufferRole::InputA => Some(&inputs.a[r]),
                            BufferRole::InputB => Some(&inputs.b[r]),
                            BufferRole::InputX => inputs.x.get(r),
                            _ => None,
                        };
                        match given {
                            Some(m) if (m.rows, m.cols) == (b.rows, b.cols) => Ok(m.clone()),
                            Some(m) => Err(Error::InvalidPlan(format!(
                                "rank {r} buffer '{}' is [{}, {}] but the input is [{}, {}]",
                                b.name, b.rows, b.cols, m.rows, m.cols
                            ))),
                            None => Ok(Matrix::filled(b.rows, b.cols, f64::NAN)),
                        }
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?,
    );
    let mut done_groups = HashSet::new();
    for id in &hb.order {
        let rank = id.rank;
        let task = &plan.ranks[rank].tasks[id.index];
        // An NCCL rendezvous runs (and so reads and writes) once, for every member.
        let members: Vec<TaskId> = match &task.kind {
            TaskKind::Nccl { group, .. } if done_groups.contains(group) => vec![],
            TaskKind::Nccl { group, .. } => group_members(plan, *group),
            _ => vec![*id],
        };
        for m in &members {
            let kind = &plan.ranks[m.rank].tasks[m.index].kind;
            for (owner, v, write) in accesses(m.rank, kind) {
                if !write {
                    marks.read(plan, &hb, owner, &v, *m)?;
                }
            }
        }
        match &task.kind {
            TaskKind::Gemm {
                a,
                b,
                c,
                accumulate,
                ..
            } => {
                let mut out = mem.read(rank, a).matmul(&mem.read(rank, b));
                if *accumulate {
                    add(&mut out, &mem.read(rank, c));
                }
                mem.write(rank, c, &out);
            }
            TaskKind::GroupedGemm { groups, .. } => {
                // Groups write disjoint rows (validated): any order is exact.
                for g in groups {
                    let out = mem.read(rank, &g.a).matmul(&mem.read(rank, &g.b));
                    mem.write(rank, &g.c, &out);
                }
            }
            TaskKind::Copy { src, dst } => {
                let m = mem.read(src.rank, &src.view);
                mem.write(dst.rank, &dst.view, &m);
            }
            TaskKind::Reduce { srcs, dst } => {
                let mut acc = mem.read(rank, &srcs[0]);
                for s in &srcs[1..] {
                    add(&mut acc, &mem.read(rank, s));
                }
                mem.write(rank, dst, &acc);
            }
            // Ordering only: the happens-before order already put every
            // Wait after its Signal.
            TaskKind::Signal { .. } | TaskKind::Wait { .. } => {}
            TaskKind::Nccl { group, .. } => {
                if done_groups.insert(*group) {
                    run_group(plan, *group, &mut mem)?;
                }
            }
            TaskKind::TileGemm(_) => {
                return Err(Error::InvalidPlan(
                    "a tile GEMM left after expansion".into(),
                ))
            }
        }
        for m in &members {
            let kind = &plan.ranks[m.rank].tasks[m.index].kind;
            for (owner, v, write) in accesses(m.rank, kind) {
                if write {
                    marks.write(plan, &hb, owner, &v, *m)?;
                }
            }
        }
    }
    plan.ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            let id = rp
                .buffer_with(BufferRole::Output)
                .ok_or_else(|| Error::InvalidPlan(format!("rank {r} has no output buffer")))?;
            Ok(mem.0[r][id].clone())
        })
        .collect()
}

/// The tasks of NCCL group `group`, one per rank that has it.
fn group_members(plan: &Plan, group: usize) -> Vec<TaskId> {
    plan.ranks
        .iter()
        .enumerate()
        .filter_map(|(r, rp)| {
            rp.tasks
                .iter()
                .position(|t| matches!(t.kind, TaskKind::Nccl { group: g, .. } if g == group))
                .map(|index| TaskId { rank: r, index })
        })
        .collect()
}

/// One NCCL rendezvous: read every member's sends, then write every receive.
fn run_group(plan: &Plan, group: usize, mem: &mut Memory) -> Result<()> {
    let ops: Vec<&NcclOp> = plan
        .ranks
        .iter()
        .map(|rp| {
            rp.tasks.iter().find_map(|t| match &t.kind {
                TaskKind::Nccl { group: g, op } if *g == group => Some(op),
                _ => None,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::InvalidPlan(format!("NCCL group {group} lacks a rank")))?;
    let mut writes: Vec<(usize, View, Matrix)> = vec![];
    let flat = |m: Matrix| m.data;
    match ops[0] {
        NcclOp::AllGather { .. } => {
            let parts: Vec<Vec<f64>> = ops
                .iter()
                .enumerate()
                .map(|(r, op)| match op {
                    NcclOp::AllGather { send, .. } => flat(mem.read(r, send)),
                    _ => vec![],
                })
                .collect();
            let all: Vec<f64> = parts.concat();
            for (r, op) in ops.iter().enumerate() {
                if let NcclOp::AllGather { recv, .. } = op {
                    let m = Matrix {
                        rows: recv.rows,
                        cols: recv.cols,
                        data: all.clone(),
                    };
                    writes.push((r, *recv, m));
                }
            }
        }
        NcclOp::ReduceScatter { .. } | NcclOp::AllReduce { .. } => {
            let mut sum: Option<Vec<f64>> = None;
            for (r, op) in ops.iter().enumerate() {
                let (NcclOp::ReduceScatter { send, .. } | NcclOp::AllReduce { send, .. }) = op
                else {
                    continue;
                };
                let d = flat(mem.read(r, send));
                match sum.as_mut() {
                    None => sum = Some(d),
                    Some(s) => s.iter_mut().zip(d).for_each(|(a, b)| *a += b),
                }
            }
            let sum = sum.unwrap_or_default();
            for (r, op) in ops.iter().enumerate() {
                match op {
                    NcclOp::ReduceScatter { recv, .. } => {
                        let n = recv.elems();
                        let data = sum[r * n..(r + 1) * n].to_vec();
                        writes.push((
                            r,
                            *recv,
                            Matrix {
                                rows: recv.rows,
                                cols: recv.cols,
                                data,
                            },
                        ));
                    }
                    NcclOp::AllReduce { recv, .. } => {
                        writes.push((
                            r,
                            *recv,
                            Matrix {
                                rows: recv.rows,
                                cols: recv.cols,
                                data: sum.clone(),
                            },
                        ));
                    }
                    _ => {}
                }
            }
        }
        NcclOp::SendRecv { .. } => {
            for (r, op) in ops.iter().enumerate() {
                let NcclOp::SendRecv { recvs, .. } = op else {
                    continue;
                };
                for (q, view) in recvs {
                    let NcclOp::SendRecv { sends, .. } = ops[*q] else {
                        continue;
                    };
                    // The k-th receive from q on r matches the k-th send to r on q.
                    let k = recvs
                        .iter()
                        .take_while(|(x, v)| !(x == q && v == view))
                        .filter(|(x, _)| x == q)
                        .count();
                    let (_, sv) =
                        sends
                            .iter()
                            .filter(|(x, _)| *x == r)
                            .nth(k)
                            .ok_or_else(|| {
                                Error::InvalidPlan(format!(
                                    "NCCL group {group}: no send from {q} to {r}"
                                ))
                            })?;
                    let m = mem.read(*q, sv);
                    writes.push((
                        r,
                        *view,
                        Matrix {
                            rows: view.rows,
                            cols: view.cols,
                            data: m.data,
                        },
                    ));
                }
            }
        }
    }
    for (r, v, m) in writes {
        mem.write(r, &v, &m);
    }
    Ok(())
}
