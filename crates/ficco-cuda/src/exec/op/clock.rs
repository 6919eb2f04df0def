//! Where an operator call's host time goes: the call path marks the end of
//! each of its phases ([`lap`]), and [`take`] reports the mean time of each
//! phase since the last report (`bench/host_breakdown.py` prints it beside
//! the Python side's pieces). A mark costs one monotonic clock read, so
//! the clock is always on.

use std::cell::RefCell;
use std::time::{Duration, Instant};

/// A phase of an operator call on the host, in call order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The session's plan lookup (problem check, plan cache).
    Plan,
    /// The operands as the plan sees them (shared-memory agreement).
    Operands,
    /// The backend's checks: the copy form, an earlier hang, the path.
    Path,
    /// The operands bound into the plan's buffers.
    Bind,
    /// The fast call's set-up: context, watch, graph lookup.
    Setup,
    /// Driver calls of a replayed graph (the wait, the launch, the event).
    Launch,
    /// A call issued step by step (or captured), with its events.
    Issue,
}

const PHASES: [Phase; 7] = [
    Phase::Plan,
    Phase::Operands,
    Phase::Path,
    Phase::Bind,
    Phase::Setup,
    Phase::Launch,
    Phase::Issue,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Operands => "operands",
            Phase::Path => "path",
            Phase::Bind => "bind",
            Phase::Setup => "setup",
            Phase::Launch => "launch",
            Phase::Issue => "issue",
        }
    }
}

#[derive(Default)]
struct Clock {
    last: Option<Instant>,
    total: [Duration; PHASES.len()],
    count: [u64; PHASES.len()],
}

thread_local! {
    static CLOCK: RefCell<Clock> = RefCell::new(Clock::default());
}

/// Starts a call's clock.
pub fn start() {
    CLOCK.with(|c| c.borrow_mut().last = Some(Instant::now()));
}

/// Ends `phase`: the time since the call started or its last phase ended.
pub fn lap(phase: Phase) {
    let now = Instant::now();
    CLOCK.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(t) = c.last.replace(now) {
            let i = phase as usize;
            c.total[i] += now - t;
            c.count[i] += 1;
        }
    });
}

/// Each phase that ran on this thread since the last report: its name,
/// mean microseconds and count; the clock starts again.
pub fn take() -> Vec<(&'static str, f64, u64)> {
    CLOCK.with(|c| {
        let mut c = c.borrow_mut();
        let out = PHASES
            .iter()
            .filter(|&&p| c.count[p as usize] > 0)
            .map(|&p| {
                let i = p as usize;
                let us = c.total[i].as_secs_f64() * 1e6 / c.count[i] as f64;
                (p.name(), us, c.count[i])
            })
            .collect();
        *c = Clock::default();
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_are_reported_once_per_phase_then_reset() {
        take();
        for _ in 0..3 {
            start();
            std::thread::sleep(Duration::from_millis(2));
            lap(Phase::Plan);
            lap(Phase::Launch);
        }
        let got = take();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((got[0].0, got[0].2), ("plan", 3));
        assert!(got[0].1 >= 2000.0, "{got:?}");
        assert_eq!((got[1].0, got[1].2), ("launch", 3));
        assert!(got[1].1 < got[0].1, "{got:?}");
        assert!(take().is_empty());
    }

    #[test]
    fn a_lap_without_a_start_counts_nothing() {
        take();
        lap(Phase::Bind);
        assert!(take().is_empty());
    }
}
