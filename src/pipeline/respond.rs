//! Stage 6, the client's response: the upstream's status and end-to-end headers with the session header, and a body that
//! is the upstream's relayed through the tap, the answer after ctxgate's recall rounds, or our own error.

use super::access::{self, End, Logged};
use super::draft::TurnDraft;
use super::forward::Sent;
use super::rounds::Rounds;
use super::turn::{Seen, Turn};
use super::{Exchange, Outgoing, FALLBACK_HEADER, REWRITE_HEADER, SESSION_HEADER};
use crate::app::AppState;
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::RequestTimer;
use crate::recall::{HistorySource, LazyHistory};
use crate::relay::{self, Finisher};
use crate::session::SessionIdentity;
use crate::upstream::answer_headers;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{Map, Value};
use std::sync::Arc;

impl Exchange {
    /// Stage 6: relays the upstream's answer as it arrives, through the tap that assembles the reply and ends the
    /// turn (`turn`). A new session is only stored (and cached) once the upstream accepted its first request.
    /// When the model may call the recall tools we offered, ctxgate answers them and asks again, within the same
    /// response; anything but a successful first answer is relayed as it is.
    pub(super) async fn respond(
        self,
        outgoing: Outgoing,
        draft: Option<TurnDraft>,
        mut sent: Sent,
        timer: &mut Option<RequestTimer>,
    ) -> Response {
        let status = sent.resp.status();
        if let (Some(m), true) = (&self.mark, status.is_success()) {
            self.state.sessions.admit(m).await;
        }
        let is_sse = is_event_stream(sent.resp.headers());
        let mut timer = timer.take();
        if let (Some(t), true) = (timer.as_mut(), is_sse) {
            t.streaming();
        }
        let turn = Turn::new(&self, &outgoing, draft, &mut sent, timer);
        let own = Own {
            session: self.session.as_ref(),
            rewrite: outgoing
                .rewrite
                .as_ref()
                .and_then(|r| rewrite_header(&r.record)),
            fallback: outgoing
                .fallback
                .as_deref()
                .and_then(|m| HeaderValue::from_str(m).ok()),
        };
        let recall = (outgoing.rewrite.as_ref()).is_some_and(|r| r.injected && status.is_success());
        if !recall {
            let finisher = turn.finisher(outgoing.estimate);
            let idle = sent.target.timeout();
            return relayed(
                &self.state,
                self.dialect,
                sent.resp,
                idle,
                is_sse,
                &own,
                finisher,
            )
            .await;
        }
        let rounds = self.rounds(turn, &outgoing, sent.url, sent.target, sent.headers);
        after_rounds(
            &self.state,
            rounds,
            sent.resp,
            is_sse,
            &self.request.body,
            &own,
        )
        .await
    }

    /// The recall rounds that answer `turn` (asking again at `url` with `headers`), reading the request's and the
    /// session's history (built only if the model calls one of the tools).
    fn rounds(
        &self,
        mut turn: Turn,
        outgoing: &Outgoing,
        url: String,
        target: Arc<crate::upstream::Target>,
        headers: HeaderMap,
    ) -> Rounds {
        let stored = match &self.mark {
            Some(m) => m
                .entry
                .with_tree(|t| t.nodes().map(|n| (n.position, n.message.clone())).collect()),
            None => Vec::new(),
        };
        let (of, dialect) = (Arc::clone(&self.request), self.dialect);
        let source = LazyHistory::new(move || {
            HistorySource::from_parts(of.messages(), dialect.neutral_history(stored))
        });
        Rounds {
            state: self.state.clone(),
            live: self.live.clone(),
            dialect,
            url,
            target,
            headers,
            sent: outgoing.body.clone(),
            messages_close: outgoing.messages_close,
            appended: Vec::new(),
            source,
            on_round: turn.on_round(),
            trace: turn.take_trace(),
            finisher: turn.finisher(None),
        }
    }
}

/// The upstream's answer, relayed through the tap (which assembles the reply; `finisher` ends the turn). A stream
/// goes out as it arrives; a JSON answer, of no use to a client before its end, is gathered first (up to
/// [`GATHER_MAX`]; a longer one is relayed on from there) so that it leaves with its head in one write. Its own
/// `content-length` stays: the bytes are the upstream's. A body that breaks is relayed as far as it came, then the
/// connection is aborted, as when relayed chunk by chunk.
pub(super) async fn relayed(
    state: &AppState,
    dialect: Dialect,
    resp: crate::upstream::UpstreamResponse,
    idle: std::time::Duration,
    is_sse: bool,
    own: &Own<'_>,
    finisher: Finisher,
) -> Response {
    let builder = head(resp.status(), resp.headers(), true, own);
    let mut body = relay::relay(
        resp.bytes_stream().boxed(),
        dialect,
        is_sse,
        idle,
        relay::Cut {
            token: state.cut_streams.clone(),
            grace_secs: state.config.server.shutdown_grace_secs,
        },
        state.tasks.clone(),
        finisher,
    )
    .boxed();
    if is_sse {
        return finish(builder, Body::from_stream(body));
    }
    let mut got: Vec<bytes::Bytes> = Vec::new();
    let mut size = 0;
    while size <= GATHER_MAX {
        match body.next().await {
            Some(Ok(b)) => {
                size += b.len();
                got.push(b);
            }
            None if got.len() <= 1 => {
                return finish(builder, Body::from(got.pop().unwrap_or_default()))
            }
            None => return finish(builder, Body::from(got.concat())),
            Some(Err(e)) => {
                // The error after one pending poll: the server writes the head and what came before it aborts.
                let so_far = futures_util::stream::iter(got.into_iter().map(Ok));
                let abort = futures_util::stream::once(async {
                    tokio::task::yield_now().await;
                    Err(e)
                });
                return finish(builder, Body::from_stream(so_far.chain(abort)));
            }
        }
    }
    let so_far = futures_util::stream::iter(got.into_iter().map(Ok));
    finish(builder, Body::from_stream(so_far.chain(body)))
}

/// Most bytes of a JSON answer gathered before it is sent (1 MiB: any completion a client waits for whole).
const GATHER_MAX: usize = 1024 * 1024;

/// The answer after ctxgate's recall rounds: a stream spliced from every round (under the first answer's head),
/// or the last round's JSON answer. The length is the rounds', so no upstream `content-length` is copied.
pub(super) async fn after_rounds(
    state: &AppState,
    rounds: Rounds,
    first: crate::upstream::UpstreamResponse,
    is_sse: bool,
    client_body: &Map<String, Value>,
    own: &Own<'_>,
) -> Response {
    if is_sse {
        let builder = head(first.status(), first.headers(), false, own);
        return finish(
            builder,
            Body::from_stream(rounds.stream(first, client_body)),
        );
    }
    // Tracked like the streaming rounds: a client that goes away mid-round does not cut the rounds (and the
    // turn's finisher) short.
    let rounds_dialect = rounds.dialect;
    match state.tasks.spawn(rounds.json(first)).await {
        Ok((status, mut headers, bytes)) => {
            // `x-ctxgate-recall` is ours (the rounds set it); every other `x-ctxgate-*` the upstream sent is left out.
            let recall = headers.remove(super::RECALL_HEADER);
            let mut builder = head(status, &headers, false, own);
            if let (Some(v), Some(h)) = (recall, builder.headers_mut()) {
                h.insert(super::RECALL_HEADER, v);
            }
            finish(builder, Body::from(bytes))
        }
        Err(e) => error_response(
            rounds_dialect,
            GatewayError::Internal(format!("recall rounds: {e}")),
        ),
    }
}

/// Whether `headers` announce a server-sent event stream.
pub(super) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The headers ctxgate adds to an answer: the session's id and, for a rewritten request, what the rewrite did.
#[derive(Default)]
pub(super) struct Own<'a> {
    /// The session, when one is kept.
    pub session: Option<&'a SessionIdentity>,
    /// `x-ctxgate-rewrite`'s value, when the request was rewritten (see [`rewrite_header`]).
    pub rewrite: Option<HeaderValue>,
    /// `x-ctxgate-fallback`'s value: the model the request went to instead of its own.
    pub fallback: Option<HeaderValue>,
}

/// `x-ctxgate-rewrite`'s value: the stages that changed something and the estimated tokens of the client's
/// request and of what was sent, e.g. `cleared,pruned; tokens=5468->3048`.
pub(super) fn rewrite_header(record: &crate::context::CompressionRecord) -> Option<HeaderValue> {
    HeaderValue::from_str(&rewrite_text(
        &record.stages,
        record.tokens_before,
        record.tokens_after,
    ))
    .ok()
}

/// The text of `x-ctxgate-rewrite`. A request forwarded with only the recall tools added (stage `offered`, from
/// `recall.offer_at`: its messages as the client sent them, so both counts are equal) says so after the counts —
/// `offered; tokens=6400->6400; messages=unchanged; added=recall-tools` — rather than read like a rewrite that
/// did nothing; the first two parts keep their form for clients that read them.
fn rewrite_text(stages: &[&str], before: u64, after: u64) -> String {
    let mut text = if stages.is_empty() {
        "rewritten".to_string()
    } else {
        stages.join(",")
    };
    text.push_str(&format!("; tokens={before}->{after}"));
    if stages == [OFFERED] {
        text.push_str("; messages=unchanged; added=recall-tools");
    }
    text
}

/// The stage of a request forwarded as the client sent it, with only the recall tools added.
const OFFERED: &str = "offered";

/// A response head with `status`, the end-to-end headers of `upstream` (its `content-length` only when
/// `keep_length`) and ctxgate's own headers.
fn head(
    status: StatusCode,
    upstream: &HeaderMap,
    keep_length: bool,
    own: &Own<'_>,
) -> http::response::Builder {
    let mut builder = Response::builder().status(status);
    if let Some(h) = builder.headers_mut() {
        *h = answer_headers(upstream, |k| {
            keep_length || k != http::header::CONTENT_LENGTH
        });
        if let Some(v) = &own.rewrite {
            h.insert(REWRITE_HEADER, v.clone());
        }
        if let Some(v) = &own.fallback {
            h.insert(FALLBACK_HEADER, v.clone());
        }
    }
    match own.session.map(|s| HeaderValue::from_str(&s.id)) {
        Some(Ok(v)) => builder.header(SESSION_HEADER, v),
        _ => builder,
    }
}

/// `e` as an answer in the dialect's error shape (with `retry-after` when overloaded).
pub fn error_response(dialect: Dialect, e: GatewayError) -> Response {
    let body = dialect.error_body(&e);
    let mut resp = e.into_response();
    let (parts, _) = resp.into_parts();
    resp = Response::from_parts(parts, Body::from(body.to_string()));
    resp.headers_mut().remove(http::header::CONTENT_LENGTH);
    resp
}

fn finish(builder: http::response::Builder, body: Body) -> Response {
    builder
        .body(body)
        .unwrap_or_else(|e| GatewayError::Internal(e.to_string()).into_response())
}

/// Our own error answer, logged (`seen`: the plan's, when the request was planned), with the session header when
/// the session is known, in the dialect's shape.
pub(super) fn own_error(logged: &Logged<'_>, seen: Option<&Seen>, e: GatewayError) -> Response {
    access::write(logged, seen, End::Failed(&e));
    let mut resp = error_response(logged.dialect, e);
    if let Some(id) = logged.session {
        if let Ok(v) = HeaderValue::from_str(id) {
            resp.headers_mut().insert(SESSION_HEADER, v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::rewrite_text;

    #[test]
    fn the_rewrite_header_says_when_only_the_recall_tools_were_added() {
        assert_eq!(
            rewrite_text(&["cleared", "pruned"], 5468, 3048),
            "cleared,pruned; tokens=5468->3048"
        );
        assert_eq!(rewrite_text(&[], 900, 800), "rewritten; tokens=900->800");
        assert_eq!(
            rewrite_text(&["offered"], 6400, 6400),
            "offered; tokens=6400->6400; messages=unchanged; added=recall-tools"
        );
    }
}
