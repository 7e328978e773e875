//! ctxgate's own errors in Google's shape: `{"error":{"code","message","status"}}`, `status` the gRPC name of the
//! HTTP status (what `@google/genai` reads into its `ApiError`), as a body or as the SSE event ending a stream.

use crate::error::GatewayError;
use serde_json::{json, Value};

/// The gRPC status name Google's APIs give an HTTP status.
pub fn status_name(code: u16) -> &'static str {
    match code {
        400 | 411 | 413 | 415 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        _ => "INTERNAL",
    }
}

/// The error body (the message is the error's own text; a request that cannot fit says so in Google's words).
pub fn error_body(e: &GatewayError) -> Value {
    let code = e.status().as_u16();
    let message = match e {
        GatewayError::ContextLengthExceeded { tokens, limit, .. } => format!(
            "The input token count ({tokens}) exceeds the maximum number of tokens allowed ({limit})."
        ),
        other => other.to_string(),
    };
    json!({"error": {"code": code, "message": message, "status": status_name(code)}})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn errors_take_googles_shape() {
        let b = error_body(&GatewayError::bad_request("bad thing"));
        assert_eq!(b["error"]["code"], 400);
        assert_eq!(b["error"]["status"], "INVALID_ARGUMENT");
        assert!(b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad thing"));
        let b = error_body(&GatewayError::UpstreamTimeout(5));
        assert_eq!(
            b["error"]["status"],
            status_name(b["error"]["code"].as_u64().unwrap() as u16)
        );
    }
}
