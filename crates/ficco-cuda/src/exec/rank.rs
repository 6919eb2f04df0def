//! [`Rank`]: one GPU and everything the executor keeps on it between plans:
//! the context, the control stream, plan streams by priority (and on
//! green-context splits), GEMM handles and workspaces, a buffer pool, and the
//! kernels. Allocation and kernel loading happen here, before rank threads
//! start issuing (either can wait for the device to go idle).

use super::addr::{b_view_addr, view_addr};
use super::gemm_args::{
    own_gemm_args, own_grouped_args, takes_kernel, tile_gemm_args, GroupedRoute, TileFlags,
};
use super::shared::TileTables;
use super::tables::{dest_maps_fit, tile_table_bytes};
use crate::controls::RawStream;
use crate::driver::cuda as cu;
use crate::error::{drv, Result};
use crate::gemm::{GemmKey, Gemms, WORKSPACE_BYTES};
use crate::green::{GreenPartition, PartitionRequest};
use crate::hgemm::grouped::{GroupedArgs, GroupedLaunch};
use crate::hgemm::HopperGemm;
use crate::kernels::Kernels;
use crate::mem::{DeviceBuffer, DevicePtr};
use cudarc::driver::{CudaContext, CudaStream};
use ficco_core::plan::{GemmGroup, RankPlan, Resources, StreamRole, TaskKind};
use ficco_core::problem::workload::ELEM_BYTES;
use ficco_core::space::GemmEngine;
use ficco_core::space::Priority;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Streams on a green-context split of one rank, kept between plans.
struct GreenSet {
    /// Borrowing wrappers of `raw` by (communication side, priority); dropped first.
    wrapped: HashMap<(bool, i32), Vec<Arc<CudaStream>>>,
    raw: Vec<RawStream>,
    partition: GreenPartition,
}

/// One GPU and everything the executor keeps on it between plans.
pub struct Rank {
    pub rank: usize,
    pub ctx: Arc<CudaContext>,
    pub kernels: Kernels,
    pub(super) gemms: Gemms,
    /// (least, greatest) stream priority.
    pub priority_range: (i32, i32),
    control: Arc<CudaStream>,
    /// Streams by priority value, reused between plans.
    streams: HashMap<i32, Vec<Arc<CudaStream>>>,
    /// GEMM workspace per plan stream index.
    pub(super) workspaces: Vec<DeviceBuffer>,
    /// Allocations reused between plans.
    pool: Vec<DeviceBuffer>,
    /// 2 f64 + 1 u64 for the check kernel.
    pub(super) check_acc: DeviceBuffer,
    /// cuBLASLt GEMMs already run once, with whether they accumulated
    /// (their kernels are loaded).
    warmed: HashSet<(GemmKey, bool)>,
    /// ficco's own GEMM, one per plan stream index (its split-K workspace
    /// and tickets need stream-ordered launches), loaded when a plan
    /// first runs its GEMMs on it.
    pub(super) own_gemms: Vec<HopperGemm>,
    /// The current plan's grouped GEMM tasks that run on ficco's grouped
    /// kernel, by task index: their tables, built before the run.
    pub(super) grouped: HashMap<usize, GroupedLaunch>,
    /// Grouped GEMM tasks issued on the grouped kernel so far (which route
    /// ran is otherwise invisible: the two often agree bit for bit).
    pub grouped_issued: usize,
    /// Green-context splits by compute SM count.
    green: HashMap<usize, GreenSet>,
    /// This rank's signal flags (u32 words peers write, see [`crate::signal`]).
    flags: Option<DeviceBuffer>,
    /// Destination tables of the current plan's tile GEMMs
    /// ([`super::tables`]).
    tables: Option<DeviceBuffer>,
}

impl Rank {
    /// Sets up GPU `rank` on `ctx`: event tracking off, the control stream,
    /// kernels, cuBLASLt. NCCL communicators are not the rank's: see
    /// [`super::open_comms`].
    pub fn new(rank: usize, ctx: Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: we never hand cudarc-tracked slices to kernels; all ordering is ours.
        unsafe { ctx.disable_event_tracking() };
        let priority_range = cu::stream_priority_range()?;
        let control = ctx
            .new_stream_with_priority(priority_range.0)
            .map_err(drv("cuStreamCreateWithPriority"))?;
        Ok(Rank {
            rank,
            kernels: Kernels::load(&ctx)?,
            gemms: Gemms::new()?,
            priority_range,
            control,
            streams: HashMap::new(),
            workspaces: vec![],
            pool: vec![],
            check_acc: DeviceBuffer::alloc(&ctx, 32)?,
            warmed: Default::default(),
            own_gemms: vec![],
            grouped: HashMap::new(),
            grouped_issued: 0,
            green: HashMap::new(),
            flags: None,
            tables: None,
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
    pub fn bind(&mut self, rp: &RankPlan) -> Result<Vec<DevicePtr>> {
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
    pub(super) fn plan_streams(
        &mut self,
        rp: &RankPlan,
        res: &Resources,
    ) -> Result<Vec<Arc<CudaStream>>> {
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

    /// Loads ficco's own GEMM for every plan stream when the plan runs its
    /// GEMMs on it (`res.gemm`, or tile GEMMs): one instance per stream, so that GEMMs on
    /// two compute streams never share a split-K workspace. The cubin comes
    /// from the disk cache after the first compile; loading is eager (lazy
    /// loading mid-plan can wait for the device to go idle). Then every
    /// own-GEMM launch of the plan is autotuned on its stream's instance
    /// ([`HopperGemm::autotune`]: timed once per shape, then from memory or
    /// the disk cache), here and never during the run, with the arguments
    /// the run will launch (`tile_share`: persistent tile GEMMs sharing this
    /// rank's SMs, [`super::shared::tile_sm_cap`]).
    ///
    /// Grouped GEMM tasks that the grouped kernel supports run on it (unless
    /// `FICCO_GROUPED=loop`, [`GroupedRoute`]), whatever the engine: their
    /// tables of tensor maps are built and copied to the device here.
    pub(super) fn prepare_own_gemm(
        &mut self,
        rp: &RankPlan,
        res: &Resources,
        ptrs: &[DevicePtr],
        tile_share: usize,
        route: GroupedRoute,
    ) -> Result<()> {
        self.grouped.clear();
        let grouped = self.grouped_tasks(rp, ptrs, route)?;
        // Tile GEMMs run on it whatever the engine (cuBLASLt has no hooks).
        let wants = !grouped.is_empty()
            || rp.tasks.iter().any(|t| match t.kind {
                TaskKind::Gemm { .. } => res.gemm == GemmEngine::Own,
                TaskKind::TileGemm(_) => true,
                _ => false,
            });
        while wants && self.own_gemms.len() < rp.streams.len() {
            self.own_gemms.push(HopperGemm::load(&self.ctx)?);
        }
        for (i, args) in grouped {
            let Some(g) = rp.tasks.get(i).and_then(|t| self.own_gemms.get(t.stream)) else {
                continue;
            };
            let launch = g.prepare_grouped(&args)?;
            self.grouped.insert(i, launch);
        }
        for t in &rp.tasks {
            let Some(g) = self.own_gemms.get(t.stream) else {
                continue;
            };
            let args = match &t.kind {
                TaskKind::Gemm {
                    a,
                    b,
                    c,
                    sm_target,
                    accumulate,
                    occupancy,
                } if res.gemm == GemmEngine::Own => own_gemm_args(
                    (a.rows, b.cols, a.cols),
                    [
                        view_addr(&rp.buffers, ptrs, a, "gemm a")?,
                        view_addr(&rp.buffers, ptrs, b, "gemm b")?,
                        view_addr(&rp.buffers, ptrs, c, "gemm c")?,
                    ],
                    *accumulate,
                    *sm_target,
                    *occupancy,
                )?,
                TaskKind::TileGemm(tg) => {
                    let sms = self
                        .green_compute_sms(res.green_sms)
                        .map_or(g.sms(), |s| s.min(g.sms()));
                    let cap = super::shared::tile_sm_cap(sms, tile_share);
                    // Only which hooks are on matters to the schedule: the
                    // tuning runs them on its own scratch words.
                    let dummy = DevicePtr::NULL.offset(256);
                    let flags = TileFlags {
                        wait: tg.wait.map(|_| dummy),
                        signal: tg.signal.map(|_| dummy),
                        dest: tg.dest.iter().any(Option::is_some).then_some((dummy, 0)),
                        dest_maps: dest_maps_fit(rp, ptrs, tg)?.then_some(dummy),
                    };
                    if cap == 0 {
                        // The run reports it (not every GEMM can be resident).
                        continue;
                    }
                    tile_gemm_args(
                        tg,
                        [
                            view_addr(&rp.buffers, ptrs, &tg.a, "tile gemm a")?,
                            view_addr(&rp.buffers, ptrs, &tg.b, "tile gemm b")?,
                            view_addr(&rp.buffers, ptrs, &tg.c, "tile gemm c")?,
                        ],
                        flags,
                        cap,
                    )?
                }
                _ => continue,
            };
            g.autotune(&args)?;
        }
        Ok(())
    }

    /// This rank's flag buffer with at least `words` words, all zeroed but
    /// `preset` (first word, count), which is set to [`crate::signal::SET`]
    /// (synchronously: call only while nothing runs on the rank).
    pub(super) fn reset_flags(
        &mut self,
        words: usize,
        preset: (usize, usize),
    ) -> Result<DevicePtr> {
        let words = words.max(1);
        if self.flags.as_ref().is_none_or(|f| f.bytes() < words * 4) {
            // Grow in powers of two so plans of similar size reuse it.
            self.flags = Some(DeviceBuffer::alloc(
                &self.ctx,
                words.next_power_of_two() * 4,
            )?);
        }
        let f = self.flags.as_ref().map(|f| (f.ptr(), f.bytes() / 4));
        let Some((ptr, n)) = f else {
            return Ok(DevicePtr::NULL);
        };
        self.reset_flags_at(ptr, n, preset)?;
        Ok(ptr)
    }

    /// Zeroes the `n` flag words at `ptr` (this rank's device memory, also
    /// memory shared with other processes) and presets `preset` (first,
    /// count) to SET; returns when done.
    pub(super) fn reset_flags_at(
        &self,
        ptr: DevicePtr,
        n: usize,
        preset: (usize, usize),
    ) -> Result<()> {
        // SAFETY: the caller's buffer holds n words on this device; the control stream is live.
        unsafe { cu::memset_d32_async(ptr, 0, n, self.control.cu_stream())? };
        if preset.1 > 0 && preset.0 + preset.1 <= n {
            // SAFETY: in bounds, checked above.
            unsafe {
                cu::memset_d32_async(
                    crate::signal::word(ptr, preset.0),
                    crate::signal::SET,
                    preset.1,
                    self.control.cu_stream(),
                )?
            };
        }
        self.control
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }

    /// SMs of the compute green context of a split of `green_sms` SMs (as
    /// the driver made it), if this rank has that split.
    pub(super) fn green_compute_sms(&self, green_sms: Option<usize>) -> Option<u32> {
        Some(self.green.get(&green_sms?)?.partition.compute_sms)
    }

    /// Writes the destination tables of `rp`'s tile GEMMs
    /// ([`super::tables`]) for its buffers at `ptrs` into this rank's table
    /// buffer, synchronously: call only while nothing runs on the rank.
    pub(super) fn tile_tables(&mut self, rp: &RankPlan, ptrs: &[DevicePtr]) -> Result<TileTables> {
        let tb = tile_table_bytes(&self.own_gemms, rp, ptrs)?;
        if tb.is_empty() {
            return Ok(TileTables::default());
        }
        if self
            .tables
            .as_ref()
            .is_none_or(|t| t.bytes() < tb.bytes.len())
        {
            self.tables = Some(DeviceBuffer::alloc(
                &self.ctx,
                tb.bytes.len().next_power_of_two(),
            )?);
        }
        let Some(buf) = self.tables.as_ref() else {
            return Ok(TileTables::default());
        };
        buf.upload(&tb.bytes)?;
        Ok(tb.at(buf.ptr()))
    }

    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    }

    /// [`grouped_tasks`] on this rank's device.
    fn grouped_tasks(
        &self,
        rp: &RankPlan,
        ptrs: &[DevicePtr],
        route: GroupedRoute,
    ) -> Result<Vec<(usize, GroupedArgs)>> {
        grouped_tasks(&self.ctx, rp, ptrs, route)
    }

    /// Runs every cuBLASLt GEMM of `rp` not run before once, alone, into a
    /// temporary output, in each form the plan uses (c = a·b, and c += a·b:
    /// cuBLASLt runs a different kernel when beta is not 0). A kernel's first
    /// launch can load code (cuBLASLt loads its kernel libraries on demand),
    /// and loading waits for the device to go idle while holding locks that
    /// every other rank's thread then waits for: inside a running plan, where
    /// this device waits for those threads' signals, that is a deadlock (hang
    /// 3 of issue 26). Call before the rank threads start. Plans on ficco's
    /// own GEMM need none of it ([`Rank::prepare_own_gemm`]).
    pub(super) fn prewarm_gemms(
        &mut self,
        rp: &RankPlan,
        res: &Resources,
        ptrs: &[DevicePtr],
        route: GroupedRoute,
    ) -> Result<()> {
        if res.gemm == GemmEngine::Own {
            return Ok(());
        }
        // Every cuBLASLt GEMM: plain ones (not shaped) and each group of a
        // grouped one that does not run on ficco's grouped kernel.
        let own_grouped: HashSet<usize> = self
            .grouped_tasks(rp, ptrs, route)?
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        let gemms = rp
            .tasks
            .iter()
            .enumerate()
            .flat_map(|(i, t)| match &t.kind {
                TaskKind::Gemm {
                    a,
                    b,
                    c,
                    sm_target,
                    accumulate,
                    ..
                } => vec![(a, b, c, sm_target, *accumulate)],
                TaskKind::GroupedGemm { groups, sm_target } if !own_grouped.contains(&i) => groups
                    .iter()
                    .map(|g| (&g.a, &g.b, &g.c, sm_target, false))
                    .collect(),
                _ => vec![],
            });
        for (a, b, c, sm_target, accumulate) in gemms {
            let (pa, lda) = view_addr(&rp.buffers, ptrs, a, "gemm a")?;
            let (pb, ldb) = b_view_addr(&rp.buffers, ptrs, b, res.b_transposed, "gemm b")?;
            let (_, ldc) = view_addr(&rp.buffers, ptrs, c, "gemm c")?;
            let key = GemmKey {
                m: a.rows,
                n: b.cols,
                k: a.cols,
                lda: lda / ELEM_BYTES,
                ldb: ldb / ELEM_BYTES,
                ldc: ldc / ELEM_BYTES,
                sm_target: *sm_target,
                b_transposed: res.b_transposed,
            };
            if self.warmed.contains(&(key, accumulate)) || a.cols != b.rows {
                continue;
            }
            let bytes = key.m * key.ldc * ELEM_BYTES;
            let tmp = DeviceBuffer::alloc(&self.ctx, bytes)?;
            let ws = self
                .workspaces
                .first()
                .map(|w| w.ptr())
                .unwrap_or(DevicePtr::NULL);
            let s = self.control.cu_stream();
            // SAFETY: a and b are bounds-checked live views; tmp holds m rows
            // at ldc (zeroed first: the accumulating form reads it).
            unsafe {
                cu::memset_d8_async(tmp.ptr(), 0, bytes, s)?;
                self.gemms.tune(key, pa, pb, tmp.ptr(), ws, &self.control)?;
                // The chosen algorithm, in the form the run launches (tune
                // runs nothing when cuBLASLt offers a single algorithm).
                self.gemms.gemm(key, pa, pb, tmp.ptr(), accumulate, ws, s)?;
            }
            self.control
                .synchronize()
                .map_err(drv("cuStreamSynchronize"))?;
            self.warmed.insert((key, accumulate));
        }
        Ok(())
    }
}

/// The grouped GEMM tasks of `rp` that run on ficco's grouped kernel, by
/// task index, with their launch arguments: none under
/// `FICCO_GROUPED=loop` or off Hopper (the kernel is sm_90a), and only
/// those whose groups the kernel supports.
fn grouped_tasks(
    ctx: &Arc<CudaContext>,
    rp: &RankPlan,
    ptrs: &[DevicePtr],
    route: GroupedRoute,
) -> Result<Vec<(usize, GroupedArgs)>> {
    if route == GroupedRoute::Loop
        || !rp
            .tasks
            .iter()
            .any(|t| matches!(t.kind, TaskKind::GroupedGemm { .. }))
    {
        return Ok(vec![]);
    }
    let cc = ctx
        .compute_capability()
        .map_err(drv("cuDeviceGetAttribute(compute capability)"))?;
    if cc != (9, 0) {
        return Ok(vec![]);
    }
    let mut out = vec![];
    for (i, t) in rp.tasks.iter().enumerate() {
        let TaskKind::GroupedGemm { groups, sm_target } = &t.kind else {
            continue;
        };
        if !takes_kernel(route, groups.iter().filter(|g| g.a.rows > 0).count()) {
            continue;
        }
        let views = groups
            .iter()
            .map(|g: &GemmGroup| {
                Ok((
                    (g.a.rows, g.a.cols),
                    (g.b.rows, g.b.cols),
                    [
                        view_addr(&rp.buffers, ptrs, &g.a, "grouped gemm a")?,
                        view_addr(&rp.buffers, ptrs, &g.b, "grouped gemm b")?,
                        view_addr(&rp.buffers, ptrs, &g.c, "grouped gemm c")?,
                    ],
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(args) = own_grouped_args(&views, *sm_target) {
            out.push((i, args));
        }
    }
    Ok(out)
}
