//! An executor: Spark's `CoarseGrainedExecutorBackend`. It subscribes its inbox, registers with
//! the driver (retrying while no driver answers), then runs what arrives in the inbox and reports
//! each attempt's status in batches until it is told to stop.

mod abandoned;
mod backend;
mod command;
pub mod gang_ports;
mod launched;
pub mod machine;
mod memory;
mod python;
mod python_worker;
mod result_objects;
mod runner;
mod staging;
mod status;
pub mod tasks;
mod upstream;

pub use backend::{default_data_dir, run, ExecutorConfig, ExecutorError};
pub use gang_ports::{GangPortsConfig, GangSeat};
pub use python::{default_interpreter, PythonConfig, DEFAULT_INTERPRETER};
pub use status::encode_status_batch;
pub use tasks::{Handlers, StopToken, TaskContext, TaskResult};

/// Exit code of an executor whose registration the driver refused (a duplicate id, say).
pub const EXIT_REGISTRATION_REFUSED: i32 = 1;
