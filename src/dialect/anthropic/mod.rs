//! The Anthropic Messages dialect (`POST /v1/messages`): its requests, rewritten bodies, answers and errors.

pub mod assemble;
pub mod errors;
pub mod splice;

#[cfg(test)]
mod fixtures;
