//! What a launch may be: every constraint the kernel relies on, checked on
//! the host before any device work, and the launch geometry it leads to
//! (tile, stages, epilogue mode, K splits, grid). Kept apart from the
//! launch so that it is testable without a GPU.

use super::params::{
    smem_bytes, GemmArgs, LaunchShape, BLOCK_K, MAX_SIGNAL_ADVANCE, MAX_SPLITS, MIN_STAGES,
};
use super::schedule::{auto_schedule, estimate_us};
use crate::error::{CudaError, Result};

/// A launch the kernel cannot take, in words.
pub(super) fn bad(msg: String) -> CudaError {
    CudaError::Plan(format!("ficco hgemm: {msg}"))
}

/// What a device allows a launch ([`validate`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Opt-in dynamic shared memory per CTA.
    pub(super) max_smem: u32,
    pub(super) sms: u32,
    /// Clusters of 2 resident at once (`HopperGemm::resident_clusters`).
    pub(super) max_clusters: u32,
}

/// Checks every constraint the kernel relies on; returns the geometry.
pub(super) fn validate(a: &GemmArgs, lim: Limits) -> Result<LaunchShape> {
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
