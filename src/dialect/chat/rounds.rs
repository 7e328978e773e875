//! Chat completions in recall rounds: the tool messages that carry ctxgate's answers, the final JSON answer, and
//! the splicer of `data:` chunk streams (see [`StreamSplicer`]) ended by `[DONE]`.

use super::{strip_injected, MessageAssembler, RoundEnd, StreamSplicer};
use crate::dialect::reply::with_round_totals;
use crate::dialect::rounds::{Splice, SpliceEnd};
use crate::dialect::{AssembledReply, InjectedNames};
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::{json, Map, Value};

/// The chat splicer with the assembler of what the client was sent.
pub struct ChatSplice {
    splicer: StreamSplicer,
    seen: MessageAssembler,
}

impl ChatSplice {
    /// For a client body asking (or not) for `stream_options.include_usage`.
    pub fn new(names: InjectedNames, body: &Map<String, Value>) -> Self {
        let include_usage = body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Self {
            splicer: StreamSplicer::new(names, include_usage),
            seen: MessageAssembler::new(),
        }
    }

    fn emit(&mut self, chunks: Vec<Value>) -> Vec<Bytes> {
        chunks
            .iter()
            .map(|c| {
                self.seen.on_chunk(c);
                data_event(c)
            })
            .collect()
    }
}

impl Splice for ChatSplice {
    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes> {
        let data = ev.data.trim();
        if data == "[DONE]" || data.is_empty() {
            return Vec::new();
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Vec::new();
        };
        let out = self.splicer.on_chunk(v);
        self.emit(out)
    }

    fn end_round(&mut self, rounds_left: bool) -> SpliceEnd {
        match self.splicer.end_round(rounds_left) {
            RoundEnd::Continue { assistant, calls } => SpliceEnd::Continue { assistant, calls },
            RoundEnd::Finish(tail) => SpliceEnd::Finish(self.emit(tail)),
        }
    }

    fn abort(&mut self) -> Vec<Bytes> {
        let tail = self.splicer.abort();
        self.emit(tail)
    }

    fn reply(&self) -> AssembledReply {
        let mut reply = self.seen.finish();
        reply.round_usage = self.splicer.round_usage().to_vec();
        reply
    }

    fn done(&self) -> Option<Bytes> {
        Some(Bytes::from_static(b"data: [DONE]\n\n"))
    }

    fn keepalive(&self) -> Option<Bytes> {
        None
    }
}

/// One chunk as an SSE `data:` event.
fn data_event(v: &Value) -> Bytes {
    let mut b = b"data: ".to_vec();
    b.extend(serde_json::to_vec(v).unwrap_or_default());
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

/// The assistant message with only ctxgate's `calls`, then one tool message per call with its result.
pub fn round_messages(assistant: &Value, calls: &[Value], results: &[String]) -> Vec<Value> {
    let mut a = assistant.clone();
    if let Some(o) = a.as_object_mut() {
        o.insert("tool_calls".into(), Value::Array(calls.to_vec()));
    }
    let mut out = vec![a];
    for (c, content) in calls.iter().zip(results) {
        out.push(
            json!({"role": "tool", "tool_call_id": c.get("id").cloned().unwrap_or(Value::Null),
                        "content": content}),
        );
    }
    out
}

/// The client's answer: our calls removed (`finish_reason` `stop` when none is left), usage summed over the
/// rounds, the first round's id.
pub fn finalize(
    mut v: Value,
    names: &InjectedNames,
    usage: Option<Value>,
    first_id: Option<Value>,
) -> Value {
    if let Some(msg) = v.pointer_mut("/choices/0/message") {
        let removed = strip_injected(msg, names);
        let has_calls = msg.get("tool_calls").is_some();
        if removed > 0 && !has_calls {
            if let Some(c) = v.pointer_mut("/choices/0") {
                c["finish_reason"] = json!("stop");
            }
        }
    }
    with_round_totals(v, usage, first_id)
}
