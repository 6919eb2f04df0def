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
//! # KernelSchedule and epilogue variants
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
//! `ficco gemm-bench` ([`bench`](mod@bench)) measures it beside cuBLASLt.
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
//!
//! # Files
//! One role each, each file using only those below it in this list (no
//! import circle: `.ci/structure.py`); this file re-exports the public API.
//!
//! | file | role |
//! |---|---|
//! | `bench.rs`, `bench/` | `gemm-bench`: ficco's GEMM against cuBLASLt ([`bench`](mod@bench)) |
//! | `tune.rs` | the autotuner: timing candidates, the tune files on disk ([`tune`]) |
//! | `grouped.rs` | the grouped mode: group table, shape, launch ([`grouped`]) |
//! | `launch.rs` | a launch: parameter block, tensor maps, destination maps, the raw launch |
//! | `load.rs` | [`HopperGemm`]: loading, the device's limits, which schedule a launch gets |
//! | `validate.rs` | every constraint of a launch, and its geometry ([`LaunchShape`]) |
//! | `schedule.rs` | the schedule space: wave model, chooser, variants, tune key |
//! | `compile.rs` | the source, its entries and its compile through `crate::nvrtc` |
//! | `params.rs` | the launch's types and the kernel's fixed sizes |
//! | `tests.rs` | host-side and NVRTC tests (no GPU) |

pub mod bench;
mod compile;
pub mod grouped;
mod launch;
mod load;
mod params;
mod schedule;
pub mod tune;
mod validate;

#[cfg(test)]
mod tests;

pub use compile::{compile, compile_with, CacheOutcome, CompileInfo, SOURCE};
pub use launch::{DestLayout, DestMaps};
pub use load::HopperGemm;
pub use params::{
    signal_advance, smem_bytes, Bf16, DestHook, GemmArgs, Hooks, LaunchShape, Occupancy,
    SignalHook, TileN, TypedPtr, WaitHook, BLOCK_K, BLOCK_M, BLOCK_N, GROUP_M, MAX_SIGNAL_ADVANCE,
    MAX_SPLITS, MAX_STAGES, MIN_STAGES, SPLIT_WORKSPACE_BYTES, STAGE_BYTES,
};
pub use schedule::{auto_schedule, estimate_us, PINGPONG_MIN_WAVES};
