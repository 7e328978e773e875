//! Recall rounds: when a rewritten request offered the recall tools and the model calls them, ctxgate answers the
//! calls from the session's history, asks the upstream again, and returns one ordinary answer (JSON) or one
//! continuous SSE stream; the client never sees the injected tools.

use crate::app::AppState;
use crate::context::splice_messages;
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::{RecallOutcome, RecallTool};
use crate::recall::{
    answer_call_with_outcome, merge_usage, strip_injected, Answered, HistorySource, InjectedNames,
    RoundEnd, StreamSplicer,
};
use crate::relay::{Finisher, RelayOutcome};
use crate::sse::{AssembledReply, MessageAssembler, SseParser};
use crate::upstream::map_reqwest_error;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Method};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Largest upstream JSON body read for a recall round: the relay's bound.
const MAX_ROUND_BODY: usize = crate::relay::MAX_TAPPED_JSON;

/// One request's recall rounds.
pub struct Rounds {
    /// The gateway.
    pub state: Arc<AppState>,
    /// Where and how to send the follow-up requests.
    pub url: String,
    /// Headers for the follow-up requests.
    pub headers: HeaderMap,
    /// The first request's body as sent (with the injected tools).
    pub sent: Bytes,
    /// Offset in `sent` of the `]` closing its messages.
    pub messages_close: usize,
    /// What each round appended to its messages (assistant calls, ctxgate's answers); empty at first.
    pub appended: Vec<Value>,
    /// What recall and search may read.
    pub source: HistorySource,
    /// Called once with the client-visible reply: records it before the last bytes are released.
    pub finisher: Finisher,
    /// Receives each round's exchange (assistant call + ctxgate's answers) for the session's internal records.
    pub on_round: Box<dyn Fn(Value) + Send + Sync>,
}

impl Rounds {
    fn names(&self) -> InjectedNames {
        InjectedNames::from_config(&self.state.config.recall)
    }

    /// Answers the injected calls of `assistant` and appends the exchange to the next request.
    fn answer(&mut self, round: u32, assistant: Value, calls: &[Value]) {
        let names = self.names();
        let metrics = &self.state.metrics;
        metrics.recall_round(Dialect::Chat);
        let results: Vec<Value> = calls
            .iter()
            .map(|c| {
                let (content, answered) =
                    answer_call_with_outcome(c, &names, &self.source, &self.state.config.recall);
                let search = c.pointer("/function/name").and_then(Value::as_str)
                    == Some(names.search.as_str());
                metrics.recall_call(
                    Dialect::Chat,
                    if search {
                        RecallTool::Search
                    } else {
                        RecallTool::Recall
                    },
                    match answered {
                        Answered::Found => RecallOutcome::Found,
                        Answered::NotFound => RecallOutcome::NotFound,
                        Answered::Error => RecallOutcome::Error,
                    },
                );
                json!({"role": "tool", "tool_call_id": c.get("id").cloned().unwrap_or(Value::Null),
                       "content": content})
            })
            .collect();
        (self.on_round)(json!({"round": round, "assistant": assistant, "results": results}));
        self.appended.push(assistant);
        self.appended.extend(results);
    }

    /// The next round's body: the first one with the rounds' messages spliced in where its messages end (no
    /// parsing).
    fn next_body(&self) -> Result<Bytes, GatewayError> {
        splice_messages(&self.sent, self.messages_close, &self.appended)
            .map(Bytes::from)
            .ok_or_else(|| {
                GatewayError::Internal("recall round body: messages offset is off".into())
            })
    }

    /// The next round's request (built now, so the future holds no borrow of `self`).
    fn send(
        &self,
    ) -> impl std::future::Future<Output = Result<reqwest::Response, GatewayError>> + Send + 'static
    {
        let body = self.next_body();
        let (state, url, headers) = (self.state.clone(), self.url.clone(), self.headers.clone());
        async move {
            state
                .upstream
                .send(Method::POST, &url, headers, body?.into())
                .await
        }
    }

    /// Non-streaming: reads each answer whole; returns the final body (and the status and headers of the round it
    /// came from). `first` is the first round's successful response.
    pub async fn json(mut self, first: reqwest::Response) -> (http::StatusCode, HeaderMap, Bytes) {
        let names = self.names();
        let max_rounds = self.state.config.recall.max_rounds;
        let (mut status, mut headers) = (first.status(), first.headers().clone());
        let idle = self.state.upstream.timeout();
        let mut body = read_body(first, idle).await;
        let mut usage = None;
        let mut first_id = None;
        let mut last_good: Option<Value> = None;
        let mut round = 0;
        let final_value = loop {
            let parsed = body
                .as_ref()
                .ok()
                .filter(|_| status.is_success())
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                .filter(|v| v.pointer("/choices/0/message").is_some());
            let Some(mut v) = parsed else {
                // A failed follow-up: give the last good answer, without our calls.
                match last_good.take() {
                    Some(v) => break v,
                    None => {
                        let (status, raw) = match body {
                            Ok(raw) => (status, raw),
                            Err(e) => {
                                let err = GatewayError::UpstreamUnreachable(e);
                                headers = HeaderMap::new();
                                headers.insert(
                                    http::header::CONTENT_TYPE,
                                    http::HeaderValue::from_static("application/json"),
                                );
                                (err.status(), Bytes::from(err.body().to_string()))
                            }
                        };
                        self.finish(&raw, None).await;
                        return (status, headers, raw);
                    }
                }
            };
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                merge_usage(&mut usage, u);
            }
            first_id.get_or_insert_with(|| v.get("id").cloned().unwrap_or(Value::Null));
            let message = v
                .pointer("/choices/0/message")
                .cloned()
                .unwrap_or(Value::Null);
            let calls: Vec<Value> = names
                .injected_calls(&message)
                .into_iter()
                .cloned()
                .collect();
            if calls.is_empty() || round >= max_rounds {
                break v;
            }
            round += 1;
            let mut assistant = message.clone();
            assistant["tool_calls"] = Value::Array(calls.clone());
            self.answer(round, assistant, &calls);
            if let Some(o) = v.as_object_mut() {
                o.remove("usage");
            }
            last_good = Some(v);
            match self.send().await {
                Ok(r) => {
                    (status, headers) = (r.status(), r.headers().clone());
                    body = read_body(r, idle).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, round, "recall: follow-up request failed; answering with the last reply");
                    body = Err(e.to_string());
                }
            }
        };
        let out = finalize(final_value, &names, usage, first_id);
        let raw = Bytes::from(serde_json::to_vec(&out).unwrap_or_default());
        self.finish(&raw, None).await;
        (http::StatusCode::OK, headers, raw)
    }

    async fn finish(&mut self, body: &[u8], error: Option<String>) {
        let f = std::mem::replace(&mut self.finisher, Box::new(|_| Box::pin(async {})));
        let reply = MessageAssembler::from_completion_body(body);
        f(outcome(reply, false, error, body.len() as u64, None)).await;
    }

    /// Streaming: relays every round into one client stream (see `StreamSplicer`). Returns the body stream.
    pub fn stream(
        self,
        first: reqwest::Response,
        include_usage: bool,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(32);
        let tasks = self.state.tasks.clone();
        tasks.spawn(self.drive(first, include_usage, tx));
        futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
    }

    async fn drive(
        mut self,
        first: reqwest::Response,
        include_usage: bool,
        tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    ) {
        let names = self.names();
        let max_rounds = self.state.config.recall.max_rounds;
        let idle = self.state.upstream.timeout();
        let mut splicer = StreamSplicer::new(names, include_usage);
        let mut seen = MessageAssembler::new();
        let (mut bytes, mut first_byte_at) = (0u64, None);
        let mut resp = first;
        let mut round = 0;
        loop {
            let mut parser = SseParser::new();
            let mut upstream = resp.bytes_stream();
            let mut error = None;
            loop {
                let chunk = match tokio::time::timeout(idle, upstream.next()).await {
                    Ok(Some(Ok(c))) => c,
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        error = Some(map_reqwest_error(&e, idle));
                        break;
                    }
                    Err(_) => {
                        error = Some(GatewayError::UpstreamTimeout(idle.as_secs()));
                        break;
                    }
                };
                first_byte_at.get_or_insert_with(Instant::now);
                for ev in parser.feed(&chunk) {
                    let data = ev.data.trim();
                    if data == "[DONE]" || data.is_empty() {
                        continue;
                    }
                    let Ok(v) = serde_json::from_str::<Value>(data) else {
                        continue;
                    };
                    for out in splicer.on_chunk(v) {
                        seen.on_chunk(&out);
                        let b = sse(&out);
                        bytes += b.len() as u64;
                        if tx.send(Ok(b)).await.is_err() {
                            return self.gone(seen, bytes, first_byte_at).await;
                        }
                    }
                }
            }
            if let Some(ev) = parser.finish() {
                if let Ok(v) = serde_json::from_str::<Value>(ev.data.trim()) {
                    for out in splicer.on_chunk(v) {
                        seen.on_chunk(&out);
                        let _ = tx.send(Ok(sse(&out))).await;
                    }
                }
            }
            round += 1;
            let rounds_left = error.is_none() && round <= max_rounds;
            match splicer.end_round(rounds_left) {
                RoundEnd::Continue { assistant, calls } => {
                    self.answer(round, assistant, &calls);
                    match self.send().await {
                        Ok(r) if r.status().is_success() => resp = r,
                        Ok(r) => {
                            tracing::warn!(
                                status = r.status().as_u16(),
                                round,
                                "recall: follow-up request refused; ending the stream"
                            );
                            return self
                                .end(splicer.abort(), seen, tx, bytes, first_byte_at, None)
                                .await;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, round, "recall: follow-up request failed; ending the stream");
                            return self
                                .end(splicer.abort(), seen, tx, bytes, first_byte_at, None)
                                .await;
                        }
                    }
                }
                RoundEnd::Finish(tail) => {
                    return self.end(tail, seen, tx, bytes, first_byte_at, error).await;
                }
            }
        }
    }

    /// Sends the last chunks, records the reply, then `[DONE]` (or, when the upstream broke the stream, an error
    /// event: the client's stream is re-serialised by the splicer, so it always stops between events).
    async fn end(
        self,
        tail: Vec<Value>,
        mut seen: MessageAssembler,
        tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
        mut bytes: u64,
        first_byte_at: Option<Instant>,
        error: Option<GatewayError>,
    ) {
        for c in &tail {
            seen.on_chunk(c);
            let b = sse(c);
            bytes += b.len() as u64;
            if tx.send(Ok(b)).await.is_err() {
                return self.gone(seen, bytes, first_byte_at).await;
            }
        }
        let mut reply = seen.finish();
        reply.complete = error.is_none();
        let last = match &error {
            None => Bytes::from_static(b"data: [DONE]\n\n"),
            Some(e) => crate::relay::error_event(e, false),
        };
        let message = error.map(|e| format!("upstream body: {e}"));
        bytes += last.len() as u64;
        (self.finisher)(outcome(reply, false, message, bytes, first_byte_at)).await;
        let _ = tx.send(Ok(last)).await;
    }

    async fn gone(self, seen: MessageAssembler, bytes: u64, first_byte_at: Option<Instant>) {
        (self.finisher)(outcome(seen.finish(), true, None, bytes, first_byte_at)).await;
    }
}

fn outcome(
    reply: AssembledReply,
    gone: bool,
    error: Option<String>,
    bytes: u64,
    first: Option<Instant>,
) -> RelayOutcome {
    RelayOutcome {
        reply,
        client_disconnected: gone,
        upstream_error: error,
        bytes,
        first_byte_at: first,
    }
}

fn sse(v: &Value) -> Bytes {
    let mut b = b"data: ".to_vec();
    b.extend(serde_json::to_vec(v).unwrap_or_default());
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

async fn read_body(r: reqwest::Response, idle: std::time::Duration) -> Result<Bytes, String> {
    let mut out = Vec::new();
    let mut s = r.bytes_stream();
    loop {
        let c = match tokio::time::timeout(idle, s.next()).await {
            Ok(Some(c)) => c.map_err(|e| format!("upstream body failed: {e}"))?,
            Ok(None) => break,
            Err(_) => return Err(format!("upstream body stalled for {} s", idle.as_secs())),
        };
        if out.len() + c.len() > MAX_ROUND_BODY {
            return Err("upstream body too large for a recall round".into());
        }
        out.extend_from_slice(&c);
    }
    Ok(Bytes::from(out))
}

/// The client's answer: our calls removed, usage summed over the rounds, the first round's id.
fn finalize(
    mut v: Value,
    names: &InjectedNames,
    usage: Option<Value>,
    first_id: Option<Value>,
) -> Value {
    if let Some(msg) = v.pointer_mut("/choices/0/message") {
        let removed = strip_injected(msg, names);
        let has_calls = msg.get("tool_calls").is_some();
        if removed > 0 && !has_calls {
            if let Some(c) = v.pointer_mut("/choices/0") {
                c["finish_reason"] = json!("stop");
            }
        }
    }
    if let Some(o) = v.as_object_mut() {
        if let Some(id) = first_id {
            o.insert("id".into(), id);
        }
        if let Some(u) = usage {
            o.insert("usage".into(), u);
        }
    }
    v
}
