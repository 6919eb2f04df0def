//! Per-shape autotuning of ficco's own GEMM: time the schedules that
//! `gemm-bench` sweeps too ([`schedule_variants`] plus the
//! chooser's own, [`super::auto_schedule`]) on scratch buffers, keep the
//! fastest in memory and on disk next to the cubin cache, so that a shape
//! is timed once per kernel source and device. [`HopperGemm::launch`]
//! applies the cached pick to launches that leave the schedule open.
//!
//! The key holds everything that changes which schedule is fastest or
//! valid: the dimensions, leading dimensions, accumulate, SM budget,
//! occupancy, grouping, and which hooks are on (tuning runs with
//! the same hooks, on scratch flags already set, so the pick is one that
//! honours them). Pointers are not in the key: the tuned schedule is valid
//! for any operands of the shape.

use super::{Bf16, DevPtr, GemmArgs, HopperGemm, TileN, BLOCK_M, SOURCE};
use crate::controls::{median, time_batched_ms};
use crate::driver::cuda::memset_d32;
use crate::error::{CudaError, Result};
use crate::mem::DeviceBuffer;
use std::path::PathBuf;

/// What a tuned schedule depends on (no addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TuneKey {
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

impl TuneKey {
    /// The key of a launch.
    pub fn of(a: &GemmArgs) -> Self {
        let h = &a.hooks;
        TuneKey {
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

/// Where a tuned schedule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum TuneSource {
    /// This [`HopperGemm`] had it.
    Memory,
    /// Read from the disk cache.
    Disk,
    /// Timed now (`candidates` schedules ran).
    Timed { candidates: usize },
}

/// A tuned schedule and its provenance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuned {
    pub schedule: Schedule,
    pub source: TuneSource,
}

/// Per candidate and round: batches of back-to-back launches (each timed
/// as a whole, after one untimed launch that keeps the GPU busy), and
/// launches per batch. Timing single launches with a host sync between
/// them counted the host's launch gap into 20 µs kernels.
const BATCHES: usize = 2;
const PER_BATCH: usize = 4;
/// Rounds over the candidates (interleaved, so clock drift hits all alike).
/// Two rounds of five single launches picked schedules up to 16% slower than
/// the fastest (as `gemm-bench` measures them, 2026-11-24).
const ROUNDS: usize = 4;
/// Rounds when the fastest candidate takes less than [`SHORT_MS`] (chunk
/// GEMMs of tens of microseconds, where the tuner's pick was up to 7% slower
/// than the fastest in `gemm-bench` after 4 rounds, 2026-11-24).
const SHORT_ROUNDS: usize = 12;
const SHORT_MS: f32 = 0.2;

/// The median of unsorted times.
fn median_of(t: &[f32]) -> f32 {
    let mut t = t.to_vec();
    t.sort_by(f32::total_cmp);
    median(&t)
}

/// The smallest median over the candidates that ran (infinity if none).
fn fastest_median(times: &[Vec<f32>], failed: &[bool]) -> f32 {
    times
        .iter()
        .zip(failed)
        .filter(|(t, &f)| !f && !t.is_empty())
        .map(|(t, _)| median_of(t))
        .fold(f32::INFINITY, f32::min)
}
/// Elements of the random block that fills every scratch operand, repeated
/// (2 MiB: generated once, uploaded in pieces).
const RANDOM_BLOCK: usize = 1 << 20;

/// ~U(-1, 1) bf16 values from a fixed LCG. Timing runs on random data:
/// constant operands draw less power than real ones, and the tuner then
/// ranks candidates for clocks that real data does not get.
fn random_block() -> Vec<u8> {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..RANDOM_BLOCK)
        .flat_map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let f = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            ((f.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

/// Fills `n` bf16 at `buf` with the random block, repeated.
fn fill_random(buf: &DeviceBuffer, n: usize, block: &[u8]) -> Result<()> {
    let mut at = 0;
    while at < n * 2 {
        let len = block.len().min(n * 2 - at);
        // SAFETY: the buffer holds n bf16; the context is current.
        unsafe { crate::driver::cuda::memcpy_htod(buf.ptr().offset(at), &block[..len])? };
        at += len;
    }
    Ok(())
}

/// The candidates for `args`: the chooser's schedule first, then the
/// bench's variants; the launch decides which are valid.
pub fn candidates(g: &HopperGemm, args: &GemmArgs) -> Vec<Schedule> {
    let grid = args.hooks.sm_budget.unwrap_or(g.sms()).max(1);
    let chosen = g
        .shape(&GemmArgs {
            hooks: super::Hooks {
                tile_n: None,
                split_k: None,
                split_tail_only: false,
                untuned: true,
                ..args.hooks
            },
            ..*args
        })
        .map(|s| (s.tile_n, s.splits, false))
        .unwrap_or((TileN::N256, 1, false));
    let mut out = vec![chosen];
    out.extend(schedule_variants(args.m, args.n, args.k, grid, chosen));
    out
}

/// How the tuner measures; part of the disk cache key, so picks timed the
/// old way (constant operands) are not reused.
const METHOD: &str = "random operands";

/// The disk cache file of a key: `hgemm-tune-<hash>.txt` beside the cubins
/// (`crate::nvrtc::cache_dir`, which `$FICCO_CUBIN_CACHE` overrides).
fn disk_path(device: &str, key: &TuneKey) -> Option<PathBuf> {
    let h = key_hash(&[SOURCE, METHOD, device, &format!("{key:?}")]);
    crate::nvrtc::cache_dir().map(|d| d.join(format!("hgemm-tune-{h}.txt")))
}

/// 128-bit FNV-1a of the parts (each followed by a NUL), in hex: stable
/// across Rust versions, unlike `DefaultHasher`. It names the tune files
/// only (the cubins have `crate::nvrtc`'s key); unchanged, so that picks
/// already on disk stay valid.
fn key_hash(parts: &[&str]) -> String {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    let prime: u128 = 0x0000000001000000000000000000013B;
    for p in parts {
        for &b in p.as_bytes().iter().chain(std::iter::once(&0u8)) {
            h ^= b as u128;
            h = h.wrapping_mul(prime);
        }
    }
    format!("{h:032x}")
}

/// "tile splits tail", e.g. "256 4 1".
fn encode((tile, splits, tail): Schedule) -> String {
    format!("{} {splits} {}\n", tile.label(), tail as u8)
}

fn decode(s: &str) -> Option<Schedule> {
    let mut it = s.split_whitespace();
    let tile = TileN::from_label(it.next()?)?;
    let splits: u32 = it.next()?.parse().ok()?;
    let tail = match it.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    (it.next().is_none() && splits >= 1).then_some((tile, splits, tail))
}

/// `args` with `s` as its schedule.
pub fn with_schedule(args: &GemmArgs, (tile, splits, tail): Schedule) -> GemmArgs {
    GemmArgs {
        hooks: super::Hooks {
            tile_n: Some(tile),
            split_k: Some(splits),
            split_tail_only: tail,
            ..args.hooks
        },
        ..*args
    }
}

/// Scratch operands and hook words for timing one key.
struct Scratch {
    _bufs: Vec<DeviceBuffer>,
    _maps: Option<super::DestMaps>,
    args: GemmArgs,
}

fn scratch(g: &HopperGemm, key: &TuneKey, template: &GemmArgs) -> Result<Scratch> {
    let ctx = g.context();
    let elems = |rows: usize, ld: usize| rows.max(1) * ld.max(1);
    let a = DeviceBuffer::alloc(ctx, elems(key.m, key.lda) * 2)?;
    let b = DeviceBuffer::alloc(ctx, elems(key.k, key.ldb) * 2)?;
    // C 16-byte aligned or not, as in the launch (the epilogue depends on it).
    let c = DeviceBuffer::alloc(ctx, elems(key.m, key.ldc) * 2 + 16)?;
    let c_off = if key.c_aligned { 0 } else { 4 };
    let block = random_block();
    for (buf, n) in [
        (&a, elems(key.m, key.lda)),
        (&b, elems(key.k, key.ldb)),
        (&c, elems(key.m, key.ldc)),
    ] {
        fill_random(buf, n, &block)?;
    }
    let mut hooks = template.hooks;
    let mut bufs = vec![];
    // Hook words: flags already at the epoch (the wait never blocks),
    // counters to count into, a destination table of zeros (rows stay in C).
    let words = |rows: u32| key.m.div_ceil(rows.max(1) as usize).max(1);
    if let Some(w) = hooks.wait.as_mut() {
        let n = words(w.rows_per_flag);
        let f = DeviceBuffer::alloc(ctx, n * 4)?;
        // SAFETY: f holds n u32; the context is current.
        unsafe { memset_d32(f.ptr(), w.epoch, n)? };
        w.flags = DevPtr::new(f.ptr().raw());
        bufs.push(f);
    }
    if let Some(s) = hooks.signal.as_mut() {
        let n = words(s.rows_per_counter);
        let f = DeviceBuffer::alloc(ctx, n * 4)?;
        // SAFETY: f holds n u32; the context is current.
        unsafe { memset_d32(f.ptr(), 0, n)? };
        s.counters = DevPtr::new(f.ptr().raw());
        bufs.push(f);
    }
    if let Some(d) = hooks.dest.as_mut() {
        let n = words(d.rows_per_block);
        let f = DeviceBuffer::alloc(ctx, n * 8)?;
        // SAFETY: f holds 2n u32; the context is current.
        unsafe { memset_d32(f.ptr(), 0, 2 * n)? };
        d.table = DevPtr::new(f.ptr().raw());
        d.ld = key.ldc;
        bufs.push(f);
    }
    let c_ptr = DevPtr::new(c.ptr().raw() + c_off);
    // Per-block maps of the zero table (every block's rows in C); where C
    // cannot take them (rows not 16-byte aligned), timed without maps.
    let mut maps = None;
    if let Some(d) = hooks.dest.as_mut().filter(|d| d.maps.is_some()) {
        let table = vec![0u64; key.m.div_ceil(d.rows_per_block.max(1) as usize)];
        maps = g
            .dest_maps(
                &table,
                key.ldc,
                d.rows_per_block,
                key.m,
                key.n,
                c_ptr,
                key.ldc,
            )
            .ok();
        d.maps = maps.as_ref().map(|m| m.ptr());
    }
    let args = GemmArgs {
        a: DevPtr::<Bf16>::new(a.ptr().raw()),
        b: DevPtr::new(b.ptr().raw()),
        c: c_ptr,
        hooks,
        ..*template
    };
    bufs.extend([a, b, c]);
    Ok(Scratch {
        _bufs: bufs,
        _maps: maps,
        args,
    })
}

impl HopperGemm {
    /// The tuned schedule of `args`' shape, timing the candidates (on
    /// scratch buffers, with CUDA events, synchronously) unless this
    /// instance or the disk cache already has it. Candidates that are
    /// rejected or fail to launch are skipped; an error only when none ran.
    /// Call only while nothing else runs on the device.
    pub fn autotune(&self, args: &GemmArgs) -> Result<Tuned> {
        let key = TuneKey::of(args);
        if let Some(&s) = self.tuned_map()?.get(&key) {
            return Ok(Tuned {
                schedule: s,
                source: TuneSource::Memory,
            });
        }
        let device = self
            .context()
            .name()
            .unwrap_or_else(|_| "unknown device".into());
        let path = disk_path(&device, &key);
        // Validity as the tuning launches it: the destination table's rows
        // are C's (the executor's pitch is not known before the run).
        let mut probe = *args;
        if let Some(d) = probe.hooks.dest.as_mut() {
            d.ld = args.ldc;
        }
        let valid = |s: Schedule| self.shape(&with_schedule(&probe, s)).is_ok();
        if let Some(s) = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| decode(&t))
            .filter(|&s| valid(s))
        {
            self.tuned_map()?.insert(key, s);
            return Ok(Tuned {
                schedule: s,
                source: TuneSource::Disk,
            });
        }
        let cands: Vec<Schedule> = candidates(self, &probe)
            .into_iter()
            .filter(|&s| valid(s))
            .collect();
        let ctx = self.context().clone();
        ctx.bind_to_thread()
            .map_err(crate::error::drv("cuCtxSetCurrent"))?;
        let stream = ctx
            .new_stream()
            .map_err(crate::error::drv("cuStreamCreate"))?;
        let cu = stream.cu_stream();
        let sc = scratch(self, &key, args)?;
        // The hook words are set on the legacy stream, which the timing
        // stream does not wait for: finish every fill before any launch.
        ctx.synchronize()
            .map_err(crate::error::drv("cuCtxSynchronize"))?;
        let mut times: Vec<Vec<f32>> = vec![vec![]; cands.len()];
        let mut failed = vec![false; cands.len()];
        let mut rounds = ROUNDS;
        let mut round = 0;
        while round < rounds {
            round += 1;
            for (i, &s) in cands.iter().enumerate() {
                if failed[i] {
                    continue;
                }
                let a = with_schedule(&sc.args, s);
                // SAFETY: scratch operands and hook words sized for the key
                // (the wait flags are at the epoch), alive until the stream
                // is synchronized below; the stream is on this device.
                match unsafe {
                    time_batched_ms(&ctx, cu, 1, BATCHES, PER_BATCH, || self.launch(cu, &a))
                } {
                    Ok(t) => times[i].extend(t),
                    Err(_) => failed[i] = true,
                }
            }
            // Short kernels: candidates a few percent apart are within the
            // noise of 4 rounds, and more rounds cost little.
            if round == ROUNDS && fastest_median(&times, &failed) < SHORT_MS {
                rounds = SHORT_ROUNDS;
            }
        }
        stream
            .synchronize()
            .map_err(crate::error::drv("cuStreamSynchronize"))?;
        let best = cands
            .iter()
            .zip(&times)
            .zip(&failed)
            .filter(|(_, &f)| !f)
            .map(|((&s, t), _)| (s, median_of(t)))
            .filter(|(_, ms)| ms.is_finite() && *ms > 0.0)
            .min_by(|x, y| x.1.total_cmp(&y.1));
        let Some((s, _)) = best else {
            return Err(CudaError::Plan(format!(
                "ficco hgemm autotune: none of {} schedules ran for {key:?}",
                cands.len()
            )));
        };
        self.timings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tuned_map()?.insert(key, s);
        if let Some(p) = &path {
            // A cache that cannot be written only costs a re-tune next run.
            let _ = crate::nvrtc::write_atomic(p, encode(s).as_bytes());
        }
        Ok(Tuned {
            schedule: s,
            source: TuneSource::Timed {
                candidates: cands.len(),
            },
        })
    }

    /// The disk cache file of `args`' shape on this device, if there is a
    /// cache directory (whether or not the file exists).
    pub fn tune_cache_path(&self, args: &GemmArgs) -> Option<PathBuf> {
        let device = self
            .context()
            .name()
            .unwrap_or_else(|_| "unknown device".into());
        disk_path(&device, &TuneKey::of(args))
    }

    /// How many shapes this instance has timed (not read from memory or disk).
    pub fn tune_timings(&self) -> u64 {
        self.timings.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The tuned schedule of `args`' shape if [`HopperGemm::autotune`] has
    /// it in memory.
    pub fn tuned(&self, args: &GemmArgs) -> Option<Schedule> {
        self.tuned_map().ok()?.get(&TuneKey::of(args)).copied()
    }

    fn tuned_map(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, std::collections::HashMap<TuneKey, Schedule>>> {
        self.tuned
            .lock()
            .map_err(|_| CudaError::Plan("ficco hgemm: tuning cache poisoned".into()))
    }
}

/// One schedule of ficco's kernel: tile width, K splits, and whether only
/// the last partial wave's tiles are split.
pub type Schedule = (TileN, u32, bool);

/// The label of a schedule in the table: "tile/splits", "t" appended when
/// only the tail wave is split.
pub fn schedule_label((tile, splits, tail): Schedule) -> String {
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
    chosen: Schedule,
) -> Vec<Schedule> {
    let k_blocks = k.div_ceil(super::BLOCK_K) as u64;
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

#[cfg(test)]
mod tests {
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
    fn key_hash_is_stable_and_sensitive() {
        let a = key_hash(&["src", "opts"]);
        assert_eq!(a, key_hash(&["src", "opts"]));
        assert_ne!(a, key_hash(&["srco", "pts"]));
        assert_eq!(a.len(), 32);
        // Tune files already on disk keep their names.
        assert_eq!(key_hash(&[]), "6c62272e07bb014262b821756295c58d");
    }

    #[test]
    fn schedules_round_trip_through_text() {
        for s in [
            (TileN::N256, 1, false),
            (TileN::N128, 4, true),
            (TileN::M64N256, 2, false),
            (TileN::N256, 8, true),
            (TileN::Pp128, 1, false),
            (TileN::M64N128, 6, true),
        ] {
            assert_eq!(decode(&encode(s)), Some(s));
        }
        assert_eq!(decode("64 1 0"), None);
        assert_eq!(decode("256 0 0"), None);
        assert_eq!(decode("256 2"), None);
        assert_eq!(decode("256 2 0 x"), None);
        assert_eq!(decode("256 x 0"), None);
    }

    #[test]
    fn fastest_median_skips_failed_and_empty_candidates() {
        let t = vec![vec![3.0, 1.0, 2.0], vec![5.0], vec![]];
        assert_eq!(fastest_median(&t, &[false, false, false]), 2.0);
        assert_eq!(fastest_median(&t, &[true, false, false]), 5.0);
        assert!(fastest_median(&t, &[true, true, false]).is_infinite());
    }

    #[test]
    fn key_ignores_addresses_but_not_hooks_or_alignment() {
        let a = GemmArgs::dense(
            256,
            512,
            1024,
            DevPtr::new(0x1000),
            DevPtr::new(0x2000),
            DevPtr::new(0x3000),
        );
        let moved = GemmArgs {
            a: DevPtr::new(0x9000),
            b: DevPtr::new(0xa000),
            c: DevPtr::new(0xb000),
            ..a
        };
        assert_eq!(TuneKey::of(&a), TuneKey::of(&moved));
        let unaligned = GemmArgs {
            c: DevPtr::new(0x3004),
            ..a
        };
        assert_ne!(TuneKey::of(&a), TuneKey::of(&unaligned));
        let mut hooked = a;
        hooked.hooks.signal = Some(super::super::SignalHook {
            counters: DevPtr::new(0x4000),
            rows_per_counter: 128,
        });
        assert_ne!(TuneKey::of(&a), TuneKey::of(&hooked));
        let mut acc = a;
        acc.accumulate = true;
        assert_ne!(TuneKey::of(&a), TuneKey::of(&acc));
    }

    #[test]
    fn with_schedule_keeps_hooks() {
        let mut a = GemmArgs::dense(
            256,
            512,
            1024,
            DevPtr::new(0x1000),
            DevPtr::new(0x2000),
            DevPtr::new(0x3000),
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
