//! `POST /v1/messages/count_tokens` and Gemini's `:countTokens`: the count a client sees agrees with the usage ctxgate relays. Usage is the
//! upstream's count of what ctxgate sent (the rewritten request), so the request is planned like a real turn
//! (read-only: nothing is recorded, no summary started) and the upstream counts the body that turn would send.
//! Claude Code sizes its own compaction from these numbers; the client's full size would make it compact what
//! ctxgate already manages.

use super::{plan, plan_request, read_body};
use crate::app::AppState;
use crate::dialect::request::Call;
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::{DialectLabel, Route};
use crate::relay;
use crate::session::manager::now_secs;
use crate::upstream::answer_headers;
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http::Method;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handles a count request of `dialect`: `POST /v1/messages/count_tokens`, `POST /{version}/models/{model}:countTokens`.
pub async fn count_tokens(state: Arc<AppState>, req: Request, dialect: Dialect) -> Response {
    let started = Instant::now();
    let mut timer = state
        .metrics
        .start(Route::Passthrough, DialectLabel::from(dialect), started);
    let (parts, body) = req.into_parts();
    let live = state.live();
    let cfg = &*live.config;
    let fail = |e: GatewayError, timer: &mut crate::metrics::RequestTimer| {
        timer.set_status(e.status().as_u16());
        super::respond::own_error(&super::Logged::unparsed(dialect, started), None, e)
    };
    let timeout = Duration::from_secs(cfg.server.body_read_timeout_secs);
    let raw = match read_body(body, cfg.server.max_body_bytes, timeout).await {
        Ok(b) => b,
        Err(e) => return fail(e, &mut timer),
    };
    let call = Call {
        path: parts.uri.path(),
        query: parts.uri.query(),
    };
    let request = match dialect.parse_count(raw.clone(), &call) {
        Ok(r) => r,
        Err(e) => return fail(e, &mut timer),
    };
    let strategy = match plan::strategy(&parts.headers, cfg.context.strategy) {
        Ok(s) => s,
        Err(e) => return fail(e, &mut timer),
    };
    // The model's upstream, as for its turns.
    let target = match live.routes.resolve(&request.model, dialect) {
        Ok(r) => r.target.clone(),
        Err(e) => return fail(e, &mut timer),
    };
    // A strategy an operator pinned on the session counts as it does for its turns.
    let credentials = dialect.credential_headers(&parts.headers, parts.uri.query());
    let credentials = credentials.as_ref().unwrap_or(&parts.headers);
    let session = super::identity::identify(
        credentials,
        &cfg.session,
        &state.tenant_key,
        dialect,
        &request.body,
    );
    let strategy = match session {
        Some(s) => match state.sessions.entry(&s.id).await {
            Ok(Some(e)) => e.pinned_strategy().unwrap_or(strategy),
            _ => strategy,
        },
        None => strategy,
    };
    // A request ctxgate would refuse is counted whole: its true size is what tells the client to compact.
    let (body, target) = match plan_request(
        &state,
        &live,
        strategy,
        &request,
        None,
        credentials,
        super::PlanAt {
            now: now_secs(),
            trace: None,
        },
    )
    .await
    {
        // Fallen back: counted by the fallback model's upstream, as its turn would go.
        Ok(outgoing) => match outgoing
            .fallback
            .as_deref()
            .map(|m| live.routes.resolve(m, dialect))
        {
            None => (outgoing.body, target),
            Some(Ok(r)) => (outgoing.body, r.target.clone()),
            Some(Err(_)) => (request.raw.clone(), target),
        },
        Err(_) => (request.raw.clone(), target),
    };
    let rewritten = body != request.raw;
    let body = dialect.count_body(raw, body, rewritten);
    let url = target.url(&dialect.count_path(&request), parts.uri.query());
    let mut headers = target.request_headers(&parts.headers, true);
    headers.remove(plan::STRATEGY_HEADER);
    timer.upstream_sent();
    let resp = match target.send(Method::POST, &url, headers, body.into()).await {
        Ok(r) => r,
        Err(e) => return fail(e, &mut timer),
    };
    timer.set_status(resp.status().as_u16());
    let mut builder = Response::builder().status(resp.status());
    if let Some(h) = builder.headers_mut() {
        *h = answer_headers(resp.headers(), |k| k != http::header::CONTENT_LENGTH);
    }
    let stream =
        relay::passthrough(resp.bytes_stream().boxed(), target.timeout()).map(move |chunk| {
            let _in_flight = &timer;
            chunk
        });
    builder
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| GatewayError::Internal(e.to_string()).into_response())
}
