//! The mock upstream's Anthropic Messages API: a scripted reply rendered as a `message` body or as Anthropic's SSE
//! event sequence, errors in Anthropic's shape, and the deterministic token estimate behind `count_tokens` and the
//! default reply's usage.
//!
//! A stream follows the real API's order: `message_start` (with usage), `ping`, then per content block
//! `content_block_start`, its deltas (`text_delta`; `input_json_delta` in several pieces; `thinking_delta` then
//! `signature_delta`) and `content_block_stop`, then `message_delta` (stop reason, cumulative usage with
//! `input_tokens`) and `message_stop`. A scripted `stream_error` cuts the stream after some blocks with an `error`
//! event, as the API does when it fails after answering 200.

use super::MockReply;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// One scripted Anthropic answer, rendered as JSON or SSE according to the request's `stream` flag.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicReply {
    /// Content blocks in the API's own shape (`text`, `tool_use`, `thinking`, or any other block, sent as is).
    pub content: Vec<Value>,
    /// `stop_reason`; unset: `tool_use` when a block is a `tool_use`, else `end_turn`.
    pub stop_reason: Option<String>,
    /// `usage.input_tokens`; unset: [`estimate_tokens`] of the request.
    pub input_tokens: Option<u64>,
    /// `usage.output_tokens`; unset: an estimate from the content.
    pub output_tokens: Option<u64>,
    /// `usage.cache_read_input_tokens` (prompt tokens read from the cache, beyond `input_tokens`; 0 when unset).
    pub cache_read_input_tokens: u64,
    /// `usage.cache_creation_input_tokens` (prompt tokens written to the cache, beyond `input_tokens`; 0 when
    /// unset).
    pub cache_creation_input_tokens: u64,
    /// `model`; unset: the request's.
    pub model: Option<String>,
    /// The message id; unset: `msg_mock_` and a hash of the request (clients such as Claude Code merge the
    /// blocks of answers that share an id into one message).
    pub id: Option<String>,
    /// In a stream, an `error` event sent after this many content blocks, ending the stream (no `message_delta`
    /// or `message_stop`); a JSON request gets the error as an HTTP error instead.
    pub stream_error: Option<(usize, AnthropicError)>,
    /// Delay between two stream events (or before a JSON answer).
    pub delay: Duration,
}

/// An error in Anthropic's shape: `{"type":"error","error":{"type","message"},"request_id"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicError {
    /// HTTP status of the error answer.
    pub status: u16,
    /// `error.type`, e.g. `overloaded_error`.
    pub kind: String,
    /// `error.message`.
    pub message: String,
}

impl AnthropicError {
    /// An error of `kind` with the status the API gives it (400 for unknown kinds).
    pub fn new(kind: &str, message: &str) -> AnthropicError {
        AnthropicError {
            status: status_of(kind),
            kind: kind.to_string(),
            message: message.to_string(),
        }
    }

    /// The error event of a stream: `{"type":"error","error":{"type","message"}}`.
    pub fn event(&self) -> Value {
        json!({"type": "error", "error": {"type": self.kind, "message": self.message}})
    }

    /// The body of an error answer: the event's fields and a `request_id`.
    pub fn body(&self) -> Value {
        let mut body = self.event();
        body["request_id"] = json!("req_mock");
        body
    }

    /// The error as a whole HTTP answer (with the `request-id` header the API sends).
    pub fn reply(&self) -> MockReply {
        let mut reply = MockReply::json(self.status, self.body());
        if let MockReply::Json { headers, .. } = &mut reply {
            headers.push(("request-id".into(), "req_mock".into()));
        }
        reply
    }

    /// From `{"type", "message", "status"?}` (the status defaults to the one the API gives the type).
    pub fn from_spec(spec: &Value) -> Result<AnthropicError, String> {
        let kind = spec
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("an Anthropic error needs a string \"type\", got {spec}"))?;
        let message = spec.get("message").and_then(Value::as_str).unwrap_or(kind);
        let mut e = AnthropicError::new(kind, message);
        if let Some(s) = spec.get("status") {
            e.status = s
                .as_u64()
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (400..600).contains(s))
                .ok_or_else(|| format!("bad error status {s}"))?;
        }
        Ok(e)
    }
}

/// The HTTP status Anthropic answers an error type with.
fn status_of(kind: &str) -> u16 {
    match kind {
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "api_error" => 500,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => 400,
    }
}

/// A deterministic token estimate of a Messages request: a quarter of the serialized length of its `system`,
/// `messages` and `tools` (at least 1). `count_tokens` answers it, and replies that script no usage report it.
pub fn estimate_tokens(request: &Value) -> u64 {
    let len: usize = ["system", "messages", "tools"]
        .iter()
        .filter_map(|k| request.get(k))
        .map(|v| v.to_string().len())
        .sum();
    (len as u64).div_ceil(4).max(1)
}

impl AnthropicReply {
    /// A reply saying `text`.
    pub fn text(text: &str) -> AnthropicReply {
        AnthropicReply::blocks(vec![json!({"type": "text", "text": text})])
    }

    /// A reply made of `content` blocks, everything else defaulted.
    pub fn blocks(content: Vec<Value>) -> AnthropicReply {
        AnthropicReply {
            content,
            stop_reason: None,
            input_tokens: None,
            output_tokens: None,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
            model: None,
            id: None,
            stream_error: None,
            delay: Duration::ZERO,
        }
    }

    /// A reply calling one tool.
    pub fn tool_use(id: &str, name: &str, input: Value) -> AnthropicReply {
        AnthropicReply::blocks(vec![
            json!({"type": "tool_use", "id": id, "name": name, "input": input}),
        ])
    }

    /// From the value of a `{"anthropic": …}` spec: `content` (a string, or a list of blocks), and optional
    /// `stop_reason`, `usage` (`input_tokens`, `output_tokens`, `cache_read_input_tokens`,
    /// `cache_creation_input_tokens`), `model`, `id`, `stream_error` (`{"after_blocks",
    /// "type", "message", "status"?}`).
    pub fn from_spec(spec: &Value) -> Result<AnthropicReply, String> {
        let o = spec
            .as_object()
            .ok_or_else(|| format!("\"anthropic\" must be an object, got {spec}"))?;
        let content = match o.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(blocks)) => {
                blocks.iter().map(check_block).collect::<Result<_, _>>()?
            }
            _ => {
                return Err("\"anthropic\" needs \"content\": a string or a list of blocks".into())
            }
        };
        let string = |k: &str| -> Result<Option<String>, String> {
            match o.get(k) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(format!("\"{k}\" must be a string, got {other}")),
            }
        };
        let usage = |k: &str| -> Result<Option<u64>, String> {
            match o.get("usage").and_then(|u| u.get(k)) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| format!("usage.{k} must be a count, got {v}")),
            }
        };
        let stream_error = match o.get("stream_error") {
            None => None,
            Some(e) => {
                let after = e.get("after_blocks").and_then(Value::as_u64).unwrap_or(0);
                let after = usize::try_from(after).map_err(|_| "after_blocks is too big")?;
                Some((after, AnthropicError::from_spec(e)?))
            }
        };
        Ok(AnthropicReply {
            content,
            stop_reason: string("stop_reason")?,
            input_tokens: usage("input_tokens")?,
            output_tokens: usage("output_tokens")?,
            cache_read_input_tokens: usage("cache_read_input_tokens")?.unwrap_or(0),
            cache_creation_input_tokens: usage("cache_creation_input_tokens")?.unwrap_or(0),
            model: string("model")?,
            id: string("id")?,
            stream_error,
            delay: Duration::ZERO,
        })
    }

    /// The spec this reply was made from, as `GET /_mock/requests` shows a reply that was never sent.
    pub fn describe(&self) -> Value {
        json!({"anthropic": {"content": self.content, "stop_reason": self.stop_reason}})
    }

    /// The answer to `request`: an SSE stream when it says `"stream": true`, else a `message` body (or, with a
    /// scripted `stream_error`, that error as an HTTP error).
    pub fn render(&self, request: &Value) -> MockReply {
        let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
        if !stream {
            let reply = match &self.stream_error {
                Some((_, e)) => e.reply(),
                None => MockReply::json(200, self.message(request, self.content.clone())),
            };
            return reply.delayed(self.delay);
        }
        let mut events = Vec::new();
        let mut start = self.message(request, Vec::new());
        start["stop_reason"] = Value::Null;
        start["usage"]["output_tokens"] = json!(1);
        events.push((
            "message_start",
            json!({"type": "message_start", "message": start}),
        ));
        events.push(("ping", json!({"type": "ping"})));
        for (index, block) in self.content.iter().enumerate() {
            if let Some((after, e)) = &self.stream_error {
                if *after == index {
                    events.push(("error", e.event()));
                    return sse(events, self.delay);
                }
            }
            block_events(index, block, &mut events);
        }
        if let Some((_, e)) = &self.stream_error {
            events.push(("error", e.event()));
            return sse(events, self.delay);
        }
        let usage = self.usage(request);
        events.push((
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                   "usage": usage}),
        ));
        events.push(("message_stop", json!({"type": "message_stop"})));
        sse(events, self.delay)
    }

    fn stop_reason(&self) -> String {
        self.stop_reason.clone().unwrap_or_else(|| {
            let tool = self.content.iter().any(|b| b["type"] == "tool_use");
            if tool { "tool_use" } else { "end_turn" }.to_string()
        })
    }

    fn usage(&self, request: &Value) -> Value {
        let output = self.output_tokens.unwrap_or_else(|| {
            (Value::Array(self.content.clone()).to_string().len() as u64)
                .div_ceil(4)
                .max(1)
        });
        json!({"input_tokens": self.input_tokens.unwrap_or_else(|| estimate_tokens(request)),
               "cache_creation_input_tokens": self.cache_creation_input_tokens,
               "cache_read_input_tokens": self.cache_read_input_tokens, "output_tokens": output})
    }

    fn message(&self, request: &Value, content: Vec<Value>) -> Value {
        let model = self
            .model
            .clone()
            .or_else(|| {
                request
                    .get("model")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .unwrap_or_else(|| "mock-model".into());
        let id = self.id.clone().unwrap_or_else(|| message_id(request));
        json!({"id": id, "type": "message", "role": "assistant",
               "model": model, "content": content, "stop_reason": self.stop_reason(), "stop_sequence": null,
               "usage": self.usage(request)})
    }
}

/// `msg_mock_` and the FNV-1a hash of the request: the same for the same request, different for the next turn.
fn message_id(request: &Value) -> String {
    let hash = request
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    format!("msg_mock_{hash:016x}")
}

/// A block must be an object with a string `type`; the common types must have their fields.
fn check_block(block: &Value) -> Result<Value, String> {
    let kind = block
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("a content block needs a string \"type\", got {block}"))?;
    let needs: &[&str] = match kind {
        "text" => &["text"],
        "tool_use" => &["id", "name", "input"],
        "thinking" => &["thinking", "signature"],
        _ => &[],
    };
    match needs.iter().find(|k| block.get(**k).is_none()) {
        Some(k) => Err(format!("a {kind} block needs \"{k}\", got {block}")),
        None => Ok(block.clone()),
    }
}

/// The `content_block_start`, deltas and `content_block_stop` of one block.
fn block_events(index: usize, block: &Value, events: &mut Vec<(&'static str, Value)>) {
    let delta = |d: Value| {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": d}),
        )
    };
    let (start, deltas): (Value, Vec<Value>) = match block["type"].as_str() {
        Some("text") => (
            json!({"type": "text", "text": ""}),
            pieces(block["text"].as_str().unwrap_or_default(), 3)
                .into_iter()
                .map(|t| json!({"type": "text_delta", "text": t}))
                .collect(),
        ),
        Some("tool_use") => {
            let mut start = block.clone();
            start["input"] = json!({});
            let input = block["input"].to_string();
            (
                start,
                pieces(&input, 3)
                    .into_iter()
                    .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                    .collect(),
            )
        }
        Some("thinking") => {
            let mut d: Vec<Value> = pieces(block["thinking"].as_str().unwrap_or_default(), 2)
                .into_iter()
                .map(|t| json!({"type": "thinking_delta", "thinking": t}))
                .collect();
            d.push(json!({"type": "signature_delta", "signature": block["signature"]}));
            (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                d,
            )
        }
        _ => (block.clone(), Vec::new()),
    };
    events.push((
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": start}),
    ));
    events.extend(deltas.into_iter().map(delta));
    events.push((
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    ));
}

/// `s` cut into at most `n` non-empty pieces of about equal length (on char boundaries); none for "".
pub(super) fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let size = chars.len().div_ceil(n.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// An SSE reply: `event: <name>` and `data: <json>` per event.
fn sse(events: Vec<(&'static str, Value)>, delay: Duration) -> MockReply {
    MockReply::Sse {
        chunks: events
            .into_iter()
            .map(|(name, data)| {
                (
                    delay,
                    Bytes::from(format!("event: {name}\ndata: {data}\n\n")),
                )
            })
            .collect(),
        stall_after: false,
    }
}

/// The answer to `POST /v1/messages/count_tokens`.
pub fn count_tokens(request: &Value) -> MockReply {
    let mut body = Map::new();
    body.insert("input_tokens".into(), json!(estimate_tokens(request)));
    MockReply::json(200, Value::Object(body))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn events(reply: &MockReply) -> Vec<(String, Value)> {
        let MockReply::Sse { chunks, .. } = reply else {
            panic!("not a stream: {reply:?}")
        };
        chunks
            .iter()
            .map(|(_, b)| {
                let text = std::str::from_utf8(b).unwrap();
                let (event, data) = text.trim_end().split_once('\n').unwrap();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                let event = event.strip_prefix("event: ").unwrap().to_string();
                assert_eq!(
                    data["type"],
                    event.as_str(),
                    "event name and data type agree"
                );
                (event, data)
            })
            .collect()
    }

    #[test]
    fn pieces_cover_the_string_on_char_boundaries() {
        assert_eq!(pieces("abcdefg", 3), ["abc", "def", "g"]);
        assert_eq!(pieces("é✓x", 2), ["é✓", "x"]);
        assert!(pieces("", 3).is_empty());
        assert_eq!(pieces("ab", 3), ["a", "b"]);
    }

    #[test]
    fn a_stream_has_the_real_event_sequence() {
        let reply = AnthropicReply::blocks(vec![
            json!({"type": "thinking", "thinking": "let me think", "signature": "sig=="}),
            json!({"type": "text", "text": "Running it."}),
            json!({"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo hi"}}),
        ]);
        let request = json!({"model": "claude-x", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
        let ev = events(&reply.render(&request));
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..2], ["message_start", "ping"]);
        assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
        let start = &ev[0].1["message"];
        assert_eq!(start["model"], "claude-x");
        assert_eq!(start["content"], json!([]));
        assert_eq!(start["usage"]["input_tokens"], estimate_tokens(&request));
        // thinking: its deltas, then the signature just before the stop
        let of = |i: u64| -> Vec<&Value> {
            ev.iter()
                .filter(|(_, d)| d["index"] == i)
                .map(|(_, d)| d)
                .collect()
        };
        let thinking = of(0);
        assert_eq!(
            thinking[0]["content_block"],
            json!({"type": "thinking", "thinking": "", "signature": ""})
        );
        let n = thinking.len();
        assert_eq!(
            thinking[n - 2]["delta"],
            json!({"type": "signature_delta", "signature": "sig=="})
        );
        assert_eq!(thinking[n - 1]["type"], "content_block_stop");
        let said: String = thinking
            .iter()
            .filter_map(|d| d["delta"]["thinking"].as_str())
            .collect();
        assert_eq!(said, "let me think");
        // tool_use: the input in several partial_json pieces that join to the input
        let tool = of(2);
        assert_eq!(tool[0]["content_block"]["input"], json!({}));
        let parts: Vec<&str> = tool
            .iter()
            .filter_map(|d| d["delta"]["partial_json"].as_str())
            .collect();
        assert!(parts.len() > 1);
        assert_eq!(
            serde_json::from_str::<Value>(&parts.concat()).unwrap(),
            json!({"command": "echo hi"})
        );
        let delta = &ev[ev.len() - 2].1;
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert!(delta["usage"]["input_tokens"].as_u64().unwrap() > 0);
    }

    #[test]
    fn json_answers_carry_the_whole_message() {
        let reply = AnthropicReply::text("hello");
        let request =
            json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(400)}]});
        let MockReply::Json { status, body, .. } = reply.render(&request) else {
            panic!()
        };
        assert_eq!(status, 200);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["content"], json!([{"type": "text", "text": "hello"}]));
        assert_eq!(body["stop_reason"], "end_turn");
        let other = json!({"model": "m", "messages": [{"role": "user", "content": "y"}]});
        let MockReply::Json { body: again, .. } = reply.render(&other) else {
            panic!()
        };
        let again: Value = serde_json::from_slice(&again).unwrap();
        assert!(body["id"].as_str().unwrap().starts_with("msg_mock_"));
        assert_ne!(
            body["id"], again["id"],
            "each turn's message has its own id"
        );
        assert!(
            body["usage"]["input_tokens"].as_u64().unwrap() >= 100,
            "the request's size"
        );
    }

    #[test]
    fn a_stream_error_cuts_the_stream_and_fails_a_json_request() {
        let spec = json!({"content": [{"type": "text", "text": "x"}],
                          "stream_error": {"after_blocks": 1, "type": "overloaded_error", "message": "Overloaded"}});
        let reply = AnthropicReply::from_spec(&spec).unwrap();
        let ev = events(&reply.render(&json!({"stream": true})));
        let (name, data) = ev.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(
            data["error"],
            json!({"type": "overloaded_error", "message": "Overloaded"})
        );
        assert!(ev.iter().any(|(n, _)| n == "content_block_stop"));
        assert!(!ev.iter().any(|(n, _)| n == "message_delta"));
        let MockReply::Json { status, .. } = reply.render(&json!({})) else {
            panic!()
        };
        assert_eq!(status, 529);
    }

    #[test]
    fn scripted_cache_usage_is_reported_in_json_and_in_the_stream() {
        let spec = json!({"content": "x", "usage": {"input_tokens": 12, "cache_read_input_tokens": 3000,
                                                    "cache_creation_input_tokens": 40}});
        let reply = AnthropicReply::from_spec(&spec).unwrap();
        let MockReply::Json { body, .. } = reply.render(&json!({})) else {
            panic!()
        };
        let body: Value = serde_json::from_slice(&body).unwrap();
        let ev = events(&reply.render(&json!({"stream": true})));
        let start = &ev.iter().find(|(n, _)| n == "message_start").unwrap().1;
        let delta = &ev.iter().find(|(n, _)| n == "message_delta").unwrap().1;
        for usage in [&body["usage"], &start["message"]["usage"], &delta["usage"]] {
            assert_eq!(usage["input_tokens"], 12, "{usage}");
            assert_eq!(usage["cache_read_input_tokens"], 3000, "{usage}");
            assert_eq!(usage["cache_creation_input_tokens"], 40, "{usage}");
        }
        let bad = json!({"content": "x", "usage": {"cache_read_input_tokens": -1}});
        assert!(AnthropicReply::from_spec(&bad).is_err());
    }

    #[test]
    fn bad_specs_are_refused() {
        for bad in [
            json!("text"),
            json!({}),
            json!({"content": [{"type": "tool_use", "id": "t"}]}),
            json!({"content": [{"text": "no type"}]}),
            json!({"content": "x", "usage": {"input_tokens": "many"}}),
            json!({"content": "x", "stream_error": {"message": "no type"}}),
        ] {
            assert!(AnthropicReply::from_spec(&bad).is_err(), "{bad}");
        }
        assert_eq!(
            AnthropicError::from_spec(&json!({"type": "rate_limit_error"}))
                .unwrap()
                .status,
            429
        );
    }

    #[test]
    fn the_estimate_grows_with_the_request() {
        let small = json!({"messages": [{"role": "user", "content": "hi"}]});
        let big =
            json!({"messages": [{"role": "user", "content": "hi ".repeat(1000)}], "tools": []});
        assert!(estimate_tokens(&big) > estimate_tokens(&small) + 700);
        assert_eq!(estimate_tokens(&json!({})), 1);
    }
}
