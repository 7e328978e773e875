//! Rebuilding the items of one neutral message the context engine changed: every item keeps its fields and their
//! order; only what the rewrite touched changes (an output's `output`, a message's text parts, a call's `arguments`
//! or custom tool `input` when the engine cleared them). Reasoning,
//! compaction and unknown items are carried byte-exact, and a reasoning item goes with the item it precedes.

use super::convert::{call_id, kind, Kind};
use crate::message::tool_calls;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::HashSet;

/// A message ctxgate added as a message item with one text part: a user or assistant one (strict role order: the
/// summary, a gap's message) in its role, anything else (neutral `system`) as a `developer` item; `None` when it
/// has no text.
pub fn added(m: &Value) -> Option<Value> {
    let text = neutral_text(m.get("content"));
    let (role, part) = match m.get("role").and_then(Value::as_str) {
        Some("assistant") => ("assistant", "output_text"),
        Some("user") => ("user", "input_text"),
        _ => ("developer", "input_text"),
    };
    (!text.is_empty())
        .then(|| json!({"type":"message","role":role,"content":[{"type":part,"text":text}]}))
}

/// The text of neutral content: a string, or its text parts joined by newlines (null: empty).
fn neutral_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            texts.join("\n")
        }
        _ => String::new(),
    }
}

/// The items of one neutral message (`items`, converted as `orig`) after the engine rewrote it as `new`.
pub fn rebuild<'a>(items: &'a [Value], orig: Option<&Value>, new: &Value) -> Vec<Cow<'a, Value>> {
    let text_changed = orig.is_none_or(|o| o.get("content") != new.get("content"));
    let text = neutral_text(new.get("content"));
    match new.get("role").and_then(Value::as_str) {
        Some("tool") => {
            let id = new
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            let mut done = false;
            items
                .iter()
                .map(|it| {
                    if !done && kind(it) == Kind::Output && call_id(it) == id {
                        done = true;
                        Cow::Owned(with_field(it, "output", Value::String(text.clone())))
                    } else {
                        Cow::Borrowed(it)
                    }
                })
                .collect()
        }
        Some("assistant") => assistant(items, orig, new, text_changed.then_some(text)),
        _ => items
            .iter()
            .filter_map(|it| match kind(it) {
                Kind::User | Kind::System if text_changed => with_text(it, &text).map(Cow::Owned),
                _ => Some(Cow::Borrowed(it)),
            })
            .collect(),
    }
}

/// An assistant group: calls kept while their neutral call is (calls the neutral form never listed are carried),
/// the first assistant message given the new text (the others left out) when it changed, a reasoning item kept
/// with the item it precedes; nothing when only reasoning would be left.
fn assistant<'a>(
    items: &'a [Value],
    orig: Option<&Value>,
    new: &Value,
    text: Option<String>,
) -> Vec<Cow<'a, Value>> {
    let ids = |m: &Value| -> HashSet<String> {
        tool_calls(m)
            .iter()
            .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_owned))
            .collect()
    };
    let (kept, listed) = (ids(new), orig.map(ids).unwrap_or_default());
    let changed = changed_arguments(orig, new);
    let mut first_message = true;
    let mut out: Vec<Option<Cow<'a, Value>>> = items
        .iter()
        .map(|it| match kind(it) {
            Kind::Call if listed.contains(call_id(it)) && !kept.contains(call_id(it)) => None,
            Kind::Call => Some(match changed.iter().find(|(id, _)| *id == call_id(it)) {
                Some((_, args)) => Cow::Owned(with_arguments(it, args)),
                None => Cow::Borrowed(it),
            }),
            Kind::Assistant => match &text {
                None => Some(Cow::Borrowed(it)),
                Some(t) if std::mem::take(&mut first_message) => with_text(it, t).map(Cow::Owned),
                Some(_) => None,
            },
            _ => Some(Cow::Borrowed(it)),
        })
        .collect();
    // A reasoning item goes with the next non-reasoning item of the group (with the rest when none follows).
    let mut next_kept = None;
    for x in (0..items.len()).rev() {
        if kind(&items[x]) == Kind::Reasoning {
            let keep = next_kept
                .unwrap_or_else(|| out.iter().flatten().any(|c| kind(c) != Kind::Reasoning));
            if !keep {
                out[x] = None;
            }
        } else {
            next_kept = Some(out[x].is_some());
        }
    }
    let mut out: Vec<Cow<'a, Value>> = out.into_iter().flatten().collect();
    if out.iter().all(|c| kind(c) == Kind::Reasoning) {
        return Vec::new();
    }
    if let Some(t) = text.filter(|t| first_message && !t.is_empty()) {
        // New text for a group that had no assistant message (a summary put before its calls): one of its own,
        // first.
        out.insert(
            0,
            Cow::Owned(json!({"type":"message","role":"assistant","content":[{"type":"output_text","text":t}]})),
        );
    }
    out
}

/// The calls of `new` whose arguments differ from those of the same call in `orig` (tool-input clearing), with the
/// new arguments.
fn changed_arguments<'v>(orig: Option<&'v Value>, new: &'v Value) -> Vec<(&'v str, &'v str)> {
    let args = |m: &'v Value| -> Vec<(&'v str, &'v str)> {
        tool_calls(m)
            .iter()
            .filter_map(|c| {
                let id = c.get("id")?.as_str()?;
                Some((id, c.pointer("/function/arguments")?.as_str()?))
            })
            .collect()
    };
    let before = orig.map(args).unwrap_or_default();
    args(new)
        .into_iter()
        .filter(|(id, a)| {
            before
                .iter()
                .find(|(b, _)| b == id)
                .is_some_and(|(_, was)| was != a)
        })
        .collect()
}

/// A call item given new arguments: a `function_call`'s `arguments`, a `custom_tool_call`'s `input` (whichever
/// field it carries its arguments in), as a string, every other field kept in place.
fn with_arguments(item: &Value, args: &str) -> Value {
    let key = if item.get("arguments").is_none() && item.get("input").is_some() {
        "input"
    } else {
        "arguments"
    };
    with_field(item, key, Value::String(args.to_owned()))
}

/// `item` with `key` replaced (in place, every other field kept in order).
fn with_field(item: &Value, key: &str, v: Value) -> Value {
    let mut b = item.clone();
    if let Some(o) = b.as_object_mut() {
        o.insert(key.into(), v);
    }
    b
}

/// A message item with its text replaced: string content by `text`; text parts by one part of the first one's
/// kind with `text` where the first stood, the other parts kept. `None` when nothing would be left.
fn with_text(item: &Value, text: &str) -> Option<Value> {
    let is_text = |p: &Value| {
        matches!(
            p.get("type").and_then(Value::as_str),
            Some("input_text" | "output_text" | "text")
        )
    };
    let content = match item.get("content") {
        Some(Value::Array(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            let mut placed = false;
            for p in parts {
                if !is_text(p) {
                    out.push(p.clone());
                } else if !std::mem::replace(&mut placed, true) && !text.is_empty() {
                    let mut part = Map::new();
                    part.insert("type".into(), p.get("type").cloned().unwrap_or(Value::Null));
                    part.insert("text".into(), Value::String(text.to_owned()));
                    out.push(Value::Object(part));
                }
            }
            if !placed && !text.is_empty() {
                let t = if item.get("role").and_then(Value::as_str) == Some("assistant") {
                    "output_text"
                } else {
                    "input_text"
                };
                out.push(json!({"type":t,"text":text}));
            }
            if out.is_empty() {
                return None;
            }
            Value::Array(out)
        }
        _ if text.is_empty() => return None,
        _ => Value::String(text.to_owned()),
    };
    Some(with_field(item, "content", content))
}
