//! Per-shape autotuning of ficco's own GEMM: time the schedules that
//! `gemm-bench` sweeps too ([`schedule_variants`] plus the
//! chooser's own, [`super::auto_schedule`]) on scratch buffers, keep the
//! fastest in memory and on disk next to the cubin cache, so that a shape
//! is timed once per kernel source and device. [`HopperGemm::launch`]
//! applies the cached pick to launches that leave the schedule open.
//! The schedule space itself (the candidates, [`KernelTuneKey`], [`KernelSchedule`])
//! is `super::schedule`'s, re-exported here; this file is the timing and
//! the disk cache.
//!
//! The key holds everything that changes which schedule is fastest or
//! valid: the dimensions, leading dimensions, accumulate, SM budget,
//! occupancy, grouping, and which hooks are on (tuning runs with
//! the same hooks, on scratch flags already set, so the pick is one that
//! honours them). Pointers are not in the key: the tuned schedule is valid
//! for any operands of the shape.

use super::compile::SOURCE;
use super::launch::{DestLayout, DestMaps};
use super::load::HopperGemm;
use super::params::{Bf16, GemmArgs, Hooks, TileN, TypedPtr};
pub use super::schedule::{
    schedule_label, schedule_variants, with_schedule, KernelSchedule, KernelTuneKey,
};
use crate::controls::time_batched_ms;
use crate::driver::cuda::memset_d32;
use crate::error::{CudaError, Result};
use crate::mem::DeviceBuffer;
use std::path::PathBuf;

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
pub struct TunedKernel {
    pub schedule: KernelSchedule,
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

/// The median of unsorted times (0 when empty).
fn median_of(t: &[f32]) -> f32 {
    ficco_core::stats::median(t).unwrap_or(0.0) as f32
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
pub fn candidates(g: &HopperGemm, args: &GemmArgs) -> Vec<KernelSchedule> {
    let grid = args.hooks.sm_budget.unwrap_or(g.sms()).max(1);
    let chosen = g
        .shape(&GemmArgs {
            hooks: Hooks {
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
pub(super) fn disk_path(device: &str, key: &KernelTuneKey) -> Option<PathBuf> {
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
fn encode((tile, splits, tail): KernelSchedule) -> String {
    format!("{} {splits} {}\n", tile.label(), tail as u8)
}

fn decode(s: &str) -> Option<KernelSchedule> {
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

/// Scratch operands and hook words for timing one key.
struct Scratch {
    _bufs: Vec<DeviceBuffer>,
    _maps: Option<DestMaps>,
    args: GemmArgs,
}

fn scratch(g: &HopperGemm, key: &KernelTuneKey, template: &GemmArgs) -> Result<Scratch> {
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
        w.flags = TypedPtr::new(f.ptr().raw());
        bufs.push(f);
    }
    if let Some(s) = hooks.signal.as_mut() {
        let n = words(s.rows_per_counter);
        let f = DeviceBuffer::alloc(ctx, n * 4)?;
        // SAFETY: f holds n u32; the context is current.
        unsafe { memset_d32(f.ptr(), 0, n)? };
        s.counters = TypedPtr::new(f.ptr().raw());
        bufs.push(f);
    }
    if let Some(d) = hooks.dest.as_mut() {
        let n = words(d.rows_per_block);
        let f = DeviceBuffer::alloc(ctx, n * 8)?;
        // SAFETY: f holds 2n u32; the context is current.
        unsafe { memset_d32(f.ptr(), 0, 2 * n)? };
        d.table = TypedPtr::new(f.ptr().raw());
        d.ld = key.ldc;
        bufs.push(f);
    }
    let c_ptr = TypedPtr::new(c.ptr().raw() + c_off);
    // Per-block maps of the zero table (every block's rows in C); where C
    // cannot take them (rows not 16-byte aligned), timed without maps.
    let mut maps = None;
    if let Some(d) = hooks.dest.as_mut().filter(|d| d.maps.is_some()) {
        let table = vec![0u64; key.m.div_ceil(d.rows_per_block.max(1) as usize)];
        maps = g
            .dest_maps(&DestLayout {
                table: &table,
                ld: key.ldc,
                rows_per_block: d.rows_per_block,
                m: key.m,
                n: key.n,
                c: c_ptr,
                ldc: key.ldc,
            })
            .ok();
        d.maps = maps.as_ref().map(|m| m.ptr());
    }
    let args = GemmArgs {
        a: TypedPtr::<Bf16>::new(a.ptr().raw()),
        b: TypedPtr::new(b.ptr().raw()),
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
    pub fn autotune(&self, args: &GemmArgs) -> Result<TunedKernel> {
        let key = KernelTuneKey::of(args);
        if let Some(&s) = self.tuned_map()?.get(&key) {
            return Ok(TunedKernel {
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
        let valid = |s: KernelSchedule| self.shape(&with_schedule(&probe, s)).is_ok();
        if let Some(s) = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| decode(&t))
            .filter(|&s| valid(s))
        {
            self.tuned_map()?.insert(key, s);
            return Ok(TunedKernel {
                schedule: s,
                source: TuneSource::Disk,
            });
        }
        let cands: Vec<KernelSchedule> = candidates(self, &probe)
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
        Ok(TunedKernel {
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
        disk_path(&device, &KernelTuneKey::of(args))
    }

    /// How many shapes this instance has timed (not read from memory or disk).
    pub fn tune_timings(&self) -> u64 {
        self.timings.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
