//! The one layer that calls the NVIDIA libraries' raw C APIs (cudarc's `sys`
//! and `result` modules). Every other module calls these wrappers, so a
//! newcomer finds every raw call, and the reasoning for its safety, here.
//!
//! | module | library |
//! |---|---|
//! | [`cuda`] | the CUDA driver: devices, contexts, memory, streams, events, libraries, kernels, green contexts |
//! | [`hopper`] | the CUDA driver's Hopper features: TMA tensor maps, cluster occupancy |
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

use cudarc::driver::DeviceRepr;

pub(crate) mod blas;
pub(crate) mod cuda;
pub(crate) mod dl;
pub(crate) mod hopper;
pub(crate) mod nccl;
pub(crate) mod nvrtc;

/// A device address (`CUdeviceptr`). Only a typed value: holding one proves
/// nothing; the `unsafe fn`s that take one state what it must point to.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

// SAFETY: `repr(transparent)` over u64, the kernel parameter type of a pointer.
unsafe impl DeviceRepr for DevicePtr {}

impl DevicePtr {
    /// The null address (kernels read it as "absent", e.g. no bias).
    pub const NULL: DevicePtr = DevicePtr(0);

    /// Whether this is [`Self::NULL`] (e.g. memory of another node's rank).
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The raw address, for the FFI layer and kernel parameter blocks.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }

    /// Whether the address is a multiple of `align` bytes.
    pub fn is_aligned(self, align: u64) -> bool {
        self.0 % align == 0
    }
}
