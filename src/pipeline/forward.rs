//! Stage 5: what the plan decided goes to the model's upstream (its route, else the dialect's default), with the
//! client's end-to-end headers (less ctxgate's own; a routed upstream's key in place of the client's) and, when
//! traced, the upstream round's `traceparent`.

use super::draft::conversation_array;
use super::{measure, Exchange, Outgoing, STRATEGY_HEADER};
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::{RequestTimer, UpstreamOutcome};
use crate::otel::{ChatStart, UpstreamTrace};
use crate::upstream::{Target, UpstreamResponse};
use http::{HeaderMap, Method};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The upstream's answer to what was sent, and how to ask it again (recall rounds).
pub(super) struct Sent {
    pub resp: UpstreamResponse,
    /// From sending to the answer's head.
    pub upstream_wait: Duration,
    pub url: String,
    /// Where it was sent (recall rounds go there too).
    pub target: Arc<Target>,
    /// The headers sent.
    pub headers: HeaderMap,
    /// The upstream round's span (traced requests).
    pub trace: Option<UpstreamTrace>,
}

impl Exchange {
    /// Sends `outgoing` upstream; `parts`: the client's request head.
    pub(super) async fn forward(
        &self,
        parts: &http::request::Parts,
        outgoing: &Outgoing,
        timer: &mut Option<RequestTimer>,
    ) -> Result<Sent, GatewayError> {
        let (state, dialect) = (&self.state, self.dialect);
        let target = &self.route.target;
        let url = target.url(&self.request.path, parts.uri.query());
        let mut headers = target.request_headers(&parts.headers, true);
        headers.remove(STRATEGY_HEADER);
        // Traced: the round's span, named in the upstream's `traceparent` (the one header ctxgate then adds).
        let mut trace = self.trace.as_ref().map(|t| {
            let session_id = self.session.as_ref().map(|s| s.id.as_str());
            let start = ChatStart::new(dialect.provider(), &self.request.model, session_id, &url)
                .upstream(target.name());
            t.upstream(start.planned(&outgoing.planned(self.strategy)))
        });
        if let Some(t) = trace.as_mut() {
            let sent = t
                .captures_content()
                .then(|| sent_messages(&outgoing.body, dialect));
            t.round(&mut headers, sent.as_deref());
        }
        let upstream_started = Instant::now();
        if let Some(t) = timer.as_mut() {
            t.upstream_sent();
        }
        let body = outgoing.body.clone().into();
        match target.send(Method::POST, &url, headers.clone(), body).await {
            Ok(resp) => {
                let outcome = UpstreamOutcome::of_status(resp.status().as_u16());
                self.route.count(dialect, outcome);
                Ok(Sent {
                    resp,
                    upstream_wait: upstream_started.elapsed(),
                    url,
                    target: target.clone(),
                    headers,
                    trace,
                })
            }
            Err(e) => {
                let outcome = match e {
                    GatewayError::UpstreamTimeout(_) => UpstreamOutcome::Timeout,
                    _ => UpstreamOutcome::Unreachable,
                };
                self.route.count(dialect, outcome);
                measure::send_failed(state, dialect, timer, &e);
                if let Some(t) = trace.as_mut() {
                    t.failed(&e);
                }
                Err(e)
            }
        }
    }
}

/// The conversation array of the body sent upstream (for `otel.capture_content`).
fn sent_messages(body: &[u8], dialect: Dialect) -> Vec<Value> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|mut v| v.get_mut(dialect.conversation_key()).map(Value::take))
        .map_or_else(Vec::new, |v| conversation_array(Some(&v)).into_owned())
}
