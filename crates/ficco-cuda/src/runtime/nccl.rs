//! NCCL across processes: the job's `ncclUniqueId` travels through the
//! rendezvous store (rank 0 makes it), and each process creates its own
//! rank of the communicator. Nothing here assumes one node: NCCL reaches
//! the other nodes' ranks itself.

use super::Rendezvous;
use crate::comm::{NcclComm, NcclLimits};
use crate::driver::nccl as nc;
use crate::error::{drv, Result};
use cudarc::driver::CudaContext;
use cudarc::nccl::sys as nsys;
use std::sync::Arc;

/// The id of the communicator `name`: made by rank 0, read by the others.
pub(crate) fn unique_id(rv: &Rendezvous, name: &str) -> Result<nsys::ncclUniqueId> {
    let mine = if rv.env.rank == 0 {
        let id = nc::unique_id().map_err(|e| super::shared::abort_on(rv, e))?;
        Some(id.internal.iter().map(|&c| c as u8).collect::<Vec<u8>>())
    } else {
        None
    };
    let bytes = rv.broadcast(&format!("nccl/{name}"), 0, mine.as_deref())?;
    let mut id = nsys::ncclUniqueId { internal: [0; 128] };
    if bytes.len() != id.internal.len() {
        return Err(rv
            .fail(super::DistError::Mismatch(format!(
                "NCCL id {name} has {} bytes, expected {}",
                bytes.len(),
                id.internal.len()
            )))
            .into());
    }
    for (d, s) in id.internal.iter_mut().zip(&bytes) {
        *d = *s as std::ffi::c_char;
    }
    Ok(id)
}

/// This rank's communicator over every rank of the job, on `ctx`'s device.
pub(crate) fn communicator(
    rv: &Rendezvous,
    name: &str,
    ctx: &Arc<CudaContext>,
    limits: NcclLimits,
) -> Result<NcclComm> {
    let id = unique_id(rv, name)?;
    ctx.bind_to_thread()
        .map_err(drv("cuCtxSetCurrent"))
        .and_then(|_| NcclComm::init_rank(rv.env.world_size, id, rv.env.rank, limits))
        .map_err(|e| super::shared::abort_on(rv, e))
}

#[cfg(test)]
mod tests {
    //! Needs 2 GPUs (NCCL refuses two ranks on one GPU), so `#[ignore]`d and
    //! named `_2gpus` (see `ficco-testkit` for the policy): the test binary
    //! re-runs itself as ranks 0 and 1 on GPUs 0 and 1.
    use super::*;
    use crate::driver::cuda as cu;
    use crate::mem::DeviceBuffer;
    use crate::runtime::LaunchEnv;
    use ficco_testkit::{b2f, f2b, gate, GpuAvailability};
    use std::time::Duration;

    const CHILD: &str = "FICCO_DIST_NCCL_CHILD";

    /// Two processes, one GPU each, a communicator from the id passed
    /// through the store: NCCL reports the right (count, device, rank), and
    /// a bf16 all-reduce of small integers is exact.
    #[test]
    #[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
    fn two_processes_all_reduce_through_a_shared_id_2gpus() {
        const TEST: &str = "two_processes_all_reduce_through_a_shared_id_2gpus";
        if std::env::var(CHILD).is_ok() {
            child();
            return;
        }
        let found = match crate::loader::require().and_then(|_| crate::info::device_count()) {
            Ok(n) => GpuAvailability::Found(n),
            Err(e) => GpuAvailability::Unusable(e.to_string()),
        };
        gate(TEST, 2, found);
        let codes = crate::runtime::run_children(
            &format!("runtime::nccl::tests::{TEST}"),
            2,
            CHILD,
            crate::runtime::ChildGpus::All,
            Duration::from_secs(60),
        );
        assert_eq!(codes, vec![Some(0), Some(0)], "rank exit codes");
    }

    fn child() {
        const N: usize = 4096;
        let env = LaunchEnv::from_env().expect("launcher env");
        let (me, world, gpu) = (env.rank, env.world_size, env.local_rank);
        let rv = Rendezvous::join(env, crate::runtime::timeout_from_env()).expect("join");
        crate::loader::require().expect("libraries");
        let ctx = CudaContext::new(gpu).expect("context");
        let comm = communicator(&rv, "world", &ctx, NcclLimits::default()).expect("communicator");
        assert_eq!(
            (
                comm.count().expect("count"),
                comm.device().expect("device"),
                comm.rank().expect("rank")
            ),
            (world as i32, gpu as i32, me as i32)
        );
        let host: Vec<u8> = (0..N)
            .flat_map(|i| f2b(((me + 1) * (i % 8)) as f32).to_le_bytes())
            .collect();
        let buf = DeviceBuffer::alloc(&ctx, N * 2).expect("buffer");
        buf.upload(&host).expect("upload");
        let s = cu::stream_create_nonblocking().expect("stream");
        let mut out = vec![0u8; N * 2];
        // SAFETY: live communicator, buffer of N bf16 on its device, our stream.
        unsafe {
            nc::all_reduce(buf.ptr(), buf.ptr(), N, comm.raw(), s).expect("all-reduce");
            cu::memcpy_dtoh_async(&mut out, buf.ptr(), s).expect("read");
            cu::stream_synchronize(s).expect("sync");
            cu::stream_destroy(s);
        }
        let ranks_sum: usize = (1..=world).sum();
        for i in 0..N {
            let got = b2f(u16::from_le_bytes([out[2 * i], out[2 * i + 1]]));
            assert_eq!(got, (ranks_sum * (i % 8)) as f32, "rank {me} element {i}");
        }
        println!("rank {me}: NCCL all-reduce over {world} processes exact");
        drop(comm);
        rv.close().expect("close");
    }
}
