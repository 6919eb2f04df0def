//! The error types of the GPU backend, below every other module: the one
//! [`CudaError`], and the two it carries, [`LibProblem`] (why a library
//! cannot be used, from the loader) and [`DistError`] (the job runtime).
//! Every variant names what failed; library result codes are kept (cudarc's
//! `NcclError` prints without its code).

use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// Errors of the GPU backend. Nothing the user or the hardware can trigger panics;
/// it ends up here.
#[derive(Debug, Error)]
pub enum CudaError {
    /// A shared library is not on the loader's search path. `searched` lists
    /// the file names tried (too long for a one-line message; `ficco
    /// --verbose` prints it).
    #[error("{lib} not found{hint}")]
    LibraryMissing {
        lib: &'static str,
        searched: Vec<String>,
        /// Extra advice, starting with "; " when present.
        hint: String,
    },
    /// A shared library is there but cannot be used: it does not load, lacks
    /// a function ficco calls, or is of another version.
    #[error("{lib} unusable: {problem}")]
    LibraryUnusable {
        lib: &'static str,
        problem: LibProblem,
    },
    /// The driver loaded but reports no device.
    #[error("no CUDA GPU found: {0}")]
    NoGpu(String),
    /// The driver loaded but cannot start (`cuInit` failed other than with
    /// "no device"): a stub library, a driver/kernel-module mismatch, no
    /// permission on the device files.
    #[error("the CUDA driver cannot start: cuInit returned {code:?}{}", init_meaning(*.code))]
    DriverInit { code: cudarc::driver::sys::CUresult },
    #[error("{wanted} GPUs requested but only {found} present")]
    NotEnoughGpus { wanted: usize, found: usize },
    #[error("CUDA driver call {call} failed: {code:?}")]
    Driver {
        call: &'static str,
        code: cudarc::driver::sys::CUresult,
    },
    #[error("cuBLASLt call {call} failed: {code:?}")]
    Cublas {
        call: &'static str,
        code: cudarc::cublaslt::sys::cublasStatus_t,
    },
    #[error("NCCL call {call} failed: {code:?} ({})", nccl_meaning(*.code))]
    Nccl {
        call: &'static str,
        code: cudarc::nccl::sys::ncclResult_t,
    },
    #[error("NVRTC failed to compile {kernel}: {code:?}\n{log}")]
    Nvrtc {
        kernel: &'static str,
        code: cudarc::nvrtc::sys::nvrtcResult,
        log: String,
    },
    /// The plan cannot be executed as given (bad view, unsupported shape, ...).
    #[error("plan cannot run on the GPU: {0}")]
    Plan(String),
    /// An operator call on a stream that is capturing a CUDA graph needs
    /// set-up that cannot be captured (its shape's first call, a call after
    /// a failure, a plan that only runs on the full path): nothing ran.
    #[error("{0}")]
    Capture(String),
    /// `measure` was called before `prepare` for this problem.
    #[error("no reference prepared for {0}; call prepare with the sequential plan first")]
    NotPrepared(String),
    /// The plan cannot run on this backend by design (not a failure): e.g.
    /// NCCL tasks in loopback. Reports list the schedule as skipped with
    /// this reason.
    #[error("{0}")]
    Skipped(String),
    /// The watchdog ended a run: no rank finished an iteration for
    /// `waited_ms` (`FICCO_WATCHDOG_MS`, default 10 s). `point` names the plan
    /// point rank `rank` was waiting at; every signal flag was then released
    /// so the streams drained and nothing is left running.
    #[error("run hung: rank {rank} stuck at {point}; no progress for {waited_ms} ms (watchdog, FICCO_WATCHDOG_MS); all waits were released and the run aborted")]
    Hang {
        rank: usize,
        point: String,
        waited_ms: u64,
    },
    /// An issuing thread stopped because the run was already failing (the
    /// watchdog's abort); the run reports the first real failure instead.
    #[error("run aborted after another rank failed or hung")]
    Aborted,
    /// The rendezvous of one-process-per-GPU ranks failed (a rank missing,
    /// dead or disagreeing; the launcher environment).
    #[error(transparent)]
    Dist(#[from] DistError),
    /// A host thread driving a GPU died.
    #[error("GPU worker thread for rank {0} panicked")]
    Worker(usize),
    /// A `FICCO_*` environment variable has a value it does not take.
    #[error(transparent)]
    Settings(#[from] ficco_core::settings::SettingsError),
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Maps a cudarc driver error, naming the call.
pub(crate) fn drv(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver { call, code: e.0 }
}

/// Maps a raw `CUresult`, naming the call.
pub(crate) fn check(call: &'static str, r: cudarc::driver::sys::CUresult) -> Result<()> {
    if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver { call, code: r })
    }
}

pub(crate) fn blas(
    call: &'static str,
) -> impl Fn(cudarc::cublaslt::result::CublasError) -> CudaError {
    move |e| CudaError::Cublas { call, code: e.0 }
}

/// What a `cuInit` failure means, in words, starting with " (" when known.
pub fn init_meaning(code: cudarc::driver::sys::CUresult) -> &'static str {
    use cudarc::driver::sys::CUresult as R;
    match code {
        R::CUDA_ERROR_STUB_LIBRARY => {
            " (libcuda is the CUDA toolkit's link stub, not the driver; take its folder off LD_LIBRARY_PATH)"
        }
        R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => {
            " (libcuda does not match the loaded kernel driver; reinstall the driver or reboot)"
        }
        R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => {
            " (the forward-compatibility libcuda does not support this GPU)"
        }
        R::CUDA_ERROR_NOT_PERMITTED | R::CUDA_ERROR_OPERATING_SYSTEM => {
            " (the system refused access to the GPU: device permissions, or a container without GPUs)"
        }
        R::CUDA_ERROR_SYSTEM_NOT_READY => " (the driver is not ready: is the fabric manager running?)",
        _ => "",
    }
}

/// What an NCCL result code means, in words.
pub fn nccl_meaning(code: cudarc::nccl::sys::ncclResult_t) -> &'static str {
    use cudarc::nccl::sys::ncclResult_t as R;
    match code {
        R::ncclSuccess => "success",
        R::ncclUnhandledCudaError => "a CUDA call inside NCCL failed",
        R::ncclSystemError => {
            "a system call failed (shared memory, sockets or /dev/shm; see NCCL_DEBUG=WARN)"
        }
        R::ncclInternalError => "internal NCCL error",
        R::ncclInvalidArgument => "invalid argument (null buffer, bad count, rank or config)",
        R::ncclInvalidUsage => {
            "invalid usage (mismatched calls across ranks, or a communicator used wrongly)"
        }
        R::ncclRemoteError => "a peer or the network failed",
        R::ncclInProgress => "the operation is still in progress (non-blocking communicator)",
        _ => "unknown NCCL result",
    }
}

pub(crate) fn nccl(call: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> CudaError {
    move |e| CudaError::Nccl { call, code: e.0 }
}

/// Why a library cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LibProblem {
    /// No candidate file is on the loader's search path.
    NotFound,
    /// A candidate exists but the dynamic loader refused it (a missing
    /// dependency, a wrong ELF class, not a shared object): `dlerror`'s text.
    LoadFailed { error: String },
    /// The file loaded but lacks functions ficco calls: `missing` (in
    /// [`crate::loader::LibSpec::symbols`] order) of the `needed`.
    MissingSymbols {
        path: String,
        missing: Vec<String>,
        needed: usize,
    },
    /// The version function failed: `call` returned `code` (`meaning`, when known).
    VersionUnreadable {
        path: String,
        call: String,
        code: i32,
        meaning: Option<String>,
    },
    /// The version is not one ficco's bindings support.
    WrongVersion {
        path: String,
        found: String,
        needs: String,
    },
}

impl fmt::Display for LibProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LibProblem::NotFound => write!(f, "not found"),
            LibProblem::LoadFailed { error } => write!(f, "cannot be loaded: {error}"),
            LibProblem::MissingSymbols {
                path,
                missing,
                needed,
            } => {
                let first = missing.first().map(String::as_str).unwrap_or("?");
                write!(f, "{path} has no symbol {first}")?;
                if missing.len() > 1 {
                    write!(
                        f,
                        ", nor {} more of the {needed} functions ficco calls",
                        missing.len() - 1
                    )?;
                }
                Ok(())
            }
            LibProblem::VersionUnreadable {
                path,
                call,
                code,
                meaning,
            } => {
                write!(f, "{path}: {call} failed with code {code}")?;
                if let Some(m) = meaning {
                    write!(f, " ({m})")?;
                }
                Ok(())
            }
            LibProblem::WrongVersion { path, found, needs } => {
                write!(f, "{path} is version {found}; ficco needs {needs}")
            }
        }
    }
}

/// Errors of the rendezvous and of sharing memory between processes.
#[derive(Debug, Error)]
pub enum DistError {
    #[error("launcher variable {var} is not set (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")]
    MissingVar { var: &'static str },
    #[error("launcher variable {var}={value:?} is invalid: {why}")]
    InvalidVar {
        var: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("cannot reach the rendezvous store at {addr} after {waited_ms} ms: {last}")]
    StoreUnreachable {
        addr: String,
        waited_ms: u64,
        last: String,
    },
    #[error("lost the rendezvous store at {addr} (rank 0 exited or died): {source}")]
    StoreLost {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "rank {rank} disconnected without finishing (died?) while this rank waited for {key:?}"
    )]
    PeerLost { rank: usize, key: String },
    /// Another rank gave up (its own error, passed through the store).
    #[error("rank {rank} failed: {reason}")]
    PeerFailed { rank: usize, reason: String },
    #[error(
        "waited {waited_ms} ms for {key:?} in the rendezvous store: {}",
        timeout_hint(key)
    )]
    Timeout { key: String, waited_ms: u64 },
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    /// The store challenge failed: this rank's secret is not the store's.
    #[error("the rendezvous store at {addr} and this rank do not share the job secret ({why}); every rank needs the same FICCO_JOB_SECRET")]
    StoreAuth { addr: String, why: String },
    /// No job secret can be had (see `runtime::auth`).
    #[error("no job secret for the rendezvous store: {why}")]
    NoSecret { why: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn timeout_hint(key: &str) -> String {
    match key.strip_prefix("host/") {
        Some(r) => format!("rank {r} never arrived"),
        None => "a rank is late or stuck".into(),
    }
}
