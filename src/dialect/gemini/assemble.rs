//! The reply of a Gemini answer: one `GenerateContentResponse` (a JSON body), the chunks of an `alt=sse` stream
//! (each `data:` one chunk), or the chunks of a streamed JSON array (`[{…},{…}]`, read whole by the relay's tap).
//! The reply message is the `model` content as the client sends it back: the chunks' parts in order, adjacent
//! plain text parts (and adjacent thought texts) merged as Gemini CLI merges them; its usage is the last
//! `usageMetadata` (the chunks' are cumulative).

use crate::dialect::{Assemble, AssembledReply};
use crate::sse::SseEvent;
use serde_json::{json, Map, Value};

/// Assembles a reply from Gemini chunks.
#[derive(Debug, Default)]
pub struct Assembler {
    parts: Vec<Value>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    id: Option<String>,
    model: Option<String>,
    error: Option<Value>,
    chunks: usize,
    bytes: usize,
}

/// Whether a part is plain text (only `text`, maybe `thought`), which merges with the one before it.
fn plain_text(p: &Value) -> Option<(bool, &str)> {
    let o = p.as_object()?;
    let text = o.get("text")?.as_str()?;
    let thought = o.get("thought").and_then(Value::as_bool).unwrap_or(false);
    let others = o.keys().any(|k| k != "text" && k != "thought");
    (!others).then_some((thought, text))
}

impl Assembler {
    /// Feeds one chunk (a `GenerateContentResponse`, or `{"error":…}`).
    pub fn on_chunk(&mut self, v: &Value) {
        self.chunks += 1;
        if let Some(e) = v.get("error") {
            self.error = Some(e.clone());
            return;
        }
        if let Some(id) = v.get("responseId").and_then(Value::as_str) {
            self.id.get_or_insert_with(|| id.to_string());
        }
        if let Some(m) = v.get("modelVersion").and_then(Value::as_str) {
            self.model.get_or_insert_with(|| m.to_string());
        }
        if let Some(u) = v.get("usageMetadata") {
            self.usage = Some(u.clone());
        }
        let Some(c) = v.pointer("/candidates/0") else {
            return;
        };
        if let Some(f) = c.get("finishReason").and_then(Value::as_str) {
            self.finish_reason = Some(f.to_string());
        }
        let parts = c
            .pointer("/content/parts")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for p in parts {
            self.push(p);
        }
    }

    fn push(&mut self, p: &Value) {
        // A text part weighs its text; others (calls, data) their JSON.
        let size = p
            .get("text")
            .and_then(Value::as_str)
            .map_or_else(|| p.to_string().len(), str::len);
        if self.bytes + size > crate::dialect::MAX_ASSEMBLED_BYTES {
            return;
        }
        self.bytes += size;
        if let (Some((thought, text)), Some(last)) = (plain_text(p), self.parts.last_mut()) {
            if let Some((last_thought, last_text)) = plain_text(last) {
                if last_thought == thought {
                    let merged = format!("{last_text}{text}");
                    last["text"] = Value::String(merged);
                    return;
                }
            }
        }
        self.parts.push(p.clone());
    }

    /// Feeds one SSE event.
    pub fn on_event(&mut self, ev: &SseEvent) {
        if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
            self.on_chunk(&v);
        }
    }

    /// The reply so far.
    pub fn finish(&self) -> AssembledReply {
        let message = if self.parts.is_empty() {
            Value::Object(Map::new())
        } else {
            json!({"role": "model", "parts": self.parts})
        };
        AssembledReply {
            message,
            finish_reason: self.finish_reason.clone(),
            usage: self.usage.clone(),
            id: self.id.clone(),
            model: self.model.clone(),
            error: self.error.clone(),
            complete: self.error.is_none() && self.finish_reason.is_some(),
            chunks: self.chunks,
            round_usage: Vec::new(),
        }
    }
}

impl Assemble for Assembler {
    /// True for the chunk that carries the `finishReason` (with the usage): the reply is whole.
    fn on_event(&mut self, ev: &SseEvent) -> bool {
        let before = self.finish_reason.is_some() || self.error.is_some();
        Assembler::on_event(self, ev);
        !before && (self.finish_reason.is_some() || self.error.is_some())
    }

    fn finish(&mut self) -> AssembledReply {
        Assembler::finish(self)
    }
}

/// The chunks of an answer body: itself, or the elements of a streamed JSON array.
pub fn chunks(body: &Value) -> Vec<&Value> {
    match body {
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

/// The reply of a whole answer body (one response, or a streamed JSON array's chunks).
pub fn from_body(body: &[u8]) -> AssembledReply {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return AssembledReply::default();
    };
    let mut a = Assembler::default();
    for c in chunks(&v) {
        a.on_chunk(c);
    }
    let mut reply = a.finish();
    reply.complete = reply.error.is_none() && !reply.message.as_object().is_some_and(Map::is_empty);
    reply
}

/// The chunks of an answer merged into one response: the first chunk's fields, the assembled content and
/// `finishReason`, the last usage (a streamed JSON array answered after recall rounds goes out as one element).
pub fn merged(body: &Value) -> Value {
    let all = chunks(body);
    let Some(first) = all.first() else {
        return Value::Null;
    };
    if all.len() == 1 {
        return (*first).clone();
    }
    let mut a = Assembler::default();
    for c in &all {
        a.on_chunk(c);
    }
    let mut out = (*first).clone();
    if let Some(o) = out.as_object_mut() {
        if let Some(u) = &a.usage {
            o.insert("usageMetadata".into(), u.clone());
        }
    }
    if let Some(c) = out
        .pointer_mut("/candidates/0")
        .and_then(Value::as_object_mut)
    {
        c.insert("content".into(), json!({"role": "model", "parts": a.parts}));
        if let Some(f) = &a.finish_reason {
            c.insert("finishReason".into(), json!(f));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ev(v: Value) -> SseEvent {
        SseEvent {
            event: None,
            data: v.to_string(),
        }
    }

    #[test]
    fn a_stream_is_assembled_into_the_model_content() {
        let mut a = Assembler::default();
        let chunks = [
            json!({"candidates":[{"content":{"role":"model","parts":[{"text":"plan","thought":true}]}}],"responseId":"r1","modelVersion":"gemini-2.5-flash"}),
            json!({"candidates":[{"content":{"role":"model","parts":[{"text":"Let me "}]}}],"usageMetadata":{"promptTokenCount":9}}),
            json!({"candidates":[{"content":{"role":"model","parts":[{"text":"look."}]}}]}),
            json!({"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"id":"c","name":"ls","args":{}},"thoughtSignature":"S"}]},"finishReason":"STOP"}],
                   "usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":4,"totalTokenCount":13}}),
        ];
        let done: Vec<bool> = chunks
            .iter()
            .map(|c| Assemble::on_event(&mut a, &ev(c.clone())))
            .collect();
        assert_eq!(done, [false, false, false, true]);
        let r = Assemble::finish(&mut a);
        assert_eq!(
            r.message,
            json!({"role":"model","parts":[{"text":"plan","thought":true},{"text":"Let me look."},
                {"functionCall":{"id":"c","name":"ls","args":{}},"thoughtSignature":"S"}]})
        );
        assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
        assert_eq!(r.usage.unwrap()["totalTokenCount"], 13);
        assert_eq!(
            (r.id.as_deref(), r.model.as_deref()),
            (Some("r1"), Some("gemini-2.5-flash"))
        );
        assert!(r.complete);
        assert!(!AssembledReply {
            message: json!({"role":"model","parts":[{"text":"x"}]}),
            ..Default::default()
        }
        .is_empty());
    }

    #[test]
    fn a_body_or_a_json_array_stream_is_one_reply() {
        let one = json!({"candidates":[{"content":{"role":"model","parts":[{"text":"hi"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3}});
        let r = from_body(one.to_string().as_bytes());
        assert_eq!(r.message["parts"][0]["text"], "hi");
        assert!(r.complete);
        let arr = json!([{"candidates":[{"content":{"role":"model","parts":[{"text":"h"}]}}]},
            {"candidates":[{"content":{"role":"model","parts":[{"text":"i"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3}}]);
        let r = from_body(arr.to_string().as_bytes());
        assert_eq!(r.message["parts"], json!([{"text":"hi"}]));
        assert_eq!(
            merged(&arr)["candidates"][0]["content"]["parts"],
            json!([{"text":"hi"}])
        );
        assert_eq!(merged(&arr)["usageMetadata"]["promptTokenCount"], 3);
        let e =
            from_body(br#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}"#);
        assert!(e.error.is_some() && !e.complete);
    }
}
