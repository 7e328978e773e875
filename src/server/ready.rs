//! `GET /readyz`: readiness, for load balancers and orchestrators. 200 while the store answers within
//! `store.timeout_ms`; 503 with a JSON reason otherwise (requests are still served then, as plain proxying, so
//! `/healthz` — liveness only — stays 200 and nothing should restart the process for it).

use crate::app::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

pub(super) async fn handle(State(state): State<Arc<AppState>>) -> Response {
    let store = state.sessions.store();
    let backend = store.backend();
    let timeout = Duration::from_millis(state.config.store.timeout_ms);
    let reason = match tokio::time::timeout(timeout, store.ping()).await {
        Ok(Ok(())) => {
            return Json(json!({"status": "ready", "store": backend})).into_response();
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "the store did not answer within {} ms (store.timeout_ms)",
            timeout.as_millis()
        ),
    };
    tracing::warn!(store = backend, reason = %reason, "readyz: not ready");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": "not ready", "store": backend, "reason": reason})),
    )
        .into_response()
}
