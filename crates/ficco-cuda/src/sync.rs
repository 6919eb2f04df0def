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
//! for one process driving every GPU (events shared between threads, a
//! condition variable for generations). A later backend with one process per
//! rank implements it with IPC event handles and signal flags.

use crate::error::{drv, CudaError, Result};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::sync::{Arc, Condvar, Mutex};

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

struct State {
    /// Generation last recorded, per rank per point; 0 = never.
    gens: Vec<Vec<u64>>,
    aborted: bool,
}

/// Events shared between the host threads of one process.
pub struct InProcessSync {
    /// events[rank][point][iteration parity]
    events: Vec<Vec<[CudaEvent; 2]>>,
    state: Mutex<State>,
    cv: Condvar,
}

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
            state: Mutex::new(State {
                gens: points.iter().map(|&n| vec![0; n]).collect(),
                aborted: false,
            }),
            cv: Condvar::new(),
        })
    }

    fn event(&self, p: Point, iter: u64) -> Result<&CudaEvent> {
        self.events
            .get(p.rank)
            .and_then(|e| e.get(p.index))
            .map(|pair| &pair[(iter % 2) as usize])
            .ok_or_else(|| CudaError::Plan(format!("dependency on unknown task {p:?}")))
    }
}

fn poisoned<T>(_: T) -> CudaError {
    CudaError::Plan("synchronisation state poisoned by a failed rank".into())
}

impl CrossRankSync for InProcessSync {
    fn record(&self, point: Point, stream: &CudaStream, iter: u64) -> Result<()> {
        self.event(point, iter)?
            .record(stream)
            .map_err(drv("cuEventRecord"))?;
        let mut st = self.state.lock().map_err(poisoned)?;
        st.gens[point.rank][point.index] = iter;
        drop(st);
        self.cv.notify_all();
        Ok(())
    }

    fn wait(&self, stream: &CudaStream, point: Point, iter: u64) -> Result<()> {
        let ev = self.event(point, iter)?;
        let mut st = self.state.lock().map_err(poisoned)?;
        while st.gens[point.rank][point.index] < iter {
            if st.aborted {
                return Err(CudaError::Plan("another rank failed".into()));
            }
            st = self.cv.wait(st).map_err(poisoned)?;
        }
        drop(st);
        stream.wait(ev).map_err(drv("cuStreamWaitEvent"))
    }

    fn abort(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.aborted = true;
        }
        self.cv.notify_all();
    }
}
