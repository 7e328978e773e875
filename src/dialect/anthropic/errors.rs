//! ctxgate's own errors in Anthropic's shape: `{"type":"error","error":{"type","message"}}`, as a body or as an SSE
//! `error` event for a stream broken mid-way.

use crate::error::GatewayError;
use bytes::Bytes;
use serde_json::{json, Value};

/// Anthropic's `error.type` for `e`, chosen by the status ctxgate answers with.
pub fn error_type(e: &GatewayError) -> &'static str {
    match e {
        GatewayError::BadRequest { .. } | GatewayError::ContextLengthExceeded { .. } => {
            "invalid_request_error"
        }
        GatewayError::PayloadTooLarge { .. } | GatewayError::TooLarge { .. } => "request_too_large",
        GatewayError::RequestTimeout { .. } | GatewayError::UpstreamTimeout(_) => "timeout_error",
        GatewayError::Overloaded { .. }
        | GatewayError::MemoryBusy { .. }
        | GatewayError::ShuttingDown { .. }
        | GatewayError::ConnectionsFull { .. } => "overloaded_error",
        GatewayError::Unauthorized => "authentication_error",
        GatewayError::Forbidden | GatewayError::ForeignRequest(_) => "permission_error",
        GatewayError::UnsupportedMediaType(_) => "invalid_request_error",
        GatewayError::NotFound(_) => "not_found_error",
        GatewayError::UpstreamUnreachable(_) | GatewayError::Internal(_) => "api_error",
    }
}

/// The message: the error's own text, except for a request that cannot fit, which gets the API's wording
/// (`prompt is too long: N tokens > M maximum`) that Claude Code answers by compacting its history.
pub fn error_message(e: &GatewayError) -> String {
    match e {
        GatewayError::ContextLengthExceeded { tokens, limit, .. } => {
            format!("prompt is too long: {tokens} tokens > {limit} maximum")
        }
        other => other.to_string(),
    }
}

/// The error body.
pub fn error_body(e: &GatewayError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e), "message": error_message(e)}})
}

/// An SSE `error` event carrying [`error_body`], to end a stream that broke after its status was sent.
pub fn error_event(e: &GatewayError) -> Bytes {
    let mut b = b"event: error\ndata: ".to_vec();
    b.extend(serde_json::to_vec(&error_body(e)).unwrap_or_default());
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn all() -> Vec<(GatewayError, u16, &'static str)> {
        vec![
            (
                GatewayError::bad_request("bad"),
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::ContextLengthExceeded {
                    message: "x".into(),
                    tokens: 250_000,
                    limit: 200_000,
                },
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::PayloadTooLarge { limit: 9 },
                413,
                "request_too_large",
            ),
            (
                GatewayError::RequestTimeout { secs: 3 },
                408,
                "timeout_error",
            ),
            (
                GatewayError::Overloaded {
                    limit: 4,
                    retry_after_secs: 1,
                },
                503,
                "overloaded_error",
            ),
            (GatewayError::Unauthorized, 401, "authentication_error"),
            (GatewayError::Forbidden, 403, "permission_error"),
            (
                GatewayError::NotFound("no such session".into()),
                404,
                "not_found_error",
            ),
            (
                GatewayError::UpstreamUnreachable("refused".into()),
                502,
                "api_error",
            ),
            (GatewayError::UpstreamTimeout(30), 504, "timeout_error"),
            (GatewayError::Internal("bug".into()), 500, "api_error"),
        ]
    }

    #[test]
    fn every_error_has_the_anthropic_shape() {
        for (e, status, kind) in all() {
            assert_eq!(e.status().as_u16(), status, "{e:?}");
            let b = error_body(&e);
            assert_eq!(b["type"], "error");
            assert_eq!(b["error"]["type"], kind, "{e:?}");
            assert!(!b["error"]["message"].as_str().unwrap().is_empty());
            assert_eq!(b.as_object().unwrap().len(), 2);
        }
        assert_eq!(
            error_body(&GatewayError::UpstreamTimeout(30))["error"]["message"],
            GatewayError::UpstreamTimeout(30).to_string()
        );
    }

    #[test]
    fn an_unfittable_prompt_uses_the_words_claude_code_compacts_on() {
        let e = GatewayError::ContextLengthExceeded {
            message: "the request needs 250000 tokens".into(),
            tokens: 250_000,
            limit: 200_000,
        };
        assert_eq!(
            error_body(&e)["error"]["message"],
            "prompt is too long: 250000 tokens > 200000 maximum"
        );
    }

    #[test]
    fn the_error_event_is_one_sse_event() {
        let e = GatewayError::UpstreamUnreachable("reset".into());
        let b = error_event(&e);
        let events = super::super::fixtures::parse(&b);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event.as_deref(), Some("error"));
        let v: Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(v, error_body(&e));
        assert!(b.ends_with(b"\n\n"));
    }
}
