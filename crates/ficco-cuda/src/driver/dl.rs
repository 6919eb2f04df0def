//! Raw dynamic loading for the library probe: open the first candidate that
//! loads (in the order cudarc tries them, with the same `dlopen` flags, so
//! the probe sees the file cudarc will use), ask the dynamic loader where the
//! file is, look symbols up, and call the one version function of each
//! library through a pointer typed with C integers only.
//!
//! Nothing here goes through cudarc: cudarc resolves a symbol when it is
//! first called and panics when it is missing, and its return types are Rust
//! enums, which a broken or foreign library could fill with a value outside
//! the enum. The probe's calls return plain `c_int`s instead.

use std::ffi::{c_char, c_int, c_void, CStr};

/// The outcome of trying a list of candidate file names.
pub(crate) enum Lookup {
    /// The first candidate that loaded.
    Loaded(Loaded),
    /// No candidate loaded, and at least one exists but the dynamic loader
    /// refused it; the first such error, as `dlerror` words it.
    Failed(String),
    /// No candidate exists on the loader's search path.
    NotFound,
}

/// A library opened by the probe; closed again when dropped.
pub(crate) struct Loaded {
    lib: libloading::os::unix::Library,
    /// The candidate name that loaded.
    pub(crate) name: String,
    /// The file the loader mapped, links resolved; `None` where the
    /// platform cannot say.
    pub(crate) path: Option<String>,
}

/// Whether `dlerror`'s text for `candidate` only says the file is not on the
/// search path (glibc words it `NAME: cannot open shared object file: No
/// such file or directory`). Any other text, e.g. a missing dependency
/// (which names the dependency, not the candidate), a wrong ELF class or a
/// file that is not ELF, means the candidate exists but cannot be used.
fn is_absent(candidate: &str, error: &str) -> bool {
    error.starts_with(&format!("{candidate}: cannot open shared object file"))
        && error.ends_with("No such file or directory")
}

fn dlerror_text(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(s) => s.to_string(),
        None => e.to_string(),
    }
}

/// Opens the first of `candidates` that loads. Names without a `/` are
/// searched like cudarc searches them (`LD_LIBRARY_PATH`, the loader cache,
/// the default folders); names with a `/` are paths.
pub(crate) fn open_first(candidates: &[String]) -> Lookup {
    let mut failed = None;
    for c in candidates {
        // SAFETY: loading runs the library's initialisers; these are the
        // NVIDIA libraries cudarc would load under the same names and flags
        // (RTLD_LAZY | RTLD_LOCAL), or, in tests, small fakes.
        match unsafe { libloading::os::unix::Library::new(c) } {
            Ok(lib) => {
                let (lib, path) = path_of(lib);
                return Lookup::Loaded(Loaded {
                    lib,
                    name: c.clone(),
                    path,
                });
            }
            Err(e) => {
                let text = dlerror_text(&e);
                if failed.is_none() && !is_absent(c, &text) {
                    failed = Some(text);
                }
            }
        }
    }
    match failed {
        Some(e) => Lookup::Failed(e),
        None => Lookup::NotFound,
    }
}

/// The prefix of glibc's `struct link_map` (`<link.h>`): the load address,
/// then the file name. Only these two fields are read.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[repr(C)]
struct LinkMapPrefix {
    #[allow(dead_code)] // present for the layout only
    l_addr: usize,
    l_name: *const c_char,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn path_of(lib: libloading::os::unix::Library) -> (libloading::os::unix::Library, Option<String>) {
    let handle = lib.into_raw();
    let mut map: *const LinkMapPrefix = std::ptr::null();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes one
    // pointer to the loader's link_map, valid while the handle is open.
    let ok = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            &mut map as *mut *const LinkMapPrefix as *mut c_void,
        )
    } == 0;
    let path = if ok && !map.is_null() {
        // SAFETY: map points at the loader's link_map (see above), whose
        // l_name is a NUL-terminated string or null.
        let name = unsafe { (*map).l_name };
        if name.is_null() {
            None
        } else {
            // SAFETY: non-null, NUL-terminated, owned by the loader.
            let s = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            // The file itself, not the link it was found through
            // (`libcuda.so.1` → `libcuda.so.580.95.05`).
            let real = std::fs::canonicalize(&s).map(|p| p.display().to_string());
            (!s.is_empty()).then(|| real.unwrap_or(s))
        }
    } else {
        None
    };
    // SAFETY: `handle` came from `into_raw` above and is still open.
    (
        unsafe { libloading::os::unix::Library::from_raw(handle) },
        path,
    )
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn path_of(lib: libloading::os::unix::Library) -> (libloading::os::unix::Library, Option<String>) {
    (lib, None)
}

impl Loaded {
    /// Whether the library exports `symbol`.
    pub(crate) fn has(&self, symbol: &str) -> bool {
        // SAFETY: the symbol is only looked up, never called or read.
        unsafe { self.lib.get::<*const c_void>(symbol.as_bytes()).is_ok() }
    }

    /// Calls `int symbol(int *out)` (`cuDriverGetVersion`, `ncclGetVersion`):
    /// `Ok(out)` when it returns 0, else `Err(status)`. `None` when the
    /// symbol is missing.
    pub(crate) fn call_int_out(&self, symbol: &str) -> Option<Result<c_int, c_int>> {
        type F = unsafe extern "C" fn(*mut c_int) -> c_int;
        // SAFETY: both libraries declare this function with this signature.
        let f = unsafe { self.lib.get::<F>(symbol.as_bytes()) }.ok()?;
        let mut out: c_int = 0;
        // SAFETY: a valid out-pointer; the function reads no other state.
        let r = unsafe { f(&mut out) };
        Some(if r == 0 { Ok(out) } else { Err(r) })
    }

    /// Calls `int symbol(int *major, int *minor)` (`nvrtcVersion`).
    pub(crate) fn call_two_int_out(&self, symbol: &str) -> Option<Result<(c_int, c_int), c_int>> {
        type F = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
        // SAFETY: NVRTC declares nvrtcVersion with this signature.
        let f = unsafe { self.lib.get::<F>(symbol.as_bytes()) }.ok()?;
        let (mut a, mut b): (c_int, c_int) = (0, 0);
        // SAFETY: valid out-pointers.
        let r = unsafe { f(&mut a, &mut b) };
        Some(if r == 0 { Ok((a, b)) } else { Err(r) })
    }

    /// Calls `size_t symbol(void)` (`cublasLtGetVersion`).
    pub(crate) fn call_size(&self, symbol: &str) -> Option<usize> {
        type F = unsafe extern "C" fn() -> usize;
        // SAFETY: cuBLASLt declares cublasLtGetVersion with this signature.
        let f = unsafe { self.lib.get::<F>(symbol.as_bytes()) }.ok()?;
        // SAFETY: no arguments, no preconditions.
        Some(unsafe { f() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_and_refused_files_are_told_apart() {
        assert!(is_absent(
            "libcuda.so.1",
            "libcuda.so.1: cannot open shared object file: No such file or directory"
        ));
        // A missing dependency names the dependency: the candidate exists.
        assert!(!is_absent(
            "libcublasLt.so.13",
            "libcublas.so.13: cannot open shared object file: No such file or directory"
        ));
        assert!(!is_absent(
            "libcuda.so",
            "/x/libcuda.so: invalid ELF header"
        ));
    }

    #[test]
    fn nothing_loads_from_a_folder_that_does_not_exist() {
        let c = vec!["/no/such/folder/libficco-none.so".to_string()];
        match open_first(&c) {
            Lookup::NotFound => {}
            Lookup::Failed(e) => panic!("refused: {e}"),
            Lookup::Loaded(l) => panic!("loaded {}", l.name),
        }
    }
}
