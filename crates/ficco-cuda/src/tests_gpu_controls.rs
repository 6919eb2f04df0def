//! GPU tests of the resource controls: stream priorities, green-context SM
//! partitions, shared-memory occupancy shaping with ficco's own tensor-core
//! GEMM, and NCCL communicator limits. Each test prints what it measures.
//! They are unit tests (they use crate-internal modules); without CUDA
//! libraries or GPUs each prints `SKIPPED: <test>: <reason>` and passes,
//! unless `FICCO_REQUIRE_GPU=1` (see `tests/common`). The NCCL test needs 2
//! GPUs. Run on the device with `--test-threads=1 --nocapture` and
//! `NCCL_NVLS_ENABLE=0`.

use crate::comm::{CommCache, CommSet, CtaPolicy, NcclLimits};
use crate::controls::{
    median, priority_stream, stream_priority, time_ms, PriorityRange, StreamPriority,
};
use crate::gemm::{GemmKey, Gemms, WORKSPACE_BYTES};
use crate::green::{device_sm_resource, distinct, GreenPartition, PartitionRequest, SmIdProbe};
use crate::kernels::Kernels;
use crate::mem::{DeviceBuffer, DevicePtr};
use crate::shaped::ShapedGemm;
use crate::test_common::{b2f, gate, rand, rel_err, GpuAvailability};
use crate::CudaError;
use cudarc::driver::CudaContext;
use std::sync::Arc;
use std::time::Instant;

/// GPU 0's context, or None (printed) where `test` is skipped.
fn ctx0(test: &str) -> Option<Arc<CudaContext>> {
    ctx_n(test, 1).map(|mut v| v.remove(0))
}

fn ctx_n(test: &str, n: usize) -> Option<Vec<Arc<CudaContext>>> {
    let found = match crate::loader::require().and_then(|_| crate::info::device_count()) {
        Ok(found) => GpuAvailability::Found(found),
        Err(e) => GpuAvailability::Unusable(e.to_string()),
    };
    if !gate(test, n, found) {
        return None;
    }
    Some(
        (0..n)
            .map(|i| CudaContext::new(i).expect("primary context"))
            .collect(),
    )
}

fn to_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn upload(ctx: &Arc<CudaContext>, v: &[u16]) -> DeviceBuffer {
    let b = DeviceBuffer::alloc(ctx, v.len() * 2).expect("alloc");
    b.upload(&to_bytes(v)).expect("upload");
    b
}

fn download(b: &DeviceBuffer, n: usize) -> Vec<u16> {
    let mut out = vec![0u8; n * 2];
    b.download(&mut out).expect("download");
    from_bytes(&out)
}

fn host_gemm(a: &[u16], b: &[u16], m: usize, n: usize, k: usize) -> Vec<f32> {
    let af: Vec<f32> = a.iter().map(|&x| b2f(x)).collect();
    let bf: Vec<f32> = b.iter().map(|&x| b2f(x)).collect();
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = af[i * k + p];
            let row = &bf[p * n..p * n + n];
            for (cj, bj) in c[i * n..i * n + n].iter_mut().zip(row) {
                *cj += x * bj;
            }
        }
    }
    c
}

/// erf, Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
fn erf(x: f32) -> f32 {
    let s = x.signum();
    let x = x.abs() as f64;
    let t = 1.0 / (1.0 + 0.3275911 * x);
    let y = 1.0
        - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
            + 0.254829592)
            * t
            * (-x * x).exp();
    s * y as f32
}

#[test]
fn priority_range_and_streams() {
    let Some(ctx) = ctx0("priority_range_and_streams") else {
        return;
    };
    let r = PriorityRange::of(&ctx).expect("priority range");
    println!(
        "stream priorities: least {} greatest {}",
        r.least, r.greatest
    );
    assert!(r.greatest <= r.least);
    for p in [StreamPriority::Normal, StreamPriority::High] {
        let s = priority_stream(&ctx, p).expect("stream");
        // SAFETY: the stream is alive.
        let got = unsafe { stream_priority(s.cu_stream()) }.expect("priority");
        println!("  {p:?} stream has priority {got}");
        assert_eq!(got, r.value(p));
    }
}

#[test]
fn green_partitions_confine_kernels() {
    let Some(ctx) = ctx0("green_partitions_confine_kernels") else {
        return;
    };
    let dev = device_sm_resource(&ctx).expect("SM resource");
    println!(
        "device SMs {}, min partition {}, alignment {}",
        dev.sm_count, dev.min_partition, dev.alignment
    );
    let probe = SmIdProbe::load(&ctx).expect("probe");
    let blocks = dev.sm_count * 4;
    let spin = 100_000; // ~50 us per block
    let primary = ctx.new_stream().expect("stream");
    // SAFETY: live stream of ctx's device.
    let all = distinct(&unsafe { probe.run(&ctx, primary.cu_stream(), blocks, spin) }.unwrap());
    println!(
        "  primary context: {} blocks ran on {} distinct SMs",
        blocks,
        all.len()
    );
    assert!(all.len() as u32 <= dev.sm_count);
    let range = PriorityRange::of(&ctx).unwrap();
    for want in [16u32, 64] {
        let t = Instant::now();
        let p = GreenPartition::new(&ctx, PartitionRequest::split(want)).expect("partition");
        println!(
            "  request {want} SMs (rounded {}): compute green ctx has {} SMs, comm green ctx {} SMs ({:.1} ms to create)",
            p.requested_sms,
            p.compute_sms,
            p.comm_sms,
            t.elapsed().as_secs_f64() * 1e3
        );
        assert!(p.compute_sms >= want, "fewer SMs than requested");
        assert!(p.compute_sms + p.comm_sms <= dev.sm_count);
        // SAFETY: the green streams live as long as `p`.
        let c = distinct(
            &unsafe { probe.run(&ctx, p.compute_stream().cu_stream(), blocks, spin) }.unwrap(),
        );
        println!(
            "    compute stream: {blocks} blocks ran on {} distinct SMs (limit {})",
            c.len(),
            p.compute_sms
        );
        assert!(!c.is_empty() && c.len() as u32 <= p.compute_sms);
        let cs = p.comm_stream().expect("comm stream");
        assert_eq!(cs.priority().unwrap(), range.greatest);
        // SAFETY: as above.
        let m = distinct(&unsafe { probe.run(&ctx, cs.cu_stream(), blocks, spin) }.unwrap());
        let overlap = c.iter().filter(|x| m.binary_search(x).is_ok()).count();
        println!(
            "    comm stream (priority {}): ran on {} distinct SMs (limit {}); SMs shared with compute: {overlap}",
            cs.priority().unwrap(),
            m.len(),
            p.comm_sms
        );
        assert!(m.len() as u32 <= p.comm_sms);
        assert_eq!(overlap, 0, "compute and comm partitions share SMs");
    }
    match GreenPartition::new(&ctx, PartitionRequest::compute_only(dev.sm_count + 1)) {
        Err(CudaError::Plan(e)) => println!("  oversized request rejected: {e}"),
        other => panic!("oversized request: {other:?}"),
    }
}

#[test]
fn shaped_gemm_matches_host_reference() {
    let Some(ctx) = ctx0("shaped_gemm_matches_host_reference") else {
        return;
    };
    let g = ShapedGemm::load(&ctx).expect("load");
    let stream = ctx.new_stream().expect("stream");
    let s = stream.cu_stream();
    for (i, &(m, n, k)) in [
        (128, 128, 32),
        (256, 384, 512),
        (200, 136, 72),
        (1000, 520, 264),
        (77, 8, 8),
    ]
    .iter()
    .enumerate()
    {
        let a = rand(m * k, 10 + i as u64);
        let b = rand(k * n, 20 + i as u64);
        let reference = host_gemm(&a, &b, m, n, k);
        let (da, db) = (upload(&ctx, &a), upload(&ctx, &b));
        let dc = DeviceBuffer::alloc(&ctx, m * n * 2).unwrap();
        for bps in [None, Some(1)] {
            // SAFETY: buffers hold the matrices; the stream is ctx's.
            unsafe {
                crate::mem::memset_d16_async(dc.ptr(), 0x7fc0, m * n, s).unwrap();
                g.launch(s, da.ptr(), db.ptr(), dc.ptr(), m, n, k, bps)
                    .unwrap();
            }
            stream.synchronize().unwrap();
            let out: Vec<f32> = download(&dc, m * n).into_iter().map(b2f).collect();
            let e = rel_err(&out, &reference);
            println!("  GEMM {m}x{n}x{k} blocks/SM {bps:?}: rel err {e:.2e}");
            assert!(e <= 1e-2, "GEMM {m}x{n}x{k} rel err {e}");
        }
        if (m, n, k) == (200, 136, 72) {
            let bias = rand(n, 99);
            let dbias = upload(&ctx, &bias);
            let y = download(&dc, m * n);
            let want: Vec<f32> = y
                .iter()
                .enumerate()
                .map(|(idx, &v)| {
                    let x = b2f(v) + b2f(bias[idx % n]);
                    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
                })
                .collect();
            // SAFETY: dc holds m x n, dbias n.
            unsafe {
                g.bias_gelu(s, dc.ptr(), n, m, n, Some(dbias.ptr()), Some(2))
                    .unwrap()
            };
            stream.synchronize().unwrap();
            let got: Vec<f32> = download(&dc, m * n).into_iter().map(b2f).collect();
            let e = rel_err(&got, &want);
            println!("  bias+GELU {m}x{n}: rel err {e:.2e}");
            assert!(e <= 1e-2, "bias+GELU rel err {e}");
        }
    }
    // Unsupported shapes are typed errors, not launches.
    // SAFETY: rejected before any launch.
    let z = DevicePtr::NULL;
    let r = unsafe { g.launch(s, z, z, z, 64, 12, 64, None) };
    assert!(matches!(r, Err(CudaError::Plan(_))), "{r:?}");
    let r = g.gemm.extra_smem(Some(0));
    assert!(matches!(r, Err(CudaError::Plan(_))), "{r:?}");
}

#[test]
fn shaped_occupancy_matches_request() {
    let Some(ctx) = ctx0("shaped_occupancy_matches_request") else {
        return;
    };
    let g = ShapedGemm::load(&ctx).expect("load");
    for (name, sh) in [("gemm", &g.gemm), ("bias_gelu", &g.epilogue)] {
        println!(
            "  {name}: {} threads, static smem {} B, max dynamic {} B, natural {} blocks/SM",
            sh.threads(),
            sh.static_smem,
            sh.max_dyn_smem,
            sh.natural
        );
        for b in [Some(1), Some(2), Some(3), Some(4), None] {
            let extra = sh.extra_smem(b).expect("extra");
            let occ = sh.occupancy(b).expect("occupancy");
            let want = b.map_or(sh.natural, |b| b.min(sh.natural));
            println!("    blocks/SM {b:?}: extra smem {extra} B -> occupancy {occ}");
            assert_eq!(occ, want, "{name} at {b:?}");
        }
    }
    // The cost of shaping the GEMM itself, 4096^3.
    let (m, n, k) = (4096, 4096, 4096);
    let kern = Kernels::load(&ctx).expect("kernels");
    let stream = ctx.new_stream().unwrap();
    let (a, b, c) = (
        DeviceBuffer::alloc(&ctx, m * k * 2).unwrap(),
        DeviceBuffer::alloc(&ctx, k * n * 2).unwrap(),
        DeviceBuffer::alloc(&ctx, m * n * 2).unwrap(),
    );
    // SAFETY: sizes as allocated.
    unsafe {
        kern.fill(&stream, a.ptr(), (m * k) as u64, 1).unwrap();
        kern.fill(&stream, b.ptr(), (k * n) as u64, 2).unwrap();
    }
    let s = stream.cu_stream();
    for bps in [None, Some(2), Some(1)] {
        // SAFETY: live stream of ctx; buffers as allocated.
        let t = unsafe {
            time_ms(&ctx, s, 2, 10, || {
                g.launch(s, a.ptr(), b.ptr(), c.ptr(), m, n, k, bps)
            })
        }
        .unwrap();
        let ms = median(&t);
        println!(
            "    GEMM {m}^3 at blocks/SM {bps:?}: {ms:.3} ms ({:.0} TFLOP/s)",
            2.0 * (m * n * k) as f64 / (ms as f64 * 1e-3) / 1e12
        );
    }
}

#[test]
fn shaped_gemm_vs_cublaslt_4096() {
    let Some(ctx) = ctx0("shaped_gemm_vs_cublaslt_4096") else {
        return;
    };
    let g = ShapedGemm::load(&ctx).expect("load");
    let kern = Kernels::load(&ctx).expect("kernels");
    let (m, n, k) = (4096usize, 4096, 4096);
    let stream = ctx.new_stream().unwrap();
    let s = stream.cu_stream();
    let a = DeviceBuffer::alloc(&ctx, m * k * 2).unwrap();
    let b = DeviceBuffer::alloc(&ctx, k * n * 2).unwrap();
    let mine = DeviceBuffer::alloc(&ctx, m * n * 2).unwrap();
    let theirs = DeviceBuffer::alloc(&ctx, m * n * 2).unwrap();
    let ws = DeviceBuffer::alloc(&ctx, WORKSPACE_BYTES).unwrap();
    let acc = DeviceBuffer::alloc(&ctx, 32).unwrap();
    acc.upload(&[0u8; 32]).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut lt = Gemms::new().expect("cuBLASLt");
    let key = GemmKey {
        m,
        n,
        k,
        lda: k,
        ldb: n,
        ldc: n,
        sm_target: None,
    };
    // SAFETY: buffers hold the matrices; one stream uses the workspace.
    unsafe {
        kern.fill(&stream, a.ptr(), (m * k) as u64, 7).unwrap();
        kern.fill(&stream, b.ptr(), (k * n) as u64, 8).unwrap();
        lt.tune(key, a.ptr(), b.ptr(), theirs.ptr(), ws.ptr(), &stream)
            .unwrap();
        let t_lt = time_ms(&ctx, s, 3, 20, || {
            lt.gemm(key, a.ptr(), b.ptr(), theirs.ptr(), false, ws.ptr(), s)
        })
        .unwrap();
        let t_me = time_ms(&ctx, s, 3, 20, || {
            g.launch(s, a.ptr(), b.ptr(), mine.ptr(), m, n, k, None)
        })
        .unwrap();
        kern.check(
            &stream,
            mine.ptr(),
            theirs.ptr(),
            (m * n) as u64,
            acc.ptr(),
            acc.ptr().offset(16),
        )
        .unwrap();
        stream.synchronize().unwrap();
        let mut raw = [0u8; 24];
        acc.download(&mut raw).unwrap();
        let sd = f64::from_le_bytes(raw[0..8].try_into().unwrap());
        let sr = f64::from_le_bytes(raw[8..16].try_into().unwrap());
        let nans = u64::from_le_bytes(raw[16..24].try_into().unwrap());
        let rel = (sd / sr.max(1e-30)).sqrt();
        let (ml, mm) = (median(&t_lt), median(&t_me));
        let tf = |ms: f32| 2.0 * (m * n * k) as f64 / (ms as f64 * 1e-3) / 1e12;
        println!(
            "  4096^3 bf16: cuBLASLt {ml:.3} ms ({:.0} TFLOP/s), ficco GEMM {mm:.3} ms ({:.0} TFLOP/s), ficco/cuBLASLt time ratio {:.2}; rel diff {rel:.2e}, NaNs {nans}",
            tf(ml),
            tf(mm),
            mm / ml
        );
        assert_eq!(nans, 0);
        assert!(rel <= 1e-2, "ficco GEMM differs from cuBLASLt: {rel}");
    }
}

/// Median wall time of an all-reduce of `count` bf16 on every rank.
fn time_allreduce(
    set: &CommSet,
    ctxs: &[Arc<CudaContext>],
    bufs: &[(DeviceBuffer, DeviceBuffer)],
    streams: &[Arc<cudarc::driver::CudaStream>],
    count: usize,
) -> f64 {
    use crate::driver::nccl as nc;
    let mut times = vec![];
    for it in 0..12 {
        let t = Instant::now();
        nc::grouped(|| {
            for (r, comm) in set.comms().iter().enumerate() {
                ctxs[r].bind_to_thread().unwrap();
                // SAFETY: each buffer holds `count` bf16; one stream per rank.
                unsafe {
                    nc::all_reduce(
                        bufs[r].0.ptr(),
                        bufs[r].1.ptr(),
                        count,
                        comm.raw(),
                        streams[r].cu_stream(),
                    )?;
                }
            }
            Ok(())
        })
        .unwrap();
        for s in streams {
            s.synchronize().unwrap();
        }
        if it >= 2 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[test]
fn nccl_limits_configure_communicators() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // Before any NCCL call in this process; tests run on one thread.
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let Some(ctxs) = ctx_n("nccl_limits_configure_communicators", 2) else {
        return;
    };
    let gpus = [0usize, 1];
    let cache = CommCache::global();
    let before = cache.len();
    let t = Instant::now();
    let default = cache
        .get(&gpus, NcclLimits::default())
        .expect("default comms");
    println!(
        "  NCCL {} : default communicators in {:.0} ms",
        default.nccl_version,
        t.elapsed().as_secs_f64() * 1e3
    );
    let again = cache.get(&gpus, NcclLimits::default()).unwrap();
    assert!(Arc::ptr_eq(&default, &again), "cache made a second set");
    let one = NcclLimits {
        max_ctas: Some(1),
        min_ctas: Some(1),
        ..Default::default()
    };
    let eff = NcclLimits {
        cta_policy: Some(CtaPolicy::Efficiency),
        ..Default::default()
    };
    let limited = cache.get(&gpus, one).expect("maxCTAs=1 comms");
    let efficient = cache.get(&gpus, eff).expect("efficiency comms");
    // At most the three sets asked for are new (others may exist already,
    // e.g. the default set of a backend opened by another test).
    assert!(
        cache.len() >= 3 && cache.len() <= before + 3,
        "{}",
        cache.len()
    );
    let count = 32usize << 20; // 64 MiB of bf16 per rank
    let bufs: Vec<_> = ctxs
        .iter()
        .map(|c| {
            (
                DeviceBuffer::alloc(c, count * 2).unwrap(),
                DeviceBuffer::alloc(c, count * 2).unwrap(),
            )
        })
        .collect();
    let streams: Vec<_> = ctxs.iter().map(|c| c.new_stream().unwrap()).collect();
    let mut times = vec![];
    for (name, set) in [
        ("default", &default),
        ("maxCTAs=1,minCTAs=1", &limited),
        ("CTAPolicy=efficiency", &efficient),
    ] {
        let info = set.verify().expect("NCCL reports the configured ranks");
        let c = set.limits.to_raw();
        let ms = time_allreduce(set, &ctxs, &bufs, &streams, count);
        println!(
            "  {name}: (count, device, rank) per comm {info:?}; config maxCTAs {} minCTAs {} CTAPolicy {} (i32::MIN = NCCL default); all-reduce 64 MiB bf16: {ms:.3} ms ({:.0} GB/s bus)",
            c.maxCTAs,
            c.minCTAs,
            c.CTAPolicy,
            (count * 2) as f64 / (ms * 1e-3) / 1e9
        );
        times.push(ms);
    }
    assert!(
        times[1] > 1.5 * times[0],
        "maxCTAs=1 all-reduce ({:.3} ms) is not slower than default ({:.3} ms): limit not applied?",
        times[1],
        times[0]
    );
}
