//! One client stream out of the `alt=sse` streams of several upstream rounds. Each chunk goes to the client as it
//! came (its `data:` text unchanged) unless it carries ctxgate's `functionCall` parts, which are taken out (a
//! chunk left with nothing to say is dropped). A round that called ctxgate's tools shows neither its
//! `finishReason` nor its usage; the stream's last chunk carries the `usageMetadata` summed over the rounds and
//! the first round's `responseId`. Google's SDK parser stalls for good on an SSE comment, so the keep-alive while
//! a round is in flight is a bare line break, which it skips.

use super::assemble::Assembler;
use super::rounds::{add_usage, injected_calls, is_injected_call};
use crate::dialect::shared::{RoundEnd, StreamSplice};
use crate::dialect::{AssembledReply, InjectedNames};
use crate::error::GatewayError;
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::{json, Value};

/// Splices the SSE streams of successive upstream rounds into one client stream.
#[derive(Debug)]
pub struct StreamSplicer {
    names: InjectedNames,
    /// Usage summed over the rounds that ended.
    usage: Option<Value>,
    round_usage: Vec<Value>,
    /// The first round's `responseId`.
    first_id: Option<Value>,
    /// What the client was sent, assembled.
    seen: Assembler,
    ended: bool,
    round: Round,
}

/// The current round.
#[derive(Debug, Default)]
struct Round {
    /// Every chunk of it, assembled (the model content the next round carries).
    answer: Assembler,
    /// It called ctxgate's tools.
    ours: bool,
    /// A client `functionCall` of it reached the client (the client must answer it: no next round).
    client_call_relayed: bool,
    /// Its finishing chunk, held back (ctxgate's calls and the text already sent taken out).
    finish: Option<Value>,
    usage: Option<Value>,
}

/// One SSE event as Google frames it.
fn encode(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\r\n\r\n"))
}

impl StreamSplicer {
    /// A splicer for one client stream.
    pub fn new(names: InjectedNames) -> Self {
        Self {
            names,
            usage: None,
            round_usage: Vec::new(),
            first_id: None,
            seen: Assembler::default(),
            ended: false,
            round: Round::default(),
        }
    }

    fn send(&mut self, v: &Value, raw: Option<&str>, out: &mut Vec<Bytes>) {
        self.seen.on_chunk(v);
        match raw {
            Some(r) => out.push(encode(r)),
            None => out.push(encode(&v.to_string())),
        }
    }

    /// The chunk that ends the client's stream: the held finishing chunk (or a bare one) with the summed usage and
    /// the first round's id.
    fn closing(&mut self, held: Option<Value>, finish_reason: &str) -> Vec<Bytes> {
        let mut v = held.unwrap_or_else(|| {
            json!({"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": finish_reason, "index": 0}]})
        });
        if let Some(parts) = v
            .pointer_mut("/candidates/0/content/parts")
            .and_then(Value::as_array_mut)
        {
            if parts.is_empty() {
                parts.push(json!({"text": ""}));
            }
        }
        if let Some(o) = v.as_object_mut() {
            if let Some(u) = &self.usage {
                o.insert("usageMetadata".into(), u.clone());
            }
            if let Some(id) = &self.first_id {
                o.insert("responseId".into(), id.clone());
            }
        }
        self.ended = true;
        let mut out = Vec::new();
        self.send(&v, None, &mut out);
        out
    }
}

impl StreamSplice for StreamSplicer {
    /// A bare line break: `@google/genai` skips whitespace before `data:`, while an SSE comment stalls it.
    fn keepalive() -> Bytes {
        Bytes::from_static(b"\r\n")
    }

    fn reply(&self) -> AssembledReply {
        let mut reply = self.seen.finish();
        reply.round_usage.clone_from(&self.round_usage);
        reply
    }

    fn error_event(&mut self, e: &GatewayError) -> Option<Bytes> {
        self.ended = true;
        Some(encode(&super::errors::error_body(e).to_string()))
    }

    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.ended || ev.data.trim().is_empty() {
            return out;
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&ev.data) else {
            return out;
        };
        if v.get("error").is_some() {
            self.send(&v, Some(&ev.data), &mut out);
            self.ended = true;
            return out;
        }
        self.round.answer.on_chunk(&v);
        if self.first_id.is_none() {
            self.first_id = v.get("responseId").cloned();
        }
        let later_round = !self.round_usage.is_empty();
        let parts = v
            .pointer("/candidates/0/content/parts")
            .and_then(Value::as_array);
        let ours = parts.is_some_and(|ps| ps.iter().any(|p| is_injected_call(p, &self.names)));
        let client_calls = parts.is_some_and(|ps| {
            ps.iter()
                .any(|p| p.get("functionCall").is_some() && !is_injected_call(p, &self.names))
        });
        self.round.ours |= ours;
        self.round.client_call_relayed |= client_calls;
        let finishing = v.pointer("/candidates/0/finishReason").is_some();
        if finishing {
            if let Some(u) = v.get("usageMetadata") {
                self.round.usage = Some(u.clone());
            }
        }
        if !self.round.ours && !later_round {
            // The first round, none of ctxgate's calls so far: the chunk as it came. A finishing one ends the
            // client's stream (the round calls nothing of ours, and its usage is all there is).
            self.send(&v, Some(&ev.data), &mut out);
            self.ended |= finishing;
            return out;
        }
        if ours {
            if let Some(ps) = v
                .pointer_mut("/candidates/0/content/parts")
                .and_then(Value::as_array_mut)
            {
                ps.retain(|p| !is_injected_call(p, &self.names));
            }
        }
        if later_round {
            if let (Some(o), Some(id)) = (v.as_object_mut(), &self.first_id) {
                if o.contains_key("responseId") {
                    o.insert("responseId".into(), id.clone());
                }
            }
        }
        let says = v
            .pointer("/candidates/0/content/parts")
            .and_then(Value::as_array)
            .is_some_and(|ps| !ps.is_empty());
        if finishing {
            // Held until the round's end says whether it is the stream's last; what it says goes now.
            let mut held = v.clone();
            if says && self.round.ours {
                if let Some(c) = v
                    .pointer_mut("/candidates/0")
                    .and_then(Value::as_object_mut)
                {
                    c.remove("finishReason");
                }
                if let Some(o) = v.as_object_mut() {
                    o.remove("usageMetadata");
                }
                self.send(&v, None, &mut out);
                if let Some(ps) = held
                    .pointer_mut("/candidates/0/content/parts")
                    .and_then(Value::as_array_mut)
                {
                    ps.clear();
                }
            }
            self.round.finish = Some(held);
        } else if says {
            self.send(&v, None, &mut out);
        }
        out
    }

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
        if round.ours && !calls.is_empty() && !round.client_call_relayed && rounds_left {
            return RoundEnd::Continue {
                assistant: answer.message,
                calls,
            };
        }
        let reason = answer.finish_reason.unwrap_or_else(|| "STOP".into());
        RoundEnd::Finish(self.closing(round.finish, &reason))
    }

    fn abort(&mut self) -> Vec<Bytes> {
        let round = std::mem::take(&mut self.round);
        if let Some(u) = &round.usage {
            add_usage(&mut self.usage, u);
            self.round_usage.push(u.clone());
        }
        if self.ended {
            return Vec::new();
        }
        self.closing(round.finish, "STOP")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::RecallConfig;
    use crate::sse::SseParser;

    fn names() -> InjectedNames {
        InjectedNames::from_config(&RecallConfig::default())
    }

    fn ev(v: &Value) -> SseEvent {
        SseEvent {
            event: None,
            data: v.to_string(),
        }
    }

    fn chunk(parts: Value, finish: bool, prompt: u64) -> Value {
        let mut v = json!({"candidates":[{"content":{"role":"model","parts":parts},"index":0}],
            "usageMetadata":{"promptTokenCount":prompt},"responseId":format!("id-{prompt}")});
        if finish {
            v["candidates"][0]["finishReason"] = json!("STOP");
            v["usageMetadata"]["candidatesTokenCount"] = json!(2);
        }
        v
    }

    /// The `data:` of every event in `bytes`.
    fn datas(bytes: &[Bytes]) -> Vec<Value> {
        let all: Vec<u8> = bytes.iter().flat_map(|b| b.to_vec()).collect();
        SseParser::new()
            .feed(&all)
            .into_iter()
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect()
    }

    #[test]
    fn a_stream_without_our_calls_passes_event_for_event() {
        let mut s = StreamSplicer::new(names());
        let chunks = [
            chunk(json!([{"text":"a"}]), false, 5),
            chunk(
                json!([{"functionCall":{"id":"c","name":"ls","args":{}},"thoughtSignature":"S"}]),
                true,
                5,
            ),
        ];
        let mut out = Vec::new();
        for c in &chunks {
            out.extend(s.on_event(&ev(c)));
        }
        let RoundEnd::Finish(tail) = s.end_round(true) else {
            panic!("a round without our calls ends the stream")
        };
        out.extend(tail);
        let got = datas(&out);
        assert_eq!(got[0], chunks[0]);
        // the finishing chunk: as it came, with the (one round's) usage and id
        assert_eq!(got[1], chunks[1]);
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn our_calls_are_hidden_and_the_rounds_make_one_stream() {
        let mut s = StreamSplicer::new(names());
        let mut out = Vec::new();
        out.extend(s.on_event(&ev(&chunk(json!([{"text":"Let me check."}]), false, 10))));
        let call = json!({"functionCall":{"id":"r","name":"recall_tool_call","args":{"call_id":"c1"}},"thoughtSignature":"S"});
        out.extend(s.on_event(&ev(&chunk(json!([call]), true, 10))));
        let RoundEnd::Continue { assistant, calls } = s.end_round(true) else {
            panic!("our call continues")
        };
        assert_eq!(calls[0]["id"], "r");
        assert_eq!(assistant["parts"][1]["thoughtSignature"], "S");
        assert!(!StreamSplicer::keepalive().is_empty());
        out.extend(s.on_event(&ev(&chunk(json!([{"text":"It said 42."}]), false, 30))));
        out.extend(s.on_event(&ev(&chunk(json!([{"text":""}]), true, 30))));
        let RoundEnd::Finish(tail) = s.end_round(true) else {
            panic!("a text answer ends")
        };
        out.extend(tail);
        let got = datas(&out);
        let text: String = got
            .iter()
            .flat_map(|c| {
                c["candidates"][0]["content"]["parts"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|p| p["text"].as_str().map(str::to_string))
            .collect();
        assert_eq!(text, "Let me check.It said 42.");
        assert!(!got
            .iter()
            .any(|c| c.to_string().contains("recall_tool_call")));
        let finishes: Vec<&Value> = got
            .iter()
            .filter(|c| c["candidates"][0].get("finishReason").is_some())
            .collect();
        assert_eq!(finishes.len(), 1);
        let last = got.last().unwrap();
        assert_eq!(last["usageMetadata"]["promptTokenCount"], 40);
        assert_eq!(last["usageMetadata"]["candidatesTokenCount"], 4);
        assert!(got.iter().all(|c| c["responseId"] == "id-10"));
        let reply = s.reply();
        assert_eq!(reply.round_usage.len(), 2);
        assert!(!reply.message.to_string().contains("recall_tool_call"));
    }

    #[test]
    fn an_aborted_stream_is_closed_and_errors_take_googles_shape() {
        let mut s = StreamSplicer::new(names());
        let call = json!({"functionCall":{"name":"recall_tool_call","args":{"call_id":"c1"}}});
        s.on_event(&ev(&chunk(json!([call]), true, 10)));
        let RoundEnd::Continue { calls, .. } = s.end_round(true) else {
            panic!("continues")
        };
        assert_eq!(calls[0]["id"], "ctxgate-call-0");
        let closed = datas(&s.abort());
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0]["candidates"][0]["finishReason"], "STOP");
        let mut s = StreamSplicer::new(names());
        let e = s.error_event(&GatewayError::UpstreamTimeout(3)).unwrap();
        assert!(String::from_utf8_lossy(&e).starts_with("data: {\"error\":"));
    }
}
