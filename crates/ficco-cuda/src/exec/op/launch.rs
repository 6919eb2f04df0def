//! The launch thread of replayed calls: the caller's thread hands a call's
//! graph over and returns; a thread of ficco's pays the `cuGraphLaunch`.
//!
//! Why: at P = 4 a replayed call's launch costs the host 28-37 µs (its
//! memory-operation batches and copies from peers, `bench/graph_launch.py`),
//! most of the call's host time, on the thread that runs the model. Here the
//! caller's stream gets two memory operations in one batch instead: write the
//! call's number `n` into [`ARRIVED`], wait until [`FINISHED`] reaches `n`.
//! The launch thread, in call order, makes its own stream wait for
//! `ARRIVED >= n`, launches the graph and writes `FINISHED = n`. The graph
//! thus runs after the caller's work before the call and before its work
//! after it, as it did when launched on the caller's stream.
//!
//! Numbers grow by one per call (the waits compare wrap-aware). Calls on
//! different caller streams are already ordered by the watch's `done` event
//! (`OpRunner::last_on`), so `ARRIVED` only grows on the device.
//!
//! Failure: a launch that fails still writes `FINISHED` (the caller's stream
//! drains; that call has no valid result) and the next call reports the
//! error. Whatever frees or rewrites memory a queued graph uses (the full
//! path, a quiet barrier, the end of the job) first [`Launcher::flush`]es.
//! The watch thread guards launched graphs as before: a call that waits for
//! a dead peer hangs on the device, not here.

use super::fast::CallGraph;
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::{DeviceBuffer, DevicePtr};
use cudarc::driver::{CudaContext, CudaStream};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Byte offset of the word the caller's stream writes (a call's number).
const ARRIVED: usize = 0;
/// Byte offset of the word the launch stream writes after a call's graph.
const FINISHED: usize = 4;

/// How long the thread spins for the next call before it sleeps: a model
/// makes its calls tens of µs apart, and waking a sleeping thread costs
/// about as much as the launch it saves.
const SPIN: Duration = Duration::from_micros(200);

/// How long [`Launcher::flush`] waits for the thread before it gives up (a
/// launch blocks only while the device's queue is full).
const FLUSH_BOUND: Duration = Duration::from_secs(60);

/// A replayed call waiting for its launch.
struct Item {
    graph: Arc<CallGraph>,
    n: u32,
}

/// What the caller's thread and the launch thread share.
struct LaunchState {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Calls handed over and not yet launched.
    pending: AtomicUsize,
    failed: Mutex<Option<CudaError>>,
    stop: AtomicBool,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    /// The thread waits on `wake` (the caller then notifies).
    asleep: bool,
}

/// The launch thread of one rank's replayed calls (see the module doc).
pub(super) struct Launcher {
    state: Arc<LaunchState>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// [`ARRIVED`] and [`FINISHED`], on this rank's device.
    words: DeviceBuffer,
    /// The stream the graphs are launched on (held until the thread ends).
    _stream: Arc<CudaStream>,
    /// The number of the last call handed over.
    n: u32,
}

impl Launcher {
    /// Starts the thread on `ctx` with its stream and two zeroed words.
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let words = DeviceBuffer::alloc(ctx, 8)?;
        words.upload(&[0u8; 8])?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let state = Arc::new(LaunchState {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            pending: AtomicUsize::new(0),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let s = state.clone();
        let c = ctx.clone();
        let raw = stream.cu_stream() as u64;
        let base = words.ptr();
        let (up, started) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ficco-op-launch".into())
            .spawn(move || launch_loop(&s, &c, raw, base, up))
            .map_err(|e| CudaError::Plan(format!("cannot start the call launch thread: {e}")))?;
        // The thread's context must be bound before a call relies on it.
        started.recv().unwrap_or_else(|_| {
            Err(CudaError::Plan(
                "the call launch thread ended while starting".into(),
            ))
        })?;
        Ok(Launcher {
            state,
            thread: Some(thread),
            words,
            _stream: stream,
            n: 0,
        })
    }

    /// Hands a replay of `graph` over, ordered on the caller's `stream` (see
    /// the module doc): one batch of two memory operations on the stream.
    ///
    /// # Safety
    /// `stream` is live on this launcher's context, which is current.
    pub(super) unsafe fn hand_over(
        &mut self,
        graph: Arc<CallGraph>,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
            return Err(self
                .take_failure()
                .unwrap_or_else(|| CudaError::Plan("the call launch thread has ended".into())));
        }
        let n = self.n.wrapping_add(1);
        // Queued first: the thread's ~30 µs launch starts while the caller
        // issues its two operations.
        self.state.pending.fetch_add(1, Ordering::AcqRel);
        let asleep = {
            let mut q = self.state.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.items.push_back(Item { graph, n });
            q.asleep
        };
        if asleep {
            self.state.wake.notify_one();
        }
        self.n = n;
        let base = self.words.ptr();
        cu::stream_memops(
            stream,
            &[
                cu::MemOp::Write(base.offset(ARRIVED), n),
                cu::MemOp::WaitGeq(base.offset(FINISHED), n),
            ],
        )
    }

    /// Waits until every call handed over is launched (not run): after it,
    /// what the caller frees or resets is only in use on the device.
    pub(super) fn flush(&self) -> Result<()> {
        let deadline = Instant::now() + FLUSH_BOUND;
        while self.state.pending.load(Ordering::Acquire) > 0 {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return Err(CudaError::Plan(
                    "the call launch thread ended with calls still queued".into(),
                ));
            }
            if Instant::now() > deadline {
                return Err(CudaError::Plan(format!(
                    "the call launch thread launched nothing for {} s (the device's launch queue stays full)",
                    FLUSH_BOUND.as_secs()
                )));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Calls handed over so far.
    #[cfg(test)]
    pub(super) fn handed_over(&self) -> u32 {
        self.n
    }

    /// The launch error found since the last call, if any.
    pub(super) fn take_failure(&self) -> Option<CudaError> {
        self.state
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.flush();
        self.state.stop.store(true, Ordering::Release);
        {
            let _q = self.state.queue.lock().unwrap_or_else(|p| p.into_inner());
            self.state.wake.notify_one();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The next call to launch, or `None` once stopped with nothing queued.
fn next(s: &LaunchState) -> Option<Item> {
    let spin_until = Instant::now() + SPIN;
    while s.pending.load(Ordering::Acquire) == 0
        && !s.stop.load(Ordering::Acquire)
        && Instant::now() < spin_until
    {
        std::hint::spin_loop();
    }
    let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(item) = q.items.pop_front() {
            return Some(item);
        }
        if s.stop.load(Ordering::Acquire) {
            return None;
        }
        q.asleep = true;
        q = s.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        q.asleep = false;
    }
}

fn launch_loop(
    s: &LaunchState,
    ctx: &Arc<CudaContext>,
    stream: u64,
    words: DevicePtr,
    started: std::sync::mpsc::Sender<Result<()>>,
) {
    let stream = stream as cudarc::driver::sys::CUstream;
    let bound = ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"));
    let ok = bound.is_ok();
    let _ = started.send(bound);
    if !ok {
        return;
    }
    while let Some(item) = next(s) {
        // SAFETY: the stream and the words live as long as the launcher,
        // which joins this thread first; the graph is held by the item (the
        // caller's table may have dropped it).
        let launched = unsafe {
            cu::stream_wait_value32_geq(stream, words.offset(ARRIVED), item.n)
                .and_then(|_| cu::graph_launch(item.graph.0.cu_graph_exec(), stream))
        };
        // Written whatever happened, so the caller's stream drains.
        // SAFETY: as above.
        let finished = unsafe { cu::stream_write_value32(stream, words.offset(FINISHED), item.n) };
        if let Err(e) = launched.and(finished) {
            let mut f = s.failed.lock().unwrap_or_else(|p| p.into_inner());
            f.get_or_insert(e);
        }
        drop(item);
        s.pending.fetch_sub(1, Ordering::AcqRel);
    }
}
