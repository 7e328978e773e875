//! Hiding the injected tools from the client: removing their calls from a reply, summing usage over rounds, and
//! splicing several upstream streams into one client stream (one id, one role chunk, one finish, one usage).

use super::MessageAssembler;
use crate::dialect::reply::add_numbers;
use crate::dialect::InjectedNames;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Removes injected calls from an assistant message; returns how many were removed. A `tool_calls` left empty
/// is removed.
pub fn strip_injected(message: &mut Value, names: &InjectedNames) -> usize {
    let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
        return 0;
    };
    let before = calls.len();
    calls.retain(|c| {
        !c.pointer("/function/name")
            .and_then(Value::as_str)
            .is_some_and(|n| names.is_injected(n))
    });
    let removed = before - calls.len();
    if calls.is_empty() {
        if let Some(m) = message.as_object_mut() {
            m.remove("tool_calls");
        }
    }
    removed
}

/// Adds the numbers of `u` into `acc` (nested objects such as `prompt_tokens_details` included).
pub fn merge_usage(acc: &mut Option<Value>, u: &Value) {
    match acc {
        None => *acc = Some(u.clone()),
        Some(a) => add_numbers(a, u),
    }
}

#[derive(Debug)]
enum Call {
    /// Name not known yet: deltas held.
    Pending(Vec<Value>),
    /// A client call relayed under this client-side index.
    Client(u64),
    /// A client call held back because an injected call came first in this round.
    HeldClient(Vec<Value>),
    /// One of ours: swallowed.
    Injected,
}

/// How a round ended.
#[derive(Debug)]
pub enum RoundEnd {
    /// The round called our tools: answer them and ask again. `assistant` is the message to append (its injected
    /// calls only), `calls` the injected calls to answer.
    Continue {
        /// The assistant message for the next request.
        assistant: Value,
        /// The injected calls.
        calls: Vec<Value>,
    },
    /// The response is over: send these chunks, then `[DONE]`.
    Finish(Vec<Value>),
}

/// Rewrites the chunks of successive upstream rounds into one client stream.
#[derive(Debug)]
pub struct StreamSplicer {
    names: InjectedNames,
    include_usage: bool,
    ident: Option<(Value, Value, Value)>,
    role_sent: bool,
    usage: Option<Value>,
    /// Each usage the upstream reported (one per round), in order.
    round_usage: Vec<Value>,
    calls: HashMap<u64, Call>,
    order: Vec<u64>,
    next_client: u64,
    injected_seen: bool,
    client_relayed: bool,
    finish: Option<Value>,
    assembler: MessageAssembler,
}

impl StreamSplicer {
    /// A splicer; `include_usage` when the client asked for `stream_options.include_usage`.
    pub fn new(names: InjectedNames, include_usage: bool) -> Self {
        Self {
            names,
            include_usage,
            ident: None,
            role_sent: false,
            usage: None,
            round_usage: Vec::new(),
            calls: HashMap::new(),
            order: Vec::new(),
            next_client: 0,
            injected_seen: false,
            client_relayed: false,
            finish: None,
            assembler: MessageAssembler::new(),
        }
    }

    /// The usage summed over the rounds so far.
    pub fn usage(&self) -> Option<&Value> {
        self.usage.as_ref()
    }

    /// Each usage the upstream reported so far (one per round), in order.
    pub fn round_usage(&self) -> &[Value] {
        &self.round_usage
    }

    /// Takes one upstream chunk; returns what the client gets now.
    pub fn on_chunk(&mut self, mut chunk: Value) -> Vec<Value> {
        if chunk.get("error").is_some() {
            return vec![chunk];
        }
        self.assembler.on_chunk(&chunk);
        let Some(obj) = chunk.as_object_mut() else {
            return Vec::new();
        };
        if let Some(u) = obj.remove("usage").filter(|u| u.is_object()) {
            merge_usage(&mut self.usage, &u);
            self.round_usage.push(u);
        }
        let ident = self.ident.get_or_insert_with(|| {
            (
                obj.get("id").cloned().unwrap_or(Value::Null),
                obj.get("created").cloned().unwrap_or(Value::Null),
                obj.get("model").cloned().unwrap_or(Value::Null),
            )
        });
        for (k, v) in [("id", &ident.0), ("created", &ident.1), ("model", &ident.2)] {
            if obj.contains_key(k) {
                obj.insert(k.into(), v.clone());
            }
        }
        let Some(Value::Array(choices)) = obj.get_mut("choices") else {
            return Vec::new();
        };
        if choices.is_empty() {
            return Vec::new(); // the usage chunk: sent once, summed, at the end
        }
        let mut finish_here = None;
        for choice in choices.iter_mut() {
            let Some(c) = choice.as_object_mut() else {
                continue;
            };
            if let Some(fr) = c.get("finish_reason").filter(|f| !f.is_null()).cloned() {
                finish_here = Some(fr);
                c.insert("finish_reason".into(), Value::Null);
            }
            if let Some(Value::Object(delta)) = c.get_mut("delta") {
                self.rewrite_delta(delta);
            }
        }
        let mut out = Vec::new();
        let has_payload = choices.iter().any(|c| {
            c.get("delta")
                .and_then(Value::as_object)
                .is_some_and(|d| !d.is_empty())
        });
        if finish_here.is_some() {
            let mut fin = chunk.clone();
            if let Some(Value::Array(cs)) = fin.get_mut("choices") {
                for c in cs.iter_mut() {
                    if let Some(c) = c.as_object_mut() {
                        c.insert("delta".into(), Value::Object(Map::new()));
                        c.insert(
                            "finish_reason".into(),
                            finish_here.clone().unwrap_or(Value::Null),
                        );
                    }
                }
            }
            self.finish = Some(fin);
        }
        if has_payload {
            out.push(chunk);
        }
        out
    }

    fn rewrite_delta(&mut self, delta: &mut Map<String, Value>) {
        if delta.contains_key("role") {
            if self.role_sent {
                delta.remove("role");
            } else {
                self.role_sent = true;
            }
        }
        if delta.get("content").is_some_and(Value::is_null) && delta.contains_key("tool_calls") {
            delta.remove("content");
        }
        let Some(Value::Array(calls)) = delta.remove("tool_calls") else {
            return;
        };
        let mut relay = Vec::new();
        for (pos, call) in calls.into_iter().enumerate() {
            let idx = call
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(pos as u64);
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .map(str::to_string);
            let state = self.calls.remove(&idx).unwrap_or_else(|| {
                self.order.push(idx);
                Call::Pending(Vec::new())
            });
            let state = match state {
                Call::Pending(mut held) => {
                    held.push(call);
                    match name {
                        Some(n) if self.names.is_injected(&n) => {
                            self.injected_seen = true;
                            Call::Injected
                        }
                        Some(_) if self.injected_seen => Call::HeldClient(held),
                        Some(_) => {
                            let ci = self.next_client;
                            self.next_client += 1;
                            self.client_relayed = true;
                            relay.extend(held.into_iter().map(|d| reindex(d, ci)));
                            Call::Client(ci)
                        }
                        None => Call::Pending(held),
                    }
                }
                Call::Client(ci) => {
                    relay.push(reindex(call, ci));
                    Call::Client(ci)
                }
                Call::HeldClient(mut held) => {
                    held.push(call);
                    Call::HeldClient(held)
                }
                Call::Injected => Call::Injected,
            };
            self.calls.insert(idx, state);
        }
        if !relay.is_empty() {
            delta.insert("tool_calls".into(), Value::Array(relay));
        }
    }

    /// Ends the current upstream round. `rounds_left`: whether another round may be made.
    pub fn end_round(&mut self, rounds_left: bool) -> RoundEnd {
        let reply = std::mem::take(&mut self.assembler).finish();
        let injected: Vec<Value> = self
            .names
            .injected_calls(&reply.message)
            .into_iter()
            .cloned()
            .collect();
        let calls = std::mem::take(&mut self.calls);
        let order = std::mem::take(&mut self.order);
        let finish = self.finish.take();
        if !injected.is_empty() && !self.client_relayed && rounds_left {
            self.injected_seen = false;
            self.next_client = 0;
            let mut assistant = reply.message.clone();
            if let Some(m) = assistant.as_object_mut() {
                m.insert("tool_calls".into(), Value::Array(injected.clone()));
            }
            return RoundEnd::Continue {
                assistant,
                calls: injected,
            };
        }
        // The response ends here: release client calls held back, then one finish chunk and the summed usage.
        let mut out = Vec::new();
        let template = finish.clone().unwrap_or_else(|| self.blank_chunk());
        let mut calls = calls;
        for idx in order {
            if let Some(Call::HeldClient(held)) | Some(Call::Pending(held)) = calls.remove(&idx) {
                if held.iter().any(|d| d.pointer("/function/name").is_some()) {
                    let ci = self.next_client;
                    self.next_client += 1;
                    let deltas: Vec<Value> = held.into_iter().map(|d| reindex(d, ci)).collect();
                    out.push(with_delta(
                        &template,
                        serde_json::json!({"tool_calls": deltas}),
                        Value::Null,
                    ));
                }
            }
        }
        let delivered_calls = self.next_client > 0;
        let upstream_reason = finish
            .as_ref()
            .and_then(|f| f.pointer("/choices/0/finish_reason"))
            .cloned()
            .unwrap_or(Value::Null);
        let reason = if delivered_calls {
            Value::String("tool_calls".into())
        } else if upstream_reason == "tool_calls" {
            Value::String("stop".into())
        } else {
            upstream_reason
        };
        if finish.is_some() || !out.is_empty() {
            out.push(with_delta(&template, Value::Object(Map::new()), reason));
        }
        if self.include_usage {
            if let Some(u) = &self.usage {
                let mut c = self.blank_chunk();
                if let Some(o) = c.as_object_mut() {
                    o.insert("choices".into(), Value::Array(Vec::new()));
                    o.insert("usage".into(), u.clone());
                }
                out.push(c);
            }
        }
        RoundEnd::Finish(out)
    }

    /// Ends the response early (a follow-up round failed): what `end_round` gives with no rounds left, plus a
    /// `stop` finish chunk when there was none.
    pub fn abort(&mut self) -> Vec<Value> {
        let RoundEnd::Finish(mut out) = self.end_round(false) else {
            return Vec::new();
        };
        let finished = out.iter().any(|c| {
            c.pointer("/choices/0/finish_reason")
                .is_some_and(|f| !f.is_null())
        });
        if !finished {
            let fin = with_delta(
                &self.blank_chunk(),
                Value::Object(Map::new()),
                Value::from("stop"),
            );
            let at = out
                .iter()
                .position(|c| c.get("usage").is_some())
                .unwrap_or(out.len());
            out.insert(at, fin);
        }
        out
    }

    fn blank_chunk(&self) -> Value {
        let (id, created, model) =
            self.ident
                .clone()
                .unwrap_or((Value::Null, Value::Null, Value::Null));
        serde_json::json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": null}]})
    }
}

fn reindex(mut delta: Value, index: u64) -> Value {
    if let Some(o) = delta.as_object_mut() {
        o.insert("index".into(), Value::from(index));
    }
    delta
}

fn with_delta(template: &Value, delta: Value, finish_reason: Value) -> Value {
    let mut c = template.clone();
    if let Some(Value::Array(cs)) = c.get_mut("choices") {
        cs.truncate(1);
        if let Some(Value::Object(o)) = cs.first_mut() {
            o.insert("delta".into(), delta);
            o.insert("finish_reason".into(), finish_reason);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RecallConfig;
    use crate::mock::chunk;
    use serde_json::json;

    fn names() -> InjectedNames {
        InjectedNames::from_config(&RecallConfig::default())
    }

    fn call_delta(index: u64, id: Option<&str>, name: Option<&str>, args: &str) -> Value {
        let mut f = json!({"arguments": args});
        if let Some(n) = name {
            f["name"] = json!(n);
        }
        let mut c = json!({"index": index, "function": f});
        if let Some(i) = id {
            c["id"] = json!(i);
            c["type"] = json!("function");
        }
        json!({"tool_calls": [c]})
    }

    #[test]
    fn injected_round_continues_then_finishes_once() {
        let mut s = StreamSplicer::new(names(), true);
        let mut seen = Vec::new();
        seen.extend(s.on_chunk(chunk(
            json!({"role":"assistant","content":"Checking. "}),
            None,
        )));
        seen.extend(s.on_chunk(chunk(
            call_delta(0, Some("r1"), Some("recall_tool_call"), ""),
            None,
        )));
        seen.extend(s.on_chunk(chunk(
            call_delta(0, None, None, "{\"call_id\":\"c9\"}"),
            None,
        )));
        seen.extend(s.on_chunk(chunk(json!({}), Some("tool_calls"))));
        seen.extend(s.on_chunk(json!({"id":"x","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}})));
        let RoundEnd::Continue { assistant, calls } = s.end_round(true) else {
            panic!("must continue")
        };
        assert_eq!(calls.len(), 1);
        assert_eq!(
            assistant["tool_calls"][0]["function"]["arguments"],
            "{\"call_id\":\"c9\"}"
        );
        // round 2: a different id upstream, a second role chunk
        let mut c2 = chunk(json!({"role":"assistant","content":"Found it."}), None);
        c2["id"] = json!("other-id");
        seen.extend(s.on_chunk(c2));
        seen.extend(s.on_chunk(chunk(json!({}), Some("stop"))));
        seen.extend(s.on_chunk(json!({"id":"y","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":2,"total_tokens":22}})));
        let RoundEnd::Finish(tail) = s.end_round(true) else {
            panic!("must finish")
        };
        seen.extend(tail);
        let text = serde_json::to_string(&seen).unwrap();
        assert!(!text.contains("recall_tool_call"), "{text}");
        assert!(seen.iter().all(|c| c["id"] == "chatcmpl-mock"));
        assert_eq!(
            seen.iter()
                .filter(|c| c.pointer("/choices/0/delta/role").is_some())
                .count(),
            1
        );
        let finishes: Vec<&Value> = seen
            .iter()
            .filter_map(|c| c.pointer("/choices/0/finish_reason"))
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finishes, [&json!("stop")]);
        assert_eq!(seen.last().unwrap()["usage"]["total_tokens"], 35);
    }

    #[test]
    fn client_call_first_is_relayed_and_later_injected_dropped() {
        let mut s = StreamSplicer::new(names(), false);
        let mut seen = Vec::new();
        seen.extend(s.on_chunk(chunk(
            call_delta(0, Some("c1"), Some("read_file"), "{}"),
            None,
        )));
        seen.extend(s.on_chunk(chunk(
            call_delta(1, Some("r1"), Some("search_history"), "{\"query\":\"x\"}"),
            None,
        )));
        seen.extend(s.on_chunk(chunk(json!({}), Some("tool_calls"))));
        let RoundEnd::Finish(tail) = s.end_round(true) else {
            panic!("client calls were relayed: finish")
        };
        seen.extend(tail);
        let text = serde_json::to_string(&seen).unwrap();
        assert!(text.contains("read_file") && !text.contains("search_history"));
        assert_eq!(
            seen.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
    }

    #[test]
    fn injected_first_holds_client_calls_and_releases_them_when_rounds_run_out() {
        let mut s = StreamSplicer::new(names(), false);
        let mut seen = Vec::new();
        seen.extend(s.on_chunk(chunk(
            call_delta(
                0,
                Some("r1"),
                Some("recall_tool_call"),
                "{\"call_id\":\"a\"}",
            ),
            None,
        )));
        seen.extend(s.on_chunk(chunk(
            call_delta(1, Some("c1"), Some("ls"), "{\"d\":"),
            None,
        )));
        seen.extend(s.on_chunk(chunk(call_delta(1, None, None, "1}"), None)));
        seen.extend(s.on_chunk(chunk(json!({}), Some("tool_calls"))));
        assert!(seen.is_empty(), "nothing relayed yet: {seen:?}");
        let RoundEnd::Finish(tail) = s.end_round(false) else {
            panic!("no rounds left")
        };
        let mut a = MessageAssembler::new();
        for c in &tail {
            a.on_chunk(c);
        }
        let m = a.finish().message;
        assert_eq!(
            m["tool_calls"],
            json!([{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"d\":1}"}}])
        );
    }

    #[test]
    fn strip_and_usage() {
        let mut m = json!({"role":"assistant","tool_calls":[
            {"id":"a","function":{"name":"recall_tool_call","arguments":"{}"}},
            {"id":"b","function":{"name":"mine","arguments":"{}"}}]});
        assert_eq!(strip_injected(&mut m, &names()), 1);
        assert_eq!(m["tool_calls"].as_array().unwrap().len(), 1);
        let mut u = None;
        merge_usage(&mut u, &json!({"prompt_tokens":1,"details":{"cached":2}}));
        merge_usage(&mut u, &json!({"prompt_tokens":4,"details":{"cached":1}}));
        assert_eq!(
            u.unwrap(),
            json!({"prompt_tokens":5,"details":{"cached":3}})
        );
    }
}
