//! `server.max_in_flight`: beyond it a `/v1/*` request is refused with 503 and `retry-after`; a response holds its
//! slot until its body has been sent (a stream counts until it ends). No request holds a slot while its body
//! arrives, so slow or idle bodies cannot hold the slots: a conversation request takes its slot once its body has
//! arrived and been admitted (`admission`: a compressed body decoded, `server.max_messages`,
//! `server.request_memory_bytes`); a passthrough request with a body streams it to the upstream and takes its slot
//! when it ends (`late_slot`); one without a body takes it at once.

use super::admission::{self, Memory, Reserved, Rules};
use super::decode;
use super::late_slot::{LateSlot, SlotAtEnd};
use crate::app::AppState;
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::{DialectLabel, RejectReason, Route};
use crate::upstream::Api;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::Method;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Seconds a refused client is told to wait.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The in-flight slots (`None`: no limit) and the memory budget of conversation requests.
#[derive(Clone)]
pub struct InFlight {
    slots: Option<Arc<Semaphore>>,
    limit: usize,
    memory: Memory,
    rules: Arc<Rules>,
}

impl InFlight {
    /// Slots and admission under `server`'s limits; a `max_in_flight` of 0 means no limit.
    pub fn new(server: &crate::config::ServerConfig) -> Self {
        let limit = server.max_in_flight;
        Self {
            slots: (limit > 0).then(|| Arc::new(Semaphore::new(limit))),
            limit,
            memory: Memory::new(server.request_memory_bytes),
            rules: Arc::new(Rules {
                max_body_bytes: server.max_body_bytes,
                body_timeout: Duration::from_secs(server.body_read_timeout_secs),
                max_messages: server.max_messages,
            }),
        }
    }
}

/// The dialect of a conversation request (the routes the pipeline manages), from its method and path.
fn conversation(req: &Request) -> Option<Dialect> {
    if req.method() != Method::POST {
        return None;
    }
    Dialect::serving(req.uri().path())
}

/// Middleware: admits a conversation request's body, takes a slot for the request and hands it (and the
/// request's memory) to the response body, or refuses the request.
pub async fn limit(
    State((state, in_flight)): State<(Arc<AppState>, InFlight)>,
    req: Request,
    next: Next,
) -> Response {
    let dialect = conversation(&req);
    // The error shape of the API the client speaks.
    let shape = dialect.unwrap_or_else(|| {
        let path = req.uri().path();
        if path.starts_with("/v1beta/") || path.starts_with("/v1alpha/") {
            return Dialect::Gemini;
        }
        let rest = path.strip_prefix("/v1").unwrap_or_default();
        match Api::of(rest, req.headers()) {
            Api::Anthropic => Dialect::Anthropic,
            Api::Gemini => Dialect::Gemini,
            Api::OpenAi => Dialect::Chat,
        }
    });
    let refuse = |reason, e: GatewayError| refuse(&state, dialect, shape, reason, e);
    let (req, reserved) = match dialect {
        Some(_) => {
            let (mut parts, body) = req.into_parts();
            // A compressed body is managed and forwarded decoded: its `content-encoding` goes (`decode`).
            let codings = match decode::take_codings(&mut parts.headers) {
                Ok(c) => c,
                Err(e) => return refuse(None, e),
            };
            let decoded = codings.is_some();
            match admission::admit(body, codings, &in_flight.rules, &in_flight.memory).await {
                Ok((raw, reserved)) => {
                    if decoded {
                        parts.headers.insert(CONTENT_LENGTH, raw.len().into());
                    }
                    (Request::from_parts(parts, Body::from(raw)), reserved)
                }
                Err(e) => {
                    let reason = match &e {
                        GatewayError::RequestTimeout { .. } => Some(RejectReason::BodyTimeout),
                        GatewayError::TooLarge { .. } => Some(RejectReason::TooLarge),
                        GatewayError::MemoryBusy { .. } => Some(RejectReason::Memory),
                        _ => None,
                    };
                    return refuse(reason, e);
                }
            }
        }
        None => (req, Reserved::default()),
    };
    // A passthrough request with a body streams it to the upstream and takes its slot when it ends.
    let has_body = http_body::Body::size_hint(req.body()).exact() != Some(0);
    if let (None, true, Some(slots)) = (dialect, has_body, &in_flight.slots) {
        let late = LateSlot::new(slots.clone());
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(late.clone());
        let req = Request::from_parts(parts, Body::new(SlotAtEnd::new(body, late.clone())));
        let resp = next.run(req).await;
        if late.refused() {
            // answered 503 by the passthrough (and counted there among the requests): a rejection too
            state.metrics.rejected(
                Route::Passthrough,
                DialectLabel::NoDialect,
                RejectReason::Overloaded,
            );
            tracing::warn!(
                max_in_flight = in_flight.limit,
                "refused a passthrough request when its body ended: server.max_in_flight reached"
            );
        }
        return resp.map(|body| {
            Body::new(Holding {
                inner: body,
                _permit: None,
                _late: Some(late),
                _memory: Reserved::default(),
            })
        });
    }
    let permit = match &in_flight.slots {
        None => None,
        Some(slots) => match slots.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                let e = GatewayError::Overloaded {
                    limit: in_flight.limit,
                    retry_after_secs: RETRY_AFTER_SECS,
                };
                return refuse(Some(RejectReason::Overloaded), e);
            }
        },
    };
    if permit.is_none() && dialect.is_none() {
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    resp.map(|body| {
        Body::new(Holding {
            inner: body,
            _permit: permit,
            _late: None,
            _memory: reserved,
        })
    })
}

/// A request refused before it is handled: counted like any answered request (route and status class) and, with
/// a `reason`, as a rejection (the overload panel and alert); logged; answered in `shape`'s error shape.
fn refuse(
    state: &AppState,
    dialect: Option<Dialect>,
    shape: Dialect,
    reason: Option<RejectReason>,
    e: GatewayError,
) -> Response {
    let (route, label) = match dialect {
        Some(d) => (Route::Chat, DialectLabel::from(d)),
        None => (Route::Passthrough, DialectLabel::NoDialect),
    };
    if let Some(r) = reason {
        state.metrics.rejected(route, label, r);
    }
    let mut timer = state.metrics.start(route, label, Instant::now());
    timer.set_status(e.status().as_u16());
    tracing::warn!(
        status = e.status().as_u16(),
        dialect = shape.as_str(),
        "refused a request before handling it: {e}"
    );
    crate::pipeline::error_response(shape, e)
}

/// A response body that keeps its request's in-flight slot and memory until it is dropped (sent, or the client left).
struct Holding {
    inner: Body,
    _permit: Option<OwnedSemaphorePermit>,
    /// The slot a passthrough body took when it ended.
    _late: Option<Arc<LateSlot>>,
    /// The request's memory (conversation requests), given back with the slot.
    _memory: Reserved,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
