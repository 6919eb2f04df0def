//! Where an operator call's host time goes: the call path marks the end of
//! each of its phases ([`lap`]), and [`take`] reports the mean time and the
//! count of each phase since the last report (`bench/host_breakdown.py`
//! prints it beside the Python side's pieces; `examples/train_tp.py
//! --host-breakdown` per training step). A mark costs one monotonic clock
//! read and an uncontended lock, so the clock is always on.
//!
//! A call's start and its last mark are per thread, the totals per process:
//! autograd runs the backward's calls on its own thread, and a report from
//! the main thread must count them.

use std::cell::Cell;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A phase of an operator call on the host, in call order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// From a binding's entry ([`enter`]) to the session's call: argument
    /// conversion and checks, the GIL's release, the session lock.
    Entry,
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
    /// A call issued step by step, with its events.
    Issue,
    /// A call captured into a graph, and the graph's first launch.
    Capture,
    /// A call on the full path (synchronizing; see [`super::Path`]).
    Full,
    /// From the call's last phase back to the binding's return
    /// ([`leave`]): the result, the GIL again.
    Return,
}

const PHASES: [Phase; 11] = [
    Phase::Entry,
    Phase::Plan,
    Phase::Operands,
    Phase::Path,
    Phase::Bind,
    Phase::Setup,
    Phase::Launch,
    Phase::Issue,
    Phase::Capture,
    Phase::Full,
    Phase::Return,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Entry => "entry",
            Phase::Plan => "plan",
            Phase::Operands => "operands",
            Phase::Path => "path",
            Phase::Bind => "bind",
            Phase::Setup => "setup",
            Phase::Launch => "launch",
            Phase::Issue => "issue",
            Phase::Capture => "capture",
            Phase::Full => "full",
            Phase::Return => "return",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Totals {
    total: [Duration; PHASES.len()],
    count: [u64; PHASES.len()],
}

impl Totals {
    const ZERO: Totals = Totals {
        total: [Duration::ZERO; PHASES.len()],
        count: [0; PHASES.len()],
    };

    fn add(&mut self, phase: Phase, d: Duration) {
        let i = phase as usize;
        self.total[i] += d;
        self.count[i] += 1;
    }

    /// Each phase with a count: its name, mean microseconds and count;
    /// then every total is zero again.
    fn take(&mut self) -> Vec<(&'static str, f64, u64)> {
        let out = PHASES
            .iter()
            .filter(|&&p| self.count[p as usize] > 0)
            .map(|&p| {
                let i = p as usize;
                let us = self.total[i].as_secs_f64() * 1e6 / self.count[i] as f64;
                (p.name(), us, self.count[i])
            })
            .collect();
        *self = Totals::ZERO;
        out
    }
}

static TOTALS: Mutex<Totals> = Mutex::new(Totals::ZERO);

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    /// A binding entered a call ([`enter`]) and has not left it.
    static ENTERED: Cell<bool> = const { Cell::new(false) };
}

/// Starts a call's clock (on this thread).
pub fn start() {
    LAST.with(|l| l.set(Some(Instant::now())));
}

/// A binding (the Python extension) received a call: its clock starts
/// here, and the session's `begin` ends the `entry` phase (re-exported as
/// `session::clock_enter`, so plain names: the links would be private).
pub fn enter() {
    ENTERED.with(|e| e.set(true));
    start();
}

/// The session's call begins: the end of [`Phase::Entry`] where a binding
/// entered, else the start of the call's clock.
pub fn begin() {
    if ENTERED.with(Cell::get) {
        lap(Phase::Entry);
    } else {
        start();
    }
}

/// The binding returns: the end of the `return` phase (nothing where no
/// `enter` preceded).
pub fn leave() {
    if ENTERED.with(|e| e.replace(false)) {
        lap(Phase::Return);
    }
}

/// Ends `phase`: the time since this thread's call started or its last
/// phase ended.
pub fn lap(phase: Phase) {
    let now = Instant::now();
    let Some(t) = LAST.with(|l| l.replace(Some(now))) else {
        return;
    };
    TOTALS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .add(phase, now - t);
}

/// Each phase that ran in this process since the last report: its name,
/// mean microseconds and count; the totals start again.
pub fn take() -> Vec<(&'static str, f64, u64)> {
    TOTALS.lock().unwrap_or_else(|p| p.into_inner()).take()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_report_each_phase_once_with_its_mean_then_reset() {
        let mut t = Totals::ZERO;
        for ms in [2, 4, 6] {
            t.add(Phase::Plan, Duration::from_millis(ms));
            t.add(Phase::Full, Duration::from_micros(10));
        }
        let got = t.take();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((got[0].0, got[0].2), ("plan", 3));
        assert!((got[0].1 - 4000.0).abs() < 1e-6, "{got:?}");
        assert_eq!((got[1].0, got[1].2), ("full", 3));
        assert_eq!(t, Totals::ZERO);
        assert!(t.take().is_empty());
    }

    /// The tests that report the process's totals, one at a time (a
    /// report resets them).
    static GLOBAL: Mutex<()> = Mutex::new(());

    /// A binding's entry and return are phases of their own; a call
    /// without a binding starts at the session. (Other tests of this
    /// process may lap too: counts are at least; another thread keeps this
    /// one's thread-locals apart.)
    #[test]
    fn a_bindings_entry_and_return_are_phases() {
        let _one = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::spawn(|| {
            enter();
            std::thread::sleep(Duration::from_millis(2));
            begin();
            lap(Phase::Plan);
            leave();
            // Without a binding: begin starts, leave adds nothing.
            begin();
            lap(Phase::Plan);
            leave();
        })
        .join()
        .unwrap();
        let got = take();
        let of = |name: &str| got.iter().find(|p| p.0 == name).copied();
        assert!(
            of("entry").is_some_and(|e| e.2 >= 1 && e.1 >= 2000.0),
            "{got:?}"
        );
        assert!(of("plan").is_some_and(|p| p.2 >= 2), "{got:?}");
        assert!(of("return").is_some_and(|r| r.2 >= 1), "{got:?}");
        let entry = got.iter().position(|p| p.0 == "entry");
        let ret = got.iter().position(|p| p.0 == "return");
        assert!(entry < ret, "phases in call order: {got:?}");
    }

    /// The backward's calls run on autograd's thread; the report comes
    /// from another. (Other tests of this process may lap too: counts are
    /// at least.)
    #[test]
    fn laps_of_another_thread_reach_this_threads_report() {
        let _one = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::spawn(|| {
            start();
            std::thread::sleep(Duration::from_millis(1));
            lap(Phase::Capture);
        })
        .join()
        .unwrap();
        let got = take();
        let cap = got.iter().find(|p| p.0 == "capture").copied();
        assert!(cap.is_some_and(|c| c.2 >= 1 && c.1 >= 1000.0), "{got:?}");
    }
}
