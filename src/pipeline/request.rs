//! Stages 1 and 2: reading a request body whole, within its size limit and its deadline, and parsing it as a
//! request of its dialect.

use crate::app::AppState;
use crate::config::Config;
use crate::dialect::request::Call;
use crate::dialect::{Dialect, Request};
use crate::error::GatewayError;
use crate::metrics::{RejectReason, Route};
use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::time::Duration;

/// Reads a whole body, refusing more than `limit` bytes with 413 and a body not received within `timeout` with
/// 408.
pub async fn read_body(body: Body, limit: u64, timeout: Duration) -> Result<Bytes, GatewayError> {
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    let collect = http_body_util::Limited::new(body, limit_usize).collect();
    let Ok(collected) = tokio::time::timeout(timeout, collect).await else {
        return Err(GatewayError::RequestTimeout {
            secs: timeout.as_secs(),
        });
    };
    match collected {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(GatewayError::PayloadTooLarge { limit })
        }
        Err(e) => Err(GatewayError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// Reads `body` within `cfg.server`'s limits and parses it as a request of `dialect`, keeping every field and its
/// order; a body that timed out is counted as rejected, and a request whose history the upstream keeps as
/// unmanaged (it is forwarded as sent: see `Request::managed`).
pub(super) async fn receive(
    state: &AppState,
    cfg: &Config,
    body: Body,
    dialect: Dialect,
    call: &Call<'_>,
) -> Result<Request, GatewayError> {
    let timeout = Duration::from_secs(cfg.server.body_read_timeout_secs);
    let raw = match read_body(body, cfg.server.max_body_bytes, timeout).await {
        Ok(b) => b,
        Err(e) => {
            if matches!(e, GatewayError::RequestTimeout { .. }) {
                state
                    .metrics
                    .rejected(Route::Chat, dialect, RejectReason::BodyTimeout);
            }
            return Err(e);
        }
    };
    let request = dialect.parse(raw, call)?;
    if let Some(reason) = request.unmanaged_reason() {
        state.metrics.unmanaged(dialect, reason);
    }
    Ok(request)
}
