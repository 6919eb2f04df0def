//! `ficco._native`: the thin PyO3 layer between Python and the Rust library.
//!
//! It only converts: Python arguments into checked Rust values, calls into
//! `ficco_cuda::session::Session` (one process's rank of a job) and the core's
//! schedule grammar, and Rust errors into Python exceptions. Tensors, process
//! groups and the rendezvous through PyTorch's store are `ficco/torch.py`'s
//! business; this module never imports torch.
//!
//! Errors: a caller's mistake (a shape, a schedule name, a plan that cannot
//! run as asked, a schedule skipped by design) raises `ValueError`, anything
//! else (the driver, NCCL, a lost peer, a hang) `RuntimeError`, each with the
//! Rust error's own message. Nothing here unwraps user input: the Python user
//! sees an exception, never a panic.

use ficco_core::choose::call::Basis;
use ficco_core::choose::explore::check_named;
use ficco_core::problem::workload::Op;
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::{enumerate, Schedule, SpaceOptions};
use ficco_cuda::runtime::{JobSecret, LaunchEnv};
use ficco_cuda::session::{OpCall, Session, SessionOpts};
use ficco_cuda::CudaError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The hardware profile whose SM count bounds `-smN`, `-gcN` and `-ctaN`
/// when the caller does not give the device's (the CLI's default too).
const DEFAULT_HW: &str = "h200-nvlink";

/// A Rust error of the GPU backend as the Python exception it means.
fn cuda_err(e: CudaError) -> PyErr {
    let text = e.to_string();
    match e {
        // The call cannot run as asked (shape, schedule, plan) or the
        // schedule does not run here by design: the caller's to change.
        CudaError::Plan(_)
        | CudaError::Skipped(_)
        | CudaError::NotPrepared(_)
        | CudaError::Capture(_) => PyValueError::new_err(text),
        _ => PyRuntimeError::new_err(text),
    }
}

/// A core error (grammar, shape, profile) as the Python exception it means.
fn core_err(e: ficco_core::Error) -> PyErr {
    match e {
        ficco_core::Error::Io(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// One of the three operators the PyTorch ops run.
fn parse_op(op: &str) -> PyResult<Op> {
    let parsed: Op = op.parse().map_err(core_err)?;
    if !Op::ALL.contains(&parsed) {
        return Err(PyValueError::new_err(format!(
            "operator '{op}' has no PyTorch op; ficco's ops on tensors are ag-gemm, gemm-rs and gemm-ar"
        )));
    }
    Ok(parsed)
}

/// The design-space bounds of a device of `sm_count` SMs (default: the
/// default profile's), with every control allowed: a name may use any
/// option the device can run.
fn space_for(sm_count: Option<usize>) -> PyResult<SpaceOptions> {
    let hw = HwProfile::builtin(DEFAULT_HW).map_err(core_err)?;
    let sm_count = match sm_count {
        Some(0) => return Err(PyValueError::new_err("sm_count must be positive, got 0")),
        Some(n) => n,
        None => hw.sm_count,
    };
    Ok(SpaceOptions {
        controls: true,
        sm_count,
        nccl_sms: hw.nccl_sms.min(sm_count),
    })
}

/// Parses a schedule name for `op` with the core's grammar and checks it
/// against the design space: its options on a device of `sm_count` SMs
/// (default: the default hardware profile's) and, when `gpus` is given,
/// that it can run on that many ranks. Returns the canonical name; raises
/// `ValueError` with the core's message.
#[pyfunction]
#[pyo3(signature = (op, name, gpus=None, sm_count=None))]
fn check_schedule(
    op: &str,
    name: &str,
    gpus: Option<usize>,
    sm_count: Option<usize>,
) -> PyResult<String> {
    let op = parse_op(op)?;
    let schedule: Schedule = name.parse().map_err(core_err)?;
    check_named(op, space_for(sm_count)?, &[schedule]).map_err(core_err)?;
    if let Some(why) = gpus.and_then(|g| schedule.gpus_misfit(g)) {
        return Err(core_err(ficco_core::Error::DoesNotFit {
            schedule: schedule.name(),
            reason: why,
        }));
    }
    Ok(schedule.name())
}

/// The enumerated schedule names of `op` on `gpus` ranks (what
/// `ficco schedules --op OP --gpus P [--controls]` lists), `seq` first.
#[pyfunction]
#[pyo3(signature = (op, gpus, controls=false))]
fn schedules(op: &str, gpus: usize, controls: bool) -> PyResult<Vec<String>> {
    // Every operator, as `ficco schedules` lists them (not only the three
    // with PyTorch ops).
    let op: Op = op.parse().map_err(core_err)?;
    if gpus < 2 {
        return Err(core_err(ficco_core::Error::Shape(format!(
            "gpus must be at least 2 for a communication-dependent operator, got {gpus}"
        ))));
    }
    let space = SpaceOptions {
        controls,
        ..space_for(None)?
    };
    Ok(enumerate(op, space)
        .into_iter()
        .filter(|s| s.gpus_misfit(gpus).is_none())
        .map(|s| s.name())
        .collect())
}

/// A TCP port free on every interface now (rank 0 of a group hosts the
/// session's store on it; the port is released before it returns, so another
/// process could take it first, which the store's bind then reports).
#[pyfunction]
fn free_port() -> PyResult<u16> {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| PyRuntimeError::new_err(format!("no free TCP port: {e}")))
}

/// A fresh job secret from the OS random source, as 64 hex digits (rank 0
/// of a group draws one and gives it to the others' `Session(secret=...)`).
#[pyfunction]
fn new_secret() -> PyResult<String> {
    JobSecret::generate()
        .map(|s| s.to_hex())
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// ficco's rendezvous bound in ms: `FICCO_DIST_TIMEOUT_MS` as the Rust
/// runtime parses it (read now, so a changed environment is seen; one
/// parser for both languages). Raises `ValueError` naming a bad value.
#[pyfunction]
fn dist_timeout_ms() -> PyResult<u64> {
    env_settings().map(|s| s.dist_timeout_ms)
}

/// This process's `FICCO_*` settings, parsed now; a bad value is a `ValueError`.
fn env_settings() -> PyResult<ficco_core::settings::Settings> {
    ficco_core::settings::Settings::from_env().map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `FICCO_KEEP_GATHERED` as the Rust settings parse it (read now): whether
/// `all_gather_matmul` keeps its gathered operand for the weight gradient
/// (`None`: auto, by the group's size). Raises `ValueError` naming a bad
/// value.
#[pyfunction]
fn keep_gathered_default() -> PyResult<Option<bool>> {
    env_settings().map(|s| s.keep_gathered)
}

/// `FICCO_ADAPT_HOST` as the Rust settings parse it (read now): whether
/// `auto` turns to `seq` for call shapes whose caller is host-bound.
/// Raises `ValueError` naming a bad value.
#[pyfunction]
fn adapt_host_default() -> PyResult<bool> {
    env_settings().map(|s| s.adapt_host)
}

/// The package version (the Rust crate's).
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The checked launcher environment of one rank; `LaunchEnv::from_lookup`
/// checks the same for environment variables, this names the arguments.
fn launch_env(
    rank: i64,
    world: i64,
    local_rank: i64,
    local_world: i64,
    master_addr: String,
    port: i64,
    secret: Option<String>,
) -> PyResult<LaunchEnv> {
    let bad = |msg: String| Err(PyValueError::new_err(msg));
    // Python ints in, so a negative or huge one gets a message naming it
    // (not PyO3's bare OverflowError).
    let count = |name: &str, v: i64| -> PyResult<usize> {
        usize::try_from(v)
            .map_err(|_| PyValueError::new_err(format!("{name} must be non-negative, got {v}")))
    };
    let (rank, world) = (count("rank", rank)?, count("world", world)?);
    let (local_rank, local_world) = (
        count("local_rank", local_rank)?,
        count("local_world", local_world)?,
    );
    let port = match u16::try_from(port) {
        Ok(p) if p > 0 => p,
        _ => return bad(format!("port must be a TCP port (1 to 65535), got {port}")),
    };
    if world == 0 {
        return bad("world must be at least 1, got 0".into());
    }
    if rank >= world {
        return bad(format!("rank {rank} must be below world {world}"));
    }
    if local_world == 0 || local_world > world {
        return bad(format!(
            "local_world must be between 1 and world {world}, got {local_world}"
        ));
    }
    if local_rank >= local_world {
        return bad(format!(
            "local_rank {local_rank} must be below local_world {local_world}"
        ));
    }
    let master_addr = master_addr.trim().to_string();
    if master_addr.is_empty() {
        return bad("master_addr is empty; give rank 0's host name or address".into());
    }
    // FICCO_STORE_BIND, and FICCO_JOB_SECRET unless the caller gives one.
    let (env_secret, store_bind) = LaunchEnv::security_from_lookup(|k| std::env::var(k).ok())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let secret = match secret {
        Some(hex) => Some(JobSecret::from_hex(&hex).ok_or_else(|| {
            PyValueError::new_err(format!(
                "secret must be 64 hex digits, got {} characters",
                hex.trim().len()
            ))
        })?),
        None => env_secret,
    };
    Ok(LaunchEnv {
        rank,
        world_size: world,
        local_rank,
        local_world_size: local_world,
        master_addr,
        master_port: port,
        store_port: port,
        secret,
        store_bind,
    })
}

/// Seconds as the bound of every rendezvous wait.
fn timeout_from_secs(s: f64) -> PyResult<Duration> {
    if !s.is_finite() || s <= 0.0 || s > 1e9 {
        return Err(PyValueError::new_err(format!(
            "timeout_s must be a positive number of seconds, got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// One process's rank of a ficco job (`ficco_cuda::session::Session`).
///
/// Every rank of the job constructs one with the same `world`,
/// `master_addr` and `port`; rank 0 hosts the rendezvous store on `port`.
/// The constructor returns once every rank joined, or raises within the
/// timeout (`timeout_s`, else `FICCO_DIST_TIMEOUT_MS`, else 60 s).
/// `secret`: the job secret (64 hex digits, the same on every rank; see
/// `new_secret`), else `FICCO_JOB_SECRET`, else as the README's "Security"
/// says (a private file on one node; refused over several nodes).
#[pyclass(module = "ficco._native", name = "Session", frozen)]
struct PySession {
    /// `None` once closed. The lock is taken with the GIL released (the
    /// calls it guards block on the other ranks).
    inner: Mutex<Option<Session>>,
}

impl PySession {
    fn lock(&self) -> MutexGuard<'_, Option<Session>> {
        // A panic while the lock was held cannot leave a session half
        // changed in a way later calls rely on; take it back.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `f` of the open session, or `RuntimeError` once closed.
    fn with<T>(&self, f: impl FnOnce(&Session) -> T) -> PyResult<T> {
        self.lock().as_ref().map(f).ok_or_else(closed)
    }

    /// `f` of the open session with the GIL released (the calls it runs
    /// wait for the other ranks, whose threads in this process, and
    /// Python's, must keep running); `RuntimeError` once closed, and the
    /// library's error as the Python exception it means.
    fn blocking<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Session) -> Result<T, CudaError> + Send,
    ) -> PyResult<T> {
        py.detach(|| match self.lock().as_mut() {
            None => Err(closed()),
            Some(s) => f(s).map_err(cuda_err),
        })
    }
}

fn closed() -> PyErr {
    PyRuntimeError::new_err("the ficco session is closed")
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (rank, world, local_rank, local_world, master_addr, port, loopback=None, timeout_s=None, device=None, secret=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rank: i64,
        world: i64,
        local_rank: i64,
        local_world: i64,
        master_addr: String,
        port: i64,
        loopback: Option<bool>,
        timeout_s: Option<f64>,
        device: Option<usize>,
        secret: Option<String>,
    ) -> PyResult<Self> {
        let env = launch_env(
            rank,
            world,
            local_rank,
            local_world,
            master_addr,
            port,
            secret,
        )?;
        let mut opts = SessionOpts {
            loopback,
            device,
            ..SessionOpts::default()
        };
        if let Some(s) = timeout_s {
            opts.timeout = timeout_from_secs(s)?;
        }
        // The rendezvous waits for every rank: other Python threads run meanwhile.
        let session = py
            .detach(move || Session::join(env, opts))
            .map_err(cuda_err)?;
        Ok(PySession {
            inner: Mutex::new(Some(session)),
        })
    }

    /// Runs one operator on device memory (see `ficco_cuda::session::OpCall`):
    /// `a`, `b`, `out` are device addresses of bf16 row-major contiguous
    /// operands on this rank's device, `stream` the caller's `CUstream`.
    /// Every rank calls it with the same op, shapes and schedule. `schedule`
    /// `None` takes the tuning cache's winner, else the rule selector's
    /// pick. `b_transposed`: `b` holds B as `[n, k]` row-major (cuBLASLt
    /// reads it transposed; schedules with `tile`, grouped or ficco's own
    /// GEMMs refuse it). `gathered` (ag-gemm only, 0 for none): where to
    /// also write the gathered A, `[m, k]`. Returns the canonical name of
    /// the schedule that ran.
    #[pyo3(signature = (op, m, k, n, schedule, a, b, out, stream, b_transposed=false, gathered=0))]
    #[allow(clippy::too_many_arguments)]
    fn run_op(
        &self,
        py: Python<'_>,
        op: &str,
        m: usize,
        k: usize,
        n: usize,
        schedule: Option<String>,
        a: u64,
        b: u64,
        out: u64,
        stream: u64,
        b_transposed: bool,
        gathered: u64,
    ) -> PyResult<String> {
        // The native clock's entry and return marks bracket the checks
        // and the call (`Session.host_times()`).
        ficco_cuda::session::clock_enter();
        let ran = (|| -> PyResult<String> {
            let op = parse_op(op)?;
            for (name, v) in [("m", m), ("k", k), ("n", n)] {
                if v == 0 {
                    return Err(PyValueError::new_err(format!(
                        "{name} must be positive, got 0"
                    )));
                }
            }
            for (name, p) in [("a", a), ("b", b), ("out", out)] {
                if p == 0 {
                    return Err(PyValueError::new_err(format!(
                        "{name} is a null device address"
                    )));
                }
            }
            let call = OpCall {
                op,
                m,
                k,
                n,
                schedule: schedule.as_deref(),
                a,
                b,
                out,
                stream,
                b_transposed,
                gathered,
            };
            self.blocking(py, |s| s.run_op(&call)).map(|d| d.schedule)
        })();
        ficco_cuda::session::clock_leave();
        ran
    }

    /// What `schedule="auto"` runs for an operator call of this shape in a
    /// model (collective: every rank calls it, in the same order; rank 0's
    /// decision, made once per shape): `(schedule, candidate, basis,
    /// seq_ms, candidate_ms, gain_ms, cost_ms)`, where `schedule` is the
    /// candidate or `"seq"` (the candidate's gain does not cover the
    /// call's own cost) and `basis` is `"measured"` or `"predicted"`.
    #[allow(clippy::type_complexity)]
    fn decide(
        &self,
        py: Python<'_>,
        op: &str,
        m: usize,
        k: usize,
        n: usize,
    ) -> PyResult<(String, String, String, f64, f64, f64, f64)> {
        let op = parse_op(op)?;
        let d = self.blocking(py, |s| s.decide_op(op, m, k, n))?;
        Ok((
            d.schedule,
            d.candidate,
            match d.basis {
                Basis::Measured => "measured".into(),
                Basis::Predicted => "predicted".into(),
            },
            d.seq_ms,
            d.candidate_ms,
            d.gain_ms,
            d.cost_ms,
        ))
    }

    /// A shared allocation of `bytes` on this rank's device (collective:
    /// every rank calls it with the same size); returns its address.
    /// Operands in such memory are used in place by `run_op`.
    fn alloc(&self, py: Python<'_>, bytes: usize) -> PyResult<u64> {
        self.blocking(py, |s| s.alloc(bytes))
    }

    /// Releases this rank's shared allocation at `addr` (local), once this
    /// rank's calls that may use it finished. A closed session already
    /// released everything: then it does nothing.
    fn free(&self, py: Python<'_>, addr: u64) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(
            || match inner.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                None => Ok(()),
                Some(s) => s.free(addr),
            },
        )
        .map_err(cuda_err)
    }

    /// Waits until every operator call of this rank finished on its device
    /// (calls return once queued on the caller's stream). Raises
    /// `RuntimeError` if one of them hung (a rank died): its result, and
    /// those of the calls after it, are not valid.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.blocking(py, |s| s.synchronize())
    }

    /// Where the host time of this process's operator calls went since the
    /// last report, in the native layer, every thread's (autograd issues
    /// the backward's on its own): `[(phase, mean µs, calls)]` in call
    /// order (`bench/host_breakdown.py` prints it).
    #[staticmethod]
    fn host_times() -> Vec<(&'static str, f64, u64)> {
        ficco_cuda::session::host_times()
    }

    /// Leaves the job (a last barrier with the other ranks); later calls
    /// raise. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        let taken = py.detach(|| inner.lock().unwrap_or_else(|p| p.into_inner()).take());
        match taken {
            None => Ok(()),
            Some(s) => py.detach(move || s.close()).map_err(cuda_err),
        }
    }

    /// Whether the session is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// This process's rank of the job.
    #[getter]
    fn rank(&self) -> PyResult<usize> {
        self.with(Session::rank)
    }

    /// Ranks in the job.
    #[getter]
    fn world(&self) -> PyResult<usize> {
        self.with(Session::world)
    }

    /// Whether every rank runs on one GPU.
    #[getter]
    fn loopback(&self) -> PyResult<bool> {
        self.with(Session::loopback)
    }

    /// Whether every rank is on this node (copy and tile schedules need it).
    #[getter]
    fn single_node(&self) -> PyResult<bool> {
        self.with(Session::single_node)
    }

    /// The CUDA device ordinal this rank drives.
    #[getter]
    fn device(&self) -> PyResult<usize> {
        self.with(Session::device)
    }

    fn __repr__(&self) -> String {
        match self.lock().as_ref() {
            None => "Session(closed)".into(),
            Some(s) => format!(
                "Session(rank={}, world={}, device={}, loopback={}, single_node={})",
                s.rank(),
                s.world(),
                s.device(),
                if s.loopback() { "True" } else { "False" },
                if s.single_node() { "True" } else { "False" },
            ),
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySession>()?;
    m.add_function(wrap_pyfunction!(check_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(schedules, m)?)?;
    m.add_function(wrap_pyfunction!(free_port, m)?)?;
    m.add_function(wrap_pyfunction!(new_secret, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(dist_timeout_ms, m)?)?;
    m.add_function(wrap_pyfunction!(keep_gathered_default, m)?)?;
    m.add_function(wrap_pyfunction!(adapt_host_default, m)?)?;
    Ok(())
}
