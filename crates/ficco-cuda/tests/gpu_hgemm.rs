//! GPU exactness tests of ficco's Hopper GEMM ([`ficco_cuda::hgemm`]) and of
//! each of its hooks. They need a Hopper GPU, so they are `#[ignore]`d and
//! fail where they run without one (see `ficco_testkit` for the policy). Run on
//! the device with `--include-ignored --test-threads=1 --nocapture`
//! (`bench/gpu-tests.sh`).

use common::{b2f, no_gpu, rand, rel_err};
use cudarc::driver::{sys, CudaContext};
use ficco_cuda::gemm::{GemmKey, Gemms, WORKSPACE_BYTES};
use ficco_cuda::hgemm::{
    signal_advance, Bf16, DestHook, DestLayout, GemmArgs, Hooks, HopperGemm, Occupancy, SignalHook,
    TileN, TypedPtr, WaitHook, BLOCK_M,
};
use ficco_cuda::mem::DeviceBuffer;
use ficco_testkit as common;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

const NAN: u16 = 0x7fc0;

/// The loaded kernel on GPU 0, shared by the tests (one at a time); fails
/// the test where there is no usable Hopper GPU.
type Gpu = (Arc<CudaContext>, HopperGemm);

fn gpu() -> MutexGuard<'static, Gpu> {
    static G: OnceLock<Result<Mutex<Gpu>, String>> = OnceLock::new();
    let g = G.get_or_init(|| {
        ficco_cuda::loader::require().map_err(|e| e.to_string())?;
        let n = CudaContext::device_count().map_err(|e| format!("{e:?}"))?;
        if n < 1 {
            return Err("no GPU".into());
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("{e:?}"))?;
        let g = HopperGemm::load(&ctx).map_err(|e| e.to_string())?;
        let ci = g.compile_info();
        eprintln!(
            "hgemm cubin: {:.1} ms ({:?}), {} SMs",
            ci.ms,
            ci.cache,
            g.sms()
        );
        Ok(Mutex::new((ctx, g)))
    });
    match g {
        Ok(m) => m.lock().unwrap_or_else(|p| p.into_inner()),
        Err(e) => no_gpu("this Hopper GEMM test", e),
    }
}

fn to_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn upload(ctx: &Arc<CudaContext>, v: &[u16]) -> DeviceBuffer {
    let b = DeviceBuffer::alloc(ctx, v.len() * 2).expect("alloc");
    b.upload(&to_bytes(v)).expect("upload");
    b
}

fn upload_u32(ctx: &Arc<CudaContext>, v: &[u32]) -> DeviceBuffer {
    let b = DeviceBuffer::alloc(ctx, v.len() * 4).expect("alloc");
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    b.upload(&bytes).expect("upload");
    b
}

fn upload_u64(ctx: &Arc<CudaContext>, v: &[u64]) -> DeviceBuffer {
    let b = DeviceBuffer::alloc(ctx, v.len() * 8).expect("alloc");
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    b.upload(&bytes).expect("upload");
    b
}

fn download(b: &DeviceBuffer, n: usize) -> Vec<u16> {
    let mut out = vec![0u8; n * 2];
    b.download(&mut out).expect("download");
    out.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// What `launches` launches leave in the signal counters of an `m` × `n`
/// output with `rows` rows per counter (from 0): each block's
/// [`signal_advance`] per launch, whatever the tile.
fn advances(m: usize, n: usize, rows: usize, launches: u32) -> Vec<u32> {
    (0..m.div_ceil(rows))
        .map(|b| launches * signal_advance(m, n, rows, b).expect("advance"))
        .collect()
}

fn download_u32(b: &DeviceBuffer, n: usize) -> Vec<u32> {
    let mut out = vec![0u8; n * 4];
    b.download(&mut out).expect("download");
    out.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A view problem on the host: A [m, lda], B [k, ldb], C [m, ldc] (poisoned).
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    a: Vec<u16>,
    b: Vec<u16>,
}

impl Problem {
    fn new(m: usize, n: usize, k: usize, pad: (usize, usize, usize), seed: u64) -> Self {
        let (lda, ldb, ldc) = (k + pad.0, n + pad.1, n + pad.2);
        Problem {
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
            a: rand(m * lda, seed),
            b: rand(k * ldb, seed + 7),
        }
    }

    /// f32 reference of A·B (row-major, m × n).
    fn reference(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.m * self.n];
        let bf: Vec<f32> = self.b.iter().map(|&x| b2f(x)).collect();
        for i in 0..self.m {
            let row = &mut out[i * self.n..(i + 1) * self.n];
            for p in 0..self.k {
                let av = b2f(self.a[i * self.lda + p]);
                let brow = &bf[p * self.ldb..p * self.ldb + self.n];
                for (o, &bv) in row.iter_mut().zip(brow) {
                    *o += av * bv;
                }
            }
        }
        out
    }
}

/// Device copies of a problem and the args of its plain launch.
struct Dev {
    a: DeviceBuffer,
    b: DeviceBuffer,
    c: DeviceBuffer,
    args: GemmArgs,
}

fn device(ctx: &Arc<CudaContext>, p: &Problem) -> Dev {
    let a = upload(ctx, &p.a);
    let b = upload(ctx, &p.b);
    let c = upload(ctx, &vec![NAN; p.m * p.ldc]);
    let args = GemmArgs {
        m: p.m,
        n: p.n,
        k: p.k,
        a: TypedPtr::<Bf16>::new(a.ptr().raw()),
        lda: p.lda,
        b: TypedPtr::new(b.ptr().raw()),
        ldb: p.ldb,
        c: TypedPtr::new(c.ptr().raw()),
        ldc: p.ldc,
        accumulate: false,
        hooks: Hooks::default(),
    };
    Dev { a, b, c, args }
}

fn run(ctx: &Arc<CudaContext>, g: &HopperGemm, args: &GemmArgs) {
    let stream = ctx.new_stream().expect("stream");
    // SAFETY: the args' buffers are alive and sized for the views.
    unsafe { g.launch(stream.cu_stream(), args) }.expect("launch");
    stream.synchronize().expect("sync (kernel fault?)");
}

/// A destination buffer of `m` rows, `ldd` elements apart, holding random
/// data (`x`, seeded), and a destination table of `rows`-row blocks, on
/// the host and the device: odd blocks go to the buffer (at the block's own
/// rows), even ones stay in C (0).
struct Redirect {
    x: Vec<u16>,
    dst: DeviceBuffer,
    table: Vec<u64>,
    tbl: DeviceBuffer,
}

fn odd_blocks_redirect(
    ctx: &Arc<CudaContext>,
    m: usize,
    rows: usize,
    ldd: usize,
    seed: u64,
) -> Redirect {
    let x = rand(m * ldd, seed);
    let dst = upload(ctx, &x);
    let table: Vec<u64> = (0..m.div_ceil(rows))
        .map(|b| {
            if b % 2 == 1 {
                dst.ptr().raw() + (b * rows * ldd * 2) as u64
            } else {
                0
            }
        })
        .collect();
    let tbl = upload_u64(ctx, &table);
    Redirect { x, dst, table, tbl }
}

/// The m × n view of C (ldc) as f32.
fn view(c: &[u16], m: usize, n: usize, ld: usize) -> Vec<f32> {
    (0..m)
        .flat_map(|i| c[i * ld..i * ld + n].iter().map(|&x| b2f(x)))
        .collect()
}

/// Elements outside the m × n view (padding columns) are still poison.
fn padding_untouched(c: &[u16], m: usize, n: usize, ld: usize) -> bool {
    (0..m).all(|i| c[i * ld + n..(i + 1) * ld].iter().all(|&x| x == NAN))
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn plain_gemm_matches_host_reference() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    // (m, n, k, (lda, ldb, ldc padding)): tile-exact, M/N/K residues, K and N
    // multiples of 8 but not of 64, tiny, and views with leading dimensions.
    let cases = [
        (128, 256, 64, (0, 0, 0)),
        (200, 264, 72, (0, 0, 0)),
        (1, 8, 8, (0, 0, 0)),
        (333, 520, 200, (0, 0, 0)),
        (257, 1032, 136, (16, 8, 24)),
        (640, 776, 1000, (8, 40, 2)),
        (1000, 256, 512, (64, 0, 8)),
    ];
    for (i, &(m, n, k, pad)) in cases.iter().enumerate() {
        let p = Problem::new(m, n, k, pad, 100 + i as u64);
        let reference = p.reference();
        for tile in [TileN::N256, TileN::N128, TileN::Pp128] {
            let d = device(ctx, &p);
            let args = GemmArgs {
                hooks: Hooks {
                    tile_n: Some(tile),
                    split_k: Some(1),
                    ..Hooks::default()
                },
                ..d.args
            };
            run(ctx, g, &args);
            let c = download(&d.c, m * p.ldc);
            let err = rel_err(&view(&c, m, n, p.ldc), &reference);
            let pad_ok = padding_untouched(&c, m, n, p.ldc);
            eprintln!(
                "hgemm {tile:?} {m}x{n}x{k} lds ({}, {}, {}): rel err {err:.2e}, padding untouched {pad_ok}",
                p.lda, p.ldb, p.ldc
            );
            assert!(err < 1e-2, "{m}x{n}x{k}: rel err {err}");
            assert!(pad_ok, "{m}x{n}x{k}: wrote outside the view");
        }
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn accumulate_adds_into_c() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let (m, n, k) = (300, 392, 264);
    let p = Problem::new(m, n, k, (0, 0, 0), 7);
    let d = device(ctx, &p);
    let c0 = rand(m * n, 99);
    d.c.upload(&to_bytes(&c0)).expect("upload");
    run(
        ctx,
        g,
        &GemmArgs {
            accumulate: true,
            ..d.args
        },
    );
    let c = download(&d.c, m * n);
    let mut reference = p.reference();
    for (r, &x) in reference.iter_mut().zip(&c0) {
        *r += b2f(x);
    }
    let err = rel_err(&view(&c, m, n, n), &reference);
    eprintln!("hgemm accumulate {m}x{n}x{k}: rel err {err:.2e}");
    assert!(err < 1e-2, "rel err {err}");
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn large_gemm_matches_cublaslt() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    for &(m, n, k) in &[(2048, 3072, 4096), (1000, 4104, 1032)] {
        let p = Problem::new(m, n, k, (0, 0, 0), 3);
        let d = device(ctx, &p);
        run(ctx, g, &d.args);
        let ours = download(&d.c, m * n);
        let r = upload(ctx, &vec![NAN; m * n]);
        let ws = DeviceBuffer::alloc(ctx, WORKSPACE_BYTES).expect("ws");
        ctx.bind_to_thread().expect("bind");
        let mut lt = Gemms::new().expect("cublaslt");
        let stream = ctx.new_stream().expect("stream");
        let key = GemmKey {
            m,
            n,
            k,
            lda: k,
            ldb: n,
            ldc: n,
            sm_target: None,
            b_transposed: false,
        };
        // SAFETY: buffers sized for the shape.
        unsafe {
            lt.gemm(
                key,
                d.a.ptr(),
                d.b.ptr(),
                r.ptr(),
                false,
                ws.ptr(),
                stream.cu_stream(),
            )
        }
        .expect("cublaslt gemm");
        stream.synchronize().expect("sync");
        let theirs = download(&r, m * n);
        let f = |v: &[u16]| v.iter().map(|&x| b2f(x)).collect::<Vec<_>>();
        let err = rel_err(&f(&ours), &f(&theirs));
        eprintln!("hgemm {m}x{n}x{k} vs cuBLASLt: rel err {err:.2e}");
        assert!(err < 1e-2, "rel err {err}");
    }
}

/// Output of a hooked launch equals the plain launch's, bit for bit (each
/// tile's accumulation order does not depend on which CTA runs it).
fn same_as_plain(name: &str, m: usize, n: usize, k: usize, hooks: impl Fn(&Dev) -> Hooks) {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let p = Problem::new(m, n, k, (0, 0, 8), 11);
    let d = device(ctx, &p);
    let mut h = hooks(&d);
    // The same K split and tile on both sides (the automatic choice depends
    // on the grid).
    let split_k = Some(h.split_k.unwrap_or(1));
    let tile_n = Some(h.tile_n.unwrap_or(TileN::N256));
    h.split_k = split_k;
    h.tile_n = tile_n;
    let plain_args = GemmArgs {
        hooks: Hooks {
            split_k,
            tile_n,
            ..Hooks::default()
        },
        ..d.args
    };
    run(ctx, g, &plain_args);
    let plain = download(&d.c, m * p.ldc);
    d.c.upload(&to_bytes(&vec![NAN; m * p.ldc]))
        .expect("poison");
    run(ctx, g, &GemmArgs { hooks: h, ..d.args });
    let hooked = download(&d.c, m * p.ldc);
    let diff = plain.iter().zip(&hooked).filter(|(a, b)| a != b).count();
    eprintln!("hgemm hook {name} {m}x{n}x{k}: {diff} elements differ from the plain launch");
    assert_eq!(diff, 0, "{name}");
    let err = rel_err(&view(&plain, m, n, p.ldc), &p.reference());
    assert!(err < 1e-2, "plain rel err {err}");
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook1_sm_budget() {
    for s in [1, 3, 17] {
        same_as_plain(&format!("sm_budget={s}"), 1000, 1000, 256, |_| Hooks {
            sm_budget: Some(s),
            ..Hooks::default()
        });
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook2_occupancy() {
    for (stages, extra) in [(2, 0), (3, 0), (3, 48 * 1024), (4, 16 * 1024)] {
        same_as_plain(
            &format!("stages={stages} extra={extra}"),
            700,
            1024,
            520,
            |_| Hooks {
                occupancy: Occupancy {
                    stages,
                    extra_smem: extra,
                },
                ..Hooks::default()
            },
        );
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook3_tile_order() {
    for start in [1, 3, 7] {
        same_as_plain(&format!("m_start_block={start}"), 1000, 520, 128, |_| {
            Hooks {
                m_start_block: start,
                sm_budget: Some(2),
                ..Hooks::default()
            }
        });
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook4_wait_flags_already_set() {
    let guard = gpu();
    let ctx = guard.0.clone();
    drop(guard);
    let rows = 96usize; // not a tile multiple: flags straddle tiles
    let m = 1000usize;
    let flags = upload_u32(&ctx, &vec![5u32; m.div_ceil(rows)]);
    same_as_plain("wait(set)", m, 520, 136, |_| Hooks {
        wait: Some(WaitHook {
            flags: TypedPtr::new(flags.ptr().raw()),
            rows_per_flag: rows as u32,
            epoch: 5,
        }),
        ..Hooks::default()
    });
}

/// Launches `args` (a wait hook on `flags`, 4-byte words) on one stream,
/// checks that it still waits 100 ms later, then sets the words `late` to
/// `epoch` from a second stream (`cuStreamWriteValue32`, as a copy engine's
/// stream does) and returns C's relative error against the reference.
fn release_late(
    (ctx, g): &Gpu,
    p: &Problem,
    d: &Dev,
    args: &GemmArgs,
    flags: &DeviceBuffer,
    late: impl Iterator<Item = usize>,
    epoch: u32,
) -> f64 {
    let s1 = ctx.new_stream().expect("stream");
    let s2 = ctx.new_stream().expect("stream");
    // SAFETY: buffers alive; the flags are released below.
    unsafe { g.launch(s1.cu_stream(), args) }.expect("launch");
    std::thread::sleep(std::time::Duration::from_millis(100));
    // SAFETY: live stream.
    let pending = unsafe { sys::cuStreamQuery(s1.cu_stream()) };
    eprintln!("hgemm wait hook: before the flags, stream query = {pending:?}");
    assert_eq!(pending, sys::CUresult::CUDA_ERROR_NOT_READY, "did not wait");
    for b in late {
        // SAFETY: `late` indexes words of `flags`; live stream.
        let r = unsafe {
            sys::cuStreamWriteValue32_v2(s2.cu_stream(), flags.ptr().raw() + 4 * b as u64, epoch, 0)
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    }
    s2.synchronize().expect("sync");
    s1.synchronize().expect("sync");
    let c = download(&d.c, p.m * p.n);
    rel_err(&view(&c, p.m, p.n, p.n), &p.reference())
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook4_wait_blocks_until_flags_arrive() {
    let guard = gpu();
    let ctx = &guard.0;
    let (m, n, k) = (512, 512, 256);
    let rows = 128;
    let p = Problem::new(m, n, k, (0, 0, 0), 21);
    let d = device(ctx, &p);
    let blocks = m / rows;
    let flags = upload_u32(ctx, &vec![0u32; blocks]);
    let args = GemmArgs {
        hooks: Hooks {
            wait: Some(WaitHook {
                flags: TypedPtr::new(flags.ptr().raw()),
                rows_per_flag: rows as u32,
                epoch: 1,
            }),
            ..Hooks::default()
        },
        ..d.args
    };
    let err = release_late(&guard, &p, &d, &args, &flags, 0..blocks, 1);
    eprintln!("hgemm wait hook: after the flags, rel err {err:.2e}");
    assert!(err < 1e-2);
}

/// Flags of even blocks set before the launch, odd ones 100 ms into it:
/// tiles straddle a set and an unset flag (96-row blocks), so the producer's
/// first poll finds some set and then spins on the rest, and with 3 CTAs
/// each takes several tiles of flags it has already seen.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook4_wait_some_flags_late() {
    let guard = gpu();
    let ctx = &guard.0;
    let (m, n, k) = (1000, 520, 320);
    let rows = 96;
    let p = Problem::new(m, n, k, (0, 0, 0), 23);
    let d = device(ctx, &p);
    let blocks = m.div_ceil(rows);
    let init: Vec<u32> = (0..blocks).map(|b| u32::from(b % 2 == 0) * 7).collect();
    let flags = upload_u32(ctx, &init);
    let args = GemmArgs {
        hooks: Hooks {
            wait: Some(WaitHook {
                flags: TypedPtr::new(flags.ptr().raw()),
                rows_per_flag: rows as u32,
                epoch: 7,
            }),
            sm_budget: Some(3),
            ..Hooks::default()
        },
        ..d.args
    };
    let err = release_late(&guard, &p, &d, &args, &flags, (1..blocks).step_by(2), 7);
    eprintln!("hgemm wait hook, odd flags late: rel err {err:.2e}");
    assert!(err < 1e-2);
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook5_signal_advances_each_block() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    // signal_delay 3 with 5 k-blocks per tile: the deferred signal goes out
    // mid-way through the next tile, or at the end of a CTA's last one.
    for &(m, n, rows, delay) in &[
        (1000, 520, 100, 0u32),
        (1024, 1024, 256, 0),
        (700, 264, 64, 0),
        (300, 8, 1000, 0),
        (1000, 520, 100, 3),
        (700, 264, 64, 3),
    ] {
        let k = if delay == 0 { 64 } else { 320 };
        let p = Problem::new(m, n, k, (0, 0, 0), 5);
        let d = device(ctx, &p);
        let blocks = m.div_ceil(rows);
        let counters = upload_u32(ctx, &vec![0u32; blocks]);
        let args = GemmArgs {
            hooks: Hooks {
                signal: Some(SignalHook {
                    counters: TypedPtr::new(counters.ptr().raw()),
                    rows_per_counter: rows as u32,
                }),
                sm_budget: Some(7),
                signal_delay: delay,
                ..Hooks::default()
            },
            ..d.args
        };
        run(ctx, g, &args);
        run(ctx, g, &args);
        let got = download_u32(&counters, blocks);
        eprintln!("hgemm signal {m}x{n}x{k} rows/counter {rows} delay {delay}: counters {got:?}");
        assert_eq!(got, advances(m, n, rows, 2));
        let c = download(&d.c, m * n);
        assert!(rel_err(&view(&c, m, n, n), &p.reference()) < 1e-2);
    }
}

/// Hook 5 as a copy engine uses it: a side stream waits on each block's
/// counter (`cuStreamWaitValue32` `GEQ`) and copies the block out while the
/// GEMM runs on 3 CTAs with a long K, so that early blocks land long before
/// the launch ends. Odd counters start preset to `1 - advance`, so they
/// reach 1 (the executor's constant) through the cyclic compare; even ones
/// start at 0 and are waited for at their advance. Every copy must equal
/// the final output: no block was read before all of its stores.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook5_stream_waits_copy_each_block_as_it_lands() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let (m, n, k, rows) = (1000usize, 520usize, 4096usize, 96usize);
    let p = Problem::new(m, n, k, (0, 0, 0), 61);
    let d = device(ctx, &p);
    let blocks = m.div_ceil(rows);
    let adv = advances(m, n, rows, 1);
    let (start, target): (Vec<u32>, Vec<u32>) = adv
        .iter()
        .enumerate()
        .map(|(b, &a)| {
            if b % 2 == 1 {
                (1u32.wrapping_sub(a), 1)
            } else {
                (0, a)
            }
        })
        .unzip();
    let counters = upload_u32(ctx, &start);
    let copy = upload(ctx, &vec![NAN; m * n]);
    let side = ctx.new_stream().expect("stream");
    let main = ctx.new_stream().expect("stream");
    for (b, &want) in target.iter().enumerate() {
        let (lo, hi) = (b * rows, ((b + 1) * rows).min(m));
        let at = (lo * n * 2) as u64;
        // SAFETY: the counter word and both buffers are live until the
        // streams are synchronized below; the ranges are in bounds.
        unsafe {
            assert_eq!(
                sys::cuStreamWaitValue32_v2(
                    side.cu_stream(),
                    counters.ptr().raw() + 4 * b as u64,
                    want,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                ),
                sys::CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                sys::cuMemcpyDtoDAsync_v2(
                    copy.ptr().raw() + at,
                    d.c.ptr().raw() + at,
                    (hi - lo) * n * 2,
                    side.cu_stream(),
                ),
                sys::CUresult::CUDA_SUCCESS
            );
        }
    }
    let args = GemmArgs {
        hooks: Hooks {
            signal: Some(SignalHook {
                counters: TypedPtr::new(counters.ptr().raw()),
                rows_per_counter: rows as u32,
            }),
            sm_budget: Some(3),
            ..Hooks::default()
        },
        ..d.args
    };
    // SAFETY: the args' buffers are alive and sized for the views.
    unsafe { g.launch(main.cu_stream(), &args) }.expect("launch");
    main.synchronize().expect("sync (kernel fault?)");
    side.synchronize().expect("sync side stream");
    let got = download_u32(&counters, blocks);
    let want: Vec<u32> = start
        .iter()
        .zip(&adv)
        .map(|(s, a)| s.wrapping_add(*a))
        .collect();
    assert_eq!(got, want);
    let c = download(&d.c, m * n);
    let copied = download(&copy, m * n);
    let differ = (0..m * n).filter(|&i| copied[i] != c[i]).count();
    assert_eq!(
        differ, 0,
        "{differ} elements copied before their block was stored"
    );
    assert!(rel_err(&view(&c, m, n, n), &p.reference()) < 1e-2);
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn hook6_destination_table() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let (m, n, k) = (1000usize, 520, 200);
    let rows = 96usize;
    let p = Problem::new(m, n, k, (0, 0, 0), 31);
    let reference = p.reference();
    for add in [false, true] {
        let d = device(ctx, &p);
        let ldd = n + 24;
        let Redirect {
            x,
            dst,
            table: _,
            tbl,
        } = odd_blocks_redirect(ctx, m, rows, ldd, 77);
        run(
            ctx,
            g,
            &GemmArgs {
                hooks: Hooks {
                    dest: Some(DestHook {
                        table: TypedPtr::new(tbl.ptr().raw()),
                        ld: ldd,
                        rows_per_block: rows as u32,
                        add,
                        maps: None,
                    }),
                    ..Hooks::default()
                },
                ..d.args
            },
        );
        let c = download(&d.c, m * n);
        let dd = download(&dst, m * ldd);
        let (mut got, mut want) = (vec![], vec![]);
        let mut misplaced = 0usize;
        for i in 0..m {
            let redirected = (i / rows) % 2 == 1;
            for j in 0..n {
                let r = reference[i * n + j];
                if redirected {
                    got.push(b2f(dd[i * ldd + j]));
                    want.push(r + if add { b2f(x[i * ldd + j]) } else { 0.0 });
                    misplaced += (c[i * n + j] != NAN) as usize;
                } else {
                    got.push(b2f(c[i * n + j]));
                    want.push(r);
                    misplaced += (dd[i * ldd + j] != x[i * ldd + j]) as usize;
                }
            }
        }
        let err = rel_err(&got, &want);
        eprintln!("hgemm dest add={add}: rel err {err:.2e}, {misplaced} misplaced writes");
        assert!(err < 1e-2, "rel err {err}");
        assert_eq!(misplaced, 0);
    }
}

/// The staged epilogue (the default; [`Hooks::register_epilogue`] turns it off) writes exactly what the
/// register epilogue writes, to the same places, with the destination hook
/// (rows redirected, half of them not 16-byte aligned), C rows not 16-byte
/// aligned, split-K and the signal hook.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn staged_epilogue_matches_register_epilogue() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let (m, n, k) = (1000usize, 520, 200);
    let rows = 96usize;
    let blocks = m.div_ceil(rows);
    // ldc = ldd = n + 4: every other row starts off a 16-byte boundary.
    let p = Problem::new(m, n, k, (0, 0, 4), 41);
    let d = device(ctx, &p);
    let ldd = n + 4;
    let Redirect {
        x,
        dst,
        table: _,
        tbl,
    } = odd_blocks_redirect(ctx, m, rows, ldd, 78);
    let counters = upload_u32(ctx, &vec![0u32; blocks]);
    for tile in [TileN::N256, TileN::N128] {
        for splits in [1u32, 3] {
            for with_dest in [false, true] {
                let mut outs = vec![];
                for staged in [false, true] {
                    d.c.upload(&to_bytes(&vec![NAN; m * p.ldc]))
                        .expect("poison");
                    dst.upload(&to_bytes(&x)).expect("reset dst");
                    counters.upload(&vec![0u8; blocks * 4]).expect("reset");
                    let args = GemmArgs {
                        hooks: Hooks {
                            split_k: Some(splits),
                            tile_n: Some(tile),
                            register_epilogue: !staged,
                            signal_delay: if staged { 2 } else { 0 },
                            signal: Some(SignalHook {
                                counters: TypedPtr::new(counters.ptr().raw()),
                                rows_per_counter: rows as u32,
                            }),
                            dest: with_dest.then_some(DestHook {
                                table: TypedPtr::new(tbl.ptr().raw()),
                                ld: ldd,
                                rows_per_block: rows as u32,
                                add: false,
                                maps: None,
                            }),
                            ..Hooks::default()
                        },
                        ..d.args
                    };
                    let shape = g.shape(&args).expect("shape");
                    assert_eq!(shape.staged, staged, "{tile:?} split {splits}");
                    assert!(!shape.tma_store);
                    run(ctx, g, &args);
                    let counts = download_u32(&counters, blocks);
                    assert_eq!(counts, advances(m, n, rows, 1), "{tile:?} split {splits}");
                    outs.push((download(&d.c, m * p.ldc), download(&dst, m * ldd)));
                }
                let (reg, stg) = (&outs[0], &outs[1]);
                let dc = reg.0.iter().zip(&stg.0).filter(|(a, b)| a != b).count();
                let dd = reg.1.iter().zip(&stg.1).filter(|(a, b)| a != b).count();
                eprintln!(
                    "hgemm staged epilogue {tile:?} split {splits} dest {with_dest}: {dc} C and {dd} dst elements differ"
                );
                assert_eq!((dc, dd), (0, 0));
                assert!(padding_untouched(&stg.0, m, n, p.ldc));
                if !with_dest {
                    let err = rel_err(&view(&stg.0, m, n, p.ldc), &p.reference());
                    assert!(err < 1e-2, "rel err {err}");
                }
            }
        }
    }
}

/// The destination hook through per-block tensor maps ([`DestHook::maps`],
/// TMA stores) writes exactly what the staged epilogue writes, to the same
/// places (odd blocks to another buffer, even ones in C), on every tile,
/// cluster tiles too, unsplit and split, and the signal hook (not on cluster
/// tiles) still counts each block once.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn dest_maps_match_staged_epilogue() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let (m, n, k) = (1000usize, 520, 200);
    let rows = 128usize;
    let blocks = m.div_ceil(rows);
    let p = Problem::new(m, n, k, (0, 0, 8), 43);
    let d = device(ctx, &p);
    let ldd = n + 8;
    let Redirect { x, dst, table, tbl } = odd_blocks_redirect(ctx, m, rows, ldd, 80);
    let maps = g
        .dest_maps(&DestLayout {
            table: &table,
            ld: ldd,
            rows_per_block: rows as u32,
            m,
            n,
            c: d.args.c,
            ldc: p.ldc,
        })
        .expect("dest maps");
    let counters = upload_u32(ctx, &vec![0u32; blocks]);
    for (tile, splits, budget) in [
        (TileN::N256, 1u32, None),
        (TileN::N128, 1, Some(5)),
        (TileN::N128, 3, None),
        (TileN::Pp128, 1, Some(3)),
        (TileN::Pp128, 1, None),
        (TileN::N256C2, 1, Some(6)),
        (TileN::Pp128C2, 1, None),
    ] {
        let mut outs = vec![];
        for with_maps in [false, true] {
            d.c.upload(&to_bytes(&vec![NAN; m * p.ldc]))
                .expect("poison");
            dst.upload(&to_bytes(&x)).expect("reset dst");
            counters.upload(&vec![0u8; blocks * 4]).expect("reset");
            let args = GemmArgs {
                hooks: Hooks {
                    split_k: Some(splits),
                    tile_n: Some(tile),
                    sm_budget: budget,
                    // (Cluster tiles refuse the signal hook.)
                    signal: (tile.cluster() == 1).then(|| SignalHook {
                        counters: TypedPtr::new(counters.ptr().raw()),
                        rows_per_counter: 96,
                    }),
                    dest: Some(DestHook {
                        table: TypedPtr::new(tbl.ptr().raw()),
                        ld: ldd,
                        rows_per_block: rows as u32,
                        add: false,
                        maps: with_maps.then(|| maps.ptr()),
                    }),
                    ..Hooks::default()
                },
                ..d.args
            };
            let shape = g.shape(&args).expect("shape");
            assert_eq!(
                (shape.tma_dest, shape.staged),
                (with_maps, !with_maps),
                "{tile:?}"
            );
            run(ctx, g, &args);
            if tile.cluster() == 1 {
                let counts = download_u32(&counters, blocks);
                assert_eq!(counts, advances(m, n, rows, 1), "{tile:?}");
            }
            outs.push((download(&d.c, m * p.ldc), download(&dst, m * ldd)));
        }
        let (stg, tma) = (&outs[0], &outs[1]);
        let dc = stg.0.iter().zip(&tma.0).filter(|(a, b)| a != b).count();
        let dd = stg.1.iter().zip(&tma.1).filter(|(a, b)| a != b).count();
        eprintln!(
            "hgemm dest maps {tile:?} split {splits} budget {budget:?}: {dc} C and {dd} dst elements differ from the staged epilogue"
        );
        assert_eq!((dc, dd), (0, 0), "{tile:?} split {splits}");
        assert!(padding_untouched(&tma.0, m, n, p.ldc));
        // Redirected rows reached dst, the others C (checked against the host).
        let reference = p.reference();
        let (mut got, mut want) = (vec![], vec![]);
        for i in 0..m {
            for j in 0..n {
                let v = if (i / rows) % 2 == 1 {
                    tma.1[i * ldd + j]
                } else {
                    tma.0[i * p.ldc + j]
                };
                got.push(b2f(v));
                want.push(reference[i * n + j]);
            }
        }
        let err = rel_err(&got, &want);
        assert!(err < 1e-2, "{tile:?}: rel err {err}");
    }
}

/// One case of [`same_as_tile`].
struct Case {
    m: usize,
    n: usize,
    k: usize,
    ldc_pad: usize,
    sm_budget: Option<u32>,
    stages: u32,
    accumulate: bool,
    hooked: bool,
    add: bool,
    register_epilogue: bool,
}

fn case(m: usize, n: usize, k: usize, ldc_pad: usize, sm_budget: Option<u32>) -> Case {
    Case {
        m,
        n,
        k,
        ldc_pad,
        sm_budget,
        stages: 0,
        accumulate: false,
        hooked: false,
        add: false,
        register_epilogue: false,
    }
}

/// The cases the ping-pong and cluster tiles are checked on: grids where a
/// CTA (or cluster) runs one, an odd or many tiles (one SM: two for a cluster), fewer k-blocks than
/// stages, M/N/K residues (odd M-block counts), C rows off 16-byte
/// boundaries, accumulate, and the hooks: start block, destination
/// (overwrite, add, register epilogue), and signal and wait (flags set)
/// where `tile` takes them.
fn tile_cases() -> Vec<Case> {
    vec![
        case(128, 128, 64, 0, None),
        case(1000, 520, 200, 0, Some(3)),
        case(1000, 520, 1000, 8, Some(7)),
        case(333, 1032, 136, 0, Some(1)),
        case(2048, 2048, 512, 0, None),
        case(4096, 4096, 1024, 0, None),
        case(700, 264, 64, 4, Some(5)),
        Case {
            stages: 2,
            ..case(1000, 520, 520, 0, Some(4))
        },
        Case {
            accumulate: true,
            ..case(1000, 520, 200, 0, Some(3))
        },
        Case {
            hooked: true,
            ..case(1000, 520, 320, 0, Some(3))
        },
        Case {
            hooked: true,
            ..case(2000, 1024, 256, 4, None)
        },
        Case {
            hooked: true,
            add: true,
            ..case(1000, 520, 320, 0, Some(3))
        },
        Case {
            hooked: true,
            register_epilogue: true,
            ..case(1000, 520, 320, 0, Some(5))
        },
    ]
}

/// `tile` writes exactly what `base` writes (same wgmma per 64 rows, same k
/// order), to the same places, on every case of [`tile_cases`]; the signal
/// hook counts every block once per launch.
fn same_as_tile(ctx: &Arc<CudaContext>, g: &HopperGemm, base: TileN, tile: TileN) {
    for (i, c) in tile_cases().iter().enumerate() {
        let (m, n, k) = (c.m, c.n, c.k);
        let p = Problem::new(m, n, k, (0, 0, c.ldc_pad), 300 + i as u64);
        let d = device(ctx, &p);
        let rows = 96usize; // hook blocks straddle tiles
        let blocks = m.div_ceil(rows);
        let ldd = n + 8;
        let Redirect {
            x,
            dst,
            table: _,
            tbl,
        } = odd_blocks_redirect(ctx, m, rows, ldd, 79 + i as u64);
        let counters = upload_u32(ctx, &vec![0u32; blocks]);
        let flags = upload_u32(ctx, &vec![9u32; blocks]);
        let c0 = rand(m * p.ldc, 500 + i as u64);
        let mut outs = vec![];
        for t in [base, tile] {
            let init = if c.accumulate {
                c0.clone()
            } else {
                vec![NAN; m * p.ldc]
            };
            d.c.upload(&to_bytes(&init)).expect("poison");
            dst.upload(&to_bytes(&x)).expect("reset dst");
            counters.upload(&vec![0u8; blocks * 4]).expect("reset");
            let mut hooks = Hooks {
                tile_n: Some(t),
                split_k: Some(1),
                // (A cluster needs two SMs; the output does not depend on the grid.)
                sm_budget: c.sm_budget.map(|b| b.max(t.cluster())),
                register_epilogue: c.register_epilogue,
                occupancy: Occupancy {
                    stages: c.stages,
                    extra_smem: 0,
                },
                ..Hooks::default()
            };
            // (Cluster tiles refuse the wait and signal hooks.)
            let signalled = c.hooked && tile.cluster() == 1;
            if signalled {
                hooks.wait = Some(WaitHook {
                    flags: TypedPtr::new(flags.ptr().raw()),
                    rows_per_flag: rows as u32,
                    epoch: 9,
                });
                hooks.signal = Some(SignalHook {
                    counters: TypedPtr::new(counters.ptr().raw()),
                    rows_per_counter: rows as u32,
                });
            }
            if c.hooked {
                hooks.m_start_block = 3;
                hooks.dest = Some(DestHook {
                    table: TypedPtr::new(tbl.ptr().raw()),
                    ld: ldd,
                    rows_per_block: rows as u32,
                    add: c.add,
                    maps: None,
                });
            }
            let args = GemmArgs {
                accumulate: c.accumulate,
                hooks,
                ..d.args
            };
            let shape = g.shape(&args).expect("shape");
            run(ctx, g, &args);
            if signalled {
                let counts = download_u32(&counters, blocks);
                assert_eq!(counts, advances(m, n, rows, 1), "{t:?} case {i}");
            }
            outs.push((shape, download(&d.c, m * p.ldc), download(&dst, m * ldd)));
        }
        let (one, two) = (&outs[0], &outs[1]);
        let dc = one.1.iter().zip(&two.1).filter(|(a, b)| a != b).count();
        let dd = one.2.iter().zip(&two.2).filter(|(a, b)| a != b).count();
        eprintln!(
            "hgemm {tile:?} case {i} {m}x{n}x{k} ldc {} grid {} stages {} tma {} staged {} acc {} hooked {} add {}: {dc} C and {dd} dst elements differ from {base:?}",
            p.ldc, two.0.grid, two.0.stages, two.0.tma_store, two.0.staged, c.accumulate, c.hooked, c.add
        );
        assert_eq!((dc, dd), (0, 0), "{tile:?} case {i}");
        assert!(padding_untouched(&two.1, m, n, p.ldc) || c.accumulate);
        // (The host reference of the largest case would take a while; the
        // base tile is checked against it elsewhere.)
        if !c.hooked && !c.accumulate && m * n * k <= 1 << 32 {
            let err = rel_err(&view(&two.1, m, n, p.ldc), &p.reference());
            assert!(err < 1e-2, "{tile:?} case {i}: rel err {err}");
        }
    }
}

/// The ping-pong tile ([`TileN::Pp128`]) writes exactly what the cooperative
/// narrow tile writes on every case of [`tile_cases`] (its two consumer
/// warpgroups alternate tiles).
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn pingpong_matches_cooperative_tile() {
    let guard = gpu();
    same_as_tile(&guard.0, &guard.1, TileN::N128, TileN::Pp128);
}

/// The cluster tiles ([`TileN::N256C2`], [`TileN::Pp128C2`]: pairs of CTAs
/// sharing B by TMA multicast) write exactly what their single-CTA tiles
/// write on every case of [`tile_cases`]: odd M-block counts leave the last
/// pair's second CTA without rows, odd SM budgets round the grid down to
/// whole clusters. Their grid is even, and they refuse the wait and signal
/// hooks.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn cluster_tiles_match_single_cta_tiles() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    same_as_tile(ctx, g, TileN::N256, TileN::N256C2);
    same_as_tile(ctx, g, TileN::Pp128, TileN::Pp128C2);
    let p = Problem::new(1000, 520, 320, (0, 0, 0), 9);
    let d = device(ctx, &p);
    for budget in [None, Some(7), Some(2)] {
        let args = GemmArgs {
            hooks: Hooks {
                tile_n: Some(TileN::N256C2),
                sm_budget: budget,
                ..Hooks::default()
            },
            ..d.args
        };
        let grid = g.shape(&args).expect("shape").grid;
        assert!(
            grid % 2 == 0 && grid <= budget.unwrap_or(g.sms()),
            "grid {grid}"
        );
    }
    let flags = upload_u32(ctx, &[1u32; 8]);
    let waited = GemmArgs {
        hooks: Hooks {
            tile_n: Some(TileN::Pp128C2),
            wait: Some(WaitHook {
                flags: TypedPtr::new(flags.ptr().raw()),
                rows_per_flag: 128,
                epoch: 1,
            }),
            ..Hooks::default()
        },
        ..d.args
    };
    let err = g.shape(&waited).expect_err("wait hook refused").to_string();
    assert!(err.contains("wait or signal hook"), "{err}");
}

/// [`Hooks::split_tail_only`]: full waves run whole tiles, the last wave's
/// tiles are split. Every output element equals the unsplit launch's or the
/// fully split launch's (same per-tile summation order), the result matches
/// the host reference, and the signal hook still counts every block once.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn split_tail_only_matches_whole_and_split() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    // 1000 x 520, K = 640 (10 k-blocks) on 7 CTAs: 8 x 5 narrow tiles
    // (35 whole + 5 split) or 8 x 3 wide ones (21 whole + 3 split).
    let (m, n, k) = (1000usize, 520, 640);
    let rows = 100usize;
    let blocks = m.div_ceil(rows);
    let p = Problem::new(m, n, k, (8, 0, 0), 51);
    let reference = p.reference();
    let d = device(ctx, &p);
    let counters = upload_u32(ctx, &vec![0u32; blocks]);
    for (tile, dp) in [(TileN::N128, 35u32), (TileN::N256, 21)] {
        let launch = |splits: u32, tail: bool, signal: bool| -> Vec<u16> {
            d.c.upload(&to_bytes(&vec![NAN; m * n])).expect("poison");
            let args = GemmArgs {
                hooks: Hooks {
                    sm_budget: Some(7),
                    tile_n: Some(tile),
                    split_k: Some(splits),
                    split_tail_only: tail,
                    signal: signal.then_some(SignalHook {
                        counters: TypedPtr::new(counters.ptr().raw()),
                        rows_per_counter: rows as u32,
                    }),
                    ..Hooks::default()
                },
                ..d.args
            };
            if tail {
                let s = g.shape(&args).expect("shape");
                assert_eq!((s.dp_tiles, s.splits), (dp, splits), "{tile:?}");
            }
            run(ctx, g, &args);
            download(&d.c, m * n)
        };
        let whole = launch(1, false, false);
        let split = launch(3, false, false);
        counters.upload(&vec![0u8; blocks * 4]).expect("reset");
        let mixed = launch(3, true, true);
        let counts = download_u32(&counters, blocks);
        assert_eq!(counts, advances(m, n, rows, 1), "{tile:?}");
        let odd = (0..m * n)
            .filter(|&i| mixed[i] != whole[i] && mixed[i] != split[i])
            .count();
        let from_split = (0..m * n)
            .filter(|&i| mixed[i] == split[i] && mixed[i] != whole[i])
            .count();
        let err = rel_err(&view(&mixed, m, n, n), &reference);
        eprintln!(
            "hgemm {tile:?} split_tail_only: {odd} elements from neither launch, {from_split} only from the split one, rel err {err:.2e}"
        );
        assert_eq!(odd, 0);
        assert!(err < 1e-2, "rel err {err}");
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn split_k_matches_host_reference() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    for &(m, n, k, splits, tile) in &[
        (64, 2560, 8192, None, None),
        (200, 520, 1000, Some(2), Some(TileN::N256)),
        (300, 264, 1096, Some(5), Some(TileN::N128)),
        (128, 256, 1024, Some(16), Some(TileN::N256)),
        (128, 264, 1024, Some(16), Some(TileN::N128)),
        (1000, 1032, 520, Some(3), None),
    ] {
        let p = Problem::new(m, n, k, (8, 0, 8), 41);
        let d = device(ctx, &p);
        let args = GemmArgs {
            hooks: Hooks {
                split_k: splits,
                tile_n: tile,
                ..Hooks::default()
            },
            ..d.args
        };
        let shape = g.shape(&args).expect("shape");
        run(ctx, g, &args);
        let first = download(&d.c, m * p.ldc);
        d.c.upload(&to_bytes(&vec![NAN; m * p.ldc]))
            .expect("poison");
        run(
            ctx,
            g,
            &GemmArgs {
                hooks: Hooks {
                    split_k: Some(shape.splits),
                    tile_n: Some(shape.tile_n),
                    sm_budget: Some(5),
                    ..Hooks::default()
                },
                ..args
            },
        );
        let second = download(&d.c, m * p.ldc);
        let diff = first.iter().zip(&second).filter(|(a, b)| a != b).count();
        let err = rel_err(&view(&first, m, n, p.ldc), &p.reference());
        eprintln!(
            "hgemm split-K {m}x{n}x{k} {:?} splits {}: rel err {err:.2e}, {diff} elements differ with 5 CTAs",
            shape.tile_n, shape.splits
        );
        assert!(err < 1e-2, "rel err {err}");
        assert!(padding_untouched(&first, m, n, p.ldc));
        assert_eq!(diff, 0, "split-K sum depends on the schedule");
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn split_k_with_hooks() {
    for tile in [TileN::N256, TileN::N128] {
        split_k_with_hooks_on(tile);
    }
}

fn split_k_with_hooks_on(tile: TileN) {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let (m, n, k) = (520usize, 264usize, 2048usize);
    let rows = 200usize;
    let blocks = m.div_ceil(rows);
    let p = Problem::new(m, n, k, (0, 0, 0), 51);
    let d = device(ctx, &p);
    let c0 = rand(m * n, 52);
    d.c.upload(&to_bytes(&c0)).expect("upload");
    let ldd = n + 8;
    let x = rand(m * ldd, 53);
    let dst = upload(ctx, &x);
    let table: Vec<u64> = (0..blocks)
        .map(|b| {
            if b == 1 {
                dst.ptr().raw() + (b * rows * ldd * 2) as u64
            } else {
                0
            }
        })
        .collect();
    let tbl = upload_u64(ctx, &table);
    let flags = upload_u32(ctx, &vec![3u32; blocks]);
    let counters = upload_u32(ctx, &vec![0u32; blocks]);
    let args = GemmArgs {
        accumulate: true,
        hooks: Hooks {
            split_k: Some(4),
            tile_n: Some(tile),
            m_start_block: 2,
            wait: Some(WaitHook {
                flags: TypedPtr::new(flags.ptr().raw()),
                rows_per_flag: rows as u32,
                epoch: 3,
            }),
            signal: Some(SignalHook {
                counters: TypedPtr::new(counters.ptr().raw()),
                rows_per_counter: rows as u32,
            }),
            dest: Some(DestHook {
                table: TypedPtr::new(tbl.ptr().raw()),
                ld: ldd,
                rows_per_block: rows as u32,
                add: true,
                maps: None,
            }),
            ..Hooks::default()
        },
        ..d.args
    };
    run(ctx, g, &args);
    let c = download(&d.c, m * n);
    let dd = download(&dst, m * ldd);
    let reference = p.reference();
    let (mut got, mut want) = (vec![], vec![]);
    for i in 0..m {
        for j in 0..n {
            if i / rows == 1 {
                got.push(b2f(dd[i * ldd + j]));
                want.push(reference[i * n + j] + b2f(x[i * ldd + j]));
            } else {
                got.push(b2f(c[i * n + j]));
                want.push(reference[i * n + j] + b2f(c0[i * n + j]));
            }
        }
    }
    let err = rel_err(&got, &want);
    let counts = download_u32(&counters, blocks);
    eprintln!(
        "hgemm {tile:?} split-K 4 + hooks 3-6 + accumulate: rel err {err:.2e}, counters {counts:?}"
    );
    assert!(err < 1e-2, "rel err {err}");
    assert_eq!(counts, advances(m, n, rows, 1));
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn rejects_bad_views() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let p = Problem::new(64, 64, 64, (0, 0, 0), 1);
    let d = device(ctx, &p);
    let stream = ctx.new_stream().expect("stream");
    for bad in [
        GemmArgs { k: 60, ..d.args },
        GemmArgs { lda: 68, ..d.args },
        GemmArgs {
            hooks: Hooks {
                occupancy: Occupancy {
                    stages: 9,
                    extra_smem: 0,
                },
                ..Hooks::default()
            },
            ..d.args
        },
    ] {
        // SAFETY: rejected before any device work.
        let r = unsafe { g.launch(stream.cu_stream(), &bad) };
        assert!(r.is_err());
    }
    assert_eq!(BLOCK_M, 128);
}

/// [`HopperGemm::autotune`]: the tuned schedule is what `shape` and an
/// open-schedule launch then use, its output matches autotuned cuBLASLt,
/// and the pick comes back from memory, then (on a fresh instance) from
/// the disk cache, without timing again.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn autotuned_schedule_matches_cublaslt_and_is_cached() {
    use ficco_cuda::hgemm::tune::TuneSource;
    let guard = gpu();
    let ctx = &guard.0;
    // Its own instances: a tuned schedule would change the open-schedule
    // launches of the other tests on the shared one.
    let g = HopperGemm::load(ctx).expect("load");
    let ws = DeviceBuffer::alloc(ctx, WORKSPACE_BYTES).expect("ws");
    ctx.bind_to_thread().expect("bind");
    let mut lt = Gemms::new().expect("cublaslt");
    // A chunk shape (one M-block: split-K candidates), one with residues,
    // one of several waves.
    for &(m, n, k) in &[(64, 4096, 3584), (1000, 4104, 1032), (2048, 3072, 4096)] {
        let p = Problem::new(m, n, k, (0, 0, 0), 5);
        let d = device(ctx, &p);
        // Time it here whatever earlier runs left on disk.
        if let Some(path) = g.tune_cache_path(&d.args) {
            let _ = std::fs::remove_file(path);
        }
        let before = g.tune_timings();
        let t = g.autotune(&d.args).expect("autotune");
        assert!(
            matches!(t.source, TuneSource::Timed { candidates } if candidates >= 1),
            "{:?}",
            t.source
        );
        assert_eq!(g.tune_timings(), before + 1);
        let (tile, splits, tail) = t.schedule;
        // `shape` of the open schedule is the tuned one's, not the chooser's.
        let fixed = ficco_cuda::hgemm::tune::with_schedule(&d.args, t.schedule);
        assert_eq!(
            g.shape(&d.args).expect("shape"),
            g.shape(&fixed).expect("shape")
        );
        assert_eq!(g.shape(&d.args).expect("shape").tile_n, tile);
        // From memory: no timing.
        let again = g.autotune(&d.args).expect("autotune again");
        assert_eq!(
            (again.schedule, again.source),
            (t.schedule, TuneSource::Memory)
        );
        assert_eq!(g.tune_timings(), before + 1);
        // The open-schedule launch runs the tuned pick.
        run(ctx, &g, &d.args);
        let ours = download(&d.c, m * n);
        let r = upload(ctx, &vec![NAN; m * n]);
        let stream = ctx.new_stream().expect("stream");
        let key = GemmKey {
            m,
            n,
            k,
            lda: k,
            ldb: n,
            ldc: n,
            sm_target: None,
            b_transposed: false,
        };
        // SAFETY: buffers sized for the shape.
        unsafe {
            lt.gemm(
                key,
                d.a.ptr(),
                d.b.ptr(),
                r.ptr(),
                false,
                ws.ptr(),
                stream.cu_stream(),
            )
        }
        .expect("cublaslt gemm");
        stream.synchronize().expect("sync");
        let theirs = download(&r, m * n);
        let f = |v: &[u16]| v.iter().map(|&x| b2f(x)).collect::<Vec<_>>();
        let err = rel_err(&f(&ours), &f(&theirs));
        eprintln!(
            "hgemm autotuned {m}x{n}x{k}: {tile:?}/{splits}{} ({:?}) vs cuBLASLt: rel err {err:.2e}",
            if tail { "t" } else { "" },
            t.source
        );
        assert!(err < 1e-2, "rel err {err}");
        // A fresh instance reads the pick from disk when it could be stored.
        if g.tune_cache_path(&d.args).is_some_and(|p| p.exists()) {
            let fresh = HopperGemm::load(ctx).expect("load");
            let disk = fresh.autotune(&d.args).expect("autotune from disk");
            assert_eq!((disk.schedule, disk.source), (t.schedule, TuneSource::Disk));
            assert_eq!(fresh.tune_timings(), 0);
        }
    }
}

/// cuBLASLt's C = A·B for a dense problem already on the device.
fn cublaslt_reference(ctx: &Arc<CudaContext>, d: &Dev, m: usize, n: usize, k: usize) -> Vec<u16> {
    let r = upload(ctx, &vec![NAN; m * n]);
    let ws = DeviceBuffer::alloc(ctx, WORKSPACE_BYTES).expect("ws");
    ctx.bind_to_thread().expect("bind");
    let mut lt = Gemms::new().expect("cublaslt");
    let stream = ctx.new_stream().expect("stream");
    let key = GemmKey {
        m,
        n,
        k,
        lda: k,
        ldb: n,
        ldc: n,
        sm_target: None,
        b_transposed: false,
    };
    // SAFETY: buffers sized for the shape.
    unsafe {
        lt.gemm(
            key,
            d.a.ptr(),
            d.b.ptr(),
            r.ptr(),
            false,
            ws.ptr(),
            stream.cu_stream(),
        )
    }
    .expect("cublaslt gemm");
    stream.synchronize().expect("sync");
    download(&r, m * n)
}

/// [`TileN::M64N256`]: 64-row tiles whose two warpgroups split the columns.
/// Each warpgroup runs the narrow tile's wgmma (m64n128k16) over the same
/// k-blocks, so the output equals the narrow tile's bit for bit (unsplit and
/// split, every epilogue: TMA store, staged, register with accumulate), and
/// matches cuBLASLt; hooks that count 128-row blocks are refused.
#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn m64_tile_matches_narrow_tile_and_cublaslt() {
    let guard = gpu();
    let (ctx, g) = (&guard.0, &guard.1);
    let f = |v: &[u16]| v.iter().map(|&x| b2f(x)).collect::<Vec<_>>();
    for (i, &(m, n, k)) in [
        (64usize, 4096usize, 3584usize),
        (192, 1032, 520),
        (64, 200, 72),
        (33, 264, 136),
    ]
    .iter()
    .enumerate()
    {
        let p = Problem::new(m, n, k, (0, 0, 0), 300 + i as u64);
        let d = device(ctx, &p);
        let launch = |tile: TileN, splits: u32| -> Vec<u16> {
            d.c.upload(&to_bytes(&vec![NAN; m * n])).expect("poison");
            let args = GemmArgs {
                hooks: Hooks {
                    tile_n: Some(tile),
                    split_k: Some(splits),
                    ..Hooks::default()
                },
                ..d.args
            };
            let s = g.shape(&args).expect("shape");
            assert_eq!(s.tiles_m as usize, m.div_ceil(tile.rows()));
            run(ctx, g, &args);
            download(&d.c, m * n)
        };
        let theirs = cublaslt_reference(ctx, &d, m, n, k);
        for splits in [1u32, 3.min(k.div_ceil(64) as u32)] {
            let narrow = launch(TileN::N128, splits);
            for tile in [TileN::M64N256, TileN::M64N128] {
                let ours = launch(tile, splits);
                let diff = narrow.iter().zip(&ours).filter(|(a, b)| a != b).count();
                let err = rel_err(&f(&ours), &f(&theirs));
                eprintln!(
                    "hgemm {tile:?} {m}x{n}x{k} split {splits}: {diff} elements differ from N128, rel err vs cuBLASLt {err:.2e}"
                );
                assert_eq!(diff, 0, "{tile:?} {m}x{n}x{k} split {splits}");
                assert!(err < 1e-2, "{m}x{n}x{k}: rel err {err}");
            }
        }
    }
    // Padded C (staged epilogue) and accumulate (register epilogue).
    let (m, n, k) = (192usize, 520usize, 264usize);
    // ldc = 522: C rows not 16-byte aligned, so no TMA store.
    let p = Problem::new(m, n, k, (8, 8, 2), 77);
    let d = device(ctx, &p);
    let c0 = rand(m * p.ldc, 78);
    for accumulate in [false, true] {
        let launch = |tile: TileN| -> Vec<u16> {
            d.c.upload(&to_bytes(&c0)).expect("c0");
            let args = GemmArgs {
                accumulate,
                hooks: Hooks {
                    tile_n: Some(tile),
                    split_k: Some(1),
                    ..Hooks::default()
                },
                ..d.args
            };
            let s = g.shape(&args).expect("shape");
            assert!(!s.tma_store);
            run(ctx, g, &args);
            download(&d.c, m * p.ldc)
        };
        let narrow = launch(TileN::N128);
        for tile in [TileN::M64N256, TileN::M64N128] {
            let ours = launch(tile);
            let diff = narrow.iter().zip(&ours).filter(|(a, b)| a != b).count();
            eprintln!("hgemm {tile:?} {m}x{n}x{k} ldc {} accumulate {accumulate}: {diff} elements differ from N128", p.ldc);
            assert_eq!(diff, 0, "{tile:?} accumulate {accumulate}");
        }
    }
    let reference = p.reference();
    let ours = {
        d.c.upload(&to_bytes(&c0)).expect("c0");
        run(
            ctx,
            g,
            &GemmArgs {
                hooks: Hooks {
                    tile_n: Some(TileN::M64N256),
                    split_k: Some(1),
                    ..Hooks::default()
                },
                ..d.args
            },
        );
        download(&d.c, m * p.ldc)
    };
    assert!(padding_untouched_by(&ours, &c0, m, n, p.ldc));
    let err = rel_err(&view(&ours, m, n, p.ldc), &reference);
    assert!(err < 1e-2, "padded rel err {err}");
    // Hooks counted in 128-row blocks: a typed error, nothing launched.
    let flags = upload_u32(ctx, &[1u32; 4]);
    let hooked = GemmArgs {
        hooks: Hooks {
            tile_n: Some(TileN::M64N256),
            wait: Some(WaitHook {
                flags: TypedPtr::new(flags.ptr().raw()),
                rows_per_flag: 64,
                epoch: 1,
            }),
            ..Hooks::default()
        },
        ..d.args
    };
    let stream = ctx.new_stream().expect("stream");
    // SAFETY: rejected before any launch; the buffers are alive anyway.
    let r = unsafe { g.launch(stream.cu_stream(), &hooked) };
    assert!(r.is_err(), "wait hook with 64-row tiles must be refused");
}

/// Padding columns of C still hold what was there before the launch.
fn padding_untouched_by(c: &[u16], before: &[u16], m: usize, n: usize, ld: usize) -> bool {
    (0..m).all(|i| c[i * ld + n..(i + 1) * ld] == before[i * ld + n..(i + 1) * ld])
}
