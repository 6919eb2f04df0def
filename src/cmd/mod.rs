//! One file per command. Each parses nothing itself (clap does, with the
//! shared arguments of `crate::args`) and calls the library.

pub mod characterize;
pub mod evaluate;
pub mod explore;
pub mod gemm_bench;
pub mod info;
pub mod procs;
pub mod schedules;
pub mod select;
pub mod soak;
pub mod tune;

use crate::args::BackendArg;
use crate::output::one_line;
use anyhow::{anyhow, Result};
use ficco_core::run::Backend;
use ficco_core::sim::profile::HwProfile;
use ficco_cuda::CudaError;
use std::sync::atomic::{AtomicBool, Ordering};

/// `--verbose`, set once by `main` before the command runs.
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Sets `--verbose` for the commands.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

/// Whether `--verbose` was given.
pub fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// With `--verbose`, the file names tried for a missing library, on a line
/// of their own (they are too many for the one-line message).
fn explain(e: &CudaError) {
    if let CudaError::LibraryMissing { lib, searched, .. } = e {
        if verbose() {
            eprintln!("ficco: file names tried for {lib}: {}", searched.join(", "));
        }
    }
}

/// Why the GPUs cannot be used, on one line: the library and the file and
/// what is wrong with it, or why the driver does not start; for a missing
/// library, where to put it. The file names tried come with `--verbose`.
pub fn gpu_reason(e: &CudaError) -> String {
    explain(e);
    one_line(&e.to_string())
}

/// For a missing library without `--verbose`: that `--verbose` lists the
/// file names tried.
pub fn tried_hint(e: &CudaError) -> Option<String> {
    match e {
        CudaError::LibraryMissing { searched, .. } if !verbose() => Some(format!(
            "--verbose lists the {} file names tried",
            searched.len()
        )),
        _ => None,
    }
}

/// The unavailability reason of the `auto` fallback note, in one short
/// line: a missing library's advice belongs to `--backend gpu`'s error.
fn short_reason(e: &CudaError) -> String {
    explain(e);
    match e {
        CudaError::LibraryMissing { lib, .. } => format!("{lib} not found"),
        e => one_line(&e.to_string()),
    }
}

/// Opens `--backend` for up to `gpus` GPUs, or for this process's rank of
/// the job `job` describes. With `auto` and no usable GPU, says so on
/// stderr (rank 0 of a job only) and returns the simulator on `hw`.
pub fn open_backend(
    choice: BackendArg,
    gpus: usize,
    hw: &HwProfile,
    job: Option<ficco_cuda::runtime::LaunchEnv>,
) -> Result<Box<dyn Backend>> {
    // One notice per job: rank 0's (the other ranks' stderr is the same terminal).
    let announce = job.as_ref().is_none_or(|env| env.rank == 0);
    let opened = match job {
        Some(env) => ficco_cuda::open_job(choice.into(), env, hw),
        None => ficco_cuda::open(choice.into(), gpus, hw),
    };
    let opened = opened.map_err(|e| {
        let hint = tried_hint(&e).map(|h| format!("; {h}")).unwrap_or_default();
        anyhow!(
            "GPU backend not available: {} (or run with --backend sim to simulate{hint})",
            gpu_reason(&e)
        )
    })?;
    if let Some(e) = opened.fallback.as_ref().filter(|_| announce) {
        eprintln!(
            "ficco: no GPU backend available ({}); simulating with hardware profile '{}'",
            short_reason(e),
            hw.name
        );
    }
    Ok(opened.backend)
}
