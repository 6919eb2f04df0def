//! cuBLASLt calls: handle, matmul and layout descriptors, heuristics, matmul.
//!
//! Results become [`CudaError::Cublas`] naming the call. Calls that take a
//! handle, a descriptor or device memory are `unsafe`: the handle and
//! descriptors must be live and the memory must hold what they describe.

use super::DevicePtr;
use crate::error::{blas, CudaError, Result};
use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::sys::CUstream;
use std::ffi::c_void;

pub(crate) type Handle = sys::cublasLtHandle_t;
pub(crate) type MatmulDesc = sys::cublasLtMatmulDesc_t;
pub(crate) type Layout = sys::cublasLtMatrixLayout_t;
pub(crate) type Algo = sys::cublasLtMatmulAlgo_t;

/// A handle on the current device.
pub(crate) fn create_handle() -> Result<Handle> {
    lt::create_handle().map_err(blas("cublasLtCreate"))
}

/// Destroys a handle.
///
/// # Safety
/// `h` is destroyed once and not used after.
pub(crate) unsafe fn destroy_handle(h: Handle) {
    let _ = lt::destroy_handle(h);
}

/// `CUBLAS_OP_T` (cublasOperation_t; not in cudarc's cuBLASLt bindings).
const OP_T: i32 = 1;

/// A bf16-in, f32-compute matmul descriptor, with `CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`
/// when `sm_target` is given, and cuBLASLt's A read transposed with `trans_a`.
pub(crate) fn matmul_desc(sm_target: Option<i32>, trans_a: bool) -> Result<MatmulDesc> {
    let desc = lt::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    )
    .map_err(blas("cublasLtMatmulDescCreate"))?;
    if trans_a {
        // SAFETY: desc is live; the attribute is an int32 read during the call.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &OP_T as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
            .map_err(blas("cublasLtMatmulDescSetAttribute(TRANSA)"))?;
        }
    }
    if let Some(v) = sm_target {
        // SAFETY: desc is live; the attribute is an int32 read during the call.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                &v as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
            .map_err(blas("cublasLtMatmulDescSetAttribute(SM_COUNT_TARGET)"))?;
        }
    }
    Ok(desc)
}

/// A column-major bf16 layout of `rows` × `cols` at leading dimension `ld`.
pub(crate) fn layout_bf16(rows: u64, cols: u64, ld: i64, what: &'static str) -> Result<Layout> {
    lt::create_matrix_layout(sys::cudaDataType::CUDA_R_16BF, rows, cols, ld).map_err(blas(what))
}

/// Up to `max` heuristic algorithms for D = A·B + C (C and D share `c`)
/// within `workspace_bytes` of workspace, best first; those whose state is
/// not success are dropped.
///
/// # Safety
/// The handle and descriptors are live.
pub(crate) unsafe fn heuristics(
    handle: Handle,
    desc: MatmulDesc,
    a: Layout,
    b: Layout,
    c: Layout,
    max: usize,
    workspace_bytes: u64,
) -> Result<Vec<Algo>> {
    let pref = lt::create_matmul_pref().map_err(blas("cublasLtMatmulPreferenceCreate"))?;
    let set = lt::set_matmul_pref_attribute(
        pref,
        sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        &workspace_bytes as *const u64 as *const c_void,
        std::mem::size_of::<u64>(),
    );
    if let Err(e) = set {
        let _ = lt::destroy_matmul_pref(pref);
        return Err(CudaError::Cublas {
            call: "cublasLtMatmulPreferenceSetAttribute",
            code: e.0,
        });
    }
    let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); max];
    let mut count = 0;
    let status = sys::cublasLtMatmulAlgoGetHeuristic(
        handle,
        desc,
        a,
        b,
        c,
        c,
        pref,
        max as i32,
        results.as_mut_ptr(),
        &mut count,
    );
    let _ = lt::destroy_matmul_pref(pref);
    status
        .result()
        .map_err(blas("cublasLtMatmulAlgoGetHeuristic"))?;
    results.truncate(count.max(0) as usize);
    Ok(results
        .iter()
        .filter(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
        .map(|h| h.algo)
        .collect())
}

/// The code cuBLASLt uses for "no algorithm".
pub(crate) const NOT_SUPPORTED: sys::cublasStatus_t =
    sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED;

/// D = alpha · A·B + beta · C with D = C (in place), enqueued on `stream`.
///
/// # Safety
/// Handle, descriptor, layouts and algorithm are live and match; the
/// pointers hold the matrices the layouts describe on the handle's device;
/// `workspace` holds `workspace_bytes` and is used by no other stream meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul(
    handle: Handle,
    desc: MatmulDesc,
    beta: f32,
    a: (DevicePtr, Layout),
    b: (DevicePtr, Layout),
    c: (DevicePtr, Layout),
    algo: &Algo,
    workspace: DevicePtr,
    workspace_bytes: usize,
    stream: CUstream,
) -> Result<()> {
    let alpha = 1.0f32;
    lt::matmul(
        handle,
        desc,
        &alpha as *const f32 as *const c_void,
        &beta as *const f32 as *const c_void,
        a.0.raw() as *const c_void,
        a.1,
        b.0.raw() as *const c_void,
        b.1,
        c.0.raw() as *const c_void,
        c.1,
        c.0.raw() as *mut c_void,
        c.1,
        algo,
        workspace.raw() as *mut c_void,
        workspace_bytes,
        stream as sys::cudaStream_t,
    )
    .map_err(blas("cublasLtMatmul"))
}

/// Destroys a layout.
///
/// # Safety
/// Destroyed once, not used after.
pub(crate) unsafe fn destroy_layout(l: Layout) {
    let _ = lt::destroy_matrix_layout(l);
}

/// Destroys a matmul descriptor.
///
/// # Safety
/// Destroyed once, not used after.
pub(crate) unsafe fn destroy_desc(d: MatmulDesc) {
    let _ = lt::destroy_matmul_desc(d);
}
