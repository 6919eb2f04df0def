//! ficco-core: the pure core of ficco, with no CUDA in it.
//!
//! Data flows workload → schedule → plan → executor (simulated here, or on
//! GPUs in `ficco-cuda`) → timeline → report.
//!
//! | module | role |
//! |---|---|
//! | [`workload`] | operators, problems, scenarios |
//! | [`schedule`] | the design space and canonical schedule names |
//! | [`plan`] | the plan IR: buffers, views, streams, tasks, dependencies |
//! | [`lower`] | schedule + problem → plan |
//! | [`validate`] | cycles, unordered reads, races |
//! | [`interp`] | exact CPU interpreter of plans on small integer matrices |
//! | [`timeline`] | the timeline type shared by simulator and GPU executor |
//! | [`models`] | model presets expanded into tensor-parallel layer scenarios |
//! | [`suite`] | suite TOML files → scenarios (+ skipped entries) |
//! | [`explore`] | the driver: scenario x schedules → predicted/measured report |
//! | [`report`] | result types, JSON, nccl-tests table, Chrome trace, SVG Gantt, suite summary |
//! | [`profile`] | hardware profiles (built in, or TOML files) |
//! | [`cost`] | the cost model: GEMM, NCCL, copy and reduce times |
//! | [`sim`] | the discrete-event simulator: plan + profile → timeline |
//! | [`select`] | schedule selection without measuring: model and rule selectors |
//! | [`tune`] | the autotuning cache of measured winners |
//! | [`evaluate`] | scoring selectors and the simulator against measured reports |

mod concurrent;
pub mod cost;
pub mod error;
pub mod evaluate;
pub mod explore;
pub mod interp;
pub mod lower;
pub mod measure;
pub mod models;
pub mod plan;
pub mod profile;
pub mod report;
pub mod schedule;
pub mod select;
pub mod sim;
pub mod suite;
pub mod timeline;
pub mod tune;
pub mod validate;
pub mod workload;

pub use error::{Error, Result};
