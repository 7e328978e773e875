//! `server.max_in_flight`: beyond it a `/v1/*` request is refused at once with 503 and `retry-after`, before its
//! body is read; a response holds its slot until its body has been sent (a stream counts until it ends).

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
use http::Method;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Seconds a refused client is told to wait.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The in-flight slots (`None`: no limit).
#[derive(Clone)]
pub struct InFlight {
    slots: Option<Arc<Semaphore>>,
    limit: usize,
}

impl InFlight {
    /// Slots for `limit` requests; 0 means no limit.
    pub fn new(limit: usize) -> Self {
        Self {
            slots: (limit > 0).then(|| Arc::new(Semaphore::new(limit))),
            limit,
        }
    }
}

/// Middleware: takes a slot for the request and hands it to the response body, or refuses the request.
pub async fn limit(
    State((state, in_flight)): State<(Arc<AppState>, InFlight)>,
    req: Request,
    next: Next,
) -> Response {
    let Some(slots) = &in_flight.slots else {
        return next.run(req).await;
    };
    let Ok(permit) = slots.clone().try_acquire_owned() else {
        // Counted like any answered request (route and status class), and as a rejection (the overload panel
        // and alert).
        let conversation = match (req.method() == Method::POST, req.uri().path()) {
            (true, "/v1/chat/completions") => Some(Dialect::Chat),
            (true, "/v1/messages") => Some(Dialect::Anthropic),
            (true, "/v1/responses") => Some(Dialect::Responses),
            _ => None,
        };
        let (route, dialect) = match conversation {
            Some(d) => (Route::Chat, DialectLabel::from(d)),
            None => (Route::Passthrough, DialectLabel::NoDialect),
        };
        state
            .metrics
            .rejected(route, dialect, RejectReason::Overloaded);
        let mut timer = state.metrics.start(route, dialect, Instant::now());
        timer.set_status(503);
        tracing::warn!(
            max_in_flight = in_flight.limit,
            "server busy: refused a request (server.max_in_flight)"
        );
        // In the error shape of the API the client speaks.
        let rest = req.uri().path().strip_prefix("/v1").unwrap_or_default();
        let shape = match conversation {
            Some(d) => d,
            None if Api::of(rest, req.headers()) == Api::Anthropic => Dialect::Anthropic,
            None => Dialect::Chat,
        };
        let e = GatewayError::Overloaded {
            limit: in_flight.limit,
            retry_after_secs: RETRY_AFTER_SECS,
        };
        return crate::pipeline::error_response(shape, e);
    };
    let resp = next.run(req).await;
    resp.map(|body| {
        Body::new(Holding {
            inner: body,
            _permit: permit,
        })
    })
}

/// A response body that keeps its request's in-flight slot until it is dropped (sent, or the client left).
struct Holding {
    inner: Body,
    _permit: OwnedSemaphorePermit,
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
