//! Recall rounds: when a rewritten request offered the recall tools and the model calls them, ctxgate answers the
//! calls from the session's history, asks the upstream again, and returns one ordinary answer (JSON) or one
//! continuous SSE stream; the client never sees the injected tools.

use crate::app::AppState;
use crate::context::splice_messages;
use crate::dialect::rounds::{Splice, SpliceEnd};
use crate::dialect::{AssembledReply, Dialect};
use crate::error::GatewayError;
use crate::metrics::{RecallOutcome, RecallTool};
use crate::recall::{answer_call_with_outcome, Answered, InjectedNames, LazyHistory};
use crate::relay::{Finisher, RelayOutcome};
use crate::sse::SseParser;
use crate::upstream::{map_client_error, UpstreamResponse};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Method};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Largest upstream JSON body read for a recall round: the relay's bound.
const MAX_ROUND_BODY: usize = crate::relay::MAX_TAPPED_JSON;

/// One request's recall rounds.
pub struct Rounds {
    /// The gateway.
    pub state: Arc<AppState>,
    /// The request's dialect.
    pub dialect: Dialect,
    /// Where and how to send the follow-up requests.
    pub url: String,
    /// The upstream they go to (the first round's).
    pub target: Arc<crate::upstream::Target>,
    /// Headers for the follow-up requests.
    pub headers: HeaderMap,
    /// The first request's body as sent (with the injected tools).
    pub sent: Bytes,
    /// Offset in `sent` of the `]` closing its messages.
    pub messages_close: usize,
    /// What each round appended to its messages (assistant calls, ctxgate's answers); empty at first.
    pub appended: Vec<Value>,
    /// What recall and search may read.
    pub source: LazyHistory,
    /// Called once with the client-visible reply: records it before the last bytes are released.
    pub finisher: Finisher,
    /// The request's config snapshot (recall settings).
    pub live: std::sync::Arc<crate::app::Live>,
    /// Receives each round's exchange (assistant call + ctxgate's answers) for the session's internal records.
    pub on_round: Box<dyn Fn(Value) + Send + Sync>,
    /// The spans of the upstream rounds and recall calls (traced requests); the first round's is open.
    pub trace: Option<crate::otel::UpstreamTrace>,
}

impl Rounds {
    fn names(&self) -> InjectedNames {
        InjectedNames::from_config(&self.live.config.recall)
    }

    /// Answers the injected calls (neutral) of `assistant` (the dialect's message) and appends the exchange to
    /// the next request.
    fn answer(&mut self, round: u32, assistant: Value, calls: &[Value]) {
        let names = self.names();
        let source = self.source.get();
        let metrics = &self.state.metrics;
        metrics.recall_round(self.dialect);
        let results: Vec<String> = calls
            .iter()
            .map(|c| {
                let name = c.pointer("/function/name").and_then(Value::as_str);
                let span = self.trace.as_ref().map(|t| {
                    let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
                    t.tool(name.unwrap_or_default(), id)
                });
                let (content, answered) =
                    answer_call_with_outcome(c, &names, source, &self.live.config.recall);
                if let Some(span) = span {
                    span.finish(match answered {
                        Answered::Found => "found",
                        Answered::NotFound => "not_found",
                        Answered::Error => "error",
                    });
                }
                let search = name == Some(names.search.as_str());
                metrics.recall_call(
                    self.dialect,
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
                content
            })
            .collect();
        let messages = self
            .dialect
            .round_messages(&assistant, &names, calls, &results);
        let answered: Vec<Value> = calls
            .iter()
            .map(|c| {
                let f = c.get("function");
                let arguments = f
                    .and_then(|f| f.get("arguments"))
                    .and_then(Value::as_str)
                    .and_then(|a| serde_json::from_str::<Value>(a).ok())
                    .unwrap_or(Value::Null);
                json!({"id": c.get("id"), "name": f.and_then(|f| f.get("name")), "arguments": arguments})
            })
            .collect();
        (self.on_round)(json!({"round": round, "dialect": self.dialect.as_str(),
                               "calls": answered, "messages": messages}));
        self.appended.extend(messages);
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

    /// The next round's request (built now, so the future holds no borrow of `self`); traced, its span opens.
    fn send(
        &mut self,
    ) -> impl std::future::Future<Output = Result<UpstreamResponse, GatewayError>> + Send + 'static
    {
        let body = self.next_body();
        let (target, url, mut headers) =
            (self.target.clone(), self.url.clone(), self.headers.clone());
        if let Some(t) = self.trace.as_mut() {
            t.round(&mut headers, None);
        }
        async move { target.send(Method::POST, &url, headers, body?.into()).await }
    }

    /// Non-streaming: reads each answer whole; returns the final body (and the status and headers of the round it
    /// came from). `first` is the first round's successful response.
    pub async fn json(mut self, first: UpstreamResponse) -> (http::StatusCode, HeaderMap, Bytes) {
        let names = self.names();
        let max_rounds = self.live.config.recall.max_rounds;
        let (mut status, mut headers) = (first.status(), first.headers().clone());
        let idle = self.target.timeout();
        let mut body = read_body(first, idle).await;
        let mut usage = None;
        // Each round's usage as the upstream reported it (the metrics count every request sent).
        let mut round_usage = Vec::new();
        let mut first_id = None;
        let mut last_good: Option<Value> = None;
        let mut round = 0;
        let final_value = loop {
            let dialect = self.dialect;
            if let Some(t) = self.trace.as_mut() {
                let reply = body.as_ref().map_or_else(
                    |_| AssembledReply::default(),
                    |b| dialect.reply_from_body(b),
                );
                t.answered(status.as_u16(), &reply.answer(None), body.is_err());
            }
            let parsed = body
                .as_ref()
                .ok()
                .filter(|_| status.is_success())
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                .filter(|v| dialect.answer_message(v).is_some());
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
                                let body = dialect.error_body(&err).to_string();
                                (err.status(), Bytes::from(body))
                            }
                        };
                        self.finish(&raw, Vec::new()).await;
                        return (status, headers, raw);
                    }
                }
            };
            if let Some(u) = dialect.answer_usage(&v) {
                dialect.add_usage(&mut usage, &u);
                round_usage.push(u);
            }
            first_id.get_or_insert_with(|| dialect.answer_id(&v));
            let message = dialect.answer_message(&v).unwrap_or(Value::Null);
            let calls = dialect.injected_calls(&message, &names);
            if calls.is_empty() || round >= max_rounds {
                break v;
            }
            round += 1;
            self.answer(round, message, &calls);
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
                    if let Some(t) = self.trace.as_mut() {
                        t.failed(&e);
                    }
                    body = Err(e.to_string());
                }
            }
        };
        let out = self
            .dialect
            .finalize_answer(final_value, &names, usage, first_id);
        let raw = Bytes::from(serde_json::to_vec(&out).unwrap_or_default());
        self.finish(&raw, round_usage).await;
        // The upstream's own `x-ctxgate-recall`, if it sent one, never stands for ours.
        headers.remove(super::RECALL_HEADER);
        if round > 0 {
            headers.insert(super::RECALL_HEADER, http::HeaderValue::from(round));
        }
        (http::StatusCode::OK, headers, raw)
    }

    /// Records the client's JSON answer `body`; `round_usage`: each upstream round's usage behind it.
    async fn finish(&mut self, body: &[u8], round_usage: Vec<Value>) {
        let f = std::mem::replace(&mut self.finisher, Box::new(|_| Box::pin(async {})));
        let mut reply = self.dialect.reply_from_body(body);
        reply.round_usage = round_usage;
        f(outcome(reply, false, None, body.len() as u64, None)).await;
    }

    /// Streaming: relays every round into one client stream (see `StreamSplicer`). Returns the body stream.
    pub fn stream(
        self,
        first: UpstreamResponse,
        client_body: &Map<String, Value>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(32);
        let tasks = self.state.tasks.clone();
        let splicer = self.dialect.splicer(self.names(), client_body);
        tasks.spawn(self.drive(first, splicer, tx));
        futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
    }

    async fn drive(
        mut self,
        first: UpstreamResponse,
        mut splicer: Box<dyn Splice>,
        tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    ) {
        let max_rounds = self.live.config.recall.max_rounds;
        let idle = self.target.timeout();
        let (mut bytes, mut first_byte_at) = (0u64, None);
        let mut resp = first;
        let mut round = 0;
        loop {
            let mut parser = SseParser::new();
            let mut upstream = resp.bytes_stream();
            let mut error = None;
            loop {
                let next = tokio::select! {
                    biased;
                    n = tokio::time::timeout(idle, upstream.next()) => n,
                    () = self.state.cut_streams.cancelled() => {
                        let grace_secs = self.state.config.server.shutdown_grace_secs;
                        error = Some(GatewayError::ShuttingDown { grace_secs });
                        break;
                    }
                };
                let chunk = match next {
                    Ok(Some(Ok(c))) => c,
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        error = Some(map_client_error(&e, idle));
                        break;
                    }
                    Err(_) => {
                        error = Some(GatewayError::UpstreamTimeout(idle.as_secs()));
                        break;
                    }
                };
                first_byte_at.get_or_insert_with(Instant::now);
                let events = parser.feed(&chunk);
                for b in events.iter().flat_map(|ev| splicer.on_event(ev)) {
                    bytes += b.len() as u64;
                    if tx.send(Ok(b)).await.is_err() {
                        return self.gone(splicer.reply(), bytes, first_byte_at).await;
                    }
                }
            }
            if let Some(ev) = parser.finish() {
                for b in splicer.on_event(&ev) {
                    bytes += b.len() as u64;
                    let _ = tx.send(Ok(b)).await;
                }
            }
            if let Some(t) = self.trace.as_mut() {
                // This round's own usage: the splicer keeps one per round.
                let reply = splicer.reply();
                let usage = reply
                    .round_usage
                    .get(round as usize)
                    .unwrap_or(&Value::Null);
                let usage = if reply.round_usage.is_empty() {
                    None
                } else {
                    Some(usage)
                };
                t.answered(200, &reply.answer(usage), error.is_some());
            }
            round += 1;
            let rounds_left = error.is_none() && round <= max_rounds;
            match splicer.end_round(rounds_left) {
                SpliceEnd::Continue { assistant, calls } => {
                    self.answer(round, assistant, &calls);
                    let next = keep_alive(self.send(), splicer.keepalive(), &tx, &mut bytes);
                    match next.await {
                        Ok(r) if r.status().is_success() => resp = r,
                        Ok(r) => {
                            if let Some(t) = self.trace.as_mut() {
                                t.answered(
                                    r.status().as_u16(),
                                    &AssembledReply::default().answer(None),
                                    false,
                                );
                            }
                            tracing::warn!(
                                status = r.status().as_u16(),
                                round,
                                "recall: follow-up request refused; ending the stream"
                            );
                            let tail = splicer.abort();
                            return self
                                .end(tail, splicer, tx, bytes, first_byte_at, None)
                                .await;
                        }
                        Err(e) => {
                            if let Some(t) = self.trace.as_mut() {
                                t.failed(&e);
                            }
                            tracing::warn!(error = %e, round, "recall: follow-up request failed; ending the stream");
                            let tail = splicer.abort();
                            return self
                                .end(tail, splicer, tx, bytes, first_byte_at, None)
                                .await;
                        }
                    }
                }
                SpliceEnd::Finish(tail) => {
                    return self
                        .end(tail, splicer, tx, bytes, first_byte_at, error)
                        .await;
                }
            }
        }
    }

    /// Sends the last bytes, records the reply, then the stream's end (or, when the upstream broke the stream, an
    /// error event: the client's stream is re-serialised by the splicer, so it always stops between events).
    async fn end(
        self,
        tail: Vec<Bytes>,
        mut splicer: Box<dyn Splice>,
        tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
        mut bytes: u64,
        first_byte_at: Option<Instant>,
        error: Option<GatewayError>,
    ) {
        for b in tail {
            bytes += b.len() as u64;
            if tx.send(Ok(b)).await.is_err() {
                return self.gone(splicer.reply(), bytes, first_byte_at).await;
            }
        }
        let mut reply = splicer.reply();
        reply.complete = error.is_none();
        let last = match &error {
            None => splicer.done(),
            Some(e) => splicer
                .error_event(e)
                .or_else(|| Some(self.dialect.error_event(e, false))),
        };
        let message = error.map(|e| format!("upstream body: {e}"));
        bytes += last.as_ref().map_or(0, |b| b.len() as u64);
        (self.finisher)(outcome(reply, false, message, bytes, first_byte_at)).await;
        if let Some(last) = last {
            let _ = tx.send(Ok(last)).await;
        }
    }

    async fn gone(mut self, reply: AssembledReply, bytes: u64, first_byte_at: Option<Instant>) {
        if let Some(t) = self.trace.as_mut() {
            t.answered(200, &reply.answer(None), false);
        }
        (self.finisher)(outcome(reply, true, None, bytes, first_byte_at)).await;
    }
}

/// Awaits the next round's response, keeping the client's stream alive with `ping` (the dialect's keep-alive
/// event, at once and every few seconds) while the upstream has not answered.
async fn keep_alive(
    send: impl std::future::Future<Output = Result<UpstreamResponse, GatewayError>>,
    ping: Option<Bytes>,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    bytes: &mut u64,
) -> Result<UpstreamResponse, GatewayError> {
    tokio::pin!(send);
    let Some(ping) = ping else {
        return send.await;
    };
    // One at once (the client learns the stream is alive before the follow-up is even sent), then one every
    // `KEEPALIVE_EVERY` while it is in flight.
    *bytes += ping.len() as u64;
    let _ = tx.send(Ok(ping.clone())).await;
    let start = tokio::time::Instant::now() + KEEPALIVE_EVERY;
    let mut every = tokio::time::interval_at(start, KEEPALIVE_EVERY);
    loop {
        tokio::select! {
            r = &mut send => return r,
            _ = every.tick() => {
                *bytes += ping.len() as u64;
                // A client gone away is noticed by the next send of the answer itself.
                let _ = tx.send(Ok(ping.clone())).await;
            }
        }
    }
}

/// How often a keep-alive event goes to the client while a follow-up round is in flight.
const KEEPALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

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

async fn read_body(r: UpstreamResponse, idle: std::time::Duration) -> Result<Bytes, String> {
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
