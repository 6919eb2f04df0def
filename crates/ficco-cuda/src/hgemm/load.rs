//! The loaded kernel on one device ([`HopperGemm`]): loading the cubin and
//! every entry into the primary context, what it knows of the device (SMs,
//! shared memory, resident clusters), and which schedule a launch gets (the
//! tuned one where the launch leaves it open). The launch itself
//! (`super::launch`), the grouped mode and the tuner add methods in their
//! own files.

use super::compile::{cubin_cached, CompileInfo, ENTRIES};
use super::params::{
    smem_bytes, GemmArgs, LaunchShape, TileN, MAX_SPLIT_TICKETS, SPLIT_WORKSPACE_BYTES, THREADS,
};
use super::schedule::{with_schedule, KernelSchedule, KernelTuneKey};
use super::validate::{validate, Limits};
use crate::driver::cuda as cu;
use crate::driver::hopper;
use crate::error::{drv, CudaError, Result};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::ffi::CString;
use std::sync::Arc;

/// The loaded kernel on one device.
#[derive(Debug)]
pub struct HopperGemm {
    lib: sys::CUlibrary,
    /// One per entry of [`ENTRIES`], in its order.
    pub(super) kernels: [sys::CUkernel; 9],
    /// Clusters of 2 CTAs that can be resident at once (0: the device cannot
    /// run the cluster entries): the most a cluster tile's grid uses.
    max_clusters: u32,
    pub(super) ctx: Arc<CudaContext>,
    pub(super) sms: u32,
    pub(super) max_smem: u32,
    /// Split-K tickets and partials (see the module doc of `super`).
    pub(super) tickets: crate::mem::DeviceBuffer,
    pub(super) workspace: crate::mem::DeviceBuffer,
    compile: CompileInfo,
    /// Schedules [`HopperGemm::autotune`] picked, per shape.
    tuned: std::sync::Mutex<std::collections::HashMap<KernelTuneKey, KernelSchedule>>,
    /// Shapes timed by this instance (the rest came from memory or disk).
    pub(super) timings: std::sync::atomic::AtomicU64,
}

// SAFETY: library and kernel handles are context-independent driver objects;
// the ticket buffer is plain device memory.
unsafe impl Send for HopperGemm {}
// SAFETY: as above; launches only read `self`.
unsafe impl Sync for HopperGemm {}

impl Drop for HopperGemm {
    fn drop(&mut self) {
        // SAFETY: loaded once, unloaded once; no kernel of it is used after.
        unsafe { cu::library_unload(self.lib) }
    }
}

/// Names the call of a failed driver wrapper as hgemm did before it used
/// them (e.g. `cuLaunchKernel(ficco_hgemm)`), so the error says which kernel.
pub(super) fn named(call: &'static str) -> impl Fn(CudaError) -> CudaError {
    move |e| match e {
        CudaError::Driver { code, .. } => CudaError::Driver { call, code },
        e => e,
    }
}

impl HopperGemm {
    /// Compiles (or reads from the disk cache) and loads the kernel on `ctx`'s
    /// device, which must be compute capability 9.0 (Hopper).
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute(compute capability)"))?;
        if (major, minor) != (9, 0) {
            return Err(CudaError::Plan(format!(
                "ficco's Hopper GEMM needs compute capability 9.0 (sm_90a), found {major}.{minor}"
            )));
        }
        let (cubin, compile) = cubin_cached()?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let lib = cu::library_load_data(&cubin)?;
        let sms = crate::controls::device_attribute(
            ctx,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?
        .max(1) as u32;
        let max_smem = crate::controls::device_attribute(
            ctx,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?
        .max(0) as u32;
        let tickets = crate::mem::DeviceBuffer::alloc(ctx, MAX_SPLIT_TICKETS * 4)?;
        let workspace = crate::mem::DeviceBuffer::alloc(ctx, SPLIT_WORKSPACE_BYTES)?;
        let mut g = HopperGemm {
            lib,
            kernels: [std::ptr::null_mut(); 9],
            max_clusters: 0,
            ctx: ctx.clone(),
            sms,
            max_smem,
            tickets,
            workspace,
            compile,
            tuned: Default::default(),
            timings: Default::default(),
        };
        for (i, entry) in ENTRIES.into_iter().enumerate() {
            let name = CString::new(entry).map_err(|e| CudaError::Plan(e.to_string()))?;
            // SAFETY: the library is loaded until `g` drops; its kernels are
            // used only while it lives.
            unsafe {
                g.kernels[i] = cu::library_get_kernel(g.lib, &name)?;
                cu::kernel_set_attribute(
                    g.kernels[i],
                    ctx.cu_device(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    max_smem as i32,
                )
                .map_err(named("cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"))?;
                // Load into the primary context now (lazy loading mid-plan can deadlock).
                cu::kernel_get_function(g.kernels[i])?;
            }
        }
        g.max_clusters = g.resident_clusters();
        // SAFETY: the ticket buffer holds this many u32; its context is current.
        unsafe { cu::memset_d32(g.tickets.ptr(), 0, MAX_SPLIT_TICKETS)? };
        Ok(g)
    }

    /// How many clusters of 2 of the cluster entries fit on the device at
    /// once with the most shared memory (one CTA per SM: the registers allow
    /// no more; a cluster's two CTAs must share a GPC, so this can be fewer
    /// than half the SMs). 0 where the driver cannot say: the cluster tiles
    /// are then refused.
    fn resident_clusters(&self) -> u32 {
        let smem = smem_bytes(TileN::N256C2, TileN::N256C2.max_stages(), 0)
            + TileN::N256C2.staging_bytes();
        let mut least = u32::MAX;
        for kernel in [self.kernels[7], self.kernels[8]] {
            // SAFETY: a kernel of the loaded library; its function is taken
            // in the current context (bound by `load`).
            let n = unsafe {
                cu::kernel_get_function(kernel).and_then(|f| {
                    hopper::occupancy_max_active_clusters(
                        f,
                        2 * self.sms,
                        THREADS,
                        smem.min(self.max_smem),
                    )
                })
            };
            least = least.min(n.unwrap_or(0));
        }
        least.min(self.sms / 2)
    }

    /// How the cubin was obtained and what it cost.
    pub fn compile_info(&self) -> &CompileInfo {
        &self.compile
    }

    /// The device's SM count (the default grid).
    pub fn sms(&self) -> u32 {
        self.sms
    }

    /// Clusters of 2 CTAs resident at once: the most a cluster tile's grid
    /// uses ([`TileN::N256C2`], [`TileN::Pp128C2`]; 0: refused).
    pub fn max_clusters(&self) -> u32 {
        self.max_clusters
    }

    /// The context the kernel was loaded from.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Largest `extra_smem` that fits beside `stages` stages of `tile`.
    pub fn max_extra_smem(&self, tile: TileN, stages: u32) -> u32 {
        self.max_smem.saturating_sub(smem_bytes(tile, stages, 0))
    }

    /// Checks `args` and returns the launch geometry (no device work), with
    /// the tuned schedule where [`HopperGemm::launch`] would take it.
    pub fn shape(&self, args: &GemmArgs) -> Result<LaunchShape> {
        self.resolve(args).map(|(_, shape)| shape)
    }

    /// What [`validate`] checks a launch against on this device.
    fn limits(&self) -> Limits {
        Limits {
            max_smem: self.max_smem,
            sms: self.sms,
            max_clusters: self.max_clusters,
        }
    }

    /// `args` with the tuned schedule of its shape when it leaves the
    /// schedule open (no `tile_n`, no `split_k`, not `untuned`) and
    /// [`HopperGemm::autotune`] has one, and the launch geometry: validated
    /// once, here.
    pub(super) fn resolve(&self, args: &GemmArgs) -> Result<(GemmArgs, LaunchShape)> {
        let h = &args.hooks;
        let open = !h.untuned && h.tile_n.is_none() && h.split_k.is_none();
        if let Some(s) = open.then(|| self.tuned(args)).flatten() {
            let tuned = with_schedule(args, s);
            // A tuned schedule the launch cannot take (a 64-row tile with a
            // start block, which the tune key leaves out; a pick cached on
            // disk under rules since tightened) gives way to the chooser's.
            if let Ok(shape) = validate(&tuned, self.limits()) {
                return Ok((tuned, shape));
            }
        }
        Ok((*args, validate(args, self.limits())?))
    }

    /// The tuned schedule of `args`' shape if [`HopperGemm::autotune`] has
    /// it in memory.
    pub fn tuned(&self, args: &GemmArgs) -> Option<KernelSchedule> {
        self.tuned_map()
            .ok()?
            .get(&KernelTuneKey::of(args))
            .copied()
    }

    /// This instance's tuned picks (the tuner reads and fills them).
    pub(super) fn tuned_map(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, std::collections::HashMap<KernelTuneKey, KernelSchedule>>>
    {
        self.tuned
            .lock()
            .map_err(|_| CudaError::Plan("ficco hgemm: tuning cache poisoned".into()))
    }
}
