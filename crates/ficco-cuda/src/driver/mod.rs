//! The one layer that calls the NVIDIA libraries' raw C APIs (cudarc's `sys`
//! and `result` modules). Every other module calls these wrappers, so a
//! newcomer finds every raw call, and the reasoning for its safety, here.
//!
//! | module | library |
//! |---|---|
//! | [`cuda`] | the CUDA driver: devices, contexts, memory, streams, events, libraries, kernels, green contexts |
//! | [`nccl`] | NCCL: communicators, groups, collectives, send/recv |
//! | [`blas`] | cuBLASLt: handles, descriptors, heuristics, matmul |
//! | [`nvrtc`] | NVRTC: source to CUBIN |
//! | [`dl`] | any of them, raw: `dlopen` a candidate, its path, its symbols, its version function |
//!
//! Conventions: a wrapper returns [`crate::error::Result`] with the call's
//! name; a wrapper is `unsafe` exactly when a caller must promise something
//! the types cannot show (a live handle, device memory of a size), and says
//! what under `# Safety`. cudarc's safe API (`CudaContext`, `CudaStream`,
//! `CudaEvent`, launch builders) is used directly by the other modules.
//!
//! [`dl`] is the raw dynamic loading behind [`crate::loader`]'s probe:
//! cudarc panics on a call into a library or function that is missing, so
//! the loader checks every library with it first.

pub(crate) mod blas;
pub(crate) mod cuda;
pub(crate) mod dl;
pub(crate) mod nccl;
pub(crate) mod nvrtc;

/// Fails `test` unless NVRTC is usable (found, complete, version 13): the
/// compile tests need it but no GPU. They are `#[ignore]`d, so a `cargo
/// test` without NVRTC lists them as ignored; `.ci/run` (NVRTC from PyPI)
/// and `bench/gpu-tests.sh` run them with `--include-ignored`.
#[cfg(test)]
pub(crate) fn require_nvrtc(test: &str) {
    let nvrtc = crate::loader::Libraries::probe().nvrtc;
    assert!(
        nvrtc.usable,
        "{test}: needs NVRTC, which is not usable here ({}): put libnvrtc.so.13 on \
         LD_LIBRARY_PATH (.ci/run installs it from PyPI), or leave out --include-ignored",
        nvrtc
            .problem
            .map(|p| p.to_string())
            .unwrap_or_else(|| "not found".into())
    );
}
