//! NCCL communicators: the one wrapper ([`NcclComm`], one rank's
//! communicator; [`CommSet`], the communicators of a set of GPUs) and the
//! process-wide [`CommCache`]. Every communicator is created with
//! `ncclCommInitRankConfig` and an `ncclConfig_t` from [`NcclLimits`], which
//! can cap the CTAs (thread blocks, hence SMs) NCCL's kernels may take and
//! set the CTA policy: the "NCCL `maxCTAs` and CTA policy" resource control of
//! the design space. The executor's default communicators are the set with
//! default limits. The raw calls are in `crate::driver::nccl`.
//!
//! The config is built like `NCCL_CONFIG_INITIALIZER`: `size`, `magic`
//! (`0xcafebeef`) and `version` set, every other field "undefined"
//! (`INT_MIN` / null) so NCCL keeps its default. cudarc's struct is the NCCL
//! 2.30 layout; the device runs NCCL 2.28. NCCL copies `min(size, its own
//! sizeof)` bytes and reads `version` to know which fields the caller knew,
//! so [`NcclLimits::to_raw`] declares the 2.28 prefix only (`size` = offset of
//! the first field 2.29 added, `version` = 2.28.0). The 2.28 layout is a
//! prefix of cudarc's (fields are only ever appended).
//!
//! NCCL 2.28 has no call that reads a communicator's configuration back;
//! [`CommSet`] keeps the limits it was created with plus what NCCL does
//! report (rank count, device, rank), and the GPU test checks the effect
//! (an all-reduce limited to one CTA is much slower).
//!
//! Communicators cost ~0.5 s for 4 ranks, so [`CommCache`] creates one
//! [`CommSet`] per (GPUs, limits) and hands out the same `Arc` afterwards;
//! [`CommSet::warm`] establishes NCCL's connections once per set.
//!
//! See [ncclConfig_t](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html#ncclconfig-t),
//! [ncclCommInitRankConfig](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclcomminitrankconfig)
//! and [CTA policy flags](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/flags.html).

use crate::driver::nccl::{self as nc, RawComm};
use crate::error::{drv, CudaError, Result};
use crate::mem::DeviceBuffer;
use cudarc::driver::CudaContext;
use cudarc::nccl::sys as nsys;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// `NCCL_CONFIG_UNDEF_INT`.
pub const UNDEF_INT: i32 = i32::MIN;
/// `NCCL_API_MAGIC` / the `magic` of `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_VERSION(2, 28, 0)`: the config layout this module fills in.
pub const CONFIG_VERSION: u32 = 22800;

/// NCCL's CTA policy (`NCCL_CTA_POLICY_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtaPolicy {
    /// `NCCL_CTA_POLICY_DEFAULT` (0): maximal performance.
    Default,
    /// `NCCL_CTA_POLICY_EFFICIENCY` (1): fewest CTAs that still perform well;
    /// meant for compute–communication overlap.
    Efficiency,
    /// `NCCL_CTA_POLICY_ZERO` (2, NCCL ≥ 2.28): zero CTAs where possible
    /// (copy-engine paths), even at some cost in speed.
    Zero,
}

impl CtaPolicy {
    pub fn raw(self) -> i32 {
        match self {
            CtaPolicy::Default => 0,
            CtaPolicy::Efficiency => 1,
            CtaPolicy::Zero => 2,
        }
    }
}

/// The resource limits of a set of communicators. `None` keeps NCCL's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NcclLimits {
    /// `maxCTAs`: most CTAs (channels) per collective kernel; NCCL caps it at 64.
    pub max_ctas: Option<u32>,
    /// `minCTAs`: fewest CTAs; NCCL lowers it to `maxCTAs` if larger.
    pub min_ctas: Option<u32>,
    /// `CTAPolicy`.
    pub cta_policy: Option<CtaPolicy>,
    /// `cgaClusterSize` (0..=8 on Hopper; 0 disables clusters).
    pub cga_cluster_size: Option<u32>,
}

impl NcclLimits {
    /// Validates the limits (NCCL would silently clamp bad values).
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(CudaError::Plan(format!("NCCL limits: {s}")));
        if let Some(m) = self.max_ctas {
            if !(1..=64).contains(&m) {
                return bad(format!("maxCTAs {m} not in 1..=64"));
            }
        }
        if let Some(m) = self.min_ctas {
            if !(1..=64).contains(&m) {
                return bad(format!("minCTAs {m} not in 1..=64"));
            }
        }
        if let (Some(lo), Some(hi)) = (self.min_ctas, self.max_ctas) {
            if lo > hi {
                return bad(format!("minCTAs {lo} > maxCTAs {hi}"));
            }
        }
        if let Some(c) = self.cga_cluster_size {
            if c > 8 {
                return bad(format!("cgaClusterSize {c} > 8"));
            }
        }
        Ok(())
    }

    /// The `ncclConfig_t` these limits describe, initialised like
    /// `NCCL_CONFIG_INITIALIZER` (see the module doc for size and version).
    pub fn to_raw(self) -> nsys::ncclConfig_t {
        let opt = |v: Option<u32>| v.map_or(UNDEF_INT, |x| x as i32);
        nsys::ncclConfig_t {
            size: std::mem::offset_of!(nsys::ncclConfig_t, graphUsageMode),
            magic: CONFIG_MAGIC,
            version: CONFIG_VERSION,
            blocking: 1,
            cgaClusterSize: opt(self.cga_cluster_size),
            minCTAs: opt(self.min_ctas),
            maxCTAs: opt(self.max_ctas),
            netName: std::ptr::null(),
            splitShare: UNDEF_INT,
            trafficClass: UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: UNDEF_INT,
            CTAPolicy: self.cta_policy.map_or(UNDEF_INT, CtaPolicy::raw),
            shrinkShare: UNDEF_INT,
            nvlsCTAs: UNDEF_INT,
            nChannelsPerNetPeer: UNDEF_INT,
            nvlinkCentricSched: UNDEF_INT,
            graphUsageMode: UNDEF_INT,
            numRmaCtx: UNDEF_INT,
            maxP2pPeers: UNDEF_INT,
        }
    }
}

/// One rank's communicator, destroyed on drop.
#[derive(Debug)]
pub struct NcclComm {
    comm: RawComm,
}

// SAFETY: each communicator is used by one host thread at a time (callers
// hold it through `CommSet`, and NCCL calls on it are issued by one thread).
unsafe impl Send for NcclComm {}
// SAFETY: shared read-only; NCCL calls need the caller's serialisation per comm.
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// This process's rank `rank` of an `n`-rank communicator whose other
    /// ranks live in other processes (one process per GPU): `id` is the
    /// job's shared id (see `crate::runtime::nccl`); the rank's device context
    /// must be current. Blocks until every rank has joined.
    pub fn init_rank(
        n: usize,
        id: nsys::ncclUniqueId,
        rank: usize,
        limits: NcclLimits,
    ) -> Result<Self> {
        limits.validate()?;
        let mut raw: RawComm = std::ptr::null_mut();
        let mut config = limits.to_raw();
        // SAFETY: out-pointer and config outlive the call (no group); the
        // caller made the rank's context current.
        let r =
            unsafe { nc::comm_init_rank_config(&mut raw, n as i32, id, rank as i32, &mut config) };
        // Owned (destroyed on drop) from here, even if the call failed late.
        let comm = (!raw.is_null()).then_some(NcclComm { comm: raw });
        r?;
        comm.ok_or_else(|| {
            CudaError::Plan("ncclCommInitRankConfig returned no communicator".into())
        })
    }

    /// The raw handle, for NCCL calls (valid while `self` lives).
    pub fn raw(&self) -> RawComm {
        self.comm
    }

    /// Ranks in the communicator (`ncclCommCount`).
    pub fn count(&self) -> Result<i32> {
        // SAFETY: live communicator.
        unsafe { nc::comm_count(self.comm) }
    }

    /// The CUDA device of this rank (`ncclCommCuDevice`).
    pub fn device(&self) -> Result<i32> {
        // SAFETY: live communicator.
        unsafe { nc::comm_cu_device(self.comm) }
    }

    /// This communicator's rank (`ncclCommUserRank`).
    pub fn rank(&self) -> Result<i32> {
        // SAFETY: live communicator.
        unsafe { nc::comm_user_rank(self.comm) }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: created by ncclCommInitRankConfig, destroyed once.
        unsafe { nc::comm_destroy(self.comm) }
    }
}

/// The communicators of one set of GPUs under one [`NcclLimits`]; rank i is
/// `gpus[i]`.
#[derive(Debug)]
pub struct CommSet {
    pub gpus: Vec<usize>,
    pub limits: NcclLimits,
    /// `ncclGetVersion` of the loaded library, e.g. 22803.
    pub nccl_version: i32,
    // Communicators before contexts: fields drop in declaration order.
    comms: Vec<NcclComm>,
    /// The GPUs' primary contexts, kept alive as long as the communicators.
    ctxs: Vec<Arc<CudaContext>>,
    /// Whether [`CommSet::warm`] has run.
    warmed: std::sync::atomic::AtomicBool,
}

impl CommSet {
    /// Creates one communicator per GPU from this thread: `ncclGetUniqueId`,
    /// then `ncclCommInitRankConfig` for every rank inside one
    /// `ncclGroupStart`/`ncclGroupEnd`, each with its device's primary
    /// context current (NCCL takes the rank's device from the current one).
    pub fn new(gpus: &[usize], limits: NcclLimits) -> Result<Self> {
        crate::loader::require()?;
        limits.validate()?;
        if gpus.is_empty() {
            return Err(CudaError::Plan("a communicator set needs a GPU".into()));
        }
        let mut sorted = gpus.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != gpus.len() {
            return Err(CudaError::Plan(format!("GPU listed twice in {gpus:?}")));
        }
        let found = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))? as usize;
        if let Some(&g) = gpus.iter().find(|&&g| g >= found) {
            return Err(CudaError::NotEnoughGpus {
                wanted: g + 1,
                found,
            });
        }
        let ctxs = gpus
            .iter()
            .map(|&g| CudaContext::new(g).map_err(drv("cuDevicePrimaryCtxRetain")))
            .collect::<Result<Vec<_>>>()?;
        let version = nc::version()?;
        let id = nc::unique_id()?;
        let n = gpus.len() as i32;
        let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); gpus.len()];
        let mut configs: Vec<nsys::ncclConfig_t> = gpus.iter().map(|_| limits.to_raw()).collect();
        let res = nc::grouped(|| {
            for (r, ctx) in ctxs.iter().enumerate() {
                ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
                // SAFETY: out-pointer and config are live until ncclGroupEnd
                // returns (both vectors outlive `grouped`); the id is shared
                // by all ranks; the rank's context is current.
                unsafe {
                    nc::comm_init_rank_config(&mut raw[r], n, id, r as i32, &mut configs[r])?
                };
            }
            Ok(())
        });
        // Whatever was created is owned (and destroyed on error) from here.
        let comms: Vec<NcclComm> = raw
            .into_iter()
            .filter(|c| !c.is_null())
            .map(|comm| NcclComm { comm })
            .collect();
        res?;
        if comms.len() != gpus.len() {
            return Err(CudaError::Plan(format!(
                "NCCL created {} of {} communicators",
                comms.len(),
                gpus.len()
            )));
        }
        Ok(CommSet {
            gpus: gpus.to_vec(),
            limits,
            nccl_version: version,
            comms,
            ctxs,
            warmed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The communicators, rank order.
    pub fn comms(&self) -> &[NcclComm] {
        &self.comms
    }

    /// Establishes NCCL's connections once per set (they are made lazily at
    /// the first call of each kind, which blocks the host until peers join,
    /// and can deadlock inside a running plan); later calls return at once.
    pub fn warm(&self) -> Result<()> {
        if self.first_use() {
            warm_comms(&self.ctxs, &self.comms)?;
        }
        Ok(())
    }

    /// True the first time only: the caller then warms the set up.
    pub fn first_use(&self) -> bool {
        !self.warmed.swap(true, std::sync::atomic::Ordering::SeqCst)
    }

    /// What NCCL reports about each rank, `(count, device, rank)`, checked
    /// against the set's GPUs; an error names the first mismatch.
    pub fn verify(&self) -> Result<Vec<(i32, i32, i32)>> {
        let mut out = vec![];
        for (r, c) in self.comms.iter().enumerate() {
            let got = (c.count()?, c.device()?, c.rank()?);
            let want = (self.gpus.len() as i32, self.gpus[r] as i32, r as i32);
            if got != want {
                return Err(CudaError::Plan(format!(
                    "communicator {r}: NCCL reports (count, device, rank) = {got:?}, expected {want:?}"
                )));
            }
            out.push(got);
        }
        Ok(out)
    }
}

/// All-reduce of a small and a large message, all-gather, reduce-scatter and
/// a send/recv with every peer, issued from this thread in one group per
/// step, each collective at an LL-, LL128- and Simple-sized message, so every
/// kernel and connection NCCL picks later already exists.
fn warm_comms(ctxs: &[Arc<CudaContext>], comms: &[NcclComm]) -> Result<()> {
    let n = ctxs.len();
    let elems = 4 << 20; // 8 MiB of bf16 per buffer
    let mut bufs = vec![];
    let mut streams = vec![];
    for ctx in ctxs {
        bufs.push((
            DeviceBuffer::alloc(ctx, elems * 2 * n)?,
            DeviceBuffer::alloc(ctx, elems * 2 * n)?,
        ));
        streams.push(ctx.new_stream().map_err(drv("cuStreamCreate"))?);
    }
    let sizes = [1024usize, 64 << 10, elems];
    for step in 0..4 * sizes.len() {
        let (kind, count) = (step % 4, sizes[step / 4]);
        nc::grouped(|| {
            for r in 0..n {
                let (a, b) = (bufs[r].0.ptr(), bufs[r].1.ptr());
                let s = streams[r].cu_stream();
                let c = comms[r].raw();
                // SAFETY: buffers hold n * elems bf16 each; one stream per
                // communicator; this thread issues every rank's call.
                unsafe {
                    match kind {
                        0 => nc::all_reduce(a, b, count, c, s)?,
                        1 => nc::all_gather(a, b, count, c, s)?,
                        2 => nc::reduce_scatter(a, b, count, c, s)?,
                        _ => {
                            for p in (0..n).filter(|&p| p != r) {
                                nc::send(a, count, p, c, s)?;
                                nc::recv(b, count, p, c, s)?;
                            }
                        }
                    }
                }
            }
            Ok(())
        })?;
    }
    for s in &streams {
        s.synchronize().map_err(drv("cuStreamSynchronize"))?;
    }
    Ok(())
}

type CacheMap = HashMap<(Vec<usize>, NcclLimits), Arc<CommSet>>;

/// One [`CommSet`] per (GPUs, limits), created at first request and shared after.
#[derive(Debug, Default)]
pub struct CommCache {
    sets: Mutex<CacheMap>,
}

impl CommCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide cache.
    pub fn global() -> &'static CommCache {
        static C: OnceLock<CommCache> = OnceLock::new();
        C.get_or_init(CommCache::new)
    }

    /// The communicators for `gpus` under `limits`, created once. Creation
    /// holds the cache lock (NCCL init of in-process ranks must not interleave).
    pub fn get(&self, gpus: &[usize], limits: NcclLimits) -> Result<Arc<CommSet>> {
        let mut sets = self
            .sets
            .lock()
            .map_err(|_| CudaError::Plan("NCCL communicator cache poisoned".into()))?;
        let key = (gpus.to_vec(), limits);
        if let Some(s) = sets.get(&key) {
            return Ok(s.clone());
        }
        let s = Arc::new(CommSet::new(gpus, limits)?);
        sets.insert(key, s.clone());
        Ok(s)
    }

    /// Sets created so far.
    pub fn len(&self) -> usize {
        self.sets.lock().map(|s| s.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_initialised_like_the_nccl_initializer() {
        let c = NcclLimits::default().to_raw();
        assert_eq!(c.magic, 0xcafebeef);
        assert_eq!(c.version, 22800);
        // The 2.28 layout: 8 + 4 + 4 + 4*4 + 8 + 4 + 4 + 8 + 4*6 bytes.
        assert_eq!(c.size, 80);
        assert_eq!(c.maxCTAs, i32::MIN);
        assert_eq!(c.minCTAs, i32::MIN);
        assert_eq!(c.CTAPolicy, i32::MIN);
        assert_eq!(c.cgaClusterSize, i32::MIN);
        assert!(c.netName.is_null() && c.commName.is_null());
        assert_eq!(c.blocking, 1);
    }

    #[test]
    fn limits_are_written_and_validated() {
        let l = NcclLimits {
            max_ctas: Some(4),
            min_ctas: Some(2),
            cta_policy: Some(CtaPolicy::Efficiency),
            cga_cluster_size: Some(0),
        };
        l.validate().unwrap();
        let c = l.to_raw();
        assert_eq!(
            (c.maxCTAs, c.minCTAs, c.CTAPolicy, c.cgaClusterSize),
            (4, 2, 1, 0)
        );
        assert_eq!(CtaPolicy::Zero.raw(), 2);
        for bad in [
            NcclLimits {
                max_ctas: Some(0),
                ..Default::default()
            },
            NcclLimits {
                max_ctas: Some(65),
                ..Default::default()
            },
            NcclLimits {
                min_ctas: Some(5),
                max_ctas: Some(4),
                ..Default::default()
            },
            NcclLimits {
                cga_cluster_size: Some(9),
                ..Default::default()
            },
        ] {
            assert!(matches!(bad.validate(), Err(CudaError::Plan(_))), "{bad:?}");
        }
    }

    #[test]
    fn cache_starts_empty_and_bad_requests_are_typed_errors() {
        let c = CommCache::new();
        assert!(c.is_empty());
        let bad = NcclLimits {
            max_ctas: Some(0),
            ..Default::default()
        };
        // Without NCCL this is LibraryMissing; with it, the limits are rejected.
        match c.get(&[0], bad) {
            Err(CudaError::LibraryMissing { .. } | CudaError::Plan(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(c.is_empty());
    }
}
