//! `/v1/*` other than chat: method, query, headers and body streamed both ways, untouched.

use crate::app::AppState;
use crate::error::GatewayError;
use crate::metrics::{Route, UpstreamErrorClass};
use crate::relay;
use crate::upstream::strip_hop_by_hop;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use futures_util::{StreamExt, TryStreamExt};
use std::sync::Arc;
use std::time::Instant;

/// Forwards any `/v1/<rest>` request to `<upstream.base_url>/<rest>`.
pub async fn handle(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let started = Instant::now();
    // Records the request when dropped: with the response body, once it is relayed (or the client went away).
    let mut timer = state.metrics.start(Route::Passthrough, started);
    let (parts, body) = req.into_parts();
    let rest = parts
        .uri
        .path()
        .strip_prefix("/v1")
        .unwrap_or(parts.uri.path());
    let url = state.upstream.url(rest, parts.uri.query());
    let headers = state.upstream.request_headers(&parts.headers, false);
    let body = reqwest::Body::wrap_stream(body.into_data_stream().map_err(std::io::Error::other));
    let path = parts.uri.path().to_string();
    timer.upstream_sent();
    let result = state
        .upstream
        .send(parts.method.clone(), &url, headers, body)
        .await;
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            log(&parts.method, &path, e.status().as_u16(), started);
            let class = match e {
                GatewayError::UpstreamTimeout(_) => UpstreamErrorClass::Timeout,
                _ => UpstreamErrorClass::Unreachable,
            };
            state.metrics.upstream_error(Route::Passthrough, class);
            timer.set_status(e.status().as_u16());
            return e.into_response();
        }
    };
    log(&parts.method, &path, resp.status().as_u16(), started);
    let status = resp.status().as_u16();
    timer.set_status(status);
    if let Some(class) = UpstreamErrorClass::of_status(status) {
        state.metrics.upstream_error(Route::Passthrough, class);
    }
    let sse = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    timer.set_stream(sse);
    let mut builder = Response::builder().status(resp.status());
    for (k, v) in strip_hop_by_hop(resp.headers()).iter() {
        builder = builder.header(k, v);
    }
    let metrics = state.metrics.clone();
    let stream = relay::passthrough(resp.bytes_stream().boxed(), state.upstream.timeout()).map(
        move |chunk| {
            let _in_flight = &timer;
            if chunk.is_err() {
                metrics.upstream_error(Route::Passthrough, UpstreamErrorClass::Interrupted);
            }
            chunk
        },
    );
    builder
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| GatewayError::Internal(e.to_string()).into_response())
}

fn log(method: &http::Method, path: &str, status: u16, started: Instant) {
    tracing::info!(
        target: "ctxgate::access",
        method = %method,
        path,
        status,
        upstream_ms = started.elapsed().as_secs_f64() * 1000.0,
        "passthrough"
    );
}
