//! ficco-cuda: the GPU backend. It executes `ficco_core` plans on NVIDIA GPUs
//! through cudarc: cuBLASLt GEMMs, NCCL collectives, copy-engine peer copies
//! and a few NVRTC kernels, either one process driving every GPU with one
//! host thread per GPU, or one process per GPU ([`runtime`]: `torchrun`,
//! `--procs`, the Python package), with the same plans and executor.
//!
//! The main design choices: all cross-rank ordering goes through one seam,
//! `signal`: flags in device memory that the producer's stream writes and
//! the consumer's stream waits on (no host thread waits for another rank), and
//! nothing in cudarc's implicit machinery is relied on: its per-buffer event
//! tracking is off, buffers are plain `cuMemAlloc` (pool memory copies
//! peer-to-peer at a tenth of NVLink speed), every dependency is an explicit
//! event. Every raw call into the NVIDIA libraries is in `driver`.
//!
//! Public: what the CLI, the Python package and the tests use (the backend
//! and its factory, the session and the job runtime, the GEMM engines, the
//! resource-control toolkit, memory, info, the loader, errors). The
//! executor, the signal protocol, the utility kernels, the NVRTC path and
//! the raw FFI layer are crate-internal.
//!
//! | module | role |
//! |---|---|
//! | [`backend`] | [`GpuBackend`]: open, prepare, measure (implements `ficco_core::run::Backend`) |
//! | [`open()`] | the backend factory: auto, sim or gpu, with the typed reason when no GPU is usable |
//! | [`characterize`] | `ficco characterize`: the measuring loop (plans, data types and the fit: `ficco_core::sim::calibrate`) |
//! | [`info`](mod@info) | GPUs, SMs, memory, copy engines, peer matrix, versions |
//! | [`loader`] | checks libcuda, cuBLASLt, NCCL, NVRTC load before any call (cudarc panics otherwise) |
//! | [`error`] | [`CudaError`] |
//! | [`runtime`] | one process per GPU: launcher environment, TCP rendezvous store, fd passing, VMM memory shared across processes, a backend's rank of a job |
//! | [`session`] | [`session::Session`]: one process's rank of a job, the runtime the Python ops and `--procs` call (measurements and single operator calls) |
//! | `exec` | the executor: `exec::rank` resources, `exec::check` host checks and output comparison, `exec::issue` one function per task kind, `exec::run` the run loop |
//! | `signal` | the cross-rank synchronisation seam: device signal flags, epochs, progress words |
//! | [`comm`] | the NCCL communicator wrapper: sets per (GPUs, `maxCTAs`/`minCTAs`/CTA policy), cached, warmed |
//! | [`gemm`] | cuBLASLt bf16 GEMM with row-major views, cached descriptors, measured algorithm choice |
//! | [`hgemm`] | ficco's own Hopper GEMM (TMA, wgmma, persistent; SM budget, occupancy, tile order, wait/signal/destination hooks) and `gemm-bench` |
//! | [`green`] | green-context SM partitions: compute and communication streams on disjoint SMs |
//! | [`controls`] | stream priorities, raw streams, event timing, context-independent kernel libraries |
//! | `kernels` | ficco's utility kernels: random fill, reduce, check |
//! | `nvrtc` | the one NVRTC compile path and CUBIN cache (memory and disk) |
//! | `mem` | typed device pointers, `cuMemAlloc` buffers, peer access, peer / 2-D copies |
//! | `driver` | the one layer of raw FFI: CUDA driver, NCCL, cuBLASLt, NVRTC calls |

pub mod backend;
pub mod characterize;
pub mod error;
pub(crate) mod exec;
pub mod gemm;
pub mod hgemm;
pub mod info;
pub(crate) mod kernels;
pub mod loader;
pub mod mem;
pub(crate) mod nvrtc;
pub mod open;
pub mod runtime;
pub mod session;
pub(crate) mod signal;

// The resource-control toolkit (stream priorities, green-context SM
// partitions, NCCL communicator limits): public, as schedules and users
// outside the executor build on more of it than the executor uses today.
pub mod comm;
pub mod controls;
pub(crate) mod driver;
pub mod green;

pub use backend::{GpuBackend, MeasureConfig};
pub use error::CudaError;
pub use exec::{RunOpts, DEFAULT_WATCHDOG_MS, GRAPHS_ENV, HANG_EXIT_CODE};
pub use info::{info, SystemInfo};
pub use loader::{nccl_soname_shim, Libraries};
pub use open::{open, open_job, open_loopback, BackendChoice, GpuBackends, Opened};
