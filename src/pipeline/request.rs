//! Reading a request body: whole, within its size limit and its deadline.

use crate::error::GatewayError;
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

