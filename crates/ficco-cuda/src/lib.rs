//! ficco-cuda: the GPU backend. It executes `ficco_core` plans on NVIDIA GPUs
//! through cudarc: cuBLASLt GEMMs, NCCL collectives, copy-engine peer copies
//! and a few NVRTC kernels, one process driving every GPU with one host thread
//! per GPU.
//!
//! The main design choice: all cross-rank ordering goes through one seam,
//! [`sync::CrossRankSync`] (in-process events now; IPC handles later), and
//! nothing in cudarc's implicit machinery is relied on: its per-buffer event
//! tracking is off, buffers are plain `cuMemAlloc` (pool memory copies
//! peer-to-peer at a tenth of NVLink speed), every dependency is an explicit event.
//!
//! | module | role |
//! |---|---|
//! | [`loader`] | checks libcuda, cuBLASLt, NCCL, NVRTC load before any call (cudarc panics otherwise) |
//! | [`info`] | GPUs, SMs, memory, copy engines, peer matrix, versions |
//! | [`characterize`] | `ficco characterize`: decomposition, contention and communication measurements, profile fitting |
//! | [`backend`] | [`GpuBackend`]: open, prepare, measure (implements `Measurer`) |
//! | [`exec`] | the executor: streams, events, iterations, task issue |
//! | [`sync`] | the cross-rank synchronisation seam |
//! | [`gemm`] | cuBLASLt bf16 GEMM with row-major views, cached descriptors |
//! | [`kernels`] | NVRTC kernels: random fill, reduce, check |
//! | [`mem`] | `cuMemAlloc` buffers, peer access, peer / 2-D copies |
//! | [`controls`] | stream priorities, raw streams, event timing, context-independent NVRTC libraries |
//! | [`nccl_config`] | NCCL communicators with `maxCTAs` / `minCTAs` / CTA policy, cached per config |
//! | [`green`] | green-context SM partitions: compute and communication streams on disjoint SMs |
//! | [`shaped`] | ficco's tensor-core bf16 GEMM and bias+GELU, with shared-memory occupancy shaping |
//! | [`error`] | [`CudaError`] |

pub mod backend;
pub mod characterize;
pub mod controls;
pub mod error;
pub mod exec;
pub mod gemm;
pub mod green;
pub mod hgemm;
pub mod info;
pub mod kernels;
pub mod loader;
pub mod mem;
pub mod nccl_config;
pub mod shaped;
pub mod sync;

pub use backend::{GpuBackend, MeasureConfig};
pub use error::CudaError;
pub use info::{info, SystemInfo};
pub use loader::{nccl_soname_shim, Libraries};
