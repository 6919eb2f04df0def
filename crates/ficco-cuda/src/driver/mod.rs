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
//!
//! Conventions: a wrapper returns [`crate::error::Result`] with the call's
//! name; a wrapper is `unsafe` exactly when a caller must promise something
//! the types cannot show (a live handle, device memory of a size), and says
//! what under `# Safety`. cudarc's safe API (`CudaContext`, `CudaStream`,
//! `CudaEvent`, launch builders) is used directly by the other modules.
//!
//! The presence probes below only `dlopen`: cudarc panics on a call into a
//! library that is missing, so [`crate::loader`] checks these first.

pub(crate) mod blas;
pub(crate) mod cuda;
pub(crate) mod nccl;
pub(crate) mod nvrtc;

/// Whether libcuda loads.
pub(crate) fn cuda_present() -> bool {
    // SAFETY: only dlopen attempts on fixed library names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether cuBLASLt loads.
pub(crate) fn cublaslt_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// Whether NCCL loads (under the names cudarc tries).
pub(crate) fn nccl_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// Whether NVRTC loads.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}
