//! The one error type of the request path, its exhaustive HTTP status mapping, and OpenAI's error shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Everything that can go wrong while ctxgate itself handles a request.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The client sent something we cannot use.
    #[error("{message}")]
    BadRequest {
        /// Human-readable explanation.
        message: String,
        /// The offending parameter, when there is one.
        param: Option<&'static str>,
    },
    /// The request body exceeds `server.max_body_bytes`.
    #[error("request body exceeds the limit of {limit} bytes (server.max_body_bytes)")]
    PayloadTooLarge {
        /// The configured limit.
        limit: u64,
    },
    /// A conversation request holds more than the gateway manages (`server.max_messages`, more memory than
    /// `server.request_memory_bytes`, or a compressed body that decodes past `server.max_body_bytes`): 413, before
    /// it is parsed.
    #[error("{message}")]
    TooLarge {
        /// What was counted and the limit, by its key.
        message: String,
    },
    /// Requests in flight hold `server.request_memory_bytes`: 503 with `retry-after`.
    #[error("the gateway's memory for requests in flight is spent: this request needs ~{need_mib} MiB of the {limit_mib} MiB that server.request_memory_bytes allows; retry after {retry_after_secs} s")]
    MemoryBusy {
        /// The estimate for this request, MiB.
        need_mib: u64,
        /// The configured budget, MiB.
        limit_mib: u64,
        /// Seconds the client is told to wait (`retry-after`).
        retry_after_secs: u64,
    },
    /// The client did not send the whole request body within `server.body_read_timeout_secs`.
    #[error("the request body was not received within {secs} s (server.body_read_timeout_secs)")]
    RequestTimeout {
        /// The configured deadline.
        secs: u64,
    },
    /// `server.max_in_flight` requests are already being served.
    #[error("the gateway is serving its limit of {limit} requests (server.max_in_flight); retry after {retry_after_secs} s")]
    Overloaded {
        /// The configured limit.
        limit: usize,
        /// Seconds the client is told to wait (`retry-after`).
        retry_after_secs: u64,
    },
    /// `server.max_connections` connections are open: a connection of the probes' reserve asked for anything
    /// but `/healthz` or `/readyz`.
    #[error("the gateway has its limit of {limit} connections open (server.max_connections); beyond it only /healthz and /readyz are answered; retry after 1 s")]
    ConnectionsFull {
        /// The configured limit.
        limit: usize,
    },
    /// Even the hard limit cannot make the request fit the model's window.
    #[error("{message}")]
    ContextLengthExceeded {
        /// The numbers involved.
        message: String,
        /// Estimated tokens of the smallest rewrite.
        tokens: u64,
        /// The hard limit in tokens.
        limit: u64,
    },
    /// The admin API was called without valid credentials.
    #[error("admin API: missing or invalid bearer token")]
    Unauthorized,
    /// Without a configured token the admin API is off, or serves loopback peers only.
    #[error(
        "admin API: no [admin] token is configured; without one it is off, or serves loopback peers only when \
         [admin] allow_loopback_without_token allows it"
    )]
    Forbidden,
    /// An admin request that a browser may have forged (a foreign `Host`, `Origin` or `Sec-Fetch-Site`): refused
    /// whatever the credentials.
    #[error("admin API: {0}")]
    ForeignRequest(String),
    /// A state-changing admin request whose body is not JSON or JSON Lines; a conversation body in a
    /// `Content-Encoding` ctxgate does not decode.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// An unknown resource (admin API).
    #[error("{0}")]
    NotFound(String),
    /// The upstream could not be reached or broke the connection.
    #[error("upstream unreachable: {0}")]
    UpstreamUnreachable(String),
    /// The upstream did not answer in time.
    #[error("upstream timed out after {0} s (upstream.timeout_secs)")]
    UpstreamTimeout(u64),
    /// The gateway is shutting down and cut the stream when `server.shutdown_grace_secs` ran out.
    #[error(
        "the gateway is shutting down: the stream was cut when its grace of {grace_secs} s ran out \
         (server.shutdown_grace_secs); retry the request"
    )]
    ShuttingDown {
        /// The configured grace.
        grace_secs: u64,
    },
    /// A bug or an unexpected local failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    /// Shorthand for a 400 without a parameter.
    pub fn bad_request(message: impl Into<String>) -> Self {
        GatewayError::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            GatewayError::PayloadTooLarge { .. } | GatewayError::TooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            GatewayError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            GatewayError::Overloaded { .. }
            | GatewayError::MemoryBusy { .. }
            | GatewayError::ShuttingDown { .. }
            | GatewayError::ConnectionsFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::ContextLengthExceeded { .. } => StatusCode::BAD_REQUEST,
            GatewayError::Unauthorized => StatusCode::UNAUTHORIZED,
            GatewayError::Forbidden | GatewayError::ForeignRequest(_) => StatusCode::FORBIDDEN,
            GatewayError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            GatewayError::NotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn error_type(&self) -> &'static str {
        match self {
            GatewayError::BadRequest { .. }
            | GatewayError::PayloadTooLarge { .. }
            | GatewayError::TooLarge { .. }
            | GatewayError::RequestTimeout { .. }
            | GatewayError::ContextLengthExceeded { .. }
            | GatewayError::UnsupportedMediaType(_) => "invalid_request_error",
            GatewayError::Unauthorized
            | GatewayError::Forbidden
            | GatewayError::ForeignRequest(_) => "authentication_error",
            GatewayError::NotFound(_) => "not_found_error",
            GatewayError::UpstreamUnreachable(_) | GatewayError::UpstreamTimeout(_) => {
                "upstream_error"
            }
            GatewayError::Overloaded { .. }
            | GatewayError::MemoryBusy { .. }
            | GatewayError::ShuttingDown { .. }
            | GatewayError::ConnectionsFull { .. }
            | GatewayError::Internal(_) => "server_error",
        }
    }

    /// OpenAI's `error.code`.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            GatewayError::BadRequest { .. } => None,
            GatewayError::PayloadTooLarge { .. } | GatewayError::TooLarge { .. } => {
                Some("request_too_large")
            }
            GatewayError::RequestTimeout { .. } => Some("request_timeout"),
            GatewayError::Overloaded { .. }
            | GatewayError::MemoryBusy { .. }
            | GatewayError::ConnectionsFull { .. } => Some("overloaded"),
            GatewayError::ShuttingDown { .. } => Some("shutting_down"),
            GatewayError::ContextLengthExceeded { .. } => Some("context_length_exceeded"),
            GatewayError::Unauthorized => Some("invalid_api_key"),
            GatewayError::Forbidden => Some("forbidden"),
            GatewayError::ForeignRequest(_) => Some("foreign_request"),
            GatewayError::UnsupportedMediaType(_) => Some("unsupported_media_type"),
            GatewayError::NotFound(_) => Some("not_found"),
            GatewayError::UpstreamUnreachable(_) => Some("upstream_unreachable"),
            GatewayError::UpstreamTimeout(_) => Some("upstream_timeout"),
            GatewayError::Internal(_) => None,
        }
    }

    /// The body in OpenAI's `{"error":{message,type,param,code}}` shape.
    pub fn body(&self) -> serde_json::Value {
        let param = match self {
            GatewayError::BadRequest { param, .. } => *param,
            GatewayError::ContextLengthExceeded { .. } => Some("messages"),
            _ => None,
        };
        json!({"error": {
            "message": self.to_string(),
            "type": self.error_type(),
            "param": param,
            "code": self.code(),
        }})
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        let retry_after = match self {
            GatewayError::Overloaded {
                retry_after_secs, ..
            }
            | GatewayError::MemoryBusy {
                retry_after_secs, ..
            } => Some(retry_after_secs),
            GatewayError::ConnectionsFull { .. } => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_shape() {
        let cases = [
            (GatewayError::bad_request("x"), 400),
            (GatewayError::PayloadTooLarge { limit: 1 }, 413),
            (GatewayError::RequestTimeout { secs: 1 }, 408),
            (
                GatewayError::Overloaded {
                    limit: 1,
                    retry_after_secs: 1,
                },
                503,
            ),
            (GatewayError::UpstreamUnreachable("refused".into()), 502),
            (GatewayError::UpstreamTimeout(5), 504),
            (GatewayError::Internal("x".into()), 500),
            (GatewayError::ForeignRequest("x".into()), 403),
            (GatewayError::ConnectionsFull { limit: 1 }, 503),
            (GatewayError::UnsupportedMediaType("x".into()), 415),
        ];
        for (e, code) in cases {
            assert_eq!(e.status().as_u16(), code);
            let b = e.body();
            assert!(b["error"]["message"].is_string());
            assert!(b["error"]["type"].is_string());
            assert!(b["error"].get("param").is_some() && b["error"].get("code").is_some());
        }
    }

    #[test]
    fn overloaded_says_when_to_retry() {
        let resp = GatewayError::Overloaded {
            limit: 4,
            retry_after_secs: 2,
        }
        .into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "2");
    }
}
