//! `GET /v1/responses` with `Upgrade: websocket` (Codex's built-in OpenAI provider tries Responses over a WebSocket
//! first): refused at once with 426 and an OpenAI-shaped error, since ctxgate speaks HTTP (SSE) on
//! `/v1/responses`. Codex treats a 426 on the handshake as "fall back to HTTP" and goes on with `POST
//! /v1/responses` straight away (a 404 made it retry the handshake several times first). Any other `GET
//! /v1/responses` is the upstream's: passed through.

use super::passthrough;
use crate::app::AppState;
use crate::metrics::{DialectLabel, Route};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, StatusCode};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// The message of the refusal.
pub const MESSAGE: &str =
    "ctxgate speaks HTTP on /v1/responses: WebSocket upgrades are not supported; \
                           send POST /v1/responses (stream: true for server-sent events)";

/// Whether the request asks to switch protocols (an `Upgrade` header naming anything, WebSocket included).
pub fn asks_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().is_empty())
}

/// `GET /v1/responses`: 426 for an upgrade, the passthrough otherwise.
pub async fn handle(State(state): State<Arc<AppState>>, req: Request) -> Response {
    if !asks_upgrade(req.headers()) {
        return passthrough::handle(State(state), req).await;
    }
    let mut timer =
        state
            .metrics
            .start(Route::Passthrough, DialectLabel::NoDialect, Instant::now());
    timer.set_status(StatusCode::UPGRADE_REQUIRED.as_u16());
    tracing::info!(
        target: "ctxgate::access",
        method = "GET",
        path = "/v1/responses",
        status = StatusCode::UPGRADE_REQUIRED.as_u16(),
        "websocket upgrade refused: clients fall back to HTTP"
    );
    let body = json!({"error": {
        "message": MESSAGE,
        "type": "invalid_request_error",
        "param": null,
        "code": "websocket_not_supported",
    }});
    (StatusCode::UPGRADE_REQUIRED, axum::Json(body)).into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn only_a_named_protocol_is_an_upgrade() {
        let mut h = HeaderMap::new();
        assert!(!asks_upgrade(&h));
        h.insert(header::UPGRADE, " ".parse().unwrap());
        assert!(!asks_upgrade(&h));
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert!(asks_upgrade(&h));
        h.insert(header::UPGRADE, "WebSocket".parse().unwrap());
        assert!(asks_upgrade(&h));
    }
}
