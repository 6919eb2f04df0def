//! The executor: one process drives every GPU, one host thread per GPU.
//!
//! Per rank: a context (cudarc event tracking off), streams created with the
//! plan's priorities, an event per task, a control stream that starts and ends
//! each iteration. Dependencies go through [`CrossRankSync`]; between
//! iterations every rank's streams wait for every rank's end of the previous
//! iteration, so pushes into a peer's buffers cannot overrun.

use crate::controls::RawStream;
use crate::error::{check, drv, nccl, CudaError, Result};
use crate::gemm::{GemmKey, Gemms, WORKSPACE_BYTES};
use crate::green::{GreenPartition, PartitionRequest};
use crate::kernels::{Kernels, ReduceSrcs, MAX_REDUCE_SRCS};
use crate::mem::{copy_2d_async, memset_d16_async, CopyEnd, DeviceBuffer};
use crate::nccl_config::{CommCache, NcclLimits};
use crate::shaped::ShapedGemm;
use crate::sync::{CrossRankSync, InProcessSync, Point};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use cudarc::nccl::sys as nsys;
use ficco_core::plan::{Buffer, NcclOp, Plan, RankPlan, Resources, StreamRole, TaskKind, View};
use ficco_core::problem::workload::ELEM_BYTES;
use ficco_core::space::Priority;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// bf16 quiet NaN, used to poison outputs before a checked run.
pub const BF16_NAN: u16 = 0x7fc0;

/// An NCCL communicator of one rank (all created together by `ncclCommInitAll`).
pub struct NcclComm(nsys::ncclComm_t);

// SAFETY: each communicator is used by one host thread at a time.
unsafe impl Send for NcclComm {}

impl NcclComm {
    pub fn raw(&self) -> nsys::ncclComm_t {
        self.0
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: created by ncclCommInitAll, destroyed once.
        unsafe {
            let _ = cudarc::nccl::result::comm_destroy(self.0);
        }
    }
}

/// Creates one communicator per device 0..n in this process (~0.5 s; done once).
pub fn init_comms(n: usize) -> Result<Vec<NcclComm>> {
    let mut comms = vec![std::ptr::null_mut(); n];
    let devs: Vec<i32> = (0..n as i32).collect();
    // SAFETY: arrays of n entries.
    unsafe {
        cudarc::nccl::result::comm_init_all(comms.as_mut_ptr(), n as i32, devs.as_ptr())
            .map_err(nccl("ncclCommInitAll"))?;
    }
    Ok(comms.into_iter().map(NcclComm).collect())
}

/// Establishes NCCL's connections up front (they are made lazily at the first
/// call of each kind, which blocks the host until peers join): all-reduce of a
/// small and a large message, all-gather, reduce-scatter and a send/recv with
/// every peer, issued from this thread in one group per step.
pub fn warm_comms(ctxs: &[Arc<CudaContext>], comms: &[nsys::ncclComm_t]) -> Result<()> {
    use cudarc::nccl::result as nr;
    let n = ctxs.len();
    let elems = 4 << 20; // 8 MiB of bf16 per buffer
    let mut bufs = vec![];
    let mut streams = vec![];
    for ctx in ctxs {
        bufs.push((
            DeviceBuffer::alloc(ctx, elems * 2 * n)?,
            DeviceBuffer::alloc(ctx, elems * 2 * n)?,
        ));
        streams.push(ctx.new_stream().map_err(drv("cuStreamCreate"))?);
    }
    let bf = nsys::ncclDataType_t::ncclBfloat16;
    let sum = nsys::ncclRedOp_t::ncclSum;
    // Each collective at an LL-, LL128- and Simple-sized message, so every
    // kernel and connection NCCL picks later already exists.
    let sizes = [1024usize, 64 << 10, elems];
    for step in 0..4 * sizes.len() {
        let (kind, count) = (step % 4, sizes[step / 4]);
        nr::group_start().map_err(nccl("ncclGroupStart"))?;
        for r in 0..n {
            let (a, b) = (
                bufs[r].0.ptr() as *mut c_void,
                bufs[r].1.ptr() as *mut c_void,
            );
            let s = streams[r].cu_stream() as nsys::cudaStream_t;
            let c = comms[r];
            // SAFETY: buffers hold n * elems bf16 each; one stream per comm.
            let res = unsafe {
                match kind {
                    0 => nr::all_reduce(a, b, count, bf, sum, c, s),
                    1 => nr::all_gather(a, b, count, bf, c, s),
                    2 => nr::reduce_scatter(a, b, count, bf, sum, c, s),
                    _ => {
                        let mut res = Ok(nr::NcclStatus::Success);
                        for p in (0..n).filter(|&p| p != r) {
                            res = res
                                .and_then(|_| nr::send(a, count, bf, p as i32, c, s))
                                .and_then(|_| nr::recv(b, count, bf, p as i32, c, s));
                        }
                        res
                    }
                }
            };
            if let Err(e) = res {
                let _ = nr::group_end();
                return Err(nccl("NCCL warm-up")(e));
            }
        }
        nr::group_end().map_err(nccl("ncclGroupEnd (warm-up)"))?;
    }
    for s in &streams {
        s.synchronize().map_err(drv("cuStreamSynchronize"))?;
    }
    Ok(())
}

/// Streams on a green-context split of one rank, kept between plans.
struct GreenSet {
    /// Borrowing wrappers of `raw` by (communication side, priority); dropped first.
    wrapped: HashMap<(bool, i32), Vec<Arc<CudaStream>>>,
    raw: Vec<RawStream>,
    partition: GreenPartition,
}

/// The NCCL communicator a rank uses for one plan.
#[derive(Clone, Copy)]
pub struct CommHandle(pub nsys::ncclComm_t);
// SAFETY: each handle is used by its rank's thread only during a run.
unsafe impl Send for CommHandle {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for CommHandle {}

/// One GPU and everything the executor keeps on it between plans.
pub struct Rank {
    pub rank: usize,
    pub ctx: Arc<CudaContext>,
    pub kernels: Kernels,
    gemms: Gemms,
    comm: NcclComm,
    /// (least, greatest) stream priority.
    pub priority_range: (i32, i32),
    control: Arc<CudaStream>,
    /// Streams by priority value, reused between plans.
    streams: HashMap<i32, Vec<Arc<CudaStream>>>,
    /// GEMM workspace per plan stream index.
    workspaces: Vec<DeviceBuffer>,
    /// Allocations reused between plans: (bytes, buffer, in use by current plan).
    pool: Vec<DeviceBuffer>,
    /// 2 f64 + 1 u64 for the check kernel.
    check_acc: DeviceBuffer,
    /// GEMM configurations already run once (their kernels are loaded).
    warmed: std::collections::HashSet<GemmKey>,
    /// ficco's shaped GEMM, loaded when a plan first asks for occupancy shaping.
    shaped: Option<ShapedGemm>,
    /// Green-context splits by compute SM count.
    green: HashMap<usize, GreenSet>,
}

impl Rank {
    pub fn new(rank: usize, ctx: Arc<CudaContext>, comm: NcclComm) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: we never hand cudarc-tracked slices to kernels; all ordering is ours.
        unsafe { ctx.disable_event_tracking() };
        let priority_range = cudarc::driver::result::stream::get_priority_range()
            .map_err(drv("cuCtxGetStreamPriorityRange"))?;
        let control = ctx
            .new_stream_with_priority(priority_range.0)
            .map_err(drv("cuStreamCreateWithPriority"))?;
        Ok(Rank {
            rank,
            kernels: Kernels::load(&ctx)?,
            gemms: Gemms::new()?,
            comm,
            priority_range,
            control,
            streams: HashMap::new(),
            workspaces: vec![],
            pool: vec![],
            check_acc: DeviceBuffer::alloc(&ctx, 32)?,
            warmed: Default::default(),
            shaped: None,
            green: HashMap::new(),
            ctx,
        })
    }

    pub fn control(&self) -> &Arc<CudaStream> {
        &self.control
    }

    /// Allocates a buffer (plain cuMemAlloc), outside the pool.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc(&self.ctx, bytes)
    }

    /// Binds every buffer of `rp` to a pool allocation of exactly its size,
    /// allocating where none is free. Returns the base pointer of each buffer.
    pub fn bind(&mut self, rp: &RankPlan) -> Result<Vec<u64>> {
        let mut used = vec![false; self.pool.len()];
        let mut ptrs = Vec::with_capacity(rp.buffers.len());
        for b in &rp.buffers {
            let bytes = b.bytes();
            let found = (0..self.pool.len()).find(|&i| !used[i] && self.pool[i].bytes() == bytes);
            let i = match found {
                Some(i) => i,
                None => {
                    let buf = match DeviceBuffer::alloc(&self.ctx, bytes) {
                        Ok(b) => b,
                        Err(_) => {
                            // Out of memory: drop pool entries this plan does not use, retry.
                            let mut keep = vec![];
                            let mut keep_used = vec![];
                            for (j, d) in std::mem::take(&mut self.pool).into_iter().enumerate() {
                                if used[j] {
                                    keep.push(d);
                                    keep_used.push(true);
                                }
                            }
                            self.pool = keep;
                            used = keep_used;
                            // Pointers handed out so far stay valid: kept entries are not freed.
                            DeviceBuffer::alloc(&self.ctx, bytes)?
                        }
                    };
                    self.pool.push(buf);
                    used.push(false);
                    self.pool.len() - 1
                }
            };
            used[i] = true;
            ptrs.push(self.pool[i].ptr());
        }
        Ok(ptrs)
    }

    /// The plan's streams, created (or reused) with the device's priorities:
    /// High = greatest, Normal = least. Under a green split, compute streams
    /// are on the compute green context and communication streams on the rest.
    fn plan_streams(&mut self, rp: &RankPlan, res: &Resources) -> Result<Vec<Arc<CudaStream>>> {
        let mut taken: HashMap<(bool, i32), usize> = HashMap::new();
        let mut out = vec![];
        if let Some(sms) = res.green_sms {
            if !self.green.contains_key(&sms) {
                let partition =
                    GreenPartition::new(&self.ctx, PartitionRequest::split(sms as u32))?;
                self.green.insert(
                    sms,
                    GreenSet {
                        wrapped: HashMap::new(),
                        raw: vec![],
                        partition,
                    },
                );
            }
        }
        for s in &rp.streams {
            let prio = match s.priority {
                Priority::High => self.priority_range.1,
                Priority::Normal => self.priority_range.0,
            };
            let comm = s.role == StreamRole::Comm;
            let stream = match res.green_sms.and_then(|n| self.green.get_mut(&n)) {
                Some(g) => {
                    let key = (comm, prio);
                    let k = taken.entry(key).or_insert(0);
                    let list = g.wrapped.entry(key).or_default();
                    if list.len() <= *k {
                        let raw = g.partition.new_stream(comm, prio)?;
                        // SAFETY: `raw` is kept in the same GreenSet and dropped
                        // after the wrapper; ordering is ours (event tracking off).
                        list.push(unsafe { self.ctx.wrap_borrowed_stream(raw.cu_stream()) });
                        g.raw.push(raw);
                    }
                    *k += 1;
                    list[*k - 1].clone()
                }
                None => {
                    let k = taken.entry((false, prio)).or_insert(0);
                    let list = self.streams.entry(prio).or_default();
                    if list.len() <= *k {
                        list.push(
                            self.ctx
                                .new_stream_with_priority(prio)
                                .map_err(drv("cuStreamCreateWithPriority"))?,
                        );
                    }
                    *k += 1;
                    list[*k - 1].clone()
                }
            };
            out.push(stream);
        }
        while self.workspaces.len() < rp.streams.len() {
            self.workspaces
                .push(DeviceBuffer::alloc(&self.ctx, WORKSPACE_BYTES)?);
        }
        Ok(out)
    }

    /// Loads ficco's shaped GEMM when `rp` has a shaped GEMM task.
    fn prepare_shaped(&mut self, rp: &RankPlan) -> Result<()> {
        let wants = rp.tasks.iter().any(|t| {
            matches!(
                t.kind,
                TaskKind::Gemm {
                    occupancy: Some(_),
                    ..
                }
            )
        });
        if wants && self.shaped.is_none() {
            self.shaped = Some(ShapedGemm::load(&self.ctx)?);
        }
        Ok(())
    }

    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    }

    /// Runs every GEMM configuration of `rp` not run before once, alone, into a
    /// temporary output. CUDA loads kernels lazily, and loading one can wait for
    /// the device to go idle: inside a running plan that can deadlock against an
    /// NCCL kernel waiting for a peer. Call before the rank threads start.
    fn prewarm_gemms(&mut self, rp: &RankPlan, ptrs: &[u64]) -> Result<()> {
        for t in &rp.tasks {
            let TaskKind::Gemm {
                a, b, c, sm_target, ..
            } = &t.kind
            else {
                continue;
            };
            let (pa, lda) = view_addr(&rp.buffers, ptrs, a, "gemm a")?;
            let (pb, ldb) = view_addr(&rp.buffers, ptrs, b, "gemm b")?;
            let (_, ldc) = view_addr(&rp.buffers, ptrs, c, "gemm c")?;
            let key = GemmKey {
                m: a.rows,
                n: b.cols,
                k: a.cols,
                lda: lda / ELEM_BYTES,
                ldb: ldb / ELEM_BYTES,
                ldc: ldc / ELEM_BYTES,
                sm_target: *sm_target,
            };
            if self.warmed.contains(&key) || a.cols != b.rows {
                continue;
            }
            let tmp = DeviceBuffer::alloc(&self.ctx, key.m * key.ldc * ELEM_BYTES)?;
            let ws = self.workspaces.first().map(|w| w.ptr()).unwrap_or(0);
            // SAFETY: a and b are bounds-checked live views; tmp holds m rows at ldc.
            unsafe {
                self.gemms.tune(key, pa, pb, tmp.ptr(), ws, &self.control)?;
            }
            self.control
                .synchronize()
                .map_err(drv("cuStreamSynchronize"))?;
            self.warmed.insert(key);
        }
        Ok(())
    }
}

/// How to run a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSpec {
    /// Iterations run before the timed ones.
    pub warmup: usize,
    /// Timed iterations (0: run `warmup` iterations only, no timing).
    pub timed: usize,
    /// Record per-task events in one extra iteration after the timed ones.
    pub timeline: bool,
}

impl RunSpec {
    /// Run the plan once, untimed (reference runs and correctness checks).
    pub const ONCE: RunSpec = RunSpec {
        warmup: 1,
        timed: 0,
        timeline: false,
    };
}

/// What one rank's thread measured.
#[derive(Debug, Clone, Default)]
pub struct RankTimes {
    /// Per timed iteration, ms from start to end on this rank.
    pub iters: Vec<f64>,
    /// Per task (start, end) in ms from the iteration start, when asked.
    pub tasks: Vec<(f64, f64)>,
    /// Per timed iteration, host µs this thread spent issuing the plan: every
    /// launch, copy, event record and cross-rank wait, from the start event
    /// to the end event (no CUDA graphs).
    pub host_us: Vec<f64>,
}

/// Bounds-checked device address of a view's first element, and its pitch in bytes.
fn view_addr(bufs: &[Buffer], ptrs: &[u64], v: &View, what: &str) -> Result<(u64, usize)> {
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
        ptrs[v.buf] + ((v.row * b.cols + v.col) * ELEM_BYTES) as u64,
        b.cols * ELEM_BYTES,
    ))
}

/// Checks every task of `plan` on the host before anything is issued: a task
/// that fails to issue on one rank would leave its peers' NCCL kernels waiting
/// forever on the device.
pub fn precheck(plan: &Plan, ptrs: &[Vec<u64>]) -> Result<()> {
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

/// The tasks whose completion another stream waits for. Dependencies on an
/// earlier task of the same stream are already kept by stream order, so
/// neither their record nor their wait is issued: each costs host time on
/// every launch of the plan.
pub fn cross_stream_points(plan: &Plan) -> Vec<Vec<bool>> {
    let mut out: Vec<Vec<bool>> = plan
        .ranks
        .iter()
        .map(|rp| vec![false; rp.tasks.len()])
        .collect();
    for (r, rp) in plan.ranks.iter().enumerate() {
        for t in &rp.tasks {
            for d in &t.deps {
                if !same_stream(plan, r, t.stream, d.rank, d.index) {
                    if let Some(x) = out.get_mut(d.rank).and_then(|v| v.get_mut(d.index)) {
                        *x = true;
                    }
                }
            }
        }
    }
    out
}

/// Task `index` of rank `dep_rank` runs on stream `stream` of rank `rank`.
fn same_stream(plan: &Plan, rank: usize, stream: usize, dep_rank: usize, index: usize) -> bool {
    dep_rank == rank
        && plan.ranks[rank]
            .tasks
            .get(index)
            .is_some_and(|t| t.stream == stream)
}

/// Everything the rank threads share for one run.
pub struct Shared<'a> {
    pub plan: &'a Plan,
    /// Base pointers per rank per buffer.
    pub ptrs: &'a [Vec<u64>],
    /// Raw context of each rank (peer copies name both).
    pub ctxs: &'a [Arc<CudaContext>],
    pub sync: &'a dyn CrossRankSync,
    /// Each rank's communicator for this plan (its NCCL limits).
    pub comms: &'a [CommHandle],
    /// Per rank per task: another stream (of any rank) waits for it, so its
    /// completion must be recorded. See [`cross_stream_points`].
    pub recorded: &'a [Vec<bool>],
    pub spec: RunSpec,
    /// Every rank thread passes it once its events exist.
    pub start: &'a std::sync::Barrier,
}

fn issue(
    rank: &mut Rank,
    sh: &Shared<'_>,
    stream: &CudaStream,
    stream_idx: usize,
    kind: &TaskKind,
) -> Result<()> {
    let r = rank.rank;
    let rp = &sh.plan.ranks[r];
    let ptrs = &sh.ptrs[r];
    let s = stream.cu_stream();
    match kind {
        TaskKind::Gemm {
            a,
            b,
            c,
            sm_target,
            accumulate,
            occupancy,
        } => {
            if a.cols != b.rows || c.rows != a.rows || c.cols != b.cols {
                return Err(CudaError::Plan(format!(
                    "gemm shapes do not match: a {}x{}, b {}x{}, c {}x{}",
                    a.rows, a.cols, b.rows, b.cols, c.rows, c.cols
                )));
            }
            let (pa, lda) = view_addr(&rp.buffers, ptrs, a, "gemm a")?;
            let (pb, ldb) = view_addr(&rp.buffers, ptrs, b, "gemm b")?;
            let (pc, ldc) = view_addr(&rp.buffers, ptrs, c, "gemm c")?;
            if let Some(blocks) = occupancy {
                let shaped = rank.shaped.as_ref().ok_or_else(|| {
                    CudaError::Plan("shaped GEMM not loaded before the run".into())
                })?;
                if *accumulate {
                    return Err(CudaError::Plan(
                        "ficco's shaped GEMM does not accumulate (C += A.B)".into(),
                    ));
                }
                // SAFETY: bounds-checked views of live allocations; c is an
                // output view that does not overlap a or b (validated plan).
                return unsafe {
                    shaped.launch_ld(
                        s,
                        pa,
                        lda / ELEM_BYTES,
                        pb,
                        ldb / ELEM_BYTES,
                        pc,
                        ldc / ELEM_BYTES,
                        a.rows,
                        b.cols,
                        a.cols,
                        Some(*blocks as u32),
                    )
                };
            }
            let key = GemmKey {
                m: a.rows,
                n: b.cols,
                k: a.cols,
                lda: lda / ELEM_BYTES,
                ldb: ldb / ELEM_BYTES,
                ldc: ldc / ELEM_BYTES,
                sm_target: *sm_target,
            };
            let ws = rank.workspaces[stream_idx].ptr();
            // SAFETY: views are bounds-checked against live pool allocations;
            // the workspace belongs to this stream alone.
            unsafe { rank.gemms.gemm(key, pa, pb, pc, *accumulate, ws, s) }
        }
        TaskKind::Copy { src, dst } => {
            if src.view.rows != dst.view.rows || src.view.cols != dst.view.cols {
                return Err(CudaError::Plan(
                    "copy between views of different shapes".into(),
                ));
            }
            let end = |rv: &ficco_core::plan::RankView, what| -> Result<CopyEnd> {
                let rp = sh
                    .plan
                    .ranks
                    .get(rv.rank)
                    .ok_or_else(|| CudaError::Plan(format!("{what}: no rank {}", rv.rank)))?;
                let (ptr, pitch) = view_addr(&rp.buffers, &sh.ptrs[rv.rank], &rv.view, what)?;
                Ok(CopyEnd {
                    ptr,
                    ctx: sh.ctxs[rv.rank].cu_ctx(),
                    pitch,
                })
            };
            let (se, de) = (end(src, "copy src")?, end(dst, "copy dst")?);
            // SAFETY: both ends are bounds-checked views of live allocations;
            // peer access is enabled at open.
            unsafe { copy_2d_async(se, de, src.view.cols * ELEM_BYTES, src.view.rows, s) }
        }
        TaskKind::Reduce { srcs, dst } => {
            if srcs.is_empty() || srcs.len() > MAX_REDUCE_SRCS {
                return Err(CudaError::Plan(format!(
                    "reduce of {} sources (1..={MAX_REDUCE_SRCS} supported)",
                    srcs.len()
                )));
            }
            let mut rs = ReduceSrcs::default();
            for (j, v) in srcs.iter().enumerate() {
                if v.rows != dst.rows || v.cols != dst.cols {
                    return Err(CudaError::Plan(
                        "reduce source shape differs from dst".into(),
                    ));
                }
                let (p, pitch) = view_addr(&rp.buffers, ptrs, v, "reduce src")?;
                rs.p[j] = p;
                rs.ld[j] = (pitch / ELEM_BYTES) as u64;
            }
            let (pd, pitch) = view_addr(&rp.buffers, ptrs, dst, "reduce dst")?;
            // SAFETY: bounds-checked views on this device.
            unsafe {
                rank.kernels.reduce(
                    stream,
                    &rs,
                    srcs.len(),
                    pd,
                    (pitch / ELEM_BYTES) as u64,
                    dst.rows as u64,
                    dst.cols as u64,
                )
            }
        }
        TaskKind::Nccl { op, .. } => {
            let comm = sh.comms[r].0;
            let ns = s as nsys::cudaStream_t;
            let bf = nsys::ncclDataType_t::ncclBfloat16;
            let sum = nsys::ncclRedOp_t::ncclSum;
            let contiguous = |v: &View, what: &str| -> Result<u64> {
                let (p, pitch) = view_addr(&rp.buffers, ptrs, v, what)?;
                if v.rows > 1 && pitch != v.cols * ELEM_BYTES {
                    return Err(CudaError::Plan(format!(
                        "{what}: NCCL needs a contiguous view (full rows of its buffer)"
                    )));
                }
                Ok(p)
            };
            let p = sh.plan.ranks.len();
            // SAFETY (all calls below): contiguous, bounds-checked views of live
            // allocations; the communicator belongs to this rank's thread.
            unsafe {
                match op {
                    NcclOp::AllGather { send, recv } => {
                        if recv.elems() != send.elems() * p {
                            return Err(CudaError::Plan("all-gather recv != P x send".into()));
                        }
                        let (ps, pr) = (
                            contiguous(send, "all-gather send")?,
                            contiguous(recv, "all-gather recv")?,
                        );
                        cudarc::nccl::result::all_gather(
                            ps as *const c_void,
                            pr as *mut c_void,
                            send.elems(),
                            bf,
                            comm,
                            ns,
                        )
                        .map_err(nccl("ncclAllGather"))?;
                    }
                    NcclOp::ReduceScatter { send, recv } => {
                        if send.elems() != recv.elems() * p {
                            return Err(CudaError::Plan("reduce-scatter send != P x recv".into()));
                        }
                        let (ps, pr) = (
                            contiguous(send, "reduce-scatter send")?,
                            contiguous(recv, "reduce-scatter recv")?,
                        );
                        cudarc::nccl::result::reduce_scatter(
                            ps as *const c_void,
                            pr as *mut c_void,
                            recv.elems(),
                            bf,
                            sum,
                            comm,
                            ns,
                        )
                        .map_err(nccl("ncclReduceScatter"))?;
                    }
                    NcclOp::AllReduce { send, recv } => {
                        if send.elems() != recv.elems() {
                            return Err(CudaError::Plan("all-reduce send and recv differ".into()));
                        }
                        let (ps, pr) = (
                            contiguous(send, "all-reduce send")?,
                            contiguous(recv, "all-reduce recv")?,
                        );
                        cudarc::nccl::result::all_reduce(
                            ps as *const c_void,
                            pr as *mut c_void,
                            recv.elems(),
                            bf,
                            sum,
                            comm,
                            ns,
                        )
                        .map_err(nccl("ncclAllReduce"))?;
                    }
                    NcclOp::SendRecv { sends, recvs } => {
                        cudarc::nccl::result::group_start().map_err(nccl("ncclGroupStart"))?;
                        let mut res = Ok(());
                        for (peer, v) in sends {
                            res = contiguous(v, "send").and_then(|ptr| {
                                cudarc::nccl::result::send(
                                    ptr as *const c_void,
                                    v.elems(),
                                    bf,
                                    *peer as i32,
                                    comm,
                                    ns,
                                )
                                .map(|_| ())
                                .map_err(nccl("ncclSend"))
                            });
                            if res.is_err() {
                                break;
                            }
                        }
                        if res.is_ok() {
                            for (peer, v) in recvs {
                                res = contiguous(v, "recv").and_then(|ptr| {
                                    cudarc::nccl::result::recv(
                                        ptr as *mut c_void,
                                        v.elems(),
                                        bf,
                                        *peer as i32,
                                        comm,
                                        ns,
                                    )
                                    .map(|_| ())
                                    .map_err(nccl("ncclRecv"))
                                });
                                if res.is_err() {
                                    break;
                                }
                            }
                        }
                        // Always close the group, even after an error.
                        let end = cudarc::nccl::result::group_end().map_err(nccl("ncclGroupEnd"));
                        res?;
                        end?;
                    }
                }
            }
            Ok(())
        }
    }
}

/// Runs `f` with `stream`'s context current (a green context for green
/// streams), restoring the previous one after.
fn with_stream_ctx<T>(stream: &CudaStream, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: live stream; valid out-pointer.
    check("cuStreamGetCtx", unsafe {
        cudarc::driver::sys::cuStreamGetCtx(stream.cu_stream(), &mut ctx)
    })?;
    // SAFETY: ctx is the stream's live context.
    check("cuCtxPushCurrent", unsafe {
        cudarc::driver::sys::cuCtxPushCurrent_v2(ctx)
    })?;
    let res = f();
    let mut popped = std::ptr::null_mut();
    // SAFETY: pops what was pushed above.
    let pop = check("cuCtxPopCurrent", unsafe {
        cudarc::driver::sys::cuCtxPopCurrent_v2(&mut popped)
    });
    res.and_then(|v| pop.map(|_| v))
}

/// Runs one rank's share of `warmup + timed (+1)` iterations. Iteration numbers
/// start at `first_iter` (> 0) and are the generations of the sync points.
pub fn run_rank(
    rank: &mut Rank,
    sh: &Shared<'_>,
    streams: Vec<Arc<CudaStream>>,
    first_iter: u64,
) -> Result<RankTimes> {
    let r = rank.rank;
    let bound = rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"));
    let rp = &sh.plan.ranks[r];
    let n_ranks = sh.plan.ranks.len();
    let n_tasks = rp.tasks.len();
    let ctx = rank.ctx.clone();
    let timed_ev = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventCreate"))
    };
    let plain_ev = || ctx.new_event(None).map_err(drv("cuEventCreate"));
    let spec = sh.spec;
    let total = spec.warmup + spec.timed + usize::from(spec.timeline);
    // Create every event before any rank issues work, then start together.
    let prep = (|| -> Result<_> {
        bound?;
        let mut starts: Vec<CudaEvent> = vec![];
        let mut ends: Vec<CudaEvent> = vec![];
        for _ in 0..spec.timed + usize::from(spec.timeline) {
            starts.push(timed_ev()?);
            ends.push(timed_ev()?);
        }
        let mut task_ev: Vec<(CudaEvent, CudaEvent)> = vec![];
        if spec.timeline {
            for _ in 0..n_tasks {
                task_ev.push((timed_ev()?, timed_ev()?));
            }
        }
        let go = plain_ev()?;
        let stream_done: Vec<CudaEvent> =
            streams.iter().map(|_| plain_ev()).collect::<Result<_>>()?;

        Ok((starts, ends, task_ev, go, stream_done))
    })();
    sh.start.wait();
    let (starts, ends, task_ev, go, stream_done) = prep?;
    let mut host_us = Vec::with_capacity(spec.timed);
    for it in 0..total {
        let iter = first_iter + it as u64;
        let control = rank.control.clone();
        // Barrier: wait for every rank's end of the previous iteration.
        if it > 0 {
            for q in 0..n_ranks {
                sh.sync.wait(
                    &control,
                    Point {
                        rank: q,
                        index: sh.plan.ranks[q].tasks.len(),
                    },
                    iter - 1,
                )?;
            }
        }
        let timed_slot = it.checked_sub(spec.warmup);
        let issue_start = std::time::Instant::now();
        if let Some(k) = timed_slot {
            starts[k].record(&control).map_err(drv("cuEventRecord"))?;
        }
        go.record(&control).map_err(drv("cuEventRecord"))?;
        for s in &streams {
            s.wait(&go).map_err(drv("cuStreamWaitEvent"))?;
        }
        let in_timeline = spec.timeline && it + 1 == total;
        for (i, task) in rp.tasks.iter().enumerate() {
            let stream = streams.get(task.stream).ok_or_else(|| {
                CudaError::Plan(format!("task {i} of rank {r} names stream {}", task.stream))
            })?;
            for d in task.deps.iter().filter(|d| {
                // Stream order already keeps a dependency on the same stream.
                !same_stream(sh.plan, r, task.stream, d.rank, d.index)
            }) {
                sh.sync.wait(
                    stream,
                    Point {
                        rank: d.rank,
                        index: d.index,
                    },
                    iter,
                )?;
            }
            if in_timeline {
                task_ev[i].0.record(stream).map_err(drv("cuEventRecord"))?;
            }
            if sh.plan.resources.green_sms.is_some() {
                // Green-context streams: issue in the stream's own context.
                with_stream_ctx(stream, || issue(rank, sh, stream, task.stream, &task.kind))?;
            } else {
                issue(rank, sh, stream, task.stream, &task.kind)?;
            }
            if in_timeline {
                task_ev[i].1.record(stream).map_err(drv("cuEventRecord"))?;
            }
            let waited_on = sh
                .recorded
                .get(r)
                .and_then(|v| v.get(i))
                .copied()
                .unwrap_or(true);
            if waited_on {
                sh.sync.record(Point { rank: r, index: i }, stream, iter)?;
            }
        }
        for (s, ev) in streams.iter().zip(&stream_done) {
            ev.record(s).map_err(drv("cuEventRecord"))?;
            control.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
        }
        if let Some(k) = timed_slot {
            ends[k].record(&control).map_err(drv("cuEventRecord"))?;
            if k < spec.timed {
                host_us.push(issue_start.elapsed().as_secs_f64() * 1e6);
            }
        }
        sh.sync.record(
            Point {
                rank: r,
                index: n_tasks,
            },
            &control,
            iter,
        )?;
    }
    rank.synchronize()?;
    let mut out = RankTimes {
        host_us,
        ..RankTimes::default()
    };
    for k in 0..spec.timed {
        out.iters.push(
            starts[k]
                .elapsed_ms(&ends[k])
                .map_err(drv("cuEventElapsedTime"))? as f64,
        );
    }
    if spec.timeline {
        let st = &starts[spec.timed];
        for (a, b) in &task_ev {
            out.tasks.push((
                st.elapsed_ms(a).map_err(drv("cuEventElapsedTime"))? as f64,
                st.elapsed_ms(b).map_err(drv("cuEventElapsedTime"))? as f64,
            ));
        }
    }
    Ok(out)
}

/// Runs `plan` on every rank, one host thread per GPU. `first_iter` must be
/// greater than any iteration number used before with the same sync object
/// (a fresh sync is made here, so any value > 0 works).
pub fn run_plan(
    ranks: &mut [Rank],
    plan: &Plan,
    ptrs: &[Vec<u64>],
    spec: RunSpec,
) -> Result<Vec<RankTimes>> {
    if plan.ranks.len() != ranks.len() {
        return Err(CudaError::Plan(format!(
            "plan has {} ranks but the backend drives {} GPUs",
            plan.ranks.len(),
            ranks.len()
        )));
    }
    for (r, rp) in plan.ranks.iter().enumerate() {
        if rp.streams.is_empty() && !rp.tasks.is_empty() {
            return Err(CudaError::Plan(format!(
                "rank {r} has tasks but no streams"
            )));
        }
        let _ = rp
            .streams
            .iter()
            .filter(|s| s.role == StreamRole::Comm)
            .count();
    }
    precheck(plan, ptrs)?;
    // All allocation and kernel loading happens here, before any rank issues
    // work (either can wait for a device to go idle).
    let mut all_streams = vec![];
    for (r, rank) in ranks.iter_mut().enumerate() {
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        all_streams.push(rank.plan_streams(&plan.ranks[r], &plan.resources)?);
        rank.prewarm_gemms(&plan.ranks[r], &ptrs[r])?;
        rank.prepare_shaped(&plan.ranks[r])?;
    }
    let ctxs: Vec<Arc<CudaContext>> = ranks.iter().map(|r| r.ctx.clone()).collect();
    // Communicators under the plan's NCCL limits: one set per limit, cached
    // for the process and warmed up at first use.
    let _set;
    let comms: Vec<CommHandle> = match plan.resources.nccl_ctas {
        None => ranks.iter().map(|r| CommHandle(r.comm.raw())).collect(),
        Some(ctas) => {
            let gpus: Vec<usize> = ranks.iter().map(|r| r.ctx.ordinal()).collect();
            let limits = NcclLimits {
                max_ctas: Some(ctas as u32),
                ..NcclLimits::default()
            };
            let set = CommCache::global().get(&gpus, limits)?;
            let raw: Vec<_> = set.comms().iter().map(|c| c.raw()).collect();
            if set.first_use() {
                warm_comms(&ctxs, &raw)?;
            }
            _set = set;
            raw.into_iter().map(CommHandle).collect()
        }
    };
    let start = std::sync::Barrier::new(ranks.len());
    let points: Vec<usize> = plan.ranks.iter().map(|rp| rp.tasks.len() + 1).collect();
    let sync = InProcessSync::new(&ctxs, &points)?;
    let recorded = cross_stream_points(plan);
    let sh = Shared {
        recorded: &recorded,
        plan,
        ptrs,
        ctxs: &ctxs,
        sync: &sync,
        comms: &comms,
        spec,
        start: &start,
    };
    let results: Vec<Result<RankTimes>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter_mut()
            .zip(all_streams)
            .map(|(rank, streams)| {
                let sh = &sh;
                s.spawn(move || {
                    let res = run_rank(rank, sh, streams, 1);
                    if res.is_err() {
                        sh.sync.abort();
                        let _ = rank.synchronize();
                    }
                    res
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| h.join().unwrap_or(Err(CudaError::Worker(r))))
            .collect()
    });
    // Report the root cause: a rank's own error before "another rank failed".
    let mut out = Vec::with_capacity(results.len());
    let mut first_err: Option<CudaError> = None;
    for res in results {
        match res {
            Ok(t) => out.push(t),
            Err(e) => {
                let secondary = matches!(&e, CudaError::Plan(m) if m == "another rank failed");
                if first_err.is_none()
                    || (!secondary
                        && matches!(&first_err, Some(CudaError::Plan(m)) if m == "another rank failed"))
                {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Fills `n` bf16 at `ptr` on `rank` with the NaN poison (stream-ordered on the control stream).
pub fn poison(rank: &Rank, ptr: u64, n: usize) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: callers pass pool allocations of at least n elements.
    unsafe { memset_d16_async(ptr, BF16_NAN, n, rank.control.cu_stream()) }
}

/// Device-to-device copy of `bytes` on the rank's control stream.
pub fn copy_d2d(rank: &Rank, dst: u64, src: u64, bytes: usize) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: callers pass allocations of at least `bytes` on this device.
    check("cuMemcpyDtoDAsync", unsafe {
        cudarc::driver::sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, rank.control.cu_stream())
    })
}

/// Sum of squared differences, sum of squared reference, NaN count of `n`
/// bf16 at `out` against `reference` (either may be a peer's memory).
pub fn compare(rank: &Rank, out: u64, reference: u64, n: usize) -> Result<(f64, f64, u64)> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let s = &rank.control;
    let acc = rank.check_acc.ptr();
    // SAFETY: check_acc holds 32 bytes; out/reference hold n bf16 (callers).
    unsafe {
        check(
            "cuMemsetD8Async",
            cudarc::driver::sys::cuMemsetD8Async(acc, 0, 24, s.cu_stream()),
        )?;
        rank.kernels
            .check(s, out, reference, n as u64, acc, acc + 16)?;
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
    use ficco_core::plan::lower::{comm_only, gemm_only, lower};
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::{enumerate, SpaceOptions};

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
                    let ptrs: Vec<Vec<u64>> = plan
                        .ranks
                        .iter()
                        .map(|rp| vec![0; rp.buffers.len()])
                        .collect();
                    if let Err(e) = super::precheck(&plan, &ptrs) {
                        panic!("{} {}: {e}", problem.label(), plan.name);
                    }
                }
            }
        }
    }

    /// Every task another stream waits for is recorded; tasks only their own
    /// stream follows are not (fine-grained plans have many of those).
    #[test]
    fn only_cross_stream_dependencies_are_recorded() {
        let mut skipped = 0;
        for gpus in [2, 4, 8] {
            for op in Op::ALL {
                let problem = Problem::new(op, 4096, 1024, 1024, gpus).expect("problem");
                for s in enumerate(op, SpaceOptions::default()) {
                    let Ok(plan) = lower(&problem, &s) else {
                        continue;
                    };
                    let rec = super::cross_stream_points(&plan);
                    for (r, rp) in plan.ranks.iter().enumerate() {
                        for t in &rp.tasks {
                            for d in &t.deps {
                                let producer = &plan.ranks[d.rank].tasks[d.index];
                                let cross = d.rank != r || producer.stream != t.stream;
                                assert!(!cross || rec[d.rank][d.index], "{}", plan.name);
                            }
                        }
                        skipped += rec[r].iter().filter(|x| !**x).count();
                    }
                }
            }
        }
        assert!(skipped > 0);
    }
}
