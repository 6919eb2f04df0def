//! The hook rows of `gemm-bench` ([`Bench::hook_costs`]): every hook
//! setting (SM budget, stages, tile order, wait, signal, destination, the
//! ping-pong tile and their combinations) launched on one shape, checked
//! against the plain launch and timed in interleaved pairs with it. In its
//! own file because the settings list is long and independent of the rest.

use super::report::{
    tflops, HookRow, HOOKS_3_TO_6, HOOKS_3_TO_6_MAPS, HOOKS_3_TO_6_PINGPONG,
    HOOKS_3_TO_6_PINGPONG_MAPS, HOOKS_3_TO_6_REGISTER, PINGPONG,
};
use super::{Bench, BenchEngine};
use crate::driver::cuda::memcpy_dtod_async;
use crate::error::Result;
use crate::hgemm::{
    DestHook, DestLayout, GemmArgs, Hooks, Occupancy, SignalHook, TileN, TypedPtr, WaitHook,
    BLOCK_M, MIN_STAGES,
};
use crate::mem::DeviceBuffer;

/// The shapes hook costs are measured on: 8192³, a whole MLP-up GEMM and a
/// chunk-sized one.
pub const HOOK_SHAPES: [(usize, usize, usize); 3] =
    [(8192, 8192, 8192), (2048, 14336, 4096), (1024, 4096, 7168)];

impl Bench {
    /// Times each hook setting on one shape against the plain launch. Hook
    /// flags are already set (the wait never blocks), the destination table
    /// points back into C, so every setting computes the plain result.
    pub fn hook_costs(&mut self, m: usize, n: usize, k: usize) -> Result<Vec<HookRow>> {
        let o = self.operands(m, n, k)?;
        let ctx = self.ctx.clone();
        let mut plain = GemmArgs::dense(
            m,
            n,
            k,
            TypedPtr::new(o.a.ptr().raw()),
            TypedPtr::new(o.b.ptr().raw()),
            TypedPtr::new(o.c.ptr().raw()),
        );
        plain.hooks.untuned = true;
        // Reference output of the plain launch.
        // SAFETY: operands sized for the shape.
        unsafe { self.gemm.launch(self.cu(), &plain)? };
        // SAFETY: both hold m*n bf16; the stream is live.
        unsafe { memcpy_dtod_async(o.r.ptr(), o.c.ptr(), m * n * 2, self.cu())? };
        let rows = (m / 8).max(1);
        let blocks = m.div_ceil(rows);
        let flags = DeviceBuffer::alloc(&ctx, blocks * 4)?;
        let counters = DeviceBuffer::alloc(&ctx, blocks * 4)?;
        let table = DeviceBuffer::alloc(&ctx, blocks * 8)?;
        let flag_bytes: Vec<u8> = (0..blocks).flat_map(|_| 1u32.to_le_bytes()).collect();
        flags.upload(&flag_bytes)?;
        counters.upload(&vec![0u8; blocks * 4])?;
        let entries: Vec<u64> = (0..blocks)
            .map(|b| o.c.ptr().raw() + (b * rows * n * 2) as u64)
            .collect();
        let tbl: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        table.upload(&tbl)?;
        // The same table as tensor maps (TMA-store epilogue), where the rows
        // per block allow (multiples of 64).
        let maps = self
            .gemm
            .dest_maps(&DestLayout {
                table: &entries,
                ld: n,
                rows_per_block: rows as u32,
                m,
                n,
                c: TypedPtr::new(o.c.ptr().raw()),
                ldc: n,
            })
            .ok();
        let wait = WaitHook {
            flags: TypedPtr::new(flags.ptr().raw()),
            rows_per_flag: rows as u32,
            epoch: 1,
        };
        let signal = SignalHook {
            counters: TypedPtr::new(counters.ptr().raw()),
            rows_per_counter: rows as u32,
        };
        let dest = DestHook {
            table: TypedPtr::new(table.ptr().raw()),
            ld: n,
            rows_per_block: rows as u32,
            add: false,
            maps: None,
        };
        let dest_maps = maps.as_ref().map(|mp| DestHook {
            maps: Some(mp.ptr()),
            ..dest
        });
        let sms = self.gemm.sms();
        let tiles_m = m.div_ceil(BLOCK_M) as u32;
        let mut settings: Vec<(String, Hooks)> = vec![("plain".into(), Hooks::default())];
        for s in [sms - sms / 8, sms * 3 / 4, (sms / 2).max(1)] {
            settings.push((
                format!("sm_budget={s}"),
                Hooks {
                    sm_budget: Some(s),
                    ..Hooks::default()
                },
            ));
        }
        let base = self.gemm.shape(&plain)?;
        let tile = base.tile_n;
        for st in (MIN_STAGES..tile.max_stages()).rev() {
            settings.push((
                format!("stages={st}"),
                Hooks {
                    occupancy: Occupancy {
                        stages: st,
                        extra_smem: 0,
                    },
                    ..Hooks::default()
                },
            ));
        }
        let extra = self.gemm.max_extra_smem(tile, tile.max_stages()) / 1024 * 1024;
        settings.push((
            format!(
                "stages={}+extra_smem={}KiB",
                tile.max_stages(),
                extra / 1024
            ),
            Hooks {
                occupancy: Occupancy {
                    stages: tile.max_stages(),
                    extra_smem: extra,
                },
                ..Hooks::default()
            },
        ));
        for gm in [4, 8, 32] {
            settings.push((
                format!("group_m={gm}"),
                Hooks {
                    group_m: Some(gm),
                    ..Hooks::default()
                },
            ));
        }
        let start = tiles_m / 2;
        let h3 = Hooks {
            m_start_block: start,
            ..Hooks::default()
        };
        settings.push((format!("tile_start={start}"), h3));
        settings.push((
            "wait(flags set)".into(),
            Hooks {
                wait: Some(wait),
                ..Hooks::default()
            },
        ));
        settings.push((
            "signal".into(),
            Hooks {
                signal: Some(signal),
                ..Hooks::default()
            },
        ));
        settings.push((
            "dest(table->C) register".into(),
            Hooks {
                dest: Some(dest),
                register_epilogue: true,
                ..Hooks::default()
            },
        ));
        for delay in [2, 4] {
            settings.push((
                format!("signal delay={delay}"),
                Hooks {
                    signal: Some(signal),
                    signal_delay: delay,
                    ..Hooks::default()
                },
            ));
        }
        settings.push((
            "dest(table->C)".into(),
            Hooks {
                dest: Some(dest),
                ..Hooks::default()
            },
        ));
        let h36 = Hooks {
            m_start_block: start,
            wait: Some(wait),
            signal: Some(signal),
            dest: Some(dest),
            ..Hooks::default()
        };
        settings.push((HOOKS_3_TO_6.into(), h36));
        settings.push((
            HOOKS_3_TO_6_REGISTER.into(),
            Hooks {
                register_epilogue: true,
                ..h36
            },
        ));
        // The ping-pong tile, plain and with hooks 3-6: its epilogue and
        // signals run under the other warpgroup's main loop.
        let pp = Hooks {
            tile_n: Some(TileN::Pp128),
            split_k: Some(1),
            ..Hooks::default()
        };
        settings.push((PINGPONG.into(), pp));
        // Each hook alone on the ping-pong tile.
        for (name, h) in [
            (
                "pingpong wait",
                Hooks {
                    wait: Some(wait),
                    ..pp
                },
            ),
            (
                "pingpong signal",
                Hooks {
                    signal: Some(signal),
                    ..pp
                },
            ),
            (
                "pingpong dest",
                Hooks {
                    dest: Some(dest),
                    ..pp
                },
            ),
            (
                "pingpong dest+signal",
                Hooks {
                    dest: Some(dest),
                    signal: Some(signal),
                    ..pp
                },
            ),
        ] {
            settings.push((name.into(), h));
        }
        settings.push((
            HOOKS_3_TO_6_PINGPONG.into(),
            Hooks {
                tile_n: pp.tile_n,
                split_k: pp.split_k,
                ..h36
            },
        ));
        // The destination hook through per-block tensor maps (TMA stores).
        if let Some(dm) = dest_maps {
            settings.push((
                "dest(maps)".into(),
                Hooks {
                    dest: Some(dm),
                    ..Hooks::default()
                },
            ));
            settings.push((
                "pingpong dest(maps)".into(),
                Hooks {
                    dest: Some(dm),
                    ..pp
                },
            ));
            settings.push((
                HOOKS_3_TO_6_MAPS.into(),
                Hooks {
                    dest: Some(dm),
                    ..h36
                },
            ));
            settings.push((
                HOOKS_3_TO_6_PINGPONG_MAPS.into(),
                Hooks {
                    tile_n: pp.tile_n,
                    split_k: pp.split_k,
                    dest: Some(dm),
                    ..h36
                },
            ));
        }
        // A setting the kernel rejects or cannot launch is reported as
        // failed; the others are still measured.
        let mut checked = vec![];
        for (_, hooks) in &settings {
            // Every setting as given: no tuned schedule (the shape may have
            // been tuned with other hooks), so that only the setting differs.
            let args = GemmArgs {
                hooks: Hooks {
                    untuned: true,
                    ..*hooks
                },
                ..plain
            };
            self.poison(&o.c, m * n)?;
            // SAFETY: operands and hook arrays sized for the shape.
            let launched = unsafe { self.gemm.launch(self.cu(), &args) };
            checked.push(match launched {
                Ok(()) => Ok((args, self.rel_err(o.c.ptr(), o.r.ptr(), m * n)?)),
                Err(e) => Err(e.to_string()),
            });
        }
        // Each setting is timed against the plain launch in interleaved
        // pairs: the GPU's clock follows its power draw, so settings timed
        // apart would compare different clocks.
        let mut rows = vec![];
        for ((setting, _), c) in settings.into_iter().zip(checked) {
            let row = match c {
                Ok((args, rel_err)) => {
                    // SAFETY: as above; the buffers live until the end of this function.
                    let t = unsafe {
                        self.time_interleaved(&[
                            BenchEngine::Ficco(plain),
                            BenchEngine::Ficco(args),
                        ])?
                    };
                    let (base, ms) = (t[0], t[1]);
                    HookRow {
                        m,
                        n,
                        k,
                        setting,
                        ms,
                        tflops: tflops(m, n, k, ms),
                        cost: if base > 0.0 { ms / base - 1.0 } else { 0.0 },
                        rel_err,
                        error: None,
                    }
                }
                Err(e) => HookRow {
                    m,
                    n,
                    k,
                    setting,
                    ms: 0.0,
                    tflops: 0.0,
                    cost: 0.0,
                    rel_err: 0.0,
                    error: Some(e),
                },
            };
            rows.push(row);
        }
        self.sync()?;
        Ok(rows)
    }
}
