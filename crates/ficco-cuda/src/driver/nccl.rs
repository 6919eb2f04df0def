//! NCCL calls (`nccl.h`): versions, communicator creation and queries, groups,
//! and the bf16 collectives and point-to-point calls ficco issues.
//!
//! Results become [`CudaError::Nccl`] naming the call (the message explains
//! the result code). Calls on a communicator or device buffer are `unsafe`:
//! the communicator must be live and used by one host thread at a time, and
//! the buffers must hold the counts given on the communicator's device.

use super::DevicePtr;
use crate::error::{nccl, Result};
use cudarc::driver::sys::CUstream;
use cudarc::nccl::{result as nr, sys as nsys};
use std::ffi::c_void;

/// A raw communicator handle.
pub(crate) type RawComm = nsys::ncclComm_t;

const BF16: nsys::ncclDataType_t = nsys::ncclDataType_t::ncclBfloat16;
const SUM: nsys::ncclRedOp_t = nsys::ncclRedOp_t::ncclSum;

fn stream(s: CUstream) -> nsys::cudaStream_t {
    s as nsys::cudaStream_t
}

/// `ncclGetVersion`, e.g. 22803.
pub(crate) fn version() -> Result<i32> {
    nr::get_nccl_version().map_err(nccl("ncclGetVersion"))
}

/// A fresh `ncclUniqueId` shared by the ranks of one communicator.
pub(crate) fn unique_id() -> Result<nsys::ncclUniqueId> {
    nr::get_uniqueid().map_err(nccl("ncclGetUniqueId"))
}

/// Runs `f` between `ncclGroupStart` and `ncclGroupEnd`. The group is always
/// closed; an error of `f` is reported before one of `ncclGroupEnd`.
pub(crate) fn grouped<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    nr::group_start().map_err(nccl("ncclGroupStart"))?;
    let res = f();
    let end = nr::group_end().map_err(nccl("ncclGroupEnd"));
    let v = res?;
    end?;
    Ok(v)
}

/// `ncclCommInitRankConfig` of rank `rank` of `n` into `out`.
///
/// # Safety
/// `out` and `config` must stay valid until the enclosing `ncclGroupEnd`
/// returns; the rank's device context is current.
pub(crate) unsafe fn comm_init_rank_config(
    out: &mut RawComm,
    n: i32,
    id: nsys::ncclUniqueId,
    rank: i32,
    config: &mut nsys::ncclConfig_t,
) -> Result<()> {
    nsys::ncclCommInitRankConfig(out, n, id, rank, config)
        .result()
        .map(|_| ())
        .map_err(nccl("ncclCommInitRankConfig"))
}

/// Destroys a communicator; errors on teardown cannot be reported.
///
/// # Safety
/// `comm` was created by NCCL, is destroyed once and not used after.
pub(crate) unsafe fn comm_destroy(comm: RawComm) {
    let _ = nr::comm_destroy(comm);
}

/// Ranks in the communicator (`ncclCommCount`).
///
/// # Safety
/// `comm` is live.
pub(crate) unsafe fn comm_count(comm: RawComm) -> Result<i32> {
    nr::comm_count(comm).map_err(nccl("ncclCommCount"))
}

/// The CUDA device of the communicator (`ncclCommCuDevice`).
///
/// # Safety
/// `comm` is live.
pub(crate) unsafe fn comm_cu_device(comm: RawComm) -> Result<i32> {
    nr::comm_cu_device(comm).map_err(nccl("ncclCommCuDevice"))
}

/// The communicator's rank (`ncclCommUserRank`).
///
/// # Safety
/// `comm` is live.
pub(crate) unsafe fn comm_user_rank(comm: RawComm) -> Result<i32> {
    nr::comm_user_rank(comm).map_err(nccl("ncclCommUserRank"))
}

/// bf16 all-gather: `count` elements from every rank into `recv` (P × count).
///
/// # Safety
/// See the module doc; `send` holds `count`, `recv` P × `count` bf16.
pub(crate) unsafe fn all_gather(
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    comm: RawComm,
    s: CUstream,
) -> Result<()> {
    nr::all_gather(
        send.raw() as *const c_void,
        recv.raw() as *mut c_void,
        count,
        BF16,
        comm,
        stream(s),
    )
    .map(|_| ())
    .map_err(nccl("ncclAllGather"))
}

/// bf16 sum reduce-scatter: `recv` gets `recv_count` elements.
///
/// # Safety
/// See the module doc; `send` holds P × `recv_count`, `recv` `recv_count` bf16.
pub(crate) unsafe fn reduce_scatter(
    send: DevicePtr,
    recv: DevicePtr,
    recv_count: usize,
    comm: RawComm,
    s: CUstream,
) -> Result<()> {
    nr::reduce_scatter(
        send.raw() as *const c_void,
        recv.raw() as *mut c_void,
        recv_count,
        BF16,
        SUM,
        comm,
        stream(s),
    )
    .map(|_| ())
    .map_err(nccl("ncclReduceScatter"))
}

/// bf16 sum all-reduce of `count` elements (in place when `send == recv`).
///
/// # Safety
/// See the module doc; both hold `count` bf16.
pub(crate) unsafe fn all_reduce(
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    comm: RawComm,
    s: CUstream,
) -> Result<()> {
    nr::all_reduce(
        send.raw() as *const c_void,
        recv.raw() as *mut c_void,
        count,
        BF16,
        SUM,
        comm,
        stream(s),
    )
    .map(|_| ())
    .map_err(nccl("ncclAllReduce"))
}

/// Sends `count` bf16 to `peer` (inside a group with the matching receive).
///
/// # Safety
/// See the module doc; `buf` holds `count` bf16.
pub(crate) unsafe fn send(
    buf: DevicePtr,
    count: usize,
    peer: usize,
    comm: RawComm,
    s: CUstream,
) -> Result<()> {
    nr::send(
        buf.raw() as *const c_void,
        count,
        BF16,
        peer as i32,
        comm,
        stream(s),
    )
    .map(|_| ())
    .map_err(nccl("ncclSend"))
}

/// Receives `count` bf16 from `peer` (inside a group with the matching send).
///
/// # Safety
/// See the module doc; `buf` holds `count` bf16.
pub(crate) unsafe fn recv(
    buf: DevicePtr,
    count: usize,
    peer: usize,
    comm: RawComm,
    s: CUstream,
) -> Result<()> {
    nr::recv(
        buf.raw() as *mut c_void,
        count,
        BF16,
        peer as i32,
        comm,
        stream(s),
    )
    .map(|_| ())
    .map_err(nccl("ncclRecv"))
}
