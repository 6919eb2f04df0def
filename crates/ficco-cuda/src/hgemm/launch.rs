//! Enqueuing the GEMM: the kernel's parameter block and tensor maps, packed
//! from a validated [`GemmArgs`] ([`HopperGemm::launch`]), the destination
//! hook's per-block maps ([`HopperGemm::dest_maps`]), and the one raw
//! launch that the plain and grouped entries share. Every driver call goes
//! through `crate::driver`.

use super::load::{named, HopperGemm};
use super::params::{Bf16, GemmArgs, TileN, TypedPtr, BLOCK_K, GROUP_M, THREADS};
use super::validate::bad;
use crate::driver::cuda as cu;
use crate::driver::hopper;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Launch parameters; mirrors `struct Params` in `hgemm.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct KernelParams {
    pub(super) c: u64,
    pub(super) ldc: u64,
    pub(super) wait_flags: u64,
    pub(super) sig_counters: u64,
    pub(super) dest_table: u64,
    pub(super) dest_ld: u64,
    pub(super) ws: u64,
    pub(super) ws_tickets: u64,
    pub(super) dest_maps: u64,
    pub(super) m: u32,
    pub(super) n: u32,
    pub(super) k: u32,
    pub(super) tiles_m: u32,
    pub(super) tiles_n: u32,
    pub(super) stages: u32,
    pub(super) tile_start: u32,
    pub(super) group_m: u32,
    pub(super) accumulate: u32,
    pub(super) wait_rows: u32,
    pub(super) wait_epoch: u32,
    pub(super) sig_rows: u32,
    pub(super) dest_rows: u32,
    pub(super) dest_add: u32,
    pub(super) splits: u32,
    pub(super) tma_store: u32,
    pub(super) sig_delay: u32,
    pub(super) dp_tiles: u32,
}

/// A CUtensorMap, passed by value as a `__grid_constant__`.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
pub(super) struct TensorMap(pub(super) sys::CUtensorMap);

/// Device tensor maps of a destination hook, from [`HopperGemm::dest_maps`];
/// alive as long as launches use [`DestMaps::ptr`].
#[derive(Debug)]
pub struct DestMaps {
    buf: crate::mem::DeviceBuffer,
}

impl DestMaps {
    /// The address for [`DestHook::maps`](super::DestHook::maps) (device memory, 256-byte aligned).
    pub fn ptr(&self) -> TypedPtr<u8> {
        TypedPtr::new(self.buf.ptr().raw())
    }
}

/// Where a destination hook's blocks go ([`HopperGemm::dest_maps`]): for
/// block b, `table[b]` (rows `ld` elements apart) or, where that entry is 0,
/// C's rows of the block (rows `ldc` apart); `rows_per_block` rows each
/// (fewer in the last) of the `m` x `n` output.
#[derive(Debug, Clone, Copy)]
pub struct DestLayout<'a> {
    pub table: &'a [u64],
    pub ld: usize,
    pub rows_per_block: u32,
    pub m: usize,
    pub n: usize,
    pub c: TypedPtr<Bf16>,
    pub ldc: usize,
}

impl HopperGemm {
    /// The tensor maps of a destination hook ([`DestHook::maps`](super::DestHook::maps))
    /// laid out as `at` says, in device memory of their own. Every
    /// destination must be 16-byte aligned with `ld` (and `ldc`) a multiple
    /// of 8, and `rows_per_block` a multiple of 64.
    pub fn dest_maps(&self, at: &DestLayout<'_>) -> Result<DestMaps> {
        let bytes = self.dest_map_bytes(at)?;
        let buf = crate::mem::DeviceBuffer::alloc(&self.ctx, bytes.len().max(128))?;
        buf.upload(&bytes)?;
        Ok(DestMaps { buf })
    }

    /// The bytes of [`HopperGemm::dest_maps`] (128 per block), for the
    /// caller to place in device memory of its own (128-byte aligned).
    pub fn dest_map_bytes(&self, at: &DestLayout<'_>) -> Result<Vec<u8>> {
        let DestLayout {
            table,
            ld,
            rows_per_block,
            m,
            n,
            c,
            ldc,
        } = *at;
        let rows = rows_per_block as usize;
        if rows == 0 || rows % 64 != 0 || table.len() < m.div_ceil(rows) {
            return Err(bad(format!(
                "dest maps: rows_per_block must be a positive multiple of 64 (got {rows}) and the table must cover the {m} rows"
            )));
        }
        let mut bytes = Vec::with_capacity(table.len() * 128);
        for (b, &dst) in table.iter().enumerate().take(m.div_ceil(rows)) {
            let (base, pitch) = if dst != 0 {
                (TypedPtr::new(dst), ld)
            } else {
                (c.add(b * rows * ldc), ldc)
            };
            if base.addr() % 16 != 0 || pitch % 8 != 0 {
                return Err(bad(format!(
                    "dest maps: block {b}'s destination must be 16-byte aligned with a leading dimension a multiple of 8"
                )));
            }
            let map = tensor_map(base, n, rows.min(m - b * rows), pitch, 64, 64)?;
            // SAFETY: TensorMap is 128 plain bytes (repr C, align 128).
            let raw =
                unsafe { std::slice::from_raw_parts(&map as *const TensorMap as *const u8, 128) };
            bytes.extend_from_slice(raw);
        }
        Ok(bytes)
    }

    /// Enqueues the GEMM on `stream` (which may belong to any context of the
    /// device, green contexts included).
    ///
    /// # Safety
    /// `stream` must be a live stream of the kernel's device. Every pointer in
    /// `args` must be device memory reachable from that device holding what the
    /// views describe (A: m rows of lda, B: k rows of ldb, C: m rows of ldc;
    /// hook arrays long enough for their blocks; destination pointers valid for
    /// their rows), alive until the launch completes. A wait hook whose flags
    /// never reach the epoch hangs the kernel.
    pub unsafe fn launch(&self, stream: sys::CUstream, args: &GemmArgs) -> Result<()> {
        self.launch_ordered(stream, args, None)
    }

    /// [`HopperGemm::launch`] that also records `launched` once every block
    /// has begun (`cu::launch_kernel`): streams that wait for it
    /// follow the launch, not the end, of a persistent GEMM.
    ///
    /// # Safety
    /// As [`HopperGemm::launch`]; `launched` is a live event of the stream's
    /// context, created without timing.
    pub unsafe fn launch_ordered(
        &self,
        stream: sys::CUstream,
        args: &GemmArgs,
        launched: Option<sys::CUevent>,
    ) -> Result<()> {
        if args.m == 0 || args.n == 0 {
            return Ok(());
        }
        // A schedule left open takes the tuned one when this shape was tuned.
        let (resolved, shape) = self.resolve(args)?;
        let args = &resolved;
        let amap = tensor_map(
            args.a,
            args.k,
            args.m,
            args.lda,
            64,
            shape.tile_n.rows() as u32,
        )?;
        let bmap = tensor_map(args.b, args.n, args.k, args.ldb, 64, BLOCK_K as u32)?;
        let kernel = match shape.tile_n {
            TileN::N256 => self.kernels[0],
            TileN::N128 => self.kernels[1],
            TileN::M64N256 => self.kernels[2],
            TileN::Pp128 => self.kernels[5],
            TileN::M64N128 => self.kernels[6],
            TileN::N256C2 => self.kernels[7],
            TileN::Pp128C2 => self.kernels[8],
        };
        let h = &args.hooks;
        let mut p = KernelParams {
            c: args.c.addr(),
            ldc: args.ldc as u64,
            m: args.m as u32,
            n: args.n as u32,
            k: args.k as u32,
            tiles_m: shape.tiles_m,
            tiles_n: shape.tiles_n,
            stages: shape.stages,
            tile_start: h.m_start_block % shape.tiles_m,
            group_m: h.group_m.unwrap_or(GROUP_M),
            accumulate: args.accumulate as u32,
            splits: shape.splits,
            dp_tiles: shape.dp_tiles,
            tma_store: if shape.tma_store {
                1
            } else if shape.staged {
                2
            } else if shape.tma_dest {
                3
            } else {
                0
            },
            ws: self.workspace.ptr().raw(),
            ws_tickets: self.tickets.ptr().raw(),
            ..KernelParams::default()
        };
        if let Some(w) = h.wait {
            p.wait_flags = w.flags.addr();
            p.wait_rows = w.rows_per_flag;
            p.wait_epoch = w.epoch;
        }
        if let Some(s) = h.signal {
            p.sig_counters = s.counters.addr();
            p.sig_rows = s.rows_per_counter;
            p.sig_delay = h.signal_delay;
        }
        if let Some(d) = h.dest {
            p.dest_maps = d.maps.map_or(0, |m| m.addr());
            p.dest_table = d.table.addr();
            p.dest_ld = d.ld as u64;
            p.dest_rows = d.rows_per_block;
            p.dest_add = d.add as u32;
        }
        // C as a tensor map (64 x 64 boxes) for the TMA-store epilogue; unused otherwise.
        let cmap = if shape.tma_store {
            tensor_map(args.c, args.n, args.m, args.ldc, 64, 64)?
        } else {
            TensorMap(hopper::zeroed_tensor_map())
        };
        let (mut am, mut bm, mut cm) = (amap, bmap, cmap);
        let mut params: [*mut c_void; 4] = [
            &mut am as *mut TensorMap as *mut c_void,
            &mut bm as *mut TensorMap as *mut c_void,
            &mut cm as *mut TensorMap as *mut c_void,
            &mut p as *mut KernelParams as *mut c_void,
        ];
        self.launch_raw(
            stream,
            kernel,
            shape.grid,
            shape.dyn_smem,
            &mut params,
            launched,
        )
    }

    /// Launches `kernel` (one of this library's) with `params` on `stream`,
    /// the stream's context made current for the call.
    ///
    /// # Safety
    /// `stream` must be live; `params` must point to the entry's parameters
    /// in order, each of its exact layout.
    pub(super) unsafe fn launch_raw(
        &self,
        stream: sys::CUstream,
        kernel: sys::CUkernel,
        grid: u32,
        dyn_smem: u32,
        params: &mut [*mut c_void],
        launched: Option<sys::CUevent>,
    ) -> Result<()> {
        cu::with_stream_ctx(stream, || {
            let f = cu::kernel_get_function(kernel)?;
            let (grid, block) = ((grid, 1, 1), (THREADS, 1, 1));
            let call = match launched {
                None => "cuLaunchKernel(ficco_hgemm)",
                Some(_) => "cuLaunchKernelEx(ficco_hgemm)",
            };
            cu::launch_kernel(f, grid, block, dyn_smem, stream, params, launched)
                .map_err(named(call))
        })
    }
}

/// A 2-D bf16 tensor map: `inner` contiguous elements per row, `outer` rows
/// `ld` elements apart, boxes of `box_inner` × `box_outer`, 128-byte swizzle,
/// zero fill out of bounds.
pub(super) fn tensor_map(
    base: TypedPtr<Bf16>,
    inner: usize,
    outer: usize,
    ld: usize,
    box_inner: u32,
    box_outer: u32,
) -> Result<TensorMap> {
    hopper::tensor_map_bf16_2d(
        crate::driver::DevicePtr(base.addr()),
        [inner as u64, outer as u64],
        (ld * 2) as u64,
        [box_inner, box_outer],
    )
    .map(TensorMap)
}
