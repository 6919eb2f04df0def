//! ficco-core: the pure core of ficco, with no CUDA in it.
//!
//! The folders follow the data path, and each one only uses the ones above it:
//!
//! ```text
//! problem   what to run: operators, shapes, model presets, suite files
//!   ↓
//! space     the design space: schedules and their canonical names
//!   ↓
//! plan      a schedule of a problem lowered to the plan IR; one validator,
//!           one dependency graph, an exact CPU interpreter
//!   ↓
//! run       the seam that runs plans: the Backend trait and the Timeline
//!   ↓       both backends produce
//! sim       the simulator backend: cost model, hardware profiles, the event
//!           simulator, calibration from measurements
//!   ↓
//! choose    explore (every schedule through a backend), selection (rules,
//!           model), the tuning cache and its algorithm, evaluation
//!   ↓
//! report    the result data model and its exporters: table, summary, JSON,
//!           Chrome trace, SVG, ablation
//! ```
//!
//! `stats` (median), `suggest` (did you mean), `error` and `settings` (every
//! `FICCO_*` environment variable, parsed in one place) serve every stage.
//!
//! The GPU backend (`ficco-cuda`) is the other implementation of
//! [`run::Backend`]; it executes the same plans and returns the same
//! [`run::timeline::Timeline`].

pub mod choose;
pub mod error;
pub mod plan;
pub mod problem;
pub mod report;
pub mod run;
pub mod settings;
pub mod sim;
pub mod space;
pub mod stats;
pub mod suggest;

pub use error::{Error, Result};
