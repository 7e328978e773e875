//! The admin API's failures, in the gateway's JSON error shape: its [`GatewayError`]s, the session store
//! unavailable (503 with `retry-after`, not 500 `internal error`), and a body over a route's limit (413, not
//! axum's plain text).

use crate::app::AppState;
use crate::error::GatewayError;
use crate::session::breaker;
use crate::store::StoreError;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

/// Seconds a client is told to wait while the store is unavailable: the longest pause between two probes of the
/// store's circuit breaker, after which a healthy store's circuit is closed.
pub const RETRY_AFTER_SECS: u64 = match breaker::PROBE_MAX.as_secs() {
    0 => 1,
    s => s,
};

/// Why an admin request failed.
#[derive(Debug)]
pub enum AdminError {
    /// What the rest of the gateway answers too.
    Gateway(GatewayError),
    /// The session store does not answer, or its circuit is open: 503 with `retry-after`.
    StoreUnavailable(String),
}

impl From<GatewayError> for AdminError {
    fn from(e: GatewayError) -> Self {
        AdminError::Gateway(e)
    }
}

/// A store failure as the admin API answers it: 503 when the store is unavailable — its circuit is open, or it
/// did not answer in time, refused the write (a full queue) or is shutting down — else 500.
pub fn store_error(state: &AppState, e: StoreError) -> AdminError {
    let opened = state.sessions.breaker().opened();
    let unavailable = matches!(
        e,
        StoreError::Unavailable
            | StoreError::Timeout(_)
            | StoreError::QueueFull
            | StoreError::Closed
    );
    match opened {
        Some(o) => AdminError::StoreUnavailable(format!(
            "its circuit is open after: {}; a background probe closes it once the store answers",
            o.reason
        )),
        None if unavailable => AdminError::StoreUnavailable(e.to_string()),
        None => AdminError::Gateway(GatewayError::Internal(e.to_string())),
    }
}

/// A body the extractor could not read: 413 over `limit` (named `by`), else 400.
pub fn body_rejected(r: &BytesRejection, limit: u64, by: &'static str) -> AdminError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        // 413 in the gateway's JSON error shape (`request_too_large`), not axum's plain text
        AdminError::Gateway(GatewayError::TooLarge {
            message: format!("request body exceeds the limit of {limit} bytes ({by})"),
        })
    } else {
        AdminError::Gateway(GatewayError::bad_request(format!(
            "the request body could not be read: {}",
            r.body_text()
        )))
    }
}

fn error_body(message: String, kind: &str, code: &str) -> serde_json::Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        match self {
            AdminError::Gateway(e) => e.into_response(),
            AdminError::StoreUnavailable(why) => {
                let message = format!(
                    "the session store is unavailable ({why}); retry after {RETRY_AFTER_SECS} s"
                );
                let mut r = (
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(error_body(message, "server_error", "store_unavailable")),
                )
                    .into_response();
                r.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from(RETRY_AFTER_SECS),
                );
                r
            }
        }
    }
}
