//! [`GpuBackend`]: opens the GPUs and implements `ficco_core::run::Backend`.

use crate::error::{drv, CudaError, Result};
use crate::exec::{self, Rank, RunOpts, RunSpec};
use crate::info::{self, SystemInfo};
use crate::mem::{can_access_peer, enable_peer_access, DeviceBuffer, DevicePtr};
use crate::runtime::job::Job;
use cudarc::driver::CudaContext;
use ficco_core::plan::{BufferRole, Plan};
use ficco_core::problem::workload::Problem;
use ficco_core::run::{Backend, BackendError, Measured, Skip};

mod calls;
mod measure;

/// Iteration counts and tolerance of measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasureConfig {
    /// Untimed iterations first (at least 5 is sensible).
    pub warmup: usize,
    /// Timed iterations; the median is reported.
    pub iters: usize,
    /// Largest relative error ||out - ref|| / ||ref|| accepted.
    pub tolerance: f64,
    /// Seed of the random inputs; `prepare` advances it so each call draws fresh data.
    pub seed: u32,
}

impl Default for MeasureConfig {
    fn default() -> Self {
        MeasureConfig {
            warmup: 5,
            iters: 20,
            tolerance: 1e-2,
            seed: 0x5eed,
        }
    }
}

/// One operand of an operator call on caller memory ([`GpuBackend::run_on`]).
pub(crate) use crate::exec::op::Operand;

/// Inputs and reference outputs of one prepared problem, per rank driven
/// here (in the order of `GpuBackend::ranks`).
struct Prepared {
    problem: Problem,
    /// (role, buffer) per local rank.
    inputs: Vec<Vec<(BufferRole, DeviceBuffer)>>,
    /// Reference output per local rank.
    reference: Vec<DeviceBuffer>,
}

/// The GPU backend: one process driving `gpus` GPUs (ordinals 0..gpus), or
/// one rank of a job of one process per rank ([`GpuBackend::open_job`]).
pub struct GpuBackend {
    /// The ranks this process drives (`Rank::rank` is the plan rank).
    ranks: Vec<Rank>,
    /// The job, when other processes drive the other ranks.
    job: Option<Job>,
    info: SystemInfo,
    pub config: MeasureConfig,
    prepared: Option<Prepared>,
    /// Every rank on GPU 0 ([`GpuBackend::open_loopback`]).
    loopback: bool,
    /// Watchdog and test hooks of every run (see [`RunOpts`]).
    pub run_opts: RunOpts,
    /// Whether the last measured plan's timed iterations were replayed from
    /// CUDA graphs (None before the first measurement).
    pub last_graphed: Option<bool>,
    /// Why the last measured plan did not use graphs although asked to.
    pub last_graph_error: Option<String>,
}

impl std::fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuBackend({})", self.device_name())
    }
}

/// Asks the driver for its most hardware work queues per device
/// (`CUDA_DEVICE_MAX_CONNECTIONS=32`, default 8) unless the user set it.
/// A stream waiting on a signal flag blocks its hardware queue; streams that
/// share a queue then wait behind it, which deadlocks when the signal's
/// producer is one of them (all ranks' streams share one device in loopback).
/// Likewise `CUDA_MODULE_LOADING=EAGER`: a lazily loaded kernel can wait for
/// the device to go idle, which never happens while a stream waits on a
/// signal the loading thread has yet to issue. Must run before the driver is
/// initialised to take effect. Also reads ficco's own settings, so that a bad
/// `FICCO_*` value is reported before any work.
fn process_setup() -> Result<()> {
    ficco_core::settings::Settings::get()?;
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    }
    if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        std::env::set_var("CUDA_MODULE_LOADING", "EAGER");
    }
    Ok(())
}

impl GpuBackend {
    /// Opens GPUs 0..gpus: checks the libraries, creates contexts, enables peer
    /// access, compiles the kernels and creates the NCCL communicators.
    /// Fails with `LibraryMissing`, `NoGpu` or `NotEnoughGpus`; never panics.
    pub fn open(gpus: usize) -> Result<Self> {
        process_setup()?;
        crate::loader::require()?;
        let found = info::device_count()?;
        if gpus == 0 || gpus > found {
            return Err(CudaError::NotEnoughGpus {
                wanted: gpus,
                found,
            });
        }
        let info = info::info();
        let ctxs: Vec<_> = (0..gpus)
            .map(|i| CudaContext::new(i).map_err(drv("cuDevicePrimaryCtxRetain")))
            .collect::<Result<_>>()?;
        for i in 0..gpus {
            for j in 0..gpus {
                if i != j && can_access_peer(ctxs[i].cu_device(), ctxs[j].cu_device())? {
                    enable_peer_access(&ctxs[i], &ctxs[j])?;
                }
            }
        }
        exec::open_comms(&ctxs)?;
        let mut ranks = Vec::with_capacity(gpus);
        for (r, ctx) in ctxs.into_iter().enumerate() {
            ranks.push(Rank::new(r, ctx)?);
        }
        Ok(GpuBackend {
            ranks,
            info,
            config: MeasureConfig::default(),
            prepared: None,
            loopback: false,
            job: None,
            run_opts: RunOpts::default(),
            last_graphed: None,
            last_graph_error: None,
        })
    }

    /// Opens `ranks` ranks on GPU 0 alone (loopback): each rank has its own
    /// buffers, streams and signal flags on the one device, and copies are
    /// device-local. NCCL cannot run there: plans with NCCL tasks fail with
    /// [`CudaError::Skipped`], except the reference plans (`seq`,
    /// comm-only), which run in their copy form (`exec::copy_reference`).
    /// Reports name the device `"1x <GPU> (loopback, P ranks)"`.
    pub fn open_loopback(ranks: usize) -> Result<Self> {
        process_setup()?;
        crate::loader::require()?;
        let found = info::device_count()?;
        if found == 0 {
            return Err(CudaError::NotEnoughGpus { wanted: 1, found });
        }
        if ranks == 0 {
            return Err(CudaError::Plan("loopback needs at least one rank".into()));
        }
        let info = info::info();
        let ctx = CudaContext::new(0).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        let mut rs = Vec::with_capacity(ranks);
        for r in 0..ranks {
            rs.push(Rank::new(r, ctx.clone())?);
        }
        Ok(GpuBackend {
            ranks: rs,
            info,
            config: MeasureConfig::default(),
            prepared: None,
            loopback: true,
            job: None,
            run_opts: RunOpts::default(),
            last_graphed: None,
            last_graph_error: None,
        })
    }

    /// Joins the job `env` describes as its rank `env.rank`, one process
    /// per rank: the GPU `LOCAL_RANK`, or GPU 0 for every rank in loopback
    /// (`loopback`, or when `None`, exactly when this node has more ranks
    /// than GPUs; every rank must agree). Buffers and signal flags live in
    /// memory shared with the node's other ranks; NCCL communicators are
    /// made on first use. Every rank then calls the same `prepare` and
    /// `measure` sequence; each returns the job's result on every rank.
    pub fn open_job(
        env: crate::runtime::LaunchEnv,
        loopback: Option<bool>,
        device: Option<usize>,
        timeout: std::time::Duration,
    ) -> Result<Self> {
        process_setup()?;
        crate::loader::require()?;
        let found = info::device_count()?;
        let rv = crate::runtime::Rendezvous::join(env, timeout)?;
        let on_one = loopback.unwrap_or(rv.env.local_world_size > found);
        let votes = rv.all_gather("loopback", &[u8::from(on_one)])?;
        if votes.iter().any(|v| v.as_slice() != [u8::from(on_one)]) {
            return Err(rv
                .fail(crate::runtime::DistError::Mismatch(
                    "some ranks run in loopback (all on GPU 0), others not".into(),
                ))
                .into());
        }
        if on_one && !rv.single_node() {
            return Err(rv
                .fail(crate::runtime::DistError::Mismatch(
                    "loopback puts every rank on one GPU, but the job spans several hosts".into(),
                ))
                .into());
        }
        let ordinal = device.unwrap_or(if on_one { 0 } else { rv.env.local_rank });
        if ordinal >= found {
            let e = CudaError::NotEnoughGpus {
                wanted: rv.env.local_world_size,
                found,
            };
            return Err(crate::runtime::shared::abort_on(&rv, e));
        }
        let opened = (|| -> Result<_> {
            let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
            let rank = Rank::new(rv.env.rank, ctx.clone())?;
            Ok((ctx, rank))
        })();
        let (ctx, rank) = match opened {
            Ok(v) => v,
            Err(e) => return Err(crate::runtime::shared::abort_on(&rv, e)),
        };
        rv.barrier("opened")?;
        Ok(GpuBackend {
            ranks: vec![rank],
            info: info::info(),
            config: MeasureConfig::default(),
            prepared: None,
            loopback: on_one,
            job: Some(Job::new(rv, on_one, ordinal, ctx)),
            run_opts: RunOpts::default(),
            last_graphed: None,
            last_graph_error: None,
        })
    }

    /// The context and device ordinal of this process's one rank (a rank
    /// of a job).
    pub(crate) fn rank_context(&self) -> Result<(std::sync::Arc<CudaContext>, usize)> {
        match (self.ranks.as_slice(), self.job.as_ref()) {
            ([rank], Some(job)) => Ok((rank.ctx.clone(), job.ordinal)),
            _ => Err(CudaError::Plan(
                "shared allocations belong to a rank of a job (one process per rank)".into(),
            )),
        }
    }

    /// The job this backend is a rank of, if any.
    pub fn job(&self) -> Option<&Job> {
        self.job.as_ref()
    }

    pub(crate) fn job_mut(&mut self) -> Option<&mut Job> {
        self.job.as_mut()
    }

    /// The job, after this rank's device work and GPU resources are
    /// released (its shared memory is released with the job).
    pub fn into_job(mut self) -> Option<Job> {
        for r in &self.ranks {
            let _ = r.synchronize();
        }
        self.prepared = None;
        self.ranks.clear();
        self.job.take()
    }

    /// Whether every rank runs on one GPU.
    pub fn is_loopback(&self) -> bool {
        self.loopback
    }

    /// The plan that runs for `plan`: in loopback, reference plans (no
    /// schedule, or `seq`) run their collectives as copies.
    fn runnable(&self, plan: &Plan) -> Result<Option<Plan>> {
        let reference = plan.schedule.as_ref().is_none_or(|s| s.is_seq());
        if self.loopback && reference {
            return exec::copy_reference(plan).map(Some);
        }
        Ok(None)
    }

    /// In loopback, reference plans run in their copy form (see
    /// [`Self::runnable`]). Returns the times of the ranks driven here.
    fn run(
        &mut self,
        plan: &Plan,
        ptrs: &[Vec<DevicePtr>],
        spec: RunSpec,
    ) -> Result<Vec<exec::run::RankTimes>> {
        match self.job.as_mut() {
            None => exec::run_plan_with(&mut self.ranks, plan, ptrs, spec, self.run_opts),
            Some(job) => {
                if let Some(rank) = self.ranks.first() {
                    job.quiesce(rank)?;
                }
                let view = job.run_view(plan)?;
                let res = exec::run::run_plan_in(
                    &mut self.ranks,
                    plan,
                    ptrs,
                    spec,
                    self.run_opts,
                    Some(&view),
                );
                // The flags are between iterations again (every rank's
                // device idle at the final barrier), or unknown.
                match &res {
                    Ok(_) => job
                        .op
                        .epoch
                        .after_full(spec.warmup + spec.timed + usize::from(spec.timeline)),
                    Err(_) => job.op.epoch.failed(),
                }
                res
            }
        }
    }

    /// Ranks in the plans this backend runs (the job's, or the GPUs driven).
    fn world(&self) -> usize {
        self.job.as_ref().map_or(self.ranks.len(), |j| j.world())
    }

    /// The machine description gathered at open.
    pub fn info(&self) -> &SystemInfo {
        &self.info
    }

    /// Grouped GEMM tasks issued on ficco's grouped kernel so far, over the
    /// ranks driven here (the rest ran as loops of cuBLASLt calls).
    pub fn grouped_launches(&self) -> usize {
        self.ranks.iter().map(|r| r.grouped_issued).sum()
    }

    /// Number of ranks of the plans it runs (GPUs driven, or the job's ranks).
    pub fn gpus(&self) -> usize {
        self.world()
    }

    fn device_name(&self) -> String {
        let name = self
            .info
            .gpus
            .first()
            .map(|g| g.name.clone())
            .unwrap_or_else(|| "GPU".into());
        let launch = if self.run_opts.graphs {
            "CUDA graphs"
        } else {
            "no graphs"
        };
        let procs = if self.job.is_some() {
            " as processes"
        } else {
            ""
        };
        if self.loopback {
            return format!(
                "1x {name} (loopback, {} ranks{procs}; {launch})",
                self.world()
            );
        }
        format!(
            "{}x {} ({}{launch})",
            self.world(),
            name,
            if procs.is_empty() {
                ""
            } else {
                "a process per GPU; "
            }
        )
    }

    /// Every rank's buffers of `plan`; `skip`: for an operator call, the
    /// operands it binds in place, which take no room in a job's shared
    /// arena (empty for a run).
    fn bind(&mut self, plan: &Plan, skip: &[Vec<bool>]) -> Result<Vec<Vec<DevicePtr>>> {
        if plan.ranks.len() != self.world() {
            return Err(CudaError::Plan(format!(
                "plan has {} ranks but the backend drives {}",
                plan.ranks.len(),
                self.world()
            )));
        }
        if let Some(job) = self.job.as_mut() {
            // Nothing of this rank may be in flight when the arena grows:
            // operator calls issued without a final barrier end first.
            if let Some(rank) = self.ranks.first() {
                job.quiesce(rank)?;
            }
            return job.bind(plan, skip);
        }
        self.ranks
            .iter_mut()
            .zip(&plan.ranks)
            .map(|(rank, rp)| rank.bind(rp))
            .collect()
    }

    fn sync_all(&self) -> Result<()> {
        self.ranks.iter().try_for_each(|r| r.synchronize())
    }

    /// Runs `plan` once with given initial buffer contents and returns every
    /// buffer's final contents (bf16 bit patterns). `init[rank][buf]` of `None`
    /// poisons the buffer with NaN. For tests and debugging; copies everything
    /// through the host.
    pub fn run_host(
        &mut self,
        plan: &Plan,
        init: &[Vec<Option<Vec<u16>>>],
    ) -> Result<Vec<Vec<Vec<u16>>>> {
        if self.job.is_some() {
            return Err(CudaError::Plan(
                "run_host reads every rank's buffers; a rank of a job has only its own".into(),
            ));
        }
        let copy_form = self.runnable(plan)?;
        let plan = copy_form.as_ref().unwrap_or(plan);
        let ptrs = self.bind(plan, &[])?;
        for (r, rp) in plan.ranks.iter().enumerate() {
            self.ranks[r].synchronize()?;
            for (b, buf) in rp.buffers.iter().enumerate() {
                match init.get(r).and_then(|v| v.get(b)).and_then(|o| o.as_ref()) {
                    Some(data) => {
                        let bytes: Vec<u8> = data.iter().flat_map(|w| w.to_le_bytes()).collect();
                        upload(
                            &self.ranks[r],
                            ptrs[r][b],
                            &bytes[..bytes.len().min(buf.bytes())],
                        )?;
                    }
                    None => exec::poison(&self.ranks[r], ptrs[r][b], buf.rows * buf.cols)?,
                }
            }
        }
        self.sync_all()?;
        self.run(plan, &ptrs, RunSpec::ONCE)?;
        let mut out = vec![];
        for (r, rp) in plan.ranks.iter().enumerate() {
            let mut bufs = vec![];
            for (b, buf) in rp.buffers.iter().enumerate() {
                let mut bytes = vec![0u8; buf.bytes()];
                download(&self.ranks[r], ptrs[r][b], &mut bytes)?;
                bufs.push(
                    bytes
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]]))
                        .collect(),
                );
            }
            out.push(bufs);
        }
        Ok(out)
    }
}

fn upload(rank: &Rank, ptr: DevicePtr, data: &[u8]) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: ptr is a pool allocation of at least data.len() bytes.
    unsafe { crate::driver::cuda::memcpy_htod(ptr, data) }
}

fn download(rank: &Rank, ptr: DevicePtr, out: &mut [u8]) -> Result<()> {
    rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: ptr is a pool allocation of at least out.len() bytes.
    unsafe { crate::driver::cuda::memcpy_dtoh(out, ptr) }
}

impl Backend for GpuBackend {
    fn name(&self) -> &str {
        "gpu"
    }

    fn device(&self) -> String {
        self.device_name()
    }

    fn prepare(&mut self, seq: &Plan) -> Result<(), BackendError> {
        self.prepare_plan(seq).map_err(to_backend)
    }

    fn measure(
        &mut self,
        plan: &Plan,
        check: bool,
        timeline: bool,
    ) -> Result<Measured, BackendError> {
        self.measure_plan(plan, check, timeline).map_err(to_backend)
    }

    fn set_iterations(&mut self, it: ficco_core::run::Iterations) -> bool {
        self.config.warmup = it.warmup;
        self.config.iters = it.timed.max(1);
        true
    }
}

/// A [`CudaError::Skipped`] becomes the core's [`Skip`] (reports show its
/// reason as the skip reason); every other error stays typed.
fn to_backend(e: CudaError) -> BackendError {
    match e {
        CudaError::Skipped(reason) => Box::new(Skip(reason)),
        e => Box::new(e),
    }
}
