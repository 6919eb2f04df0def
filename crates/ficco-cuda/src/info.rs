//! What the machine has: GPUs, SMs, memory, copy engines, the peer matrix and
//! library versions. Serializable, and `Display` prints a small table.

use crate::error::{check, CudaError, Result};
use crate::loader::Libraries;
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

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer and device handle.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, a, dev)
    })?;
    Ok(v)
}

/// Initialises the driver and returns the device count; a missing driver or no
/// device is a typed error.
pub(crate) fn device_count() -> Result<usize> {
    crate::loader::require_driver()?;
    // SAFETY: the driver library is present (checked above).
    let r = unsafe { sys::cuInit(0) };
    if r == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return Err(CudaError::NoGpu("cuInit: CUDA_ERROR_NO_DEVICE".into()));
    }
    check("cuInit", r)?;
    let mut n = 0;
    // SAFETY: valid out-pointer after cuInit.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    if n <= 0 {
        return Err(CudaError::NoGpu("cuDeviceGetCount returned 0".into()));
    }
    Ok(n as usize)
}

fn gpu(ordinal: usize) -> Result<GpuInfo> {
    use sys::CUdevice_attribute as A;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-pointer; ordinal < device count.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    })?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: buffer of the given length.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)
    })?;
    let bytes: Vec<u8> = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let mut mem = 0usize;
    // SAFETY: out-pointer.
    check("cuDeviceTotalMem", unsafe {
        sys::cuDeviceTotalMem_v2(&mut mem, dev)
    })?;
    let ctx = cudarc::driver::CudaContext::new(ordinal)
        .map_err(crate::error::drv("cuDevicePrimaryCtxRetain"))?;
    ctx.bind_to_thread()
        .map_err(crate::error::drv("cuCtxSetCurrent"))?;
    let priority_range = cudarc::driver::result::stream::get_priority_range()
        .map_err(crate::error::drv("cuCtxGetStreamPriorityRange"))?;
    drop(ctx);
    Ok(GpuInfo {
        ordinal,
        name: String::from_utf8_lossy(&bytes).into_owned(),
        compute_capability: (
            attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sms: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize,
        memory_bytes: mem,
        copy_engines: attr(dev, A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)? as usize,
        l2_bytes: attr(dev, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
        shared_mem_per_sm: attr(
            dev,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )? as usize,
        priority_range,
    })
}

fn peer(from: usize, to: usize) -> Result<PeerLink> {
    use sys::CUdevice_P2PAttribute as P;
    let get = |a: P| -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer; ordinals are devices (CUdevice == ordinal).
        check("cuDeviceGetP2PAttribute", unsafe {
            sys::cuDeviceGetP2PAttribute(&mut v, a, from as i32, to as i32)
        })?;
        Ok(v)
    };
    Ok(PeerLink {
        from,
        to,
        access: crate::mem::can_access_peer(from as i32, to as i32)?,
        native_atomics: get(P::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
        perf_rank: get(P::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
    })
}

/// Gathers the machine description. Never panics: a missing library or GPU is
/// reported in `libraries` / `error`, and versions of libraries not found are `None`.
pub fn info() -> SystemInfo {
    let libraries = Libraries::probe();
    let mut out = SystemInfo {
        libraries: libraries.clone(),
        driver_version: None,
        nccl_version: None,
        cublaslt_version: None,
        nvrtc_version: None,
        gpus: vec![],
        peers: vec![],
        error: None,
    };
    if libraries.nccl.found {
        out.nccl_version = cudarc::nccl::result::get_nccl_version().ok();
    }
    if libraries.cublaslt.found {
        // SAFETY: the library is present; the call takes no arguments.
        out.cublaslt_version = Some(unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() });
    }
    if libraries.nvrtc.found {
        let (mut a, mut b) = (0, 0);
        // SAFETY: out-pointers; library present.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
        if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            out.nvrtc_version = Some((a, b));
        }
    }
    let res = (|| -> Result<()> {
        let n = device_count()?;
        let mut v = 0;
        // SAFETY: out-pointer, driver initialised.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut v)
        })?;
        out.driver_version = Some(v);
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

fn ver(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

impl fmt::Display for SystemInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# libraries")?;
        for l in self.libraries.all() {
            writeln!(
                f,
                "{:<9} {}{}",
                l.name,
                if l.found { "found" } else { "MISSING" },
                l.note
                    .as_ref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default()
            )?;
        }
        writeln!(
            f,
            "driver {}  NCCL {}  cuBLASLt {}  NVRTC {}",
            ver(self
                .driver_version
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))),
            ver(self.nccl_version.map(|v| format!(
                "{}.{}.{}",
                v / 10000,
                (v / 100) % 100,
                v % 100
            ))),
            ver(self.cublaslt_version.map(|v| v.to_string())),
            ver(self.nvrtc_version.map(|(a, b)| format!("{a}.{b}"))),
        )?;
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
