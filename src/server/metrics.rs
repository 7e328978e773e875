//! `GET /metrics` (the Prometheus text exposition), the admin API's request metrics, and the router of the
//! optional separate metrics listener (`[metrics] listen`).

use crate::app::AppState;
use crate::metrics::{self, DialectLabel, Route};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;
use std::time::Instant;

/// Answers a scrape: gauges read at scrape time (session cache, the store's circuit breaker, calibration) are
/// refreshed, then everything is encoded.
pub async fn handle(State(state): State<Arc<AppState>>) -> Response {
    let (sessions, bytes) = state.sessions.cache_stats_now().await;
    state.metrics.set_session_cache(sessions, bytes);
    state
        .metrics
        .set_store_circuit_open(state.sessions.breaker().is_open());
    state.metrics.set_calibration(&state.counter.ratios());
    (
        [(http::header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

/// Middleware counting and timing `/admin/*` requests (rejected ones included).
pub async fn count_admin(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let mut timer = state
        .metrics
        .start(Route::Admin, DialectLabel::NoDialect, Instant::now());
    let resp = next.run(req).await;
    timer.set_status(resp.status().as_u16());
    resp
}

/// The separate metrics listener's routes: `/metrics` only.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(handle))
        .with_state(state)
}
