//! The problem: operators and their shapes ([`workload`]), the token
//! routing of the expert-parallel operators ([`routing`]), model presets
//! expanded into layer scenarios ([`models`]), and suite files ([`suite`]).

pub mod models;
pub mod routing;
pub mod suite;
pub mod workload;
