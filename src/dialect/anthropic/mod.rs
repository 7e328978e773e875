//! The Anthropic Messages dialect (`POST /v1/messages`): its requests, rewritten bodies, answers and errors.

pub mod convert;
mod rebuild;
pub mod request;
pub mod validate;

#[cfg(test)]
mod tests;
