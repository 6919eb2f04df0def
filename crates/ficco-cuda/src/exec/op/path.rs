//! Which path an operator call takes (fast or full), from the facts of
//! the call and of its plan; the job-wide epoch of full calls.

/// Whether `FICCO_OP_SYNC=1` asks for the full path on every call (reset,
/// barriers, host synchronize), as before the fast path existed.
pub fn sync_from_env() -> bool {
    ficco_core::settings::Settings::current().op_sync
}

/// Which path a call takes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Reset every flag, barriers, host synchronize. `quiet`: fast calls
    /// preceded it, so first wait for this rank's device and pass a barrier.
    Full { quiet: bool },
    /// Stream-ordered, as the iteration of `parity`.
    Fast { parity: usize },
}

/// What a call's path depends on besides the [`Epoch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallFacts {
    /// `FICCO_OP_SYNC=1` (agreed by every rank).
    pub sync: bool,
    /// The plan needs a larger shared arena or more flag words than the
    /// job holds.
    pub grows: bool,
    /// The call shape's state is cached (it ran before, full).
    pub cached: bool,
    /// The plan can run fast ([`fast_capable`]).
    pub capable: bool,
}

/// The flag state carried from one call to the next, alike on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Epoch {
    /// The parity of the next iteration while every flag is in its
    /// between-iterations state; `None` before the first full run and after
    /// any failure (the flags are then unknown: reset them).
    pub(super) parity: Option<usize>,
    /// Fast calls were issued since the last barrier after which every
    /// rank's device was idle.
    pub(super) fast_since_quiet: bool,
}

impl Epoch {
    /// The path of a call with `facts`.
    pub fn path(&self, facts: CallFacts) -> Path {
        match self.parity {
            Some(parity) if !facts.sync && !facts.grows && facts.cached && facts.capable => {
                Path::Fast { parity }
            }
            _ => Path::Full {
                quiet: self.fast_since_quiet,
            },
        }
    }

    /// After a full run of `iterations` iterations (from parity 0, every
    /// rank's device idle at its final barrier).
    pub fn after_full(&mut self, iterations: usize) {
        self.parity = Some(iterations % 2);
        self.fast_since_quiet = false;
    }

    /// After a fast call was issued: it left the banks as it found them
    /// ([`super::Step::SignalDone`]), so the parity stays.
    pub fn after_fast(&mut self) {
        self.fast_since_quiet = true;
    }

    /// After this rank's device went idle and every rank passed a barrier.
    pub fn quiet(&mut self) {
        self.fast_since_quiet = false;
    }

    /// After a failure: the flags are unknown until the next full run.
    pub fn failed(&mut self) {
        self.parity = None;
    }

    /// Whether the flags' state is known (a full run came after the last
    /// failure).
    pub fn known(&self) -> bool {
        self.parity.is_some()
    }

    /// Whether fast calls may still be in flight on some rank.
    pub fn needs_quiet(&self) -> bool {
        self.fast_since_quiet
    }
}
