//! NVRTC calls: version and one CUDA C++ source to a CUBIN (and its log).
//!
//! Results become [`CudaError::Nvrtc`] naming the kernel, with the compile log.

use crate::error::{CudaError, Result};
use cudarc::nvrtc::{result as nvrtc, sys};
use std::ffi::CString;

fn err(kernel: &'static str, code: sys::nvrtcResult, log: String) -> CudaError {
    CudaError::Nvrtc { kernel, code, log }
}

/// `nvrtcVersion`, e.g. (13, 0).
pub(crate) fn version() -> Result<(i32, i32)> {
    let (mut a, mut b) = (0, 0);
    // SAFETY: valid out-pointers; callers checked that the library loads.
    let r = unsafe { sys::nvrtcVersion(&mut a, &mut b) };
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok((a, b))
    } else {
        Err(err("nvrtcVersion", r, String::new()))
    }
}

/// Compiles CUDA C++ `src` (no headers) with `options` to a CUBIN and
/// NVRTC's log (ptxas' report with `--ptxas-options=-v`; often empty); the
/// options must name a real architecture (`--gpu-architecture=sm_XY[a]`).
pub(crate) fn compile_to_cubin(
    name: &'static str,
    src: &str,
    options: &[&str],
) -> Result<(Vec<u8>, String)> {
    let csrc = CString::new(src).map_err(|e| CudaError::Plan(e.to_string()))?;
    let prog = nvrtc::create_program(&csrc, None).map_err(|e| err(name, e.0, String::new()))?;
    // SAFETY: `prog` was just created; it is used only below and destroyed
    // once at the end; the CUBIN buffer has the size NVRTC reports.
    unsafe {
        let log = || {
            nvrtc::get_program_log(prog)
                .map(|l| {
                    let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_string()
                })
                .unwrap_or_default()
        };
        let res = match nvrtc::compile_program(prog, options) {
            Err(e) => Err(err(name, e.0, log())),
            Ok(()) => {
                let mut size = 0usize;
                let r = sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    Err(err(name, r, "nvrtcGetCUBINSize".into()))
                } else {
                    let mut buf = vec![0u8; size];
                    let r = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _);
                    if r != sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(err(name, r, "nvrtcGetCUBIN".into()))
                    } else {
                        Ok((buf, log()))
                    }
                }
            }
        };
        let _ = nvrtc::destroy_program(prog);
        res
    }
}
