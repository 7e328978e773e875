//! Rebuilding one client message after the context engine changed or left out part of it: the message keeps its
//! role, every other field and its block order; only the blocks the rewrite touched change. Thinking, redacted
//! thinking, server tool, image, document and unknown blocks are carried byte-exact, and no `cache_control` is
//! added or moved (a replaced text block keeps the marker of the block it replaces). A `tool_use` whose call's
//! arguments the rewrite changed (tool-input clearing) gets them as its `input` when they are a JSON object, every
//! other field in place.

use super::convert::Origin;
use crate::message::message_text;
use serde_json::{json, Map, Value};
use std::collections::HashSet;

/// Text of the user message put first when a rewrite would otherwise open with an assistant message.
pub const TURN_NOTE: &str = "[ctxgate] Earlier messages were left out to fit the context window.";

/// The user message put first when a rewrite would otherwise open with an assistant message.
pub fn turn_note() -> Value {
    json!({"role":"user","content":[{"type":"text","text":TURN_NOTE}]})
}

/// A message ctxgate added (a summary, a note; neutral `system`) as a user message with one text block; `None`
/// when it has no text.
pub fn added(m: &Value) -> Option<Value> {
    let text = message_text(m);
    (!text.is_empty()).then(|| json!({"role":"user","content":[{"type":"text","text":text}]}))
}

/// One present part of a native message: its origin, the rewritten neutral message, and the neutral message as
/// converted from the client's (to tell a changed part from an unchanged one).
pub type Part<'p> = (Origin, &'p Value, Option<&'p Value>);

/// `nat` with only the `parts` present, as rewritten; `None` when nothing of it is left to send.
pub fn rebuild(nat: &Value, parts: &[Part<'_>]) -> Option<Value> {
    let Value::Object(fields) = nat else {
        return Some(nat.clone());
    };
    let assistant = fields.get("role").and_then(Value::as_str) == Some("assistant");
    let content = match fields.get("content") {
        Some(Value::Array(blocks)) if assistant => assistant_blocks(blocks, parts.first()?)?,
        Some(Value::Array(blocks)) => user_blocks(blocks, parts)?,
        _ => {
            // String (or odd) content: one neutral part, the whole message.
            let &(_, new, orig) = parts.first()?;
            if orig.is_some_and(|o| o.get("content") == new.get("content")) {
                return Some(nat.clone());
            }
            let text = text_of(new.get("content"));
            if text.is_empty() {
                return None;
            }
            Value::String(text)
        }
    };
    let mut out = Map::new();
    let mut content = Some(content);
    for (k, v) in fields {
        match (k.as_str(), content.take()) {
            ("content", Some(c)) => out.insert(k.clone(), c),
            (_, c) => {
                content = c;
                out.insert(k.clone(), v.clone())
            }
        };
    }
    Some(Value::Object(out))
}

/// The text of neutral content: a string, or its text parts joined by newlines (null: empty).
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(c @ Value::Array(_)) => message_text(&json!({ "content": c })),
        _ => String::new(),
    }
}

fn block_type(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Whether the rewrite changed the content of a part (a part without its original counts as changed).
fn content_changed(&(_, new, orig): &Part<'_>) -> bool {
    orig.is_none_or(|o| o.get("content") != new.get("content"))
}

/// Text blocks replaced by one with `text` where the first of them stood (carrying the marker of a replaced
/// block); `None` when the text is unchanged.
struct TextSwap {
    text: String,
    done: bool,
}

impl TextSwap {
    fn new(part: &Part<'_>) -> Option<Self> {
        content_changed(part).then(|| TextSwap {
            text: text_of(part.1.get("content")),
            done: false,
        })
    }

    /// The block to put where text block `b` of `blocks` (the first text block) stood.
    fn replacement(&mut self, blocks: &[Value], b: usize) -> Option<Value> {
        if self.done {
            return None;
        }
        self.done = true;
        if self.text.is_empty() {
            return None;
        }
        let mut block = Map::new();
        block.insert("type".into(), "text".into());
        block.insert("text".into(), Value::String(std::mem::take(&mut self.text)));
        let marker = blocks[b..]
            .iter()
            .filter(|x| block_type(x) == "text")
            .find_map(|x| x.get("cache_control"));
        if let Some(cc) = marker {
            block.insert("cache_control".into(), cc.clone());
        }
        Some(Value::Object(block))
    }

    /// Text that had no text block to replace, as a block to append.
    fn leftover(self) -> Option<Value> {
        (!self.done && !self.text.is_empty()).then(|| json!({"type":"text","text":self.text}))
    }
}

/// An assistant message's blocks: text replaced when changed, tool uses kept while their call is, the rest kept.
/// `None` when nothing but thinking would be left.
fn assistant_blocks(blocks: &[Value], part: &Part<'_>) -> Option<Value> {
    let calls: HashSet<&str> = crate::message::tool_calls(part.1)
        .iter()
        .filter_map(|c| c.get("id").and_then(Value::as_str))
        .collect();
    let inputs = NewInputs::of(part);
    let mut swap = TextSwap::new(part);
    let mut out = Vec::with_capacity(blocks.len());
    for (b, block) in blocks.iter().enumerate() {
        match block_type(block) {
            "text" => match swap.as_mut() {
                Some(s) => out.extend(s.replacement(blocks, b)),
                None => out.push(block.clone()),
            },
            "tool_use" => {
                let id = block.get("id").and_then(Value::as_str).unwrap_or("");
                if calls.contains(id) {
                    out.push(match inputs.get(id) {
                        Some(input) => with_field(block, "input", input.clone()),
                        None => block.clone(),
                    });
                }
            }
            _ => out.push(block.clone()),
        }
    }
    out.extend(swap.and_then(TextSwap::leftover));
    let substance = out
        .iter()
        .any(|b| !matches!(block_type(b), "thinking" | "redacted_thinking"));
    substance.then_some(Value::Array(out))
}

/// A user (or system) message's blocks: each `tool_result` kept, given its new content or left out with its
/// part; the other blocks left out with theirs, or kept with their text replaced when it changed.
fn user_blocks(blocks: &[Value], parts: &[Part<'_>]) -> Option<Value> {
    let has_results = blocks.iter().any(|b| block_type(b) == "tool_result");
    let find = |o: Origin| parts.iter().find(|p| p.0 == o);
    let native = parts.first()?.0.native()?;
    let rest = find(if has_results {
        Origin::Rest(native)
    } else {
        Origin::Whole(native)
    });
    let mut swap = rest.and_then(TextSwap::new);
    let mut out = Vec::with_capacity(blocks.len());
    for (b, block) in blocks.iter().enumerate() {
        if block_type(block) == "tool_result" {
            match find(Origin::ToolResult(native, b)) {
                None => {}
                Some(p) if !content_changed(p) => out.push(block.clone()),
                Some(p) => out.push(with_result(block, p.1.get("content"))),
            }
            continue;
        }
        if rest.is_none() {
            continue;
        }
        match (block_type(block), swap.as_mut()) {
            ("text", Some(s)) => out.extend(s.replacement(blocks, b)),
            _ => out.push(block.clone()),
        }
    }
    out.extend(swap.and_then(TextSwap::leftover));
    (!out.is_empty()).then_some(Value::Array(out))
}

/// The calls whose arguments the rewrite changed (e.g. cleared to a short placeholder), by id, with the new
/// arguments parsed: only those that are a JSON object (a `tool_use` input must be one; other arguments leave the
/// client's input in place, so the request stays valid).
struct NewInputs<'p>(Vec<(&'p str, Value)>);

impl<'p> NewInputs<'p> {
    fn of(&(_, new, orig): &Part<'p>) -> Self {
        let args = |m: &'p Value| -> Vec<(&'p str, &'p str)> {
            crate::message::tool_calls(m)
                .iter()
                .filter_map(|c| {
                    let id = c.get("id")?.as_str()?;
                    Some((id, c.pointer("/function/arguments")?.as_str()?))
                })
                .collect()
        };
        let before = orig.map(args).unwrap_or_default();
        let changed = args(new).into_iter().filter(|(id, a)| {
            before
                .iter()
                .find(|(b, _)| b == id)
                .is_some_and(|(_, was)| was != a)
        });
        let parsed = changed.filter_map(|(id, a)| match serde_json::from_str(a) {
            Ok(v @ Value::Object(_)) => Some((id, v)),
            _ => None,
        });
        NewInputs(parsed.collect())
    }

    fn get(&self, id: &str) -> Option<&Value> {
        self.0.iter().find(|(i, _)| *i == id).map(|(_, v)| v)
    }
}

/// `block` with `key` set to `v` (in place when present, every other field kept in order).
fn with_field(block: &Value, key: &str, v: Value) -> Value {
    let mut b = block.clone();
    if let Some(o) = b.as_object_mut() {
        o.insert(key.into(), v);
    }
    b
}

/// A `tool_result` block with its `content` replaced by the rewritten neutral content (a string; parts become
/// their text), every other field kept in place.
fn with_result(block: &Value, content: Option<&Value>) -> Value {
    let mut b = block.clone();
    if let Some(o) = b.as_object_mut() {
        let text = text_of(content);
        o.insert("content".into(), Value::String(text));
    }
    b
}
