//! Anthropic Messages in recall rounds: ctxgate's calls are `tool_use` blocks answered by a user message of
//! `tool_result` blocks; the client's stream is spliced by [`splice::StreamSplicer`] and kept alive with `ping` events.

use super::splice;
use crate::dialect::shared::splice::answers;
use crate::dialect::InjectedNames;
use serde_json::Value;

/// A whole JSON answer is the assistant message itself.
pub fn answer_message(answer: &Value) -> Option<Value> {
    (answer.get("type").and_then(Value::as_str) == Some("message")
        && answer.get("content").is_some_and(Value::is_array))
    .then(|| answer.clone())
}

/// ctxgate's `tool_use` blocks of `message`, as neutral calls.
pub fn injected_calls(message: &Value, names: &InjectedNames) -> Vec<Value> {
    splice::injected_calls(message, names)
        .iter()
        .map(splice::as_chat_call)
        .collect()
}

/// The assistant turn that led to ctxgate's calls and the user message answering them.
pub fn round_messages(
    assistant: &Value,
    names: &InjectedNames,
    calls: &[Value],
    results: &[String],
) -> Vec<Value> {
    let (a, u) = splice::round_messages(assistant, names, &answers(calls, results));
    vec![a, u]
}

/// Adds a round's usage.
pub fn add_usage(acc: &mut Option<Value>, usage: &Value) {
    splice::add_usage(acc, usage);
}

/// The client's answer: ctxgate's `tool_use` blocks removed, usage summed, the first round's id.
pub use splice::finalize_body as finalize;
