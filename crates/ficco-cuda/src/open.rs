//! The backend factory: `auto`, `sim` or `gpu` in, a [`Backend`] out, and
//! when the GPUs are not there, the typed reason ([`CudaError`]) instead of
//! a parsed message. `auto` falls back to the simulator and says why.

use crate::backend::GpuBackend;
use crate::error::CudaError;
use ficco_core::plan::Plan;
use ficco_core::run::{Backend, BackendError, Measured};
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::Simulator;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

/// Where plans run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// GPUs when available, else the simulator.
    Auto,
    /// The simulator with a hardware profile.
    Sim,
    /// The GPUs (an error when there are none).
    Gpu,
    /// Every rank on GPU 0 (loopback, see [`GpuBackend::open_loopback`]):
    /// copy-engine schedules run and are checked on one GPU; NCCL schedules
    /// are skipped; reports say "loopback".
    Loopback,
}

/// An opened backend.
pub struct Opened {
    pub backend: Box<dyn Backend>,
    /// With `auto`: why the GPUs were not used (the simulator runs instead).
    pub fallback: Option<CudaError>,
}

/// Whether `e` means "no usable GPU here" (libraries missing or unusable,
/// no device, too few devices), as opposed to a failure of a GPU that is there.
pub fn is_unavailable(e: &CudaError) -> bool {
    matches!(
        e,
        CudaError::LibraryMissing { .. }
            | CudaError::LibraryUnusable { .. }
            | CudaError::NoGpu(_)
            | CudaError::DriverInit { .. }
            | CudaError::NotEnoughGpus { .. }
    )
}

/// Opens the backend `choice` for plans of up to `gpus` GPUs; the simulator
/// uses `hw`. `gpu` fails with the typed reason; `auto` falls back to the
/// simulator only when the GPUs are unavailable ([`is_unavailable`]), and
/// fails on any other GPU error.
pub fn open(choice: BackendChoice, gpus: usize, hw: &HwProfile) -> Result<Opened, CudaError> {
    let sim = |fallback| Opened {
        backend: Box::new(Simulator::new(hw.clone())),
        fallback,
    };
    match choice {
        BackendChoice::Sim => Ok(sim(None)),
        BackendChoice::Gpu => Ok(Opened {
            backend: Box::new(GpuBackends::open(gpus)?),
            fallback: None,
        }),
        BackendChoice::Loopback => Ok(Opened {
            backend: Box::new(GpuBackends::open_loopback(gpus)?),
            fallback: None,
        }),
        BackendChoice::Auto => match GpuBackends::open(gpus) {
            Ok(b) => Ok(Opened {
                backend: Box::new(b),
                fallback: None,
            }),
            Err(e) if is_unavailable(&e) => Ok(sim(Some(e))),
            Err(e) => Err(e),
        },
    }
}

/// Opens this process's rank of the job `env` describes (one process per
/// rank: `torchrun`, `ficco explore --procs N`): `Gpu` drives GPU
/// `LOCAL_RANK`, `Loopback` puts every rank on GPU 0, `Auto` does that only
/// when the node has more ranks than GPUs, and falls back to the simulator
/// when no GPU is usable (as [`open`] does). Plans of another rank count
/// than the job's are skipped.
pub fn open_job(
    choice: BackendChoice,
    env: crate::runtime::LaunchEnv,
    hw: &HwProfile,
) -> Result<Opened, CudaError> {
    let loopback = match choice {
        BackendChoice::Sim => return open(choice, env.world_size, hw),
        BackendChoice::Gpu => Some(false),
        BackendChoice::Loopback => Some(true),
        BackendChoice::Auto => None,
    };
    let timeout = crate::runtime::timeout_from_env();
    match GpuBackend::open_job(env, loopback, None, timeout) {
        Ok(b) => Ok(Opened {
            backend: Box::new(JobBackend(b)),
            fallback: None,
        }),
        Err(e) if choice == BackendChoice::Auto && is_unavailable(&e) => Ok(Opened {
            backend: Box::new(Simulator::new(hw.clone())),
            fallback: Some(e),
        }),
        Err(e) => Err(e),
    }
}

/// A rank of a job as a [`Backend`]: plans of the job's rank count only.
struct JobBackend(GpuBackend);

impl JobBackend {
    fn fits(&self, plan: &Plan) -> Result<(), BackendError> {
        if plan.problem.gpus != self.0.gpus() {
            return Err(Box::new(ficco_core::run::Skip(format!(
                "the job has {} ranks; this problem needs {}",
                self.0.gpus(),
                plan.problem.gpus
            ))));
        }
        Ok(())
    }
}

impl Backend for JobBackend {
    fn name(&self) -> &str {
        if self.0.is_loopback() {
            "gpu-loopback"
        } else {
            "gpu"
        }
    }

    fn device(&self) -> String {
        self.0.device()
    }

    fn prepare(&mut self, seq: &Plan) -> Result<(), BackendError> {
        self.fits(seq)?;
        self.0.prepare(seq)
    }

    fn measure(
        &mut self,
        plan: &Plan,
        check: bool,
        timeline: bool,
    ) -> Result<Measured, BackendError> {
        self.fits(plan)?;
        self.0.measure(plan, check, timeline)
    }

    fn set_iterations(&mut self, it: ficco_core::run::Iterations) -> bool {
        self.0.set_iterations(it)
    }
}

/// The GPU backend for plans of any GPU count: one [`GpuBackend`] per count
/// (NCCL communicators span exactly the plan's ranks), opened on first use.
/// The largest count is opened at once, so a machine without enough GPUs is
/// detected before any work.
pub struct GpuBackends {
    by_count: BTreeMap<usize, GpuBackend>,
    current: usize,
    /// Every count runs as that many ranks on GPU 0.
    loopback: bool,
    /// Iterations set for every count, opened or to be opened.
    iterations: Option<ficco_core::run::Iterations>,
}

impl GpuBackends {
    pub fn open(gpus: usize) -> Result<Self, CudaError> {
        Self::open_with(gpus, false)
    }

    /// Plans of any rank count, each run as that many ranks on GPU 0.
    pub fn open_loopback(ranks: usize) -> Result<Self, CudaError> {
        Self::open_with(ranks, true)
    }

    fn open_one(gpus: usize, loopback: bool) -> Result<GpuBackend, CudaError> {
        if loopback {
            GpuBackend::open_loopback(gpus)
        } else {
            GpuBackend::open(gpus)
        }
    }

    fn open_with(gpus: usize, loopback: bool) -> Result<Self, CudaError> {
        let first = Self::open_one(gpus, loopback)?;
        let mut by_count = BTreeMap::new();
        by_count.insert(gpus, first);
        Ok(GpuBackends {
            by_count,
            current: gpus,
            loopback,
            iterations: None,
        })
    }

    fn select(&mut self, gpus: usize) -> Result<&mut GpuBackend, CudaError> {
        self.current = gpus;
        Ok(match self.by_count.entry(gpus) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let mut b = Self::open_one(gpus, self.loopback)?;
                if let Some(it) = self.iterations {
                    b.set_iterations(it);
                }
                e.insert(b)
            }
        })
    }
}

/// The loopback backend for plans of `ranks` ranks (see
/// [`BackendChoice::Loopback`]).
pub fn open_loopback(ranks: usize) -> Result<GpuBackends, CudaError> {
    GpuBackends::open_loopback(ranks)
}

impl Backend for GpuBackends {
    fn name(&self) -> &str {
        if self.loopback {
            "gpu-loopback"
        } else {
            "gpu"
        }
    }

    fn device(&self) -> String {
        self.by_count
            .get(&self.current)
            .map(|b| b.device())
            .unwrap_or_default()
    }

    fn prepare(&mut self, seq: &Plan) -> Result<(), BackendError> {
        self.select(seq.problem.gpus)?.prepare(seq)
    }

    fn measure(
        &mut self,
        plan: &Plan,
        check: bool,
        timeline: bool,
    ) -> Result<Measured, BackendError> {
        self.select(plan.problem.gpus)?
            .measure(plan, check, timeline)
    }

    fn set_iterations(&mut self, it: ficco_core::run::Iterations) -> bool {
        self.iterations = Some(it);
        for b in self.by_count.values_mut() {
            b.set_iterations(it);
        }
        true
    }
}
