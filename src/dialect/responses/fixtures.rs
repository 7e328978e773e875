//! Test fixtures: Responses API SSE events as the API streams them (shapes from its streaming reference), each
//! numbered by the stream that makes it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::sse::{SseEvent, SseParser};
use serde_json::{json, Value};

/// A reasoning item's opaque content, as the API returns it with `include: ["reasoning.encrypted_content"]`.
pub const ENC: &str = "gAAAAABo+Z3x/enc+rypted==";

/// Makes one upstream stream's events, numbering them from 0.
pub struct Upstream {
    seq: u64,
    pub events: Vec<SseEvent>,
    id: String,
    tools: Value,
}

/// A client tool, as a response echoes its request's `tools`.
pub fn tool(name: &str) -> Value {
    json!({"type":"function","name":name,"description":"d","parameters":{"type":"object"},"strict":false})
}

impl Upstream {
    /// A stream whose response echoes the client's `shell` tool and ctxgate's two tools (default names).
    pub fn new(id: &str) -> Self {
        let names =
            crate::dialect::InjectedNames::from_config(&crate::config::RecallConfig::default());
        Self::with_tools(
            id,
            json!([tool("shell"), tool(&names.recall), tool(&names.search)]),
        )
    }

    /// A stream whose response echoes `tools`.
    pub fn with_tools(id: &str, tools: Value) -> Self {
        let mut u = Self {
            seq: 0,
            events: Vec::new(),
            id: id.into(),
            tools,
        };
        let r = u.response("in_progress", json!([]), Value::Null);
        u.push(json!({"type":"response.created","response": r}));
        u.push(json!({"type":"response.in_progress","response": r}));
        u
    }

    pub fn response(&self, status: &str, output: Value, usage: Value) -> Value {
        json!({"id": self.id, "object":"response", "created_at": 1_760_000_000, "status": status,
               "error": null, "incomplete_details": null, "instructions": null, "model": "gpt-5-codex",
               "output": output, "parallel_tool_calls": true, "store": false, "tools": self.tools, "usage": usage})
    }

    /// Appends an event of type `v.type`, numbered next.
    pub fn push(&mut self, mut v: Value) -> &mut Self {
        let kind = v["type"].as_str().unwrap().to_string();
        // `type` first, `sequence_number` second, as the API writes them
        let mut o = serde_json::Map::new();
        o.insert("type".into(), json!(kind));
        o.insert("sequence_number".into(), json!(self.seq));
        for (k, x) in v.as_object_mut().unwrap().iter() {
            if k != "type" {
                o.insert(k.clone(), x.clone());
            }
        }
        self.seq += 1;
        self.events.push(SseEvent {
            event: Some(kind),
            data: Value::Object(o).to_string(),
        });
        self
    }

    fn added(&mut self, i: u64, item: Value) {
        self.push(json!({"type":"response.output_item.added","output_index":i,"item":item}));
    }

    fn done(&mut self, i: u64, item: &Value) {
        self.push(json!({"type":"response.output_item.done","output_index":i,"item":item}));
    }

    /// A reasoning item whose summary arrives as `pieces`; returns the done item.
    pub fn reasoning(&mut self, i: u64, id: &str, pieces: &[&str]) -> Value {
        // `.added` carries no (or a partial) encrypted_content: only `.done` has it whole
        self.added(i, json!({"id": id, "type":"reasoning", "summary": []}));
        self.push(
            json!({"type":"response.reasoning_summary_part.added","item_id":id,"output_index":i,
                         "summary_index":0,"part":{"type":"summary_text","text":""}}),
        );
        for p in pieces {
            self.push(
                json!({"type":"response.reasoning_summary_text.delta","item_id":id,"output_index":i,
                             "summary_index":0,"delta":p}),
            );
        }
        let text = pieces.concat();
        self.push(
            json!({"type":"response.reasoning_summary_text.done","item_id":id,"output_index":i,
                         "summary_index":0,"text":text}),
        );
        self.push(
            json!({"type":"response.reasoning_summary_part.done","item_id":id,"output_index":i,
                         "summary_index":0,"part":{"type":"summary_text","text":text}}),
        );
        let item = json!({"id": id, "type":"reasoning", "encrypted_content": ENC,
                          "summary":[{"type":"summary_text","text":text}]});
        self.done(i, &item);
        item
    }

    /// An assistant message whose text arrives as `pieces`; returns the done item.
    pub fn message(&mut self, i: u64, id: &str, pieces: &[&str]) -> Value {
        self.added(
            i,
            json!({"id": id, "type":"message", "status":"in_progress", "content": [], "role":"assistant"}),
        );
        self.push(json!({"type":"response.content_part.added","item_id":id,"output_index":i,"content_index":0,
                         "part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}}));
        for p in pieces {
            self.push(
                json!({"type":"response.output_text.delta","item_id":id,"output_index":i,
                             "content_index":0,"delta":p,"logprobs":[]}),
            );
        }
        let text = pieces.concat();
        self.push(json!({"type":"response.output_text.done","item_id":id,"output_index":i,"content_index":0,
                         "text":text,"logprobs":[]}));
        let part = json!({"type":"output_text","annotations":[],"logprobs":[],"text":text});
        self.push(json!({"type":"response.content_part.done","item_id":id,"output_index":i,"content_index":0,
                         "part":part}));
        let item = json!({"id": id, "type":"message", "status":"completed", "content": [part],
                          "phase": "final_answer", "role":"assistant"});
        self.done(i, &item);
        item
    }

    /// A function call whose arguments arrive as `pieces`; returns the done item.
    pub fn function_call(&mut self, i: u64, call_id: &str, name: &str, pieces: &[&str]) -> Value {
        let id = format!("fc_{call_id}");
        self.added(
            i,
            json!({"id": id, "type":"function_call", "status":"in_progress", "arguments":"",
                   "call_id": call_id, "name": name}),
        );
        for p in pieces {
            self.push(json!({"type":"response.function_call_arguments.delta","item_id":id,"output_index":i,
                             "delta":p}));
        }
        let args = pieces.concat();
        self.push(
            json!({"type":"response.function_call_arguments.done","item_id":id,"output_index":i,
                         "arguments":args}),
        );
        let item = json!({"id": id, "type":"function_call", "status":"completed", "arguments": args,
                          "call_id": call_id, "name": name});
        self.done(i, &item);
        item
    }

    /// A custom (freeform) tool call whose input arrives as `pieces`; returns the done item.
    pub fn custom_call(&mut self, i: u64, call_id: &str, name: &str, pieces: &[&str]) -> Value {
        let id = format!("ctc_{call_id}");
        self.added(
            i,
            json!({"id": id, "type":"custom_tool_call", "status":"in_progress", "call_id": call_id,
                   "input":"", "name": name}),
        );
        for p in pieces {
            self.push(
                json!({"type":"response.custom_tool_call_input.delta","item_id":id,"output_index":i,
                             "delta":p}),
            );
        }
        let input = pieces.concat();
        self.push(
            json!({"type":"response.custom_tool_call_input.done","item_id":id,"output_index":i,
                         "input":input}),
        );
        let item = json!({"id": id, "type":"custom_tool_call", "status":"completed", "call_id": call_id,
                          "input": input, "name": name});
        self.done(i, &item);
        item
    }

    /// The terminal event: `kind` (`completed`, `incomplete`, `failed`) with `output` and `usage`.
    pub fn end(&mut self, kind: &str, output: Vec<Value>, input: u64, out: u64) -> Vec<SseEvent> {
        let usage = usage(input, out);
        let r = self.response(kind, Value::Array(output), usage);
        self.push(json!({"type": format!("response.{kind}"), "response": r}));
        std::mem::take(&mut self.events)
    }
}

pub fn usage(input: u64, out: u64) -> Value {
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": input / 2},
           "output_tokens": out, "output_tokens_details": {"reasoning_tokens": out / 4},
           "total_tokens": input + out})
}

/// The wire bytes of `events`.
pub fn encode(events: &[SseEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in events {
        if let Some(kind) = &e.event {
            out.extend_from_slice(format!("event: {kind}\n").as_bytes());
        }
        out.extend_from_slice(format!("data: {}\n\n", e.data).as_bytes());
    }
    out
}

/// Parses wire bytes back into events.
pub fn parse(bytes: &[u8]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut v = p.feed(bytes);
    v.extend(p.finish());
    v
}

/// The `data` of events, parsed.
pub fn values(events: &[SseEvent]) -> Vec<Value> {
    events
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap_or(Value::Null))
        .collect()
}
