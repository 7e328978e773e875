//! The Anthropic Messages dialect (`POST /v1/messages`): its requests, rewritten bodies, answers and errors.

pub mod assemble;

#[cfg(test)]
mod fixtures;
