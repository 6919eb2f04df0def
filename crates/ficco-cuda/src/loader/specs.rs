//! What ficco needs of each NVIDIA library: the file-name stems cudarc
//! searches, every function ficco calls, the version function, and the
//! versions ficco's bindings support.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The CUDA version ficco's bindings are generated for: cudarc's
/// `cuda-13000` feature in the workspace `Cargo.toml`. The driver must be at
/// least this version; cuBLASLt and NVRTC must have this major version
/// (their ABI is versioned by major, like their file names `.so.13`).
pub const CUDA_BUILT_FOR: (u32, u32) = (13, 0);

/// How a library says its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionCall {
    /// `CUresult cuDriverGetVersion(int*)`: 1000 * major + 10 * minor.
    Driver,
    /// `size_t cublasLtGetVersion(void)`: 10000 * major + 100 * minor + patch.
    CublasLt,
    /// `ncclResult_t ncclGetVersion(int*)`: 10000 * major + 100 * minor + patch
    /// (1000 * major + 100 * minor + patch before 2.9).
    Nccl,
    /// `nvrtcResult nvrtcVersion(int*, int*)`: major, minor.
    Nvrtc,
}

/// What ficco needs from one NVIDIA library.
#[derive(Debug)]
pub struct LibSpec {
    /// Short name, as `ficco info` lists it: "libcuda", "cuBLASLt", "NCCL", "NVRTC".
    pub name: &'static str,
    /// The name in error messages.
    pub label: &'static str,
    /// The stems cudarc builds its candidate file names from.
    pub stems: &'static [&'static str],
    /// Every function ficco calls in the library, directly or through
    /// cudarc's safe API (a unit test checks the direct calls against the
    /// source). A genuine library of a supported version exports them all.
    pub symbols: &'static [&'static str],
    /// The version function (it is also in `symbols`).
    pub version_symbol: &'static str,
    pub version_call: VersionCall,
}

/// The CUDA driver.
pub static CUDA: LibSpec = LibSpec {
    name: "libcuda",
    label: "libcuda (the CUDA driver)",
    stems: &["cuda", "nvcuda"],
    symbols: &[
        "cuInit",
        "cuDriverGetVersion",
        "cuGetErrorName",
        "cuGetErrorString",
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuDeviceGetAttribute",
        "cuDeviceGetName",
        "cuDeviceTotalMem_v2",
        "cuDeviceCanAccessPeer",
        "cuDeviceGetP2PAttribute",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuCtxSetCurrent",
        "cuCtxGetCurrent",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
        "cuCtxSynchronize",
        "cuCtxGetStreamPriorityRange",
        "cuCtxEnablePeerAccess",
        "cuStreamCreate",
        "cuStreamCreateWithPriority",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamQuery",
        "cuStreamGetPriority",
        "cuStreamGetCtx",
        "cuStreamIsCapturing",
        "cuGraphLaunch",
        "cuGraphDebugDotPrint",
        "cuGraphGetEdges_v2",
        "cuGraphGetNodes",
        "cuGraphNodeGetType",
        "cuStreamWaitEvent",
        "cuStreamWriteValue32_v2",
        "cuStreamWaitValue32_v2",
        "cuStreamBatchMemOp_v2",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventQuery",
        "cuEventSynchronize",
        "cuEventElapsedTime_v2",
        "cuEventDestroy_v2",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemGetAllocationGranularity",
        "cuMemCreate",
        "cuMemExportToShareableHandle",
        "cuMemImportFromShareableHandle",
        "cuMemAddressReserve",
        "cuMemMap",
        "cuMemSetAccess",
        "cuMemUnmap",
        "cuMemRelease",
        "cuMemAddressFree",
        "cuMemAllocAsync",
        "cuMemFreeAsync",
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuMemHostGetDevicePointer_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyDtoDAsync_v2",
        "cuMemcpyAsync",
        "cuMemcpyPeerAsync",
        "cuMemcpy2DAsync_v2",
        "cuMemsetD8Async",
        "cuMemsetD16Async",
        "cuMemsetD32Async",
        "cuMemsetD32_v2",
        "cuModuleLoadData",
        "cuModuleGetFunction",
        "cuModuleUnload",
        "cuLibraryLoadData",
        "cuLibraryUnload",
        "cuLibraryGetKernel",
        "cuKernelGetFunction",
        "cuKernelSetAttribute",
        "cuFuncGetAttribute",
        "cuFuncSetAttribute",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        "cuOccupancyMaxActiveClusters",
        "cuTensorMapEncodeTiled",
        "cuDeviceGetDevResource",
        "cuDevSmResourceSplitByCount",
        "cuDevResourceGenerateDesc",
        "cuGreenCtxCreate",
        "cuGreenCtxDestroy",
        "cuGreenCtxGetDevResource",
        "cuGreenCtxStreamCreate",
    ],
    version_symbol: "cuDriverGetVersion",
    version_call: VersionCall::Driver,
};

/// cuBLASLt.
pub static CUBLASLT: LibSpec = LibSpec {
    name: "cuBLASLt",
    label: "cuBLASLt",
    stems: &["cublasLt"],
    symbols: &[
        "cublasLtGetVersion",
        "cublasLtCreate",
        "cublasLtDestroy",
        "cublasLtMatmulDescCreate",
        "cublasLtMatmulDescDestroy",
        "cublasLtMatmulDescSetAttribute",
        "cublasLtMatmulPreferenceCreate",
        "cublasLtMatmulPreferenceDestroy",
        "cublasLtMatmulPreferenceSetAttribute",
        "cublasLtMatrixLayoutCreate",
        "cublasLtMatrixLayoutDestroy",
        "cublasLtMatmulAlgoGetHeuristic",
        "cublasLtMatmul",
    ],
    version_symbol: "cublasLtGetVersion",
    version_call: VersionCall::CublasLt,
};

/// NCCL.
pub static NCCL: LibSpec = LibSpec {
    name: "NCCL",
    label: "NCCL",
    stems: &["nccl"],
    symbols: &[
        "ncclGetVersion",
        "ncclGetUniqueId",
        "ncclCommInitRankConfig",
        "ncclCommDestroy",
        "ncclCommCount",
        "ncclCommCuDevice",
        "ncclCommUserRank",
        "ncclGroupStart",
        "ncclGroupEnd",
        "ncclAllGather",
        "ncclAllReduce",
        "ncclReduceScatter",
        "ncclSend",
        "ncclRecv",
    ],
    version_symbol: "ncclGetVersion",
    version_call: VersionCall::Nccl,
};

/// NVRTC.
pub static NVRTC: LibSpec = LibSpec {
    name: "NVRTC",
    label: "NVRTC",
    stems: &["nvrtc"],
    symbols: &[
        "nvrtcVersion",
        "nvrtcCreateProgram",
        "nvrtcCompileProgram",
        "nvrtcDestroyProgram",
        "nvrtcGetProgramLogSize",
        "nvrtcGetProgramLog",
        "nvrtcGetCUBINSize",
        "nvrtcGetCUBIN",
    ],
    version_symbol: "nvrtcVersion",
    version_call: VersionCall::Nvrtc,
};

/// The four libraries, in the order the backend needs them.
pub static SPECS: [&LibSpec; 4] = [&CUDA, &CUBLASLT, &NCCL, &NVRTC];

/// A library's version as it reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibVersion {
    pub major: u32,
    pub minor: u32,
    /// Absent where the library does not report one (the driver, NVRTC).
    pub patch: Option<u32>,
    /// The number the version function returned (NVRTC's pair as 1000 *
    /// major + minor).
    pub raw: i64,
}

impl fmt::Display for LibVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)?;
        if let Some(p) = self.patch {
            write!(f, ".{p}")?;
        }
        Ok(())
    }
}

/// The file names cudarc tries for `stems`, in its order, each once (its
/// list repeats names).
pub fn candidates(stems: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for c in stems
        .iter()
        .flat_map(|n| cudarc::get_lib_name_candidates(n))
    {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// A version number as `call` encodes it (NVRTC's pair as 1000 * major + minor).
pub fn decode_version(call: VersionCall, raw: i64) -> LibVersion {
    let part = |x: i64| x.clamp(0, u32::MAX as i64) as u32;
    let (major, minor, patch) = match call {
        VersionCall::Driver => (raw / 1000, (raw % 1000) / 10, None),
        VersionCall::Nvrtc => (raw / 1000, raw % 1000, None),
        VersionCall::CublasLt => (raw / 10000, (raw / 100) % 100, Some(raw % 100)),
        // NCCL 2.9 changed the encoding from 1000 * major + 100 * minor + patch.
        VersionCall::Nccl if raw >= 10000 => (raw / 10000, (raw / 100) % 100, Some(raw % 100)),
        VersionCall::Nccl => (raw / 1000, (raw % 1000) / 100, Some(raw % 100)),
    };
    LibVersion {
        major: part(major),
        minor: part(minor),
        patch: patch.map(part),
        raw,
    }
}

/// What ficco needs of `v`, or `None` when it is supported.
pub(super) fn unsupported(spec: &LibSpec, v: &LibVersion) -> Option<String> {
    let (major, minor) = CUDA_BUILT_FOR;
    match spec.version_call {
        VersionCall::Driver if (v.major, v.minor) < (major, minor) => Some(format!(
            "a driver for CUDA {major}.{minor} or newer (the CUDA version it is built for)"
        )),
        VersionCall::CublasLt | VersionCall::Nvrtc if v.major != major => Some(format!(
            "major version {major} (it is built for CUDA {major}.{minor})"
        )),
        VersionCall::Nccl if v.major != 2 => Some("NCCL 2".to_string()),
        _ => None,
    }
}

/// What a failing version call's code means, where it is known.
pub(super) fn code_meaning(spec: &LibSpec, code: i32) -> Option<String> {
    // CUDA_ERROR_STUB_LIBRARY: the toolkit's `stubs/libcuda.so`, which exists
    // to link against, answers every call with this code.
    (spec.version_call == VersionCall::Driver && code == 34).then(|| {
        "CUDA_ERROR_STUB_LIBRARY: this is the CUDA toolkit's link stub, not the driver; \
         take its folder off LD_LIBRARY_PATH"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_cudarc_s_for_the_cuda_version_built_for() {
        // CUDA_BUILT_FOR must follow cudarc's cuda-XXXXX feature, whose major
        // version cudarc puts into the versioned file names.
        let (major, _) = CUDA_BUILT_FOR;
        let c = candidates(CUBLASLT.stems);
        assert!(c.contains(&format!("libcublasLt.so.{major}")), "{c:?}");
        assert_eq!(c[0], "libcublasLt.so");
        let unique: std::collections::BTreeSet<_> = c.iter().collect();
        assert_eq!(unique.len(), c.len(), "{c:?}");
    }

    #[test]
    fn versions_decode_as_each_library_encodes_them() {
        let d = |call, raw| decode_version(call, raw).to_string();
        assert_eq!(d(VersionCall::Driver, 13000), "13.0");
        assert_eq!(d(VersionCall::Driver, 12090), "12.9");
        assert_eq!(d(VersionCall::Driver, 13020), "13.2");
        assert_eq!(d(VersionCall::CublasLt, 130100), "13.1.0");
        assert_eq!(d(VersionCall::CublasLt, 120903), "12.9.3");
        assert_eq!(d(VersionCall::Nccl, 22803), "2.28.3");
        assert_eq!(d(VersionCall::Nccl, 2804), "2.8.4");
        assert_eq!(d(VersionCall::Nvrtc, 13000), "13.0");
        assert_eq!(d(VersionCall::Nvrtc, 12008), "12.8");
        // Nonsense from a broken library decodes without a panic.
        assert_eq!(d(VersionCall::Driver, -5), "0.0");
        assert_eq!(d(VersionCall::CublasLt, i64::MIN), "0.0.0");
    }

    #[test]
    fn supported_versions_follow_cuda_built_for() {
        let ok = |spec: &LibSpec, raw| unsupported(spec, &decode_version(spec.version_call, raw));
        assert!(ok(&CUDA, 13000).is_none());
        assert!(ok(&CUDA, 13020).is_none());
        assert!(ok(&CUDA, 14000).is_none());
        let old = ok(&CUDA, 12090).expect("a 12.9 driver is too old");
        assert!(old.contains("13.0 or newer"), "{old}");
        assert!(ok(&CUBLASLT, 130100).is_none());
        assert!(ok(&CUBLASLT, 120903).is_some());
        assert!(ok(&CUBLASLT, 140000).is_some());
        assert!(ok(&NVRTC, 13000).is_none());
        assert!(ok(&NVRTC, 12008).is_some());
        assert!(ok(&NCCL, 22803).is_none());
        assert!(ok(&NCCL, 30000).is_some());
    }

    /// Every `sys::name(` call in this crate's sources is a symbol the
    /// probe checks, so a new raw call cannot bring back cudarc's panic on
    /// a library that lacks it. (Calls through cudarc's `result` and safe
    /// API are listed in the specs by hand.)
    #[test]
    fn every_raw_call_in_the_crate_is_probed() {
        fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).expect("read src").flatten() {
                let p = e.path();
                if p.is_dir() {
                    rust_files(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut files = vec![];
        rust_files(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let known: Vec<&str> = SPECS
            .iter()
            .flat_map(|s| s.symbols.iter().copied())
            .collect();
        let mut unprobed = vec![];
        for f in &files {
            let text = std::fs::read_to_string(f).expect("read a source file");
            for (i, _) in text.match_indices("sys::") {
                let rest = &text[i + 5..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let is_call = rest[name.len()..].starts_with('(');
                let is_library_fn = ["cu", "nccl", "cublasLt", "nvrtc"].iter().any(|p| {
                    name.starts_with(p)
                        && name[p.len()..].starts_with(|c: char| c.is_ascii_uppercase())
                });
                if is_call && is_library_fn && !known.contains(&name.as_str()) {
                    unprobed.push(format!("{name} ({})", f.display()));
                }
            }
        }
        assert!(
            unprobed.is_empty(),
            "called but not in loader's LibSpec symbols: {unprobed:?}"
        );
    }
}
