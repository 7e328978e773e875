//! One client SSE stream out of several upstream rounds: one `message_start`, contiguous block indexes, ctxgate's
//! `tool_use` blocks swallowed, one `message_delta` with the usage summed over the rounds, one `message_stop`.

use super::{add_usage, as_chat_call, injected_calls, is_injected_call, round_assistant};
use crate::dialect::anthropic::assemble::{overlay, Assembler};
use crate::dialect::shared::{RoundEnd, StreamSplice};
use crate::dialect::AssembledReply;
use crate::dialect::InjectedNames;
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::HashMap;

/// What becomes of an upstream block of the current round.
#[derive(Debug, Clone, Copy)]
enum Route {
    /// Relayed under this client index.
    Relay(u64),
    /// One of ours: never shown.
    Swallow,
    /// Held back until the round ends (a client call after one of ours, and every block after it).
    Hold,
}

/// The current round's state.
#[derive(Debug, Default)]
struct Round {
    routes: HashMap<u64, Route>,
    /// Client indexes started and not yet stopped.
    open: Vec<u64>,
    ours_seen: bool,
    holding: bool,
    held: Vec<Value>,
    client_call_relayed: bool,
    usage: Option<Value>,
    last_delta: Option<Value>,
    stopped: bool,
    answer: Assembler,
}

/// Rewrites the SSE events of successive upstream rounds into one client stream.
#[derive(Debug)]
pub struct StreamSplicer {
    names: InjectedNames,
    started: bool,
    ended: bool,
    next_index: u64,
    /// Usage summed over the rounds that ended.
    usage: Option<Value>,
    /// The usage of each round that ended, as the upstream reported it.
    round_usage: Vec<Value>,
    /// A client `tool_use` block reached the client.
    client_calls: bool,
    round: Round,
    seen: Assembler,
}

impl StreamSplicer {
    /// A splicer for one client stream.
    pub fn new(names: InjectedNames) -> Self {
        Self {
            names,
            started: false,
            ended: false,
            next_index: 0,
            usage: None,
            round_usage: Vec::new(),
            client_calls: false,
            round: Round::default(),
            seen: Assembler::default(),
        }
    }

    /// A `ping` event, to keep the client's stream alive while a follow-up round is in flight.
    pub fn ping() -> Bytes {
        encode("ping", r#"{"type":"ping"}"#)
    }

    /// The client stream is over: `message_stop` or an `error` was sent.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The current round's `message_stop` arrived: the caller can stop reading it.
    pub fn round_done(&self) -> bool {
        self.round.stopped
    }

    /// The usage summed over the rounds that ended.
    pub fn usage(&self) -> Option<&Value> {
        self.usage.as_ref()
    }

    fn block_start(&mut self, kind: &str, v: Value, raw: &str, out: &mut Vec<Bytes>) {
        let Some(i) = v.get("index").and_then(Value::as_u64) else {
            return;
        };
        let block = v.get("content_block").unwrap_or(&Value::Null);
        let client_call = block.get("type").and_then(Value::as_str) == Some("tool_use");
        let r = &mut self.round;
        let route = if is_injected_call(block, &self.names) {
            r.ours_seen = true;
            Route::Swallow
        } else if r.holding || (client_call && r.ours_seen) {
            r.holding = true;
            Route::Hold
        } else {
            r.client_call_relayed |= client_call;
            Route::Relay(self.next_index)
        };
        r.routes.insert(i, route);
        match route {
            Route::Relay(ci) => {
                self.next_index += 1;
                self.client_calls |= client_call;
                self.round.open.push(ci);
                out.push(self.relay(kind, v, i, ci, raw));
            }
            Route::Hold => self.round.held.push(v),
            Route::Swallow => {}
        }
    }

    fn block_event(&mut self, kind: &str, v: Value, raw: &str, out: &mut Vec<Bytes>) {
        let Some(i) = v.get("index").and_then(Value::as_u64) else {
            return;
        };
        match self.round.routes.get(&i).copied() {
            Some(Route::Relay(ci)) => {
                if kind == "content_block_stop" {
                    self.round.open.retain(|&o| o != ci);
                }
                out.push(self.relay(kind, v, i, ci, raw));
            }
            Some(Route::Hold) => self.round.held.push(v),
            Some(Route::Swallow) | None => {}
        }
    }

    /// Emits a block event under the client index `ci` (the upstream bytes as they are when `ci` is `i`).
    fn relay(&mut self, kind: &str, mut v: Value, i: u64, ci: u64, raw: &str) -> Bytes {
        if i == ci {
            return self.emit(kind, &v, Some(raw));
        }
        v["index"] = json!(ci);
        self.emit(kind, &v, None)
    }

    fn emit(&mut self, kind: &str, v: &Value, raw: Option<&str>) -> Bytes {
        self.seen.on_value(Some(kind), v);
        match raw.map(str::trim) {
            // Data that came over several `data:` lines is re-serialised onto one.
            Some(data) if !data.contains(['\n', '\r']) => encode(kind, data),
            _ => encode(kind, &v.to_string()),
        }
    }

    /// Sends the held blocks under the next client indexes.
    fn release(&mut self, held: Vec<Value>) -> Vec<Bytes> {
        let mut map = HashMap::new();
        let mut out = Vec::new();
        for mut v in held {
            let kind = v
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let Some(i) = v.get("index").and_then(Value::as_u64) else {
                continue;
            };
            if kind == "content_block_start" {
                self.client_calls |= v.pointer("/content_block/type") == Some(&json!("tool_use"));
                map.insert(i, self.next_index);
                self.next_index += 1;
            }
            if let Some(&ci) = map.get(&i) {
                v["index"] = json!(ci);
                out.push(self.emit(&kind, &v, None));
            }
        }
        out
    }

    /// Closes the client stream: `content_block_stop` for open blocks, one `message_delta`, one `message_stop`.
    fn close(&mut self, open: &[u64], last_delta: Option<Value>) -> Vec<Bytes> {
        let mut out = Vec::new();
        for &ci in open {
            out.push(self.emit(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": ci}),
                None,
            ));
        }
        let mut delta = last_delta.unwrap_or_else(
            || json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}}),
        );
        if delta.pointer("/delta/stop_reason") == Some(&json!("tool_use")) && !self.client_calls {
            delta["delta"]["stop_reason"] = json!("end_turn");
        }
        let mut usage = self.usage.clone().unwrap_or_else(|| json!({}));
        if let Some(u) = usage.as_object_mut() {
            u.entry("input_tokens").or_insert(json!(0));
        }
        delta["usage"] = usage;
        out.push(self.emit("message_delta", &delta, None));
        out.push(self.emit("message_stop", &json!({"type": "message_stop"}), None));
        self.ended = true;
        out
    }
}

impl StreamSplice for StreamSplicer {
    fn keepalive() -> Bytes {
        Self::ping()
    }

    fn neutral_call(call: Value) -> Value {
        as_chat_call(&call)
    }

    /// The reply as the client saw it so far, with the usage of each upstream round that ended.
    fn reply(&self) -> AssembledReply {
        let mut reply = self.seen.finish();
        reply.round_usage.clone_from(&self.round_usage);
        reply
    }

    /// Takes one upstream event; returns the encoded events the client gets now.
    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        let Ok(v) = serde_json::from_str::<Value>(ev.data.trim()) else {
            return out;
        };
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or("")
            .to_string();
        self.round.answer.on_value(Some(&kind), &v);
        match kind.as_str() {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage").filter(|u| u.is_object()) {
                    overlay(&mut self.round.usage, u);
                }
                if !std::mem::replace(&mut self.started, true) {
                    out.push(self.emit(&kind, &v, Some(&ev.data)));
                }
            }
            "content_block_start" => self.block_start(&kind, v, &ev.data, &mut out),
            "content_block_delta" | "content_block_stop" => {
                self.block_event(&kind, v, &ev.data, &mut out)
            }
            "message_delta" => {
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    overlay(&mut self.round.usage, u);
                }
                self.round.last_delta = Some(v).filter(Value::is_object);
            }
            "message_stop" => self.round.stopped = true,
            "error" => {
                out.push(self.emit(&kind, &v, Some(&ev.data)));
                self.ended = true;
            }
            // `ping` and event types added to the API later pass through (once the message has started).
            _ if self.started => out.push(self.emit(&kind, &v, Some(&ev.data))),
            _ => {}
        }
        out
    }

    /// Ends the current upstream round. `rounds_left`: whether another round may be made.
    fn end_round(&mut self, rounds_left: bool) -> RoundEnd {
        let round = std::mem::take(&mut self.round);
        if let Some(u) = &round.usage {
            add_usage(&mut self.usage, u);
            self.round_usage.push(u.clone());
        }
        if self.ended {
            return RoundEnd::Finish(Vec::new());
        }
        let answer = round.answer.finish();
        let calls = injected_calls(&answer.message, &self.names);
        if !calls.is_empty() && !round.client_call_relayed && round.stopped && rounds_left {
            return RoundEnd::Continue {
                assistant: round_assistant(&answer.message, &self.names),
                calls,
            };
        }
        let mut out = self.release(round.held);
        if round.stopped {
            out.extend(self.close(&round.open, round.last_delta));
        }
        RoundEnd::Finish(out)
    }

    /// Ends the client stream cleanly after a failed follow-up round (or a round cut short): open blocks closed,
    /// the usage so far, `end_turn` (or the round's own stop reason), `message_stop`. Nothing when the stream
    /// never started or is already over.
    fn abort(&mut self) -> Vec<Bytes> {
        let round = std::mem::take(&mut self.round);
        if let Some(u) = &round.usage {
            add_usage(&mut self.usage, u);
            self.round_usage.push(u.clone());
        }
        if !self.started || self.ended {
            return Vec::new();
        }
        self.close(&round.open, round.last_delta)
    }
}

/// One SSE event as Anthropic frames it.
fn encode(kind: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}
