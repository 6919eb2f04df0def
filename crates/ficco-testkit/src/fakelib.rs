//! Fake NVIDIA libraries for the probe tests: tiny shared objects, compiled
//! with the system C compiler, that export some or all of the functions
//! ficco calls ([`ficco_cuda::loader::LibSpec::symbols`]) with bodies the test
//! chooses. Used in-process (`tests/libs_probe.rs`, opened by path) and by
//! the CLI tests (`tests/cli_broken_libs.rs` at the root, found through
//! `LD_LIBRARY_PATH`).
//!
//! Every default body fails without touching memory, except the version
//! functions (a supported version), `cuInit` (`CUDA_ERROR_NO_DEVICE`, so a
//! complete fake driver never gets further than "no GPU") and
//! `cuDeviceGetCount` (0). Return values are valid codes of each library's
//! result enum.

use ficco_cuda::loader::LibSpec;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A C compiler that works here (`$CC`, `cc` or `gcc`); fails `test`
/// without one. These tests need no GPU, so they are not ignored: a machine
/// that builds Rust has `cc` (Rust's linker) almost always, CI has gcc, and
/// a test that cannot build its fakes must not count as passed.
pub fn compiler_for(test: &str) -> String {
    compiler().unwrap_or_else(|| {
        panic!(
            "{test}: no C compiler (cc, gcc or $CC) to build fake libraries: install one \
             (e.g. gcc), or leave this test out with --skip"
        )
    })
}

/// A C compiler that works here (`$CC`, `cc` or `gcc`), or `None`.
pub fn compiler() -> Option<String> {
    let mut tried = vec![];
    if let Ok(cc) = std::env::var("CC") {
        tried.push(cc);
    }
    tried.push("cc".into());
    tried.push("gcc".into());
    tried.into_iter().find(|cc| {
        Command::new(cc)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The default definition of `symbol`.
fn default_body(symbol: &str) -> String {
    match symbol {
        "cuInit" => "int cuInit(unsigned flags) { (void)flags; return 100; }".into(),
        "cuDriverGetVersion" => "int cuDriverGetVersion(int *v) { *v = 13000; return 0; }".into(),
        "cuDeviceGetCount" => "int cuDeviceGetCount(int *n) { *n = 0; return 0; }".into(),
        "cublasLtGetVersion" => "unsigned long cublasLtGetVersion(void) { return 130100; }".into(),
        "ncclGetVersion" => "int ncclGetVersion(int *v) { *v = 22803; return 0; }".into(),
        "nvrtcVersion" => "int nvrtcVersion(int *a, int *b) { *a = 13; *b = 0; return 0; }".into(),
        s => format!("int {s}(void) {{ return 1; }}"),
    }
}

/// C source of a fake `spec` library: every symbol but `omit`, with the
/// definitions in `bodies` (a whole C definition each, keyed by symbol)
/// instead of the defaults.
pub fn source(spec: &LibSpec, omit: &[&str], bodies: &[(&str, &str)]) -> String {
    let mut c = String::from("/* a fake for ficco's library probe tests */\n");
    for s in spec.symbols.iter().filter(|s| !omit.contains(s)) {
        match bodies.iter().find(|(k, _)| k == s) {
            Some((_, body)) => c.push_str(body),
            None => c.push_str(&default_body(s)),
        }
        c.push('\n');
    }
    c
}

/// Compiles `c_source` into `dir/file` as a shared object, with `extra`
/// compiler arguments (e.g. `-L`, `-l`); panics with the compiler's output
/// when it fails.
pub fn build(cc: &str, dir: &Path, file: &str, c_source: &str, extra: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create the fake library folder");
    let src = dir.join(format!("{file}.c"));
    std::fs::write(&src, c_source).expect("write the C source");
    let out = dir.join(file);
    let o = Command::new(cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .output()
        .expect("run the C compiler");
    assert!(
        o.status.success(),
        "{cc} failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A fake `spec` library in `dir/file` (see [`source`]).
pub fn fake(
    cc: &str,
    dir: &Path,
    file: &str,
    spec: &LibSpec,
    omit: &[&str],
    bodies: &[(&str, &str)],
) -> PathBuf {
    build(cc, dir, file, &source(spec, omit, bodies), &[])
}

/// A fresh folder for one test's fakes under the system temp folder,
/// removed when the test passes (kept, to look at, when it fails).
pub fn folder(test: &str) -> Folder {
    let dir = std::env::temp_dir().join(format!("ficco-fakelib-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the fake library folder");
    Folder(dir)
}

/// See [`folder`].
pub struct Folder(PathBuf);

impl std::ops::Deref for Folder {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
