//! Recall rounds in Anthropic Messages: finding ctxgate's own `tool_use` blocks in an answer, the messages that
//! answer them in the next round, hiding them from the client's JSON answer, and summing usage over rounds. The
//! streaming side (one client stream out of several rounds) is [`StreamSplicer`].

mod stream;

pub use crate::dialect::shared::{RoundEnd, StreamSplice};
pub use stream::StreamSplicer;

use crate::dialect::reply::add_numbers;
use crate::dialect::reply::with_round_totals;
use crate::dialect::InjectedNames;
use serde_json::{json, Value};

/// True when `block` is a `tool_use` block calling one of ctxgate's tools.
pub fn is_injected_call(block: &Value, names: &InjectedNames) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_use")
        && block
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| names.is_injected(n))
}

fn blocks(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The `tool_use` blocks of a native assistant message (`{"role","content":[...]}`) that call ctxgate's tools.
pub fn injected_calls(message: &Value, names: &InjectedNames) -> Vec<Value> {
    blocks(message)
        .iter()
        .filter(|b| is_injected_call(b, names))
        .cloned()
        .collect()
}

/// A `tool_use` block as a chat-completions tool call (`{id, type, function:{name, arguments}}`), the shape the
/// recall answerer reads.
pub fn as_chat_call(block: &Value) -> Value {
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    json!({"id": block.get("id").cloned().unwrap_or(Value::Null), "type": "function",
           "function": {"name": block.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": input.to_string()}})
}

/// The assistant message a round appends to the next request: the answer's blocks up to and including its last
/// call of ours, without the client's `tool_use` blocks (the model asks for them again once it has our answer).
/// Thinking and every other block are kept as they came, signatures included.
pub fn round_assistant(message: &Value, names: &InjectedNames) -> Value {
    let all = blocks(message);
    let end = all
        .iter()
        .rposition(|b| is_injected_call(b, names))
        .map_or(0, |p| p + 1);
    let kept: Vec<Value> = all[..end]
        .iter()
        .filter(|b| {
            b.get("type").and_then(Value::as_str) != Some("tool_use") || is_injected_call(b, names)
        })
        .cloned()
        .collect();
    json!({"role": "assistant", "content": kept})
}

/// The user message answering calls: one `tool_result` per `(tool_use_id, content)`, in order.
pub fn results_message(results: &[(String, String)]) -> Value {
    let content: Vec<Value> = results
        .iter()
        .map(|(id, text)| json!({"type": "tool_result", "tool_use_id": id, "content": text}))
        .collect();
    json!({"role": "user", "content": content})
}

/// The two messages a round appends to the next request: [`round_assistant`] and [`results_message`].
pub fn round_messages(
    message: &Value,
    names: &InjectedNames,
    results: &[(String, String)],
) -> (Value, Value) {
    (round_assistant(message, names), results_message(results))
}

/// Removes ctxgate's `tool_use` blocks from a whole Messages answer body; returns how many. When that leaves no
/// `tool_use` and the answer stopped for `tool_use`, it becomes `end_turn`.
pub fn strip_injected(body: &mut Value, names: &InjectedNames) -> usize {
    let Some(Value::Array(content)) = body.get_mut("content") else {
        return 0;
    };
    let before = content.len();
    content.retain(|b| !is_injected_call(b, names));
    let removed = before - content.len();
    let tool_use_left = content
        .iter()
        .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"));
    if removed > 0
        && !tool_use_left
        && body.get("stop_reason").and_then(Value::as_str) == Some("tool_use")
    {
        body["stop_reason"] = json!("end_turn");
    }
    removed
}

/// The prompt-side usage fields: what a round's request held. A later round's request holds the earlier rounds
/// whole, so the client is told the last round's figures (Claude Code sizes its context, and decides when to
/// compact, from them); summing them would report a context several times its real size.
const PROMPT_FIELDS: [&str; 4] = [
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "cache_creation",
];

/// Adds a later round's usage `u` into `acc`: the prompt-side fields ([`PROMPT_FIELDS`]) are the later round's,
/// every other number is summed (nested ones such as `server_tool_use` too); a field `acc` lacks, or holds as
/// `null`, is taken from `u`; other values keep their first form.
pub fn add_usage(acc: &mut Option<Value>, u: &Value) {
    match acc {
        None => *acc = Some(u.clone()),
        Some(a) => {
            if let (Value::Object(a), Value::Object(b)) = (&mut *a, u) {
                for k in PROMPT_FIELDS {
                    if let Some(v) = b.get(k).filter(|v| !v.is_null()) {
                        a.insert(k.to_string(), v.clone());
                    }
                }
                let rest: serde_json::Map<String, Value> = b
                    .iter()
                    .filter(|(k, _)| !PROMPT_FIELDS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let mut acc = Value::Object(std::mem::take(a));
                add_numbers(&mut acc, &Value::Object(rest));
                if let Value::Object(summed) = acc {
                    *a = summed;
                }
                return;
            }
            add_numbers(a, u)
        }
    }
}

/// The client's JSON answer after recall rounds: the last round's body without our calls, the usage summed over
/// the rounds (`usage`, when given) and the first round's `id`.
pub fn finalize_body(
    mut body: Value,
    names: &InjectedNames,
    usage: Option<Value>,
    first_id: Option<Value>,
) -> Value {
    strip_injected(&mut body, names);
    with_round_totals(body, usage, first_id)
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
