//! Measurement: what this machine's forwards cost and how drafts are accepted, apart from the
//! decoding loop that uses the answers.
//!
//! - [`profile`]: the cost curve T(n) of a model's forwards (timed, checked for a busy machine,
//!   re-checked against a cached curve).
//! - [`replay`]: a recorded run's shape sequence replayed as real forwards, beside what the
//!   measured times predict for it.
//! - [`shapes`]: the padded shapes' times, changed and replayed (whether padding pays here).
//! - [`serving_gate`]: a measurement in the background pauses while the process serves requests.
//! - [`offline`]: acceptance vectors and training data for the calibrated methods (`treespec
//!   calibrate`).
//! - `cpu_time`: this process's CPU time and the neighbours' load, for the busy-machine rule.

mod cpu_time;
pub mod offline;
pub mod profile;
pub mod replay;
pub mod serving_gate;
pub mod shapes;
