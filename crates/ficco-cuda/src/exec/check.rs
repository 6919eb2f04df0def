//! Host-side checks and the output comparison: every task of a plan is
//! checked before anything is issued ([`precheck`]), view addresses are
//! bounds-checked ([`view_addr`]), and outputs are poisoned, copied and
//! compared on the device ([`poison`], [`copy_d2d`], [`compare`]).

use super::rank::Rank;
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::kernels::MAX_REDUCE_SRCS;
use crate::mem::{memset_d16_async, DevicePtr};
use ficco_core::plan::{Buffer, NcclOp, Plan, TaskKind, View};
use ficco_core::workload::ELEM_BYTES;

/// bf16 quiet NaN, used to poison outputs before a checked run.
pub const BF16_NAN: u16 = 0x7fc0;

/// Bounds-checked device address of a view's first element, and its pitch in bytes.
pub(crate) fn view_addr(
    bufs: &[Buffer],
    ptrs: &[DevicePtr],
    v: &View,
    what: &str,
) -> Result<(DevicePtr, usize)> {
    let b = bufs
        .get(v.buf)
        .ok_or_else(|| CudaError::Plan(format!("{what}: buffer {} does not exist", v.buf)))?;
    if v.row + v.rows > b.rows || v.col + v.cols > b.cols {
        return Err(CudaError::Plan(format!(
            "{what}: view rows {}+{} cols {}+{} outside buffer '{}' [{} x {}]",
            v.row, v.rows, v.col, v.cols, b.name, b.rows, b.cols
        )));
    }
    Ok((
        ptrs[v.buf].offset((v.row * b.cols + v.col) * ELEM_BYTES),
        b.cols * ELEM_BYTES,
    ))
}

/// Checks every task of `plan` on the host before anything is issued: a task
/// that fails to issue on one rank would leave its peers' NCCL kernels waiting
/// forever on the device. What passes here issues without further checks.
pub fn precheck(plan: &Plan, ptrs: &[Vec<DevicePtr>]) -> Result<()> {
    let p = plan.ranks.len();
    for (r, rp) in plan.ranks.iter().enumerate() {
        let bufs = &rp.buffers;
        let at = |v: &View, what: &str| view_addr(bufs, &ptrs[r], v, what);
        let contiguous = |v: &View, what: &str| -> Result<()> {
            let (_, pitch) = at(v, what)?;
            if v.rows > 1 && pitch != v.cols * ELEM_BYTES {
                return Err(CudaError::Plan(format!(
                    "{what} on rank {r}: NCCL needs a contiguous view (full rows of its buffer)"
                )));
            }
            Ok(())
        };
        for (i, t) in rp.tasks.iter().enumerate() {
            if t.stream >= rp.streams.len() {
                return Err(CudaError::Plan(format!(
                    "task {i} of rank {r} names stream {}",
                    t.stream
                )));
            }
            for d in &t.deps {
                if plan.task(*d).is_none() {
                    return Err(CudaError::Plan(format!(
                        "task {i} of rank {r} depends on missing {d:?}"
                    )));
                }
            }
            match &t.kind {
                TaskKind::Gemm { a, b, c, .. } => {
                    if a.cols != b.rows || c.rows != a.rows || c.cols != b.cols || a.cols == 0 {
                        return Err(CudaError::Plan(format!(
                            "gemm '{}' on rank {r}: shapes do not match",
                            t.label
                        )));
                    }
                    at(a, "gemm a")?;
                    at(b, "gemm b")?;
                    at(c, "gemm c")?;
                }
                TaskKind::Copy { src, dst } => {
                    if src.view.rows != dst.view.rows || src.view.cols != dst.view.cols {
                        return Err(CudaError::Plan(format!(
                            "copy '{}' on rank {r}: shapes differ",
                            t.label
                        )));
                    }
                    for (rv, what) in [(src, "copy src"), (dst, "copy dst")] {
                        let rp2 = plan.ranks.get(rv.rank).ok_or_else(|| {
                            CudaError::Plan(format!("{what}: no rank {}", rv.rank))
                        })?;
                        view_addr(&rp2.buffers, &ptrs[rv.rank], &rv.view, what)?;
                    }
                }
                TaskKind::Reduce { srcs, dst } => {
                    if srcs.is_empty() || srcs.len() > MAX_REDUCE_SRCS {
                        return Err(CudaError::Plan(format!("reduce of {} sources", srcs.len())));
                    }
                    for v in srcs {
                        if v.rows != dst.rows || v.cols != dst.cols {
                            return Err(CudaError::Plan(
                                "reduce source shape differs from dst".into(),
                            ));
                        }
                        at(v, "reduce src")?;
                    }
                    at(dst, "reduce dst")?;
                }
                TaskKind::Nccl { op, .. } => match op {
                    NcclOp::AllGather { send, recv } => {
                        if recv.elems() != send.elems() * p {
                            return Err(CudaError::Plan("all-gather recv != P x send".into()));
                        }
                        contiguous(send, "all-gather send")?;
                        contiguous(recv, "all-gather recv")?;
                    }
                    NcclOp::ReduceScatter { send, recv } => {
                        if send.elems() != recv.elems() * p {
                            return Err(CudaError::Plan("reduce-scatter send != P x recv".into()));
                        }
                        contiguous(send, "reduce-scatter send")?;
                        contiguous(recv, "reduce-scatter recv")?;
                    }
                    NcclOp::AllReduce { send, recv } => {
                        if send.elems() != recv.elems() {
                            return Err(CudaError::Plan("all-reduce send and recv differ".into()));
                        }
                        contiguous(send, "all-reduce send")?;
                        contiguous(recv, "all-reduce recv")?;
                    }
                    NcclOp::SendRecv { sends, recvs } => {
                        for (peer, v) in sends.iter().chain(recvs) {
                            if *peer >= p {
                                return Err(CudaError::Plan(format!("send/recv with rank {peer}")));
                            }
                            contiguous(v, "send/recv")?;
                        }
                    }
                },
            }
        }
    }
    Ok(())
}

/// Fills `n` bf16 at `ptr` on `rank` with the NaN poison (stream-ordered on the control stream).
pub fn poison(rank: &Rank, ptr: DevicePtr, n: usize) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: callers pass pool allocations of at least n elements.
    unsafe { memset_d16_async(ptr, BF16_NAN, n, rank.control().cu_stream()) }
}

/// Device-to-device copy of `bytes` on the rank's control stream.
pub fn copy_d2d(rank: &Rank, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: callers pass allocations of at least `bytes` on this device.
    unsafe { cu::memcpy_dtod_async(dst, src, bytes, rank.control().cu_stream()) }
}

/// Sum of squared differences, sum of squared reference, NaN count of `n`
/// bf16 at `out` against `reference` (either may be a peer's memory).
pub fn compare(
    rank: &Rank,
    out: DevicePtr,
    reference: DevicePtr,
    n: usize,
) -> Result<(f64, f64, u64)> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let s = rank.control();
    let acc = rank.check_acc.ptr();
    // SAFETY: check_acc holds 32 bytes; out/reference hold n bf16 (callers).
    unsafe {
        cu::memset_d8_async(acc, 0, 24, s.cu_stream())?;
        rank.kernels
            .check(s, out, reference, n as u64, acc, acc.offset(16))?;
    }
    s.synchronize().map_err(drv("cuStreamSynchronize"))?;
    let mut host = [0u8; 24];
    rank.check_acc.download(&mut host)?;
    let f = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&host[i * 8..i * 8 + 8]);
        b
    };
    Ok((
        f64::from_le_bytes(f(0)),
        f64::from_le_bytes(f(1)),
        u64::from_le_bytes(f(2)),
    ))
}

#[cfg(test)]
mod tests {
    use crate::mem::DevicePtr;
    use ficco_core::lower::{comm_only, gemm_only, lower};
    use ficco_core::schedule::{enumerate, SpaceOptions};
    use ficco_core::workload::{Op, Problem};

    /// Every lowered plan passes the executor's host-side checks (views in
    /// bounds, NCCL views contiguous, sizes consistent). Runs without a GPU.
    #[test]
    fn every_lowered_plan_passes_precheck() {
        let opts = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 16,
        };
        for gpus in [2, 4] {
            for op in Op::ALL {
                let problem = Problem::new(op, 512, 256, 384, gpus).expect("problem");
                let mut plans = vec![gemm_only(&problem), comm_only(&problem)];
                plans.extend(
                    enumerate(op, opts)
                        .iter()
                        .filter_map(|s| lower(&problem, s).ok()),
                );
                for plan in plans {
                    let ptrs: Vec<Vec<DevicePtr>> = plan
                        .ranks
                        .iter()
                        .map(|rp| vec![DevicePtr::NULL; rp.buffers.len()])
                        .collect();
                    if let Err(e) = super::precheck(&plan, &ptrs) {
                        panic!("{} {}: {e}", problem.label(), plan.name);
                    }
                }
            }
        }
    }
}
