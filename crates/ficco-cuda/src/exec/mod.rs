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
//! | [`rank`] | [`Rank`]: one GPU's resources kept between plans (streams, buffer pool, GEMM handles, green splits) |
//! | [`check`] | host-side checks before anything is issued, view addresses, output comparison |
//! | [`issue`] | enqueues one task, one function per task kind |
//! | [`iter`] | one rank's iteration call by call (barrier, tasks with waits and signals, end), and its capture into a CUDA graph |
//! | [`op`] | the operator-call path: stream-ordered calls without reset or barriers, the parity carried between calls, the cache of call shapes |
//! | [`run`] | [`run_plan_with`]: communicators, a thread per rank (or one for a loopback), timing |
//! | [`watchdog`] | ends a hung run: names the stuck wait, releases every flag, aborts |
//! | [`reference`] | the loopback form of a sequential plan: collectives as copies and reduces |

pub(crate) mod check;
pub(crate) mod issue;
pub(crate) mod iter;
pub(crate) mod op;
#[cfg(test)]
mod op_model;
pub(crate) mod rank;
pub(crate) mod reference;
pub(crate) mod run;
pub(crate) mod watchdog;

#[cfg_attr(not(test), allow(unused_imports))]
pub use check::{compare, copy_d2d, poison};
pub use rank::Rank;
pub use reference::copy_reference;
pub use run::{open_comms, run_plan_with, RunOpts, RunSpec, DEFAULT_WATCHDOG_MS, GRAPHS_ENV};
pub use watchdog::HANG_EXIT_CODE;
