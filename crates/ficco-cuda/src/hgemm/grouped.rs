//! The grouped mode of ficco's own GEMM: many GEMMs of one K and N (the
//! experts of a mixture-of-experts layer: each group g its own A rows
//! `m_g × K`, B `K × N` and C `m_g × N`, with their own leading dimensions)
//! in ONE persistent launch, instead of one launch (or one cuBLASLt call)
//! per group.
//!
//! # The table
//! [`HopperGemm::prepare_grouped`] encodes each group's A, B and C tensor
//! maps on the host exactly as [`HopperGemm::launch`] does for one GEMM
//! (A boxes of 64 × 128 rows over the group's `m_g` rows, so rows past the
//! group read zeros and C stores past it are clipped: a tile never touches
//! the next group's rows), and copies into one device buffer:
//!
//! | offset | what |
//! |---|---|
//! | 0 | G × 3 tensor maps (A, B, C of group g at `384 g`), 128 bytes each |
//! | `384 G` | G + 1 u32: the first global tile of each group, then the total |
//!
//! The kernel entries `ficco_hgemm_n256_grouped` / `ficco_hgemm_n128_grouped`
//! take the table's address as a `GroupTable` launch parameter
//! (`GroupTableParams`). Their persistent CTAs walk the global tile list
//! round-robin, as the plain kernel walks one GEMM's tiles, and map a tile to
//! its group by a forward scan over the prefix sums: every tile costs the
//! same (same K, same tile), so CTAs balance across groups of any size, a
//! heavily skewed routing included. Empty groups have no tiles (their maps
//! stay zero and are never read). Before its first TMA use of a group's maps
//! a thread acquires them for the tensormap proxy (`fence.proxy.tensormap`,
//! as the CUDA programming guide asks of maps written by the host).
//!
//! # What it supports
//! K and N multiples of 8 (shared by the groups), every A, B and C 16-byte
//! aligned with leading dimensions multiples of 8 (C must be a tensor map:
//! the grouped mode has only the TMA-store epilogue), no accumulate, no
//! hooks, no K split; the tile is 128 × 256 or 128 × 128 ([`grouped_tile`]),
//! the SM budget optional. [`grouped_supported`] says whether a set of
//! groups qualifies; the executor keeps its cuBLASLt loop otherwise.

use super::launch::{tensor_map, KernelParams, TensorMap};
use super::load::HopperGemm;
use super::params::{smem_bytes, Bf16, TileN, TypedPtr, BLOCK_K, BLOCK_M, GROUP_M, MIN_STAGES};
use super::schedule::estimate_us;
use super::validate::bad;
use crate::driver::hopper::zeroed_tensor_map;
use crate::error::{drv, Result};
use crate::mem::DeviceBuffer;
use cudarc::driver::sys;
use std::ffi::c_void;

/// One group: `c = a · b` over `m` rows (K and N are the launch's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Group {
    /// Rows of A and C; 0 is an empty group (nothing computed).
    pub m: usize,
    pub a: TypedPtr<Bf16>,
    pub lda: usize,
    pub b: TypedPtr<Bf16>,
    pub ldb: usize,
    pub c: TypedPtr<Bf16>,
    pub ldc: usize,
}

/// A grouped GEMM: every group's `c = a · b`, one K and N.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupedArgs {
    pub n: usize,
    pub k: usize,
    pub groups: Vec<Group>,
    /// At most this many persistent CTAs (default: one per SM).
    pub sm_budget: Option<u32>,
    /// The tile; `None` picks by the wave model ([`grouped_tile`]).
    pub tile_n: Option<TileN>,
}

/// The launch geometry of a [`GroupedArgs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedShape {
    pub tile_n: TileN,
    /// M-blocks of all groups together.
    pub m_blocks: u32,
    pub tiles_n: u32,
    /// Tiles of all groups together (`m_blocks × tiles_n`).
    pub tiles: u32,
    pub grid: u32,
    pub stages: u32,
    pub dyn_smem: u32,
}

/// Launch parameter of the grouped entries; mirrors `struct GroupTable` in
/// `hgemm.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GroupTableParams {
    maps: u64,
    first: u64,
    groups: u32,
    pad: u32,
}

/// Bytes of one group's three tensor maps in the table.
pub const GROUP_MAP_BYTES: usize = 3 * 128;

/// Whether the grouped mode can run these groups (see the module doc); the
/// reason when it cannot.
pub fn grouped_supported(n: usize, k: usize, groups: &[Group]) -> std::result::Result<(), String> {
    let lim = i32::MAX as usize;
    if n == 0 || k == 0 || n % 8 != 0 || k % 8 != 0 || n > lim || k > lim {
        return Err(format!(
            "N and K must be positive multiples of 8 below 2^31 (N={n}, K={k})"
        ));
    }
    if groups.is_empty() {
        return Err("no groups".into());
    }
    for (i, g) in groups.iter().enumerate() {
        if g.m > lim {
            return Err(format!("group {i}: {} rows exceed 2^31", g.m));
        }
        if g.m == 0 {
            continue;
        }
        let ld_ok = |ld: usize, min: usize| ld >= min && ld % 8 == 0;
        if !ld_ok(g.lda, k) || !ld_ok(g.ldb, n) || !ld_ok(g.ldc, n) {
            return Err(format!(
                "group {i}: leading dimensions must be multiples of 8 and cover the rows (lda={}, ldb={}, ldc={})",
                g.lda, g.ldb, g.ldc
            ));
        }
        if g.a.addr() % 16 != 0 || g.b.addr() % 16 != 0 || g.c.addr() % 16 != 0 {
            return Err(format!("group {i}: A, B and C must be 16-byte aligned"));
        }
    }
    Ok(())
}

/// The tile for groups of `rows` on `grid` CTAs: the wide tile unless the
/// narrow one wins [`estimate_us`]'s wave model by 3% (as
/// [`super::auto_schedule`], without a K split).
pub fn grouped_tile(rows: &[usize], n: usize, k: usize, grid: u32) -> TileN {
    let m_blocks: u64 = rows.iter().map(|&m| m.div_ceil(BLOCK_M) as u64).sum();
    let kb = k.div_ceil(BLOCK_K).max(1) as u64;
    let est = |t: TileN| {
        let tiles = m_blocks * n.div_ceil(t.cols()) as u64;
        estimate_us(t, tiles, kb, 1, grid as u64)
    };
    if est(TileN::N128) < 0.97 * est(TileN::N256) {
        TileN::N128
    } else {
        TileN::N256
    }
}

/// Checks `a` and returns its geometry (no device work).
pub(super) fn grouped_shape(a: &GroupedArgs, max_smem: u32, sms: u32) -> Result<GroupedShape> {
    grouped_supported(a.n, a.k, &a.groups).map_err(|e| bad(format!("grouped: {e}")))?;
    let budget = match a.sm_budget {
        Some(0) => return Err(bad("grouped: sm_budget must be at least 1".into())),
        Some(s) => s,
        None => sms,
    };
    let rows: Vec<usize> = a.groups.iter().map(|g| g.m).collect();
    let tile = a
        .tile_n
        .unwrap_or_else(|| grouped_tile(&rows, a.n, a.k, budget));
    if !matches!(tile, TileN::N256 | TileN::N128) {
        return Err(bad(format!(
            "grouped: cooperative 128-row tiles only (N256 or N128), not {tile:?}"
        )));
    }
    // The most stages that leave room for the TMA-store staging buffer.
    let staging = tile.staging_bytes();
    let stages = (MIN_STAGES..=tile.max_stages())
        .rev()
        .find(|&st| smem_bytes(tile, st, 0) as u64 + staging as u64 <= max_smem as u64)
        .ok_or_else(|| {
            bad(format!(
                "grouped: {MIN_STAGES} stages and the staging buffer exceed the device's {max_smem} bytes of shared memory"
            ))
        })?;
    let m_blocks: u64 = rows.iter().map(|&m| m.div_ceil(BLOCK_M) as u64).sum();
    let tiles_n = a.n.div_ceil(tile.cols()) as u64;
    let tiles = m_blocks * tiles_n;
    if tiles > u32::MAX as u64 - 1 {
        return Err(bad("grouped: too many tiles".into()));
    }
    Ok(GroupedShape {
        tile_n: tile,
        m_blocks: m_blocks as u32,
        tiles_n: tiles_n as u32,
        tiles: tiles as u32,
        grid: (tiles as u32).min(budget).max(1),
        stages,
        dyn_smem: smem_bytes(tile, stages, 0) + staging,
    })
}

/// The table's host bytes (see the module doc) from each group's maps
/// (`None` for an empty group: zeros) and tile counts.
fn table_bytes(maps: &[Option<[TensorMap; 3]>], tiles: &[u32]) -> Vec<u8> {
    let g = maps.len();
    let mut out = vec![0u8; g * GROUP_MAP_BYTES + 4 * (g + 1)];
    for (i, m) in maps.iter().enumerate() {
        if let Some(m) = m {
            for (j, map) in m.iter().enumerate() {
                // SAFETY: a TensorMap is 128 plain bytes (repr(C), no padding).
                let raw = unsafe {
                    std::slice::from_raw_parts(map as *const TensorMap as *const u8, 128)
                };
                let at = i * GROUP_MAP_BYTES + 128 * j;
                out[at..at + 128].copy_from_slice(raw);
            }
        }
    }
    let mut first = 0u32;
    let base = g * GROUP_MAP_BYTES;
    for (i, t) in tiles.iter().chain(std::iter::once(&0)).enumerate() {
        out[base + 4 * i..base + 4 * i + 4].copy_from_slice(&first.to_le_bytes());
        first += t;
    }
    out
}

/// A grouped GEMM ready to launch: its table on the device and its
/// parameters. Built once (before a run), launched any number of times
/// while the operands it points to stay alive.
#[derive(Debug)]
pub struct GroupedLaunch {
    shape: GroupedShape,
    params: KernelParams,
    /// `None` when no group has rows (nothing to launch).
    table: Option<DeviceBuffer>,
    groups: u32,
}

impl GroupedLaunch {
    /// The launch geometry.
    pub fn shape(&self) -> GroupedShape {
        self.shape
    }
}

impl HopperGemm {
    /// Checks `args` and returns the grouped launch geometry (no device work).
    pub fn grouped_shape(&self, args: &GroupedArgs) -> Result<GroupedShape> {
        grouped_shape(args, self.max_smem, self.sms)
    }

    /// Encodes every group's tensor maps and copies the table to the device
    /// (synchronously: call outside a timed or captured region).
    pub fn prepare_grouped(&self, args: &GroupedArgs) -> Result<GroupedLaunch> {
        let shape = grouped_shape(args, self.max_smem, self.sms)?;
        let mut maps = Vec::with_capacity(args.groups.len());
        let mut tiles = Vec::with_capacity(args.groups.len());
        for g in &args.groups {
            if g.m == 0 {
                maps.push(None);
                tiles.push(0);
                continue;
            }
            let rows = shape.tile_n.rows() as u32;
            maps.push(Some([
                tensor_map(g.a, args.k, g.m, g.lda, 64, rows)?,
                tensor_map(g.b, args.n, args.k, g.ldb, 64, BLOCK_K as u32)?,
                tensor_map(g.c, args.n, g.m, g.ldc, 64, 64)?,
            ]));
            tiles.push(g.m.div_ceil(BLOCK_M) as u32 * shape.tiles_n);
        }
        let groups =
            u32::try_from(args.groups.len()).map_err(|_| bad("grouped: too many groups".into()))?;
        let table = if shape.tiles == 0 {
            None
        } else {
            let bytes = table_bytes(&maps, &tiles);
            let buf = DeviceBuffer::alloc(&self.ctx, bytes.len())?;
            buf.upload(&bytes)?;
            // A pageable upload may still be in flight when it returns, and
            // the launches go to streams that do not wait for it.
            self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))?;
            Some(buf)
        };
        let params = KernelParams {
            n: args.n as u32,
            k: args.k as u32,
            // The groups' M-blocks together: tiles_m × tiles_n is the tile total.
            tiles_m: shape.m_blocks,
            tiles_n: shape.tiles_n,
            stages: shape.stages,
            group_m: GROUP_M,
            splits: 1,
            tma_store: 1,
            ..KernelParams::default()
        };
        Ok(GroupedLaunch {
            shape,
            params,
            table,
            groups,
        })
    }

    /// Enqueues the grouped GEMM on `stream` (a stream of this kernel's
    /// device, any context of it).
    ///
    /// # Safety
    /// `stream` must be live; every group's A, B and C given to
    /// [`HopperGemm::prepare_grouped`] must still be device memory holding
    /// what its view describes, alive until the launch completes, and the
    /// groups' C rows must not overlap each other or any A or B.
    pub unsafe fn launch_grouped(&self, stream: sys::CUstream, g: &GroupedLaunch) -> Result<()> {
        let Some(table) = &g.table else {
            return Ok(());
        };
        let kernel = match g.shape.tile_n {
            TileN::N128 => self.kernels[4],
            _ => self.kernels[3],
        };
        let mut tp = GroupTableParams {
            maps: table.ptr().raw(),
            first: table.ptr().raw() + (g.groups as usize * GROUP_MAP_BYTES) as u64,
            groups: g.groups,
            pad: 0,
        };
        let mut p = g.params;
        // Placeholders: the grouped entries read the table's maps, not these.
        let (mut am, mut bm, mut cm) = (
            TensorMap(zeroed_tensor_map()),
            TensorMap(zeroed_tensor_map()),
            TensorMap(zeroed_tensor_map()),
        );
        let mut params: [*mut c_void; 5] = [
            &mut am as *mut TensorMap as *mut c_void,
            &mut bm as *mut TensorMap as *mut c_void,
            &mut cm as *mut TensorMap as *mut c_void,
            &mut p as *mut KernelParams as *mut c_void,
            &mut tp as *mut GroupTableParams as *mut c_void,
        ];
        self.launch_raw(
            stream,
            kernel,
            g.shape.grid,
            g.shape.dyn_smem,
            &mut params,
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(m: usize, at: u64) -> Group {
        Group {
            m,
            a: TypedPtr::new(0x10000 + at),
            lda: 2048,
            b: TypedPtr::new(0x20000 + at),
            ldb: 1536,
            c: TypedPtr::new(0x30000 + at),
            ldc: 1536,
        }
    }

    fn args(rows: &[usize]) -> GroupedArgs {
        GroupedArgs {
            n: 1536,
            k: 2048,
            groups: rows
                .iter()
                .enumerate()
                .map(|(i, &m)| group(m, 0x1000 * i as u64))
                .collect(),
            sm_budget: None,
            tile_n: Some(TileN::N256),
        }
    }

    #[test]
    fn group_table_params_match_kernel() {
        // struct GroupTable in hgemm.cu: 2 u64 then 2 u32.
        assert_eq!(std::mem::size_of::<GroupTableParams>(), 24);
        assert_eq!(std::mem::align_of::<GroupTableParams>(), 8);
        assert!(super::super::SOURCE.contains("struct GroupTable {"));
    }

    #[test]
    fn geometry_counts_every_groups_blocks() {
        // 300 rows: 3 M-blocks; 0: none; 128: 1; 129: 2. 6 tiles of 256 columns.
        let s = grouped_shape(&args(&[300, 0, 128, 129]), 232448, 132).unwrap();
        assert_eq!((s.m_blocks, s.tiles_n, s.tiles), (6, 6, 36));
        assert_eq!((s.grid, s.stages), (36, 3));
        assert_eq!(
            s.dyn_smem,
            smem_bytes(TileN::N256, 3, 0) + TileN::N256.staging_bytes()
        );
        let mut a = args(&[300, 0, 128, 129]);
        a.tile_n = Some(TileN::N128);
        let s = grouped_shape(&a, 232448, 132).unwrap();
        assert_eq!((s.tiles_n, s.tiles, s.stages), (12, 72, 6));
        a.sm_budget = Some(20);
        assert_eq!(grouped_shape(&a, 232448, 132).unwrap().grid, 20);
        // Every group empty: no tiles, still a valid shape (nothing launched).
        assert_eq!(grouped_shape(&args(&[0, 0]), 232448, 132).unwrap().tiles, 0);
    }

    #[test]
    fn refuses_what_the_grouped_kernel_cannot_do() {
        let max = 232448;
        assert!(grouped_shape(&args(&[]), max, 132).is_err());
        let mut a = args(&[64]);
        a.n = 1540;
        assert!(grouped_shape(&a, max, 132).is_err());
        let mut a = args(&[64]);
        a.groups[0].c = TypedPtr::new(0x30008);
        assert!(grouped_shape(&a, max, 132).is_err());
        let mut a = args(&[64]);
        a.groups[0].ldc = 1540;
        assert!(grouped_shape(&a, max, 132).is_err());
        let mut a = args(&[64]);
        a.groups[0].lda = 1024; // < K
        assert!(grouped_shape(&a, max, 132).is_err());
        // An empty group's views are never read: anything goes.
        let mut a = args(&[64, 0]);
        a.groups[1].a = TypedPtr::new(0x3);
        assert!(grouped_shape(&a, max, 132).is_ok());
        let mut a = args(&[64]);
        a.tile_n = Some(TileN::M64N256);
        assert!(grouped_shape(&a, max, 132).is_err());
        let mut a = args(&[64]);
        a.tile_n = Some(TileN::Pp128);
        assert!(grouped_shape(&a, max, 132).is_err());
        let mut a = args(&[64]);
        a.sm_budget = Some(0);
        assert!(grouped_shape(&a, max, 132).is_err());
        // Not enough shared memory for two stages and the staging buffer.
        assert!(grouped_shape(&args(&[64]), 100_000, 132).is_err());
    }

    #[test]
    fn table_holds_maps_then_prefix_sums() {
        // SAFETY: plain bytes.
        let mut m: TensorMap = unsafe { std::mem::zeroed() };
        // SAFETY: writing into the map's bytes.
        unsafe { *(&mut m as *mut TensorMap as *mut u8) = 7 };
        let maps = [Some([m, m, m]), None, Some([m, m, m])];
        let bytes = table_bytes(&maps, &[6, 0, 4]);
        assert_eq!(bytes.len(), 3 * 384 + 4 * 4);
        assert_eq!(bytes[0], 7);
        assert_eq!(bytes[128], 7);
        assert_eq!(bytes[384], 0, "an empty group's maps are zeros");
        assert_eq!(bytes[2 * 384 + 256], 7);
        let first: Vec<u32> = bytes[3 * 384..]
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(first, vec![0, 6, 6, 10]);
    }

    #[test]
    fn tile_choice_follows_the_wave_model() {
        // Many big groups: the wide tile.
        assert_eq!(grouped_tile(&[4096; 8], 28672, 4096, 132), TileN::N256);
        // 8 groups of 128 rows, N = 1536: 48 wide tiles (a third of a wave),
        // 96 narrow ones: the narrow tile.
        assert_eq!(grouped_tile(&[128; 8], 1536, 2048, 132), TileN::N128);
    }
}
