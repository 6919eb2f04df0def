//! Every `FICCO_*` environment variable, in one table ([`VARS`]) and one
//! parser ([`Settings`]). Nothing else in ficco reads its own variables:
//! the executor, the job runtime, the op path, the tuning cache and the
//! Python package all take their value from here, so a variable means the
//! same thing everywhere and a bad value is reported the same way.
//!
//! A process reads them once, at first use ([`Settings::get`]). A value
//! that does not parse is an error naming the variable, the value and what
//! it takes ([`SettingsError`]), never silently replaced by the default;
//! the entry points (opening a GPU backend, a session, the CLI) call
//! [`Settings::get`] first, so the error comes before any work. An empty
//! value counts as unset.
//!
//! Not settings: the markers ficco sets for its own child processes
//! (`FICCO_NCCL_SHIM`, which stops a re-exec with the NCCL shim from
//! repeating itself, and the tests' `FICCO_*_CHILD` roles).
//!
//! Launcher variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...) belong to
//! the launcher and are read with the job's environment
//! (`ficco_cuda::runtime::env`); `FICCO_STORE_PORT`, `FICCO_STORE_BIND` and
//! `FICCO_JOB_SECRET` are listed here and read there, beside the
//! `MASTER_PORT` and `MASTER_ADDR` they go with (the secret is kept out of
//! this process-wide table).

use std::path::PathBuf;
use std::sync::OnceLock;

/// One variable of the table: what the README lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    /// The values it takes.
    pub takes: &'static str,
    /// What unset means.
    pub default: &'static str,
    pub what: &'static str,
}

pub const WATCHDOG_MS: &str = "FICCO_WATCHDOG_MS";
pub const GRAPHS: &str = "FICCO_GRAPHS";
pub const OP_SYNC: &str = "FICCO_OP_SYNC";
pub const FLAG_KERNELS: &str = "FICCO_FLAG_KERNELS";
pub const KEEP_GATHERED: &str = "FICCO_KEEP_GATHERED";
pub const ADAPT_HOST: &str = "FICCO_ADAPT_HOST";
pub const GROUPED: &str = "FICCO_GROUPED";
pub const TRACE: &str = "FICCO_TRACE";
pub const GRAPH_DOT: &str = "FICCO_GRAPH_DOT";
pub const TASK_PROGRESS: &str = "FICCO_TASK_PROGRESS";
pub const DIST_TIMEOUT_MS: &str = "FICCO_DIST_TIMEOUT_MS";
pub const STORE_PORT: &str = "FICCO_STORE_PORT";
pub const STORE_BIND: &str = "FICCO_STORE_BIND";
pub const JOB_SECRET: &str = "FICCO_JOB_SECRET";
pub const TUNE_CACHE: &str = "FICCO_TUNE_CACHE";
pub const CUBIN_CACHE: &str = "FICCO_CUBIN_CACHE";
pub const TEST_DROP_SIGNAL: &str = "FICCO_TEST_DROP_SIGNAL";
pub const TEST_KILL_RANK: &str = "FICCO_TEST_KILL_RANK";
pub const TEST_LOOPBACK_TILE: &str = "FICCO_TEST_LOOPBACK_TILE";

/// Default watchdog bound in ms ([`WATCHDOG_MS`]).
pub const DEFAULT_WATCHDOG_MS: u64 = 10_000;
/// Default bound of every rendezvous wait in ms ([`DIST_TIMEOUT_MS`]).
pub const DEFAULT_DIST_TIMEOUT_MS: u64 = 60_000;

/// Every variable ficco reads, in the order of the README's table.
pub const VARS: &[Var] = &[
    Var {
        name: WATCHDOG_MS,
        takes: "milliseconds > 0",
        default: "10000",
        what: "a run in which no rank finishes an iteration for this long is ended as a hang",
    },
    Var {
        name: GRAPHS,
        takes: "0 or 1",
        default: "1",
        what: "replay each iteration from a CUDA graph where capture works (`--no-graph` sets 0); for the Python ops, replay repeated calls at the same addresses from a graph of the call",
    },
    Var {
        name: OP_SYNC,
        takes: "0 or 1",
        default: "0",
        what: "operator calls always take the full path (reset, store barriers, host synchronize)",
    },
    Var {
        name: FLAG_KERNELS,
        takes: "auto, 0 or 1",
        default: "0",
        what: "flags that no GEMM, reduce or collective of another stream can run beside (a call's control steps; ag-gemm's GEMM stream; a reduction's last reduce and broadcasts) are set and waited on by a one-warp kernel instead of stream memory operations, which cost 1.3-2.5 µs of host time each in a graph launch (auto: where each rank has its own GPU, no tile GEMM, no green context; 1: also with several ranks on one GPU, for tests; 0: never, the default until it has run on several GPUs: measured on one H200 only)",
    },
    Var {
        name: KEEP_GATHERED,
        takes: "auto, 0 or 1",
        default: "auto",
        what: "the Python `all_gather_matmul` keeps the gathered operand its op hands back, for the weight gradient, as PyTorch's forward keeps its gathered input (0: the backward gathers it again, with less memory; auto: keep, on any number of ranks: gathering again made the training step 0.2-2% slower on 4 GPUs and 0-1% on 2)",
    },
    Var {
        name: ADAPT_HOST,
        takes: "0 or 1",
        default: "1",
        what: "the Python ops' `auto` samples the first eager calls of a group that has made a call needing a gradient (training) and runs `seq` for shapes with small gains where the caller's stream was idle at more than a third of them on some rank (the host, not the GPU, sets the pace: ficco's backward calls cost more host time than PyTorch's)",
    },
    Var {
        name: GROUPED,
        takes: "auto, own or loop",
        default: "auto",
        what: "how grouped GEMM tasks run: ficco's grouped kernel from enough groups, always, or a cuBLASLt loop",
    },
    Var {
        name: TRACE,
        takes: "0 or 1",
        default: "0",
        what: "print the phases of every measurement and run on stderr (to find where a process stalls)",
    },
    Var {
        name: GRAPH_DOT,
        takes: "a directory",
        default: "unset",
        what: "write each captured operator-call graph there as Graphviz DOT (`cuGraphDebugDotPrint`, verbose), to see what a replay launches",
    },
    Var {
        name: TASK_PROGRESS,
        takes: "0 or 1",
        default: "0",
        what: "directly issued runs write a host word after every task; a hang report lists the unfinished tasks",
    },
    Var {
        name: DIST_TIMEOUT_MS,
        takes: "milliseconds > 0",
        default: "60000",
        what: "bound of every rendezvous wait of a job (`--procs`, torchrun, the Python ops)",
    },
    Var {
        name: STORE_PORT,
        takes: "a TCP port",
        default: "MASTER_PORT, or MASTER_PORT + 1 under torchrun's agent store",
        what: "port of ficco's rendezvous store on MASTER_ADDR",
    },
    Var {
        name: STORE_BIND,
        takes: "an IP address",
        default: "127.0.0.1 when every rank is on one node, else the address MASTER_ADDR resolves to",
        what: "where rank 0's store listens (0.0.0.0: every interface, not advised)",
    },
    Var {
        name: JOB_SECRET,
        takes: "64 hex digits, the same on every rank",
        default: "drawn by `--procs` and the Python ops; one node: a private file; several nodes: required",
        what: "the secret every connection to the job's store proves it knows (see Security)",
    },
    Var {
        name: TUNE_CACHE,
        takes: "a file path",
        default: "$XDG_CACHE_HOME/ficco/tune.json, else ~/.cache/ficco/tune.json",
        what: "the tuning cache `tune` writes and `select`, `auto` and the Python ops read",
    },
    Var {
        name: CUBIN_CACHE,
        takes: "a directory",
        default: "$XDG_CACHE_HOME/ficco/cubin, else ~/.cache/ficco/cubin",
        what: "compiled kernels and the own GEMM's autotune results",
    },
    Var {
        name: TEST_DROP_SIGNAL,
        takes: "RANK,TASK",
        default: "unset",
        what: "fault injection for tests: that task never signals, so its consumers wait (watchdog tests)",
    },
    Var {
        name: TEST_KILL_RANK,
        takes: "a rank",
        default: "unset",
        what: "fault injection for tests: that rank's process exits once its first run starts (rank-failure tests)",
    },
    Var {
        name: TEST_LOOPBACK_TILE,
        takes: "0 or 1",
        default: "0",
        what: "for tests of the op path on one GPU: the Python ops and `Session::run_op` run `tile` schedules with every rank on one GPU, where processes time-slice it (a tile GEMM spinning on a peer's flag holds the GPU until its slice ends: slow, never for use)",
    },
];

/// A variable set to a value it does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}='{value}' is not valid: it takes {takes} (unset: {default}); fix or unset it")]
pub struct SettingsError {
    pub var: &'static str,
    pub value: String,
    pub takes: &'static str,
    pub default: &'static str,
}

/// How grouped GEMM tasks run ([`GROUPED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Grouped {
    /// ficco's grouped kernel for tasks with enough non-empty groups that it
    /// supports, else a loop of cuBLASLt calls.
    #[default]
    Auto,
    /// ficco's grouped kernel wherever it supports the groups.
    Own,
    /// A loop of cuBLASLt calls, one per group.
    Loop,
}

/// Where flags go by ficco's signal kernel instead of stream memory
/// operations ([`FLAG_KERNELS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlagKernels {
    /// Where each rank has its own GPU (not in loopback).
    Auto,
    /// Never: the default until the kernel has run on several GPUs (it was
    /// measured on one H200 only; `bench/RESULTS.md`, 2026-11-29).
    #[default]
    Off,
    /// Also in loopback (several ranks on one GPU).
    On,
}

/// Test-only hooks ([`TEST_DROP_SIGNAL`], [`TEST_KILL_RANK`],
/// [`TEST_LOOPBACK_TILE`]): off unless a test sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// (rank, task) whose signals are never written.
    pub drop_signal: Option<(usize, usize)>,
    /// The rank whose process exits once its first run starts.
    pub kill_rank: Option<usize>,
    /// Operator calls may run `tile` schedules in loopback.
    pub loopback_tile: bool,
}

/// The parsed values of [`VARS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub watchdog_ms: u64,
    pub graphs: bool,
    pub op_sync: bool,
    pub flag_kernels: FlagKernels,
    /// `None`: auto (the Python layer keeps).
    pub keep_gathered: Option<bool>,
    pub adapt_host: bool,
    pub grouped: Grouped,
    pub trace: bool,
    pub graph_dot: Option<PathBuf>,
    pub task_progress: bool,
    pub dist_timeout_ms: u64,
    pub tune_cache: Option<PathBuf>,
    pub cubin_cache: Option<PathBuf>,
    pub faults: Faults,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            watchdog_ms: DEFAULT_WATCHDOG_MS,
            graphs: true,
            op_sync: false,
            flag_kernels: FlagKernels::Off,
            keep_gathered: None,
            adapt_host: true,
            grouped: Grouped::Auto,
            trace: false,
            graph_dot: None,
            task_progress: false,
            dist_timeout_ms: DEFAULT_DIST_TIMEOUT_MS,
            tune_cache: None,
            cubin_cache: None,
            faults: Faults::default(),
        }
    }
}

fn var(name: &str) -> &'static Var {
    // Every name passed here is one of the constants above, all in VARS.
    VARS.iter().find(|v| v.name == name).unwrap_or(&VARS[0])
}

impl Settings {
    /// Parses the variables `get` returns (unset: `None`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let value = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let bad = |name: &str, v: &str| {
            let spec = var(name);
            SettingsError {
                var: spec.name,
                value: v.to_owned(),
                takes: spec.takes,
                default: spec.default,
            }
        };
        let positive = |name: &str, default: u64| match value(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(name, &v)),
        };
        let flag = |name: &str, default: bool| match value(name).as_deref() {
            None => Ok(default),
            Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(v) => Err(bad(name, v)),
        };
        let grouped = match value(GROUPED).as_deref() {
            None | Some("auto") => Grouped::Auto,
            Some("own") => Grouped::Own,
            Some("loop") => Grouped::Loop,
            Some(v) => return Err(bad(GROUPED, v)),
        };
        let flag_kernels = match value(FLAG_KERNELS).as_deref() {
            Some("auto") => FlagKernels::Auto,
            None | Some("0") => FlagKernels::Off,
            Some("1") => FlagKernels::On,
            Some(v) => return Err(bad(FLAG_KERNELS, v)),
        };
        let drop_signal = match value(TEST_DROP_SIGNAL) {
            None => None,
            Some(v) => {
                let pair = v
                    .split_once(',')
                    .and_then(|(r, t)| Some((r.trim().parse().ok()?, t.trim().parse().ok()?)));
                Some(pair.ok_or_else(|| bad(TEST_DROP_SIGNAL, &v))?)
            }
        };
        let kill_rank = match value(TEST_KILL_RANK) {
            None => None,
            Some(v) => Some(v.parse().map_err(|_| bad(TEST_KILL_RANK, &v))?),
        };
        Ok(Settings {
            watchdog_ms: positive(WATCHDOG_MS, DEFAULT_WATCHDOG_MS)?,
            graphs: flag(GRAPHS, true)?,
            op_sync: flag(OP_SYNC, false)?,
            flag_kernels,
            keep_gathered: match value(KEEP_GATHERED).as_deref() {
                None | Some("auto") => None,
                Some(_) => Some(flag(KEEP_GATHERED, false)?),
            },
            adapt_host: flag(ADAPT_HOST, true)?,
            grouped,
            trace: flag(TRACE, false)?,
            graph_dot: value(GRAPH_DOT).map(PathBuf::from),
            task_progress: flag(TASK_PROGRESS, false)?,
            dist_timeout_ms: positive(DIST_TIMEOUT_MS, DEFAULT_DIST_TIMEOUT_MS)?,
            tune_cache: value(TUNE_CACHE).map(PathBuf::from),
            cubin_cache: value(CUBIN_CACHE).map(PathBuf::from),
            faults: Faults {
                drop_signal,
                kill_rank,
                loopback_tile: flag(TEST_LOOPBACK_TILE, false)?,
            },
        })
    }

    /// Parses this process's environment now.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// This process's settings, read from its environment at the first call
    /// (later changes to the environment are not seen).
    pub fn get() -> Result<&'static Settings, SettingsError> {
        static READ: OnceLock<Result<Settings, SettingsError>> = OnceLock::new();
        READ.get_or_init(Self::from_env)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// [`Settings::get`] for code that cannot fail: the defaults where the
    /// environment does not parse. The entry points call [`Settings::get`]
    /// first and report that error, so the defaults are never used silently.
    pub fn current() -> &'static Settings {
        static DEFAULTS: OnceLock<Settings> = OnceLock::new();
        Self::get().unwrap_or_else(|_| DEFAULTS.get_or_init(Settings::default))
    }
}

/// With [`TRACE`] set to 1, prints `what` to stderr with the seconds since
/// the first trace of the process (to find where a process stalls, and what
/// its set-up costs); otherwise does nothing, and `what` is not called.
pub fn trace(what: impl FnOnce() -> String) {
    static ON: OnceLock<Option<std::time::Instant>> = OnceLock::new();
    let on = ON.get_or_init(|| Settings::current().trace.then(std::time::Instant::now));
    if let Some(t0) = on {
        eprintln!("ficco trace {:9.3}s {}", t0.elapsed().as_secs_f64(), what());
    }
}

/// The tuning cache file: [`TUNE_CACHE`] when set, else
/// `$XDG_CACHE_HOME/ficco/tune.json`, else `$HOME/.cache/ficco/tune.json`,
/// else `ficco-tune.json` in the working directory.
pub fn tune_cache_path() -> PathBuf {
    if let Some(p) = &Settings::current().tune_cache {
        return p.clone();
    }
    user_cache_dir()
        .map(|d| d.join("tune.json"))
        .unwrap_or_else(|| PathBuf::from("ficco-tune.json"))
}

/// ficco's folder in the user's cache: `$XDG_CACHE_HOME/ficco`, else
/// `$HOME/.cache/ficco` (XDG base directories, not ficco's own settings).
pub fn user_cache_dir() -> Option<PathBuf> {
    user_cache_dir_from(|k| std::env::var_os(k))
}

/// [`user_cache_dir`] with the environment given (empty values unset).
pub fn user_cache_dir_from(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = match var("XDG_CACHE_HOME") {
        Some(x) => x,
        None => var("HOME")?.join(".cache"),
    };
    Some(base.join("ficco"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn unset_and_empty_values_are_the_defaults() {
        assert_eq!(parse(&[]).unwrap(), Settings::default());
        let empty: Vec<(&str, &str)> = VARS.iter().map(|v| (v.name, " ")).collect();
        assert_eq!(parse(&empty).unwrap(), Settings::default());
    }

    #[test]
    fn every_variable_parses() {
        let s = parse(&[
            (WATCHDOG_MS, "2000"),
            (GRAPHS, "0"),
            (OP_SYNC, "1"),
            (FLAG_KERNELS, "auto"),
            (KEEP_GATHERED, "1"),
            (ADAPT_HOST, "0"),
            (GROUPED, "loop"),
            (TRACE, "1"),
            (GRAPH_DOT, "/tmp/dot"),
            (TASK_PROGRESS, " 1 "),
            (DIST_TIMEOUT_MS, "8000"),
            (TUNE_CACHE, "/tmp/t.json"),
            (CUBIN_CACHE, "/tmp/cubin"),
            (TEST_DROP_SIGNAL, "1, 3"),
            (TEST_KILL_RANK, "2"),
            (TEST_LOOPBACK_TILE, "1"),
        ])
        .unwrap();
        assert_eq!(s.watchdog_ms, 2000);
        assert!(!s.graphs && s.op_sync && s.trace && s.task_progress);
        assert_eq!(s.keep_gathered, Some(true));
        assert_eq!(s.flag_kernels, FlagKernels::Auto);
        assert_eq!(
            parse(&[(FLAG_KERNELS, "1")]).unwrap().flag_kernels,
            FlagKernels::On
        );
        assert_eq!(
            parse(&[(KEEP_GATHERED, "0")]).unwrap().keep_gathered,
            Some(false)
        );
        assert_eq!(
            parse(&[(KEEP_GATHERED, "auto")]).unwrap().keep_gathered,
            None
        );
        assert!(!s.adapt_host);
        assert_eq!(s.grouped, Grouped::Loop);
        assert_eq!(s.dist_timeout_ms, 8000);
        assert_eq!(s.tune_cache, Some(PathBuf::from("/tmp/t.json")));
        assert_eq!(s.graph_dot, Some(PathBuf::from("/tmp/dot")));
        assert_eq!(s.cubin_cache, Some(PathBuf::from("/tmp/cubin")));
        assert_eq!(s.faults.drop_signal, Some((1, 3)));
        assert_eq!(s.faults.kill_rank, Some(2));
        assert!(s.faults.loopback_tile);
    }

    #[test]
    fn a_bad_value_names_the_variable_and_what_it_takes() {
        for (name, value) in [
            (WATCHDOG_MS, "0"),
            (WATCHDOG_MS, "10s"),
            (GRAPHS, "off"),
            (OP_SYNC, "yes"),
            (FLAG_KERNELS, "on"),
            (KEEP_GATHERED, "no"),
            (GROUPED, "fast"),
            (DIST_TIMEOUT_MS, "-5"),
            (TEST_DROP_SIGNAL, "3"),
            (TEST_KILL_RANK, "x"),
            (TEST_LOOPBACK_TILE, "yes"),
        ] {
            let e = parse(&[(name, value)]).unwrap_err();
            assert_eq!(e.var, name);
            let msg = e.to_string();
            assert!(msg.contains(name) && msg.contains(value), "{msg}");
            assert!(msg.contains(var(name).takes), "{msg}");
        }
    }

    /// The README's settings table is this table.
    #[test]
    fn the_readme_lists_every_variable_as_here() {
        let readme = include_str!("../../../README.md");
        for v in VARS {
            let row = format!(
                "| `{}` | {} | {} | {} |",
                v.name, v.takes, v.default, v.what
            );
            assert!(readme.contains(&row), "README.md lacks the row\n{row}");
        }
    }

    #[test]
    fn the_table_names_each_variable_once() {
        let mut names: Vec<&str> = VARS.iter().map(|v| v.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), VARS.len());
        assert!(VARS.iter().all(|v| v.name.starts_with("FICCO_")));
    }
}
