//! One file per command. Each parses nothing itself (clap does, with the
//! shared arguments of `crate::args`) and calls the library.

pub mod characterize;
pub mod evaluate;
pub mod explore;
pub mod gemm_bench;
pub mod info;
pub mod schedules;
pub mod select;
pub mod tune;

use crate::args::BackendArg;
use crate::output::one_line;
use anyhow::{anyhow, Result};
use ficco_core::run::Backend;
use ficco_core::sim::profile::HwProfile;
use ficco_cuda::CudaError;

/// The unavailability reason in one short line: the list of file names
/// searched belongs to `--backend gpu`'s error, not to the fallback note.
fn short_reason(e: &CudaError) -> String {
    match e {
        CudaError::LibraryMissing { lib, .. } => format!("{lib} library not found"),
        e => one_line(&e.to_string()),
    }
}

/// Opens `--backend` for up to `gpus` GPUs. With `auto` and no usable GPU,
/// says so on stderr and returns the simulator on `hw`.
pub fn open_backend(choice: BackendArg, gpus: usize, hw: &HwProfile) -> Result<Box<dyn Backend>> {
    let opened = ficco_cuda::open(choice.into(), gpus, hw).map_err(|e| {
        anyhow!("GPU backend not available: {e} (or run with --backend sim to simulate)")
    })?;
    if let Some(e) = &opened.fallback {
        eprintln!(
            "ficco: no GPU backend available ({}); simulating with hardware profile '{}'",
            short_reason(e),
            hw.name
        );
    }
    Ok(opened.backend)
}
