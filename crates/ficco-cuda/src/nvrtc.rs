//! The one NVRTC compile path and CUBIN cache.
//!
//! [`compile`] turns CUDA C++ source into a CUBIN for an architecture
//! (`sm_90`, or `sm_90a` for Hopper-only instructions) with extra NVRTC
//! options. [`cubin`] does the same through a cache: in memory for the
//! process, and on disk under `$XDG_CACHE_HOME/ficco/cubin` (else
//! `$HOME/.cache/ficco/cubin`), keyed by a hash of (name, source, options,
//! architecture, NVRTC version). A cache directory that cannot be written
//! leaves the cache memory-only, silently; a cache file that does not pass
//! its checks (magic, length, checksum, ELF header) is recompiled and
//! rewritten. Each call returns [`CompileStats`] (where the CUBIN came from,
//! how long it took) so callers can print compile time.

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
    let arch_opt = format!("--gpu-architecture={arch}");
    let mut all: Vec<&str> = vec![arch_opt.as_str()];
    all.extend(options.iter().copied());
    let image = driver::nvrtc::compile_to_cubin(name, src, &all)?;
    if !is_elf(&image) {
        return Err(CudaError::Plan(format!(
            "NVRTC returned something other than a CUBIN for {name}"
        )));
    }
    Ok(image)
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
    if let Some(c) = lock(mem)?.get(&key).cloned() {
        let n = c.len();
        return Ok(Cubin {
            image: c,
            stats: stats(CubinOrigin::Memory, n),
        });
    }
    let dir = cache_dir();
    let (image, origin) = match dir.as_deref().and_then(|d| disk_read(d, &key)) {
        Some(img) => (Arc::new(img), CubinOrigin::Disk),
        None => {
            let img = compile(name, src, options, arch)?;
            if let Some(d) = dir.as_deref() {
                disk_write(d, &key, &img);
            }
            (Arc::new(img), CubinOrigin::Compiled)
        }
    };
    lock(mem)?.insert(key, image.clone());
    let n = image.len();
    Ok(Cubin {
        image,
        stats: stats(origin, n),
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

/// `$XDG_CACHE_HOME/ficco/cubin`, else `$HOME/.cache/ficco/cubin`; `None`
/// when neither is set.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("ficco").join("cubin"))
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

/// Writes `image` for `key` into `dir` (write to a temporary file, then
/// rename); any failure leaves the cache as it was.
pub(crate) fn disk_write(dir: &Path, key: &CacheKey, image: &[u8]) {
    let _ = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut data = Vec::with_capacity(HEADER + image.len());
        data.extend_from_slice(MAGIC);
        data.extend_from_slice(&key.hash[0].to_le_bytes());
        data.extend_from_slice(&key.hash[1].to_le_bytes());
        data.extend_from_slice(&(image.len() as u64).to_le_bytes());
        data.extend_from_slice(&fnv(image, FNV_OFFSET).to_le_bytes());
        data.extend_from_slice(image);
        let path = dir.join(key.file_name());
        let tmp = dir.join(format!("{}.{}.tmp", key.file_name(), std::process::id()));
        std::fs::write(&tmp, &data)?;
        std::fs::rename(&tmp, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    })();
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
        disk_write(&file.join("sub"), &k, b"\x7fELF");
        assert_eq!(disk_read(&file.join("sub"), &k), None);
        let _ = std::fs::remove_file(&file);
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
