//! Run-time loading of the NVIDIA libraries, checked before any call.
//!
//! cudarc loads libcuda, cuBLASLt, NCCL and NVRTC lazily and *panics* when one is
//! missing. Every entry point of this crate calls [`require`] first, which turns a
//! miss into [`CudaError::LibraryMissing`] naming the library and the file names
//! cudarc searched.
//!
//! cudarc does not try `libnccl.so.2` (only `libnccl.so` and versioned names such
//! as `.so.1`, `.so.12`). Distributions that ship only the runtime package
//! (`libnccl2`) have just `libnccl.so.2`. [`Libraries::probe`] detects that case
//! and the error then says exactly how to fix it; [`nccl_soname_shim`] is an
//! opt-in fix for binaries: it re-executes the process once with a private
//! directory holding a `libnccl.so` link on `LD_LIBRARY_PATH`.

use crate::error::{CudaError, Result};
use serde::{Deserialize, Serialize};

/// One library and whether it was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibStatus {
    /// "libcuda", "cuBLASLt", "NCCL", "NVRTC".
    pub name: String,
    pub found: bool,
    /// File names tried by cudarc's loader.
    pub searched: Vec<String>,
    /// A note, e.g. that only `libnccl.so.2` exists.
    pub note: Option<String>,
}

/// Which of the four libraries the backend needs can be loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Libraries {
    pub cuda: LibStatus,
    pub cublaslt: LibStatus,
    pub nccl: LibStatus,
    pub nvrtc: LibStatus,
}

fn candidates(names: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    // cudarc's candidate list repeats names; say each once.
    for c in names
        .iter()
        .flat_map(|n| cudarc::get_lib_name_candidates(n))
    {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

fn status(name: &str, present: bool, lib_names: &[&str]) -> LibStatus {
    LibStatus {
        name: name.to_string(),
        found: present,
        searched: candidates(lib_names),
        note: None,
    }
}

const NCCL_SONAME: &str = "libnccl.so.2";

impl Libraries {
    /// Probes all four libraries (loads and unloads each candidate; no call into them).
    pub fn probe() -> Self {
        use crate::driver;
        let (cuda, lt, nccl, nvrtc) = (
            driver::cuda_present(),
            driver::cublaslt_present(),
            driver::nccl_present(),
            driver::nvrtc_present(),
        );
        let mut nccl_status = status("NCCL", nccl, &["nccl"]);
        if !nccl && soname_loadable(NCCL_SONAME) {
            nccl_status.note = Some(format!(
                "{NCCL_SONAME} is installed but cudarc only looks for libnccl.so: install the \
                 NCCL development package, or link libnccl.so -> {NCCL_SONAME} in a directory on \
                 LD_LIBRARY_PATH (`ficco` does this itself via nccl_soname_shim)"
            ));
        }
        Libraries {
            cuda: status("libcuda", cuda, &["cuda", "nvcuda"]),
            cublaslt: status("cuBLASLt", lt, &["cublasLt"]),
            nccl: nccl_status,
            nvrtc: status("NVRTC", nvrtc, &["nvrtc"]),
        }
    }

    /// All four, in the order the backend needs them.
    pub fn all(&self) -> [&LibStatus; 4] {
        [&self.cuda, &self.cublaslt, &self.nccl, &self.nvrtc]
    }

    /// Ok when every library was found; otherwise the first missing one as an error.
    pub fn require_all(&self) -> Result<()> {
        for l in self.all() {
            if !l.found {
                return Err(missing(l));
            }
        }
        Ok(())
    }
}

fn missing(l: &LibStatus) -> CudaError {
    let lib = match l.name.as_str() {
        "libcuda" => "libcuda (the CUDA driver)",
        "cuBLASLt" => "cuBLASLt",
        "NCCL" => "NCCL",
        _ => "NVRTC",
    };
    CudaError::LibraryMissing {
        lib,
        searched: l.searched.join(", "),
        hint: match &l.note {
            Some(n) => format!("; {n}"),
            None => "; set LD_LIBRARY_PATH to the directory holding it".to_string(),
        },
    }
}

/// Checks only the driver (enough for `info` to list GPUs).
pub fn require_driver() -> Result<()> {
    let s = status(
        "libcuda",
        crate::driver::cuda_present(),
        &["cuda", "nvcuda"],
    );
    if s.found {
        Ok(())
    } else {
        Err(missing(&s))
    }
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

/// Path of a loaded shared object, read from `/proc/self/maps`.
fn loaded_path(fragment: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains(fragment))
        .map(str::to_string)
}

/// Opt-in fix for systems that have only `libnccl.so.2`: when cudarc cannot find
/// NCCL but `libnccl.so.2` loads, links `libnccl.so` to it in a private
/// directory, prepends that to `LD_LIBRARY_PATH` and re-executes the current
/// program once (the dynamic loader reads `LD_LIBRARY_PATH` only at start).
/// Returns `Ok(())` when nothing needed doing; does not return when it re-executes.
/// Call it first thing in `main`, before threads start.
pub fn nccl_soname_shim() -> Result<()> {
    const GUARD: &str = "FICCO_NCCL_SHIM";
    if crate::driver::nccl_present() || std::env::var_os(GUARD).is_some() {
        return Ok(());
    }
    // SAFETY: see soname_loadable.
    let lib = match unsafe { libloading::Library::new(NCCL_SONAME) } {
        Ok(l) => l,
        Err(_) => return Ok(()),
    };
    let Some(target) = loaded_path(NCCL_SONAME) else {
        return Ok(());
    };
    drop(lib);
    let dir = std::env::temp_dir().join(format!("ficco-nccl-{}", std::process::id()));
    let fail = |e: std::io::Error| CudaError::LibraryMissing {
        lib: "NCCL",
        searched: candidates(&["nccl"]).join(", "),
        hint: format!(
            "; could not create the libnccl.so link in {}: {e}",
            dir.display()
        ),
    };
    std::fs::create_dir_all(&dir).map_err(fail)?;
    let link = dir.join("libnccl.so");
    if !link.exists() {
        std::os::unix::fs::symlink(&target, &link).map_err(fail)?;
    }
    let mut path = dir.display().to_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(':');
        path.push_str(&old.to_string_lossy());
    }
    let exe = std::env::current_exe().map_err(fail)?;
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(GUARD, "1")
        .exec();
    Err(fail(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_lists_candidates() {
        let libs = Libraries::probe();
        for l in libs.all() {
            assert!(!l.searched.is_empty(), "{} has no candidates", l.name);
        }
        assert!(libs.nccl.searched.iter().any(|s| s == "libnccl.so"));
    }

    #[test]
    fn missing_library_is_a_typed_error() {
        let libs = Libraries::probe();
        match libs.require_all() {
            Ok(()) => {} // a CUDA machine
            Err(CudaError::LibraryMissing { searched, .. }) => assert!(!searched.is_empty()),
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}
