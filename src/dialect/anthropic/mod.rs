//! The Anthropic Messages dialect (`POST /v1/messages`): its requests, rewritten bodies, answers and errors.

pub mod from_chat;
