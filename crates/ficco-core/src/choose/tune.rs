//! The autotuning cache: the measured winner per (op, m, k, n, gpus) on one
//! device with one set of software versions (`ficco tune` writes it,
//! `ficco select` reads it first).
//!
//! The file is JSON: `{"version": 1, "entries": [{"key": {...}, "schedule":
//! "...", "time_ms": ..., "measured": [["name", ms], ...]}]}`. An entry is
//! used only when its whole key matches, device and software versions
//! included; a stale entry (other device or versions) or a file that does not
//! parse is reported as one warning line and ignored, never trusted.

use crate::problem::workload::Problem;
use crate::space::Schedule;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Format version of the cache file.
pub const CACHE_VERSION: u32 = 1;

/// Where an entry applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuneKey {
    /// The problem, as its own keys (`op`, `m`, `k`, `n`, `gpus`; `side`
    /// only for `concurrent`), so entries written before this field keep
    /// parsing.
    #[serde(flatten)]
    pub problem: Problem,
    /// Device description, e.g. "4x NVIDIA H200".
    pub device: String,
    /// Software versions, e.g. "ficco 0.1.0; driver 13000; nccl 22803; cublaslt 130000".
    pub software: String,
}

impl TuneKey {
    pub fn new(p: &Problem, device: &str, software: &str) -> Self {
        TuneKey {
            problem: *p,
            device: device.to_string(),
            software: software.to_string(),
        }
    }

    fn same_problem(&self, other: &TuneKey) -> bool {
        self.problem == other.problem
    }
}

/// One tuned problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuneEntry {
    pub key: TuneKey,
    /// The measured winner (canonical name).
    pub schedule: String,
    pub time_ms: f64,
    /// Every candidate measured: (name, ms).
    pub measured: Vec<(String, f64)>,
}

/// The cache file's contents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TuneCache {
    pub version: u32,
    pub entries: Vec<TuneEntry>,
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// A matching, valid entry.
    Hit(TuneEntry),
    /// Nothing for this problem.
    Miss,
    /// Entries for this problem exist but for another device or versions:
    /// the warning line says which.
    Stale(String),
}

/// The cache path when none is given: `FICCO_TUNE_CACHE`, else
/// `$XDG_CACHE_HOME/ficco/tune.json`, else `$HOME/.cache/ficco/tune.json`,
/// else `ficco-tune.json` ([`crate::settings::tune_cache_path`]).
pub fn default_path() -> PathBuf {
    crate::settings::tune_cache_path()
}

impl TuneCache {
    pub fn new() -> Self {
        TuneCache {
            version: CACHE_VERSION,
            entries: vec![],
        }
    }

    /// Parses cache text, checking the version and every entry's schedule name.
    pub fn parse(text: &str) -> Result<TuneCache, String> {
        let c: TuneCache = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if c.version != CACHE_VERSION {
            return Err(format!(
                "version {} (this ficco reads version {CACHE_VERSION})",
                c.version
            ));
        }
        for e in &c.entries {
            e.schedule
                .parse::<Schedule>()
                .map_err(|err| err.to_string())?;
            if !(e.time_ms.is_finite() && e.time_ms > 0.0) {
                return Err(format!("entry for {} has time {}", e.schedule, e.time_ms));
            }
        }
        Ok(c)
    }

    /// Loads `path`: `(cache, warning)`. A missing file is an empty cache with
    /// no warning; an unreadable or corrupt one is an empty cache and a
    /// one-line warning.
    pub fn load(path: &Path) -> (TuneCache, Option<String>) {
        match std::fs::read_to_string(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (TuneCache::new(), None),
            Err(e) => (
                TuneCache::new(),
                Some(format!(
                    "ignoring tuning cache '{}': cannot read it: {e}",
                    path.display()
                )),
            ),
            Ok(text) => match TuneCache::parse(&text) {
                Ok(c) => (c, None),
                Err(why) => (
                    TuneCache::new(),
                    Some(format!(
                        "ignoring corrupt tuning cache '{}': {}",
                        path.display(),
                        why.split_whitespace().collect::<Vec<_>>().join(" ")
                    )),
                ),
            },
        }
    }

    /// Writes the cache to `path` (creating its directory).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        // Write then rename, so a crash never leaves half a file.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text + "\n")?;
        std::fs::rename(&tmp, path)
    }

    /// The entry for `key`, or why there is none usable.
    pub fn lookup(&self, key: &TuneKey) -> Lookup {
        if let Some(e) = self.entries.iter().find(|e| &e.key == key) {
            return Lookup::Hit(e.clone());
        }
        match self.entries.iter().find(|e| e.key.same_problem(key)) {
            Some(e) => Lookup::Stale(format!(
                "ignoring stale tuning entry for {} {}x{}x{} on {} GPUs: tuned on '{}' with '{}', this is '{}' with '{}'",
                key.problem.op, key.problem.m, key.problem.k, key.problem.n, key.problem.gpus, e.key.device, e.key.software, key.device, key.software
            )),
            None => Lookup::Miss,
        }
    }

    /// Inserts or replaces the entry of `entry.key`.
    pub fn insert(&mut self, entry: TuneEntry) {
        self.entries.retain(|e| e.key != entry.key);
        self.entries.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::workload::Op;

    fn key(device: &str) -> TuneKey {
        let p = Problem::new(Op::AgGemm, 2048, 4096, 3072, 2).unwrap();
        TuneKey::new(&p, device, "ficco 0.1.0; nccl 22803")
    }

    fn entry(device: &str) -> TuneEntry {
        TuneEntry {
            key: key(device),
            schedule: "shard-copy-ring".into(),
            time_ms: 0.08,
            measured: vec![("shard-copy-ring".into(), 0.08), ("seq".into(), 0.13)],
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ficco-tune-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join("tune.json")
    }

    #[test]
    fn hit_after_save_and_load() {
        let path = tmp("hit");
        let mut c = TuneCache::new();
        c.insert(entry("2x NVIDIA H200"));
        c.insert(entry("2x NVIDIA H200")); // replaces
        assert_eq!(c.entries.len(), 1);
        c.save(&path).unwrap();
        let (back, warn) = TuneCache::load(&path);
        assert!(warn.is_none());
        assert_eq!(
            back.lookup(&key("2x NVIDIA H200")),
            Lookup::Hit(entry("2x NVIDIA H200"))
        );
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn stale_device_or_versions_are_not_trusted() {
        let mut c = TuneCache::new();
        c.insert(entry("2x NVIDIA H200"));
        match c.lookup(&key("2x NVIDIA H100 80GB HBM3")) {
            Lookup::Stale(w) => {
                assert!(w.contains("stale") && w.contains("H100"), "{w}");
                assert!(!w.contains('\n'));
            }
            other => panic!("{other:?}"),
        }
        let mut k = key("2x NVIDIA H200");
        k.software = "ficco 0.2.0; nccl 22900".into();
        assert!(matches!(c.lookup(&k), Lookup::Stale(_)));
        k.problem.m = 4096;
        assert_eq!(c.lookup(&k), Lookup::Miss);
    }

    #[test]
    fn keys_keep_the_old_format() {
        // An entry as written before TuneKey held a Problem.
        let old = r#"{"version": 1, "entries": [{"key": {"op": "ag-gemm", "m": 2048, "k": 4096, "n": 3072, "gpus": 2, "device": "2x NVIDIA H200", "software": "ficco 0.1.0; nccl 22803"}, "schedule": "shard-copy-ring", "time_ms": 0.08, "measured": [["shard-copy-ring", 0.08], ["seq", 0.13]]}]}"#;
        let c = TuneCache::parse(old).unwrap();
        assert_eq!(c.entries, vec![entry("2x NVIDIA H200")]);
        assert_eq!(
            c.lookup(&key("2x NVIDIA H200")),
            Lookup::Hit(entry("2x NVIDIA H200"))
        );
        // And it is written back with the same keys, in the same order.
        let text = serde_json::to_string(&c.entries[0].key).unwrap();
        assert_eq!(
            text,
            r#"{"op":"ag-gemm","m":2048,"k":4096,"n":3072,"gpus":2,"device":"2x NVIDIA H200","software":"ficco 0.1.0; nccl 22803"}"#
        );
        // Unknown keys are still refused.
        let extra = old.replace(r#""gpus": 2,"#, r#""gpus": 2, "tp": 4,"#);
        assert!(TuneCache::parse(&extra).is_err());
    }

    #[test]
    fn corrupt_or_missing_files_are_ignored_with_one_line() {
        let path = tmp("corrupt");
        for bad in [
            "{not json",
            "{\"version\": 99, \"entries\": []}",
            "{\"version\": 1, \"entries\": [{\"key\": {\"op\": \"ag-gemm\", \"m\": 1, \"k\": 1, \"n\": 1, \"gpus\": 2, \"device\": \"d\", \"software\": \"s\"}, \"schedule\": \"warp-drive\", \"time_ms\": 1.0, \"measured\": []}]}",
            "[]",
        ] {
            std::fs::write(&path, bad).unwrap();
            let (c, warn) = TuneCache::load(&path);
            assert!(c.entries.is_empty());
            let w = warn.expect("a warning");
            assert!(w.contains("ignoring corrupt tuning cache"), "{w}");
            assert!(!w.contains('\n'), "{w}");
        }
        std::fs::remove_file(&path).ok();
        let (c, warn) = TuneCache::load(&path);
        assert!(c.entries.is_empty() && warn.is_none());
    }
}
