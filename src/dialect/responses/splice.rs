//! Recall rounds in the Responses API: finding ctxgate's own `function_call` items in an answer's output, the
//! items that carry them into the next request's `input`, hiding them (with the reasoning that led only to them)
//! from the client's JSON answer, and summing usage over rounds. The streaming side is [`StreamSplicer`].
//!
//! A reasoning item and the items that follow it up to the next reasoning item are one unit: the reasoning is
//! shown when one of those items is, hidden when all of them are ctxgate's calls.

mod stream;

pub use crate::dialect::shared::{RoundEnd, StreamSplice};
pub use stream::StreamSplicer;

use crate::dialect::reply::add_numbers;
use crate::dialect::reply::with_round_totals;
use crate::dialect::InjectedNames;
use serde_json::{json, Value};

/// Item types that call a tool the client runs (it answers them with an `*_output` item or an approval).
const CLIENT_CALLS: [&str; 7] = [
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
    "computer_call",
    "mcp_approval_request",
];

fn kind(item: &Value) -> &str {
    item.get("type").and_then(Value::as_str).unwrap_or("")
}

/// True for a `reasoning` item.
pub fn is_reasoning(item: &Value) -> bool {
    kind(item) == "reasoning"
}

/// True when `item` is a `function_call` of one of ctxgate's tools.
pub fn is_injected_call(item: &Value, names: &InjectedNames) -> bool {
    kind(item) == "function_call"
        && item
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| names.is_injected(n))
}

/// True when `item` calls a tool of the client's.
pub fn is_client_call(item: &Value, names: &InjectedNames) -> bool {
    CLIENT_CALLS.contains(&kind(item)) && !is_injected_call(item, names)
}

/// A `function_call` item as a neutral tool call `{id: call_id, type, function: {name, arguments}}`.
pub fn neutral_call(item: &Value) -> Value {
    json!({"id": item.get("call_id").cloned().unwrap_or(Value::Null), "type": "function",
           "function": {"name": item.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": item.get("arguments").cloned().unwrap_or_else(|| json!(""))}})
}

/// ctxgate's calls among `items` (an answer's output), as neutral tool calls, in order.
pub fn injected_calls(items: &[Value], names: &InjectedNames) -> Vec<Value> {
    items
        .iter()
        .filter(|i| is_injected_call(i, names))
        .map(neutral_call)
        .collect()
}

/// Which of `items` survive when `drop` items are removed: a reasoning item goes with them when every item of
/// its unit (up to the next reasoning item) is dropped and it has at least one.
fn keep(items: &[Value], drop: impl Fn(&Value) -> bool) -> Vec<bool> {
    let mut keep: Vec<bool> = items.iter().map(|i| !drop(i)).collect();
    let mut i = 0;
    while i < items.len() {
        if !is_reasoning(&items[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < items.len() && is_reasoning(&items[i]) {
            i += 1;
        }
        let end = items[i..]
            .iter()
            .position(is_reasoning)
            .map_or(items.len(), |p| i + p);
        if end > i && keep[i..end].iter().all(|k| !k) {
            keep[start..i].iter_mut().for_each(|k| *k = false);
        }
        i = end;
    }
    keep
}

/// The items a round appends to the next request's `input`: the answer's output up to and including its last
/// call of ours, without the client's calls (the model asks for them again once it has our answers) nor the
/// reasoning that led only to them, then one `function_call_output` per `(call_id, output)`. Every item is
/// carried as it came (reasoning with its `encrypted_content`).
pub fn round_items(
    output: &[Value],
    names: &InjectedNames,
    results: &[(String, String)],
) -> Vec<Value> {
    let end = output
        .iter()
        .rposition(|i| is_injected_call(i, names))
        .map_or(0, |p| p + 1);
    let head = &output[..end];
    let mut items: Vec<Value> = keep(head, |i| is_client_call(i, names))
        .into_iter()
        .zip(head)
        .filter(|(k, _)| *k)
        .map(|(_, i)| i.clone())
        .collect();
    items.extend(
        results
            .iter()
            .map(|(id, out)| json!({"type": "function_call_output", "call_id": id, "output": out})),
    );
    items
}

/// The items the client is shown of `output`: ctxgate's calls removed, and the reasoning that led only to them.
pub fn visible_items(output: &[Value], names: &InjectedNames) -> Vec<Value> {
    keep(output, |i| is_injected_call(i, names))
        .into_iter()
        .zip(output)
        .filter(|(k, _)| *k)
        .map(|(_, i)| i.clone())
        .collect()
}

/// Removes ctxgate's tools from the `tools` a `response` object echoes; true when there were any.
pub fn hide_tools(response: &mut Value, names: &InjectedNames) -> bool {
    let Some(Value::Array(tools)) = response.get_mut("tools") else {
        return false;
    };
    let before = tools.len();
    tools.retain(|t| {
        !(kind(t) == "function"
            && t.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| names.is_injected(n)))
    });
    tools.len() != before
}

/// Removes ctxgate's calls (and the reasoning that led only to them) from a whole Responses answer body, and its
/// tools from the echoed `tools`; returns how many calls. `status` stays: an answer that called tools is `completed` with or without them.
pub fn strip_injected(body: &mut Value, names: &InjectedNames) -> usize {
    hide_tools(body, names);
    let Some(Value::Array(output)) = body.get_mut("output") else {
        return 0;
    };
    let calls = output.iter().filter(|i| is_injected_call(i, names)).count();
    if calls > 0 {
        *output = visible_items(output, names);
    }
    calls
}

/// The prompt-side usage fields: what a round's request held. A later round's request holds the earlier rounds
/// whole, so the client is told the last round's figures (Codex sizes its context, and decides when to compact,
/// from them); summing them would report a context several times its real size.
const PROMPT_FIELDS: [&str; 2] = ["input_tokens", "input_tokens_details"];

/// Adds a later round's usage `u` into `acc`: the prompt side ([`PROMPT_FIELDS`]) is the later round's, every
/// other number is summed (`output_tokens_details` too) and `total_tokens` is their sum again.
pub fn add_usage(acc: &mut Option<Value>, u: &Value) {
    let Some(Value::Object(a)) = acc.as_mut() else {
        *acc = Some(u.clone());
        return;
    };
    let Value::Object(b) = u else {
        return;
    };
    for k in PROMPT_FIELDS {
        if let Some(v) = b.get(k).filter(|v| !v.is_null()) {
            a.insert(k.to_string(), v.clone());
        }
    }
    let rest: serde_json::Map<String, Value> = b
        .iter()
        .filter(|(k, _)| !PROMPT_FIELDS.contains(&k.as_str()) && k.as_str() != "total_tokens")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut summed = Value::Object(std::mem::take(a));
    add_numbers(&mut summed, &Value::Object(rest));
    if let Value::Object(s) = summed {
        *a = s;
    }
    let n = |k: &str| a.get(k).and_then(Value::as_u64);
    if let (Some(i), Some(o), true) = (
        n("input_tokens"),
        n("output_tokens"),
        a.contains_key("total_tokens"),
    ) {
        a.insert("total_tokens".into(), json!(i + o));
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
