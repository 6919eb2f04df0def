//! The cross-rank synchronisation seam: signal flags in device memory.
//!
//! A task may depend on a task of another rank. That dependency is a 32-bit
//! flag in the *consumer's* device memory: after the producer task, the
//! producer's stream writes 1 into the flag (`cuStreamWriteValue32`, default
//! flags: a system-scope release fence comes first, so the consumer sees the
//! producer's data once it sees the flag), and the consumer's stream waits
//! until the flag is >= 1 (`cuStreamWaitValue32`, `GEQ`). The waiter polls
//! local memory; only the write crosses NVLink. No host thread ever waits for
//! another rank: host threads only issue work.
//!
//! **Layout.** Every rank's buffer starts with its two barrier banks, at
//! fixed words whatever the plan ([`SignalLayout::bank`]): every rank's end
//! of iteration signals every other rank (so pushes into a peer's buffers
//! cannot overrun), bank `b` for iterations of parity `b`, word `q` of a
//! bank for rank `q`. Because every plan's layout agrees on them, the
//! iteration parity can be carried from one run to the next, also of
//! another plan ([`crate::exec::op`]). Two more banks of one word per rank
//! follow, only for operator calls' hand-offs ([`SignalLayout::ready_slot`],
//! [`SignalLayout::landed_slot`]). After these [`FIXED_BANKS`] banks, each
//! (producer task, consumer rank) pair has its own word, then come the
//! plan's own
//! flags ([`ficco_core::plan::TaskKind::Signal`] / `Wait` tasks and tile
//! GEMM block flags, numbered per rank from 0:
//! [`SignalLayout::plan_word`]); these two groups are the rank's *task
//! words*, [`SignalLayout::task_range`].
//!
//! A tile GEMM's block counters are plan flags too: the kernel's signal
//! hook adds [`crate::hgemm::signal_advance`] to a block's word per launch,
//! from the cleared 0, and a Wait on that word waits for exactly that value
//! ([`SignalLayout::plan_target`]; [`SET`] for every other flag); its wait
//! hook waits for `>= SET` (epoch = SET) on words that Signal tasks set. So
//! plan flags follow the same constant-value protocol as dependency words.
//!
//! **Constant values, consumer resets.** The values written and waited for
//! are constants (1), not epochs, because a CUDA graph bakes them in: one
//! captured iteration must be replayable. A consumer clears its own flags
//! when nobody can touch them:
//! * task words at the end of its iteration, after its streams joined (every
//!   wait of the iteration passed, so every producer's write landed), before
//!   it signals its end; a producer writes again only in the next iteration,
//!   which it starts after seeing that end signal;
//! * barrier words of bank `b` at the start of an iteration of parity `1-b`,
//!   right after waiting on them; the peer writes bank `b` again only at the
//!   end of its next iteration but one, which needs this rank's next end.
//!
//! Two banks are needed because a peer may finish the iteration after the
//! one waited for before this rank cleared the bank (it only needs this
//! rank's end of the one before). So a rank has two captured graphs, one per
//! parity. Bank 1 starts at 1 (as if an iteration -1 had ended), so every
//! iteration, the first included, waits the same way.
//!
//! **Memory.** When one process drives every GPU, each rank keeps one
//! peer-accessible plain `cuMemAlloc` buffer of flags (grown when a plan
//! needs more words); that is enough there, and in loopback, where every
//! rank is on one device. With one process per rank the flags are VMM
//! memory (`cuMemCreate` + POSIX-fd export, mapped by the node's other
//! ranks: [`crate::runtime::job`]). Never NVLink multicast.
//!
//! **Progress.** Each rank's control stream also writes its finished
//! iteration count into a word of pinned, mapped host memory
//! ([`HostWords`]), outside any graph; the watchdog reads it without any
//! CUDA call.

use crate::driver::cuda as cu;
use crate::error::Result;
use crate::mem::DevicePtr;
use ficco_core::plan::{Plan, TaskKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

/// The value a producer writes and a consumer waits for.
pub const SET: u32 = 1;

/// Banks of one word per rank at the start of every rank's flag memory,
/// whatever the plan: the two end-of-iteration banks (by parity), then the
/// operator calls' *ready* bank (a rank's operands are in place for this
/// call) and *landed* bank (a rank's writes into a peer's output are done).
pub const FIXED_BANKS: usize = 4;

/// A task of a rank's iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Point {
    pub rank: usize,
    pub index: usize,
}

/// Where every flag of a plan lives, in the consumer rank's flag buffer.
#[derive(Debug, Clone, Default)]
pub struct SignalLayout {
    /// (producer task, consumer rank) -> word index in the consumer's buffer.
    slots: HashMap<(Point, usize), usize>,
    /// Task words per rank: dependency words, then the plan's own flags
    /// (they follow the barrier banks, see [`SignalLayout::task_range`]).
    pub task_words: Vec<usize>,
    /// Per rank: the word of the plan's flag 0 (flag f is `plan_base + f`).
    plan_base: Vec<usize>,
    /// Per rank: the plan's own flags ([`Plan::signal_words`]).
    plan_words: Vec<usize>,
    /// Per rank: the value waited for on flags other than [`SET`].
    targets: Vec<HashMap<usize, u32>>,
    /// Words used per rank: [`FIXED_BANKS`] banks of `ranks` words, then the
    /// task words.
    pub words: Vec<usize>,
    /// Per rank per task: the consumers to signal, as (consumer rank, word).
    pub signals: Vec<Vec<Vec<(usize, usize)>>>,
    ranks: usize,
}

impl SignalLayout {
    /// The flags of `plan`: the fixed banks of every rank, then one
    /// per cross-rank dependency's (producer, consumer rank), then the
    /// plan's own flags.
    pub fn new(plan: &Plan) -> Self {
        let p = plan.ranks.len();
        let mut l = SignalLayout {
            slots: HashMap::new(),
            task_words: vec![0; p],
            plan_base: vec![0; p],
            plan_words: vec![0; p],
            targets: counted_flags(plan),
            words: vec![0; p],
            signals: plan
                .ranks
                .iter()
                .map(|rp| vec![vec![]; rp.tasks.len()])
                .collect(),
            ranks: p,
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
        let own = plan.signal_words();
        for r in 0..p {
            l.plan_base[r] = l.task_words[r];
            l.plan_words[r] = own.get(r).copied().unwrap_or(0);
            l.task_words[r] += l.plan_words[r];
            l.words[r] = FIXED_BANKS * p + l.task_words[r];
        }
        l
    }

    fn add(&mut self, producer: Point, consumer: usize) {
        if self.slots.contains_key(&(producer, consumer)) {
            return;
        }
        let w = FIXED_BANKS * self.ranks + self.task_words[consumer];
        self.task_words[consumer] += 1;
        self.slots.insert((producer, consumer), w);
        if let Some(v) = self
            .signals
            .get_mut(producer.rank)
            .and_then(|s| s.get_mut(producer.index))
        {
            v.push((consumer, w));
        }
    }

    /// The value a wait on the plan's flag `flag` of `rank` waits for: a
    /// tile GEMM block counter's advance per launch, else [`SET`].
    pub fn plan_target(&self, rank: usize, flag: usize) -> u32 {
        self.targets
            .get(rank)
            .and_then(|t| t.get(&flag))
            .copied()
            .unwrap_or(SET)
    }

    /// The word `consumer` waits on for `producer`.
    pub fn slot(&self, producer: Point, consumer: usize) -> Option<usize> {
        self.slots.get(&(producer, consumer)).copied()
    }

    /// The word of the plan's flag `flag` of `rank` (a Signal, Wait or tile
    /// GEMM block flag), if the plan has that flag.
    pub fn plan_word(&self, rank: usize, flag: usize) -> Option<usize> {
        (flag < *self.plan_words.get(rank)?)
            .then(|| FIXED_BANKS * self.ranks + self.plan_base[rank] + flag)
    }

    /// The word of `consumer`'s barrier bank `bank` that `producer`'s end
    /// of iteration sets.
    /// (The same word for every plan of `ranks` ranks.)
    pub fn end_slot(&self, producer: usize, _consumer: usize, bank: usize) -> usize {
        (bank % 2) * self.ranks + producer
    }

    /// First word and length of every rank's barrier bank `bank` (the same
    /// words for every plan of `ranks` ranks).
    pub fn bank(&self, _rank: usize, bank: usize) -> (usize, usize) {
        ((bank % 2) * self.ranks, self.ranks)
    }

    /// The word of a consumer's *ready* bank that `producer` sets once its
    /// operands of an operator call are in place (the same word for every
    /// plan of `ranks` ranks; [`crate::exec::op`]).
    pub fn ready_slot(&self, producer: usize) -> usize {
        2 * self.ranks + producer
    }

    /// The word of a consumer's *landed* bank that `producer` sets once
    /// its writes into the consumer's output of an operator call are done.
    pub fn landed_slot(&self, producer: usize) -> usize {
        3 * self.ranks + producer
    }

    /// First word and length of `rank`'s task words (dependency words and
    /// the plan's own flags), which follow the fixed banks.
    pub fn task_range(&self, rank: usize) -> (usize, usize) {
        (
            FIXED_BANKS * self.ranks,
            self.task_words.get(rank).copied().unwrap_or(0),
        )
    }
}

/// Per rank, the plan's flags that tile GEMMs' signal hooks count into,
/// with each one's advance per launch ([`crate::hgemm::signal_advance`];
/// [`SET`] for a block the kernel would refuse, which the executor's tile
/// check rejects before any launch).
pub fn counted_flags(plan: &Plan) -> Vec<HashMap<usize, u32>> {
    plan.ranks
        .iter()
        .map(|rp| {
            let mut t = HashMap::new();
            for task in &rp.tasks {
                if let TaskKind::TileGemm(g) = &task.kind {
                    if let Some(f0) = g.signal {
                        for b in 0..g.blocks() {
                            let v =
                                crate::hgemm::signal_advance(g.a.rows, g.b.cols, g.block_rows, b);
                            t.insert(f0 + b, v.unwrap_or(SET));
                        }
                    }
                }
            }
            t
        })
        .collect()
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

    /// A Wait on a tile GEMM's block counter waits for that block's advance
    /// per launch; on any flag a Signal task sets, for [`SET`].
    #[test]
    fn tile_gemm_counters_are_waited_at_their_advance() {
        let mut counted = 0;
        for op in Op::ALL {
            let problem = Problem::new(op, 1536, 256, 520, 4).expect("problem");
            for s in enumerate(op, SpaceOptions::default()) {
                let Ok(plan) = lower(&problem, &s) else {
                    continue;
                };
                let l = SignalLayout::new(&plan);
                for (r, rp) in plan.ranks.iter().enumerate() {
                    for t in &rp.tasks {
                        match &t.kind {
                            TaskKind::TileGemm(g) => {
                                for b in 0..g.signal.map_or(0, |_| g.blocks()) {
                                    let f = g.signal.unwrap_or(0) + b;
                                    let want = crate::hgemm::signal_advance(
                                        g.a.rows,
                                        g.b.cols,
                                        g.block_rows,
                                        b,
                                    );
                                    assert_eq!(Some(l.plan_target(r, f)), want, "{}", plan.name);
                                    counted += 1;
                                }
                            }
                            TaskKind::Signal { to_rank, flag } => {
                                assert_eq!(l.plan_target(*to_rank, *flag), SET, "{}", plan.name);
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        assert!(counted > 0, "no tile GEMM with a signal hook in the space");
    }

    /// Every cross-rank dependency and every plan flag (tile schedules) has
    /// its own task word on its rank, and every other rank's end has a word
    /// in each barrier bank.
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
                                let (first, n) = l.task_range(r);
                                assert!(w >= first && w < first + n && w < l.words[r]);
                                assert!(l.signals[d.rank][d.index].contains(&(r, w)));
                                seen.insert((r, w));
                            }
                        }
                        for q in (0..gpus).filter(|&q| q != r) {
                            let fixed = (0..2)
                                .map(|bank| l.end_slot(q, r, bank))
                                .chain([l.ready_slot(q), l.landed_slot(q)]);
                            for (bank, w) in fixed.enumerate() {
                                // Before the task words, at a word fixed by
                                // (producer, bank) alone: every plan agrees.
                                assert!(w < l.task_range(r).0);
                                assert_eq!(w, bank * gpus + q);
                                assert!(seen.insert((r, w)), "barrier word reused");
                            }
                        }
                    }
                    // The plan's own flags: one task word each, distinct.
                    for (r, &n) in plan.signal_words().iter().enumerate() {
                        for f in 0..n {
                            let w = l.plan_word(r, f).expect("plan word");
                            let (first, n) = l.task_range(r);
                            assert!(w >= first && w < first + n);
                            assert!(seen.insert((r, w)), "plan word reused");
                        }
                        assert_eq!(l.plan_word(r, n), None);
                    }
                    let total: usize = l.words.iter().sum();
                    assert_eq!(total, seen.len() + FIXED_BANKS * gpus, "{}", plan.name);
                }
            }
        }
    }
}
