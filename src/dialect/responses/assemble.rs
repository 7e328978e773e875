//! Assembles the output items of an OpenAI Responses answer, from its SSE events or a whole JSON body. The
//! assembled message is [`reply_message`]: the answer's output items, in order, as one session node.

use crate::dialect::{Assemble, AssembledReply, MAX_ASSEMBLED_BYTES};
use crate::sse::SseEvent;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The `type` of the assembled message: an answer's output items stored as one node.
pub const OUTPUT_TYPE: &str = "ctxgate_output";

/// The assembled message of an answer whose output is `items`:
/// `{"type":"ctxgate_output","role":"assistant","content":[items]}` (`role` and `content` so that the session's
/// identity of a message and `AssembledReply::is_empty` read it as they read other dialects' messages).
pub fn reply_message(items: Vec<Value>) -> Value {
    json!({"type": OUTPUT_TYPE, "role": "assistant", "content": items})
}

/// The output items of a message made by [`reply_message`] (none for anything else).
pub fn output_items(message: &Value) -> &[Value] {
    if message.get("type").and_then(Value::as_str) != Some(OUTPUT_TYPE) {
        return &[];
    }
    message
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The terminal events of a response.
pub const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// Accumulates the events of one Responses stream into an [`AssembledReply`].
#[derive(Debug, Default)]
pub struct Assembler {
    /// Output items by `output_index`, with the bytes each holds.
    items: BTreeMap<u64, (Map<String, Value>, usize)>,
    usage: Option<Value>,
    status: Option<String>,
    id: Option<String>,
    model: Option<String>,
    error: Option<Value>,
    ended: bool,
    chunks: usize,
    /// The highest `sequence_number` seen.
    last_sequence: Option<u64>,
    size: usize,
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

    /// The `sequence_number` an event added after the ones seen takes.
    pub fn next_sequence_number(&self) -> u64 {
        self.last_sequence.map_or(0, |n| n + 1)
    }

    /// The output items assembled so far, in order (`None` once over [`MAX_ASSEMBLED_BYTES`]).
    pub fn items(&self) -> Option<Vec<Value>> {
        (!self.overflow).then(|| {
            self.items
                .values()
                .map(|(m, _)| Value::Object(m.clone()))
                .collect()
        })
    }

    /// Output item `i` as assembled so far.
    pub fn item(&self, i: u64) -> Option<Value> {
        self.items.get(&i).map(|(m, _)| Value::Object(m.clone()))
    }

    /// Feeds one parsed event; its kind is the data's `type`, else the `event:` field.
    pub fn on_value(&mut self, event: Option<&str>, v: &Value) {
        self.chunks += 1;
        if let Some(n) = v.get("sequence_number").and_then(Value::as_u64) {
            self.last_sequence = Some(self.last_sequence.map_or(n, |l| l.max(n)));
        }
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(event)
            .unwrap_or("");
        let index = v.get("output_index").and_then(Value::as_u64);
        match kind {
            "response.created" | "response.in_progress" | "response.queued" => {
                self.on_response(v.get("response"))
            }
            k if TERMINAL.contains(&k) => {
                let r = v.get("response");
                self.on_response(r);
                if let Some(u) = r.and_then(|r| r.get("usage")).filter(|u| u.is_object()) {
                    self.usage = Some(u.clone());
                }
                if let Some(e) = r.and_then(|r| r.get("error")).filter(|e| !e.is_null()) {
                    self.error = Some(e.clone());
                }
                self.ended = true;
            }
            "error" => {
                let mut e = v.clone();
                if let Some(o) = e.as_object_mut() {
                    o.remove("sequence_number");
                }
                self.error = Some(e);
            }
            "response.output_item.added" | "response.output_item.done" => {
                if let (Some(i), Some(Value::Object(item))) = (index, v.get("item")) {
                    self.set_item(i, item);
                }
            }
            _ => {
                if let Some(i) = index {
                    self.apply(i, kind, v);
                }
            }
        }
    }

    fn on_response(&mut self, r: Option<&Value>) {
        let Some(r) = r else { return };
        let text = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_string);
        self.id = self.id.take().or_else(|| text("id"));
        self.model = self.model.take().or_else(|| text("model"));
        if let Some(s) = text("status") {
            self.status = Some(s);
        }
    }

    /// Sets item `i` whole (`output_item.added`, or `.done` whose copy is complete).
    fn set_item(&mut self, i: u64, item: &Map<String, Value>) {
        if self.overflow {
            return;
        }
        let n = item.values().map(value_size).sum::<usize>();
        let old = self.items.get(&i).map_or(0, |(_, s)| *s);
        self.size = self.size - old + n;
        if self.over() {
            return;
        }
        self.items.insert(i, (item.clone(), n));
    }

    /// A part or delta event of item `i`.
    fn apply(&mut self, i: u64, kind: &str, v: &Value) {
        if self.overflow {
            return;
        }
        let n = ["delta", "part"]
            .iter()
            .filter_map(|k| v.get(*k))
            .map(value_size)
            .sum::<usize>();
        let Some((_, size)) = self.items.get_mut(&i) else {
            return;
        };
        *size += n;
        self.size += n;
        if self.over() {
            return;
        }
        let Some((item, _)) = self.items.get_mut(&i) else {
            return;
        };
        let at = |k: &str| v.get(k).and_then(Value::as_u64).map(|n| n as usize);
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
        match kind {
            "response.content_part.added" | "response.content_part.done" => {
                if let (Some(ci), Some(p)) = (at("content_index"), v.get("part")) {
                    if let Some(c) = slot(item, "content", ci) {
                        *c = p.clone();
                    }
                }
            }
            "response.reasoning_summary_part.added" | "response.reasoning_summary_part.done" => {
                if let (Some(si), Some(p)) = (at("summary_index"), v.get("part")) {
                    if let Some(c) = slot(item, "summary", si) {
                        *c = p.clone();
                    }
                }
            }
            "response.output_text.delta" | "response.reasoning_text.delta" => {
                if let Some(ci) = at("content_index") {
                    append(slot(item, "content", ci), "text", s("delta"));
                }
            }
            "response.refusal.delta" => {
                if let Some(ci) = at("content_index") {
                    append(slot(item, "content", ci), "refusal", s("delta"));
                }
            }
            "response.reasoning_summary_text.delta" => {
                if let Some(si) = at("summary_index") {
                    append(slot(item, "summary", si), "text", s("delta"));
                }
            }
            "response.function_call_arguments.delta" => append_field(item, "arguments", s("delta")),
            "response.custom_tool_call_input.delta" => append_field(item, "input", s("delta")),
            "response.function_call_arguments.done" => {
                item.insert("arguments".into(), json!(s("arguments")));
            }
            "response.custom_tool_call_input.done" => {
                item.insert("input".into(), json!(s("input")));
            }
            _ => {} // `.done` of text parts (the part's own `.done` follows), tool progress, unknown events
        }
    }

    /// True (and nothing more is assembled) once the output is over [`MAX_ASSEMBLED_BYTES`].
    fn over(&mut self) -> bool {
        if self.size > MAX_ASSEMBLED_BYTES {
            self.overflow = true;
            self.items = BTreeMap::new();
        }
        self.overflow
    }

    /// The reply assembled so far (also valid for a stream cut short). An output over [`MAX_ASSEMBLED_BYTES`]
    /// comes back as `null` and not complete.
    pub fn finish(&self) -> AssembledReply {
        AssembledReply {
            message: self.items().map_or(Value::Null, reply_message),
            finish_reason: self.status.clone(),
            usage: self.usage.clone(),
            id: self.id.clone(),
            model: self.model.clone(),
            error: self.error.clone(),
            complete: self.ended && self.error.is_none() && !self.overflow,
            chunks: self.chunks,
            round_usage: Vec::new(),
        }
    }
}

impl Assemble for Assembler {
    fn next_sequence_number(&self) -> Option<u64> {
        Some(Assembler::next_sequence_number(self))
    }

    fn on_event(&mut self, ev: &SseEvent) -> bool {
        Assembler::on_event(self, ev);
        self.ended || self.error.is_some()
    }

    fn finish(&mut self) -> AssembledReply {
        Assembler::finish(self)
    }
}

/// Element `i` of the array `key` of `item`: an existing one, or a new `{}` when `i` is the next (an index
/// further on is ignored).
fn slot<'a>(item: &'a mut Map<String, Value>, key: &str, i: usize) -> Option<&'a mut Value> {
    let list = item.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    let a = list.as_array_mut()?;
    if i == a.len() {
        a.push(Value::Object(Map::new()));
    }
    a.get_mut(i)
}

fn append(part: Option<&mut Value>, key: &str, piece: &str) {
    if let Some(Value::Object(p)) = part {
        append_field(p, key, piece);
    }
}

fn append_field(m: &mut Map<String, Value>, key: &str, piece: &str) {
    match m.get_mut(key) {
        Some(Value::String(s)) => s.push_str(piece),
        _ => {
            m.insert(key.to_string(), json!(piece));
        }
    }
}

/// Parses a whole (non-streaming) Responses answer, or an error body.
pub fn from_body(body: &[u8]) -> AssembledReply {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return AssembledReply::default();
    };
    let Some(Value::Array(output)) = v.get("output") else {
        return AssembledReply {
            error: v.get("error").cloned(),
            ..Default::default()
        };
    };
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let error = v.get("error").filter(|e| !e.is_null()).cloned();
    AssembledReply {
        complete: error.is_none(),
        message: reply_message(output.clone()),
        finish_reason: text("status"),
        usage: v.get("usage").filter(|u| u.is_object()).cloned(),
        id: text("id"),
        model: text("model"),
        error,
        chunks: 0,
        round_usage: Vec::new(),
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
#[path = "fixtures.rs"]
pub(super) mod fixtures;

#[cfg(test)]
#[path = "assemble_tests.rs"]
mod tests;
