//! Host-side tests of the GEMM (no GPU): the parameter block's layout, the
//! validator's geometry and refusals, the chooser, the signal advance, the
//! source's entries; and the NVRTC compile tests (NVRTC, no GPU). In a file
//! of their own so that the files they test stay short.

use super::compile::{ENTRIES, ENTRY_N128_GROUPED, ENTRY_N256_GROUPED};
use super::launch::{KernelParams, TensorMap};
use super::validate::Limits;
use super::*;
use crate::error::Result;

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
        counters: TypedPtr::new(0x1000),
        rows_per_counter: u32::MAX,
    });
    let err = validate(&a, 232448, 132).unwrap_err().to_string();
    assert!(err.contains("advance a counter"), "{err}");
    a.hooks.signal = Some(SignalHook {
        counters: TypedPtr::new(0x1000),
        rows_per_counter: 128,
    });
    assert!(validate(&a, 232448, 132).is_ok());
}

/// [`super::validate::validate`] on an H200-like device (`max_smem`, `sms`) that
/// holds 60 clusters of 2 at once.
fn validate(a: &GemmArgs, max_smem: u32, sms: u32) -> Result<LaunchShape> {
    super::validate::validate(
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
        TypedPtr::new(0x1000),
        TypedPtr::new(0x2000),
        TypedPtr::new(0x3000),
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
        table: TypedPtr::new(0x4000),
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
    plain.c = TypedPtr::new(0x3004);
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
        table: TypedPtr::new(0x8000),
        ld: 528,
        rows_per_block: 128,
        add: false,
        maps: Some(TypedPtr::new(0x10000)),
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
        maps: Some(TypedPtr::new(0x10040)),
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
    a.a = TypedPtr::new(0x1008);
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
    let s = super::validate::validate(&a, lim(60)).unwrap();
    assert_eq!((s.tiles_m, s.tiles_n, s.grid, s.splits), (8, 3, 24, 1));
    // 8192^2 ping-pong: 32 x 64 pair units; the grid is what is resident.
    let mut big = args(8192, 8192, 8192);
    big.hooks.tile_n = Some(TileN::Pp128C2);
    assert_eq!(super::validate::validate(&big, lim(60)).unwrap().grid, 120);
    assert_eq!(super::validate::validate(&big, lim(66)).unwrap().grid, 132);
    // An odd SM budget rounds down to whole clusters.
    big.hooks.sm_budget = Some(7);
    assert_eq!(super::validate::validate(&big, lim(60)).unwrap().grid, 6);
    for (change, needle) in [
        (
            (|a: &mut GemmArgs| a.hooks.sm_budget = Some(1)) as fn(&mut GemmArgs),
            "SM budget under 2",
        ),
        (
            |a: &mut GemmArgs| {
                a.hooks.wait = Some(WaitHook {
                    flags: TypedPtr::new(0x4000),
                    rows_per_flag: 128,
                    epoch: 1,
                })
            },
            "wait or signal hook",
        ),
        (
            |a: &mut GemmArgs| {
                a.hooks.signal = Some(SignalHook {
                    counters: TypedPtr::new(0x4000),
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
        let e = super::validate::validate(&b, lim(60))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{e}");
    }
    // A device that cannot say how many clusters fit runs none.
    let e = super::validate::validate(&a, lim(0))
        .unwrap_err()
        .to_string();
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
            flags: TypedPtr::new(0x1000),
            rows_per_flag: 64,
            epoch: 1,
        })
    })
    .is_err());
    assert!(hooked(&|h| {
        h.signal = Some(SignalHook {
            counters: TypedPtr::new(0x1000),
            rows_per_counter: 64,
        })
    })
    .is_err());
    assert!(hooked(&|h| {
        h.dest = Some(DestHook {
            table: TypedPtr::new(0x1000),
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

/// `$FICCO_CUBIN_CACHE` moves the one cubin cache (`crate::nvrtc`) and the
/// tune files beside it: the kernel is compiled and stored there once, then
/// comes from memory. Needs NVRTC, no GPU. The variable is set in a child
/// process (the tests of one process share its environment).
#[test]
#[ignore = "needs NVRTC (.ci/run and bench/gpu-tests.sh run it: --include-ignored)"]
fn cubin_and_tune_files_follow_ficco_cubin_cache() {
    crate::loader::require_nvrtc("cubin_and_tune_files_follow_ficco_cubin_cache");
    let Some(dir) = std::env::var_os("FICCO_CUBIN_CACHE_TEST_DIR") else {
        let dir =
            std::env::temp_dir().join(format!("ficco-hgemm-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "hgemm::tests::cubin_and_tune_files_follow_ficco_cubin_cache",
                "--include-ignored",
                "--nocapture",
            ])
            .env("FICCO_CUBIN_CACHE", &dir)
            .env("FICCO_CUBIN_CACHE_TEST_DIR", &dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the check ran: {text}");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let (image, info) = super::compile::cubin_cached().unwrap_or_else(|e| panic!("{e}"));
    assert!(image.starts_with(b"\x7fELF"), "not a CUBIN");
    assert_eq!(info.cache, CacheOutcome::Stored, "{info:?}");
    let path = info.path.clone().expect("stored in the cache directory");
    assert_eq!(path.parent(), Some(dir.as_path()));
    assert!(path.is_file(), "{path:?}");
    let (again, info) = super::compile::cubin_cached().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((info.cache, info.path), (CacheOutcome::Memory, Some(path)));
    assert_eq!(again, image);
    let key = super::tune::KernelTuneKey::of(&args(256, 512, 1024));
    let tune_file = super::tune::disk_path("some GPU", &key).expect("a tune file path");
    assert_eq!(tune_file.parent(), Some(dir.as_path()));
    let name = tune_file
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("hgemm-tune-") && name.ends_with(".txt"),
        "{name}"
    );
}
