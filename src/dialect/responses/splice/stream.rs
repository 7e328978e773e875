//! One client SSE stream out of several upstream Responses rounds: the first round's `response.created` and
//! `response.in_progress` only, every event renumbered (`sequence_number` strictly increasing, `output_index`
//! contiguous), ctxgate's `function_call` items swallowed with the reasoning that led only to them, and one terminal
//! event whose `response.output` is what the client was streamed, with the usage summed and the first round's id.
//! The `response` objects the client gets do not list ctxgate's tools among their `tools`.

use super::{
    add_usage, hide_tools, injected_calls, is_client_call, is_injected_call, is_reasoning,
};
use crate::dialect::responses::assemble::{output_items, Assembler, TERMINAL};
use crate::dialect::responses::errors;
use crate::dialect::shared::{RoundEnd, StreamSplice};
use crate::dialect::{AssembledReply, InjectedNames};
use crate::error::GatewayError;
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::HashMap;

/// What becomes of an upstream output item of the current round.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    /// Relayed under this client `output_index`.
    Relay(u64),
    /// One of ours (or reasoning that led only to ours): never shown.
    Swallow,
    /// Held back until the round ends (a client call after one of ours, and every item after it).
    Hold,
    /// Reasoning not yet followed by another item: its fate is the next item's.
    Pending,
    /// Reasoning followed by our call: shown only if a later item of its unit is.
    Unit,
}

/// The current round's state.
#[derive(Debug, Default)]
struct Round {
    routes: HashMap<u64, Route>,
    /// Events of the items routed [`Route::Pending`], [`Route::Unit`] and [`Route::Hold`], in upstream order.
    pending: Vec<Value>,
    unit: Vec<Value>,
    held: Vec<Value>,
    /// Client indexes added and not yet done.
    open: Vec<u64>,
    ours_seen: bool,
    holding: bool,
    client_call_relayed: bool,
    terminal: Option<Value>,
    answer: Assembler,
}

impl Round {
    /// Takes the events listed under `from` ([`Route::Pending`], [`Route::Unit`], else the held ones).
    fn take(&mut self, from: Route) -> Vec<Value> {
        let list = match from {
            Route::Pending => &mut self.pending,
            Route::Unit => &mut self.unit,
            _ => &mut self.held,
        };
        std::mem::take(list)
    }

    /// Routes the items of `events` to `to`.
    fn reroute(&mut self, events: &[Value], to: Route) {
        for i in events.iter().filter_map(output_index) {
            self.routes.insert(i, to);
        }
    }
}

/// Rewrites the SSE events of successive upstream rounds into one client stream.
#[derive(Debug)]
pub struct StreamSplicer {
    names: InjectedNames,
    rounds_ended: usize,
    started: bool,
    ended: bool,
    next_seq: u64,
    next_index: u64,
    /// Usage summed over the rounds that ended.
    usage: Option<Value>,
    /// The usage of each round that ended, as the upstream reported it.
    round_usage: Vec<Value>,
    first_id: Option<Value>,
    /// The latest `response` object the upstream sent (for a terminal event made up by [`Self::abort`]).
    last_response: Option<Value>,
    round: Round,
    seen: Assembler,
}

impl StreamSplicer {
    /// A splicer for one client stream.
    pub fn new(names: InjectedNames) -> Self {
        Self {
            names,
            rounds_ended: 0,
            started: false,
            ended: false,
            next_seq: 0,
            next_index: 0,
            usage: None,
            round_usage: Vec::new(),
            first_id: None,
            last_response: None,
            round: Round::default(),
            seen: Assembler::default(),
        }
    }

    /// The client stream is over: its terminal event or an `error` was sent.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The current round's terminal event arrived.
    pub fn round_done(&self) -> bool {
        self.round.terminal.is_some()
    }

    /// The usage summed over the rounds that ended.
    pub fn usage(&self) -> Option<&Value> {
        self.usage.as_ref()
    }

    fn item_added(&mut self, kind: &str, v: Value, raw: Option<&str>, out: &mut Vec<Bytes>) {
        let Some(i) = output_index(&v) else {
            return;
        };
        let item = v.get("item").unwrap_or(&Value::Null);
        let r = &mut self.round;
        if is_reasoning(item) {
            if !r.holding {
                // A new unit: the reasoning of the previous one, if it led only to our calls, stays hidden.
                let dropped = r.take(Route::Unit);
                r.reroute(&dropped, Route::Swallow);
            }
            r.routes.insert(i, Route::Pending);
            r.pending.push(v);
            return;
        }
        if is_injected_call(item, &self.names) {
            r.ours_seen = true;
            let reasoning = r.take(Route::Pending);
            r.reroute(&reasoning, Route::Unit);
            r.unit.extend(reasoning);
            r.routes.insert(i, Route::Swallow);
            return;
        }
        let client_call = is_client_call(item, &self.names);
        if r.holding || (client_call && r.ours_seen) {
            r.holding = true;
            let mut before = r.take(Route::Unit);
            before.extend(r.take(Route::Pending));
            r.reroute(&before, Route::Hold);
            r.held.extend(before);
            r.routes.insert(i, Route::Hold);
            r.held.push(v);
            return;
        }
        // Shown: with the reasoning of its unit before it.
        let mut before = r.take(Route::Unit);
        before.extend(r.take(Route::Pending));
        r.client_call_relayed |= client_call;
        out.extend(self.release(before));
        let ci = self.open_item(i);
        out.push(self.emit(kind, v, raw, Some(ci)));
    }

    /// Gives upstream item `i` the next client index.
    fn open_item(&mut self, i: u64) -> u64 {
        let ci = self.next_index;
        self.next_index += 1;
        self.round.routes.insert(i, Route::Relay(ci));
        self.round.open.push(ci);
        ci
    }

    fn item_event(
        &mut self,
        i: u64,
        kind: &str,
        v: Value,
        raw: Option<&str>,
        out: &mut Vec<Bytes>,
    ) {
        let r = &mut self.round;
        match r.routes.get(&i).copied() {
            Some(Route::Relay(ci)) => {
                if kind == "response.output_item.done" {
                    r.open.retain(|&o| o != ci);
                }
                out.push(self.emit(kind, v, raw, Some(ci)));
            }
            Some(Route::Pending) => r.pending.push(v),
            Some(Route::Unit) => r.unit.push(v),
            Some(Route::Hold) => r.held.push(v),
            Some(Route::Swallow) | None => {}
        }
    }

    /// Sends held-back events, their items under the next client indexes.
    fn release(&mut self, events: Vec<Value>) -> Vec<Bytes> {
        let mut out = Vec::new();
        for v in events {
            let kind = v
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let Some(i) = output_index(&v) else {
                continue;
            };
            if kind == "response.output_item.added" {
                self.open_item(i);
            }
            if let Some(Route::Relay(ci)) = self.round.routes.get(&i).copied() {
                if kind == "response.output_item.done" {
                    self.round.open.retain(|&o| o != ci);
                }
                out.push(self.emit(&kind, v, None, Some(ci)));
            }
        }
        out
    }

    /// Emits an event as the client's next one: its `sequence_number` the next, its `output_index` `ci`. The
    /// upstream bytes go out as they are when they already say so.
    fn emit(&mut self, kind: &str, mut v: Value, raw: Option<&str>, ci: Option<u64>) -> Bytes {
        let seq = self.next_seq;
        self.next_seq += 1;
        let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
        let same = num(&v, "sequence_number") == Some(seq)
            && ci.is_none_or(|c| output_index(&v) == Some(c));
        if !same {
            if let Some(o) = v.as_object_mut() {
                o.insert("sequence_number".into(), json!(seq));
                if let Some(c) = ci {
                    o.insert("output_index".into(), json!(c));
                }
            }
        }
        self.seen.on_value(Some(kind), &v);
        match raw.map(str::trim) {
            // Data that came over several `data:` lines is re-serialised onto one.
            Some(data) if same && !data.contains(['\n', '\r']) => encode(kind, data),
            _ => encode(kind, &v.to_string()),
        }
    }

    /// Closes the client stream: `response.output_item.done` for items left open, then `terminal` carrying the
    /// output the client was shown, the summed usage and the first round's id.
    fn close(&mut self, mut terminal: Value, open: &[u64]) -> Vec<Bytes> {
        let mut out = Vec::new();
        for &ci in open {
            let item = self.seen.item(ci).unwrap_or_else(|| json!({}));
            let done = json!({"type": "response.output_item.done", "sequence_number": 0,
                              "output_index": ci, "item": item});
            out.push(self.emit("response.output_item.done", done, None, Some(ci)));
        }
        let kind = terminal
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("response.completed")
            .to_string();
        let output = self.seen.items().unwrap_or_default();
        if let Some(r) = terminal.get_mut("response") {
            hide_tools(r, &self.names);
        }
        if let Some(r) = terminal.get_mut("response").and_then(Value::as_object_mut) {
            r.insert("output".into(), Value::Array(output));
            if let Some(u) = &self.usage {
                r.insert("usage".into(), u.clone());
            }
            if let Some(id) = &self.first_id {
                r.insert("id".into(), id.clone());
            }
        }
        out.push(self.emit(&kind, terminal, None, None));
        self.ended = true;
        out
    }
}

impl StreamSplice for StreamSplicer {
    /// An SSE comment, to keep the client's stream alive while a follow-up round is in flight (the Responses API
    /// has no ping event; SSE decoders, the openai SDKs' included, skip comment lines).
    fn keepalive() -> Bytes {
        Bytes::from_static(b": keep-alive\n\n")
    }

    /// The reply as the client saw it so far, with the usage of each upstream round that ended.
    fn reply(&self) -> AssembledReply {
        let mut reply = self.seen.finish();
        reply.round_usage.clone_from(&self.round_usage);
        reply
    }

    /// The `error` event that ends the client's stream after a failure, numbered after the events sent (nothing
    /// once the stream is over).
    fn error_event(&mut self, e: &GatewayError) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        self.ended = true;
        Some(self.emit("error", errors::error_value(e), None, None))
    }

    /// Takes one upstream event; returns the encoded events the client gets now.
    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(ev.data.trim()) else {
            return out;
        };
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or("")
            .to_string();
        self.round.answer.on_value(Some(&kind), &v);
        let raw = Some(ev.data.as_str());
        match kind.as_str() {
            "response.created" | "response.in_progress" | "response.queued" => {
                let mut v = v;
                let changed = v
                    .get_mut("response")
                    .is_some_and(|r| hide_tools(r, &self.names));
                self.last_response = v.get("response").cloned();
                if self.rounds_ended == 0 {
                    if kind == "response.created" && !self.started {
                        self.started = true;
                        self.first_id = v.pointer("/response/id").cloned();
                    }
                    out.push(self.emit(&kind, v, raw.filter(|_| !changed), None));
                }
            }
            k if TERMINAL.contains(&k) => {
                self.last_response = v.get("response").cloned();
                self.round.terminal = Some(v);
            }
            "error" => {
                out.push(self.emit(&kind, v, raw, None));
                self.ended = true;
            }
            "response.output_item.added" => self.item_added(&kind, v, raw, &mut out),
            _ => match output_index(&v) {
                Some(i) => self.item_event(i, &kind, v, raw, &mut out),
                None if self.started => out.push(self.emit(&kind, v, raw, None)),
                None => {}
            },
        }
        out
    }

    /// Ends the current upstream round. `rounds_left`: whether another round may be made.
    fn end_round(&mut self, rounds_left: bool) -> RoundEnd {
        self.rounds_ended += 1;
        let usage = self
            .round
            .terminal
            .as_ref()
            .and_then(|t| t.pointer("/response/usage"))
            .filter(|u| u.is_object())
            .cloned();
        if let Some(u) = &usage {
            add_usage(&mut self.usage, u);
            self.round_usage.push(u.clone());
        }
        if self.ended {
            self.round = Round::default();
            return RoundEnd::Finish(Vec::new());
        }
        let answer = self.round.answer.finish();
        let calls = injected_calls(output_items(&answer.message), &self.names);
        let completed = self
            .round
            .terminal
            .as_ref()
            .and_then(|t| t.get("type"))
            .and_then(Value::as_str)
            == Some("response.completed");
        if !calls.is_empty() && !self.round.client_call_relayed && completed && rounds_left {
            self.round = Round::default();
            return RoundEnd::Continue {
                assistant: answer.message,
                calls,
            };
        }
        // Reasoning at the very end led to nothing of ours: it is the client's.
        let mut rest = self.round.take(Route::Hold);
        rest.extend(self.round.take(Route::Pending));
        let mut out = self.release(rest);
        let round = std::mem::take(&mut self.round);
        if let Some(t) = round.terminal {
            out.extend(self.close(t, &round.open));
        }
        RoundEnd::Finish(out)
    }

    /// Ends the client stream cleanly after a failed follow-up round (or a round cut short): open items done, one
    /// terminal event (the round's own, else `response.completed`) with the output shown and the usage so far.
    /// Nothing when the stream never started or is already over.
    fn abort(&mut self) -> Vec<Bytes> {
        let round = std::mem::take(&mut self.round);
        if let Some(u) = round
            .terminal
            .as_ref()
            .and_then(|t| t.pointer("/response/usage"))
            .filter(|u| u.is_object())
        {
            add_usage(&mut self.usage, u);
            self.round_usage.push(u.clone());
        }
        if !self.started || self.ended {
            return Vec::new();
        }
        let terminal = round.terminal.unwrap_or_else(|| {
            let mut r = self.last_response.clone().unwrap_or_else(|| json!({}));
            if let Some(o) = r.as_object_mut() {
                o.insert("status".into(), json!("completed"));
            }
            json!({"type": "response.completed", "response": r})
        });
        self.close(terminal, &round.open)
    }
}

fn output_index(v: &Value) -> Option<u64> {
    v.get("output_index").and_then(Value::as_u64)
}

/// One SSE event as the Responses API frames it.
fn encode(kind: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}
