//! Anthropic Messages in recall rounds: ctxgate's calls are `tool_use` blocks answered by a user message of
//! `tool_result` blocks; the client's stream is spliced by [`StreamSplicer`] and kept alive with `ping` events.

use super::splice::{self, RoundEnd, StreamSplicer};
use crate::dialect::rounds::{Splice, SpliceEnd};
use crate::dialect::{AssembledReply, InjectedNames};
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::{json, Value};

/// The Anthropic splicer behind the dialect-neutral [`Splice`].
pub struct AnthropicSplice {
    inner: StreamSplicer,
}

impl AnthropicSplice {
    /// A splicer hiding the tools named in `names`.
    pub fn new(names: InjectedNames) -> Self {
        Self {
            inner: StreamSplicer::new(names),
        }
    }
}

impl Splice for AnthropicSplice {
    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes> {
        self.inner.on_event(ev)
    }

    fn end_round(&mut self, rounds_left: bool) -> SpliceEnd {
        match self.inner.end_round(rounds_left) {
            RoundEnd::Continue {
                assistant, calls, ..
            } => SpliceEnd::Continue {
                assistant,
                calls: calls.iter().map(neutral_call).collect(),
            },
            RoundEnd::Finish(tail) => SpliceEnd::Finish(tail),
        }
    }

    fn abort(&mut self) -> Vec<Bytes> {
        self.inner.abort()
    }

    fn reply(&self) -> AssembledReply {
        self.inner.reply()
    }

    fn done(&self) -> Option<Bytes> {
        None
    }

    fn keepalive(&self) -> Option<Bytes> {
        Some(StreamSplicer::ping())
    }
}

/// A `tool_use` block as a neutral tool call.
fn neutral_call(block: &Value) -> Value {
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    json!({"id": block.get("id").cloned().unwrap_or(Value::Null), "type": "function",
           "function": {"name": block.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": input.to_string()}})
}

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
        .map(neutral_call)
        .collect()
}

/// The assistant turn that led to ctxgate's calls and the user message answering them.
pub fn round_messages(
    assistant: &Value,
    names: &InjectedNames,
    calls: &[Value],
    results: &[String],
) -> Vec<Value> {
    let answers: Vec<(String, String)> = calls
        .iter()
        .zip(results)
        .map(|(c, r)| {
            let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
            (id.to_string(), r.clone())
        })
        .collect();
    let (a, u) = splice::round_messages(assistant, names, &answers);
    vec![a, u]
}

/// Adds a round's usage.
pub fn add_usage(acc: &mut Option<Value>, usage: &Value) {
    splice::add_usage(acc, usage);
}

/// The client's answer: ctxgate's `tool_use` blocks removed, usage summed, the first round's id.
pub fn finalize(
    mut answer: Value,
    names: &InjectedNames,
    usage: Option<Value>,
    first_id: Option<Value>,
) -> Value {
    splice::strip_injected(&mut answer, names);
    if let Some(o) = answer.as_object_mut() {
        if let Some(id) = first_id {
            o.insert("id".into(), id);
        }
        if let Some(u) = usage {
            o.insert("usage".into(), u);
        }
    }
    answer
}
