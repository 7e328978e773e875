//! The server span of a `/v1/*` request (HTTP semantic conventions), continuing the client's trace when it sent
//! `traceparent`/`tracestate`; and `traceparent` on what goes upstream.

use super::spans::RequestTrace;
use super::Tracing;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

/// Middleware: opens the request's server span (a child of the client's span when it sent one), hands it to the
/// handler in the request's extensions ([`RequestTrace`]), and ends it when the response body has gone out (a
/// stream's end, or the client leaving).
pub async fn trace_request(
    State(t): State<Arc<Tracing>>,
    mut req: Request,
    next: Next,
) -> Response {
    let parent = TraceContextPropagator::new().extract_with_context(
        &Context::new(),
        &opentelemetry_http::HeaderExtractor(req.headers()),
    );
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let span = t
        .tracer
        .span_builder(format!("{method} {route}"))
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("http.request.method", method),
            KeyValue::new("http.route", route),
            KeyValue::new("url.path", req.uri().path().to_owned()),
            KeyValue::new("url.scheme", "http"),
        ])
        .start_with_context(&t.tracer, &parent);
    let cx = parent.with_span(span);
    req.extensions_mut()
        .insert(RequestTrace::new(t.clone(), cx.clone()));
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    let span = cx.span();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if status >= 500 {
        // Server spans mark only 5xx as errors (4xx is the client's).
        span.set_attribute(KeyValue::new("error.type", status.to_string()));
        span.set_status(Status::error(""));
    }
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, Body::new(EndsSpan { body, cx }))
}

/// A response body that ends its request's span when it is finished or dropped.
struct EndsSpan {
    body: Body,
    cx: Context,
}

impl Drop for EndsSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

impl http_body::Body for EndsSpan {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Puts `traceparent` (and `tracestate` when there is one) naming the span of `cx` into `headers`, replacing the
/// client's: the upstream's work becomes a child of ctxgate's upstream span.
pub fn inject(cx: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new()
        .inject_context(cx, &mut opentelemetry_http::HeaderInjector(headers));
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags};

    #[test]
    fn a_client_traceparent_is_continued_and_passed_on_with_our_span_id() {
        let mut incoming = HeaderMap::new();
        incoming.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        incoming.insert("tracestate", http::HeaderValue::from_static("vendor=abc"));
        let parent = TraceContextPropagator::new().extract_with_context(
            &Context::new(),
            &opentelemetry_http::HeaderExtractor(&incoming),
        );
        let sc = parent.span().span_context().clone();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.trace_state().header(), "vendor=abc");
        // Our span: same trace, its own id.
        let ours = SpanContext::new(
            sc.trace_id(),
            SpanId::from_hex("b7ad6b7169203331").unwrap_or(SpanId::INVALID),
            TraceFlags::SAMPLED,
            false,
            sc.trace_state().clone(),
        );
        let mut out = incoming.clone();
        inject(&Context::new().with_remote_span_context(ours), &mut out);
        assert_eq!(
            out["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
        );
        assert_eq!(out["tracestate"], "vendor=abc");
    }

    #[test]
    fn a_malformed_traceparent_starts_a_new_trace() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736",
        ] {
            let mut h = HeaderMap::new();
            h.insert("traceparent", http::HeaderValue::from_static(bad));
            let cx = TraceContextPropagator::new()
                .extract_with_context(&Context::new(), &opentelemetry_http::HeaderExtractor(&h));
            assert!(!cx.span().span_context().is_valid(), "{bad}");
        }
    }
}
