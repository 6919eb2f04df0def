//! GPU tests of the resource controls: stream priorities, green-context SM
//! partitions and NCCL communicator limits (ficco's own GEMM's SM budget and
//! occupancy hooks are tested in `tests/gpu_hgemm.rs`). Each test prints what it measures.
//! They are unit tests (they use crate-internal modules), `#[ignore]`d as
//! they need a GPU, and fail where they run without one (see `ficco-testkit`
//! for the policy). The NCCL test needs 2 GPUs (`_2gpus`). Run on the device
//! with `--include-ignored --test-threads=1 --nocapture` and
//! `NCCL_NVLS_ENABLE=0` (`bench/gpu-tests.sh` does).

use crate::comm::{CommCache, CommSet, CtaPolicy, NcclLimits};
use crate::controls::{priority_stream, stream_priority, PriorityRange, StreamPriority};
use crate::green::{device_sm_resource, distinct, GreenPartition, PartitionRequest, SmIdProbe};
use crate::mem::DeviceBuffer;
use crate::CudaError;
use cudarc::driver::CudaContext;
use ficco_testkit::{gate, GpuAvailability};
use std::sync::Arc;
use std::time::Instant;

/// GPU 0's context; fails `test` where there is no usable GPU.
fn ctx0(test: &str) -> Arc<CudaContext> {
    ctx_n(test, 1).remove(0)
}

/// The contexts of GPUs 0..n; fails `test` where there are fewer.
fn ctx_n(test: &str, n: usize) -> Vec<Arc<CudaContext>> {
    let found = match crate::loader::require().and_then(|_| crate::info::device_count()) {
        Ok(found) => GpuAvailability::Found(found),
        Err(e) => GpuAvailability::Unusable(e.to_string()),
    };
    gate(test, n, found);
    (0..n)
        .map(|i| CudaContext::new(i).expect("primary context"))
        .collect()
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn priority_range_and_streams() {
    let ctx = ctx0("priority_range_and_streams");
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
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn green_partitions_confine_kernels() {
    let ctx = ctx0("green_partitions_confine_kernels");
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
    ficco_core::stats::median(&times).unwrap_or(0.0)
}

#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn nccl_limits_configure_communicators_2gpus() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // Before any NCCL call in this process; tests run on one thread.
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let ctxs = ctx_n("nccl_limits_configure_communicators_2gpus", 2);
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
