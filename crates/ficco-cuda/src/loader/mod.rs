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

mod shim;
mod specs;

pub use shim::nccl_soname_shim;
pub use specs::{
    candidates, decode_version, LibSpec, LibVersion, VersionCall, CUBLASLT, CUDA, CUDA_BUILT_FOR,
    NCCL, NVRTC, SPECS,
};

use crate::driver::dl::{self, Lookup};
use crate::error::{CudaError, Result};
use serde::{Deserialize, Serialize};
use shim::with_nccl_note;
use specs::{code_meaning, unsupported};
use std::sync::OnceLock;

pub use crate::error::LibProblem;

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

/// Fails `test` unless NVRTC is usable (found, complete, version 13): the
/// compile tests need it but no GPU. They are `#[ignore]`d, so a `cargo
/// test` without NVRTC lists them as ignored; `.ci/run` (NVRTC from PyPI)
/// and `bench/gpu-tests.sh` run them with `--include-ignored`.
#[cfg(test)]
pub(crate) fn require_nvrtc(test: &str) {
    let nvrtc = Libraries::probe().nvrtc;
    assert!(
        nvrtc.usable,
        "{test}: needs NVRTC, which is not usable here ({}): put libnvrtc.so.13 on \
         LD_LIBRARY_PATH (.ci/run installs it from PyPI), or leave out --include-ignored",
        nvrtc
            .problem
            .map(|p| p.to_string())
            .unwrap_or_else(|| "not found".into())
    );
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
}
