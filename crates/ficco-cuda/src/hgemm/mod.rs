//! ficco's own Hopper (sm_90a) bf16 GEMM, compiled at run time with NVRTC,
//! with the hooks that fine-grained overlap needs.
//!
//! Semantics are those of [`crate::gemm`]: row-major `C[M,N] = A[M,K] · B[K,N]`
//! (`+ C` when accumulating), views with leading dimensions, f32 accumulation,
//! bf16 out, any M, N and K multiples of 8.
//!
//! # The kernel (`hgemm.cu`)
//! - Tile 128 × 256 × 64 ([`TileN::N256`]) or 128 × 128 × 64
//!   ([`TileN::N128`], for shapes the wide tile fills badly); [`auto_schedule`]
//!   picks the tile and the K split. A persistent grid (one CTA per SM, or fewer with
//!   [`Hooks::sm_budget`]) walks the tiles with its own scheduler: groups of
//!   [`GROUP_M`] M-blocks column by column (B stays in L2), the M order
//!   rotated to start at [`Hooks::m_start_block`].
//! - Ping-pong 128 × 128 tiles ([`TileN::Pp128`], entry
//!   `ficco_hgemm_n128_pp`): each consumer warpgroup computes whole tiles
//!   (two m64n128k16 wgmma per k16 step, 128 accumulators) and the two take
//!   the CTA's tiles in turn. Each stage is consumed by one warpgroup (its
//!   empty barrier counts one arrival), a consumer skips the other's
//!   k-blocks in the ring, and a turn barrier per warpgroup lets tile i+1's
//!   main loop start once tile i's last k-block is issued: that orders the
//!   tensor-core work and keeps every parity wait at most one phase ahead of
//!   its barrier. One warpgroup's epilogue and signal then run under the
//!   other's main loop. Every hook, no K split; the chooser takes it from
//!   [`PINGPONG_MIN_WAVES`] waves of tiles on.
//! - Clusters of 2 ([`TileN::N256C2`], [`TileN::Pp128C2`]; entries
//!   `ficco_hgemm_n256_c2`, `ficco_hgemm_n128_pp_c2`, compile-time cluster
//!   dims): the pair of CTAs takes adjacent M-blocks of one N-block, each
//!   loads half of every B stage and multicasts it to both
//!   (`cp.async.bulk.tensor...multicast::cluster`), and each consumer
//!   releases a stage on both CTAs' empty barriers. The grid is capped at
//!   the clusters resident at once (`cuOccupancyMaxActiveClusters`). No K
//!   split, no wait or signal hook: a cluster needs two free SMs of one GPC,
//!   so beside a kernel that spins on this one's signals (or on a flag) not
//!   every cluster need be resident, and one left out could wait forever.
//! - For skinny GEMMs, 64 × 128 tiles ([`TileN::M64N128`], entry
//!   `ficco_hgemm_n128_m64`): the same 64-row mode with 64 columns per
//!   warpgroup (wgmma m64n64k16), twice the tiles of the 64 × 256 one.
//! - For small M, 64 × 256 tiles ([`TileN::M64N256`], entry
//!   `ficco_hgemm_n256_m64`): 64-row A stages (40 KiB a stage, so 4 stages
//!   fit beside the staging buffer) and the two consumer warpgroups split the
//!   columns (64 × 128 each) instead of the rows; the same template with the
//!   mode off compiles the other entries unchanged. Chosen only per launch or
//!   by the tuner, never by [`auto_schedule`]; refused with the hooks that
//!   count 128-row blocks.
//! - Warpgroup 0 is the producer (`setmaxnreg.dec` to 40 registers): one
//!   thread issues TMA loads (`cp.async.bulk.tensor.2d`, 128-byte swizzle)
//!   into a ring of 2 to [`MAX_STAGES`] stages guarded by mbarriers (parity waits).
//! - Warpgroups 1 and 2 are consumers (`setmaxnreg.inc` to 232): each issues
//!   `wgmma.mma_async.m64n256k16.f32.bf16.bf16` on 64 rows of the tile with
//!   shared-memory descriptors, keeping one k-block of wgmma in flight.
//! - Epilogue: plain output (no accumulate, no destination hook, C rows
//!   16-byte aligned) goes through shared memory: bf16 into 128-byte-swizzled
//!   64 × 64 boxes (conflict-free), then one thread per warpgroup issues TMA
//!   stores and the warpgroup moves on to the next tile while they drain
//!   (the default is then 3 wide or 6 narrow stages plus the staging buffer).
//!   Otherwise accumulators go straight from registers to global memory
//!   (bf16x2 per store, bounds-checked, optional read-add).
//!
//! # Why B is read in place, not transposed
//! B is row-major `[K, N]`: N is contiguous, which wgmma calls "MN-major".
//! For 16-bit types wgmma reads MN-major B directly when its `imm-trans-b`
//! bit is 1, so TMA loads B tiles as they lie in memory: boxes of 64 columns
//! (128 bytes, one swizzle row) × 64 k-rows, four per stage for 256 columns.
//! The B descriptor is then the canonical MN-major 128-byte-swizzle layout:
//! LBO = 8 KiB between 64-column atoms, SBO = 1 KiB between groups of 8 k-rows,
//! and one k16 step advances the start address by 16 rows (2 KiB). No
//! transpose pass, no second copy of B, and a B that changes between launches
//! (a gathered or peer buffer) costs nothing extra.
//!
//! # Residues
//! TMA fills out-of-bounds elements with zeros, so M, N and K tails need no
//! special loads (zeros add nothing to the dot products); the epilogue skips
//! rows ≥ M and columns ≥ N. TMA needs 16-byte aligned A and B and leading
//! dimensions that are multiples of 8 elements.
//!
//! # Hooks ([`Hooks`]), each a launch parameter
//! 1. SM budget: at most S persistent CTAs.
//! 2. Occupancy: fewer stages and/or extra dynamic shared memory, so that a
//!    communication kernel's blocks fit beside the GEMM's on an SM.
//! 3. Tile order: the M order starts at M-block `m_start_block` and wraps.
//! 4. Input wait ([`WaitHook`]): before loading the A rows of a tile, the
//!    producer spins (`ld.acquire.sys` + `nanosleep`) until every flag word
//!    covering those rows is ≥ `epoch` (wrapping compare), then fences the
//!    async proxy. Flags are u32 words, `rows_per_flag` rows each, e.g. set
//!    by `cuStreamWriteValue32` after a copy engine lands a chunk. The first
//!    stage's B load goes out before one poll of the flags (its round trip
//!    overlaps the load); only when a flag is not set yet do the other
//!    stages' B loads go out before the spin, so flags already set cost one
//!    round trip and the pipeline fills in its usual A-and-B order.
//! 5. Output signal ([`SignalHook`]): each stored 64-row half tile adds its
//!    64-column groups inside N to `counters[b]` of every block b
//!    (`rows_per_counter` rows, all N) its rows overlap, with one
//!    `red.release.sys.global.add.u32` that publishes its stores (those to a
//!    peer through the destination hook too). So a block's counter advances by
//!    [`signal_advance`] per launch, the same for every tile shape, and has
//!    reached it exactly when all of the block is stored: a copy engine's
//!    stream waits for it with `cuStreamWaitValue32` (`GEQ` is a cyclic
//!    compare, so a counter preset to `1 - advance` reaches 1). The adds
//!    are read-modify-writes of one word, so the reader of the final value
//!    has seen every add's release. (The first design counted arrivals on
//!    an internal ticket and let the last one add 1; its GPU-scope atomic
//!    round trip cost about 1% of a one-wave launch on the kernel's tail.
//!    Without it the signal keeps no state inside the [`HopperGemm`], and
//!    any number of blocks may signal, within [`MAX_SIGNAL_ADVANCE`].)
//!    On cooperative tiles without a K split, each consumer warpgroup hands
//!    its stored (in the TMA-store modes: staged) half tile to a signal
//!    thread of the producer warpgroup through two mbarriers; that thread
//!    issues the TMA stores, waits for them and sends the signal, so the
//!    wait and the atomics never stall the warpgroup's wgmma. Ping-pong
//!    tiles signal from the warpgroup (its epilogue runs under the other's
//!    main loop); split tiles defer it into the next unit.
//! 6. Destination ([`DestHook`]): rows of block b go through `table[b]`
//!    (a device pointer, `ld` elements per row) instead of C when the entry is
//!    non-zero, optionally added to what is there (`C += A·B` into a peer's buffer).
//!    With [`DestHook::maps`] ([`HopperGemm::dest_maps`]: one tensor map per
//!    block, to its destination or C's rows) and no add, the half tiles go
//!    out as TMA stores through their block's map (mode 3 of the kernel's
//!    `tma_store`), bit-identical to the staged epilogue. The executor's tile
//!    GEMMs pass them wherever they fit (`exec::rank::dest_maps_fit`).
//!
//! # Schedule and epilogue variants
//! - Staged epilogue (the default; [`Hooks::register_epilogue`] turns it
//!   off): where the TMA-store epilogue cannot run (destination hook, C rows
//!   not 16-byte aligned) and nothing is added, the tile is staged in shared
//!   memory as for TMA stores and written back with 16-byte thread stores,
//!   full 128-byte row segments per warp, instead of 4-byte stores from the
//!   registers (mode 2 of the kernel's `tma_store`). Bit-identical, and it
//!   cut the destination hook's cost from +6.8% to +2.3% (2026-11-23).
//! - [`Hooks::signal_delay`]: with a K split, the deferred signal goes out
//!   a few k-blocks into the next unit, when its stores have drained.
//! - [`Hooks::split_tail_only`]: with a K split and at least a full wave of
//!   tiles, the full waves run whole tiles and only the last, partial
//!   wave's tiles are split (a data-parallel + split-K hybrid against wave
//!   quantization, e.g. 288 wide tiles on 132 SMs: 2 whole waves, then 24
//!   tiles split 5 ways instead of a third wave at 18% occupancy).
//!
//! `gemm-bench` times these in its hook rows, and every other tile width
//! and K split on every shape ([`tune::schedule_variants`]).
//!
//! # Autotuning ([`tune`])
//! [`HopperGemm::autotune`] times the chooser's schedule and the bench's
//! variants for one launch's shape and hooks (CUDA events, scratch
//! buffers, flags already set) and keeps the fastest in memory and on disk
//! beside the cubins (keyed by source, device name and shape). Launches
//! that leave `tile_n` and `split_k` open then take it (`Hooks::untuned`
//! keeps the chooser's). The executor tunes every own-GEMM launch of a plan
//! before the run (`exec::rank`), never during it.
//!
//! # Split-K
//! When a shape has too few tiles for the grid (chunk GEMMs of a few hundred
//! rows), each tile's K range is split ([`Hooks::split_k`], by default
//! [`auto_schedule`]): every split publishes its f32 partial to a workspace and
//! counts itself on a per-(tile, half) ticket; the last one reads all the
//! partials back in split order (so the sum does not depend on timing) and
//! runs the epilogue and the hooks. The tickets and the workspace belong to
//! the [`HopperGemm`]: its split launches must be stream-ordered.
//!
//! The kernel compiles through `crate::nvrtc`, the one NVRTC path and cubin
//! cache of the crate (in memory, and on disk keyed by a hash of the source,
//! the options, the architecture and the NVRTC version).
//!
//! # Grouped mode ([`grouped`])
//! Entries `ficco_hgemm_n256_grouped` and `ficco_hgemm_n128_grouped` (the
//! same template with a compile-time switch; the other entries compile
//! unchanged) run every group of a grouped GEMM (MoE experts: one K and N,
//! per-group rows and operands) in one persistent launch: a device table
//! holds each group's tensor maps and the prefix sums of the groups' tile
//! counts, and the CTAs walk the global tile list, so they balance across
//! groups of any size. The executor runs `GroupedGemm` tasks on it
//! (`FICCO_GROUPED=loop`: the cuBLASLt loop); `gemm-bench --grouped`
//! ([`bench::grouped`]) times it against that loop. Not yet measured on a
//! GPU; no K split, hooks or 64-row tiles in this mode.
//!
//! # Where it runs
//! Schedules with `-own`, `-smN` (hook 1) or `-occS` (hook 2, S stages) run
//! every GEMM task on it (`exec::issue`, one instance per plan stream);
//! `ficco gemm-bench` ([`bench`]) measures it beside cuBLASLt.
//!
//! # Measured (one H200, 2026-11-25; `bench/data/2026-11-25-h200-s8/`)
//! Run 3 of `gemm-bench`, the autotuned pick against the autotuned
//! cuBLASLt over the 161 whole and chunk GEMMs of `suites/llama3.toml`:
//! geomean 0.994, worst 1.131, chunk shapes together 0.982; 8192³ at
//! cuBLASLt's speed (665 TFLOP/s both; the fastest variant 695: this GPU is
//! power-capped at a median SM clock near 1.45 GHz; with the clock up, 801
//! TFLOP/s was measured on 2026-11-24). Hooks 3-6 (cooperative tile,
//! tensor-map destination, flags set) cost +1.0 to +2.3% at 8192³, +0.7 to
//! +2.4% at 2048 × 14336 × 4096 and +1.9 to +2.4% at 1024 × 4096 × 7168
//! (one tile per CTA, so the last signal is on the kernel's tail; +3.1 to
//! +3.5% with the last-arrival ticket, `bench/data/2026-11-25-h200-s7/`).
//! The cluster tiles match the single-CTA ones within a few percent either
//! way (geomean 1.014 and 1.056, 2026-11-24).
//!
//! # Not done
//! Stream-K instead of split-K for shapes of one or two M-blocks is the
//! known next step.

pub mod bench;
pub mod grouped;
pub mod tune;

use crate::driver::cuda as cu;
use crate::driver::hopper;
use crate::error::{drv, CudaError, Result};
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;

/// The kernel source, compiled by NVRTC at [`HopperGemm::load`].
pub const SOURCE: &str = include_str!("hgemm.cu");
const KERNEL_NAME: &str = "ficco_hgemm";
const ENTRY_N256: &str = "ficco_hgemm_n256";
const ENTRY_N128: &str = "ficco_hgemm_n128";
const ENTRY_M64N256: &str = "ficco_hgemm_n256_m64";
const ENTRY_N256_GROUPED: &str = "ficco_hgemm_n256_grouped";
const ENTRY_N128_GROUPED: &str = "ficco_hgemm_n128_grouped";
const ENTRY_N128_PP: &str = "ficco_hgemm_n128_pp";
const ENTRY_M64N128: &str = "ficco_hgemm_n128_m64";
const ENTRY_N256_C2: &str = "ficco_hgemm_n256_c2";
const ENTRY_N128_PP_C2: &str = "ficco_hgemm_n128_pp_c2";
/// Every entry, in the order of [`HopperGemm`]'s kernel handles.
const ENTRIES: [&str; 9] = [
    ENTRY_N256,
    ENTRY_N128,
    ENTRY_M64N256,
    ENTRY_N256_GROUPED,
    ENTRY_N128_GROUPED,
    ENTRY_N128_PP,
    ENTRY_M64N128,
    ENTRY_N256_C2,
    ENTRY_N128_PP_C2,
];
/// The architecture the kernel compiles for (wgmma, setmaxnreg: Hopper only).
const ARCH: &str = "sm_90a";

/// Rows of one output tile (one M-block).
pub const BLOCK_M: usize = 128;
/// Columns of one output tile of the wide variant ([`TileN::N256`]).
pub const BLOCK_N: usize = 256;
/// K depth of one pipeline stage.
pub const BLOCK_K: usize = 64;
/// Shared memory of one stage of the wide tile: A 128×64 + B 64×256, bf16.
pub const STAGE_BYTES: u32 = ((BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * 2) as u32;
/// Most pipeline stages of the wide tile (4 × 48 KiB fit the 227 KiB an
/// H100/H200 block may use); the narrow tile takes up to 6 × 32 KiB.
pub const MAX_STAGES: u32 = 4;
/// Fewest pipeline stages.
pub const MIN_STAGES: u32 = 2;
/// M-blocks per scheduling group.
pub const GROUP_M: u32 = 16;
/// Split-K workspace: f32 partials, 64 KiB per (tile, half tile, split).
pub const SPLIT_WORKSPACE_BYTES: usize = 64 << 20;
/// Most K splits per tile.
pub const MAX_SPLITS: u32 = 16;
/// (tile, half) ticket slots for split-K (the narrow tile's 32 KiB partials).
const MAX_SPLIT_TICKETS: usize = SPLIT_WORKSPACE_BYTES / (64 * 128 * 4);
const THREADS: u32 = 384;

/// A device address of `T`s (no ownership, no lifetime: the caller keeps the
/// memory alive for the launches that use it).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DevPtr<T> {
    addr: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}

impl<T> DevPtr<T> {
    /// Wraps a raw device address.
    pub const fn new(addr: u64) -> Self {
        DevPtr {
            addr,
            _t: PhantomData,
        }
    }
    /// The raw address.
    pub const fn addr(self) -> u64 {
        self.addr
    }
    /// The address `n` elements further.
    pub const fn add(self, n: usize) -> Self {
        Self::new(self.addr + (n * std::mem::size_of::<T>()) as u64)
    }
}

/// A bf16 element (the raw bits), the element type of GEMM operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// The output tile's width: one kernel entry point each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum TileN {
    /// 128 × 256 tiles, wgmma m64n256k16 (the fastest per tile).
    N256,
    /// 128 × 128 tiles, wgmma m64n128k16: twice the tiles, for shapes that
    /// would otherwise fill the grid badly.
    N128,
    /// 64 × 256 tiles for small M (M = 64 wastes half of a 128-row tile):
    /// the two consumer warpgroups split the columns (64 × 128 each, wgmma
    /// m64n128k16). Never picked by [`auto_schedule`] (the tuner and
    /// `gemm-bench` time it); only without the hooks that count 128-row
    /// blocks (wait, signal, destination, `m_start_block`).
    M64N256,
    /// Ping-pong 128 × 128 tiles (entry `ficco_hgemm_n128_pp`): each
    /// consumer warpgroup computes whole tiles (two m64n128k16 wgmma per
    /// k16 step), the two warpgroups taking the CTA's tiles in turn, so
    /// that one's epilogue runs under the other's main loop. For many tiles
    /// of short K, where the cooperative tiles' epilogue leaves the tensor
    /// cores idle. Every hook, no K split; [`auto_schedule`] picks it from
    /// [`PINGPONG_MIN_WAVES`] waves of tiles on, the tuner and `gemm-bench`
    /// time it on every shape.
    Pp128,
    /// 64 × 128 tiles for small M (entry `ficco_hgemm_n128_m64`): as
    /// [`TileN::M64N256`], the warpgroups 64 × 64 each (wgmma m64n64k16).
    /// Twice the tiles of the 64 × 256 one, so a skinny GEMM needs fewer K
    /// splits (and smaller partials) to fill the machine.
    M64N128,
    /// [`TileN::N256`] in clusters of 2 CTAs along M (entry
    /// `ficco_hgemm_n256_c2`): the two take adjacent M-blocks of one N-block
    /// and share its B, each loading half of every B stage and multicasting
    /// it to both (TMA multicast), so each SM reads a third less from L2.
    /// No K split and no wait or signal hook (a cluster is placed only where
    /// two SMs of one GPC are free, so residency is not guaranteed); the
    /// grid is at most the clusters that are resident at once. Picked by the
    /// tuner only.
    N256C2,
    /// [`TileN::Pp128`] in clusters of 2 (entry `ficco_hgemm_n128_pp_c2`),
    /// B shared as in [`TileN::N256C2`] (a quarter less from L2 per SM).
    Pp128C2,
}

impl TileN {
    /// Output columns per tile.
    pub const fn cols(self) -> usize {
        match self {
            TileN::N256 | TileN::M64N256 | TileN::N256C2 => 256,
            TileN::N128 | TileN::Pp128 | TileN::M64N128 | TileN::Pp128C2 => 128,
        }
    }
    /// Output rows per tile (one M-block).
    pub const fn rows(self) -> usize {
        match self {
            TileN::N256 | TileN::N128 | TileN::Pp128 | TileN::N256C2 | TileN::Pp128C2 => BLOCK_M,
            TileN::M64N256 | TileN::M64N128 => 64,
        }
    }
    /// The tile's name in tables and the tune cache: "256", "128",
    /// "64x256", "128pp", "64x128", "256c2", "128ppc2".
    pub const fn label(self) -> &'static str {
        match self {
            TileN::N256 => "256",
            TileN::N128 => "128",
            TileN::M64N256 => "64x256",
            TileN::Pp128 => "128pp",
            TileN::M64N128 => "64x128",
            TileN::N256C2 => "256c2",
            TileN::Pp128C2 => "128ppc2",
        }
    }
    /// 64-row tiles (no hook that counts 128-row blocks).
    pub const fn is_m64(self) -> bool {
        matches!(self, TileN::M64N256 | TileN::M64N128)
    }
    /// Ping-pong tiles (each consumer warpgroup a whole tile).
    pub const fn is_pingpong(self) -> bool {
        matches!(self, TileN::Pp128 | TileN::Pp128C2)
    }
    /// CTAs per cluster: 2 for the tiles that share B by multicast, else 1.
    pub const fn cluster(self) -> u32 {
        match self {
            TileN::N256C2 | TileN::Pp128C2 => 2,
            _ => 1,
        }
    }
    /// Every tile, in the order of their labels' list.
    pub const ALL: [TileN; 7] = [
        TileN::N256,
        TileN::N128,
        TileN::M64N256,
        TileN::Pp128,
        TileN::M64N128,
        TileN::N256C2,
        TileN::Pp128C2,
    ];
    /// The tile of a [`TileN::label`].
    pub fn from_label(s: &str) -> Option<TileN> {
        TileN::ALL.into_iter().find(|t| t.label() == s)
    }
    /// Whether tiles can be split along K (not ping-pong, not in clusters).
    pub const fn splits_k(self) -> bool {
        !self.is_pingpong() && self.cluster() == 1
    }
    /// Shared memory of one pipeline stage.
    pub const fn stage_bytes(self) -> u32 {
        ((self.rows() * BLOCK_K + BLOCK_K * self.cols()) * 2) as u32
    }
    /// Most stages (the default).
    pub const fn max_stages(self) -> u32 {
        match self {
            TileN::N256 | TileN::M64N256 | TileN::N256C2 => MAX_STAGES,
            TileN::N128 | TileN::Pp128 | TileN::Pp128C2 => 6,
            TileN::M64N128 => 8,
        }
    }
    /// Shared memory the TMA-store epilogue stages the tile in (bf16):
    /// one tile, or in ping-pong one tile per consumer warpgroup.
    pub const fn staging_bytes(self) -> u32 {
        let tiles = if self.is_pingpong() { 2 } else { 1 };
        (tiles * BLOCK_M * self.cols() * 2) as u32
    }
    /// Split-K partial of one half tile (64 rows, f32).
    const fn slot_bytes(self) -> usize {
        64 * self.cols() * 4
    }
    /// Most (tile, split) units the split-K workspace holds.
    const fn max_units(self) -> u64 {
        (SPLIT_WORKSPACE_BYTES / (2 * self.slot_bytes())) as u64
    }
}

/// Hook 2: pipeline depth and extra dynamic shared memory per CTA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Occupancy {
    /// Pipeline stages, [`MIN_STAGES`]..=[`TileN::max_stages`]; 0 (the
    /// default) takes the most.
    pub stages: u32,
    /// Dynamic shared memory reserved beyond what the stages need (bytes).
    pub extra_smem: u32,
}

/// Hook 4: wait for `flags[b] >= epoch` before loading A rows of flag block b.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitHook {
    /// One u32 per `rows_per_flag` rows of A (and C).
    pub flags: DevPtr<u32>,
    pub rows_per_flag: u32,
    /// Compared with wrapping arithmetic: ready when `flag - epoch` is ≥ 0 as i32.
    pub epoch: u32,
}

/// Hook 5: `counters[b]` advances by [`signal_advance`] per launch, in
/// system-scope release adds, the last one once all of output block b is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SignalHook {
    /// One u32 per `rows_per_counter` rows of C.
    pub counters: DevPtr<u32>,
    pub rows_per_counter: u32,
}

/// Hook 6: store the rows of block b through `table[b]` when that entry is non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DestHook {
    /// One device address (u64) per `rows_per_block` rows of C: where row
    /// `b * rows_per_block` of C goes; 0 keeps C.
    pub table: DevPtr<u64>,
    /// Leading dimension (elements) of every destination.
    pub ld: usize,
    pub rows_per_block: u32,
    /// Add into the destination (`dst += A·B`) instead of overwriting it.
    pub add: bool,
    /// One tensor map per block ([`HopperGemm::dest_maps`], built from the
    /// same table): without `add`, the epilogue then stores each half tile
    /// with TMA through its block's map instead of 16-byte thread stores.
    /// Needs `rows_per_block` a multiple of 64.
    pub maps: Option<DevPtr<u8>>,
}

/// Every hook of one launch; `Hooks::default()` is the plain GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Hooks {
    /// Hook 1: at most this many persistent CTAs (default: one per SM).
    pub sm_budget: Option<u32>,
    /// Hook 2.
    pub occupancy: Occupancy,
    /// Hook 3: the first M-block (of [`BLOCK_M`] rows) of the M order, which wraps.
    pub m_start_block: u32,
    /// K splits per tile (not a hook: a schedule knob). `None` picks with
    /// the tile by a wave model ([`auto_schedule`]); `Some(1)` never splits.
    pub split_k: Option<u32>,
    /// Tile width; `None` picks by the wave model.
    pub tile_n: Option<TileN>,
    /// M-blocks per scheduling group (not a hook: L2 reuse); `None` is [`GROUP_M`].
    pub group_m: Option<u32>,
    /// Epilogue variant (not a hook): where the TMA-store epilogue cannot
    /// run (a destination hook, C rows not 16-byte aligned) but nothing is
    /// added to the output, the tile is staged in shared memory too and
    /// stored with 16-byte thread stores ([`LaunchShape::staged`]; exact,
    /// and faster than 4-byte stores from the registers in `gemm-bench`).
    /// `true` turns that off: the register epilogue, for comparison.
    pub register_epilogue: bool,
    /// Launch exactly this schedule: do not apply a tuned one
    /// ([`HopperGemm::autotune`]) when `tile_n` and `split_k` are open
    /// (the chooser's pick, for comparison).
    pub untuned: bool,
    /// Signal-hook variant (not a hook), for cooperative tiles split along
    /// K (the others signal from a signal thread or, in ping-pong, under
    /// the other warpgroup's main loop): a tile's signal is sent after
    /// k-block `signal_delay` of the warpgroup's next unit is issued (0, the
    /// default: right after its first; at its last if it has fewer), so
    /// that waiting for its stores and the release fence overlap more
    /// tensor-core work. Delays the signal by about as many k-blocks (≈ 1 µs each).
    pub signal_delay: u32,
    /// Schedule variant (not a hook): with a K split and more tiles than
    /// CTAs, run the full waves' tiles whole and split only the tiles of
    /// the last, partial wave (`splits` units each), so that it fills the
    /// machine instead of leaving SMs idle. Off by default until measured.
    pub split_tail_only: bool,
    pub wait: Option<WaitHook>,
    pub signal: Option<SignalHook>,
    pub dest: Option<DestHook>,
}

/// One GEMM: `c = a · b` (or `c += a · b`), row-major views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmArgs {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: DevPtr<Bf16>,
    pub lda: usize,
    pub b: DevPtr<Bf16>,
    pub ldb: usize,
    pub c: DevPtr<Bf16>,
    pub ldc: usize,
    pub accumulate: bool,
    pub hooks: Hooks,
}

impl GemmArgs {
    /// A dense GEMM (leading dimensions k, n, n), no hooks.
    pub fn dense(
        m: usize,
        n: usize,
        k: usize,
        a: DevPtr<Bf16>,
        b: DevPtr<Bf16>,
        c: DevPtr<Bf16>,
    ) -> Self {
        GemmArgs {
            m,
            n,
            k,
            a,
            lda: k,
            b,
            ldb: n,
            c,
            ldc: n,
            accumulate: false,
            hooks: Hooks::default(),
        }
    }
}

/// Device tensor maps of a destination hook, from [`HopperGemm::dest_maps`];
/// alive as long as launches use [`DestMaps::ptr`].
#[derive(Debug)]
pub struct DestMaps {
    buf: crate::mem::DeviceBuffer,
}

impl DestMaps {
    /// The address for [`DestHook::maps`] (device memory, 256-byte aligned).
    pub fn ptr(&self) -> DevPtr<u8> {
        DevPtr::new(self.buf.ptr().raw())
    }
}

/// How the cubin was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CacheOutcome {
    /// This process had compiled or read it already (an earlier load).
    Memory,
    /// Read from the disk cache.
    Hit,
    /// Compiled, and stored in the disk cache.
    Stored,
    /// Compiled; no writable cache directory.
    Uncached,
}

/// What loading the kernel cost.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CompileInfo {
    /// Wall time to obtain the cubin (compile, or read the cache), ms.
    pub ms: f64,
    pub cache: CacheOutcome,
    pub path: Option<PathBuf>,
    /// NVRTC (major, minor).
    pub nvrtc: (i32, i32),
}

/// Launch parameters; mirrors `struct Params` in `hgemm.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct KernelParams {
    c: u64,
    ldc: u64,
    wait_flags: u64,
    sig_counters: u64,
    dest_table: u64,
    dest_ld: u64,
    ws: u64,
    ws_tickets: u64,
    dest_maps: u64,
    m: u32,
    n: u32,
    k: u32,
    tiles_m: u32,
    tiles_n: u32,
    stages: u32,
    tile_start: u32,
    group_m: u32,
    accumulate: u32,
    wait_rows: u32,
    wait_epoch: u32,
    sig_rows: u32,
    dest_rows: u32,
    dest_add: u32,
    splits: u32,
    tma_store: u32,
    sig_delay: u32,
    dp_tiles: u32,
}

/// A CUtensorMap, passed by value as a `__grid_constant__`.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
struct TensorMap(sys::CUtensorMap);

/// The launch geometry a [`GemmArgs`] leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    pub tiles_m: u32,
    pub tiles_n: u32,
    pub grid: u32,
    pub dyn_smem: u32,
    /// K splits per tile.
    pub splits: u32,
    pub tile_n: TileN,
    pub stages: u32,
    /// The epilogue goes through shared memory and TMA stores (plain
    /// output: no accumulate, no destination hook, C 16-byte aligned rows).
    pub tma_store: bool,
    /// The epilogue stages the tile in shared memory and stores it with
    /// 16-byte thread stores ([`Hooks::staged_epilogue`]); excludes `tma_store`.
    pub staged: bool,
    /// The destination hook's rows go out as TMA stores through its
    /// per-block maps ([`DestHook::maps`]); excludes the other two.
    pub tma_dest: bool,
    /// Tiles run whole before the split ones ([`Hooks::split_tail_only`]; 0: all split).
    pub dp_tiles: u32,
}

/// The loaded kernel on one device.
#[derive(Debug)]
pub struct HopperGemm {
    lib: sys::CUlibrary,
    /// One per entry of [`ENTRIES`], in its order.
    kernels: [sys::CUkernel; 9],
    /// Clusters of 2 CTAs that can be resident at once (0: the device cannot
    /// run the cluster entries): the most a cluster tile's grid uses.
    max_clusters: u32,
    ctx: Arc<CudaContext>,
    sms: u32,
    max_smem: u32,
    tickets: crate::mem::DeviceBuffer,
    workspace: crate::mem::DeviceBuffer,
    compile: CompileInfo,
    /// Schedules [`HopperGemm::autotune`] picked, per shape.
    tuned: std::sync::Mutex<std::collections::HashMap<tune::TuneKey, tune::Schedule>>,
    /// Shapes timed by this instance (the rest came from memory or disk).
    timings: std::sync::atomic::AtomicU64,
}

// SAFETY: library and kernel handles are context-independent driver objects;
// the ticket buffer is plain device memory.
unsafe impl Send for HopperGemm {}
// SAFETY: as above; launches only read `self`.
unsafe impl Sync for HopperGemm {}

impl Drop for HopperGemm {
    fn drop(&mut self) {
        // SAFETY: loaded once, unloaded once; no kernel of it is used after.
        unsafe { cu::library_unload(self.lib) }
    }
}

/// Names the call of a failed driver wrapper as hgemm did before it used
/// them (e.g. `cuLaunchKernel(ficco_hgemm)`), so the error says which kernel.
fn named(call: &'static str) -> impl Fn(CudaError) -> CudaError {
    move |e| match e {
        CudaError::Driver { code, .. } => CudaError::Driver { call, code },
        e => e,
    }
}

impl HopperGemm {
    /// Compiles (or reads from the disk cache) and loads the kernel on `ctx`'s
    /// device, which must be compute capability 9.0 (Hopper).
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute(compute capability)"))?;
        if (major, minor) != (9, 0) {
            return Err(CudaError::Plan(format!(
                "ficco's Hopper GEMM needs compute capability 9.0 (sm_90a), found {major}.{minor}"
            )));
        }
        let (cubin, compile) = cubin_cached()?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let lib = cu::library_load_data(&cubin)?;
        let sms = crate::controls::device_attribute(
            ctx,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?
        .max(1) as u32;
        let max_smem = crate::controls::device_attribute(
            ctx,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?
        .max(0) as u32;
        let tickets = crate::mem::DeviceBuffer::alloc(ctx, MAX_SPLIT_TICKETS * 4)?;
        let workspace = crate::mem::DeviceBuffer::alloc(ctx, SPLIT_WORKSPACE_BYTES)?;
        let mut g = HopperGemm {
            lib,
            kernels: [std::ptr::null_mut(); 9],
            max_clusters: 0,
            ctx: ctx.clone(),
            sms,
            max_smem,
            tickets,
            workspace,
            compile,
            tuned: Default::default(),
            timings: Default::default(),
        };
        for (i, entry) in ENTRIES.into_iter().enumerate() {
            let name = CString::new(entry).map_err(|e| CudaError::Plan(e.to_string()))?;
            // SAFETY: the library is loaded until `g` drops; its kernels are
            // used only while it lives.
            unsafe {
                g.kernels[i] = cu::library_get_kernel(g.lib, &name)?;
                cu::kernel_set_attribute(
                    g.kernels[i],
                    ctx.cu_device(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    max_smem as i32,
                )
                .map_err(named("cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"))?;
                // Load into the primary context now (lazy loading mid-plan can deadlock).
                cu::kernel_get_function(g.kernels[i])?;
            }
        }
        g.max_clusters = g.resident_clusters();
        // SAFETY: the ticket buffer holds this many u32; its context is current.
        unsafe { cu::memset_d32(g.tickets.ptr(), 0, MAX_SPLIT_TICKETS)? };
        Ok(g)
    }

    /// How many clusters of 2 of the cluster entries fit on the device at
    /// once with the most shared memory (one CTA per SM: the registers allow
    /// no more; a cluster's two CTAs must share a GPC, so this can be fewer
    /// than half the SMs). 0 where the driver cannot say: the cluster tiles
    /// are then refused.
    fn resident_clusters(&self) -> u32 {
        let smem = smem_bytes(TileN::N256C2, TileN::N256C2.max_stages(), 0)
            + TileN::N256C2.staging_bytes();
        let mut least = u32::MAX;
        for kernel in [self.kernels[7], self.kernels[8]] {
            // SAFETY: a kernel of the loaded library; its function is taken
            // in the current context (bound by `load`).
            let n = unsafe {
                cu::kernel_get_function(kernel).and_then(|f| {
                    hopper::occupancy_max_active_clusters(
                        f,
                        2 * self.sms,
                        THREADS,
                        smem.min(self.max_smem),
                    )
                })
            };
            least = least.min(n.unwrap_or(0));
        }
        least.min(self.sms / 2)
    }

    /// How the cubin was obtained and what it cost.
    pub fn compile_info(&self) -> &CompileInfo {
        &self.compile
    }

    /// The device's SM count (the default grid).
    pub fn sms(&self) -> u32 {
        self.sms
    }

    /// Clusters of 2 CTAs resident at once: the most a cluster tile's grid
    /// uses ([`TileN::N256C2`], [`TileN::Pp128C2`]; 0: refused).
    pub fn max_clusters(&self) -> u32 {
        self.max_clusters
    }

    /// The context the kernel was loaded from.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Largest `extra_smem` that fits beside `stages` stages of `tile`.
    pub fn max_extra_smem(&self, tile: TileN, stages: u32) -> u32 {
        self.max_smem.saturating_sub(smem_bytes(tile, stages, 0))
    }

    /// Checks `args` and returns the launch geometry (no device work), with
    /// the tuned schedule where [`HopperGemm::launch`] would take it.
    pub fn shape(&self, args: &GemmArgs) -> Result<LaunchShape> {
        self.resolve(args).map(|(_, shape)| shape)
    }

    /// What [`validate`] checks a launch against on this device.
    fn limits(&self) -> Limits {
        Limits {
            max_smem: self.max_smem,
            sms: self.sms,
            max_clusters: self.max_clusters,
        }
    }

    /// `args` with the tuned schedule of its shape when it leaves the
    /// schedule open (no `tile_n`, no `split_k`, not `untuned`) and
    /// [`HopperGemm::autotune`] has one, and the launch geometry: validated
    /// once, here.
    fn resolve(&self, args: &GemmArgs) -> Result<(GemmArgs, LaunchShape)> {
        let h = &args.hooks;
        let open = !h.untuned && h.tile_n.is_none() && h.split_k.is_none();
        if let Some(s) = open.then(|| self.tuned(args)).flatten() {
            let tuned = tune::with_schedule(args, s);
            // A tuned schedule the launch cannot take (a 64-row tile with a
            // start block, which the tune key leaves out; a pick cached on
            // disk under rules since tightened) gives way to the chooser's.
            if let Ok(shape) = validate(&tuned, self.limits()) {
                return Ok((tuned, shape));
            }
        }
        Ok((*args, validate(args, self.limits())?))
    }

    /// The tensor maps of a destination hook ([`DestHook::maps`]): for block
    /// b, `table[b]` (rows `ld` elements apart) or, where that entry is 0,
    /// C's rows of the block; `rows_per_block` rows each (fewer in the last),
    /// N columns. Every destination must be 16-byte aligned with `ld` (and
    /// `ldc`) a multiple of 8, and `rows_per_block` a multiple of 64.
    #[allow(clippy::too_many_arguments)]
    pub fn dest_maps(
        &self,
        table: &[u64],
        ld: usize,
        rows_per_block: u32,
        m: usize,
        n: usize,
        c: DevPtr<Bf16>,
        ldc: usize,
    ) -> Result<DestMaps> {
        let rows = rows_per_block as usize;
        if rows == 0 || rows % 64 != 0 || table.len() < m.div_ceil(rows) {
            return Err(bad(format!(
                "dest maps: rows_per_block must be a positive multiple of 64 (got {rows}) and the table must cover the {m} rows"
            )));
        }
        let mut bytes = Vec::with_capacity(table.len() * 128);
        for (b, &dst) in table.iter().enumerate().take(m.div_ceil(rows)) {
            let (base, pitch) = if dst != 0 {
                (DevPtr::new(dst), ld)
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
        let buf = crate::mem::DeviceBuffer::alloc(&self.ctx, bytes.len().max(128))?;
        buf.upload(&bytes)?;
        Ok(DestMaps { buf })
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
        self.launch_raw(stream, kernel, shape.grid, shape.dyn_smem, &mut params)
    }

    /// Launches `kernel` (one of this library's) with `params` on `stream`,
    /// the stream's context made current for the call.
    ///
    /// # Safety
    /// `stream` must be live; `params` must point to the entry's parameters
    /// in order, each of its exact layout.
    unsafe fn launch_raw(
        &self,
        stream: sys::CUstream,
        kernel: sys::CUkernel,
        grid: u32,
        dyn_smem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        cu::with_stream_ctx(stream, || {
            let f = cu::kernel_get_function(kernel)?;
            cu::launch_kernel(f, (grid, 1, 1), (THREADS, 1, 1), dyn_smem, stream, params)
                .map_err(named("cuLaunchKernel(ficco_hgemm)"))
        })
    }
}

/// Dynamic shared memory of a configuration: 1 KiB alignment slack, the
/// stages, their barriers, two split-K flags, two ping-pong turn barriers,
/// the signal threads' four barriers and two handover slots, and the extra
/// reservation.
pub fn smem_bytes(tile: TileN, stages: u32, extra: u32) -> u32 {
    1024 + stages * tile.stage_bytes() + 16 * stages + 8 + 16 + 32 + 16 + extra
}

/// Most a signal counter may advance in one launch: waiters compare
/// cyclically (`cuStreamWaitValue32` `GEQ`, the wait hook), so any value
/// under 2^31 works; 2^30 leaves room for presets.
pub const MAX_SIGNAL_ADVANCE: u32 = 1 << 30;

/// How much one launch adds to the signal counter of block `block` of an
/// `m` × `n` output with `rows_per_counter` rows per block: the 64-row
/// groups (aligned at row 0) that overlap the block's rows, times the
/// 64-column groups of N (see [`SignalHook`]). `None` for a block past the
/// last row, or where it would not fit a u32.
pub fn signal_advance(m: usize, n: usize, rows_per_counter: usize, block: usize) -> Option<u32> {
    let lo = block.checked_mul(rows_per_counter)?;
    if rows_per_counter == 0 || lo >= m {
        return None;
    }
    let hi = lo.saturating_add(rows_per_counter).min(m) - 1;
    let groups = (hi / 64 - lo / 64 + 1).checked_mul(n.div_ceil(64))?;
    u32::try_from(groups).ok()
}

/// Estimated time (µs, on an H200) of `tiles` output tiles of `tile` with
/// `k_blocks` k-blocks each, split `splits` ways, on `grid` persistent CTAs.
/// CTAs take (tile, split) units round-robin, so time ≈ waves × (k-blocks
/// per split × k-block time + 3 µs per unit); a split adds per wave the f32
/// partial traffic through L2 (≈ 8 + 1.2 × splits µs for the wide tile,
/// fitted to measurements; half for the narrow tile).
pub fn estimate_us(tile: TileN, tiles: u64, k_blocks: u64, splits: u64, grid: u64) -> f64 {
    let (kb_us, scale) = match tile {
        TileN::N256 | TileN::N256C2 => (0.8, 1.0),
        // Same B traffic as the wide tile, half the tensor-core work (a guess
        // until measured: the tuner times it).
        TileN::N128 | TileN::M64N256 | TileN::Pp128 | TileN::Pp128C2 => (0.45, 0.5),
        TileN::M64N128 => (0.3, 0.25),
    };
    let waves = (tiles * splits).div_ceil(grid.max(1)) as f64;
    let mut t = waves * (k_blocks.div_ceil(splits) as f64 * kb_us + 3.0);
    if splits > 1 {
        t += waves * scale * (8.0 + 1.2 * splits as f64);
    }
    t
}

/// Waves of 128 × 128 tiles from which [`auto_schedule`] takes the
/// ping-pong tile: in `gemm-bench` on one H200 (2026-11-24) it beat the
/// chooser's cooperative pick on 50 of the 54 shapes with at least 20 waves
/// (geomean 0.95), and lost on about half of the shapes with fewer.
pub const PINGPONG_MIN_WAVES: u64 = 20;

/// The tile width and K splits for an M × N × K GEMM on `grid` CTAs: the
/// ping-pong tile from [`PINGPONG_MIN_WAVES`] waves on, else what
/// [`estimate_us`] finds fastest (the wide unsplit tile unless another
/// wins by 3%).
pub fn auto_schedule(m: usize, n: usize, k: usize, grid: u32) -> (TileN, u32) {
    let k_blocks = k.div_ceil(BLOCK_K).max(1) as u64;
    let tiles = |t: TileN| (m.div_ceil(BLOCK_M) * n.div_ceil(t.cols())) as u64;
    if tiles(TileN::Pp128) >= PINGPONG_MIN_WAVES * grid.max(1) as u64 {
        return (TileN::Pp128, 1);
    }
    let mut best = (
        estimate_us(TileN::N256, tiles(TileN::N256), k_blocks, 1, grid as u64),
        TileN::N256,
        1u64,
    );
    for tile in [TileN::N256, TileN::N128] {
        let t = tiles(tile);
        for s in 1..=(MAX_SPLITS as u64).min(k_blocks) {
            if s > 1 && t * s > tile.max_units() {
                break;
            }
            let c = estimate_us(tile, t, k_blocks, s, grid as u64);
            if c < best.0 * 0.97 {
                best = (c, tile, s);
            }
        }
    }
    (best.1, best.2 as u32)
}

fn bad(msg: String) -> CudaError {
    CudaError::Plan(format!("ficco hgemm: {msg}"))
}

/// What a device allows a launch ([`validate`]).
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Opt-in dynamic shared memory per CTA.
    max_smem: u32,
    sms: u32,
    /// Clusters of 2 resident at once ([`HopperGemm::resident_clusters`]).
    max_clusters: u32,
}

/// Checks every constraint the kernel relies on; returns the geometry.
fn validate(a: &GemmArgs, lim: Limits) -> Result<LaunchShape> {
    let Limits {
        max_smem,
        sms,
        max_clusters,
    } = lim;
    let lim = i32::MAX as usize;
    if a.m > lim || a.n > lim || a.k > lim {
        return Err(bad(format!(
            "dimensions {}x{}x{} exceed 2^31",
            a.m, a.n, a.k
        )));
    }
    if a.k == 0 || a.k % 8 != 0 || a.n % 8 != 0 {
        return Err(bad(format!(
            "N and K must be positive multiples of 8 (N={}, K={})",
            a.n, a.k
        )));
    }
    if a.lda < a.k || a.lda % 8 != 0 || a.ldb < a.n || a.ldb % 8 != 0 {
        return Err(bad(format!(
            "lda (>= K) and ldb (>= N) must be multiples of 8 (lda={}, ldb={})",
            a.lda, a.ldb
        )));
    }
    if a.ldc < a.n || a.ldc % 2 != 0 {
        return Err(bad(format!("ldc must be even and >= N (ldc={})", a.ldc)));
    }
    if a.a.addr() % 16 != 0 || a.b.addr() % 16 != 0 || a.c.addr() % 4 != 0 {
        return Err(bad(
            "A and B must be 16-byte aligned, C 4-byte aligned".into()
        ));
    }
    let h = &a.hooks;
    let budget = match h.sm_budget {
        Some(0) => return Err(bad("sm_budget must be at least 1".into())),
        Some(s) => s,
        None => sms,
    };
    let (auto_tile, auto_split) = auto_schedule(a.m, a.n, a.k, budget);
    let tile = h.tile_n.unwrap_or(auto_tile);
    // The plain epilogue goes through shared memory and TMA stores when C
    // can be a tensor map and nothing reads or redirects the output.
    let tma_able = !a.accumulate && h.dest.is_none() && a.c.addr() % 16 == 0 && a.ldc % 8 == 0;
    // The staged variant writes whatever the TMA path cannot, except adds
    // (they would round twice: once into the staging buffer, once after the add).
    // The destination hook with per-block maps and no add: TMA stores too.
    let tma_dest_able =
        !a.accumulate && !h.register_epilogue && h.dest.is_some_and(|d| d.maps.is_some() && !d.add);
    let staged_able = !tma_able
        && !tma_dest_able
        && !h.register_epilogue
        && !a.accumulate
        && h.dest.is_none_or(|d| !d.add);
    let stage_out = tma_able || staged_able || tma_dest_able;
    let staging = tile.staging_bytes() as u64;
    let fixed = |st: u32| smem_bytes(tile, st, 0) as u64;
    let st = if h.occupancy.stages != 0 {
        h.occupancy.stages
    } else if stage_out {
        // The most stages that still leave room for the staging buffer.
        (MIN_STAGES..=tile.max_stages())
            .rev()
            .find(|&st| fixed(st) + staging + h.occupancy.extra_smem as u64 <= max_smem as u64)
            .unwrap_or(tile.max_stages())
    } else {
        tile.max_stages()
    };
    if !(MIN_STAGES..=tile.max_stages()).contains(&st) {
        return Err(bad(format!(
            "stages must be {MIN_STAGES}..={} for {tile:?}, got {st}",
            tile.max_stages()
        )));
    }
    let staging_fits = fixed(st) + staging + h.occupancy.extra_smem as u64 <= max_smem as u64;
    let tma_store = tma_able && staging_fits;
    let staged = staged_able && staging_fits;
    let tma_dest = tma_dest_able && staging_fits;
    let dyn_smem = fixed(st)
        + if tma_store || staged || tma_dest {
            staging
        } else {
            0
        }
        + h.occupancy.extra_smem as u64;
    if dyn_smem > max_smem as u64 {
        return Err(bad(format!(
            "{st} stages + {} extra bytes need {dyn_smem} bytes of shared memory; the device allows {max_smem}",
            h.occupancy.extra_smem
        )));
    }
    if h.group_m == Some(0) {
        return Err(bad("group_m must be at least 1".into()));
    }
    if let Some(w) = h.wait {
        if w.rows_per_flag == 0 || w.flags.addr() % 4 != 0 {
            return Err(bad(
                "wait hook: rows_per_flag > 0, flags 4-byte aligned".into()
            ));
        }
    }
    if let Some(s) = h.signal {
        if s.rows_per_counter == 0 || s.counters.addr() % 4 != 0 {
            return Err(bad(
                "signal hook: rows_per_counter > 0, counters 4-byte aligned".into(),
            ));
        }
        // A block overlaps at most one 64-row group more than it spans.
        let rows = (s.rows_per_counter as u64).min(a.m as u64);
        let most = (rows.div_ceil(64) + 1) * (a.n as u64).div_ceil(64);
        if most > MAX_SIGNAL_ADVANCE as u64 {
            return Err(bad(format!(
                "signal hook: {} rows per counter of {} columns advance a counter by more than {MAX_SIGNAL_ADVANCE} per launch (its cyclic compare needs less); use fewer rows per counter",
                s.rows_per_counter, a.n
            )));
        }
    }
    if let Some(d) = h.dest {
        if d.rows_per_block == 0 || d.table.addr() % 8 != 0 || d.ld < a.n || d.ld % 2 != 0 {
            return Err(bad(
                "dest hook: rows_per_block > 0, table 8-byte aligned, ld even and >= N".into(),
            ));
        }
        if d.maps.is_some_and(|m| m.addr() % 128 != 0)
            || (d.maps.is_some() && d.rows_per_block % 64 != 0)
        {
            return Err(bad(format!(
                "dest hook maps: 128-byte aligned, rows_per_block a multiple of 64 (got {})",
                d.rows_per_block
            )));
        }
    }
    if tile.cluster() > 1 {
        // A cluster is scheduled only where two SMs of one GPC are free, so
        // not every cluster of a grid that fits the SM budget need be
        // resident at once: with a kernel beside it spinning on this one's
        // signals (or this one on a flag), a cluster left waiting for an SM
        // could wait forever. So no wait and no signal hook.
        if h.wait.is_some() || h.signal.is_some() {
            return Err(bad(format!(
                "{tile:?} (clusters of 2) does not take the wait or signal hook: not every cluster need be resident at once, and a waiting CTA would also hold up its peer; use a tile without a cluster"
            )));
        }
        if max_clusters == 0 || h.sm_budget.is_some_and(|s| s < 2) {
            return Err(bad(format!(
                "{tile:?} needs clusters of 2 CTAs: this device runs none{}",
                if max_clusters == 0 {
                    ""
                } else {
                    " within an SM budget under 2"
                }
            )));
        }
    }
    if tile.is_m64()
        && (h.wait.is_some() || h.signal.is_some() || h.dest.is_some() || h.m_start_block != 0)
    {
        return Err(bad(format!(
            "64-row tiles ({tile:?}) do not take the wait, signal or destination hooks or m_start_block (they count 128-row blocks)"
        )));
    }
    let tiles_m = a.m.div_ceil(tile.rows()) as u32;
    let tiles_n = a.n.div_ceil(tile.cols()) as u32;
    // A cluster tile's unit is a pair of M-blocks.
    let tiles = (tiles_m as u64).div_ceil(tile.cluster() as u64) * tiles_n as u64;
    if tiles > u32::MAX as u64 {
        return Err(bad("too many tiles".into()));
    }
    let k_blocks = a.k.div_ceil(BLOCK_K) as u64;
    let splits = match h.split_k {
        None | Some(1) if !tile.splits_k() => 1,
        Some(s) if !tile.splits_k() => {
            return Err(bad(format!(
            "{tile:?} tiles cannot be split along K (split_k {s}); use split_k 1 or another tile"
        )))
        }
        None if tile == auto_tile => auto_split,
        None => {
            let t = tiles;
            (1..=(MAX_SPLITS as u64).min(k_blocks))
                .filter(|&s| s == 1 || t * s <= tile.max_units())
                .min_by(|&x, &y| {
                    estimate_us(tile, t, k_blocks, x, budget as u64).total_cmp(&estimate_us(
                        tile,
                        t,
                        k_blocks,
                        y,
                        budget as u64,
                    ))
                })
                .unwrap_or(1) as u32
        }
        Some(s) if s == 0 || s > MAX_SPLITS || s as u64 > k_blocks => {
            return Err(bad(format!(
                "split_k must be 1..={MAX_SPLITS} and at most the {k_blocks} k-blocks, got {s}"
            )))
        }
        Some(s) => s,
    };
    // Split only the last, partial wave's tiles: the full waves run whole.
    let (splits, dp_tiles) = if h.split_tail_only && splits > 1 && tiles >= budget as u64 {
        let dp = tiles / budget as u64 * budget as u64;
        if dp == tiles {
            (1, 0)
        } else {
            (splits, dp)
        }
    } else {
        (splits, 0)
    };
    let split_tiles = tiles - dp_tiles;
    let max_units = tile.max_units();
    if splits > 1 && split_tiles * splits as u64 > max_units {
        return Err(bad(format!(
            "{split_tiles} split tiles x {splits} splits exceed the split-K workspace ({max_units} units)"
        )));
    }
    let units = dp_tiles + split_tiles * splits as u64;
    if units > u32::MAX as u64 {
        return Err(bad("too many work units".into()));
    }
    let grid = if tile.cluster() > 1 {
        // One cluster per unit at most, as many as are resident at once.
        2 * (units as u32).min(budget / 2).min(max_clusters).max(1)
    } else {
        (units as u32).min(budget).max(1)
    };
    Ok(LaunchShape {
        tiles_m,
        tiles_n,
        grid,
        dyn_smem: dyn_smem as u32,
        splits,
        tile_n: tile,
        stages: st,
        tma_store,
        staged,
        tma_dest,
        dp_tiles: dp_tiles as u32,
    })
}

/// A 2-D bf16 tensor map: `inner` contiguous elements per row, `outer` rows
/// `ld` elements apart, boxes of `box_inner` × `box_outer`, 128-byte swizzle,
/// zero fill out of bounds.
fn tensor_map(
    base: DevPtr<Bf16>,
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

// ---------------------------------------------------------------------------
// NVRTC, through the crate's one compile path and cubin cache.

/// The cubin of [`SOURCE`] through `crate::nvrtc`'s caches, and what it cost.
fn cubin_cached() -> Result<(Arc<Vec<u8>>, CompileInfo)> {
    let c = crate::nvrtc::cubin(KERNEL_NAME, SOURCE, crate::nvrtc::DEFAULT_OPTIONS, ARCH)?;
    let cache = match c.stats.origin {
        crate::nvrtc::CubinOrigin::Memory => CacheOutcome::Memory,
        crate::nvrtc::CubinOrigin::Disk => CacheOutcome::Hit,
        crate::nvrtc::CubinOrigin::Compiled if c.path.is_some() => CacheOutcome::Stored,
        crate::nvrtc::CubinOrigin::Compiled => CacheOutcome::Uncached,
    };
    let info = CompileInfo {
        ms: c.stats.ms,
        cache,
        path: c.path,
        nvrtc: c.nvrtc,
    };
    Ok((c.image, info))
}

/// Compiles [`SOURCE`] for sm_90a (uncached).
pub fn compile() -> Result<Vec<u8>> {
    compile_with(&[]).map(|(cubin, _)| cubin)
}

/// Compiles the kernel with `extra` NVRTC options (uncached); the cubin and
/// NVRTC's log (ptxas' report with `--ptxas-options=-v`).
pub fn compile_with(extra: &[&str]) -> Result<(Vec<u8>, String)> {
    let mut opts: Vec<&str> = crate::nvrtc::DEFAULT_OPTIONS.to_vec();
    opts.extend_from_slice(extra);
    crate::nvrtc::compile_with_log(KERNEL_NAME, SOURCE, &opts, ARCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed advances: 64-row groups overlapped × 64-column groups of N.
    #[test]
    fn signal_advance_counts_row_and_column_groups() {
        // rows 0..127: groups 0-1; 4096 columns: 64 groups.
        assert_eq!(signal_advance(1024, 4096, 128, 0), Some(128));
        // rows 96..191 straddle groups 1-2; 520 columns: 9 groups (the last partial).
        assert_eq!(signal_advance(1000, 520, 96, 1), Some(18));
        // rows 100..199: groups 1-3.
        assert_eq!(signal_advance(1000, 520, 100, 1), Some(27));
        // the last, partial block: rows 960..999, group 15 only.
        assert_eq!(signal_advance(1000, 520, 96, 10), Some(9));
        // one block larger than M: rows 0..299, groups 0-4; 8 columns: 1 group.
        assert_eq!(signal_advance(300, 8, 1000, 0), Some(5));
        assert_eq!(signal_advance(1000, 520, 96, 11), None, "past the last row");
        assert_eq!(signal_advance(1000, 520, 0, 0), None, "no rows per counter");
        assert_eq!(
            signal_advance(usize::MAX, usize::MAX, 1 << 20, 0),
            None,
            "overflows u32"
        );
        // Blocks of whole 64-row groups partition the output's groups.
        let total: u32 = (0..16)
            .filter_map(|b| signal_advance(1000, 520, 64, b))
            .sum();
        assert_eq!(total, 1000u32.div_ceil(64) * 9);
    }

    /// A counter must stay within the cyclic compare's reach: blocks whose
    /// advance could pass [`MAX_SIGNAL_ADVANCE`] are refused by name.
    #[test]
    fn signal_hook_refuses_advances_past_the_cyclic_range() {
        // 2^20 + 1 row groups (a block of all 2^26 rows) x 2048 column groups.
        let mut a = args(1 << 26, 1 << 17, 64);
        a.hooks.signal = Some(SignalHook {
            counters: DevPtr::new(0x1000),
            rows_per_counter: u32::MAX,
        });
        let err = validate(&a, 232448, 132).unwrap_err().to_string();
        assert!(err.contains("advance a counter"), "{err}");
        a.hooks.signal = Some(SignalHook {
            counters: DevPtr::new(0x1000),
            rows_per_counter: 128,
        });
        assert!(validate(&a, 232448, 132).is_ok());
    }

    /// [`super::validate`] on an H200-like device (`max_smem`, `sms`) that
    /// holds 60 clusters of 2 at once.
    fn validate(a: &GemmArgs, max_smem: u32, sms: u32) -> Result<LaunchShape> {
        super::validate(
            a,
            Limits {
                max_smem,
                sms,
                max_clusters: 60.min(sms / 2),
            },
        )
    }

    fn args(m: usize, n: usize, k: usize) -> GemmArgs {
        let mut a = GemmArgs::dense(
            m,
            n,
            k,
            DevPtr::new(0x1000),
            DevPtr::new(0x2000),
            DevPtr::new(0x3000),
        );
        a.hooks.tile_n = Some(TileN::N256);
        a
    }

    #[test]
    fn params_layout_matches_kernel() {
        // 9 u64 then 18 u32 (see struct Params in hgemm.cu).
        assert_eq!(std::mem::size_of::<KernelParams>(), 9 * 8 + 18 * 4);
        assert_eq!(std::mem::align_of::<TensorMap>(), 128);
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(STAGE_BYTES, 48 * 1024);
    }

    #[test]
    fn geometry_and_budget() {
        let s = validate(&args(1000, 4104, 72), 232448, 132).unwrap();
        assert_eq!((s.tiles_m, s.tiles_n), (8, 17));
        assert_eq!(s.grid, 132);
        // Plain output, aligned C: the TMA-store epilogue, 3 wide stages + staging.
        assert!(s.tma_store);
        assert_eq!(s.stages, 3);
        assert_eq!(
            s.dyn_smem,
            smem_bytes(s.tile_n, s.stages, 0) + s.tile_n.staging_bytes()
        );
        let mut acc = args(1000, 4104, 72);
        acc.accumulate = true;
        let s = validate(&acc, 232448, 132).unwrap();
        assert!(!s.tma_store);
        assert_eq!((s.stages, s.dyn_smem), (4, smem_bytes(TileN::N256, 4, 0)));
        let mut a = args(8192, 8192, 8192);
        a.hooks.sm_budget = Some(100);
        assert_eq!(validate(&a, 232448, 132).unwrap().grid, 100);
        let tiny = validate(&args(8, 8, 8), 232448, 132).unwrap();
        assert_eq!(tiny.grid, 1);
        let mut narrow = args(1000, 4104, 72);
        narrow.hooks.tile_n = None;
        let s = validate(&narrow, 232448, 132).unwrap();
        assert_eq!((s.tile_n, s.tiles_n, s.stages), (TileN::N128, 33, 6));
    }

    #[test]
    fn staged_epilogue_where_it_applies_unless_turned_off() {
        let max = 232448;
        let dest = DestHook {
            table: DevPtr::new(0x4000),
            ld: 4104,
            rows_per_block: 100,
            add: false,
            maps: None,
        };
        let mut a = args(1000, 4104, 72);
        a.hooks.dest = Some(dest);
        // Turned off: the register epilogue, the most stages.
        a.hooks.register_epilogue = true;
        let s = validate(&a, max, 132).unwrap();
        assert!(!s.staged && !s.tma_store);
        assert_eq!(s.stages, 4);
        // On by default.
        a.hooks.register_epilogue = false;
        let s = validate(&a, max, 132).unwrap();
        assert!(s.staged && !s.tma_store);
        assert_eq!(s.stages, 3);
        assert_eq!(
            s.dyn_smem,
            smem_bytes(TileN::N256, 3, 0) + TileN::N256.staging_bytes()
        );
        // Adds stay in registers (one rounding).
        a.hooks.dest = Some(DestHook { add: true, ..dest });
        assert!(!validate(&a, max, 132).unwrap().staged);
        let mut acc = args(1000, 4104, 72);
        acc.accumulate = true;
        assert!(!validate(&acc, max, 132).unwrap().staged);
        // Plain aligned output keeps the TMA stores.
        let mut plain = args(1000, 4104, 72);
        let s = validate(&plain, max, 132).unwrap();
        assert!(s.tma_store && !s.staged);
        // C rows not 16-byte aligned: staged (4-byte stores where unaligned).
        plain.c = DevPtr::new(0x3004);
        let s = validate(&plain, max, 132).unwrap();
        assert!(!s.tma_store && s.staged);
        // No room for the staging buffer: the register epilogue.
        plain.hooks.occupancy = Occupancy {
            stages: 4,
            extra_smem: 0,
        };
        assert!(!validate(&plain, max, 132).unwrap().staged);
    }

    #[test]
    fn dest_maps_take_the_tma_epilogue_unless_adding() {
        let max = 232448;
        let mut a = args(1000, 520, 200);
        let dest = DestHook {
            table: DevPtr::new(0x8000),
            ld: 528,
            rows_per_block: 128,
            add: false,
            maps: Some(DevPtr::new(0x10000)),
        };
        a.hooks.dest = Some(dest);
        let s = validate(&a, max, 132).unwrap();
        assert!(s.tma_dest && !s.staged && !s.tma_store);
        // Without maps: staged; adding: registers; register epilogue asked: registers.
        a.hooks.dest = Some(DestHook { maps: None, ..dest });
        let s = validate(&a, max, 132).unwrap();
        assert!(!s.tma_dest && s.staged);
        a.hooks.dest = Some(DestHook { add: true, ..dest });
        let s = validate(&a, max, 132).unwrap();
        assert!(!s.tma_dest && !s.staged && !s.tma_store);
        a.hooks.dest = Some(dest);
        a.hooks.register_epilogue = true;
        assert!(!validate(&a, max, 132).unwrap().tma_dest);
        a.hooks.register_epilogue = false;
        // Blocks must be whole 64-row halves, the maps 128-byte aligned.
        a.hooks.dest = Some(DestHook {
            rows_per_block: 96,
            ..dest
        });
        assert!(validate(&a, max, 132).is_err());
        a.hooks.dest = Some(DestHook {
            maps: Some(DevPtr::new(0x10040)),
            ..dest
        });
        assert!(validate(&a, max, 132).is_err());
    }

    #[test]
    fn split_tail_only_splits_the_last_wave() {
        let max = 232448;
        // 6144 x 1536: 48 x 6 = 288 wide tiles on 132 CTAs: 2 full waves
        // (264 tiles) whole, the 24 left split 5 ways.
        let mut a = args(6144, 1536, 4096);
        a.hooks.split_k = Some(5);
        a.hooks.split_tail_only = true;
        let s = validate(&a, max, 132).unwrap();
        assert_eq!((s.dp_tiles, s.splits, s.grid), (264, 5, 132));
        // Off: every tile split; 288 x 5 units exceed the workspace.
        a.hooks.split_tail_only = false;
        assert!(validate(&a, max, 132).is_err());
        // Fewer tiles than CTAs: plain split-K.
        let mut a = args(1536, 1536, 4096);
        a.hooks.split_k = Some(2);
        a.hooks.split_tail_only = true;
        let s = validate(&a, max, 132).unwrap();
        assert_eq!((s.dp_tiles, s.splits, s.grid), (0, 2, 132));
        // Whole waves only: nothing to split.
        let mut a = args(128 * 132, 256, 4096);
        a.hooks.split_k = Some(4);
        a.hooks.split_tail_only = true;
        let s = validate(&a, max, 132).unwrap();
        assert_eq!((s.dp_tiles, s.splits), (0, 1));
        // The workspace bounds only the split tiles: 20000 tiles x 4 splits
        // do not fit, 20000 - 19932 = 68 split tiles do.
        let mut a = args(128 * 100, 256 * 200, 4096);
        a.hooks.split_k = Some(4);
        assert!(validate(&a, max, 132).is_err());
        a.hooks.split_tail_only = true;
        let s = validate(&a, max, 132).unwrap();
        assert_eq!((s.dp_tiles, s.splits), (19932, 4));
    }

    #[test]
    fn rejects_what_the_kernel_cannot_do() {
        let max = 232448;
        assert!(validate(&args(64, 12, 64), max, 132).is_err());
        assert!(validate(&args(64, 64, 60), max, 132).is_err());
        let mut a = args(64, 64, 64);
        a.lda = 68;
        assert!(validate(&a, max, 132).is_err());
        let mut a = args(64, 64, 64);
        a.hooks.occupancy.stages = 5;
        assert!(validate(&a, max, 132).is_err());
        let mut a = args(64, 64, 64);
        a.hooks.occupancy.extra_smem = 40 * 1024;
        a.hooks.occupancy.stages = 4;
        assert!(validate(&a, max, 132).is_err());
        a.hooks.occupancy.stages = 3;
        assert!(validate(&a, max, 132).is_ok());
        let mut a = args(64, 64, 64);
        a.a = DevPtr::new(0x1008);
        assert!(validate(&a, max, 132).is_err());
        let mut a = args(64, 64, 64);
        a.hooks.sm_budget = Some(0);
        assert!(validate(&a, max, 132).is_err());
    }

    #[test]
    fn cluster_tiles_run_whole_pairs_on_resident_clusters() {
        let max = 232448;
        let lim = |max_clusters| Limits {
            max_smem: max,
            sms: 132,
            max_clusters,
        };
        // 1000 rows: 8 M-blocks, 4 pairs; 520 columns: 3 wide N-blocks ->
        // 12 pair units, so 12 clusters.
        let mut a = args(1000, 520, 320);
        a.hooks.tile_n = Some(TileN::N256C2);
        let s = super::validate(&a, lim(60)).unwrap();
        assert_eq!((s.tiles_m, s.tiles_n, s.grid, s.splits), (8, 3, 24, 1));
        // 8192^2 ping-pong: 32 x 64 pair units; the grid is what is resident.
        let mut big = args(8192, 8192, 8192);
        big.hooks.tile_n = Some(TileN::Pp128C2);
        assert_eq!(super::validate(&big, lim(60)).unwrap().grid, 120);
        assert_eq!(super::validate(&big, lim(66)).unwrap().grid, 132);
        // An odd SM budget rounds down to whole clusters.
        big.hooks.sm_budget = Some(7);
        assert_eq!(super::validate(&big, lim(60)).unwrap().grid, 6);
        for (change, needle) in [
            (
                (|a: &mut GemmArgs| a.hooks.sm_budget = Some(1)) as fn(&mut GemmArgs),
                "SM budget under 2",
            ),
            (
                |a: &mut GemmArgs| {
                    a.hooks.wait = Some(WaitHook {
                        flags: DevPtr::new(0x4000),
                        rows_per_flag: 128,
                        epoch: 1,
                    })
                },
                "wait or signal hook",
            ),
            (
                |a: &mut GemmArgs| {
                    a.hooks.signal = Some(SignalHook {
                        counters: DevPtr::new(0x4000),
                        rows_per_counter: 128,
                    })
                },
                "wait or signal hook",
            ),
            (
                |a: &mut GemmArgs| a.hooks.split_k = Some(2),
                "split along K",
            ),
        ] {
            let mut b = a;
            change(&mut b);
            let e = super::validate(&b, lim(60)).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        // A device that cannot say how many clusters fit runs none.
        let e = super::validate(&a, lim(0)).unwrap_err().to_string();
        assert!(e.contains("runs none"), "{e}");
        for t in TileN::ALL {
            assert_eq!(TileN::from_label(t.label()), Some(t));
        }
    }

    #[test]
    fn auto_schedule_fills_the_machine() {
        // 8192^3: 4096 narrow tiles, 31 waves: ping-pong; with 300 CTAs
        // (13.7 waves) and at 4096^3 (7.8 waves): wide, unsplit.
        assert_eq!(auto_schedule(8192, 8192, 8192, 132), (TileN::Pp128, 1));
        assert_eq!(auto_schedule(8192, 8192, 8192, 300), (TileN::N256, 1));
        assert_eq!(auto_schedule(4096, 4096, 4096, 132), (TileN::N256, 1));
        // 64 x 2560 x 8192: 10 wide tiles: split.
        assert!(auto_schedule(64, 2560, 8192, 132).1 >= 4);
        // 2048 x 3072 x 4096: 192 wide tiles = 1.45 waves; 384 narrow = 2.9.
        assert_eq!(auto_schedule(2048, 3072, 4096, 132), (TileN::N128, 1));
        // short K: never split.
        assert_eq!(auto_schedule(1000, 4104, 72, 132).1, 1);
    }

    #[test]
    fn m64_tile_halves_the_rows_and_refuses_block_hooks() {
        let max = 232448;
        let mut a = args(64, 4096, 3584);
        a.hooks.tile_n = Some(TileN::M64N256);
        a.hooks.split_k = Some(1);
        let s = validate(&a, max, 132).unwrap();
        assert_eq!((s.tiles_m, s.tiles_n, s.tile_n), (1, 16, TileN::M64N256));
        // 40 KiB stages: four fit beside the 64 KiB staging buffer.
        assert_eq!((s.stages, s.tma_store), (4, true));
        assert_eq!(TileN::M64N256.stage_bytes(), 40 * 1024);
        let mut b = a;
        b.m = 192;
        assert_eq!(validate(&b, max, 132).unwrap().tiles_m, 3);
        let hooked = |f: &dyn Fn(&mut Hooks)| {
            let mut x = a;
            f(&mut x.hooks);
            validate(&x, max, 132)
        };
        assert!(hooked(&|h| h.m_start_block = 1).is_err());
        assert!(hooked(&|h| {
            h.wait = Some(WaitHook {
                flags: DevPtr::new(0x1000),
                rows_per_flag: 64,
                epoch: 1,
            })
        })
        .is_err());
        assert!(hooked(&|h| {
            h.signal = Some(SignalHook {
                counters: DevPtr::new(0x1000),
                rows_per_counter: 64,
            })
        })
        .is_err());
        assert!(hooked(&|h| {
            h.dest = Some(DestHook {
                table: DevPtr::new(0x1000),
                ld: 4096,
                rows_per_block: 64,
                add: false,
                maps: None,
            })
        })
        .is_err());
        // The 64 x 128 tile: twice the tiles, 24 KiB stages.
        let mut c = a;
        c.hooks.tile_n = Some(TileN::M64N128);
        let s = validate(&c, max, 132).unwrap();
        assert_eq!((s.tiles_m, s.tiles_n), (1, 32));
        assert_eq!(TileN::M64N128.stage_bytes(), 24 * 1024);
        c.hooks.m_start_block = 1;
        assert!(validate(&c, max, 132).is_err());
        // The default schedule never picks them.
        a.hooks.tile_n = None;
        a.hooks.split_k = None;
        assert!(!validate(&a, max, 132).unwrap().tile_n.is_m64());
    }

    #[test]
    fn source_declares_what_rust_launches() {
        assert!(SOURCE.contains("ficco_hgemm"));
        assert!(SOURCE.contains("struct Params"));
        for entry in ENTRIES {
            assert!(SOURCE.contains(&format!("{entry}(")), "{entry}");
        }
        // The grouped entries take the group table after the plain parameters.
        for entry in [ENTRY_N256_GROUPED, ENTRY_N128_GROUPED] {
            let at = SOURCE.find(&format!("{entry}(")).unwrap_or(0);
            let sig = &SOURCE[at..at + 400.min(SOURCE.len() - at)];
            assert!(
                sig.contains("Params p,") && sig.contains("GroupTable g)"),
                "{entry}"
            );
        }
        assert!(SOURCE.contains("tnsp") || SOURCE.contains("0, 1;"));
    }

    /// Compiles the kernel for sm_90a (needs NVRTC, no GPU).
    #[test]
    #[ignore = "needs NVRTC (.ci/run and bench/gpu-tests.sh run it: --include-ignored)"]
    fn compiles_for_sm90a() {
        crate::loader::require_nvrtc("compiles_for_sm90a");
        match compile() {
            Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "not a CUBIN"),
            Err(e) => panic!("{e}"),
        }
    }

    /// Every entry compiles without register spills (a spill in the main
    /// loop costs more than any schedule choice wins). Needs NVRTC (CI
    /// installs it from PyPI), no GPU.
    #[test]
    #[ignore = "needs NVRTC (.ci/run and bench/gpu-tests.sh run it: --include-ignored)"]
    fn no_entry_spills_registers() {
        crate::loader::require_nvrtc("no_entry_spills_registers");
        // NVRTC (12.9+) caches compiles on disk: a second compile of the same
        // program on one machine skips ptxas and comes back with an empty log.
        // CUDA_CACHE_DISABLE=1 turns the cache off; it is read by the
        // library, so the check runs in a child process that has it set.
        if std::env::var("CUDA_CACHE_DISABLE").as_deref() != Ok("1") {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "hgemm::tests::no_entry_spills_registers",
                    "--include-ignored",
                    "--nocapture",
                ])
                .env("CUDA_CACHE_DISABLE", "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{text}");
            assert!(text.contains("1 passed"), "the check ran: {text}");
            return;
        }
        let (_, log) = match compile_with(&["--ptxas-options=-v"]) {
            Ok(x) => x,
            Err(e) => panic!("{e}"),
        };
        for entry in ENTRIES {
            assert!(
                log.contains(&format!("Compiling entry function '{entry}'")),
                "{entry} missing from the ptxas report:\n{log}"
            );
        }
        let spills: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("spill") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads")
            })
            .collect();
        assert!(spills.is_empty(), "register spills:\n{}", spills.join("\n"));
    }
}
