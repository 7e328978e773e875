//! Test fixtures: Anthropic Messages SSE events as the API sends them (shapes from its streaming reference).

use crate::sse::{SseEvent, SseParser};
use serde_json::{json, Value};

/// One event, its `event:` field set from the data's `type`.
pub fn ev(v: Value) -> SseEvent {
    SseEvent {
        event: v.get("type").and_then(Value::as_str).map(str::to_string),
        data: v.to_string(),
    }
}

pub fn message_start(id: &str, input_tokens: u64) -> Vec<SseEvent> {
    vec![ev(json!({"type":"message_start","message":{
        "id": id, "type":"message", "role":"assistant", "model":"claude-sonnet-4-5", "content":[],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 100, "output_tokens": 1, "service_tier": "standard"}}}))]
}

pub fn ping() -> Vec<SseEvent> {
    vec![ev(json!({"type":"ping"}))]
}

fn start(i: u64, block: Value) -> SseEvent {
    ev(json!({"type":"content_block_start","index":i,"content_block":block}))
}

fn delta(i: u64, d: Value) -> SseEvent {
    ev(json!({"type":"content_block_delta","index":i,"delta":d}))
}

fn stop(i: u64) -> SseEvent {
    ev(json!({"type":"content_block_stop","index":i}))
}

pub fn text_block(i: u64, pieces: &[&str]) -> Vec<SseEvent> {
    let mut v = vec![start(i, json!({"type":"text","text":""}))];
    v.extend(
        pieces
            .iter()
            .map(|p| delta(i, json!({"type":"text_delta","text":p}))),
    );
    v.push(stop(i));
    v
}

pub fn thinking_block(i: u64, pieces: &[&str], signature: &str) -> Vec<SseEvent> {
    let mut v = vec![start(
        i,
        json!({"type":"thinking","thinking":"","signature":""}),
    )];
    v.extend(
        pieces
            .iter()
            .map(|p| delta(i, json!({"type":"thinking_delta","thinking":p}))),
    );
    v.push(delta(
        i,
        json!({"type":"signature_delta","signature":signature}),
    ));
    v.push(stop(i));
    v
}

/// A tool_use block whose input arrives as `json_pieces` (the concatenation is the input's JSON).
pub fn tool_block(i: u64, id: &str, name: &str, json_pieces: &[&str]) -> Vec<SseEvent> {
    let mut v = vec![start(
        i,
        json!({"type":"tool_use","id":id,"name":name,"input":{}}),
    )];
    v.push(delta(
        i,
        json!({"type":"input_json_delta","partial_json":""}),
    ));
    v.extend(
        json_pieces
            .iter()
            .map(|p| delta(i, json!({"type":"input_json_delta","partial_json":p}))),
    );
    v.push(stop(i));
    v
}

pub fn message_end(stop_reason: &str, output_tokens: u64) -> Vec<SseEvent> {
    vec![
        ev(
            json!({"type":"message_delta","delta":{"stop_reason":stop_reason,"stop_sequence":null},
                  "usage":{"output_tokens":output_tokens}}),
        ),
        ev(json!({"type":"message_stop"})),
    ]
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
