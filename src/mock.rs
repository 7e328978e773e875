//! An in-process mock of an OpenAI-compatible and Anthropic-compatible upstream: records every request's raw bytes
//! and answers from a script (JSON, SSE with per-chunk delays, HTTP errors, mid-stream errors, stalls; Anthropic
//! Messages answers rendered as JSON or as Anthropic's event stream, see [`anthropic`]; OpenAI Responses answers
//! rendered as JSON or as the Responses event stream, see [`responses`]; Gemini `generateContent`,
//! `streamGenerateContent` and `countTokens` calls answered in Google's shapes, see [`gemini`]). Used by the tests, the
//! benchmarks and `ctxgate mock-upstream`; it never calls a real provider.
//!
//! Tests outside Rust (the client-library suites in `tests/clients/`) script it over HTTP through a small
//! control API that every instance serves beside its `/v1/*` answers (it is never reached through ctxgate,
//! which only forwards `/v1/*`):
//!
//! | request | effect |
//! |---|---|
//! | `POST /_mock/script` | queue replies, answered in order (a JSON list of specs, or one spec; see [`Scripted::from_spec`]) |
//! | `GET /_mock/requests` | every other request so far, in arrival order: `method`, `uri`, `headers`, `body` (JSON or `null`), `raw` (the body as text), `received_ms` (when it arrived, in milliseconds since the Unix epoch) and `reply` (what the mock answered: `status` and `body`, or `sse` with the stream's text) |
//! | `POST /_mock/reset` | forget the queued replies and the recorded requests |
//!
//! A request takes the first queued reply that fits it: an Anthropic reply fits only `POST …/messages` (any query,
//! e.g. `?beta=true`), a Responses reply only `POST …/responses` (one that ends its input with a
//! `compaction_trigger` only when the reply has a `compaction` item), any other reply fits every request but
//! `HEAD`, `…/count_tokens`, `…/input_tokens`, a WebSocket upgrade and `GET …/responses`; a reply scripted with
//! a `model` fits only requests for that model (so a client's side requests to a small model do not take the
//! replies meant for its main loop).
//!
//! With nothing fitting queued, the mock answers by default: the model list for `…/models`; 200 for `HEAD`;
//! a Gemini call (`POST /{v1beta|v1|v1alpha}/models/{model}:{method}`) without an API key gets Google's 403
//! before any scripted reply, and with nothing fitting, `mock reply` (one response, SSE with `alt=sse`, else a
//! JSON array) or `{"totalTokens": N}` for `:countTokens`;
//! `{"input_tokens": N}` for `…/messages/count_tokens` (N from [`estimate_tokens`]); for `…/messages` an Anthropic
//! message saying `mock reply` whose `usage.input_tokens` is the same estimate (JSON, or the event stream when the
//! request says `"stream": true`); for `POST …/responses` a Responses answer saying `mock reply` (usage from
//! [`responses::estimate_tokens`]; exactly one `compaction` item when the input ends with a `compaction_trigger`),
//! as JSON or as the event stream; `{"object": "response.input_tokens", "input_tokens": N}` for
//! `…/responses/input_tokens`; for `…/responses/compact` a `response.compaction` (the input's user messages and
//! one `compaction` item); a 404 in OpenAI's error shape, at once, for `GET …/responses` (Codex's WebSocket
//! upgrade, with or without its `Upgrade` header, which a proxy may drop as hop-by-hop); otherwise a chat completion saying `mock reply` (as JSON, or as an SSE stream
//! when the request says `"stream": true`, with a usage chunk when it asks for `stream_options.include_usage`),
//! whose `usage.prompt_tokens` is the request counted with the model's tokenizer ([`chat_prompt_tokens`]). A conversation request without a string
//! `model` gets a 400 in its API's shape instead, as the real APIs answer it.
//! Multi-turn tool-using runs are scripted turn by turn.

mod anthropic;
pub mod gemini;
pub mod responses;
mod script;

pub use anthropic::{estimate_tokens, AnthropicError, AnthropicReply};
pub use gemini::{GeminiCall, GeminiError, GeminiReply};
pub use responses::{ResponsesError, ResponsesReply};
pub use script::Scripted;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: Method,
    /// Path and query, e.g. `/v1/models?x=1`.
    pub uri: String,
    /// Headers as received.
    pub headers: HeaderMap,
    /// The raw body bytes.
    pub body: Bytes,
}

impl RecordedRequest {
    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }

    /// Whether it asks for a WebSocket upgrade (`Upgrade: websocket`).
    pub fn is_websocket(&self) -> bool {
        self.headers
            .get("upgrade")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
    }
}

/// One scripted reply.
#[derive(Debug, Clone)]
pub enum MockReply {
    /// A whole body.
    Json {
        /// HTTP status.
        status: u16,
        /// Extra response headers.
        headers: Vec<(String, String)>,
        /// The body bytes.
        body: Bytes,
        /// Wait before sending the response headers.
        delay: Duration,
    },
    /// An SSE stream, each chunk sent after its delay.
    Sse {
        /// Raw chunks with the delay before each.
        chunks: Vec<(Duration, Bytes)>,
        /// After the last chunk, keep the connection open without sending anything.
        stall_after: bool,
    },
    /// A 200 streamed body that is not SSE (Gemini's JSON-array stream), each chunk sent after its delay.
    Stream {
        /// The response's `content-type`.
        content_type: String,
        /// Raw chunks with the delay before each.
        chunks: Vec<(Duration, Bytes)>,
    },
    /// A 200 whose body breaks: the chunks are sent, then the connection is reset (no end of body).
    Broken {
        /// The response's `content-type`.
        content_type: String,
        /// Raw chunks with the delay before each.
        chunks: Vec<(Duration, Bytes)>,
    },
}

impl MockReply {
    /// A 200 chat.completion whose message says `text`.
    pub fn completion(text: &str) -> Self {
        Self::message(json!({"role": "assistant", "content": text}), "stop")
    }

    /// A 200 chat.completion carrying `message`.
    pub fn message(message: Value, finish_reason: &str) -> Self {
        Self::message_with_prompt(message, finish_reason, 10)
    }

    /// [`MockReply::message`] whose usage reports `prompt_tokens` (and 5 completion tokens).
    pub fn message_with_prompt(message: Value, finish_reason: &str, prompt_tokens: u64) -> Self {
        Self::json(
            200,
            json!({
                "id": "chatcmpl-mock", "object": "chat.completion", "created": 1_700_000_000, "model": "mock-model",
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": null}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5},
            }),
        )
    }

    /// A JSON reply with any status.
    pub fn json(status: u16, body: Value) -> Self {
        MockReply::Json {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from(body.to_string()),
            delay: Duration::ZERO,
        }
    }

    /// An SSE stream of chat.completion.chunk objects (then `[DONE]`), `delay` before each event.
    pub fn sse_chunks(chunks: &[Value], delay: Duration) -> Self {
        let mut out: Vec<(Duration, Bytes)> = chunks
            .iter()
            .map(|c| (delay, Bytes::from(format!("data: {c}\n\n"))))
            .collect();
        out.push((delay, Bytes::from_static(b"data: [DONE]\n\n")));
        MockReply::Sse {
            chunks: out,
            stall_after: false,
        }
    }

    /// An SSE stream that says `pieces` one content delta at a time, with a usage chunk when `usage` is set.
    pub fn sse_text(pieces: &[&str], usage: bool) -> Self {
        Self::sse_text_with_prompt(pieces, usage.then_some(10))
    }

    /// [`MockReply::sse_text`] whose usage chunk (when `prompt_tokens` is given) reports `prompt_tokens`.
    pub fn sse_text_with_prompt(pieces: &[&str], prompt_tokens: Option<u64>) -> Self {
        let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
        chunks.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None)));
        chunks.push(chunk(json!({}), Some("stop")));
        if let Some(prompt) = prompt_tokens {
            let completion = pieces.len() as u64;
            chunks.push(json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1_700_000_000,
                "model": "mock-model", "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}));
        }
        Self::sse_chunks(&chunks, Duration::ZERO)
    }

    /// Adds a delay before the response headers of a JSON reply (or before the first chunk of a stream).
    pub fn delayed(mut self, d: Duration) -> Self {
        match &mut self {
            MockReply::Json { delay, .. } => *delay = d,
            MockReply::Sse { chunks, .. }
            | MockReply::Stream { chunks, .. }
            | MockReply::Broken { chunks, .. } => {
                if let Some(first) = chunks.first_mut() {
                    first.0 = d;
                }
            }
        }
        self
    }

    /// An SSE stream of chat.completion.chunk objects whose connection is reset after the last one.
    pub fn sse_broken(chunks: &[Value]) -> Self {
        MockReply::Broken {
            content_type: "text/event-stream".into(),
            chunks: chunks
                .iter()
                .map(|c| (Duration::ZERO, Bytes::from(format!("data: {c}\n\n"))))
                .collect(),
        }
    }

    /// A reply from its JSON spec, as `POST /_mock/script` takes it. One of:
    ///
    /// - `{"json": <body>}` or `{"status": 429, "body": <body>}`: a JSON body (`status` defaults to 200);
    /// - `{"sse": [<chunk or raw data string>…], "usage": <usage>}`: an SSE stream, one `data:` event per item,
    ///   then (when `usage` is given) a chunk with no choices carrying it, then `data: [DONE]`.
    ///
    /// Both take optional `"headers": {"name": "value"}` (JSON replies only) and `"delay_ms"` (before the
    /// response headers, or between two stream events).
    pub fn from_spec(spec: &Value) -> Result<MockReply, String> {
        let o = spec
            .as_object()
            .ok_or_else(|| format!("a reply spec must be an object, got {spec}"))?;
        let delay = Duration::from_millis(o.get("delay_ms").and_then(Value::as_u64).unwrap_or(0));
        if let Some(events) = o.get("sse") {
            let events = events.as_array().ok_or("\"sse\" must be a list")?;
            let mut data: Vec<String> = events
                .iter()
                .map(|e| match e {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            if let Some(usage) = o.get("usage") {
                let first = events.iter().find(|e| e.is_object());
                let field = |k: &str, d: Value| first.and_then(|c| c.get(k)).cloned().unwrap_or(d);
                data.push(
                    json!({"id": field("id", json!("chatcmpl-mock")), "object": "chat.completion.chunk",
                        "created": field("created", json!(1_700_000_000)), "model": field("model", json!("mock-model")),
                        "choices": [], "usage": usage})
                    .to_string(),
                );
            }
            data.push("[DONE]".into());
            let chunks = data
                .into_iter()
                .map(|d| (delay, Bytes::from(format!("data: {d}\n\n"))))
                .collect();
            return Ok(MockReply::Sse {
                chunks,
                stall_after: false,
            });
        }
        let body = o
            .get("json")
            .or_else(|| o.get("body"))
            .ok_or("a reply spec needs \"json\", \"body\" or \"sse\"")?;
        let status = match o.get("status") {
            None => 200,
            Some(s) => s
                .as_u64()
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| StatusCode::from_u16(*s).is_ok())
                .ok_or_else(|| format!("bad status {s}"))?,
        };
        let mut reply = MockReply::json(status, body.clone()).delayed(delay);
        reply.add_headers(o.get("headers"))?;
        Ok(reply)
    }

    /// Adds (or replaces) the response headers of a JSON reply from a spec's `"headers": {"name": "value"}`.
    fn add_headers(&mut self, extra: Option<&Value>) -> Result<(), String> {
        if let (MockReply::Json { headers, .. }, Some(extra)) = (self, extra) {
            let extra = extra.as_object().ok_or("\"headers\" must be an object")?;
            for (k, v) in extra {
                let v = v
                    .as_str()
                    .ok_or_else(|| format!("header {k} must be a string"))?;
                headers.retain(|(name, _)| !name.eq_ignore_ascii_case(k));
                headers.push((k.clone(), v.to_string()));
            }
        }
        Ok(())
    }

    /// What this reply sends, as `GET /_mock/requests` shows it: `{"status", "body"}` with the body as text, or
    /// `{"status": 200, "sse"}` with the whole stream as text.
    fn describe(&self) -> Value {
        match self {
            MockReply::Json { status, body, .. } => {
                json!({"status": status, "body": String::from_utf8_lossy(body)})
            }
            MockReply::Sse { chunks, .. } | MockReply::Stream { chunks, .. } => {
                let text: String = chunks
                    .iter()
                    .map(|(_, b)| String::from_utf8_lossy(b))
                    .collect();
                json!({"status": 200, "sse": text})
            }
            MockReply::Broken { chunks, .. } => {
                let text: String = chunks
                    .iter()
                    .map(|(_, b)| String::from_utf8_lossy(b))
                    .collect();
                json!({"status": 200, "broken_after": text})
            }
        }
    }
}

/// `POST /_mock/script`: queues the replies described by the body (a list of specs, or one spec).
async fn control_script(State(state): State<Arc<MockState>>, body: Bytes) -> Response {
    let parsed: Result<Vec<Scripted>, String> = serde_json::from_slice::<Value>(&body)
        .map_err(|e| format!("body is not JSON: {e}"))
        .and_then(|v| match v {
            Value::Array(specs) => specs.iter().map(Scripted::from_spec).collect(),
            one => Scripted::from_spec(&one).map(|r| vec![r]),
        });
    match parsed {
        Ok(replies) => {
            let mut script = state.script.lock();
            script.extend(replies);
            control_json(StatusCode::OK, json!({"queued": script.len()}))
        }
        Err(e) => control_json(StatusCode::BAD_REQUEST, json!({"error": e})),
    }
}

/// `GET /_mock/requests`: every request received (the control API's own excepted) with the reply it got.
async fn control_requests(State(state): State<Arc<MockState>>) -> Response {
    let replies = state.replies.lock().clone();
    let arrivals = state.arrivals.lock().clone();
    let list: Vec<Value> = state
        .requests
        .lock()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let headers: serde_json::Map<String, Value> = r
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        Value::from(String::from_utf8_lossy(v.as_bytes())),
                    )
                })
                .collect();
            json!({"method": r.method.as_str(), "uri": r.uri, "headers": headers, "body": r.json(),
                   "raw": String::from_utf8_lossy(&r.body), "received_ms": arrivals.get(i),
                   "reply": replies.get(i).cloned().unwrap_or(Value::Null)})
        })
        .collect();
    control_json(StatusCode::OK, Value::Array(list))
}

/// `POST /_mock/reset`: forgets queued replies and recorded requests.
async fn control_reset(State(state): State<Arc<MockState>>) -> Response {
    state.script.lock().clear();
    state.requests.lock().clear();
    state.replies.lock().clear();
    state.arrivals.lock().clear();
    control_json(StatusCode::OK, json!({"reset": true}))
}

fn control_json(status: StatusCode, body: Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// A `chat.completion.chunk` with one choice.
pub fn chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "mock-model",
           "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]})
}

/// Computes a reply from the request, for replies that depend on what was sent.
pub type Responder = Arc<dyn Fn(&RecordedRequest) -> Option<MockReply> + Send + Sync>;

#[derive(Default)]
struct MockState {
    script: Mutex<VecDeque<Scripted>>,
    requests: Mutex<Vec<RecordedRequest>>,
    /// What was answered to `requests[i]` (as shown by `GET /_mock/requests`).
    replies: Mutex<Vec<Value>>,
    /// When `requests[i]` arrived, in milliseconds since the Unix epoch.
    arrivals: Mutex<Vec<u64>>,
    responder: Mutex<Option<Responder>>,
    streams_dropped: AtomicUsize,
}

/// A running mock upstream.
#[derive(Clone)]
pub struct MockUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<MockState>,
}

impl MockUpstream {
    /// Starts the mock on `addr` (use port 0 for any free port).
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<MockUpstream> {
        let state = Arc::new(MockState::default());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/_mock/script", post(control_script))
            .route("/_mock/requests", get(control_requests))
            .route("/_mock/reset", post(control_reset))
            .fallback(handle)
            .with_state(state.clone());
        tokio::spawn(async move {
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        Ok(MockUpstream { addr, state })
    }

    /// Starts the mock on a free loopback port.
    pub async fn start() -> std::io::Result<MockUpstream> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// The base URL to configure as `upstream.base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues replies, answered in order.
    pub fn push(&self, reply: MockReply) {
        self.script(Scripted::reply(reply));
    }

    /// Queues an Anthropic reply (rendered as JSON or SSE as the request asks), answered in order.
    pub fn push_anthropic(&self, reply: AnthropicReply) {
        self.script(Scripted::anthropic(reply));
    }

    /// Queues a Gemini reply (rendered as one response, SSE or a JSON-array stream as the call asks), answered in
    /// order; it fits only `POST /{version}/models/{model}:generateContent` and `:streamGenerateContent`.
    pub fn push_gemini(&self, reply: GeminiReply) {
        self.script(Scripted::gemini(reply));
    }

    /// Queues a Responses reply (rendered as JSON or SSE as the request asks), answered in order; it fits only
    /// `POST …/responses`.
    pub fn push_responses(&self, reply: ResponsesReply) {
        self.script(Scripted::responses(reply));
    }

    /// Queues a scripted reply (see [`Scripted`] for which requests it fits).
    pub fn script(&self, scripted: Scripted) {
        self.state.script.lock().push_back(scripted);
    }

    /// Sets a function consulted before the script; `None` from it falls through to the script.
    pub fn set_responder(&self, f: Responder) {
        *self.state.responder.lock() = Some(f);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests.lock().clone()
    }

    /// How many streamed responses were dropped before they ended (the peer closed the connection).
    pub fn streams_dropped(&self) -> usize {
        self.state.streams_dropped.load(Ordering::SeqCst)
    }
}

async fn handle(State(state): State<Arc<MockState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let rec = RecordedRequest {
        method: parts.method.clone(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let index = {
        let mut requests = state.requests.lock();
        let mut arrivals = state.arrivals.lock();
        requests.push(rec.clone());
        arrivals.resize(requests.len() - 1, 0);
        arrivals.push(now);
        requests.len() - 1
    };
    let responder = state.responder.lock().clone();
    let reply = responder
        .and_then(|f| f(&rec))
        .or_else(|| gemini::refusal(&rec))
        .or_else(|| {
            let mut script = state.script.lock();
            let i = script.iter().position(|s| s.fits(&rec))?;
            script.remove(i).map(|s| s.answer(&rec))
        })
        .unwrap_or_else(|| default_reply(&rec));
    {
        let mut replies = state.replies.lock();
        if replies.len() <= index {
            replies.resize(index + 1, Value::Null);
        }
        replies[index] = reply.describe();
    }
    render(reply, state).await
}

fn default_reply(rec: &RecordedRequest) -> MockReply {
    let v = rec.json();
    if rec.method == Method::HEAD {
        return MockReply::Json {
            status: 200,
            headers: Vec::new(),
            body: Bytes::new(),
            delay: Duration::ZERO,
        };
    }
    if rec.is_websocket() || (rec.method == Method::GET && rec.path().ends_with("/responses")) {
        return responses::no_websocket();
    }
    if let Some(call) = GeminiCall::of(rec) {
        return gemini::default_reply(rec, &call);
    }
    if let Some(missing) = missing_model(rec, &v) {
        return missing;
    }
    match rec.path() {
        p if p.ends_with("/messages/count_tokens") => return anthropic::count_tokens(&v),
        p if p.ends_with("/messages") => return AnthropicReply::text("mock reply").render(&v),
        p if p.ends_with("/responses/input_tokens") => return responses::input_tokens(&v),
        p if p.ends_with("/responses/compact") => return responses::compact(&v),
        p if p.ends_with("/responses") && rec.method == Method::POST => {
            let reply = if responses::asks_compaction(&v) {
                ResponsesReply::compaction(&v)
            } else {
                ResponsesReply::text("mock reply")
            };
            return reply.render(&v);
        }
        _ => {}
    }
    if rec.uri.ends_with("/models") {
        return MockReply::json(
            200,
            json!({"object": "list", "data": [{"id": "mock-model", "object": "model", "created": 0, "owned_by": "mock"}]}),
        );
    }
    let prompt_tokens = chat_prompt_tokens(&v);
    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        let usage = v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        MockReply::sse_text_with_prompt(&["mock ", "reply"], usage.then_some(prompt_tokens))
    } else {
        MockReply::message_with_prompt(
            json!({"role": "assistant", "content": "mock reply"}),
            "stop",
            prompt_tokens,
        )
    }
}

/// A chat request's prompt tokens as a real API would report them: counted with the model's tokenizer as the
/// gateway counts a request (its messages, tools and the reply's priming), so that a gateway calibrating against
/// the mock learns a ratio of 1 rather than a mock's artefact.
pub fn chat_prompt_tokens(request: &Value) -> u64 {
    use crate::context::tokens::{Encoding, TokenCounter};
    static COUNTER: std::sync::LazyLock<TokenCounter> = std::sync::LazyLock::new(TokenCounter::new);
    let enc = Encoding::for_model(request.get("model").and_then(Value::as_str).unwrap_or(""));
    let messages = request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    COUNTER.request_tokens(enc, messages, request.get("tools"))
}

/// A conversation request (chat completions, Messages, Responses, and their token counts) without a string
/// `model`: answered 400 in the API's own shape and words, as the real APIs answer it.
fn missing_model(rec: &RecordedRequest, v: &Value) -> Option<MockReply> {
    if rec.method != Method::POST || v.get("model").is_some_and(Value::is_string) {
        return None;
    }
    let path = rec.path();
    if path.ends_with("/messages") || path.ends_with("/messages/count_tokens") {
        return Some(MockReply::json(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "model: Field required"}}),
        ));
    }
    let openai = |message: &str| {
        Some(MockReply::json(
            400,
            json!({"error": {"message": message, "type": "invalid_request_error", "param": "model",
                             "code": "missing_required_parameter"}}),
        ))
    };
    if path.ends_with("/chat/completions") {
        return openai("you must provide a model parameter");
    }
    if path.ends_with("/responses") || path.ends_with("/responses/input_tokens") {
        return openai("Missing required parameter: 'model'.");
    }
    None
}

struct DropFlag(Arc<MockState>, bool);

impl DropFlag {
    fn complete(&mut self) {
        self.1 = true;
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.streams_dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn render(reply: MockReply, state: Arc<MockState>) -> Response {
    match reply {
        MockReply::Json {
            status,
            headers,
            body,
            delay,
        } => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut b =
                Response::builder().status(StatusCode::from_u16(status).unwrap_or(StatusCode::OK));
            for (k, v) in headers {
                b = b.header(k, v);
            }
            b.body(Body::from(body))
                .unwrap_or_else(|_| Response::new(Body::empty()))
        }
        MockReply::Stream {
            content_type,
            chunks,
        } => stream_body(chunks, false, &content_type, state),
        MockReply::Sse {
            chunks,
            stall_after,
        } => stream_body(chunks, stall_after, "text/event-stream", state),
        MockReply::Broken {
            content_type,
            chunks,
        } => {
            let sent = futures_util::stream::iter(chunks).then(|(d, b)| async move {
                if !d.is_zero() {
                    tokio::time::sleep(d).await;
                }
                Ok::<Bytes, std::io::Error>(b)
            });
            let reset = futures_util::stream::once(async {
                // Let the chunks go out first: the error makes the server drop the connection at once.
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "mock: connection reset",
                ))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", content_type)
                .body(Body::from_stream(sent.chain(reset)))
                .unwrap_or_else(|_| Response::new(Body::empty()))
        }
    }
}

/// A 200 whose body is `chunks`, each sent after its delay (then, with `stall_after`, nothing more and no end);
/// a stream the peer drops before its end is counted in `streams_dropped`.
fn stream_body(
    chunks: Vec<(Duration, Bytes)>,
    stall_after: bool,
    content_type: &str,
    state: Arc<MockState>,
) -> Response {
    let flag = DropFlag(state, false);
    let stream = futures_util::stream::unfold(
        (chunks.into_iter(), flag),
        move |(mut it, mut flag)| async move {
            match it.next() {
                Some((d, b)) => {
                    if !d.is_zero() {
                        tokio::time::sleep(d).await;
                    }
                    Some((Ok::<Bytes, std::io::Error>(b), (it, flag)))
                }
                None if stall_after => {
                    std::future::pending::<()>().await;
                    None
                }
                None => {
                    flag.complete();
                    None
                }
            }
        },
    );
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
