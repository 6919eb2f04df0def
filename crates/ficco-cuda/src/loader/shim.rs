//! The fix for systems that have only `libnccl.so.2` (the runtime package,
//! the pip wheel): cudarc looks only for `libnccl.so` and other versioned
//! names, so ficco links `libnccl.so` to it in a private folder and
//! re-executes itself with that folder on `LD_LIBRARY_PATH`.

use super::{candidates, probed, LibProblem, LibStatus, NCCL};
use crate::driver::dl::{self, Lookup};
use crate::error::{CudaError, Result};

pub(super) const NCCL_SONAME: &str = "libnccl.so.2";

/// The NCCL note for systems that have only `libnccl.so.2`.
pub(super) fn with_nccl_note(mut nccl: LibStatus) -> LibStatus {
    if nccl.problem == Some(LibProblem::NotFound) && soname_loadable(NCCL_SONAME) {
        nccl.note = Some(format!(
            "{NCCL_SONAME} is installed but cudarc only looks for libnccl.so: install the \
             NCCL development package, or link libnccl.so -> {NCCL_SONAME} in a directory on \
             LD_LIBRARY_PATH (`ficco` does this itself via nccl_soname_shim)"
        ));
    }
    nccl
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
