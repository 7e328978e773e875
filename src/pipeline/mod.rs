//! The life of a chat request, stage by stage: read → parse → identify the session → plan → forward → relay
//! with a tap → record.

mod request;

pub use request::{read_body, ChatRequest};

use crate::app::{AppState, TurnEvent};
use crate::error::GatewayError;
use crate::relay::{self, RelayOutcome};
use crate::session::tree::raw_message_hashes;
use crate::session::{identify, RequestMark, SessionIdentity};
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http::{HeaderValue, Method};
use std::sync::Arc;
use std::time::Instant;

/// Response header carrying the session id.
pub const SESSION_HEADER: &str = "x-ctxgate-session";

/// Handles `POST /v1/chat/completions`.
pub async fn chat(state: Arc<AppState>, req: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let cfg = &state.config;

    // 1. Read the whole body, within the limit: it has to be parsed before anything goes upstream.
    let raw = match read_body(body, cfg.server.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return own_error(e, None, started, false, ""),
    };
    // 2. Parse, keeping every field and its order; refuse what is not a chat request.
    let chat = match ChatRequest::parse(raw) {
        Ok(c) => c,
        Err(e) => return own_error(e, None, started, false, ""),
    };
    // 3. Identify the conversation (namespaced by the caller's credential).
    let body_value = serde_json::Value::Object(chat.body.clone());
    let session = identify(&parts.headers, &cfg.session.header, &body_value);
    // 3b. Reconcile with the stored history; new messages are queued for writing, not awaited. A store failure
    //     only costs this turn its recording.
    let mark = match state
        .sessions
        .record_request(&session, chat.messages(), &raw_message_hashes(&chat.raw))
        .await
    {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, session = %session.id, "session: could not record the request; proxying without history");
            None
        }
    };

    // 4. Nothing to rewrite: the client's own bytes go upstream, untouched.
    let outgoing = chat.raw.clone();

    // 5. Forward.
    let url = state.upstream.url("chat/completions", parts.uri.query());
    let headers = state.upstream.request_headers(&parts.headers, true);
    let upstream_started = Instant::now();
    let resp = match state
        .upstream
        .send(Method::POST, &url, headers, outgoing.into())
        .await
    {
        Ok(r) => r,
        Err(e) => return own_error(e, Some(&session), started, chat.stream, &chat.model),
    };
    let upstream_headers_at = Instant::now();

    // 6. Relay the answer as it arrives; the tap assembles the reply and finishes the turn.
    let status = resp.status();
    let is_sse = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut builder = Response::builder().status(status);
    for (k, v) in crate::upstream::strip_hop_by_hop(resp.headers()).iter() {
        builder = builder.header(k, v);
    }
    builder = with_session_header(builder, &session);
    let finisher = {
        let state = state.clone();
        let session_id = session.id.clone();
        let model = chat.model.clone();
        let stream = chat.stream;
        Box::new(move |outcome: RelayOutcome| {
            Box::pin(async move {
                // 7. The turn is complete (or cut short): record the reply (durably, before the client gets the
                //    last bytes), log it and announce it.
                if let Some(mark) = &mark {
                    record_reply(&state, mark, status, &outcome).await;
                }
                log_turn(
                    status.as_u16(),
                    &model,
                    stream,
                    upstream_headers_at.duration_since(upstream_started),
                    started,
                    &session_id,
                    &outcome,
                );
                let _ = state.turns.send(TurnEvent {
                    session_id,
                    status: status.as_u16(),
                    outcome,
                });
            }) as futures_util::future::BoxFuture<'static, ()>
        }) as relay::Finisher
    };
    let body = relay::relay(
        resp.bytes_stream().boxed(),
        is_sse,
        state.upstream.timeout(),
        state.tasks.clone(),
        finisher,
    );
    builder
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| GatewayError::Internal(e.to_string()).into_response())
}

/// Stores the assistant's reply when the upstream gave one; a reply cut short is stored marked partial.
async fn record_reply(
    state: &AppState,
    mark: &RequestMark,
    status: http::StatusCode,
    outcome: &RelayOutcome,
) {
    let reply = &outcome.reply;
    if !status.is_success() || !reply.message.is_object() {
        return;
    }
    let has_content = reply.message.get("content").is_some_and(|c| !c.is_null())
        || reply.message.get("tool_calls").is_some()
        || reply.message.get("refusal").is_some();
    if !reply.complete && !has_content {
        return;
    }
    if let Err(e) = state
        .sessions
        .record_reply(mark, reply.message.clone(), !reply.complete)
        .await
    {
        tracing::warn!(error = %e, session = %mark.entry.id, "session: could not record the reply");
    }
}

fn with_session_header(b: http::response::Builder, s: &SessionIdentity) -> http::response::Builder {
    match HeaderValue::from_str(&s.id) {
        Ok(v) => b.header(SESSION_HEADER, v),
        Err(_) => b,
    }
}

fn own_error(
    e: GatewayError,
    session: Option<&SessionIdentity>,
    started: Instant,
    stream: bool,
    model: &str,
) -> Response {
    let status = e.status().as_u16();
    tracing::warn!(
        target: "ctxgate::access",
        method = "POST",
        path = "/v1/chat/completions",
        status,
        model,
        stream,
        total_ms = started.elapsed().as_secs_f64() * 1000.0,
        error = %e,
        "chat request failed in ctxgate"
    );
    let mut resp = e.into_response();
    if let Some(s) = session {
        if let Ok(v) = HeaderValue::from_str(&s.id) {
            resp.headers_mut().insert(SESSION_HEADER, v);
        }
    }
    resp
}

fn log_turn(
    status: u16,
    model: &str,
    stream: bool,
    upstream_wait: std::time::Duration,
    started: Instant,
    session_id: &str,
    outcome: &RelayOutcome,
) {
    tracing::info!(
        target: "ctxgate::access",
        method = "POST",
        path = "/v1/chat/completions",
        status,
        model,
        stream,
        session = session_id,
        upstream_ms = upstream_wait.as_secs_f64() * 1000.0,
        total_ms = started.elapsed().as_secs_f64() * 1000.0,
        bytes = outcome.bytes,
        complete = outcome.reply.complete,
        client_disconnected = outcome.client_disconnected,
        upstream_error = outcome.upstream_error.as_deref().unwrap_or(""),
        "chat"
    );
}
