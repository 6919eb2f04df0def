//! The executor: one host thread per GPU this process drives (one thread for
//! every rank in loopback); with one process per GPU, each process drives
//! its rank and reaches the others' through shared memory
//! ([`run::JobRun`]).
//!
//! Per rank: a context (cudarc event tracking off), streams created with the
//! plan's priorities, an event per task, a control stream that starts and ends
//! each iteration. Cross-rank dependencies are signal flags written and waited
//! on by the streams ([`crate::signal`]); same-rank cross-stream ones are
//! events. Iterations are replayed from CUDA graphs where capture works. Between iterations every rank's streams wait for every rank's end
//! of the previous iteration, so pushes into a peer's buffers cannot overrun.
//! The calling thread is a watchdog that ends a hung run.
//!
//! | module | role |
//! |---|---|
//! | [`progress`] | where a run is: each thread's issuing position, optional per-task progress words, the `FICCO_TRACE` phases |
//! | [`shared`] | how to run ([`RunSpec`], [`RunOpts`]), what the issuing threads and the watchdog share ([`shared::Shared`]), facts derived from a plan once per run |
//! | [`addr`] | view addresses on bound memory, bounds-checked |
//! | [`gemm_args`] | plan GEMM tasks to launch arguments of ficco's own kernels (plain, grouped, tile with hooks) |
//! | [`tables`] | a tile GEMM's destination table (`-acc`) as bytes, built for one binding of the plan's buffers |
//! | [`rank`] | [`Rank`]: one GPU's resources kept between plans (streams, buffer pool, GEMM handles, green splits) |
//! | [`check`] | host-side checks before anything is issued, output poisoning and comparison |
//! | [`issue`] | enqueues one task, one function per task kind |
//! | [`iter`] | one rank's iteration call by call (barrier, tasks with waits and signals, end), and its capture into a CUDA graph |
//! | [`watchdog`] | ends a hung run: names the stuck wait and where every rank is, releases every flag, aborts |
//! | [`run`] | [`run_plan_with`]: communicators, a thread per rank (or one for a loopback), timing |
//! | [`op`] | the operator-call path: stream-ordered calls without reset or barriers, the parity carried between calls, the cache of call shapes |
//! | [`reference`] | the loopback form of a sequential plan: collectives as copies and reduces |
//!
//! Files point one way, in the order of this table: each uses only files
//! above it (`reference` none); `.ci/structure.py` checks that no two form
//! a circle.

pub(crate) mod addr;
pub(crate) mod check;
pub(crate) mod gemm_args;
pub(crate) mod issue;
pub(crate) mod iter;
pub(crate) mod op;
pub(crate) mod progress;
pub(crate) mod rank;
pub(crate) mod reference;
pub(crate) mod run;
pub(crate) mod shared;
pub(crate) mod tables;
pub(crate) mod watchdog;

#[cfg_attr(not(test), allow(unused_imports))]
pub use check::{compare, copy_d2d, poison};
pub use rank::Rank;
pub use reference::copy_reference;
pub use run::{open_comms, run_plan_with};
pub use shared::{RunOpts, RunSpec, DEFAULT_WATCHDOG_MS, GRAPHS_ENV};
pub use watchdog::HANG_EXIT_CODE;
