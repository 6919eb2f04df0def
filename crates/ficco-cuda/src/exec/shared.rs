//! What every part of a run shares: how to run ([`RunSpec`], [`RunOpts`]),
//! the state the issuing threads and the watchdog read ([`Shared`]), and the
//! facts derived from a plan once per run (same-rank events, the Signal
//! tasks of each Wait, each tile GEMM's share of its GPU's SMs). It depends
//! on no other file of the executor.

use super::progress::Issuing;
use crate::driver::nccl::RawComm;
use crate::error::{CudaError, Result};
use crate::mem::DevicePtr;
use crate::signal::{HostWords, SignalLayout};
use cudarc::driver::CudaContext;
use ficco_core::plan::signal::flag_links;
use ficco_core::plan::{Plan, TaskKind};
use ficco_core::settings::Settings;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Default watchdog bound: a run in which no rank finishes an iteration for
/// this long is ended with [`CudaError::Hang`]. `FICCO_WATCHDOG_MS` overrides it.
pub use ficco_core::settings::DEFAULT_WATCHDOG_MS;

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

/// Run-wide options that are not about timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOpts {
    /// Watchdog bound in ms (`FICCO_WATCHDOG_MS`).
    pub watchdog_ms: u64,
    /// Test hook: the producer of this point never writes its signal flags
    /// (or, a Signal task, is not issued), so its consumers wait forever
    /// (the watchdog tests).
    pub drop_signal: Option<(usize, usize)>,
    /// Replay each iteration from a CUDA graph captured once per plan and
    /// parity (where capture works: not under green contexts, whose streams
    /// belong to other contexts). `--no-graph` turns it off.
    pub graphs: bool,
    /// How grouped GEMM tasks run (`FICCO_GROUPED`).
    pub grouped: super::gemm_args::GroupedRoute,
}

/// Environment variable that turns CUDA graphs off when `0` (`--no-graph`).
pub const GRAPHS_ENV: &str = ficco_core::settings::GRAPHS;

impl Default for RunOpts {
    /// From the process's settings ([`ficco_core::settings`]): the
    /// watchdog bound, graphs, and the whole-process test hook
    /// `FICCO_TEST_DROP_SIGNAL=RANK,TASK` (the CLI hang test).
    fn default() -> Self {
        let s = Settings::current();
        RunOpts {
            watchdog_ms: s.watchdog_ms,
            drop_signal: s.faults.drop_signal,
            graphs: s.graphs,
            grouped: s.grouped,
        }
    }
}

/// Per rank per task: a task of another stream *of the same rank* waits for
/// it, so it records an event (other ranks wait on signal flags).
pub(crate) fn same_rank_events(plan: &Plan) -> Vec<Vec<bool>> {
    plan.ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            let mut need = vec![false; rp.tasks.len()];
            for t in &rp.tasks {
                for d in t.deps.iter().filter(|d| d.rank == r) {
                    if rp.tasks.get(d.index).is_some_and(|p| p.stream != t.stream) {
                        need[d.index] = true;
                    }
                }
            }
            need
        })
        .collect()
}

/// What a run needs of the job its ranks belong to (one process per GPU):
/// the job runtime implements it ([`crate::runtime::Rendezvous`]), so the
/// executor does not depend on the runtime.
pub(crate) trait JobLink {
    /// Ranks in the job.
    fn world_size(&self) -> usize;
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Returns once every rank of the job reached `tag`.
    fn barrier(&self, tag: &str) -> Result<()>;
    /// Tells every rank that this one failed with `e` (unless `e` came from
    /// another rank or is a skip every rank decides alike); returns `e`.
    fn abort_on(&self, e: CudaError) -> CudaError;
}

/// The NCCL communicator a rank uses for one plan.
#[derive(Clone, Copy)]
pub(crate) struct CommHandle(pub(crate) RawComm);
// SAFETY: each handle is used by its rank's thread only during a run.
unsafe impl Send for CommHandle {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for CommHandle {}

/// Everything the issuing threads share for one run.
pub(crate) struct Shared<'a> {
    pub plan: &'a Plan,
    /// Base pointers per rank per buffer.
    pub ptrs: &'a [Vec<DevicePtr>],
    /// Raw context of each rank (peer copies name both).
    pub ctxs: &'a [Arc<CudaContext>],
    /// Each rank's communicator for this plan (its NCCL limits), by global
    /// rank; `None` in loopback (no NCCL task runs there) and for ranks
    /// other processes drive.
    pub comms: &'a [Option<CommHandle>],
    /// The global ranks this process drives (every rank, but in a job of
    /// one process per GPU).
    pub local: &'a [usize],
    /// Where every signal flag is.
    pub layout: &'a SignalLayout,
    /// Base of each rank's flag buffer as this process sees it; NULL for a
    /// rank on another node (no flag crosses nodes; see [`Shared::peers`]).
    pub flags: &'a [DevicePtr],
    /// Per rank, the iterations its control stream finished.
    pub progress: &'a HostWords,
    /// Where the watchdog reads a rank's flags (as many words as the largest rank's).
    pub diag: &'a HostWords,
    /// Per rank per task: another stream of the same rank waits for it.
    pub events: &'a [Vec<bool>],
    /// Per rank per task: for a Wait task, the Signal tasks (rank, index) of
    /// its flag (graph edges of a loopback capture, see [`super::iter::CrossEvents`]).
    pub flag_preds: &'a FlagPreds,
    /// Several ranks of the job are on one GPU (loopback, in this process
    /// or in several).
    pub shares_gpu: bool,
    /// Per rank: the persistent tile GEMMs that share its device (in
    /// loopback every rank's), each held to its share of the SMs.
    pub tile_share: &'a [usize],
    /// Per rank: its tile GEMMs' destination tables, written before the
    /// run (the full path) or the call (`super::op`).
    pub tables: &'a [TileTables],
    pub spec: RunSpec,
    pub opts: RunOpts,
    /// Every issuing thread passes it once its events and graphs exist.
    pub start: &'a std::sync::Barrier,
    /// Set by the watchdog: stop issuing iterations.
    pub abort: &'a AtomicBool,
    /// Where each rank's issuing thread is (the watchdog's report).
    pub issuing: &'a Issuing,
}

impl Shared<'_> {
    /// The ranks whose flags rank `r` writes and waits on at iteration
    /// boundaries: every other rank of its node. Ranks of other nodes only
    /// meet through NCCL, which orders itself.
    pub(crate) fn peers(&self, r: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.flags.len()).filter(move |&q| q != r && !self.flags[q].is_null())
    }

    pub(crate) fn total(&self) -> usize {
        self.spec.warmup + self.spec.timed + usize::from(self.spec.timeline)
    }

    /// Whether flags may go by the signal kernel in this run
    /// ([`ficco_core::settings::FLAG_KERNELS`]). Never with a tile GEMM (its
    /// blocks wait inside the kernel for each other's counters: a warp
    /// holding a slot of an SM could keep one of them from starting) or under
    /// green contexts (the kernel is loaded in the primary context); with
    /// `auto`, not where several ranks share a GPU (one rank's waiting warp
    /// would sit beside another rank's GEMM, and across processes a
    /// spinning kernel holds the GPU until its time slice ends).
    pub(crate) fn flag_kernels(&self) -> bool {
        use ficco_core::settings::{FlagKernels, Settings};
        let allowed = match Settings::current().flag_kernels {
            FlagKernels::Off => false,
            FlagKernels::On => true,
            FlagKernels::Auto => !self.shares_gpu,
        };
        allowed && self.plan.resources.green_sms.is_none() && !self.has_tile_gemm()
    }

    fn has_tile_gemm(&self) -> bool {
        self.plan.has_task(|k| matches!(k, TaskKind::TileGemm(..)))
    }

    /// Whether iterations are replayed from graphs for this plan. Not under
    /// green contexts (their streams belong to other contexts), and not for
    /// plans with a tile GEMM whose blocks wait on flags ([`graph_safe`]).
    /// (The loopback hang once blamed on graphs, 2 of 192 runs, fits the SM
    /// starvation that [`tile_sm_cap`] now rules out; see `docs/signals.md`.)
    pub(crate) fn graphs(&self) -> bool {
        self.opts.graphs && self.plan.resources.green_sms.is_none() && graph_safe(self.plan)
    }
}

/// Whether a task's launch orders the rank's other streams after it began
/// (`super::iter::RankIssue`'s `launched` events; in a graph a
/// `LAUNCH_ORDER` edge): a tile GEMM whose blocks wait on no flag (gemm-rs
/// and gemm-ar without `-acc`). Copy and reduce streams wait on its
/// counters while it runs; in a graph replay the driver could queue such a
/// wait ahead of the GEMM's launch on a shared hardware queue, and the
/// GEMM would never start. After the edge no such wait precedes it (and on
/// an H200 the followers still start 11 µs into the kernel, not at its end:
/// `bench/launch_order.py`).
pub(crate) fn launch_ordered(kind: &TaskKind) -> bool {
    matches!(kind, TaskKind::TileGemm(g) if g.wait.is_none())
}

/// Whether `plan` may be captured in a graph: no tile GEMM whose blocks
/// wait on flags (ag-gemm's, `-acc`'s own blocks). The driver keeps a
/// launch-order edge best effort (a follower may be held until the kernel
/// ends): harmless for a GEMM that waits on nothing ([`launch_ordered`]),
/// but a GEMM spinning on a flag that a held stream (its own rank's pushes,
/// which feed the peers' GEMMs) would set never ends.
pub(crate) fn graph_safe(plan: &Plan) -> bool {
    !plan.has_task(|k| matches!(k, TaskKind::TileGemm(g) if g.wait.is_some()))
}

/// Where a rank's tile GEMMs find their destination hooks in device memory
/// ([`super::tables`]): per task, its table of block addresses and, where
/// they fit, the same blocks as tensor maps (`None`, or no entry: none).
#[derive(Debug, Clone, Default)]
pub(crate) struct TileTables {
    pub dest: Vec<Option<DevicePtr>>,
    pub maps: Vec<Option<DevicePtr>>,
}

/// Per rank per task: for a Wait task, the Signal tasks (rank, index) of its
/// flag.
pub(crate) type FlagPreds = Vec<Vec<Vec<(usize, usize)>>>;

/// Per rank per task: for a Wait task, the Signal tasks of its flag (a tile
/// GEMM's counters are left out, see [`super::iter::CrossEvents`]).
pub(crate) fn flag_preds(plan: &Plan) -> Result<FlagPreds> {
    let mut out: FlagPreds = plan
        .ranks
        .iter()
        .map(|rp| vec![vec![]; rp.tasks.len()])
        .collect();
    let links = flag_links(plan).map_err(|e| CudaError::Plan(e.to_string()))?;
    for l in links
        .into_iter()
        .filter(|l| l.signal_block.is_none() && l.wait_block.is_none())
    {
        if let Some(v) = out
            .get_mut(l.wait.rank)
            .and_then(|t| t.get_mut(l.wait.index))
        {
            v.push((l.signal.rank, l.signal.index));
        }
    }
    Ok(out)
}

/// SMs that persistent tile GEMMs sharing one GPU leave free of their CTAs
/// together. Sharing happens in loopback, where every copy between ranks is
/// a copy within the GPU, which runs as a kernel on SMs
/// (`bench/probe_sm_copy.py`): with every SM held by a spinning CTA, the
/// copy a GEMM waits for would never run ([`ficco_core::plan::spin`]).
pub(crate) const SHARED_GPU_FREE_SMS: u32 = 8;

/// The most CTAs (one per SM) a tile GEMM may launch with when `share` tile
/// GEMMs share `sms` SMs: all of them alone, else an equal part of all but
/// [`SHARED_GPU_FREE_SMS`].
pub(crate) fn tile_sm_cap(sms: u32, share: usize) -> u32 {
    let share = share.max(1) as u32;
    let free = if share > 1 {
        SHARED_GPU_FREE_SMS.min(sms / 2)
    } else {
        0
    };
    (sms - free) / share
}

/// Per rank: the tile GEMM tasks on its device (every rank's in loopback).
pub(crate) fn tile_share(plan: &Plan, loopback: bool) -> Vec<usize> {
    let per: Vec<usize> = plan
        .ranks
        .iter()
        .map(|rp| {
            rp.tasks
                .iter()
                .filter(|t| matches!(t.kind, TaskKind::TileGemm(_)))
                .count()
        })
        .collect();
    let all: usize = per.iter().sum();
    per.iter()
        .map(|&n| if loopback { all } else { n })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{graph_safe, launch_ordered};
    use ficco_core::plan::lower::lower;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::{enumerate, Granularity, SpaceOptions};

    /// A graph may hold a tile GEMM only where it waits on no flag (gemm-rs
    /// and gemm-ar without `-acc`), and exactly there its launch orders the
    /// rank's other streams; ag-gemm's tile GEMM and `-acc`'s spin on flags
    /// and are issued directly. Plans without a tile GEMM are unaffected.
    #[test]
    fn graphs_hold_only_tile_gemms_that_wait_on_nothing() {
        let opts = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 16,
        };
        let (mut captured, mut direct) = (0, 0);
        for p in [2, 4] {
            for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
                let problem = Problem::new(op, 8192, 2048, 2048, p).expect("problem");
                for s in enumerate(op, opts) {
                    let Ok(plan) = lower(&problem, &s) else {
                        continue;
                    };
                    let tile = s.granularity == Granularity::Tile;
                    let safe = !tile || (op != Op::AgGemm && !s.fused_reduce);
                    let what = format!("{op:?} P={p} {}", s.name());
                    assert_eq!(graph_safe(&plan), safe, "{what}");
                    let ordered = plan
                        .ranks
                        .iter()
                        .flat_map(|rp| &rp.tasks)
                        .any(|t| launch_ordered(&t.kind));
                    assert_eq!(ordered, tile && safe, "{what}");
                    if tile {
                        *if safe { &mut captured } else { &mut direct } += 1;
                    }
                }
            }
        }
        assert!(captured > 0 && direct > 0, "{captured} {direct}");
    }
}
