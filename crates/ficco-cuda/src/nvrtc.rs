//! The one NVRTC compile path and CUBIN cache: every kernel of ficco (the
//! utility kernels, the controls' probes, the Hopper GEMM) compiles here,
//! so there is one cache format, one key and one place on disk.
//!
//! [`compile`] turns CUDA C++ source into a CUBIN for an architecture
//! (`sm_90`, or `sm_90a` for Hopper-only instructions) with extra NVRTC
//! options; [`compile_with_log`] also returns NVRTC's log (ptxas' report).
//! [`cubin`] does the same through a cache: in memory for the process, and
//! on disk in [`cache_dir`] (`$FICCO_CUBIN_CACHE`, else
//! `$XDG_CACHE_HOME/ficco/cubin`, else `$HOME/.cache/ficco/cubin`), keyed by
//! a hash of (name, source, options, architecture, NVRTC version). Other
//! compile-derived caches (the Hopper GEMM's tuned schedules) live in the
//! same directory and write their files with [`write_atomic`]. A cache
//! directory that cannot be written leaves the cache memory-only, silently;
//! a cache file that does not pass its checks (magic, length, checksum, ELF
//! header) is recompiled and rewritten. Each call returns [`CompileStats`]
//! (where the CUBIN came from, how long it took) so callers can print
//! compile time.

use crate::driver;
use crate::error::{CudaError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Options every ficco kernel is compiled with (besides the architecture).
pub(crate) const DEFAULT_OPTIONS: &[&str] = &["-std=c++17"];

/// Where a CUBIN came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CubinOrigin {
    /// This process had it already.
    Memory,
    /// Read from the on-disk cache.
    Disk,
    /// Compiled by NVRTC now.
    Compiled,
}

/// What getting one CUBIN cost.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CompileStats {
    pub name: &'static str,
    pub arch: String,
    pub origin: CubinOrigin,
    /// Wall time of the lookup and, when compiled, of NVRTC.
    pub ms: f64,
    pub bytes: usize,
}

impl std::fmt::Display for CompileStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.origin {
            CubinOrigin::Memory => "in memory",
            CubinOrigin::Disk => "from the disk cache",
            CubinOrigin::Compiled => "compiled",
        };
        write!(
            f,
            "{} for {}: {} B {how} in {:.1} ms",
            self.name, self.arch, self.bytes, self.ms
        )
    }
}

/// A CUBIN and what getting it cost.
#[derive(Debug, Clone)]
pub(crate) struct Cubin {
    pub image: Arc<Vec<u8>>,
    pub stats: CompileStats,
    /// The cache file it was read from or written to; `None` when the disk
    /// cache is not used (no directory, or it cannot be written).
    pub path: Option<PathBuf>,
    /// The NVRTC version of the cache key ((0, 0) where NVRTC cannot say).
    pub nvrtc: (i32, i32),
}

/// The architecture name of a compute capability, e.g. (9, 0) -> "sm_90".
pub(crate) fn arch_of(cc: (i32, i32)) -> String {
    format!("sm_{}{}", cc.0, cc.1)
}

/// Compiles `src` for `arch` (e.g. "sm_90a") with `options`, uncached.
pub(crate) fn compile(
    name: &'static str,
    src: &str,
    options: &[&str],
    arch: &str,
) -> Result<Vec<u8>> {
    compile_with_log(name, src, options, arch).map(|(image, _)| image)
}

/// [`compile`], also returning NVRTC's log (with `--ptxas-options=-v`,
/// ptxas' register and spill report). NVRTC 12.9+ caches compiles itself:
/// a repeated compile may come back with an empty log unless
/// `CUDA_CACHE_DISABLE=1` is set in the environment.
pub(crate) fn compile_with_log(
    name: &'static str,
    src: &str,
    options: &[&str],
    arch: &str,
) -> Result<(Vec<u8>, String)> {
    let arch_opt = format!("--gpu-architecture={arch}");
    let mut all: Vec<&str> = vec![arch_opt.as_str()];
    all.extend(options.iter().copied());
    let (image, log) = driver::nvrtc::compile_to_cubin(name, src, &all)?;
    if !is_elf(&image) {
        return Err(CudaError::Plan(format!(
            "NVRTC returned something other than a CUBIN for {name}"
        )));
    }
    Ok((image, log))
}

/// [`compile`] through the memory and disk caches.
pub(crate) fn cubin(name: &'static str, src: &str, options: &[&str], arch: &str) -> Result<Cubin> {
    let t0 = Instant::now();
    let version = driver::nvrtc::version().unwrap_or((0, 0));
    let key = CacheKey::new(name, src, options, arch, version);
    let stats = |origin, bytes| CompileStats {
        name,
        arch: arch.to_string(),
        origin,
        ms: t0.elapsed().as_secs_f64() * 1e3,
        bytes,
    };
    let mem = memory_cache();
    let dir = cache_dir();
    if let Some(c) = lock(mem)?.get(&key).cloned() {
        let n = c.len();
        // The file this process read or wrote, if it is still there.
        let path = dir
            .as_deref()
            .map(|d| d.join(key.file_name()))
            .filter(|p| p.is_file());
        return Ok(Cubin {
            image: c,
            stats: stats(CubinOrigin::Memory, n),
            path,
            nvrtc: version,
        });
    }
    let (image, origin, path) = match dir.as_deref().and_then(|d| disk_read(d, &key)) {
        Some(img) => (
            Arc::new(img),
            CubinOrigin::Disk,
            dir.as_deref().map(|d| d.join(key.file_name())),
        ),
        None => {
            let img = compile(name, src, options, arch)?;
            let path = dir
                .as_deref()
                .filter(|d| disk_write(d, &key, &img))
                .map(|d| d.join(key.file_name()));
            (Arc::new(img), CubinOrigin::Compiled, path)
        }
    };
    lock(mem)?.insert(key, image.clone());
    let n = image.len();
    Ok(Cubin {
        image,
        stats: stats(origin, n),
        path,
        nvrtc: version,
    })
}

type MemoryCache = Mutex<HashMap<CacheKey, Arc<Vec<u8>>>>;

fn memory_cache() -> &'static MemoryCache {
    static C: OnceLock<MemoryCache> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock(c: &MemoryCache) -> Result<std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<Vec<u8>>>>> {
    c.lock()
        .map_err(|_| CudaError::Plan("cubin cache poisoned".into()))
}

/// 128-bit content hash of everything a CUBIN depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    name_tag: u64,
    hash: [u64; 2],
}

impl CacheKey {
    pub(crate) fn new(
        name: &str,
        src: &str,
        options: &[&str],
        arch: &str,
        nvrtc: (i32, i32),
    ) -> Self {
        let mut h = Fnv2::new();
        h.field(name.as_bytes());
        h.field(src.as_bytes());
        h.field(&(options.len() as u64).to_le_bytes());
        for o in options {
            h.field(o.as_bytes());
        }
        h.field(arch.as_bytes());
        h.field(&nvrtc.0.to_le_bytes());
        h.field(&nvrtc.1.to_le_bytes());
        CacheKey {
            name_tag: fnv(name.as_bytes(), FNV_OFFSET),
            hash: h.finish(),
        }
    }

    fn file_name(&self) -> String {
        format!(
            "{:08x}-{:016x}{:016x}.cubin",
            self.name_tag as u32, self.hash[0], self.hash[1]
        )
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_OFFSET_2: u64 = 0x6c62_272e_07bb_0142;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Two FNV-1a streams with different offsets; each field is length-prefixed.
struct Fnv2([u64; 2]);

impl Fnv2 {
    fn new() -> Self {
        Fnv2([FNV_OFFSET, FNV_OFFSET_2])
    }

    fn field(&mut self, bytes: &[u8]) {
        let len = (bytes.len() as u64).to_le_bytes();
        for h in &mut self.0 {
            *h = fnv(bytes, fnv(&len, *h));
        }
    }

    fn finish(&self) -> [u64; 2] {
        self.0
    }
}

fn is_elf(image: &[u8]) -> bool {
    image.starts_with(b"\x7fELF")
}

/// The one directory of compile caches (CUBINs, the Hopper GEMM's tuned
/// schedules): `$FICCO_CUBIN_CACHE` as given, else
/// `$XDG_CACHE_HOME/ficco/cubin`, else `$HOME/.cache/ficco/cubin`; `None`
/// when none is set. Empty variables count as unset. `FICCO_CUBIN_CACHE` is
/// read with ficco's other settings ([`ficco_core::settings`]).
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let over = ficco_core::settings::Settings::current()
        .cubin_cache
        .clone();
    cache_dir_from(over, |k| std::env::var_os(k))
}

/// [`cache_dir`] with the override and the environment given (testable
/// without changing the process environment, which tests share).
fn cache_dir_from(
    over: Option<PathBuf>,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    over.or_else(|| ficco_core::settings::user_cache_dir_from(env).map(|d| d.join("cubin")))
}

const MAGIC: &[u8; 8] = b"FICCOCB1";
/// Magic, key (16 bytes), image length, image checksum.
const HEADER: usize = 8 + 16 + 8 + 8;

/// The cached CUBIN of `key` in `dir`, when present and intact.
pub(crate) fn disk_read(dir: &Path, key: &CacheKey) -> Option<Vec<u8>> {
    let data = std::fs::read(dir.join(key.file_name())).ok()?;
    if data.len() < HEADER || &data[..8] != MAGIC {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap_or([0; 8]));
    if [word(8), word(16)] != key.hash {
        return None;
    }
    let (len, sum) = (word(24) as usize, word(32));
    let image = &data[HEADER..];
    if image.len() != len || fnv(image, FNV_OFFSET) != sum || !is_elf(image) {
        return None;
    }
    Some(image.to_vec())
}

/// Writes `image` for `key` into `dir` ([`write_atomic`]); false (the cache
/// as it was) when it cannot.
pub(crate) fn disk_write(dir: &Path, key: &CacheKey, image: &[u8]) -> bool {
    let mut data = Vec::with_capacity(HEADER + image.len());
    data.extend_from_slice(MAGIC);
    data.extend_from_slice(&key.hash[0].to_le_bytes());
    data.extend_from_slice(&key.hash[1].to_le_bytes());
    data.extend_from_slice(&(image.len() as u64).to_le_bytes());
    data.extend_from_slice(&fnv(image, FNV_OFFSET).to_le_bytes());
    data.extend_from_slice(image);
    write_atomic(&dir.join(key.file_name()), &data)
}

/// Writes `bytes` to `path`, creating its directory: into a temporary file
/// beside it, then renamed, so that a reader (another process sharing the
/// cache) never sees half a file. False when it cannot; nothing is left behind.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> bool {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return false;
    };
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, bytes))
        .and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(src: &str, opts: &[&str], arch: &str) -> CacheKey {
        CacheKey::new("k", src, opts, arch, (13, 0))
    }

    #[test]
    fn keys_differ_in_every_input() {
        let base = key("a", &["-std=c++17"], "sm_90");
        assert_eq!(base, key("a", &["-std=c++17"], "sm_90"));
        assert_ne!(base, key("b", &["-std=c++17"], "sm_90"));
        assert_ne!(base, key("a", &["-std=c++20"], "sm_90"));
        assert_ne!(base, key("a", &["-std=c++17"], "sm_90a"));
        assert_ne!(
            base,
            CacheKey::new("k", "a", &["-std=c++17"], "sm_90", (12, 8))
        );
        assert_ne!(
            base,
            CacheKey::new("j", "a", &["-std=c++17"], "sm_90", (13, 0))
        );
        // Field boundaries count: ["ab"] is not ["a", "b"].
        assert_ne!(key("x", &["ab"], "sm_90"), key("x", &["a", "b"], "sm_90"));
        assert_eq!(base.file_name().len(), 8 + 1 + 32 + 6);
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ficco-cubin-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn disk_cache_round_trips_and_rejects_corruption() {
        let dir = scratch("rt");
        let k = key("src", &[], "sm_90");
        let image = b"\x7fELF fake cubin".to_vec();
        assert_eq!(disk_read(&dir, &k), None);
        disk_write(&dir, &k, &image);
        assert_eq!(disk_read(&dir, &k), Some(image.clone()));
        // Another key does not read this entry.
        assert_eq!(disk_read(&dir, &key("src2", &[], "sm_90")), None);
        // A flipped byte in the image, a truncated file, a bad magic: all misses.
        let path = dir.join(k.file_name());
        let good = std::fs::read(&path).unwrap();
        for bad in [
            {
                let mut b = good.clone();
                *b.last_mut().unwrap() ^= 1;
                b
            },
            good[..good.len() - 3].to_vec(),
            {
                let mut b = good.clone();
                b[0] = b'X';
                b
            },
            vec![],
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(disk_read(&dir, &k), None);
        }
        // Rewriting repairs it.
        disk_write(&dir, &k, &image);
        assert_eq!(disk_read(&dir, &k), Some(image));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unwritable_cache_dir_is_ignored() {
        let file = scratch("file");
        std::fs::write(&file, b"not a directory").unwrap();
        let k = key("s", &[], "sm_90");
        assert!(!disk_write(&file.join("sub"), &k, b"\x7fELF"));
        assert_eq!(disk_read(&file.join("sub"), &k), None);
        assert!(!write_atomic(&file.join("sub").join("t.txt"), b"x"));
        let _ = std::fs::remove_file(&file);
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary() {
        let dir = scratch("atomic");
        let path = dir.join("deeper").join("hgemm-tune-x.txt");
        assert!(write_atomic(&path, b"256 1 0\n"));
        assert!(write_atomic(&path, b"128 2 1\n"));
        assert_eq!(std::fs::read(&path).unwrap(), b"128 2 1\n");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["hgemm-tune-x.txt"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `$FICCO_CUBIN_CACHE` overrides the directory as given; then
    /// `$XDG_CACHE_HOME`, then `$HOME`; empty values count as unset.
    #[test]
    fn cache_dir_honours_the_override_then_xdg_then_home() {
        fn env<'a>(
            vars: &'a [(&'a str, &'a str)],
        ) -> impl Fn(&str) -> Option<std::ffi::OsString> + 'a {
            move |k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        }
        let all = [("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        let over = Some(PathBuf::from("/c"));
        assert_eq!(cache_dir_from(over, env(&all)), Some(PathBuf::from("/c")));
        assert_eq!(
            cache_dir_from(None, env(&all)),
            Some(PathBuf::from("/x/ficco/cubin"))
        );
        assert_eq!(
            cache_dir_from(None, env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/ficco/cubin"))
        );
        assert_eq!(cache_dir_from(None, env(&[])), None);
    }

    /// Compiles a kernel for plain and arch-specific Hopper (needs NVRTC, no
    /// GPU), with an extra option.
    #[test]
    #[ignore = "needs NVRTC (.ci/run and bench/gpu-tests.sh run it: --include-ignored)"]
    fn compiles_for_sm90_and_sm90a() {
        crate::loader::require_nvrtc("compiles_for_sm90_and_sm90a");
        let src = r#"extern "C" __global__ void k(int* p) { p[threadIdx.x] = 1; }"#;
        for arch in ["sm_90", "sm_90a"] {
            let c = compile("k", src, &["-std=c++17", "-lineinfo"], arch).expect("compile");
            assert!(is_elf(&c));
        }
        let bad = compile("bad", "this is not C++", DEFAULT_OPTIONS, "sm_90");
        assert!(matches!(bad, Err(CudaError::Nvrtc { .. })), "{bad:?}");
    }
}
