//! The mock's other Responses endpoints: `…/responses/input_tokens`, `…/responses/compact`, and the refusal of
//! `GET …/responses` (Codex's WebSocket upgrade).

use super::super::MockReply;
use super::{compaction_item, complete_item, estimate_tokens, hash, ResponsesError};
use serde_json::{json, Value};

/// The answer to `POST …/responses/input_tokens`.
pub fn input_tokens(request: &Value) -> MockReply {
    MockReply::json(
        200,
        json!({"object": "response.input_tokens", "input_tokens": estimate_tokens(request)}),
    )
}

/// The answer to `POST …/responses/compact`: the input's user messages, then one `compaction` item.
pub fn compact(request: &Value) -> MockReply {
    let mut output: Vec<Value> = match request.get("input") {
        Some(Value::String(s)) => vec![
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": s}]}),
        ],
        Some(Value::Array(items)) => items
            .iter()
            .filter(|i| i.get("role") == Some(&json!("user")))
            .map(|i| match i.get("content") {
                Some(Value::String(s)) => {
                    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": s}]})
                }
                _ => {
                    let mut m = i.clone();
                    m["type"] = json!("message");
                    m
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    output.push(compaction_item(request));
    let output: Vec<Value> = output
        .into_iter()
        .enumerate()
        .map(|(i, item)| complete_item(i, item))
        .collect();
    let input = estimate_tokens(request);
    let out = (Value::Array(output.clone()).to_string().len() as u64)
        .div_ceil(4)
        .max(1);
    MockReply::json(
        200,
        json!({"id": format!("cmp_mock_{:016x}", hash(request)), "object": "response.compaction",
               "created_at": 1_700_000_000, "output": output,
               "usage": {"input_tokens": input,
                         "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                         "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": input + out}}),
    )
}

/// The answer to `GET …/responses` (Codex's WebSocket upgrade): a 404 at once (the mock speaks HTTP only, as a
/// relay without WebSocket support does; Codex retries, then falls back to HTTPS).
pub fn no_websocket() -> MockReply {
    ResponsesError {
        status: 404,
        kind: "invalid_request_error".into(),
        code: Some("not_found".into()),
        message: "WebSocket transport is not supported by this mock".into(),
    }
    .reply()
}
