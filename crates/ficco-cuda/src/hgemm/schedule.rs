//! The schedule space of one GEMM: the wave model and the chooser that
//! picks a tile and K split without measuring ([`auto_schedule`]), the
//! schedules the tuner and `gemm-bench` time besides it
//! ([`schedule_variants`]), and what a tuned pick is keyed by ([`KernelTuneKey`]).
//! Pure functions of the shape (the timing is `super::tune`'s), so that
//! validation and loading use them without depending on the tuner.

use super::params::{GemmArgs, Hooks, TileN, BLOCK_K, BLOCK_M, MAX_SPLITS};

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

/// What a tuned schedule depends on (no addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelTuneKey {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub accumulate: bool,
    pub sm_budget: Option<u32>,
    pub stages: u32,
    pub extra_smem: u32,
    pub group_m: Option<u32>,
    /// C rows 16-byte aligned (the TMA-store epilogue can run).
    pub c_aligned: bool,
    pub register_epilogue: bool,
    pub wait: bool,
    pub signal: bool,
    /// The destination hook, and whether it adds.
    pub dest: Option<bool>,
    /// The destination hook has per-block tensor maps (TMA-store epilogue).
    pub dest_maps: bool,
}

impl KernelTuneKey {
    /// The key of a launch.
    pub fn of(a: &GemmArgs) -> Self {
        let h = &a.hooks;
        KernelTuneKey {
            m: a.m,
            n: a.n,
            k: a.k,
            lda: a.lda,
            ldb: a.ldb,
            ldc: a.ldc,
            accumulate: a.accumulate,
            sm_budget: h.sm_budget,
            stages: h.occupancy.stages,
            extra_smem: h.occupancy.extra_smem,
            group_m: h.group_m,
            c_aligned: a.c.addr() % 16 == 0,
            register_epilogue: h.register_epilogue,
            wait: h.wait.is_some(),
            signal: h.signal.is_some(),
            dest: h.dest.map(|d| d.add),
            dest_maps: h.dest.is_some_and(|d| d.maps.is_some()),
        }
    }
}

/// One schedule of ficco's kernel: tile width, K splits, and whether only
/// the last partial wave's tiles are split.
pub type KernelSchedule = (TileN, u32, bool);

/// The label of a schedule in the table: "tile/splits", "t" appended when
/// only the tail wave is split.
pub fn schedule_label((tile, splits, tail): KernelSchedule) -> String {
    format!("{}/{splits}{}", tile.label(), if tail { "t" } else { "" })
}

/// The schedules the tuner and [`super::bench::Bench::shape`] time besides the chooser's: both tile widths, unsplit
/// and split 2 to 16 ways, except `chosen` (the chooser's own, timed anyway),
/// splits beyond the k-blocks or the split-K workspace, and splits whose
/// units exceed 4 waves of `grid` CTAs (the tiles alone then fill the
/// machine); and where the tiles leave a partial last wave, that wave's
/// tiles split 2 to 16 ways (at most 2 waves of split units). The 64-row
/// tiles ([`TileN::M64N256`], [`TileN::M64N128`]) are candidates too where M ≤ 1024 leaves the
/// last 128-row block at most half full (M = 64, 192, ...) or M ≤ 512. The ping-pong
/// tile ([`TileN::Pp128`], never split) is a candidate on every shape, and
/// the cluster tiles ([`TileN::N256C2`], [`TileN::Pp128C2`], never split)
/// on every shape of at least two M-blocks.
pub fn schedule_variants(
    m: usize,
    n: usize,
    k: usize,
    grid: u32,
    chosen: KernelSchedule,
) -> Vec<KernelSchedule> {
    let k_blocks = k.div_ceil(BLOCK_K) as u64;
    let grid = grid.max(1) as u64;
    let mut out = vec![];
    let rem = m % BLOCK_M;
    // 64-row tiles where the last 128-row block is at most half full, or the
    // GEMM is so skinny (≤ 4 M-blocks) that twice the tiles fill the grid better.
    let short_m = m <= 1024 && ((rem > 0 && rem <= 64) || m <= 512);
    let mut whole = vec![TileN::Pp128];
    if m > BLOCK_M {
        whole.extend([TileN::N256C2, TileN::Pp128C2]);
    }
    for tile in whole {
        if chosen != (tile, 1, false) {
            out.push((tile, 1, false));
        }
    }
    let tiles_of = [TileN::N256, TileN::N128, TileN::M64N256, TileN::M64N128];
    for tile in tiles_of.into_iter().filter(|&t| !t.is_m64() || short_m) {
        let tiles = (m.div_ceil(tile.rows()) * n.div_ceil(tile.cols())) as u64;
        let tail = if tiles >= grid { tiles % grid } else { 0 };
        for s in [1u32, 2, 3, 4, 6, 8, 12, 16] {
            if s as u64 > k_blocks {
                continue;
            }
            let units = tiles * s as u64;
            let fits = s == 1 || (units <= tile.max_units() && units <= 4 * grid);
            if fits && (tile, s, false) != chosen {
                out.push((tile, s, false));
            }
            let tail_units = tail * s as u64;
            let tail_fits =
                s > 1 && tail > 0 && tail_units <= tile.max_units() && tail_units <= 2 * grid;
            if tail_fits && (tile, s, true) != chosen {
                out.push((tile, s, true));
            }
        }
    }
    out
}

/// `args` with `s` as its schedule.
pub fn with_schedule(args: &GemmArgs, (tile, splits, tail): KernelSchedule) -> GemmArgs {
    GemmArgs {
        hooks: Hooks {
            tile_n: Some(tile),
            split_k: Some(splits),
            split_tail_only: tail,
            ..args.hooks
        },
        ..*args
    }
}

#[cfg(test)]
mod tests {
    use super::super::params::{SignalHook, TypedPtr};
    use super::*;

    #[test]
    fn variants_cover_both_tiles_and_useful_splits() {
        // 2048 wide tiles = 15 full waves + 68; 4096 narrow = 31 + 4.
        let v = schedule_variants(8192, 8192, 8192, 132, (TileN::N256, 1, false));
        assert!(v.contains(&(TileN::N128, 1, false)));
        assert!(v.iter().all(|&(_, s, t)| s == 1 || t), "{v:?}");
        // 68 x 3 tail units fit 2 waves of 132, 68 x 4 do not.
        assert!(v.contains(&(TileN::N256, 3, true)));
        assert!(!v.contains(&(TileN::N256, 4, true)));
        assert!(v.contains(&(TileN::N128, 8, true)));
        // 1536 x 1536 x 4096: 72 wide / 144 narrow tiles, 64 k-blocks.
        let v = schedule_variants(1536, 1536, 4096, 132, (TileN::N256, 1, false));
        assert!(!v.contains(&(TileN::N256, 1, false)));
        for want in [
            (TileN::N256, 2),
            (TileN::N256, 6),
            (TileN::N128, 1),
            (TileN::N128, 3),
        ] {
            assert!(v.contains(&(want.0, want.1, false)), "{want:?} in {v:?}");
        }
        // 144 narrow tiles x 4 = 576 units > 4 waves of 132.
        assert!(!v.contains(&(TileN::N128, 4, false)));
        // 72 wide tiles: no full wave, no tail variant; 144 narrow: 12 left.
        assert!(!v.iter().any(|&(t, _, tail)| tail && t == TileN::N256));
        assert!(v.contains(&(TileN::N128, 8, true)));
        // K = 128: two k-blocks, at most two splits.
        let v = schedule_variants(64, 4096, 128, 132, (TileN::N128, 2, false));
        assert!(v.iter().all(|&(_, s, _)| s <= 2), "{v:?}");
        assert!(v.contains(&(TileN::N256, 2, false)) && v.contains(&(TileN::N128, 1, false)));
        assert_eq!(schedule_label((TileN::N128, 4, true)), "128/4t");
        assert_eq!(schedule_label((TileN::M64N256, 2, false)), "64x256/2");
        // 64-row tiles where the last 128-row block is at most half full.
        let m64 = |m| {
            schedule_variants(m, 4096, 3584, 132, (TileN::N256, 1, false))
                .iter()
                .any(|&(t, _, _)| t == TileN::M64N256)
        };
        assert!(m64(64) && m64(192) && m64(960));
        // ... or the GEMM has at most 4 M-blocks.
        assert!(m64(128) && m64(256) && m64(100) && m64(512));
        assert!(!m64(640) && !m64(1000) && !m64(2112));
        // Ping-pong on every shape, unsplit, once.
        for (m, n, k) in [(8192, 8192, 8192), (64, 4096, 128), (16384, 4096, 1024)] {
            let v = schedule_variants(m, n, k, 132, (TileN::N256, 1, false));
            let pp: Vec<_> = v.iter().filter(|s| s.0 == TileN::Pp128).collect();
            assert_eq!(pp, [&(TileN::Pp128, 1, false)], "{m}x{n}x{k}");
        }
        let v = schedule_variants(8192, 8192, 8192, 132, (TileN::Pp128, 1, false));
        assert!(!v.iter().any(|s| s.0 == TileN::Pp128));
        assert_eq!(schedule_label((TileN::Pp128, 1, false)), "128pp/1");
    }

    #[test]
    fn key_ignores_addresses_but_not_hooks_or_alignment() {
        let a = GemmArgs::dense(
            256,
            512,
            1024,
            TypedPtr::new(0x1000),
            TypedPtr::new(0x2000),
            TypedPtr::new(0x3000),
        );
        let moved = GemmArgs {
            a: TypedPtr::new(0x9000),
            b: TypedPtr::new(0xa000),
            c: TypedPtr::new(0xb000),
            ..a
        };
        assert_eq!(KernelTuneKey::of(&a), KernelTuneKey::of(&moved));
        let unaligned = GemmArgs {
            c: TypedPtr::new(0x3004),
            ..a
        };
        assert_ne!(KernelTuneKey::of(&a), KernelTuneKey::of(&unaligned));
        let mut hooked = a;
        hooked.hooks.signal = Some(SignalHook {
            counters: TypedPtr::new(0x4000),
            rows_per_counter: 128,
        });
        assert_ne!(KernelTuneKey::of(&a), KernelTuneKey::of(&hooked));
        let mut acc = a;
        acc.accumulate = true;
        assert_ne!(KernelTuneKey::of(&a), KernelTuneKey::of(&acc));
    }

    #[test]
    fn with_schedule_keeps_hooks() {
        let mut a = GemmArgs::dense(
            256,
            512,
            1024,
            TypedPtr::new(0x1000),
            TypedPtr::new(0x2000),
            TypedPtr::new(0x3000),
        );
        a.hooks.sm_budget = Some(66);
        a.hooks.m_start_block = 1;
        let t = with_schedule(&a, (TileN::N128, 3, true));
        assert_eq!(t.hooks.tile_n, Some(TileN::N128));
        assert_eq!(t.hooks.split_k, Some(3));
        assert!(t.hooks.split_tail_only);
        assert_eq!((t.hooks.sm_budget, t.hooks.m_start_block), (Some(66), 1));
    }
}
