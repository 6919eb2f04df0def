//! The problem: operators and their shapes ([`workload`]), model presets
//! expanded into tensor-parallel layer scenarios ([`models`]), and suite
//! files ([`suite`]).

pub mod models;
pub mod suite;
pub mod workload;
