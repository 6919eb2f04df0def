//! The watchdog of fast calls: a thread that watches the job's progress
//! words while calls are in flight and releases every flag when one stalls.
//!
//! The device itself marks each call's start and end in two host-mapped
//! words ([`WatchState::words`]), so the watch needs nothing from the host
//! per call: a call captured in a CUDA graph is watched at every replay as
//! an eager call is. A call is hung when the device started it and neither
//! word changed for the bound.

use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::exec::rank::Rank;
use crate::exec::watchdog::{on_side_stream, RELEASED};
use crate::mem::DevicePtr;
use crate::signal::HostWords;
use cudarc::driver::{CudaContext, CudaEvent};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the [`Watch`] thread and the calls share.
pub(super) struct WatchState {
    pub(super) ctx: Arc<CudaContext>,
    /// Word [`DONE`]: the number of the last call this rank's device
    /// finished; word [`STARTED`]: of the last it started (both written by
    /// the control stream; a captured call writes its capture-time number
    /// at every replay, and each call first sets DONE to that number's
    /// complement, so a call in flight never shows STARTED == DONE).
    pub(super) words: HostWords,
    /// Recorded after every call made outside capture, on the stream it ran
    /// on (the control stream, or the caller's for a replay): the
    /// drain after a hang waits until it completed too.
    pub(super) done_event: CudaEvent,
    /// This rank's flag memory (base, words), released on a hang.
    pub(super) flags: Mutex<(DevicePtr, usize)>,
    /// The hang found, until a call reports it.
    pub(super) failed: Mutex<Option<CudaError>>,
    pub(super) stop: AtomicBool,
    pub(super) bound: Duration,
    pub(super) rank: usize,
}

/// The thread that ends a hung fast call (see the module doc).
pub(crate) struct Watch {
    pub(super) state: Arc<WatchState>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

/// The word the device writes at a call's end.
pub(super) const DONE: usize = 0;
/// The word the device writes at a call's start.
pub(super) const STARTED: usize = 1;

/// How often the watch thread looks at the call words.
pub(super) const WATCH_POLL: Duration = Duration::from_micros(500);
/// How often a hung call's flags are released again while it drains.
pub(super) const RELEASE_EVERY: Duration = Duration::from_millis(20);

impl Watch {
    pub(super) fn new(rank: &Rank, bound_ms: u64) -> Result<Self> {
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let state = Arc::new(WatchState {
            ctx: rank.ctx.clone(),
            words: HostWords::new(2)?,
            done_event: rank.ctx.new_event(None).map_err(drv("cuEventCreate"))?,
            flags: Mutex::new((DevicePtr::NULL, 0)),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            bound: Duration::from_millis(bound_ms.max(1)),
            rank: rank.rank,
        });
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("ficco-op-watch".into())
            .spawn(move || watch_loop(&s))
            .map_err(|e| CudaError::Plan(format!("cannot start the call watchdog: {e}")))?;
        Ok(Watch {
            state,
            thread: Some(thread),
        })
    }

    pub(super) fn take_failure(&self) -> Option<CudaError> {
        self.state
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(super) fn watch_loop(s: &WatchState) {
    // The clock runs from the last change of either word: calls issued
    // behind a hung one do not reset it (a caller that keeps queueing must
    // not hide the hang).
    let mut last = (u32::MAX, u32::MAX);
    let mut since = Instant::now();
    while !s.stop.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_POLL);
        let now = (s.words.get(STARTED), s.words.get(DONE));
        if now != last || now.0 == now.1 {
            last = now;
            since = Instant::now();
            continue;
        }
        if since.elapsed() < s.bound {
            continue;
        }
        let waited_ms = since.elapsed().as_millis() as u64;
        *s.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(CudaError::Hang {
            rank: s.rank,
            point: format!(
                "operator call {} (a peer rank died or hangs; this call and any issued after it have no valid result)",
                now.0
            ),
            waited_ms,
        });
        drain(s);
        last = (s.words.get(STARTED), s.words.get(DONE));
        since = Instant::now();
    }
}

/// Releases this rank's flags again and again until the device finished
/// every call it started and every call issued eagerly; ends the process
/// when the device does not drain (a kernel that never ends), as the run's
/// watchdog does. (A graph replayed after this point is released by the
/// next hang found.)
pub(super) fn drain(s: &WatchState) {
    let deadline = Instant::now() + s.bound.max(Duration::from_secs(2));
    let drained = || {
        s.words.get(STARTED) == s.words.get(DONE) && s.done_event.try_is_complete().unwrap_or(true)
    };
    while !drained() && !s.stop.load(Ordering::Acquire) {
        let (base, words) = *s.flags.lock().unwrap_or_else(|p| p.into_inner());
        if words > 0 && !base.is_null() {
            let _ = on_side_stream(&s.ctx, |st| {
                // SAFETY: this rank's live flag memory holds `words` words
                // (it is only replaced after every call finished).
                unsafe { cu::memset_d32_async(base, RELEASED, words, st) }
            });
        }
        if Instant::now() > deadline {
            eprintln!(
                "ficco: rank {}: an operator call hung and the device did not drain; exiting",
                s.rank
            );
            std::process::exit(crate::exec::HANG_EXIT_CODE);
        }
        std::thread::sleep(RELEASE_EVERY);
    }
}
