//! The mock upstream's OpenAI Responses API: a scripted reply rendered as a `response` body or as the API's SSE
//! event sequence, errors in OpenAI's shape, `…/responses/input_tokens`, `…/responses/compact`, and Codex's
//! `compaction_trigger` (answered with exactly one `compaction` item).
//!
//! A stream follows the real API's order: `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its own events (a message's `content_part.added`, `output_text.delta`s,
//! `output_text.done`, `content_part.done`; a function call's `function_call_arguments.delta`s in pieces and
//! `.done`; a reasoning item's `reasoning_summary_part.added`, `reasoning_summary_text.delta`/`.done`,
//! `reasoning_summary_part.done`; a custom tool call's `custom_tool_call_input.delta`/`.done`) and
//! `response.output_item.done`, then `response.completed` carrying the whole `response` with its `output` and
//! `usage`. Every event has a `sequence_number` (from 0, one per event); item events have `output_index` and
//! `item_id`. A scripted failure cuts the stream after some items with an `error` event or a `response.failed`.

mod endpoints;
mod stream;

pub use endpoints::{compact, input_tokens, no_websocket};

use super::MockReply;
use serde_json::{json, Value};
use std::time::Duration;
use stream::{item_events, Events};

/// One scripted Responses answer, rendered as JSON or SSE according to the request's `stream` flag.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesReply {
    /// Output items in the API's shape, ids and statuses filled in (see [`ResponsesReply::from_spec`]).
    pub output: Vec<Value>,
    /// `usage.input_tokens`; unset: [`estimate_tokens`] of the request.
    pub input_tokens: Option<u64>,
    /// `usage.input_tokens_details.cached_tokens` (0 when unset).
    pub cached_tokens: u64,
    /// `usage.output_tokens`; unset: an estimate from the output.
    pub output_tokens: Option<u64>,
    /// `usage.output_tokens_details.reasoning_tokens` (0 when unset).
    pub reasoning_tokens: u64,
    /// `model`; unset: the request's.
    pub model: Option<String>,
    /// The response id; unset: `resp_mock_` and a hash of the request.
    pub id: Option<String>,
    /// In a stream, a failure after this many output items: an `error` event, or (`failed`) a `response.failed`
    /// event carrying the response with the error; the `error` event has `code`, `message` and `param`, and the same in
    /// an `error` object as OpenAI's error bodies; a JSON request gets the error as an HTTP error instead.
    pub failure: Option<Failure>,
    /// Delay between two stream events (or before a JSON answer).
    pub delay: Duration,
}

/// A scripted failure of a Responses answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Output items sent before it.
    pub after_items: usize,
    /// `response.failed` (true) or an `error` event (false).
    pub failed: bool,
    /// The error.
    pub error: ResponsesError,
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesError {
    /// HTTP status of the error answer.
    pub status: u16,
    /// `error.type`, e.g. `invalid_request_error`.
    pub kind: String,
    /// `error.code`, e.g. `context_length_exceeded` (may be absent).
    pub code: Option<String>,
    /// `error.message`.
    pub message: String,
}

impl ResponsesError {
    /// From `{"type"?, "code"?, "message", "status"?}`: `type` defaults from the code (`server_error` for
    /// `server_error`, `rate_limit_exceeded` → `requests`, else `invalid_request_error`), the status from both.
    pub fn from_spec(spec: &Value) -> Result<ResponsesError, String> {
        let text = |k: &str| spec.get(k).and_then(Value::as_str).map(String::from);
        let code = text("code");
        let kind = text("type");
        if code.is_none() && kind.is_none() {
            return Err(format!(
                "a Responses error needs a string \"code\" or \"type\", got {spec}"
            ));
        }
        let kind = kind.unwrap_or_else(|| match code.as_deref() {
            Some("server_error") => "server_error".into(),
            Some("rate_limit_exceeded") => "requests".into(),
            _ => "invalid_request_error".into(),
        });
        let message = text("message").unwrap_or_else(|| code.clone().unwrap_or(kind.clone()));
        let status = match spec.get("status") {
            None => status_of(&kind, code.as_deref()),
            Some(s) => s
                .as_u64()
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (400..600).contains(s))
                .ok_or_else(|| format!("bad error status {s}"))?,
        };
        Ok(ResponsesError {
            status,
            kind,
            code,
            message,
        })
    }

    /// The body of an error answer.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": null, "code": self.code}})
    }

    /// The error as a whole HTTP answer.
    pub fn reply(&self) -> MockReply {
        let mut reply = MockReply::json(self.status, self.body());
        if let MockReply::Json { headers, .. } = &mut reply {
            headers.push(("x-request-id".into(), "req_mock".into()));
        }
        reply
    }
}

/// The HTTP status OpenAI answers an error with.
fn status_of(kind: &str, code: Option<&str>) -> u16 {
    match (kind, code) {
        (_, Some("rate_limit_exceeded" | "insufficient_quota")) | ("requests" | "tokens", _) => 429,
        (_, Some("invalid_api_key")) | ("authentication_error", _) => 401,
        ("permission_error", _) => 403,
        ("not_found_error", _) => 404,
        ("server_error", _) => 500,
        _ => 400,
    }
}

/// A deterministic token estimate of a Responses request: a quarter of the serialized length of its
/// `instructions`, `input` and `tools` (at least 1). `input_tokens` answers it, and replies that script no usage
/// report it.
pub fn estimate_tokens(request: &Value) -> u64 {
    let len: usize = ["instructions", "input", "tools"]
        .iter()
        .filter_map(|k| request.get(k))
        .map(|v| v.to_string().len())
        .sum();
    (len as u64).div_ceil(4).max(1)
}

/// Whether the request's last input item is a `compaction_trigger` (Codex's remote compaction v2).
pub fn asks_compaction(request: &Value) -> bool {
    request
        .get("input")
        .and_then(Value::as_array)
        .and_then(|items| items.last())
        .and_then(|i| i.get("type"))
        == Some(&json!("compaction_trigger"))
}

/// The FNV-1a hash of `v`'s serialization: the same for the same value, different for another.
fn hash(v: &Value) -> u64 {
    v.to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

impl ResponsesReply {
    /// A reply saying `text`.
    pub fn text(text: &str) -> ResponsesReply {
        ResponsesReply::items(vec![message(text)])
    }

    /// A reply made of `output` items (completed with [`complete_item`]), everything else defaulted.
    pub fn items(output: Vec<Value>) -> ResponsesReply {
        ResponsesReply {
            output: output
                .into_iter()
                .enumerate()
                .map(|(i, item)| complete_item(i, item))
                .collect(),
            input_tokens: None,
            cached_tokens: 0,
            output_tokens: None,
            reasoning_tokens: 0,
            model: None,
            id: None,
            failure: None,
            delay: Duration::ZERO,
        }
    }

    /// A reply calling one function tool.
    pub fn function_call(call_id: &str, name: &str, arguments: &Value) -> ResponsesReply {
        ResponsesReply::items(vec![
            json!({"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments.to_string()}),
        ])
    }

    /// The reply to a `compaction_trigger`: exactly one `compaction` item.
    pub fn compaction(request: &Value) -> ResponsesReply {
        ResponsesReply::items(vec![compaction_item(request)])
    }

    /// From the value of a `{"responses": …}` spec: `output` (a string, or a list of items: `message` items may
    /// give `text` instead of `content`, `function_call` items an object as `arguments`; ids and statuses are
    /// filled in), and optional `usage` (`input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens`,
    /// `output_tokens_details.reasoning_tokens`), `model`, `id`, `error` (`{"after_items", "code", "type",
    /// "message", "status"?}`: an `error` event) or `failed` (the same fields: a `response.failed` event).
    pub fn from_spec(spec: &Value) -> Result<ResponsesReply, String> {
        let o = spec
            .as_object()
            .ok_or_else(|| format!("\"responses\" must be an object, got {spec}"))?;
        let output = match o.get("output") {
            Some(Value::String(s)) => vec![message(s)],
            Some(Value::Array(items)) => items.iter().map(check_item).collect::<Result<_, _>>()?,
            _ => return Err("\"responses\" needs \"output\": a string or a list of items".into()),
        };
        let mut reply = ResponsesReply::items(output);
        let string = |k: &str| -> Result<Option<String>, String> {
            match o.get(k) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(format!("\"{k}\" must be a string, got {other}")),
            }
        };
        let count = |path: &str| -> Result<Option<u64>, String> {
            match o.get("usage").and_then(|u| u.pointer(path)) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| format!("usage{path} must be a count, got {v}")),
            }
        };
        reply.input_tokens = count("/input_tokens")?;
        reply.output_tokens = count("/output_tokens")?;
        reply.cached_tokens = count("/input_tokens_details/cached_tokens")?.unwrap_or(0);
        reply.reasoning_tokens = count("/output_tokens_details/reasoning_tokens")?.unwrap_or(0);
        reply.model = string("model")?;
        reply.id = string("id")?;
        for (key, failed) in [("error", false), ("failed", true)] {
            if let Some(e) = o.get(key) {
                let after = e.get("after_items").and_then(Value::as_u64).unwrap_or(0);
                let after_items = usize::try_from(after).map_err(|_| "after_items is too big")?;
                reply.failure = Some(Failure {
                    after_items,
                    failed,
                    error: ResponsesError::from_spec(e)?,
                });
            }
        }
        Ok(reply)
    }

    /// Whether one of its items is a `compaction`.
    pub fn compacts(&self) -> bool {
        self.output.iter().any(|i| i["type"] == "compaction")
    }

    /// The answer to `request`: the event stream when it says `"stream": true`, else a `response` body (or, with
    /// a scripted failure, that error as an HTTP error).
    pub fn render(&self, request: &Value) -> MockReply {
        let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
        if !stream {
            let reply = match &self.failure {
                Some(f) => f.error.reply(),
                None => MockReply::json(200, self.response(request, "completed", &self.output)),
            };
            return reply.delayed(self.delay);
        }
        let mut events = Events::default();
        let start = self.response(request, "in_progress", &[]);
        events.push("response.created", json!({"response": start}));
        events.push("response.in_progress", json!({"response": start}));
        for (index, item) in self.output.iter().enumerate() {
            if let Some(f) = self.failure.as_ref().filter(|f| f.after_items == index) {
                return self.fail(request, f, index, events);
            }
            item_events(index, item, &mut events);
        }
        if let Some(f) = &self.failure {
            return self.fail(request, f, self.output.len(), events);
        }
        let done = self.response(request, "completed", &self.output);
        events.push("response.completed", json!({"response": done}));
        events.reply(self.delay)
    }

    fn fail(&self, request: &Value, f: &Failure, sent: usize, mut events: Events) -> MockReply {
        if f.failed {
            let mut response = self.response(request, "failed", &self.output[..sent]);
            response["error"] = json!({"code": f.error.code.clone().unwrap_or(f.error.kind.clone()),
                                       "message": f.error.message});
            events.push("response.failed", json!({"response": response}));
        } else {
            // The fields of the SDK's `ResponseErrorEvent`, and the same as an `error` object (what the SDK's
            // stream reader looks for to raise).
            let mut event = f.error.body();
            event["code"] = json!(f.error.code);
            event["message"] = json!(f.error.message);
            event["param"] = Value::Null;
            events.push("error", event);
        }
        events.reply(self.delay)
    }

    fn usage(&self, request: &Value) -> Value {
        let input = self
            .input_tokens
            .unwrap_or_else(|| estimate_tokens(request));
        let output = self.output_tokens.unwrap_or_else(|| {
            (Value::Array(self.output.clone()).to_string().len() as u64)
                .div_ceil(4)
                .max(1)
        });
        json!({"input_tokens": input,
               "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
               "output_tokens": output,
               "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
               "total_tokens": input + output})
    }

    /// The `response` object with `status` and `output`.
    fn response(&self, request: &Value, status: &str, output: &[Value]) -> Value {
        let field = |k: &str, d: Value| request.get(k).cloned().unwrap_or(d);
        let model = self
            .model
            .clone()
            .map(Value::from)
            .unwrap_or_else(|| field("model", json!("mock-model")));
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| format!("resp_mock_{:016x}", hash(request)));
        let completed = status == "completed";
        json!({"id": id, "object": "response", "created_at": 1_700_000_000,
               "status": status, "background": false, "error": null, "incomplete_details": null,
               "instructions": field("instructions", Value::Null),
               "max_output_tokens": field("max_output_tokens", Value::Null),
               "model": model, "output": output,
               "parallel_tool_calls": field("parallel_tool_calls", json!(true)),
               "previous_response_id": field("previous_response_id", Value::Null),
               "prompt_cache_key": field("prompt_cache_key", Value::Null),
               "reasoning": {"effort": null, "summary": null},
               "temperature": 1.0,
               "text": {"format": {"type": "text"}},
               "tool_choice": field("tool_choice", json!("auto")), "tools": field("tools", json!([])),
               "top_p": 1.0, "truncation": "disabled",
               "usage": if completed { self.usage(request) } else { Value::Null },
               "metadata": field("metadata", json!({}))})
    }
}

/// An assistant `message` item saying `text`.
fn message(text: &str) -> Value {
    json!({"type": "message", "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// A `compaction` item whose opaque content depends on the request's input.
fn compaction_item(request: &Value) -> Value {
    let input = request.get("input").cloned().unwrap_or(Value::Null);
    json!({"type": "compaction", "encrypted_content": format!("gAAAA-mock-compaction-{:016x}", hash(&input))})
}

/// An item as the API sends it: an `id` (`msg_`, `fc_`, `rs_`, `ctc_`, `cmp_` or `item_` and the index) and a
/// `status` where the type has one, unless given.
pub fn complete_item(index: usize, mut item: Value) -> Value {
    let kind = item["type"].as_str().unwrap_or_default().to_string();
    let prefix = match kind.as_str() {
        "message" => "msg",
        "function_call" => "fc",
        "reasoning" => "rs",
        "custom_tool_call" => "ctc",
        "compaction" => "cmp",
        _ => "item",
    };
    if let Some(o) = item.as_object_mut() {
        o.entry("id")
            .or_insert_with(|| json!(format!("{prefix}_mock_{index}")));
        if matches!(
            kind.as_str(),
            "message" | "function_call" | "custom_tool_call"
        ) {
            o.entry("status").or_insert_with(|| json!("completed"));
        }
        if kind == "reasoning" {
            o.entry("summary").or_insert_with(|| json!([]));
        }
    }
    item
}

/// An item must be an object with a string `type`; the common types must have their fields (a `message` may give
/// `text`, a `function_call` an object as `arguments`).
fn check_item(item: &Value) -> Result<Value, String> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("an output item needs a string \"type\", got {item}"))?;
    let mut item = item.clone();
    if kind == "message" && item.get("content").is_none() {
        if let Some(text) = item.get("text").and_then(Value::as_str) {
            let mut m = message(text);
            if let Some(phase) = item.get("phase") {
                m["phase"] = phase.clone();
            }
            item = m;
        }
    }
    if kind == "function_call" && item.get("arguments").is_some_and(Value::is_object) {
        item["arguments"] = json!(item["arguments"].to_string());
    }
    let needs: &[&str] = match kind {
        "message" => &["content"],
        "function_call" => &["call_id", "name", "arguments"],
        "custom_tool_call" => &["call_id", "name", "input"],
        "compaction" => &["encrypted_content"],
        _ => &[],
    };
    match needs.iter().find(|k| item.get(**k).is_none()) {
        Some(k) => Err(format!("a {kind} item needs \"{k}\", got {item}")),
        None => Ok(item),
    }
}

#[cfg(test)]
mod tests;
