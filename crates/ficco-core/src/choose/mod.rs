//! Choosing a schedule: [`explore`] runs every schedule of a scenario through
//! a backend, [`select`] picks one without running anything (the rules and the
//! model selector), [`tune`] measures the top candidates and caches the
//! winner, [`call`] decides what `auto` runs for an operator call in a
//! model, and [`evaluate`] scores the selectors and the simulator against
//! measurements.

pub mod autotune;
pub mod call;
pub mod evaluate;
pub mod explore;
pub mod select;
pub mod tune;
