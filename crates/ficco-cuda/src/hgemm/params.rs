//! The types a launch is described in, and the kernel's fixed sizes: device
//! pointers, tile shapes, the hooks, one GEMM's arguments and the launch
//! geometry they lead to. Plain data with no device work, so that every
//! other file of the GEMM (and the executor) can depend on it.

use std::marker::PhantomData;

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
pub(super) const MAX_SPLIT_TICKETS: usize = SPLIT_WORKSPACE_BYTES / (64 * 128 * 4);
/// Threads per CTA: the producer warpgroup and two consumer warpgroups.
pub(super) const THREADS: u32 = 384;

/// A device address of `T`s (no ownership, no lifetime: the caller keeps the
/// memory alive for the launches that use it).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TypedPtr<T> {
    addr: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for TypedPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for TypedPtr<T> {}

impl<T> TypedPtr<T> {
    /// Wraps a raw device address.
    pub const fn new(addr: u64) -> Self {
        TypedPtr {
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
    /// m64n128k16). Never picked by [`auto_schedule`](super::auto_schedule) (the tuner and
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
    ///
    /// [`auto_schedule`]: super::auto_schedule
    /// [`PINGPONG_MIN_WAVES`]: super::PINGPONG_MIN_WAVES
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
    pub(super) const fn max_units(self) -> u64 {
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
    pub flags: TypedPtr<u32>,
    pub rows_per_flag: u32,
    /// Compared with wrapping arithmetic: ready when `flag - epoch` is ≥ 0 as i32.
    pub epoch: u32,
}

/// Hook 5: `counters[b]` advances by [`signal_advance`] per launch, in
/// system-scope release adds, the last one once all of output block b is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SignalHook {
    /// One u32 per `rows_per_counter` rows of C.
    pub counters: TypedPtr<u32>,
    pub rows_per_counter: u32,
}

/// Hook 6: store the rows of block b through `table[b]` when that entry is non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DestHook {
    /// One device address (u64) per `rows_per_block` rows of C: where row
    /// `b * rows_per_block` of C goes; 0 keeps C.
    pub table: TypedPtr<u64>,
    /// Leading dimension (elements) of every destination.
    pub ld: usize,
    pub rows_per_block: u32,
    /// Add into the destination (`dst += A·B`) instead of overwriting it.
    pub add: bool,
    /// One tensor map per block ([`HopperGemm::dest_maps`], built from the
    /// same table): without `add`, the epilogue then stores each half tile
    /// with TMA through its block's map instead of 16-byte thread stores.
    /// Needs `rows_per_block` a multiple of 64.
    ///
    /// [`HopperGemm::dest_maps`]: super::HopperGemm::dest_maps
    pub maps: Option<TypedPtr<u8>>,
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
    /// the tile by a wave model ([`auto_schedule`](super::auto_schedule)); `Some(1)` never splits.
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
    /// ([`HopperGemm::autotune`](super::HopperGemm::autotune)) when `tile_n` and `split_k` are open
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
    /// KernelSchedule variant (not a hook): with a K split and more tiles than
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
    pub a: TypedPtr<Bf16>,
    pub lda: usize,
    pub b: TypedPtr<Bf16>,
    pub ldb: usize,
    pub c: TypedPtr<Bf16>,
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
        a: TypedPtr<Bf16>,
        b: TypedPtr<Bf16>,
        c: TypedPtr<Bf16>,
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
    /// 16-byte thread stores (unless [`Hooks::register_epilogue`]); excludes `tma_store`.
    pub staged: bool,
    /// The destination hook's rows go out as TMA stores through its
    /// per-block maps ([`DestHook::maps`]); excludes the other two.
    pub tma_dest: bool,
    /// Tiles run whole before the split ones ([`Hooks::split_tail_only`]; 0: all split).
    pub dp_tiles: u32,
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
