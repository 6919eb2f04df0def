//! The watchdog: the thread that starts a run watches each rank's finished
//! iterations (a word of pinned, mapped host memory each rank's control
//! stream writes). When no rank finishes an iteration for
//! `opts.watchdog_ms`, or an issuing thread failed, it
//! 1. reads the flags (on a side stream, polled at most a second) and names
//!    the first unset wait: the rank, task, iteration and the producer it
//!    waits for;
//! 2. tells the issuing threads to stop, and writes [`RELEASED`] into every
//!    flag of the run from a fresh side stream, again every
//!    [`RELEASE_EVERY_MS`] (consumers clear their flags at each iteration's
//!    end, and iterations already queued wait again) until every thread
//!    returned: the streams drain and nothing is left running;
//! 3. fails the run with [`CudaError::Hang`].
//!
//! When the device does not drain within another bound (a kernel or NCCL
//! call that never ends), no thread can be joined: it prints the hang and
//! ends the process with [`HANG_EXIT_CODE`]. Its own work never blocks on
//! the device: every side operation is polled with a deadline. A driver
//! call can still block on a lock another thread holds inside the driver;
//! a deadman thread then ends the process, with where each rank's thread
//! was (read from host memory), once steps 1 and 2 overrun their bound.

use super::shared::Shared;
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::signal::{Point, SET};
use cudarc::driver::CudaContext;
use ficco_core::plan::TaskKind;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exit status of a process the watchdog ends (EX_SOFTWARE).
pub const HANG_EXIT_CODE: i32 = 70;

/// How often a stuck run's flags are released again while it drains.
const RELEASE_EVERY_MS: u64 = 20;

/// The watchdog loop: returns the hang, if one was found. `threads` is the
/// number of issuing threads, each of which adds one to `finished` when done.
pub(crate) fn watchdog(
    sh: &Shared<'_>,
    ctxs: &[Arc<CudaContext>],
    finished: &AtomicUsize,
    failed: &AtomicBool,
    threads: usize,
) -> Option<CudaError> {
    let bound = Duration::from_millis(sh.opts.watchdog_ms);
    let total = (sh.spec.warmup + sh.spec.timed + usize::from(sh.spec.timeline)) as u32;
    // Only this process's ranks: other processes watch their own.
    let snapshot = || {
        (0..ctxs.len())
            .map(|r| {
                if sh.local.contains(&r) {
                    sh.progress.get(r)
                } else {
                    total
                }
            })
            .collect::<Vec<u32>>()
    };
    let mut last = snapshot();
    let mut last_change = Instant::now();
    let mut hang = None;
    while finished.load(Ordering::Acquire) < threads {
        std::thread::sleep(Duration::from_micros(100));
        let stuck = if failed.load(Ordering::Acquire) {
            // A thread failed to issue: its consumers would wait forever.
            true
        } else {
            let now = snapshot();
            if now != last {
                last = now;
                last_change = Instant::now();
                continue;
            }
            !last.iter().all(|&p| p >= total) && last_change.elapsed() >= bound
        };
        if !stuck {
            continue;
        }
        // Where every local rank is (finished iterations, its thread), read
        // from host memory only: known even when the driver is not usable.
        let threads_at: Vec<String> = sh
            .local
            .iter()
            .map(|&r| {
                let done = last.get(r).copied().unwrap_or(0);
                let mut s = format!(
                    "rank {r}: {done} done, thread {}",
                    sh.issuing.describe(sh.plan, r)
                );
                if let Some(u) = sh.issuing.unfinished(sh.plan, r, done + 1) {
                    s = format!("{s}, {u}");
                }
                s
            })
            .collect();
        let threads_at = threads_at.join("; ");
        // Everything below calls the driver, which a thread stuck inside it
        // (a library loading code while its device waits) may hold locked.
        let _deadman = Deadman::arm(
            deadman_bound(bound, ctxs.len()),
            format!(
                "ficco: watchdog: the run on {} made no progress for {} ms [{threads_at}], \
                 and the watchdog's own driver calls did not return (another thread \
                 holds the driver); exiting",
                sh.plan.name,
                last_change.elapsed().as_millis()
            ),
        );
        if !failed.load(Ordering::Acquire) {
            let waited_ms = last_change.elapsed().as_millis() as u64;
            let (rank, point) = diagnose(sh, ctxs, &last);
            hang = Some(CudaError::Hang {
                rank,
                point: format!("{point} [{threads_at}]"),
                waited_ms,
            });
        }
        sh.abort.store(true, Ordering::Release);
        drain(sh, ctxs, finished, threads, bound, hang.as_ref());
        break;
    }
    hang
}

/// Releases every flag again and again until every issuing thread returned;
/// ends the process when that takes longer than `bound` (at least 2 s).
fn drain(
    sh: &Shared<'_>,
    ctxs: &[Arc<CudaContext>],
    finished: &AtomicUsize,
    threads: usize,
    bound: Duration,
    hang: Option<&CudaError>,
) {
    let deadline = Instant::now() + bound.max(Duration::from_secs(2));
    let mut released = false;
    while finished.load(Ordering::Acquire) < threads {
        released |= release_all(sh, ctxs);
        if Instant::now() > deadline {
            eprintln!(
                "ficco: watchdog: {} and the device did not drain (a flag release completed: \
                 {released}); exiting",
                hang.map(|h| h.to_string())
                    .unwrap_or_else(|| "an issuing thread failed".into())
            );
            std::process::exit(HANG_EXIT_CODE);
        }
        std::thread::sleep(Duration::from_millis(RELEASE_EVERY_MS));
    }
}

/// The most the watchdog's diagnosis and drain may take: a side read per
/// rank, then [`drain`]'s bound, with a second to spare.
fn deadman_bound(bound: Duration, ranks: usize) -> Duration {
    Duration::from_millis(SIDE_WORK_MS) * (ranks as u32 + 1) + bound.max(Duration::from_secs(2))
}

/// Ends the process with [`HANG_EXIT_CODE`] and `message` unless dropped
/// within `after`: the bound on work that may block inside the driver.
struct Deadman {
    _armed: std::sync::mpsc::Sender<()>,
}

impl Deadman {
    fn arm(after: Duration, message: String) -> Deadman {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            // Dropping the sender disconnects: the watchdog finished in time.
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(after) {
                eprintln!("{message}");
                std::process::exit(HANG_EXIT_CODE);
            }
        });
        Deadman { _armed: tx }
    }
}

/// How long the watchdog waits for its own side work (a flag read or release).
const SIDE_WORK_MS: u64 = 1000;

/// Runs `f` on a fresh non-blocking stream of `ctx` and polls it for at most
/// [`SIDE_WORK_MS`]. Returns whether the work finished; the stream is
/// destroyed either way (the driver frees it once its work is done). Never
/// blocks on a stuck device.
pub(crate) fn on_side_stream(
    ctx: &Arc<CudaContext>,
    f: impl FnOnce(cudarc::driver::sys::CUstream) -> Result<()>,
) -> Result<bool> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let s = cu::stream_create_nonblocking()?;
    let res = f(s);
    let deadline = Instant::now() + Duration::from_millis(SIDE_WORK_MS);
    let mut done = false;
    while res.is_ok() && Instant::now() < deadline {
        // SAFETY: `s` is live until destroyed below.
        if unsafe { cu::stream_done(s) }.unwrap_or(true) {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    // SAFETY: created above, destroyed once; pending work still completes.
    unsafe { cu::stream_destroy(s) };
    res.map(|_| done)
}

/// The value the watchdog writes into every flag. `CU_STREAM_WAIT_VALUE_GEQ`
/// compares `(int32_t)(*addr - value) >= 0`, so `u32::MAX` would satisfy no
/// wait; 2^30 satisfies every wait for [`SET`].
pub(crate) const RELEASED: u32 = 1 << 30;

/// Writes [`RELEASED`] into every flag of the run: every wait is satisfied.
/// Returns whether every write was seen to complete.
fn release_all(sh: &Shared<'_>, ctxs: &[Arc<CudaContext>]) -> bool {
    let mut all = true;
    for (r, ctx) in ctxs.iter().enumerate() {
        let words = sh.layout.words[r];
        // Other processes' ranks too: their waits on this rank end as well.
        if words == 0 || sh.flags[r].is_null() {
            continue;
        }
        let done = on_side_stream(ctx, |s| {
            // SAFETY: rank r's live flag buffer holds `words` words.
            unsafe { cu::memset_d32_async(sh.flags[r], RELEASED, words, s) }
        });
        all &= matches!(done, Ok(true));
    }
    all
}

/// The first wait (task waits before barrier waits) whose flag is below its
/// value, as (rank, description).
fn diagnose(sh: &Shared<'_>, ctxs: &[Arc<CudaContext>], progress: &[u32]) -> (usize, String) {
    let plan = sh.plan;
    let label = |p: Point| {
        plan.ranks[p.rank]
            .tasks
            .get(p.index)
            .map(|t| format!("task {} '{}'", p.index, t.label))
            .unwrap_or_else(|| "end of iteration".into())
    };
    let mut values: Vec<Vec<u32>> = vec![];
    for (r, ctx) in ctxs.iter().enumerate() {
        // No pinned allocation or free here: cuMemFreeHost synchronizes the
        // device, which is what is stuck. `sh.diag` lives until the run ends,
        // after the device drained.
        let words = sh.layout.words[r];
        if sh.flags[r].is_null() {
            values.push(vec![u32::MAX; words]);
            continue;
        }
        let host = sh.diag;
        let res = on_side_stream(ctx, |s| {
            // SAFETY: rank r's live flag buffer holds `words` words and the
            // mapped diagnostic buffer at least as many (run_plan_with).
            unsafe { cu::memcpy_dtod_async(host.device(0), sh.flags[r], words * 4, s) }
        });
        if matches!(res, Ok(true)) {
            values.push((0..words).map(|i| host.get(i)).collect());
        } else {
            values.push(vec![u32::MAX; words]);
        }
    }
    // Below the value waited for (flags count up from 0; u32::MAX: unread).
    let unset = |r: usize, w: usize, target: u32| values[r].get(w).is_some_and(|&v| v < target);
    for (r, rp) in plan.ranks.iter().enumerate() {
        if progress[r] as usize >= sh.spec.warmup + sh.spec.timed + usize::from(sh.spec.timeline) {
            continue;
        }
        let it = progress[r] + 1;
        for (i, t) in rp.tasks.iter().enumerate() {
            // The plan's own flags: a Wait task, or a tile GEMM's blocks.
            let own: Vec<usize> = match &t.kind {
                TaskKind::Wait { flag } => vec![*flag],
                TaskKind::TileGemm(g) => g
                    .wait
                    .map(|w| (w..w + g.blocks()).collect())
                    .unwrap_or_default(),
                _ => vec![],
            };
            if let Some(f) = own.into_iter().find(|&f| {
                sh.layout
                    .plan_word(r, f)
                    .is_some_and(|w| unset(r, w, sh.layout.plan_target(r, f)))
            }) {
                return (
                    r,
                    format!(
                        "task {i} '{}' (iteration {it}) waiting for flag {f} of rank {r}",
                        t.label
                    ),
                );
            }
            for d in t.deps.iter().filter(|d| d.rank != r) {
                let p = Point {
                    rank: d.rank,
                    index: d.index,
                };
                if sh.layout.slot(p, r).is_some_and(|w| unset(r, w, SET)) {
                    return (
                        r,
                        format!(
                            "task {i} '{}' (iteration {it}) waiting for the signal of rank {} {}",
                            t.label,
                            d.rank,
                            label(p)
                        ),
                    );
                }
            }
        }
    }
    for (r, &done) in progress.iter().enumerate() {
        if !sh.local.contains(&r) {
            continue;
        }
        // Iteration `done` (0-based) starts by waiting on bank 1 - done % 2.
        let bank = 1 - done as usize % 2;
        for q in sh.peers(r) {
            if done > 0 && unset(r, sh.layout.end_slot(q, r, bank), SET) {
                return (
                    r,
                    format!(
                        "start of iteration {}, waiting for rank {q}'s end of iteration {done}",
                        done + 1
                    ),
                );
            }
        }
    }
    let r = progress
        .iter()
        .enumerate()
        .min_by_key(|(_, &p)| p)
        .map(|(r, _)| r)
        .unwrap_or(0);
    (
        r,
        format!(
            "iteration {}: no unsatisfied signal wait (a kernel, copy or NCCL call does not finish)",
            progress.get(r).copied().unwrap_or(0) + 1
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process of [`a_deadman_ends_the_process_unless_dropped`].
    const CHILD_ENV: &str = "FICCO_TEST_DEADMAN_CHILD";

    #[test]
    fn a_deadman_ends_the_process_unless_dropped() {
        if std::env::var_os(CHILD_ENV).is_some() {
            // The child: stuck past the bound, as a watchdog blocked in a driver call.
            let _d = Deadman::arm(Duration::from_millis(50), "deadman fired".into());
            std::thread::sleep(Duration::from_secs(20));
            return;
        }
        // Dropped in time: nothing happens to this process.
        drop(Deadman::arm(
            Duration::from_millis(50),
            "must not fire".into(),
        ));
        std::thread::sleep(Duration::from_millis(200));
        let exe = std::env::current_exe().unwrap();
        let t0 = Instant::now();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "exec::watchdog::tests::a_deadman_ends_the_process_unless_dropped",
                "--nocapture",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(HANG_EXIT_CODE));
        assert!(String::from_utf8_lossy(&out.stderr).contains("deadman fired"));
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn the_deadman_bound_covers_the_diagnosis_and_the_drain() {
        let b = deadman_bound(Duration::from_millis(500), 4);
        // 4 side reads of a second each, plus the drain's 2 s floor.
        assert!(b >= Duration::from_millis(4 * SIDE_WORK_MS + 2000));
        assert!(b <= Duration::from_secs(10));
        assert!(deadman_bound(Duration::from_secs(10), 4) > Duration::from_secs(14));
    }
}
