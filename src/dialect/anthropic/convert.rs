//! Anthropic Messages ⇄ the neutral conversation: `to_neutral` maps a request's `system` and `messages` onto
//! chat-completions-shaped messages the context engine plans on (remembering where each came from), and
//! `from_neutral` renders a rewrite back onto the client's own messages: untouched messages borrowed (byte-identical),
//! changed ones rebuilt with their opaque blocks (thinking, server tools, images, unknown blocks) carried as they
//! were.
//!
//! Token estimates of what the neutral form cannot hold as text: an image is one `image` part (the counter's flat
//! price); a document with a text source counts its text, one with base64 data one image part per started 4 KiB of
//! data (at most 1000), any other document one image part; thinking and redacted thinking count nothing (the API
//! drops past turns' thinking from the input); server tool blocks (`server_tool_use`, `*_tool_result`, `mcp_*`)
//! and unknown blocks count their string fields except ids, signatures and encrypted or base64 data, held in the
//! neutral message's [`OPAQUE`] field (assistant) or in a part of their own type with a `content` string (user).

use super::rebuild::{added, rebuild, turn_note};
use crate::message::{role, Source, CONTINUES};
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// Key of a neutral assistant message holding the text of its server tool and unknown blocks (counted as tokens,
/// never rendered: the blocks themselves are carried from the client's message).
pub const OPAQUE: &str = "ctxgate_opaque";

/// Base64 characters counted as one image part when a document carries its data inline.
const DOC_CHARS_PER_PART: usize = 4096;
/// Most image parts one inline document counts as.
const DOC_MAX_PARTS: usize = 1000;
/// Fields whose strings are not text the model reads as such (ids, signatures, encrypted or base64 data).
const NOT_TEXT: [&str; 10] = [
    "type",
    "id",
    "tool_use_id",
    "signature",
    "data",
    "encrypted_content",
    "encrypted_index",
    "cache_control",
    "media_type",
    "citations",
];

/// Where a neutral message comes from in the client's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The top-level `system` (never rendered back: the body's `system` stays as sent).
    System,
    /// The whole native message at this index.
    Whole(usize),
    /// The `tool_result` block (native message, block index).
    ToolResult(usize, usize),
    /// The blocks other than `tool_result` of a user message that also carries results.
    Rest(usize),
}

impl Origin {
    /// The native message index (`None` for the top-level system).
    pub fn native(self) -> Option<usize> {
        match self {
            Origin::System => None,
            Origin::Whole(i) | Origin::ToolResult(i, _) | Origin::Rest(i) => Some(i),
        }
    }
}

/// A request's conversation in the neutral shape, with the origin of each message (aligned).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Neutral {
    /// The neutral messages.
    pub messages: Vec<Value>,
    /// Where each comes from.
    pub origins: Vec<Origin>,
}

impl Neutral {
    fn push(&mut self, m: Value, o: Origin) {
        self.messages.push(m);
        self.origins.push(o);
    }
}

/// The neutral conversation of a request's `system` and `messages`. Deterministic; reads every block once.
pub fn to_neutral(system: Option<&Value>, messages: &[Value]) -> Neutral {
    let mut n = Neutral::default();
    if let Some(s) = system.filter(|s| !s.is_null()) {
        n.push(
            json!({"role":"system","content":plain_text(s)}),
            Origin::System,
        );
    }
    for (i, m) in messages.iter().enumerate() {
        let content = m.get("content");
        match (role(m), content) {
            ("assistant", _) => n.push(assistant(content), Origin::Whole(i)),
            ("user", Some(Value::Array(blocks))) if blocks.iter().any(is_tool_result) => {
                for (b, block) in blocks.iter().enumerate().filter(|(_, b)| is_tool_result(b)) {
                    let id = block.get("tool_use_id").cloned().unwrap_or(Value::Null);
                    let content = user_content(block.get("content"));
                    n.push(
                        json!({"role":"tool","tool_call_id":id,"content":content}),
                        Origin::ToolResult(i, b),
                    );
                }
                let rest: Vec<&Value> = blocks.iter().filter(|b| !is_tool_result(b)).collect();
                if !rest.is_empty() {
                    let parts = parts(rest.into_iter());
                    n.push(
                        json!({"role":"user","content":parts,CONTINUES:true}),
                        Origin::Rest(i),
                    );
                }
            }
            (r, _) => {
                let r = if r == "system" { "system" } else { "user" };
                n.push(
                    json!({"role":r,"content":user_content(content)}),
                    Origin::Whole(i),
                );
            }
        }
    }
    n
}

fn is_tool_result(b: &Value) -> bool {
    b.get("type").and_then(Value::as_str) == Some("tool_result")
}

fn block_type(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Text of a `system` value (string, or text blocks joined by newlines).
fn plain_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            let texts: Vec<&str> = blocks
                .iter()
                .filter(|b| block_type(b) == "text")
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            texts.join("\n")
        }
        other => opaque_text(other),
    }
}

/// Neutral content of a user, system or tool result message: its string, or parts.
fn user_content(content: Option<&Value>) -> Value {
    match content {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(blocks)) => Value::Array(parts(blocks.iter())),
        Some(other) => Value::String(opaque_text(other)),
        None => Value::String(String::new()),
    }
}

/// Neutral content parts of user-side blocks.
fn parts<'v>(blocks: impl Iterator<Item = &'v Value>) -> Vec<Value> {
    let mut out = Vec::new();
    for b in blocks {
        match block_type(b) {
            "text" => match b.get("text") {
                Some(Value::String(t)) => out.push(json!({"type":"text","text":t})),
                _ => out.push(json!({"type":"text","text":opaque_text(b)})),
            },
            "image" => out.push(json!({"type":"image"})),
            "document" => document(b, &mut out),
            t => out.push(json!({"type":t,"content":opaque_text(b)})),
        }
    }
    out
}

fn document(b: &Value, out: &mut Vec<Value>) {
    let source = b.get("source");
    let kind = source.and_then(|s| s.get("type")).and_then(Value::as_str);
    let data = source.and_then(|s| s.get("data"));
    match (kind, data) {
        (Some("text"), Some(Value::String(t))) => {
            out.push(json!({"type":"document","content":t}));
        }
        (Some("content"), _) => {
            let text = source.and_then(|s| s.get("content")).map(opaque_text);
            out.push(json!({"type":"document","content":text.unwrap_or_default()}));
        }
        (Some("base64"), Some(Value::String(d))) => {
            let n = d.len().div_ceil(DOC_CHARS_PER_PART).clamp(1, DOC_MAX_PARTS);
            out.extend(std::iter::repeat_n(json!({"type":"image"}), n));
        }
        _ => out.push(json!({"type":"image"})),
    }
}

/// The neutral assistant message: text joined, tool uses as tool calls, server tool and unknown blocks' text in
/// [`OPAQUE`]; thinking is left out.
fn assistant(content: Option<&Value>) -> Value {
    let blocks = match content {
        Some(Value::Array(blocks)) => blocks,
        Some(Value::String(s)) => return json!({"role":"assistant","content":s}),
        _ => return json!({"role":"assistant","content":null}),
    };
    let (mut texts, mut calls, mut opaque) = (Vec::new(), Vec::new(), String::new());
    for b in blocks {
        match block_type(b) {
            "text" => texts.push(b.get("text").and_then(Value::as_str).unwrap_or("")),
            "tool_use" => {
                let input = b.get("input").map_or_else(String::new, Value::to_string);
                calls.push(json!({"id":b.get("id").cloned().unwrap_or(Value::Null),"type":"function",
                    "function":{"name":b.get("name").cloned().unwrap_or(Value::Null),"arguments":input}}));
            }
            "thinking" | "redacted_thinking" => {}
            _ => {
                let t = opaque_text(b);
                if !t.is_empty() {
                    if !opaque.is_empty() {
                        opaque.push('\n');
                    }
                    opaque.push_str(&t);
                }
            }
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), "assistant".into());
    let text = (!texts.is_empty()).then(|| Value::String(texts.join("\n")));
    m.insert("content".into(), text.unwrap_or(Value::Null));
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    if !opaque.is_empty() {
        m.insert(OPAQUE.into(), Value::String(opaque));
    }
    Value::Object(m)
}

/// The strings of a block a model reads (ids, signatures and encrypted or base64 data skipped), in document order,
/// joined by newlines. Walks with an explicit stack: no recursion on deep values.
pub(super) fn opaque_text(v: &Value) -> String {
    crate::dialect::shared::opaque_text(v, &NOT_TEXT)
}

/// The client's messages after a rewrite of their neutral form. `out[k]` is the k-th rewritten neutral message and
/// `sources[k]` where it came from. A native message whose neutral parts are all present and unchanged is borrowed
/// (byte-identical); one partly changed or partly absent is rebuilt (see `rebuild`); added messages (a summary, a
/// note) become user text messages; the top-level system is not rendered (the body keeps its own). A result that
/// would start with an assistant message gets a short user note first.
pub fn from_neutral<'a>(
    native: &'a [Value],
    neutral: &Neutral,
    out: &[Cow<'_, Value>],
    sources: &[Source],
) -> Vec<Cow<'a, Value>> {
    let mut rendered = crate::dialect::shared::render::by_client_message(
        native,
        neutral.messages.len(),
        |j| neutral.origins.get(j).map(|o| o.native()),
        out,
        sources,
        |i, parts, total| render_one(native, neutral, i, parts, total),
        added,
    );
    if rendered
        .iter()
        .find(|m| role(m) != "system")
        .is_some_and(|m| role(m) == "assistant")
    {
        rendered.insert(0, Cow::Owned(turn_note()));
    }
    rendered
}

/// Native message `i` from the parts of it present in the rewrite: borrowed when all `total` are there unchanged.
fn render_one<'a>(
    native: &'a [Value],
    neutral: &Neutral,
    i: usize,
    parts: &[(usize, &Value)],
    total: usize,
) -> Option<Cow<'a, Value>> {
    let unchanged = |&(j, m): &(usize, &Value)| {
        neutral
            .messages
            .get(j)
            .is_some_and(|orig| std::ptr::eq(orig, m) || orig == m)
    };
    if parts.len() == total && parts.iter().all(unchanged) {
        return Some(Cow::Borrowed(&native[i]));
    }
    let with_origins: Vec<(Origin, &Value, Option<&Value>)> = parts
        .iter()
        .filter_map(|&(j, m)| {
            let o = *neutral.origins.get(j)?;
            Some((o, m, neutral.messages.get(j)))
        })
        .collect();
    rebuild(&native[i], &with_origins).map(Cow::Owned)
}
