//! The context engine: counts tokens and, when a request outgrows its budget, plans the rewrite of what goes
//! upstream (tool-result clearing, run-loop pruning, the hard limit). **Pure: no I/O, no network, no store.**

pub mod body;
pub mod bpe;
mod cost;
pub mod decide;
pub mod digest;
pub mod fold;
pub mod long_context;
pub mod models;
pub mod plan;
mod pretokenize;
pub mod roles;
pub mod runloop;
pub mod shape;
mod stages;
pub mod task;
pub mod tokens;
pub mod units;
pub mod usage;

pub use body::{splice_messages, RewrittenBody};
pub use plan::{plan, CompressionRecord, Plan, PlanInput, PrunedCall, Rewrite};

#[cfg(test)]
mod tests;
