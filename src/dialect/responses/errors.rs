//! ctxgate's own errors in the Responses API's shape: the body is OpenAI's `{"error":{message,type,param,code}}`
//! (`GatewayError::body`, with `input` as the parameter of a request that cannot fit); a stream broken mid-way
//! ends with an `error` event `{"type":"error","code","message","param","sequence_number"}` numbered after the
//! events already sent.

use crate::error::GatewayError;
use bytes::Bytes;
use serde_json::{json, Value};

/// The error body: `GatewayError::body`, except that the parameter of a request that cannot fit is `input`.
pub fn error_body(e: &GatewayError) -> Value {
    let mut b = e.body();
    if matches!(e, GatewayError::ContextLengthExceeded { .. }) {
        b["error"]["param"] = json!("input");
    }
    b
}

/// The data of the SSE `error` event for `e`, without its `sequence_number`.
pub fn error_value(e: &GatewayError) -> Value {
    let b = error_body(e);
    let field = |k: &str| b["error"].get(k).cloned().unwrap_or(Value::Null);
    json!({"type": "error", "code": field("code"), "message": field("message"), "param": field("param")})
}

/// The SSE `error` event for `e`, numbered `sequence_number` (the next of the stream it ends).
pub fn error_event(e: &GatewayError, sequence_number: u64) -> Bytes {
    let mut v = error_value(e);
    v["sequence_number"] = json!(sequence_number);
    Bytes::from(format!("event: error\ndata: {v}\n\n"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::sse::SseParser;

    #[test]
    fn the_body_is_openais_with_input_as_the_parameter_of_an_unfittable_request() {
        let e = GatewayError::UpstreamTimeout(30);
        assert_eq!(error_body(&e), e.body());
        let e = GatewayError::ContextLengthExceeded {
            message: "the request needs 250000 tokens".into(),
            tokens: 250_000,
            limit: 200_000,
        };
        let b = error_body(&e);
        assert_eq!(b["error"]["code"], "context_length_exceeded");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["param"], "input");
        assert_eq!(b["error"]["message"], "the request needs 250000 tokens");
    }

    #[test]
    fn the_error_event_is_one_numbered_sse_event() {
        let e = GatewayError::UpstreamUnreachable("reset".into());
        let b = error_event(&e, 17);
        let mut p = SseParser::new();
        let events = p.feed(&b);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event.as_deref(), Some("error"));
        let v: Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(
            v,
            json!({"type":"error","code":"upstream_unreachable","message":"upstream unreachable: reset",
                   "param":null,"sequence_number":17})
        );
        assert!(b.ends_with(b"\n\n"));
    }
}
