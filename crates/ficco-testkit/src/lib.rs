//! Test support for ficco's GPU tests, a dev-dependency of ficco-cuda (its
//! unit and integration tests) and of the CLI's GPU tests; nothing of it is
//! in a release build. The GPU test policy, bf16 conversion, test data and
//! the relative-error check.
//!
//! GPU test policy (honest counts):
//! * Every test that needs a GPU is `#[ignore = "needs a GPU ..."]`, so a
//!   `cargo test` without one lists it as *ignored*, never as passed. The
//!   GPU machine runs them with `--include-ignored` (`bench/gpu-tests.sh`).
//! * A test that needs N > 1 GPUs ends its name in `_Ngpus` (`_2gpus`,
//!   `_4gpus`), and passes N to [`gate`], which checks the suffix. Where a
//!   machine has fewer than N GPUs, `bench/gpu-tests.sh` passes
//!   `--skip _Ngpus`, so libtest counts the test as *filtered out*.
//! * A GPU test that runs where its GPUs are not there fails ([`gate`],
//!   [`no_gpu`]) with a message saying what is missing and what to skip; it
//!   never passes without having run. (`FICCO_REQUIRE_GPU=1`, set on the
//!   GPU machine, matters only to the few tests that run everywhere and
//!   check the machine they find, such as `open_matches_the_environment`.)
//! * Tests that need NVRTC but no GPU (the crate's compile tests) are
//!   ignored the same way and fail without NVRTC; `.ci/run` runs them with
//!   NVRTC from PyPI.

/// Fake NVIDIA libraries for the library-probe tests (feature `fakelib`).
#[cfg(feature = "fakelib")]
pub mod fakelib;

/// Whether `FICCO_REQUIRE_GPU=1` is set.
pub fn gpu_required() -> bool {
    std::env::var("FICCO_REQUIRE_GPU").is_ok_and(|v| v.trim() == "1")
}

/// What a test found when it looked for GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuAvailability {
    /// `found` GPUs with every library.
    Found(usize),
    /// No usable GPU: the reason (missing library, no device, open failed).
    Unusable(String),
}

/// The name suffix of a test that needs `wanted` GPUs (`_2gpus`); none for one.
pub fn gpus_suffix(wanted: usize) -> Option<String> {
    (wanted > 1).then(|| format!("_{wanted}gpus"))
}

/// Checks that `test` can run with `found`: returns where it can, and fails
/// the test (panics) where it cannot, saying what is missing and what to
/// skip. A test of `wanted` > 1 GPUs must be named `..._{wanted}gpus`
/// (checked first, whatever the machine), so that the GPU test script can
/// leave it out by name where there are fewer.
pub fn gate(test: &str, wanted: usize, found: GpuAvailability) {
    if let Some(suffix) = gpus_suffix(wanted) {
        assert!(
            test.ends_with(&suffix),
            "{test} needs {wanted} GPUs, so its name must end in '{suffix}' \
             (bench/gpu-tests.sh skips it by that name where there are fewer)"
        );
    }
    match found {
        GpuAvailability::Found(n) if n >= wanted => {}
        GpuAvailability::Found(n) if n > 0 => {
            let suffix = gpus_suffix(wanted).unwrap_or_default();
            panic!(
                "{test}: needs {wanted} GPUs, this machine has {n}: \
                 leave it out with --skip {suffix} (bench/gpu-tests.sh does)"
            )
        }
        GpuAvailability::Found(_) => no_gpu(test, "no GPU found"),
        GpuAvailability::Unusable(reason) => no_gpu(test, &reason),
    }
}

/// Fails `test`, a GPU test that runs where no GPU is usable.
pub fn no_gpu(test: &str, reason: &str) -> ! {
    panic!(
        "{test}: needs a GPU, and none is usable here: {reason}. GPU tests are \
         #[ignore]d: run them on a GPU machine (bench/gpu-tests.sh), not with \
         --include-ignored or --ignored here"
    )
}

/// `CUDA_VISIBLE_DEVICES` for a child process that uses GPU 0 alone (every
/// loopback rank): the first GPU this process sees. The child's driver then
/// starts, and `ficco_cuda::info` opens a context, on one GPU instead of
/// every GPU of the machine, so such tests take as long on 4 GPUs as on 1.
pub fn first_gpu_only() -> (&'static str, String) {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    ("CUDA_VISIBLE_DEVICES", first_of(visible.as_deref()))
}

/// The first entry of a `CUDA_VISIBLE_DEVICES` value (index or UUID), or
/// "0" where it is unset or empty.
fn first_of(visible: Option<&str>) -> String {
    visible
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("0")
        .to_string()
}

/// f32 → bf16 bits, round to nearest even.
pub fn f2b(f: f32) -> u16 {
    if f.is_nan() {
        return 0x7fc0;
    }
    let u = f.to_bits();
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

pub fn b2f(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Deterministic ~U(-1,1) bf16 data.
pub fn rand(n: usize, seed: u64) -> Vec<u16> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            f2b(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect()
}

/// ||out - ref|| / ||ref||; infinite when `out` holds a NaN.
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    let (mut d, mut r) = (0.0f64, 0.0f64);
    for (o, x) in out.iter().zip(reference) {
        if o.is_nan() {
            return f64::INFINITY;
        }
        d += ((*o - *x) as f64).powi(2);
        r += (*x as f64).powi(2);
    }
    (d / r.max(1e-30)).sqrt()
}

/// Every copy-engine schedule of `op` (the loopback design space), with and
/// without controls, named once.
pub fn copy_schedules(op: ficco_core::problem::workload::Op) -> Vec<ficco_core::space::Schedule> {
    use ficco_core::space::{enumerate, Engine, SpaceOptions};
    let mut out = vec![];
    for controls in [false, true] {
        let opts = SpaceOptions {
            controls,
            sm_count: 132,
            nccl_sms: 16,
        };
        for s in enumerate(op, opts) {
            if s.engine == Engine::Copy && !s.is_seq() && !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// A file holding `text` whose name is already gone (a descriptor to hand
/// between processes in the fd-passing tests). Panics on an I/O failure:
/// test support.
pub fn unlinked_file(text: &str) -> std::fs::File {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static MADE: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "ficco-test-{}-{}-{}",
        std::process::id(),
        MADE.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("temp file");
    let _ = std::fs::remove_file(&path);
    f.write_all(text.as_bytes()).expect("write");
    f
}

/// The abstract Unix socket names in this network namespace that contain
/// `part` (what any user can read in `/proc/net/unix`: the intruder tests
/// find ficco's descriptor sockets this way).
pub fn abstract_sockets(part: &str) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let mut names: Vec<String> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|n| n.strip_prefix('@'))
        .filter(|n| n.contains(part))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What a foreign process does to ficco's descriptor sockets in the
/// intruder tests: until `want` sockets whose names contain `part` are
/// reached (or `within` passes), connects to each new one and, claiming to
/// be the rank that socket's owner awaits next (of `world`), hands it
/// something through `send(stream, tag)`. Returns the names reached and the
/// connections, which the caller holds open while the ranks accept.
pub fn attack_descriptor_sockets(
    part: &str,
    want: usize,
    world: u64,
    within: std::time::Duration,
    send: impl Fn(&std::os::unix::net::UnixStream, u64),
) -> (Vec<String>, Vec<std::os::unix::net::UnixStream>) {
    use std::os::linux::net::SocketAddrExt;
    let deadline = std::time::Instant::now() + within;
    let (mut reached, mut held) = (Vec::<String>::new(), vec![]);
    while reached.len() < want && std::time::Instant::now() < deadline {
        for name in abstract_sockets(part) {
            if reached.contains(&name) {
                continue;
            }
            let Ok(a) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) else {
                continue;
            };
            if let Ok(c) = std::os::unix::net::UnixStream::connect_addr(&a) {
                let owner: u64 = name
                    .rsplit('.')
                    .next()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0);
                send(&c, (owner + 1) % world.max(1));
                held.push(c);
                reached.push(name);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    (reached, held)
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    fn fails(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let e = std::panic::catch_unwind(f).expect_err("the gate must fail the test");
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    #[test]
    fn enough_gpus_run() {
        gate("t", 1, GpuAvailability::Found(1));
        gate("t_2gpus", 2, GpuAvailability::Found(8));
        gate("t_4gpus", 4, GpuAvailability::Found(4));
    }

    /// Too few GPUs fail, naming the filter that leaves the test out.
    #[test]
    fn too_few_gpus_fail_naming_what_to_skip() {
        let m = fails(|| gate("t_2gpus", 2, GpuAvailability::Found(1)));
        assert!(m.contains("needs 2 GPUs, this machine has 1"), "{m}");
        assert!(m.contains("--skip _2gpus"), "{m}");
        let m = fails(|| gate("t_4gpus", 4, GpuAvailability::Found(2)));
        assert!(m.contains("--skip _4gpus"), "{m}");
    }

    /// No usable GPU fails with the reason, whatever `FICCO_REQUIRE_GPU` says.
    #[test]
    fn no_gpu_fails_with_the_reason() {
        let m = fails(|| {
            gate(
                "t",
                1,
                GpuAvailability::Unusable("simulated, policy test".into()),
            )
        });
        assert!(
            m.contains("simulated, policy test") && m.contains("#[ignore]"),
            "{m}"
        );
        let m = fails(|| gate("t_2gpus", 2, GpuAvailability::Found(0)));
        assert!(m.contains("no GPU found"), "{m}");
    }

    /// A multi-GPU test without its suffix fails on any machine, so that
    /// the script's `--skip _Ngpus` cannot miss it.
    #[test]
    fn multi_gpu_tests_carry_their_suffix() {
        let m = fails(|| gate("t", 2, GpuAvailability::Found(8)));
        assert!(m.contains("must end in '_2gpus'"), "{m}");
        let m = fails(|| gate("t_2gpus", 4, GpuAvailability::Found(8)));
        assert!(m.contains("'_4gpus'"), "{m}");
        assert_eq!(gpus_suffix(1), None);
    }

    #[test]
    fn a_child_sees_the_first_visible_gpu() {
        assert_eq!(first_of(None), "0");
        assert_eq!(first_of(Some("")), "0");
        assert_eq!(first_of(Some("3,1")), "3");
        assert_eq!(first_of(Some(" 2 , 0")), "2");
        assert_eq!(first_of(Some("GPU-8f2e,GPU-11aa")), "GPU-8f2e");
        assert_eq!(first_gpu_only().0, "CUDA_VISIBLE_DEVICES");
    }
}
