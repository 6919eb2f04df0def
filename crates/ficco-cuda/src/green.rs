//! Green-context SM partitions: a compute stream that runs on N of the
//! device's SMs and, optionally, a communication stream on the rest. This is
//! the "green-context SM partitions" resource control of the design space.
//!
//! Steps: `cuDeviceGetDevResource(SM)` → `cuDevSmResourceSplitByCount` (one
//! group of at least N SMs, the remainder kept) → `cuDevResourceGenerateDesc`
//! → `cuGreenCtxCreate` → `cuGreenCtxStreamCreate`. The driver only splits in
//! units it reports in the SM resource (`minSmPartitionSize`,
//! `smCoscheduledAlignment`; 8 and 8 are typical on Hopper), so the request is
//! rounded up to that granularity and the count actually obtained is read
//! back with `cuGreenCtxGetDevResource`.
//!
//! Kernels must be launched through [`crate::controls::Kernel::launch`] (a
//! context-independent library kernel, launched in the stream's context);
//! cuBLASLt and NCCL take the raw stream handle.
//!
//! See [Green Contexts](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GREEN__CONTEXTS.html).

use crate::controls::{KernelLibrary, PriorityRange, RawStream, StreamPriority};
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::DevicePtr;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// The SM resource of a device, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmResourceInfo {
    pub sm_count: u32,
    /// Smallest partition the driver makes.
    pub min_partition: u32,
    /// Partitions are multiples of this.
    pub alignment: u32,
}

fn sm_info(r: &sys::CUdevResource) -> SmResourceInfo {
    let (sm_count, min_partition, alignment) = cu::sm_fields(r);
    SmResourceInfo {
        sm_count,
        min_partition,
        alignment,
    }
}

/// The device's whole SM resource.
/// See [cuDeviceGetDevResource](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GREEN__CONTEXTS.html).
pub fn device_sm_resource(ctx: &Arc<CudaContext>) -> Result<SmResourceInfo> {
    Ok(sm_info(&device_resource(ctx)?))
}

fn device_resource(ctx: &Arc<CudaContext>) -> Result<sys::CUdevResource> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    cu::device_sm_resource(ctx.cu_device())
}

/// The SM count a request for `want` SMs is rounded up to.
pub fn round_request(want: u32, info: &SmResourceInfo) -> u32 {
    let want = want.max(info.min_partition).max(1);
    let align = info.alignment.max(1);
    want.div_ceil(align) * align
}

/// A green context, destroyed on drop (after its streams).
#[derive(Debug)]
struct GreenCtx(sys::CUgreenCtx);

impl Drop for GreenCtx {
    fn drop(&mut self) {
        // SAFETY: created by cuGreenCtxCreate, destroyed once, after the
        // streams on it (field order of `GreenPartition`).
        unsafe { cu::green_ctx_destroy(self.0) }
    }
}

fn create_green(ctx: &Arc<CudaContext>, res: &mut sys::CUdevResource) -> Result<GreenCtx> {
    Ok(GreenCtx(cu::green_ctx_create(ctx.cu_device(), res)?))
}

fn green_stream(g: &GreenCtx, priority: i32) -> Result<RawStream> {
    // SAFETY: the green context lives while `g` does.
    let stream = unsafe { cu::green_stream_create(g.0, priority)? };
    Ok(RawStream { stream })
}

fn green_sm_count(g: &GreenCtx) -> Result<u32> {
    // SAFETY: the green context lives while `g` does.
    let r = unsafe { cu::green_ctx_sm_resource(g.0)? };
    Ok(sm_info(&r).sm_count)
}

/// What to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRequest {
    /// SMs wanted for compute (rounded up to the driver's granularity).
    pub compute_sms: u32,
    /// Also make a communication stream on the remaining SMs.
    pub comm_stream: bool,
    pub compute_priority: StreamPriority,
    pub comm_priority: StreamPriority,
}

impl PartitionRequest {
    /// `sms` for compute, the rest for communication at high priority.
    pub fn split(sms: u32) -> Self {
        PartitionRequest {
            compute_sms: sms,
            comm_stream: true,
            compute_priority: StreamPriority::Normal,
            comm_priority: StreamPriority::High,
        }
    }

    /// `sms` for compute only.
    pub fn compute_only(sms: u32) -> Self {
        PartitionRequest {
            comm_stream: false,
            ..Self::split(sms)
        }
    }
}

/// A compute stream on a green context of `compute_sms` SMs and optionally a
/// communication stream on a green context of the remaining SMs.
#[derive(Debug)]
pub struct GreenPartition {
    // Streams before contexts: fields drop in declaration order.
    compute: RawStream,
    comm: Option<RawStream>,
    _compute_ctx: GreenCtx,
    _comm_ctx: Option<GreenCtx>,
    /// SMs the compute green context has (read back from the driver).
    pub compute_sms: u32,
    /// SMs the communication green context has (0 without one).
    pub comm_sms: u32,
    /// SMs requested after rounding to the driver's granularity.
    pub requested_sms: u32,
    /// The device's SM resource.
    pub device: SmResourceInfo,
}

// SAFETY: green contexts and streams are driver handles usable from any thread.
unsafe impl Send for GreenPartition {}
// SAFETY: as above; no interior mutation.
unsafe impl Sync for GreenPartition {}

impl GreenPartition {
    /// Splits `ctx`'s device. Errors: [`CudaError::Plan`] when the request
    /// exceeds the device (after rounding), driver errors otherwise.
    /// See [cuDevSmResourceSplitByCount](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GREEN__CONTEXTS.html).
    pub fn new(ctx: &Arc<CudaContext>, req: PartitionRequest) -> Result<Self> {
        crate::loader::require_driver()?;
        let full = device_resource(ctx)?;
        let info = sm_info(&full);
        let want = round_request(req.compute_sms, &info);
        if want > info.sm_count || (req.comm_stream && want >= info.sm_count) {
            return Err(CudaError::Plan(format!(
                "green context of {} SMs (rounded to {want}) does not fit the device's {} SMs{}",
                req.compute_sms,
                info.sm_count,
                if req.comm_stream {
                    " with SMs left for communication"
                } else {
                    ""
                }
            )));
        }
        let (groups, mut result, mut rest) = cu::sm_split_by_count(&full, want)?;
        if groups != 1 {
            return Err(CudaError::Plan(format!(
                "driver made {groups} groups of {want} SMs from {}",
                info.sm_count
            )));
        }
        let range = PriorityRange::of(ctx)?;
        let compute_ctx = create_green(ctx, &mut result)?;
        let compute = green_stream(&compute_ctx, range.value(req.compute_priority))?;
        let compute_sms = green_sm_count(&compute_ctx)?;
        let (comm_ctx, comm, comm_sms) = if req.comm_stream && sm_info(&rest).sm_count > 0 {
            let g = create_green(ctx, &mut rest)?;
            let s = green_stream(&g, range.value(req.comm_priority))?;
            let n = green_sm_count(&g)?;
            (Some(g), Some(s), n)
        } else {
            (None, None, 0)
        };
        Ok(GreenPartition {
            compute,
            comm,
            _compute_ctx: compute_ctx,
            _comm_ctx: comm_ctx,
            compute_sms,
            comm_sms,
            requested_sms: want,
            device: info,
        })
    }

    /// The stream on the compute partition.
    pub fn compute_stream(&self) -> &RawStream {
        &self.compute
    }

    /// The stream on the remaining SMs, when requested.
    pub fn comm_stream(&self) -> Option<&RawStream> {
        self.comm.as_ref()
    }

    /// A further stream on the compute partition (`comm` false) or on the
    /// remaining SMs (`comm` true), at a raw priority value. It must be
    /// dropped before the partition.
    pub fn new_stream(&self, comm: bool, priority: i32) -> Result<RawStream> {
        match (comm, &self._comm_ctx) {
            (false, _) => green_stream(&self._compute_ctx, priority),
            (true, Some(g)) => green_stream(g, priority),
            (true, None) => Err(CudaError::Plan(
                "green partition has no communication context (request it with split)".into(),
            )),
        }
    }
}

/// NVRTC source of the `%smid` probe.
const SMID_SRC: &str = r#"
extern "C" __global__ void ficco_smid(unsigned* out, long long spin) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    long long t0 = clock64();
    while (clock64() - t0 < spin) { }
    if (threadIdx.x == 0) out[blockIdx.x] = id;
}
"#;

/// A kernel that records the SM (`%smid`) each block ran on, to check where
/// a stream's work lands.
#[derive(Debug)]
pub struct SmIdProbe {
    kernel: crate::controls::Kernel,
    _lib: KernelLibrary,
}

impl SmIdProbe {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        crate::loader::require()?;
        let lib = KernelLibrary::load(ctx, "ficco_smid", SMID_SRC)?;
        Ok(SmIdProbe {
            kernel: lib.kernel("ficco_smid")?,
            _lib: lib,
        })
    }

    /// Runs `blocks` blocks of 128 threads, each busy for `spin_cycles`
    /// clocks, on `stream`; returns the SM id of every block. Synchronous.
    ///
    /// # Safety
    /// `stream` must be a live stream of `ctx`'s device (primary or green).
    pub unsafe fn run(
        &self,
        ctx: &Arc<CudaContext>,
        stream: sys::CUstream,
        blocks: u32,
        spin_cycles: i64,
    ) -> Result<Vec<u32>> {
        let buf = crate::mem::DeviceBuffer::alloc(ctx, blocks as usize * 4)?;
        let mut ptr: DevicePtr = buf.ptr();
        let mut spin = spin_cycles;
        let mut params = [
            &mut ptr as *mut DevicePtr as *mut std::ffi::c_void,
            &mut spin as *mut i64 as *mut std::ffi::c_void,
        ];
        // The arguments match `ficco_smid(unsigned*, long long)`; the buffer
        // holds one u32 per block and outlives the synchronize.
        self.kernel
            .launch(stream, (blocks, 1, 1), (128, 1, 1), 0, &mut params)?;
        cu::stream_synchronize(stream)?;
        let mut bytes = vec![0u8; blocks as usize * 4];
        buf.download(&mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Distinct values, sorted.
pub fn distinct(ids: &[u32]) -> Vec<u32> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_up_to_the_driver_granularity() {
        let h = SmResourceInfo {
            sm_count: 132,
            min_partition: 8,
            alignment: 8,
        };
        assert_eq!(round_request(1, &h), 8);
        assert_eq!(round_request(16, &h), 16);
        assert_eq!(round_request(17, &h), 24);
        assert_eq!(round_request(64, &h), 64);
        let odd = SmResourceInfo {
            sm_count: 10,
            min_partition: 0,
            alignment: 0,
        };
        assert_eq!(round_request(3, &odd), 3);
        assert_eq!(round_request(0, &odd), 1);
    }

    #[test]
    fn distinct_sorts_and_dedups() {
        assert_eq!(distinct(&[3, 1, 3, 2, 1]), vec![1, 2, 3]);
    }
}
