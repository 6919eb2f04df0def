//! Run-time loading of the NVIDIA libraries, checked before any call.
//!
//! cudarc loads libcuda, cuBLASLt, NCCL and NVRTC lazily, resolves each
//! function on its first call, and *panics* when the library or the function
//! is missing. Every entry point of this crate calls [`require`] (or
//! [`require_driver`]) first. That probe opens each library under the names
//! cudarc tries, in cudarc's order (so it sees the file cudarc will use),
//! and checks that
//!
//! - the file loads (else [`LibProblem::LoadFailed`] with the loader's words),
//! - it exports every function ficco calls ([`LibSpec::symbols`]; else
//!   [`LibProblem::MissingSymbols`]),
//! - its version function answers and the version is one ficco's bindings
//!   are for ([`CUDA_BUILT_FOR`]; else [`LibProblem::VersionUnreadable`] or
//!   [`LibProblem::WrongVersion`]),
//!
//! and turns a miss into [`CudaError::LibraryMissing`] or
//! [`CudaError::LibraryUnusable`] naming the library, the file and the
//! reason. Libraries are found the way the dynamic loader finds them:
//! `LD_LIBRARY_PATH`, then the loader cache and the default folders.
//!
//! cudarc does not try `libnccl.so.2` (only `libnccl.so` and versioned names such
//! as `.so.1`, `.so.12`). Distributions that ship only the runtime package
//! (`libnccl2`) have just `libnccl.so.2`. [`Libraries::probe`] detects that case
//! and the error then says exactly how to fix it; [`nccl_soname_shim`] is an
//! opt-in fix for binaries: it re-executes the process once with a private
//! directory holding a `libnccl.so` link on `LD_LIBRARY_PATH`.

use crate::driver::dl::{self, Lookup};
use crate::error::{CudaError, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::OnceLock;

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
        "cuStreamWaitEvent",
        "cuStreamWriteValue32_v2",
        "cuStreamWaitValue32_v2",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventQuery",
        "cuEventSynchronize",
        "cuEventElapsedTime_v2",
        "cuEventDestroy_v2",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
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
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
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

/// Why a library cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LibProblem {
    /// No candidate file is on the loader's search path.
    NotFound,
    /// A candidate exists but the dynamic loader refused it (a missing
    /// dependency, a wrong ELF class, not a shared object): `dlerror`'s text.
    LoadFailed { error: String },
    /// The file loaded but lacks functions ficco calls: `missing` (in
    /// [`LibSpec::symbols`] order) of the `needed`.
    MissingSymbols {
        path: String,
        missing: Vec<String>,
        needed: usize,
    },
    /// The version function failed: `call` returned `code` (`meaning`, when known).
    VersionUnreadable {
        path: String,
        call: String,
        code: i32,
        meaning: Option<String>,
    },
    /// The version is not one ficco's bindings support.
    WrongVersion {
        path: String,
        found: String,
        needs: String,
    },
}

impl fmt::Display for LibProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LibProblem::NotFound => write!(f, "not found"),
            LibProblem::LoadFailed { error } => write!(f, "cannot be loaded: {error}"),
            LibProblem::MissingSymbols {
                path,
                missing,
                needed,
            } => {
                let first = missing.first().map(String::as_str).unwrap_or("?");
                write!(f, "{path} has no symbol {first}")?;
                if missing.len() > 1 {
                    write!(
                        f,
                        ", nor {} more of the {needed} functions ficco calls",
                        missing.len() - 1
                    )?;
                }
                Ok(())
            }
            LibProblem::VersionUnreadable {
                path,
                call,
                code,
                meaning,
            } => {
                write!(f, "{path}: {call} failed with code {code}")?;
                if let Some(m) = meaning {
                    write!(f, " ({m})")?;
                }
                Ok(())
            }
            LibProblem::WrongVersion { path, found, needs } => {
                write!(f, "{path} is version {found}; ficco needs {needs}")
            }
        }
    }
}

/// One library: whether it was found, where, its version, and whether
/// ficco can use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibStatus {
    /// "libcuda", "cuBLASLt", "NCCL", "NVRTC".
    pub name: String,
    /// A file loaded (it may still be unusable).
    pub found: bool,
    /// Found, with every function ficco calls, and of a supported version.
    pub usable: bool,
    /// The file loaded, as the dynamic loader recorded it.
    pub path: Option<String>,
    pub version: Option<LibVersion>,
    /// Why it cannot be used; `None` when usable.
    pub problem: Option<LibProblem>,
    /// File names tried, in cudarc's order.
    pub searched: Vec<String>,
    /// A note, e.g. that only `libnccl.so.2` exists.
    pub note: Option<String>,
}

/// Which of the four libraries the backend needs can be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Libraries {
    pub cuda: LibStatus,
    pub cublaslt: LibStatus,
    pub nccl: LibStatus,
    pub nvrtc: LibStatus,
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

/// Reads the version through the library's version function: `None` when
/// the function is missing, `Err(code)` when it fails.
fn read_version(spec: &LibSpec, lib: &dl::Loaded) -> Option<std::result::Result<LibVersion, i32>> {
    let sym = spec.version_symbol;
    let raw: std::result::Result<i64, i32> = match spec.version_call {
        VersionCall::Driver | VersionCall::Nccl => lib.call_int_out(sym)?.map(i64::from),
        VersionCall::CublasLt => Ok(lib.call_size(sym)? as i64),
        VersionCall::Nvrtc => lib
            .call_two_int_out(sym)?
            .map(|(a, b)| i64::from(a) * 1000 + i64::from(b)),
    };
    Some(raw.map(|r| decode_version(spec.version_call, r)))
}

/// What ficco needs of `v`, or `None` when it is supported.
fn unsupported(spec: &LibSpec, v: &LibVersion) -> Option<String> {
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
fn code_meaning(spec: &LibSpec, code: i32) -> Option<String> {
    // CUDA_ERROR_STUB_LIBRARY: the toolkit's `stubs/libcuda.so`, which exists
    // to link against, answers every call with this code.
    (spec.version_call == VersionCall::Driver && code == 34).then(|| {
        "CUDA_ERROR_STUB_LIBRARY: this is the CUDA toolkit's link stub, not the driver; \
         take its folder off LD_LIBRARY_PATH"
            .to_string()
    })
}

/// Probes one library: the first of `candidates` that loads (names are
/// searched like cudarc searches them, paths are opened as they are), its
/// symbols and its version. Never panics, whatever the files are. The file
/// is closed again.
pub fn probe_library(spec: &LibSpec, candidates: Vec<String>) -> LibStatus {
    probe_open(spec, candidates).0
}

/// [`probe_library`], also returning the library still open (when it loaded).
fn probe_open(spec: &LibSpec, candidates: Vec<String>) -> (LibStatus, Option<dl::Loaded>) {
    let mut status = LibStatus {
        name: spec.name.to_string(),
        found: false,
        usable: false,
        path: None,
        version: None,
        problem: None,
        searched: candidates,
        note: None,
    };
    let lib = match dl::open_first(&status.searched) {
        Lookup::NotFound => {
            status.problem = Some(LibProblem::NotFound);
            return (status, None);
        }
        Lookup::Failed(error) => {
            status.problem = Some(LibProblem::LoadFailed { error });
            return (status, None);
        }
        Lookup::Loaded(lib) => lib,
    };
    status.found = true;
    let path = lib.path.clone().unwrap_or_else(|| lib.name.clone());
    status.path = Some(path.clone());
    let missing: Vec<String> = spec
        .symbols
        .iter()
        .filter(|s| !lib.has(s))
        .map(|s| s.to_string())
        .collect();
    if !missing.is_empty() {
        status.problem = Some(LibProblem::MissingSymbols {
            path,
            missing,
            needed: spec.symbols.len(),
        });
        return (status, Some(lib));
    }
    status.problem = match read_version(spec, &lib) {
        // The symbol was checked above; a race with the file changing.
        None => Some(LibProblem::MissingSymbols {
            path,
            missing: vec![spec.version_symbol.to_string()],
            needed: spec.symbols.len(),
        }),
        Some(Err(code)) => Some(LibProblem::VersionUnreadable {
            path,
            call: spec.version_symbol.to_string(),
            code,
            meaning: code_meaning(spec, code),
        }),
        Some(Ok(v)) => {
            let problem = unsupported(spec, &v).map(|needs| LibProblem::WrongVersion {
                path,
                found: v.to_string(),
                needs,
            });
            status.version = Some(v);
            problem
        }
    };
    status.usable = status.problem.is_none();
    (status, Some(lib))
}

const NCCL_SONAME: &str = "libnccl.so.2";

/// The NCCL note for systems that have only `libnccl.so.2`.
fn with_nccl_note(mut nccl: LibStatus) -> LibStatus {
    if nccl.problem == Some(LibProblem::NotFound) && soname_loadable(NCCL_SONAME) {
        nccl.note = Some(format!(
            "{NCCL_SONAME} is installed but cudarc only looks for libnccl.so: install the \
             NCCL development package, or link libnccl.so -> {NCCL_SONAME} in a directory on \
             LD_LIBRARY_PATH (`ficco` does this itself via nccl_soname_shim)"
        ));
    }
    nccl
}

/// `spec` probed under cudarc's file names, once per process: the loader's
/// search path does not change while it runs, and a command that needs
/// only the driver (or, at start, only NCCL) loads only that library.
fn probed(spec: &'static LibSpec) -> LibStatus {
    static PROBED: [OnceLock<LibStatus>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let probe = || {
        let (status, lib) = probe_open(spec, candidates(spec.stems));
        // Kept loaded for the life of the process: cudarc loads the same
        // file next, and unloading a library after calling into it (its
        // version function) is a path its authors do not test.
        std::mem::forget(lib);
        if std::ptr::eq(spec, &NCCL) {
            with_nccl_note(status)
        } else {
            status
        }
    };
    match SPECS
        .iter()
        .zip(&PROBED)
        .find(|(s, _)| std::ptr::eq(**s, spec))
    {
        Some((_, cell)) => cell.get_or_init(probe).clone(),
        None => probe(),
    }
}

impl Libraries {
    /// Probes all four libraries under cudarc's file names (each once per
    /// process).
    pub fn probe() -> Self {
        Libraries {
            cuda: probed(&CUDA),
            cublaslt: probed(&CUBLASLT),
            nccl: probed(&NCCL),
            nvrtc: probed(&NVRTC),
        }
    }

    /// Probes all four with the candidate names (or paths) `candidates` gives
    /// for each library; not cached.
    pub fn probe_with(candidates: impl Fn(&LibSpec) -> Vec<String>) -> Self {
        let probe = |spec: &LibSpec| probe_library(spec, candidates(spec));
        Libraries {
            cuda: probe(&CUDA),
            cublaslt: probe(&CUBLASLT),
            nccl: with_nccl_note(probe(&NCCL)),
            nvrtc: probe(&NVRTC),
        }
    }

    /// All four, in the order the backend needs them.
    pub fn all(&self) -> [&LibStatus; 4] {
        [&self.cuda, &self.cublaslt, &self.nccl, &self.nvrtc]
    }

    /// Ok when every library is usable; otherwise the first that is not, as
    /// an error.
    pub fn require_all(&self) -> Result<()> {
        for (l, spec) in self.all().into_iter().zip(SPECS) {
            l.require(spec)?;
        }
        Ok(())
    }
}

impl LibStatus {
    /// Ok when usable, else the typed reason.
    fn require(&self, spec: &LibSpec) -> Result<()> {
        match &self.problem {
            None => Ok(()),
            Some(LibProblem::NotFound) => Err(CudaError::LibraryMissing {
                lib: spec.label,
                searched: self.searched.clone(),
                hint: match &self.note {
                    Some(n) => format!("; {n}"),
                    None => "; add the folder that holds it to LD_LIBRARY_PATH".to_string(),
                },
            }),
            Some(p) => Err(CudaError::LibraryUnusable {
                lib: spec.label,
                problem: p.clone(),
            }),
        }
    }
}

/// Checks only the driver (enough for `info` to list GPUs).
pub fn require_driver() -> Result<()> {
    probed(&CUDA).require(&CUDA)
}

/// Checks all four libraries; call before any cudarc call.
pub fn require() -> Result<Libraries> {
    let libs = Libraries::probe();
    libs.require_all()?;
    Ok(libs)
}

fn soname_loadable(name: &str) -> bool {
    // SAFETY: loading NCCL runs no user-visible initialisers beyond its own.
    unsafe { libloading::Library::new(name).is_ok() }
}

/// The private folder for the `libnccl.so` link to `target`: one per user
/// and target, reused by every run (so runs do not leave folders behind),
/// created `0700` and refused unless it is a folder of this user that no
/// one else can write (the shared temp folder is everyone's).
fn shim_folder(target: &str) -> std::io::Result<std::path::PathBuf> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    target.hash(&mut h);
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir().join(format!("ficco-nccl-{uid}-{:016x}", h.finish()));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let m = std::fs::symlink_metadata(&dir)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "it exists but is not a private folder of this user",
        ));
    }
    Ok(dir)
}

/// Opt-in fix for systems that have only `libnccl.so.2`: when cudarc cannot find
/// NCCL but `libnccl.so.2` loads, links `libnccl.so` to it in a private
/// directory, prepends that to `LD_LIBRARY_PATH` and re-executes the current
/// program once (the dynamic loader reads `LD_LIBRARY_PATH` only at start).
/// Returns `Ok(())` when nothing needed doing; does not return when it re-executes.
/// Call it first thing in `main`, before threads start.
pub fn nccl_soname_shim() -> Result<()> {
    const GUARD: &str = "FICCO_NCCL_SHIM";
    if std::env::var_os(GUARD).is_some() || probed(&NCCL).found {
        return Ok(());
    }
    let target = match dl::open_first(&[NCCL_SONAME.to_string()]) {
        Lookup::Loaded(lib) => match &lib.path {
            Some(p) => p.clone(),
            None => return Ok(()),
        },
        Lookup::Failed(_) | Lookup::NotFound => return Ok(()),
    };
    let fail = |what: String, e: std::io::Error| CudaError::LibraryMissing {
        lib: "NCCL",
        searched: candidates(NCCL.stems),
        hint: format!("; only {target} is there, and ficco {what}: {e}"),
    };
    let temp = std::env::temp_dir().display().to_string();
    let dir = shim_folder(&target)
        .map_err(|e| fail(format!("could not make a private folder in {temp}"), e))?;
    let link = dir.join("libnccl.so");
    let link_failed = |e| fail(format!("could not make the link {}", link.display()), e);
    if std::fs::read_link(&link).ok() != Some(std::path::PathBuf::from(&target)) {
        // Made under a name of its own and renamed into place, so that runs
        // starting together never see a half-made link.
        let tmp = dir.join(format!("libnccl.so.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).map_err(link_failed)?;
        std::fs::rename(&tmp, &link).map_err(link_failed)?;
    }
    let mut path = dir.display().to_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(':');
        path.push_str(&old.to_string_lossy());
    }
    let exec_failed = |e| fail("could not re-execute itself with the link".into(), e);
    let exe = std::env::current_exe().map_err(exec_failed)?;
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(GUARD, "1")
        .exec();
    Err(exec_failed(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_lists_candidates() {
        let libs = Libraries::probe();
        for l in libs.all() {
            assert!(!l.searched.is_empty(), "{} has no candidates", l.name);
            assert_eq!(l.usable, l.problem.is_none(), "{l:?}");
            assert_eq!(l.found, l.path.is_some(), "{l:?}");
        }
        assert!(libs.nccl.searched.iter().any(|s| s == "libnccl.so"));
        // Cached: the same answer twice.
        assert_eq!(Libraries::probe(), libs);
    }

    #[test]
    fn missing_library_is_a_typed_error() {
        let libs = Libraries::probe();
        match libs.require_all() {
            Ok(()) => {} // a CUDA machine
            Err(CudaError::LibraryMissing { searched, .. }) => assert!(!searched.is_empty()),
            Err(e @ CudaError::LibraryUnusable { .. }) => {
                assert!(e.to_string().contains(" unusable: "), "{e}")
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }

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
