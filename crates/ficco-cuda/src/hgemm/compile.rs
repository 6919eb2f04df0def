//! From source to cubin: the kernel's source and entry points, and its
//! compile through `crate::nvrtc`, the crate's one NVRTC path and cubin
//! cache (memory and disk), so that the GEMM shares the cache, its key and
//! its directory with every other kernel of ficco.

use crate::error::Result;
use std::path::PathBuf;
use std::sync::Arc;

/// The kernel source, compiled by NVRTC at [`super::HopperGemm::load`].
pub const SOURCE: &str = include_str!("hgemm.cu");
const KERNEL_NAME: &str = "ficco_hgemm";
const ENTRY_N256: &str = "ficco_hgemm_n256";
const ENTRY_N128: &str = "ficco_hgemm_n128";
const ENTRY_M64N256: &str = "ficco_hgemm_n256_m64";
pub(super) const ENTRY_N256_GROUPED: &str = "ficco_hgemm_n256_grouped";
pub(super) const ENTRY_N128_GROUPED: &str = "ficco_hgemm_n128_grouped";
const ENTRY_N128_PP: &str = "ficco_hgemm_n128_pp";
const ENTRY_M64N128: &str = "ficco_hgemm_n128_m64";
const ENTRY_N256_C2: &str = "ficco_hgemm_n256_c2";
const ENTRY_N128_PP_C2: &str = "ficco_hgemm_n128_pp_c2";
/// Every entry, in the order of [`super::HopperGemm`]'s kernel handles.
pub(super) const ENTRIES: [&str; 9] = [
    ENTRY_N256,
    ENTRY_N128,
    ENTRY_M64N256,
    ENTRY_N256_GROUPED,
    ENTRY_N128_GROUPED,
    ENTRY_N128_PP,
    ENTRY_M64N128,
    ENTRY_N256_C2,
    ENTRY_N128_PP_C2,
];
/// The architecture the kernel compiles for (wgmma, setmaxnreg: Hopper only).
const ARCH: &str = "sm_90a";

/// How the cubin was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CacheOutcome {
    /// This process had compiled or read it already (an earlier load).
    Memory,
    /// Read from the disk cache.
    Hit,
    /// Compiled, and stored in the disk cache.
    Stored,
    /// Compiled; no writable cache directory.
    Uncached,
}

/// What loading the kernel cost.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CompileInfo {
    /// Wall time to obtain the cubin (compile, or read the cache), ms.
    pub ms: f64,
    pub cache: CacheOutcome,
    pub path: Option<PathBuf>,
    /// NVRTC (major, minor).
    pub nvrtc: (i32, i32),
}

/// The cubin of [`SOURCE`] through `crate::nvrtc`'s caches, and what it cost.
pub(super) fn cubin_cached() -> Result<(Arc<Vec<u8>>, CompileInfo)> {
    let c = crate::nvrtc::cubin(KERNEL_NAME, SOURCE, crate::nvrtc::DEFAULT_OPTIONS, ARCH)?;
    let cache = match c.stats.origin {
        crate::nvrtc::CubinOrigin::Memory => CacheOutcome::Memory,
        crate::nvrtc::CubinOrigin::Disk => CacheOutcome::Hit,
        crate::nvrtc::CubinOrigin::Compiled if c.path.is_some() => CacheOutcome::Stored,
        crate::nvrtc::CubinOrigin::Compiled => CacheOutcome::Uncached,
    };
    let info = CompileInfo {
        ms: c.stats.ms,
        cache,
        path: c.path,
        nvrtc: c.nvrtc,
    };
    Ok((c.image, info))
}

/// Compiles [`SOURCE`] for sm_90a (uncached).
pub fn compile() -> Result<Vec<u8>> {
    compile_with(&[]).map(|(cubin, _)| cubin)
}

/// Compiles the kernel with `extra` NVRTC options (uncached); the cubin and
/// NVRTC's log (ptxas' report with `--ptxas-options=-v`).
pub fn compile_with(extra: &[&str]) -> Result<(Vec<u8>, String)> {
    let mut opts: Vec<&str> = crate::nvrtc::DEFAULT_OPTIONS.to_vec();
    opts.extend_from_slice(extra);
    crate::nvrtc::compile_with_log(KERNEL_NAME, SOURCE, &opts, ARCH)
}
