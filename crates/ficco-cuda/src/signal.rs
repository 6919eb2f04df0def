//! The cross-rank synchronisation seam: signal flags in device memory.
//!
//! A task may depend on a task of another rank. That dependency is a 32-bit
//! flag in the *consumer's* device memory: after the producer task, the
//! producer's stream writes the iteration's epoch into the flag
//! (`cuStreamWriteValue32`, default flags: a system-scope release fence comes
//! first, so the consumer sees the producer's data once it sees the flag),
//! and the consumer's stream waits until the flag is >= that epoch
//! (`cuStreamWaitValue32`, `GEQ`). The waiter polls local memory; only the
//! write crosses NVLink. No host thread ever waits for another rank: host
//! threads only issue work.
//!
//! **Layout.** Each (producer point, consumer rank) pair has its own word
//! ([`SignalLayout`]): a point is a task, or the end of a rank's iteration
//! (the inter-iteration barrier: every rank's streams wait for every rank's
//! end of the previous iteration, so pushes into a peer's buffers cannot
//! overrun). Same-rank dependencies between streams stay CUDA events.
//!
//! **Epochs.** The epoch of iteration `i` of a run is `i` (1, 2, ...). Flags
//! only grow during a run, so nothing is ever reset under a waiter: a flag >=
//! e means the point of iteration e (or, later, of e+1) is done, and by stream
//! order e+1 done implies e done. A producer cannot get two iterations ahead of
//! a consumer (the barrier). Flags are zeroed at the start of each run while
//! nothing runs on any rank.
//!
//! **Memory.** Each rank keeps one peer-accessible plain `cuMemAlloc` buffer
//! of flags (grown when a plan needs more words). Plain `cuMemAlloc` with peer
//! access enabled is enough while one process drives every GPU (and in
//! loopback, where every rank is on one device); VMM (`cuMemCreate` +
//! POSIX-fd export, `cuMemMap`, `cuMemSetAccess`) is the follow-up for one
//! process per rank, where the flags must be exported. Never NVLink
//! multicast.
//!
//! **Progress.** Each rank's control stream also writes its finished
//! iteration into a word of pinned, mapped host memory ([`HostWords`]); the
//! watchdog in [`crate::exec::run_plan`] reads it without any CUDA call.

use crate::driver::cuda as cu;
use crate::error::Result;
use crate::mem::DevicePtr;
use ficco_core::plan::Plan;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

/// A point of a rank's iteration: task `index` done, or, for
/// `index == tasks.len()`, the end of the rank's iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Point {
    pub rank: usize,
    pub index: usize,
}

/// Where every flag of a plan lives: one word per (producer point, consumer
/// rank), in the consumer rank's flag buffer.
#[derive(Debug, Clone, Default)]
pub struct SignalLayout {
    /// (producer point, consumer rank) -> word index in the consumer's buffer.
    slots: HashMap<(Point, usize), usize>,
    /// Words used per rank.
    pub words: Vec<usize>,
    /// Per rank per point (tasks + end): the consumers to signal, as
    /// (consumer rank, word index).
    pub signals: Vec<Vec<Vec<(usize, usize)>>>,
}

impl SignalLayout {
    /// The flags of `plan`: one per cross-rank dependency's (producer,
    /// consumer rank) and one per (rank end, other rank) for the barrier.
    pub fn new(plan: &Plan) -> Self {
        let p = plan.ranks.len();
        let mut l = SignalLayout {
            slots: HashMap::new(),
            words: vec![0; p],
            signals: plan
                .ranks
                .iter()
                .map(|rp| vec![vec![]; rp.tasks.len() + 1])
                .collect(),
        };
        for (r, rp) in plan.ranks.iter().enumerate() {
            for t in &rp.tasks {
                for d in t.deps.iter().filter(|d| d.rank != r && d.rank < p) {
                    l.add(
                        Point {
                            rank: d.rank,
                            index: d.index,
                        },
                        r,
                    );
                }
            }
        }
        for q in 0..p {
            for r in (0..p).filter(|&r| r != q) {
                l.add(
                    Point {
                        rank: q,
                        index: plan.ranks[q].tasks.len(),
                    },
                    r,
                );
            }
        }
        l
    }

    fn add(&mut self, producer: Point, consumer: usize) {
        if self.slots.contains_key(&(producer, consumer)) {
            return;
        }
        let w = self.words[consumer];
        self.words[consumer] += 1;
        self.slots.insert((producer, consumer), w);
        if let Some(v) = self
            .signals
            .get_mut(producer.rank)
            .and_then(|s| s.get_mut(producer.index))
        {
            v.push((consumer, w));
        }
    }

    /// The word `consumer` waits on for `producer`.
    pub fn slot(&self, producer: Point, consumer: usize) -> Option<usize> {
        self.slots.get(&(producer, consumer)).copied()
    }
}

/// The address of word `w` of a flag buffer at `base`.
pub fn word(base: DevicePtr, w: usize) -> DevicePtr {
    base.offset(w * 4)
}

/// Pinned host words, mapped into every context (`n` u32, zeroed).
pub struct HostWords {
    host: *mut std::ffi::c_void,
    dev: DevicePtr,
    n: usize,
}

// SAFETY: the memory is plain pinned host memory, read through atomics only.
unsafe impl Send for HostWords {}
// SAFETY: as above.
unsafe impl Sync for HostWords {}

impl HostWords {
    /// Allocates `n` words (a context must be current).
    pub fn new(n: usize) -> Result<Self> {
        let (host, dev) = cu::mem_host_alloc_mapped(n.max(1) * 4)?;
        let w = HostWords { host, dev, n };
        for i in 0..n {
            w.at(i).store(0, Ordering::Relaxed);
        }
        Ok(w)
    }

    fn at(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.n);
        // SAFETY: in bounds of a live, 4-byte aligned allocation.
        unsafe { &*(self.host as *const AtomicU32).add(i) }
    }

    /// The value of word `i` as the device last wrote it.
    pub fn get(&self, i: usize) -> u32 {
        self.at(i).load(Ordering::Acquire)
    }

    /// The device address of word `i`.
    pub fn device(&self, i: usize) -> DevicePtr {
        word(self.dev, i)
    }
}

impl Drop for HostWords {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; the run synchronized every rank first.
        unsafe { cu::mem_free_host(self.host) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ficco_core::plan::lower::lower;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::{enumerate, SpaceOptions};

    /// Every cross-rank dependency has its own word on the consumer, and
    /// every rank's end signals every other rank.
    #[test]
    fn every_cross_rank_dependency_has_one_word() {
        for gpus in [2, 4] {
            for op in Op::ALL {
                let problem = Problem::new(op, 512, 256, 384, gpus).expect("problem");
                for s in enumerate(op, SpaceOptions::default()) {
                    let Ok(plan) = lower(&problem, &s) else {
                        continue;
                    };
                    let l = SignalLayout::new(&plan);
                    let mut seen = std::collections::HashSet::new();
                    for (r, rp) in plan.ranks.iter().enumerate() {
                        for t in &rp.tasks {
                            for d in t.deps.iter().filter(|d| d.rank != r) {
                                let p = Point {
                                    rank: d.rank,
                                    index: d.index,
                                };
                                let w = l.slot(p, r).expect("slot");
                                assert!(w < l.words[r]);
                                assert!(l.signals[d.rank][d.index].contains(&(r, w)));
                                seen.insert((r, w));
                            }
                        }
                        let ends: usize = (0..gpus)
                            .filter(|&q| q != r)
                            .filter(|&q| {
                                l.slot(
                                    Point {
                                        rank: q,
                                        index: plan.ranks[q].tasks.len(),
                                    },
                                    r,
                                )
                                .is_some()
                            })
                            .count();
                        assert_eq!(ends, gpus - 1);
                    }
                    let total: usize = l.words.iter().sum();
                    assert_eq!(total, seen.len() + gpus * (gpus - 1), "{}", plan.name);
                }
            }
        }
    }
}
