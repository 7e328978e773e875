//! Assembles the native assistant message of an Anthropic Messages answer, from its SSE events or a whole JSON body.

use crate::dialect::{AssembledReply, MAX_ASSEMBLED_BYTES};
use crate::sse::SseEvent;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// One content block being assembled: what its `content_block_start` carried, plus the partial JSON of its input.
#[derive(Debug, Default)]
struct Block {
    block: Map<String, Value>,
    /// The concatenated `input_json_delta` pieces (tool_use, server_tool_use, mcp_tool_use).
    input_json: Option<String>,
}

impl Block {
    fn apply(&mut self, delta: &Map<String, Value>) {
        let kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text_delta" => self.append("text", delta.get("text")),
            "thinking_delta" => self.append("thinking", delta.get("thinking")),
            "signature_delta" => self.append("signature", delta.get("signature")),
            "input_json_delta" => {
                if let Some(p) = delta.get("partial_json").and_then(Value::as_str) {
                    self.input_json.get_or_insert_with(String::new).push_str(p);
                }
            }
            "citations_delta" => {
                if let Some(c) = delta.get("citation") {
                    let list = self
                        .block
                        .entry("citations")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if !list.is_array() {
                        *list = Value::Array(Vec::new());
                    }
                    if let Value::Array(a) = list {
                        a.push(c.clone());
                    }
                }
            }
            // Unknown deltas (e.g. `compaction_delta`): text fields are appended, anything else replaces.
            _ => {
                for (k, v) in delta.iter().filter(|(k, _)| k.as_str() != "type") {
                    self.append(k, Some(v));
                }
            }
        }
    }

    /// Appends a string piece to the field `key`, or sets a non-string value.
    fn append(&mut self, key: &str, piece: Option<&Value>) {
        let Some(piece) = piece else { return };
        match (self.block.get_mut(key), piece) {
            (Some(Value::String(s)), Value::String(p)) => s.push_str(p),
            _ => {
                self.block.insert(key.to_string(), piece.clone());
            }
        }
    }

    fn finish(&self) -> Value {
        let mut b = self.block.clone();
        let is_tool_use = b.get("type").and_then(Value::as_str) == Some("tool_use");
        match self.input_json.as_deref().map(str::trim) {
            Some(j) if !j.is_empty() => {
                // A cut stream leaves partial JSON: the block keeps what its start carried.
                if let Ok(input) = serde_json::from_str::<Value>(j) {
                    b.insert("input".into(), input);
                }
            }
            _ => {}
        }
        if is_tool_use && !b.get("input").is_some_and(Value::is_object) {
            b.insert("input".into(), Value::Object(Map::new()));
        }
        Value::Object(b)
    }
}

/// Accumulates the events of one Anthropic Messages stream into an [`AssembledReply`].
#[derive(Debug, Default)]
pub struct Assembler {
    blocks: BTreeMap<u64, Block>,
    usage: Option<Value>,
    stop_reason: Option<String>,
    id: Option<String>,
    model: Option<String>,
    error: Option<Value>,
    stopped: bool,
    /// Indexes of the content blocks started and not yet stopped.
    open: BTreeSet<u64>,
    chunks: usize,
    /// Bytes of block content taken in so far.
    size: usize,
    /// The message went over [`MAX_ASSEMBLED_BYTES`]: it is no longer assembled.
    overflow: bool,
}

impl Assembler {
    /// Feeds one SSE event (its `data` is parsed; an event that is not JSON is ignored).
    pub fn on_event(&mut self, ev: &SseEvent) {
        let data = ev.data.trim();
        if data.is_empty() {
            return;
        }
        if let Ok(v) = serde_json::from_str::<Value>(data) {
            self.on_value(ev.event.as_deref(), &v);
        }
    }

    /// Feeds one parsed event; its kind is the data's `type`, else the `event:` field.
    pub fn on_value(&mut self, event: Option<&str>, v: &Value) {
        self.chunks += 1;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(event)
            .unwrap_or("");
        match kind {
            "message_start" => {
                let m = v.get("message").unwrap_or(&Value::Null);
                let text = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
                self.id = self.id.take().or_else(|| text("id"));
                self.model = self.model.take().or_else(|| text("model"));
                if let Some(u) = m.get("usage").filter(|u| u.is_object()) {
                    overlay(&mut self.usage, u);
                }
            }
            "content_block_start" => {
                let (Some(i), Some(Value::Object(b))) = (index(v), v.get("content_block")) else {
                    return;
                };
                self.open.insert(i);
                if self.grow(b.values().map(value_size).sum()) {
                    self.blocks.insert(
                        i,
                        Block {
                            block: b.clone(),
                            input_json: None,
                        },
                    );
                }
            }
            "content_block_delta" => {
                let (Some(i), Some(Value::Object(d))) = (index(v), v.get("delta")) else {
                    return;
                };
                if self.grow(d.values().map(value_size).sum()) {
                    if let Some(b) = self.blocks.get_mut(&i) {
                        b.apply(d);
                    }
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_string());
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    overlay(&mut self.usage, u);
                }
            }
            "content_block_stop" => {
                if let Some(i) = index(v) {
                    self.open.remove(&i);
                }
            }
            "message_stop" => self.stopped = true,
            "error" => self.error = Some(v.get("error").cloned().unwrap_or_else(|| v.clone())),
            _ => {} // ping, unknown events
        }
    }

    /// Everything that carries content has come: `message_stop`, or a `message_delta` with a `stop_reason` once
    /// every block that started has stopped. What may still follow (`message_stop`, pings) adds nothing to the
    /// reply, and `message_delta` holds the final usage: a client that leaves now (litellm stops reading there)
    /// got the whole reply.
    pub fn answered(&self) -> bool {
        self.stopped || (self.stop_reason.is_some() && self.open.is_empty())
    }

    /// Counts `n` more bytes; false once the message is over the bound (then nothing more is assembled).
    fn grow(&mut self, n: usize) -> bool {
        if self.overflow {
            return false;
        }
        self.size += n;
        if self.size > MAX_ASSEMBLED_BYTES {
            self.overflow = true;
            self.blocks = BTreeMap::new();
            return false;
        }
        true
    }

    /// The reply assembled so far (also valid for a stream cut short); complete once [`Self::answered`] (and no
    /// error). A message over [`MAX_ASSEMBLED_BYTES`] comes back as `null` and not complete.
    pub fn finish(&self) -> AssembledReply {
        let message = if self.overflow {
            Value::Null
        } else {
            let content: Vec<Value> = self.blocks.values().map(Block::finish).collect();
            serde_json::json!({"role": "assistant", "content": content})
        };
        AssembledReply {
            message,
            finish_reason: self.stop_reason.clone(),
            usage: self.usage.clone(),
            id: self.id.clone(),
            model: self.model.clone(),
            error: self.error.clone(),
            complete: self.answered() && self.error.is_none() && !self.overflow,
            chunks: self.chunks,
            round_usage: Vec::new(),
        }
    }
}

/// Parses a whole (non-streaming) Messages answer, or an error body.
pub fn from_body(body: &[u8]) -> AssembledReply {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return AssembledReply::default();
    };
    if v.get("type").and_then(Value::as_str) == Some("error") || v.get("content").is_none() {
        return AssembledReply {
            error: v.get("error").cloned(),
            ..Default::default()
        };
    }
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let content = v.get("content").cloned().unwrap_or(Value::Null);
    AssembledReply {
        complete: content.is_array(),
        message: serde_json::json!({"role": "assistant", "content": content}),
        finish_reason: text("stop_reason"),
        usage: v.get("usage").filter(|u| u.is_object()).cloned(),
        id: text("id"),
        model: text("model"),
        error: None,
        chunks: 0,
        round_usage: Vec::new(),
    }
}

fn index(v: &Value) -> Option<u64> {
    v.get("index").and_then(Value::as_u64)
}

/// Sets every field of `u` into `acc` (later usage objects are cumulative: their values win; a `null` does not
/// erase a number).
pub(super) fn overlay(acc: &mut Option<Value>, u: &Value) {
    let (Some(Value::Object(a)), Value::Object(b)) = (acc.as_mut(), u) else {
        *acc = Some(u.clone());
        return;
    };
    for (k, v) in b {
        if !v.is_null() || !a.contains_key(k) {
            a.insert(k.clone(), v.clone());
        }
    }
}

/// Bytes of text a value holds (its strings, roughly).
fn value_size(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(value_size).sum(),
        Value::Object(o) => o.iter().map(|(k, v)| k.len() + value_size(v)).sum(),
        _ => 8,
    }
}

#[cfg(test)]
#[path = "assemble_tests.rs"]
mod tests;
