//! `GET /readyz`: readiness, for load balancers and orchestrators, with the store's state in its JSON. 200
//! `{"status":"ready"}` while the store answers a ping within `store.timeout_ms`; 200 `{"status":"degraded"}` with
//! the reason while the store's circuit breaker is open (answered at once, without asking the store).
//!
//! A store outage does not fail readiness, deliberately: the gateway still answers every request (as plain
//! proxying), and instances sharing one Redis all lose it at once — a readiness that failed then would take every
//! instance out of rotation together (Kubernetes removes unready endpoints and has no fail-open), turning a
//! history outage into a full outage. The degraded state is for monitoring instead: this JSON, the gauge
//! `ctxgate_store_circuit_open` and its alert.

use crate::app::AppState;
use crate::metrics::StoreOp;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;

pub(super) async fn handle(State(state): State<Arc<AppState>>) -> Response {
    let breaker = state.sessions.breaker();
    let backend = state.sessions.store().backend();
    let mut failed = None;
    if !breaker.is_open() {
        // A failed ping opens the breaker (reported below); the next requests do not wait for the store either.
        let ping = state.sessions.store().ping();
        match breaker.wait(StoreOp::Probe, ping).await {
            Ok(()) => {
                return Json(json!({"status": "ready", "store": backend, "circuit": "closed"}))
                    .into_response()
            }
            Err(e) => failed = Some(e),
        }
    }
    let Some(opened) = breaker.opened() else {
        // A failure that does not open the breaker (a full queue), or closed meanwhile by a probe.
        return match failed {
            Some(e) => Json(
                json!({"status": "degraded", "store": backend, "circuit": "closed",
                "reason": e.to_string()}),
            ),
            None => Json(json!({"status": "ready", "store": backend, "circuit": "closed"})),
        }
        .into_response();
    };
    let open_ms = u64::try_from(opened.since.elapsed().as_millis()).unwrap_or(u64::MAX);
    Json(json!({
        "status": "degraded",
        "store": backend,
        "circuit": "open",
        "reason": opened.reason,
        "open_ms": open_ms,
        "failed_probes": opened.failed_probes,
        "effect": "requests are proxied without waiting on the store: sessions not in the cache go without history, writes stay queued",
    }))
    .into_response()
}
