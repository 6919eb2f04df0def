//! The cross-rank synchronisation seam.
//!
//! A task may depend on a task of another rank. On the device that is an event
//! recorded by the producer's stream and waited on by the consumer's stream.
//! `cuStreamWaitEvent` on an event that was not yet recorded is a no-op, so the
//! consumer's host thread must first wait until the producer's host thread has
//! recorded the event *in this iteration*: every recorded point carries a
//! generation (the iteration number).
//!
//! A point's event is re-recorded every iteration, and a rank may finish
//! issuing iteration i+1 before a slower rank has issued its wait for the
//! end of iteration i (the inter-iteration barrier). Waiting then would
//! capture the newer record and deadlock. So every point has two events,
//! used by iteration parity: a rank cannot get two iterations ahead, because
//! iteration i+2 starts only after every rank has recorded the end of i+1,
//! which it does after issuing all its waits of iteration i+1.
//!
//! [`CrossRankSync`] is the one seam for this. [`InProcessSync`] implements it
//! for one process driving every GPU (events shared between threads, one
//! atomic generation per point that waiters spin on: a condition variable's
//! wake-up costs tens of µs per cross-rank dependency, which made launching a
//! fine-grained plan slower than running it). A later backend with one
//! process per rank implements it with IPC event handles and signal flags.

use crate::error::{drv, CudaError, Result};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A point of a rank's iteration: task `index` done, or, for
/// `index == tasks.len()`, the end of the rank's iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Point {
    pub rank: usize,
    pub index: usize,
}

/// Cross-rank ordering between the streams of different ranks.
pub trait CrossRankSync: Send + Sync {
    /// Records `point` on `stream` (its producer rank's stream) for iteration
    /// `iter` and publishes it to waiters.
    fn record(&self, point: Point, stream: &CudaStream, iter: u64) -> Result<()>;
    /// Makes `stream` wait (on the device) for `point` of iteration `iter`,
    /// first blocking the host until that point was recorded.
    fn wait(&self, stream: &CudaStream, point: Point, iter: u64) -> Result<()>;
    /// Wakes every waiter with an error (a rank failed).
    fn abort(&self);
}

/// Events shared between the host threads of one process.
pub struct InProcessSync {
    /// events[rank][point][iteration parity]
    events: Vec<Vec<[CudaEvent; 2]>>,
    /// Generation last recorded, per rank per point; 0 = never. Published
    /// with release ordering after the event record, read with acquire.
    gens: Vec<Vec<AtomicU64>>,
    aborted: AtomicBool,
}

/// Spins before yielding the core: waits are short (another thread is
/// issuing the producer right now) and every rank has its own core.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

impl InProcessSync {
    /// One event per point: `points[r]` points on rank `r` (tasks + 1 for the end).
    pub fn new(ctxs: &[Arc<CudaContext>], points: &[usize]) -> Result<Self> {
        let mut events = Vec::with_capacity(ctxs.len());
        for (ctx, &n) in ctxs.iter().zip(points) {
            let mut ev = Vec::with_capacity(n);
            for _ in 0..n {
                ev.push([
                    ctx.new_event(None).map_err(drv("cuEventCreate"))?,
                    ctx.new_event(None).map_err(drv("cuEventCreate"))?,
                ]);
            }
            events.push(ev);
        }
        Ok(InProcessSync {
            events,
            gens: points
                .iter()
                .map(|&n| (0..n).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            aborted: AtomicBool::new(false),
        })
    }

    fn event(&self, p: Point, iter: u64) -> Result<&CudaEvent> {
        self.events
            .get(p.rank)
            .and_then(|e| e.get(p.index))
            .map(|pair| &pair[(iter % 2) as usize])
            .ok_or_else(|| CudaError::Plan(format!("dependency on unknown task {p:?}")))
    }

    fn gen(&self, p: Point) -> Result<&AtomicU64> {
        self.gens
            .get(p.rank)
            .and_then(|g| g.get(p.index))
            .ok_or_else(|| CudaError::Plan(format!("dependency on unknown task {p:?}")))
    }
}

impl CrossRankSync for InProcessSync {
    fn record(&self, point: Point, stream: &CudaStream, iter: u64) -> Result<()> {
        self.event(point, iter)?
            .record(stream)
            .map_err(drv("cuEventRecord"))?;
        self.gen(point)?.store(iter, Ordering::Release);
        Ok(())
    }

    fn wait(&self, stream: &CudaStream, point: Point, iter: u64) -> Result<()> {
        let ev = self.event(point, iter)?;
        let gen = self.gen(point)?;
        let mut spins = 0u32;
        while gen.load(Ordering::Acquire) < iter {
            if self.aborted.load(Ordering::Acquire) {
                return Err(CudaError::Plan("another rank failed".into()));
            }
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        stream.wait(ev).map_err(drv("cuStreamWaitEvent"))
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
    }
}
