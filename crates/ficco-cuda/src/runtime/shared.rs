//! Device memory shared between the processes of one node (the VMM path of
//! the signal seam; see `crate::signal`): each rank creates physical memory
//! with `cuMemCreate` (POSIX-fd handle type), exports it as a file
//! descriptor, passes the descriptor to the node's other ranks
//! ([`super::fdpass`]), and each of them imports it, reserves an address
//! range, maps it and grants its own device access. Buffers and signal
//! flags both live in such memory when one process drives one GPU.
//!
//! Every step owns what it made: a [`SharedMem`] unmaps, frees its address
//! range and releases its handle on drop, also when a later step failed.

use super::{DistError, Rendezvous};
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::DevicePtr;
use cudarc::driver::{sys, CudaContext};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// One VMM allocation mapped into this process, local or imported.
pub struct SharedMem {
    ctx: Arc<CudaContext>,
    handle: sys::CUmemGenericAllocationHandle,
    ptr: DevicePtr,
    bytes: usize,
    reserved: bool,
    mapped: bool,
}

// SAFETY: the handle and the mapping are process-wide driver objects; the
// struct only hands out addresses.
unsafe impl Send for SharedMem {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for SharedMem {}

/// `bytes` rounded up to the allocation granularity of `ordinal`.
pub fn rounded(ordinal: usize, bytes: usize) -> Result<usize> {
    let g = cu::mem_granularity(ordinal)?;
    Ok(bytes.max(1).div_ceil(g) * g)
}

impl SharedMem {
    /// New exportable memory of at least `bytes` on `ctx`'s device
    /// `ordinal` (rounded up to the granularity), mapped read-write for it.
    /// Contents are undefined.
    pub fn create(ctx: &Arc<CudaContext>, ordinal: usize, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let bytes = rounded(ordinal, bytes)?;
        let handle = cu::mem_create_fd_exportable(ordinal, bytes)?;
        Self::mapped(ctx, ordinal, handle, bytes)
    }

    /// Imports memory another process exported as `fd` (of `bytes`, the
    /// exporter's rounded size) and maps it for device `ordinal`.
    pub fn import(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        fd: BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: an open descriptor; the driver validates what it names.
        let handle = unsafe { cu::mem_import_fd(fd.as_raw_fd()) }?;
        Self::mapped(ctx, ordinal, handle, bytes)
    }

    /// Reserves, maps and grants access; `handle` is owned from here (the
    /// partial value's drop undoes whatever succeeded).
    fn mapped(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        handle: sys::CUmemGenericAllocationHandle,
        bytes: usize,
    ) -> Result<Self> {
        let mut m = SharedMem {
            ctx: ctx.clone(),
            handle,
            ptr: DevicePtr::NULL,
            bytes,
            reserved: false,
            mapped: false,
        };
        let align = cu::mem_granularity(ordinal)?;
        m.ptr = cu::mem_address_reserve(bytes, align)?;
        m.reserved = true;
        // SAFETY: the range was just reserved, of `bytes`; the handle is live
        // and its allocation is `bytes` (the caller's promise for imports,
        // checked by the driver against the allocation's size).
        unsafe { cu::mem_map(m.ptr, bytes, handle) }?;
        m.mapped = true;
        // SAFETY: just mapped.
        unsafe { cu::mem_set_access_rw(m.ptr, bytes, &[ordinal]) }?;
        Ok(m)
    }

    /// A new descriptor for this memory, to pass to another process.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        // SAFETY: a live handle created exportable (imports are not re-exported
        // by ficco, and the driver refuses if the type does not allow it).
        let fd = unsafe { cu::mem_export_fd(self.handle) }?;
        if fd < 0 {
            return Err(CudaError::Plan(format!(
                "cuMemExportToShareableHandle returned descriptor {fd}"
            )));
        }
        // SAFETY: the driver just opened this descriptor for us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The mapped size (a multiple of the granularity).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // Teardown errors cannot be reported; a context must be current.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: each step undone once, in reverse, only if it was done;
        // the owner synchronized the work that used the memory.
        unsafe {
            if self.mapped {
                cu::mem_unmap(self.ptr, self.bytes);
            }
            if self.reserved {
                cu::mem_address_free(self.ptr, self.bytes);
            }
            cu::mem_release(self.handle);
        }
    }
}

/// One buffer per rank of a node, each mapped in every local rank's
/// process: rank r's buffer is `ptr(r)` here.
pub struct SymmetricMem {
    own: SharedMem,
    /// By global rank: peers' buffers on this node, mapped here; `None` for
    /// this rank (see `own`) and for other nodes' ranks.
    peers: Vec<Option<SharedMem>>,
    rank: usize,
}

impl SymmetricMem {
    /// Every rank of the job calls this with the same `bytes` (checked):
    /// creates this rank's buffer on device `ordinal`, exchanges descriptors
    /// with the node's other ranks under `name`, and maps theirs.
    /// A failure here (a CUDA error too) is passed to every rank through
    /// the store, so they stop at once instead of at their timeout.
    pub fn exchange(
        rv: &Rendezvous,
        name: &str,
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        bytes: usize,
    ) -> Result<Self> {
        Self::exchange_inner(rv, name, ctx, ordinal, bytes).map_err(|e| abort_on(rv, e))
    }

    fn exchange_inner(
        rv: &Rendezvous,
        name: &str,
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        bytes: usize,
    ) -> Result<Self> {
        let sizes = rv.all_gather(&format!("symm/{name}/bytes"), &(bytes as u64).to_le_bytes())?;
        if let Some((r, _)) = sizes
            .iter()
            .enumerate()
            .find(|(_, s)| s.as_slice() != (bytes as u64).to_le_bytes())
        {
            return Err(DistError::Mismatch(format!(
                "symmetric buffer {name}: rank {} asks {bytes} bytes, rank {r} another size",
                rv.env.rank
            ))
            .into());
        }
        Self::share(
            rv,
            name,
            ctx,
            ordinal,
            SharedMem::create(ctx, ordinal, bytes)?,
        )
    }

    /// The descriptor exchange and the mappings of [`Self::exchange`], once
    /// every rank agreed on the size and made its buffer `own`.
    fn share(
        rv: &Rendezvous,
        name: &str,
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        own: SharedMem,
    ) -> Result<Self> {
        let fd = own.export_fd()?;
        let fds = super::fdpass::exchange(rv, &format!("symm.{name}"), fd.as_fd())?;
        let mut peers = Vec::with_capacity(fds.len());
        for fd in fds {
            peers.push(match fd {
                Some(fd) => Some(SharedMem::import(ctx, ordinal, fd.as_fd(), own.bytes())?),
                None => None,
            });
        }
        // Nobody may use (or unmap) a peer's buffer before all are mapped.
        rv.barrier(&format!("symm/{name}/mapped"))?;
        Ok(SymmetricMem {
            own,
            peers,
            rank: rv.env.rank,
        })
    }

    /// Rank `r`'s buffer as mapped in this process (None: another node).
    pub fn ptr(&self, r: usize) -> Option<DevicePtr> {
        if r == self.rank {
            return Some(self.own.ptr());
        }
        self.peers.get(r)?.as_ref().map(|m| m.ptr())
    }

    pub fn bytes(&self) -> usize {
        self.own.bytes()
    }
}

/// The executor reaches the job through this (barriers around a run, and a
/// failure passed on to every rank).
impl crate::exec::shared::JobLink for Rendezvous {
    fn world_size(&self) -> usize {
        self.env.world_size
    }

    fn rank(&self) -> usize {
        self.env.rank
    }

    fn barrier(&self, tag: &str) -> crate::error::Result<()> {
        Ok(Rendezvous::barrier(self, tag)?)
    }

    fn abort_on(&self, e: CudaError) -> CudaError {
        abort_on(self, e)
    }
}

/// Tells the other ranks about a failure of this one that is not already
/// the store's business (those were passed on where they happened).
pub(crate) fn abort_on(rv: &Rendezvous, e: CudaError) -> CudaError {
    // Another rank's failure or the store's was passed on where it
    // happened; a skip is decided alike on every rank from the plan.
    if !matches!(e, CudaError::Dist(_) | CudaError::Skipped(_)) {
        rv.store().abort(&e.to_string());
    }
    e
}

#[cfg(test)]
mod tests {
    //! GPU tests, `#[ignore]`d (one GPU; see `ficco-testkit` for the policy),
    //! and one CPU test. The two- and four-process tests re-execute this test
    //! binary: the parent starts the ranks as children
    //! (`FICCO_DIST_GPU_CHILD=1` and the launcher variables), all on GPU 0,
    //! each seeing only that GPU, and checks they exit 0 in time.
    use super::*;
    use crate::runtime::LaunchEnv;
    use ficco_testkit::{gate, GpuAvailability};
    use std::time::Duration;

    /// GPU 0's context; fails `test` where there is no usable GPU.
    fn gpu(test: &str) -> Arc<CudaContext> {
        let found = match crate::loader::require().and_then(|_| crate::info::device_count()) {
            Ok(n) => GpuAvailability::Found(n),
            Err(e) => GpuAvailability::Unusable(e.to_string()),
        };
        gate(test, 1, found);
        CudaContext::new(0).expect("primary context")
    }

    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| ((i as u64 * 31 + seed as u64 * 7 + 3) % 251) as u8)
            .collect()
    }

    /// CPU: a CUDA failure of one rank reaches the others' waits at once,
    /// with its text; a rendezvous error is not re-posted.
    #[test]
    fn a_cuda_failure_of_one_rank_ends_the_others_waits() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let t0 = std::time::Instant::now();
        let hs: Vec<_> = (0..2usize)
            .map(|r| {
                std::thread::spawn(move || {
                    let env = LaunchEnv {
                        rank: r,
                        world_size: 2,
                        local_rank: r,
                        local_world_size: 2,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                        store_port: port,
                        secret: crate::runtime::JobSecret::from_hex(&"17".repeat(32)),
                        store_bind: None,
                    };
                    // Rank 0 may still be joining when rank 1 fails.
                    let rv = match Rendezvous::join_as(env, Duration::from_secs(20), "n") {
                        Ok(rv) => rv,
                        Err(e) if r == 0 => return Some(e.to_string()),
                        Err(e) => panic!("join: {e}"),
                    };
                    if r == 1 {
                        let e = abort_on(&rv, CudaError::Plan("out of device memory".into()));
                        assert!(matches!(e, CudaError::Plan(_)));
                        // A rendezvous error is passed on as it is.
                        let d = abort_on(&rv, CudaError::Dist(DistError::Mismatch("x".into())));
                        assert!(matches!(d, CudaError::Dist(_)));
                        // The failing rank stops; a later wait of its own fails too.
                        rv.store().get("anything").err().map(|e| e.to_string())
                    } else {
                        rv.barrier("after").err().map(|e| e.to_string())
                    }
                })
            })
            .collect();
        let errs: Vec<_> = hs.into_iter().map(|h| h.join().expect("rank")).collect();
        for e in errs {
            let e = e.expect("an error");
            assert!(
                e.contains("rank 1 failed") && e.contains("out of device memory"),
                "{e}"
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// In one process: an exported allocation imported again is the same
    /// memory (bytes written through one mapping read back through the other).
    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn an_exported_allocation_reimported_aliases_it() {
        let ctx = gpu("an_exported_allocation_reimported_aliases_it");
        let a = SharedMem::create(&ctx, 0, 5000).expect("create");
        assert_eq!(a.bytes() % cu::mem_granularity(0).expect("granularity"), 0);
        assert!(a.bytes() >= 5000);
        let fd = a.export_fd().expect("export");
        let b = SharedMem::import(&ctx, 0, fd.as_fd(), a.bytes()).expect("import");
        assert_ne!(a.ptr(), b.ptr());
        let want = pattern(1, 5000);
        let mut got = vec![0u8; 5000];
        // SAFETY: both mappings hold a.bytes() >= 5000 bytes; ctx is current.
        unsafe {
            cu::memcpy_htod(a.ptr(), &want).expect("upload");
            cu::memcpy_dtoh(&mut got, b.ptr()).expect("download");
        }
        assert_eq!(got, want);
    }

    /// Every handle, mapping and address range goes on drop, also after a
    /// failed step: eight rounds of a quarter of the GPU's memory (created,
    /// exported, imported, plus an import whose mapping fails for a size
    /// larger than the allocation) would run out of memory by the fourth
    /// round if any round leaked its allocation.
    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn dropping_shared_memory_releases_it_also_after_a_failed_map() {
        let ctx = gpu("dropping_shared_memory_releases_it_also_after_a_failed_map");
        let total = cu::device_total_mem(cu::device(0).expect("device")).expect("memory");
        let chunk = rounded(0, total / 4).expect("granularity");
        for round in 0..8 {
            let a = SharedMem::create(&ctx, 0, chunk)
                .unwrap_or_else(|e| panic!("round {round}: create {chunk} bytes: {e}"));
            let fd = a.export_fd().expect("export");
            let b = SharedMem::import(&ctx, 0, fd.as_fd(), a.bytes()).expect("import");
            match SharedMem::import(&ctx, 0, fd.as_fd(), 2 * a.bytes()) {
                Err(CudaError::Driver { call, .. }) => assert_eq!(call, "cuMemMap"),
                Err(e) => panic!("round {round}: unexpected error {e}"),
                Ok(_) => panic!(
                    "mapped {} bytes of a {}-byte allocation",
                    2 * a.bytes(),
                    a.bytes()
                ),
            }
            drop((b, fd, a));
        }
    }

    /// A descriptor that is not a CUDA allocation is a driver error naming
    /// the import (and nothing leaks: the handle was never made).
    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn importing_a_plain_file_is_a_driver_error() {
        let ctx = gpu("importing_a_plain_file_is_a_driver_error");
        let f = std::fs::File::open("/proc/self/stat").expect("a plain file");
        match SharedMem::import(&ctx, 0, f.as_fd(), 2 << 20) {
            Err(CudaError::Driver { call, .. }) => {
                assert_eq!(call, "cuMemImportFromShareableHandle")
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("imported a plain file"),
        }
    }

    /// Runs [`child`] as `world` processes on GPU 0 (the test `test`).
    fn ring(test: &str, world: usize) {
        if std::env::var("FICCO_DIST_GPU_CHILD").is_ok() {
            child();
            return;
        }
        gpu(test);
        let codes = crate::runtime::run_children(
            &format!("runtime::shared::tests::{test}"),
            world,
            "FICCO_DIST_GPU_CHILD",
            crate::runtime::ChildGpus::First,
            Duration::from_secs(60),
        );
        assert_eq!(codes, vec![Some(0); world], "rank exit codes");
    }

    /// Set for the foreign process of the intruder test: the job's store port.
    const INTRUDER: &str = "FICCO_DIST_GPU_INTRUDER";
    /// A file the foreign process makes once it attacked; rank 3 waits for
    /// it before its part of the buffer exchange, so the attack lands while
    /// the other ranks' descriptor sockets wait for rank 3.
    const MARK: &str = "FICCO_DIST_GPU_INTRUDE_MARK";
    const INTRUDED: &str = "four_processes_share_buffers_while_a_foreign_process_attacks";
    /// Bytes of the ring's buffers (also the foreign allocation's).
    const RING_BYTES: usize = 3 << 20;

    /// Four processes on GPU 0 pass real device allocations around a ring
    /// while a foreign process (no job secret, not a rank) connects to the
    /// store with a wrong secret and to every descriptor socket of the
    /// exchange, handing each an allocation of its own, filled with its own
    /// pattern, under a rank's tag. The ranks refuse it and every rank
    /// still reads exactly its peer's pattern (a foreign buffer mapped as a
    /// peer's would not hold it); the foreign process exits 0 only once it
    /// reached the sockets and the store refused it.
    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn four_processes_share_buffers_while_a_foreign_process_attacks() {
        if let Ok(port) = std::env::var(INTRUDER) {
            intruder(&port);
            return;
        }
        if std::env::var("FICCO_DIST_GPU_CHILD").is_ok() {
            child();
            return;
        }
        gpu(INTRUDED);
        let mark = std::env::temp_dir().join(format!("ficco-gpu-intruded-{}", std::process::id()));
        let _ = std::fs::remove_file(&mark);
        let test = format!("runtime::shared::tests::{INTRUDED}");
        let exe = std::env::current_exe().expect("test binary");
        let foreign = |port: u16| {
            let mut c = std::process::Command::new(&exe);
            c.args([test.as_str(), "--exact", "--include-ignored", "--nocapture"])
                .env(INTRUDER, port.to_string())
                .env(MARK, &mark)
                .env_remove("FICCO_JOB_SECRET");
            c
        };
        let (codes, intruder_code) = crate::runtime::run_children_beside(
            &test,
            4,
            "FICCO_DIST_GPU_CHILD",
            crate::runtime::ChildGpus::First,
            Duration::from_secs(90),
            &crate::runtime::Beside {
                env: vec![(MARK, mark.clone().into_os_string())],
                process: Some(&foreign),
            },
        );
        let _ = std::fs::remove_file(&mark);
        assert_eq!(codes, vec![Some(0); 4], "rank exit codes");
        assert_eq!(
            intruder_code,
            Some(0),
            "the foreign process reached the descriptor sockets and the store refused it"
        );
    }

    /// [`SymmetricMem::exchange`] without its size agreement (a collective,
    /// which would hold the others back before their sockets exist), rank 3
    /// joining the descriptor exchange only once the foreign process
    /// attacked: the others' sockets wait for rank 3 meanwhile.
    fn exchange_once_attacked(
        rv: &Rendezvous,
        ctx: &Arc<CudaContext>,
        bytes: usize,
        mark: &std::ffi::OsStr,
    ) -> SymmetricMem {
        let own = SharedMem::create(ctx, 0, bytes).expect("create");
        if rv.env.rank == 3 {
            let t = std::time::Instant::now();
            while !std::path::Path::new(mark).exists() && t.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        SymmetricMem::share(rv, "data", ctx, 0, own).expect("share")
    }

    /// The foreign process of [`four_processes_share_buffers_while_a_foreign_process_attacks`].
    fn intruder(port: &str) {
        crate::loader::require().expect("libraries");
        let ctx = CudaContext::new(0).expect("context");
        let own = SharedMem::create(&ctx, 0, RING_BYTES).expect("a foreign allocation");
        ctx.bind_to_thread().expect("bind");
        // SAFETY: the allocation holds RING_BYTES bytes on this context.
        unsafe { cu::memcpy_htod(own.ptr(), &pattern(200, RING_BYTES)) }.expect("fill");
        let fd = own.export_fd().expect("export");
        let (attacked, held) = ficco_testkit::attack_descriptor_sockets(
            ".symm.data.",
            3,
            4,
            Duration::from_secs(20),
            |c, tag| {
                let _ = crate::runtime::fdpass::send_fd(c, tag, fd.as_fd());
            },
        );
        let wrong = crate::runtime::JobSecret::generate().expect("random");
        let refused = matches!(
            crate::runtime::StoreClient::connect(
                &format!("127.0.0.1:{port}"),
                1,
                Duration::from_secs(3),
                &wrong
            ),
            Err(DistError::StoreAuth { .. })
        );
        eprintln!("foreign process: reached {attacked:?}; store refused it: {refused}");
        let mark = std::env::var_os(MARK).expect("the mark's path");
        std::fs::write(mark, b"attacked").expect("the mark");
        // Held open while the ranks accept (they check the pid the kernel
        // recorded at connect), and the allocation stays alive meanwhile.
        std::thread::sleep(Duration::from_secs(3));
        drop(held);
        std::process::exit(if refused && attacked.len() >= 3 { 0 } else { 1 });
    }

    /// Two processes on GPU 0: each copies a pattern into the other's
    /// buffer and sets the other's flag from its stream (the signal seam's
    /// producer side); each waits on its own flag on the device and reads
    /// its buffer: exactly the peer's pattern.
    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn two_processes_share_a_buffer_and_a_flag() {
        ring("two_processes_share_a_buffer_and_a_flag", 2);
    }

    /// The same as a ring of four processes: rank r pushes to rank r+1.
    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn four_processes_pass_buffers_and_flags_around_a_ring() {
        ring("four_processes_pass_buffers_and_flags_around_a_ring", 4);
    }

    /// One rank of [`ring`]: pushes its pattern to rank `me + 1` and checks
    /// that of rank `me - 1` (mod world).
    fn child() {
        const N: usize = RING_BYTES;
        let env = LaunchEnv::from_env().expect("launcher env");
        let me = env.rank;
        let world = env.world_size;
        let peer = (me + 1) % world;
        let prev = (me + world - 1) % world;
        let rv = Rendezvous::join(env, crate::runtime::timeout_from_env()).expect("join");
        crate::loader::require().expect("libraries");
        let ctx = CudaContext::new(0).expect("context");
        let data = match std::env::var_os(MARK) {
            Some(mark) => exchange_once_attacked(&rv, &ctx, N, &mark),
            None => SymmetricMem::exchange(&rv, "data", &ctx, 0, N).expect("data"),
        };
        let flags = SymmetricMem::exchange(&rv, "flags", &ctx, 0, 4096).expect("flags");
        let (Some(peer_data), Some(peer_flag), Some(own_flag)) =
            (data.ptr(peer), flags.ptr(peer), flags.ptr(me))
        else {
            panic!("a local peer's buffer is not mapped");
        };
        ctx.bind_to_thread().expect("bind");
        let mine = pattern(me as u8, N);
        let staging = SharedMem::create(&ctx, 0, N).expect("staging");
        // SAFETY: every address below is a live mapping of at least the
        // bytes used, on this context's device; the stream is ours.
        unsafe {
            cu::memcpy_htod(own_flag, &[0u8; 4]).expect("clear own flag");
            cu::memcpy_htod(data.ptr(me).expect("own"), &vec![0u8; N]).expect("clear");
            cu::memcpy_htod(staging.ptr(), &mine).expect("stage");
        }
        rv.barrier("cleared").expect("barrier");
        let s = cu::stream_create_nonblocking().expect("stream");
        let mut got = vec![0u8; N];
        let mut flag = [0u8; 4];
        // SAFETY: as above; the host slices live until the synchronize.
        unsafe {
            cu::memcpy_async(peer_data, staging.ptr(), N, s).expect("push");
            cu::stream_write_value32(s, peer_flag, crate::signal::SET).expect("signal");
            cu::stream_wait_value32_geq(s, own_flag, crate::signal::SET).expect("wait");
            cu::memcpy_dtoh_async(&mut got, data.ptr(me).expect("own"), s).expect("read");
            cu::memcpy_dtoh_async(&mut flag, own_flag, s).expect("read flag");
            cu::stream_synchronize(s).expect("sync");
            cu::stream_destroy(s);
        }
        assert_eq!(u32::from_le_bytes(flag), crate::signal::SET);
        let want = pattern(prev as u8, N);
        let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(
            bad, 0,
            "rank {me}: {bad} of {N} bytes differ from rank {prev}'s"
        );
        println!(
            "rank {me}: {N} bytes from rank {prev} exact, flag {}",
            crate::signal::SET
        );
        // Nobody unmaps before the peer finished reading through its mapping.
        rv.barrier("done").expect("barrier");
        drop((data, flags, staging));
        rv.close().expect("close");
    }
}
