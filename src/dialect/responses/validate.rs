//! What the Responses API requires of an input, and what a rewrite of a client's body must keep: the checks the
//! property tests run on every rewritten request (and that a caller may run before sending one).

use super::convert::{call_id, kind, Kind};
use crate::dialect::shared::{check_fields, conversation};
use serde_json::Value;
use std::collections::HashSet;

/// Checks an input as the Responses API does: every `function_call_output` / `custom_tool_call_output` answers a
/// call earlier in the input (of the matching kind); a `function_call`'s `arguments` and a `custom_tool_call`'s
/// `input` strings; every `reasoning` item is followed by the item it produced
/// (not the end of the input, not an output item); call ids unique;
/// a `compaction_trigger` only as the last item.
pub fn check_sequence(items: &[Value]) -> Result<(), String> {
    let mut calls: HashSet<(&str, &str)> = HashSet::new();
    for (i, it) in items.iter().enumerate() {
        let t = it.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind(it) {
            Kind::Call if call_id(it).is_empty() || !calls.insert((t, call_id(it))) => {
                return Err(format!(
                    "input[{i}]: call id {:?} is empty or not unique",
                    call_id(it)
                ));
            }
            Kind::Call if !arguments_are_text(it) => {
                return Err(format!("input[{i}]: the {t}'s arguments are not a string"));
            }
            Kind::Output => {
                let call = t.trim_end_matches("_output");
                if !calls.contains(&(call, call_id(it))) {
                    return Err(format!(
                        "input[{i}]: no {call} found for {t} with call_id {:?}",
                        call_id(it)
                    ));
                }
            }
            Kind::Reasoning => {
                let next = items.get(i + 1).map(kind);
                if matches!(next, None | Some(Kind::Output)) {
                    return Err(format!(
                        "input[{i}]: reasoning item provided without its required following item"
                    ));
                }
            }
            _ if t == "compaction_trigger" && i + 1 != items.len() => {
                return Err(format!(
                    "input[{i}]: compaction_trigger must be the last item"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a call item carries its arguments as a string (`arguments` of a function call, `input` of a custom
/// tool call).
fn arguments_are_text(it: &Value) -> bool {
    let key = match it.get("type").and_then(Value::as_str) {
        Some("custom_tool_call") => "input",
        _ => "arguments",
    };
    it.get(key).is_some_and(Value::is_string)
}

/// Checks that `sent`, the body sent upstream, keeps what must not change of `client`, the client's body: every
/// top-level field but `input` and `tools` identical and in the same order (`instructions`, `include`,
/// `prompt_cache_key`, `store`, `reasoning`, `text`, `context_management` among them); the client's `tools` an
/// identical prefix of the sent ones; every reasoning, compaction or other opaque item sent byte-identical to one
/// of the client's, in the client's order; `phase` kept on every assistant message sent that comes from a client
/// message carrying it; the client's newest item sent last, unchanged.
pub fn check_rewrite(client: &Value, sent: &Value) -> Result<(), String> {
    let (Some(c), Some(s)) = (client.as_object(), sent.as_object()) else {
        return Err("both bodies must be JSON objects".into());
    };
    check_fields(c, s, "input")?;
    let (ci, si) = (conversation(c, "input"), conversation(s, "input"));
    let carried = |it: &&Value| matches!(kind(it), Kind::Reasoning | Kind::Opaque);
    let mut rest = ci.iter().filter(carried);
    for (i, it) in si.iter().enumerate().filter(|(_, it)| carried(it)) {
        if !rest.any(|x| x == it) {
            return Err(format!(
                "input[{i}]: an opaque item that is not the client's, changed or out of order"
            ));
        }
    }
    let phased = ci
        .iter()
        .any(|m| kind(m) == Kind::Assistant && m.get("phase").is_some());
    if phased {
        if let Some(i) = si
            .iter()
            .position(|m| kind(m) == Kind::Assistant && m.get("phase").is_none() && !ctxgates(m))
        {
            return Err(format!("input[{i}]: an assistant message lost its `phase`"));
        }
    }
    if ci.last() != si.last() {
        return Err("the client's newest item is not the last item sent".into());
    }
    Ok(())
}

/// Whether a message item is one ctxgate wrote (strict role order: the summary, a gap's message), which has no
/// `phase` of the client's to keep.
fn ctxgates(m: &Value) -> bool {
    let text = item_text(m);
    text.starts_with("[ctxgate]") || text.starts_with(crate::message::SUMMARY_PREFIX)
}

/// The text of a message item: its string content or its text parts joined by newlines.
fn item_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Checks the role rule on a rewritten input (`sent`) against the client's (`client`), as `context::roles` does for
/// chat: no `system`/`developer` message item after the first other item that the client did not send there, no
/// two user or two assistant message items in a row that the client did not send in a row. Calls and their
/// outputs count as items of their own kind; reasoning, compaction and other opaque items are not messages and are
/// passed over.
pub fn check_roles(client: &[Value], sent: &[Value]) -> Result<(), String> {
    let as_messages = |items: &[Value]| -> Vec<Value> {
        items
            .iter()
            .filter_map(|it| {
                let role = match kind(it) {
                    Kind::System => "system",
                    Kind::User => "user",
                    Kind::Assistant => "assistant",
                    Kind::Call => "call",
                    Kind::Output => "output",
                    _ => return None,
                };
                let text = match kind(it) {
                    Kind::Call | Kind::Output => call_id(it).to_string(),
                    _ => item_text(it),
                };
                Some(serde_json::json!({"role": role, "content": text}))
            })
            .collect()
    };
    crate::context::roles::check_roles(&as_messages(client), &as_messages(sent))
}
