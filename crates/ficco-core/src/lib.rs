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

pub mod error;
pub mod interp;
pub mod lower;
pub mod measure;
pub mod plan;
pub mod schedule;
pub mod timeline;
pub mod validate;
pub mod workload;

pub use error::{Error, Result};
