//! The explorer: it runs randomized schedules of calls, faults, purges and record losses against
//! the runtime, records what every call and every store command did and when (a history), and
//! checks each history against the guarantees of `docs/guarantees.md` (I1 to I7, see
//! [`check`]). Schedules are generated and shrunk by proptest, so a violation comes out as the
//! smallest schedule that shows it, with the seed that reproduces it.
//!
//! Top to bottom:
//! - [`schedule`]: what a schedule holds, and the proptest strategy that makes one from a seed;
//! - [`run`]: plays a schedule on tokio's paused clock, one runtime per simulated process;
//! - [`faults`]: the store wrapper each process talks through: one connection with delays,
//!   lost replies, refusals and split commands, and a pub/sub connection of its own;
//! - [`model`]: a model of the Redis store's record semantics (server clock, a plain acquire's
//!   three commands, owner-checked scripts), beside the memory store;
//! - [`recorded`]: the store a process of the real-server layer talks through (a real store,
//!   its commands recorded; faults come from outside);
//! - [`history`]: the events a run records;
//! - [`check`]: the invariants, read off a history.

pub mod check;
pub mod faults;
pub mod history;
pub mod model;
pub mod recorded;
pub mod run;
pub mod schedule;
