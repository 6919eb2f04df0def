//! What the machine has: GPUs, SMs, memory, copy engines, the peer matrix and
//! the CUDA libraries (file, version, or why each cannot be used).
//! Serializable; `Display` prints a small table, and `{:#}` adds the file
//! names tried for each library that is not usable.

use crate::driver::cuda as cu;
use crate::error::Result;
use crate::loader::{LibProblem, LibStatus, Libraries};
use cudarc::driver::sys;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability, e.g. (9, 0).
    pub compute_capability: (i32, i32),
    pub sms: usize,
    pub memory_bytes: usize,
    /// Copy engines (asyncEngineCount).
    pub copy_engines: usize,
    pub l2_bytes: usize,
    pub shared_mem_per_sm: usize,
    /// Stream priorities (least, greatest); greater priority is numerically lower.
    pub priority_range: (i32, i32),
}

/// A pair of GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerLink {
    pub from: usize,
    pub to: usize,
    /// cuDeviceCanAccessPeer.
    pub access: bool,
    /// Native atomics over the link (true over NVLink, usually false over PCIe).
    pub native_atomics: bool,
    /// The driver's relative performance rank of the link (lower is better? driver-defined).
    pub perf_rank: i32,
}

/// Everything `ficco info` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemInfo {
    pub libraries: Libraries,
    /// cuDriverGetVersion, e.g. 13000.
    pub driver_version: Option<i32>,
    pub nccl_version: Option<i32>,
    pub cublaslt_version: Option<usize>,
    pub nvrtc_version: Option<(i32, i32)>,
    pub gpus: Vec<GpuInfo>,
    pub peers: Vec<PeerLink>,
    /// Why GPUs could not be listed, if so (e.g. the driver is missing).
    pub error: Option<String>,
}

/// Initialises the driver and returns the device count; a missing driver or no
/// device is a typed error.
pub(crate) fn device_count() -> Result<usize> {
    crate::loader::require_driver()?;
    cu::init_and_count()
}

fn gpu(ordinal: usize) -> Result<GpuInfo> {
    use sys::CUdevice_attribute as A;
    let dev = cu::device(ordinal)?;
    let attr = |a| cu::device_attribute(dev, a);
    let ctx = cudarc::driver::CudaContext::new(ordinal)
        .map_err(crate::error::drv("cuDevicePrimaryCtxRetain"))?;
    ctx.bind_to_thread()
        .map_err(crate::error::drv("cuCtxSetCurrent"))?;
    let priority_range = cu::stream_priority_range()?;
    drop(ctx);
    Ok(GpuInfo {
        ordinal,
        name: cu::device_name(dev)?,
        compute_capability: (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sms: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize,
        memory_bytes: cu::device_total_mem(dev)?,
        copy_engines: attr(A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)? as usize,
        l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
        shared_mem_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?
            as usize,
        priority_range,
    })
}

fn peer(from: usize, to: usize) -> Result<PeerLink> {
    use sys::CUdevice_P2PAttribute as P;
    let get = |a: P| cu::p2p_attribute(from, to, a);
    Ok(PeerLink {
        from,
        to,
        access: cu::can_access_peer(from as i32, to as i32)?,
        native_atomics: get(P::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
        perf_rank: get(P::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
    })
}

/// The machine description. Never panics: a missing or unusable library,
/// or no GPU, is reported in `libraries` / `error`. Versions are those the
/// libraries report, whether or not ficco can use them.
///
/// Gathered once per process, then copied: reading a GPU's stream
/// priorities takes a context on it, and where no other holds one that
/// context is created and destroyed again, a fraction of a second per GPU.
/// Every backend open and every tuning-cache lookup asks; on 4 GPUs a rank
/// of a job paid for three other GPUs' contexts each time. The machine
/// does not change under a running process (libraries load once).
pub fn info() -> SystemInfo {
    static INFO: std::sync::OnceLock<SystemInfo> = std::sync::OnceLock::new();
    INFO.get_or_init(gather).clone()
}

fn gather() -> SystemInfo {
    let libraries = Libraries::probe();
    let raw = |l: &LibStatus| l.version.as_ref().map(|v| v.raw);
    let mut out = SystemInfo {
        driver_version: raw(&libraries.cuda).map(|v| v as i32),
        nccl_version: raw(&libraries.nccl).map(|v| v as i32),
        cublaslt_version: raw(&libraries.cublaslt).map(|v| v as usize),
        nvrtc_version: libraries
            .nvrtc
            .version
            .as_ref()
            .map(|v| (v.major as i32, v.minor as i32)),
        libraries,
        gpus: vec![],
        peers: vec![],
        error: None,
    };
    let res = (|| -> Result<()> {
        let n = device_count()?;
        for i in 0..n {
            out.gpus.push(gpu(i)?);
        }
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    out.peers.push(peer(i, j)?);
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = res {
        out.error = Some(e.to_string());
    }
    out
}

/// One library's row: name, state, then the version and file, the reason
/// it cannot be used, or how many file names were tried.
fn library_row(l: &LibStatus) -> String {
    let state = match (&l.problem, l.usable) {
        (_, true) => "ok",
        (Some(LibProblem::NotFound) | None, false) => "missing",
        (Some(_), false) => "UNUSABLE",
    };
    let what = match &l.problem {
        None => format!(
            "{:<7} {}",
            l.version
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            l.path.as_deref().unwrap_or("-")
        ),
        Some(LibProblem::NotFound) => {
            format!("not found ({} file names tried)", l.searched.len())
        }
        Some(p) => p.to_string(),
    };
    let note = l
        .note
        .as_ref()
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    format!("{:<9} {state:<8}  {what}{note}", l.name)
}

impl fmt::Display for SystemInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# libraries")?;
        for l in self.libraries.all() {
            writeln!(f, "{}", library_row(l))?;
            // `{:#}` adds the file names tried for each library not usable.
            if f.alternate() && !l.usable {
                writeln!(f, "{:<9} tried {}", "", l.searched.join(", "))?;
            }
        }
        if let Some(e) = &self.error {
            writeln!(f, "# no GPUs: {e}")?;
            return Ok(());
        }
        writeln!(f, "# gpus")?;
        writeln!(
            f,
            "{:>3}  {:<24} {:>5} {:>5} {:>9} {:>4} {:>7} {:>9}",
            "id", "name", "cc", "SMs", "mem GiB", "CEs", "L2 MiB", "prio"
        )?;
        for g in &self.gpus {
            writeln!(
                f,
                "{:>3}  {:<24} {:>5} {:>5} {:>9.1} {:>4} {:>7} {:>9}",
                g.ordinal,
                g.name,
                format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
                g.sms,
                g.memory_bytes as f64 / (1u64 << 30) as f64,
                g.copy_engines,
                g.l2_bytes >> 20,
                format!("{}..{}", g.priority_range.0, g.priority_range.1),
            )?;
        }
        if !self.gpus.is_empty() {
            writeln!(
                f,
                "# peer access (P = peer access, A = + native atomics, i.e. NVLink-class)"
            )?;
            write!(f, "    ")?;
            for j in 0..self.gpus.len() {
                write!(f, "{j:>3}")?;
            }
            writeln!(f)?;
            for i in 0..self.gpus.len() {
                write!(f, "{i:>3} ")?;
                for j in 0..self.gpus.len() {
                    let c = match self.peers.iter().find(|p| p.from == i && p.to == j) {
                        None => "X",
                        Some(p) if p.access && p.native_atomics => "A",
                        Some(p) if p.access => "P",
                        Some(_) => "-",
                    };
                    write!(f, "{c:>3}")?;
                }
                writeln!(f)?;
            }
        }
        Ok(())
    }
}

/// The identity a tuning-cache entry is recorded under: the device of
/// `gpus` GPUs ("4x NVIDIA H200") and "ficco VERSION; driver D; nccl N;
/// cublaslt C"; `None` when fewer GPUs are visible.
pub fn device_and_software(gpus: usize) -> Option<(String, String)> {
    let info = info();
    let name = info.gpus.first()?.name.clone();
    if info.gpus.len() < gpus {
        return None;
    }
    let v = |x: Option<String>| x.unwrap_or_else(|| "none".into());
    let software = format!(
        "ficco {}; driver {}; nccl {}; cublaslt {}",
        env!("CARGO_PKG_VERSION"),
        v(info.driver_version.map(|x| x.to_string())),
        v(info.nccl_version.map(|x| x.to_string())),
        v(info.cublaslt_version.map(|x| x.to_string())),
    );
    Some((format!("{gpus}x {name}"), software))
}

#[cfg(test)]
mod tests {
    #[test]
    fn info_never_panics() {
        let i = super::info();
        let s = i.to_string();
        assert!(s.contains("# libraries"));
        assert!(serde_json::to_string(&i).is_ok());
    }
}
