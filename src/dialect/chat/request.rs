//! Checking a chat-completions request: parsed with every field kept in order, refused with a clear 400 when it
//! is not one.

use crate::dialect::request::json_object_scanned;
use crate::dialect::{Dialect, Request};
use crate::error::GatewayError;
use bytes::Bytes;
use serde_json::{Map, Value};

/// Longest `model` accepted: real model names are far shorter, and the name is matched against the model table,
/// used as a metric label and logged.
pub const MAX_MODEL_LEN: usize = crate::context::models::MAX_MODEL_LEN;

/// Parses and checks the body: a JSON object with a `messages` array.
pub fn parse(raw: Bytes) -> Result<Request, GatewayError> {
    let (body, hashes) = json_object_scanned(&raw)?;
    match body.get("messages") {
        Some(Value::Array(messages)) => check_messages(messages)?,
        Some(_) => {
            return Err(GatewayError::BadRequest {
                message: "`messages` must be an array of message objects".into(),
                param: Some("messages"),
            })
        }
        None => {
            return Err(GatewayError::BadRequest {
                message: "missing required parameter: `messages`".into(),
                param: Some("messages"),
            })
        }
    }
    check_options(&body)?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model = match body.get("model") {
        None => String::new(),
        Some(Value::String(m)) if m.len() <= MAX_MODEL_LEN => m.clone(),
        Some(_) => {
            return Err(GatewayError::BadRequest {
                message: format!("`model` must be a string of at most {MAX_MODEL_LEN} bytes"),
                param: Some("model"),
            })
        }
    };
    Ok(Request::new(Dialect::Chat, raw, body, stream, model).with_item_hashes(hashes))
}

/// Every message must be an object with a string `role` (what the session tree, the planner and the recall tools
/// rely on); anything else about a message (content shapes, tool call ids) is the upstream's to judge.
fn check_messages(messages: &[Value]) -> Result<(), GatewayError> {
    for (i, m) in messages.iter().enumerate() {
        let problem = match m {
            Value::Object(o) => match o.get("role") {
                Some(Value::String(_)) => continue,
                Some(_) => "its `role` must be a string",
                None => "it has no `role`",
            },
            _ => "it must be a message object",
        };
        return Err(GatewayError::BadRequest {
            message: format!("invalid message at messages[{i}]: {problem}"),
            param: Some("messages"),
        });
    }
    Ok(())
}

/// `stream` must be a boolean and `n` a positive integer when given (`null` counts as absent): both decide how
/// ctxgate reads the answer (stream or body, recall offered or not).
fn check_options(body: &Map<String, Value>) -> Result<(), GatewayError> {
    if body
        .get("stream")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(GatewayError::BadRequest {
            message: "`stream` must be a boolean".into(),
            param: Some("stream"),
        });
    }
    if body
        .get("n")
        .is_some_and(|n| !n.is_null() && n.as_u64().is_none_or(|n| n < 1))
    {
        return Err(GatewayError::BadRequest {
            message: "`n` must be a positive integer".into(),
            param: Some("n"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_keeps_order_and_rejects_bad_bodies() {
        let raw = Bytes::from_static(
            br#"{"z_unknown":1,"model":"m","messages":[],"stream":true,"a":{"y":1,"x":2}}"#,
        );
        let r = parse(raw).unwrap();
        assert!(r.stream);
        let keys: Vec<&String> = r.body.keys().collect();
        assert_eq!(keys, ["z_unknown", "model", "messages", "stream", "a"]);
        for bad in [&b"nope"[..], b"[1]", b"{}", br#"{"messages":3}"#] {
            let e = parse(Bytes::copy_from_slice(bad)).unwrap_err();
            assert_eq!(e.status().as_u16(), 400);
        }
    }

    #[test]
    fn absurd_models_are_refused() {
        let parse = |model: serde_json::Value| {
            let body = serde_json::json!({"model": model, "messages": []});
            parse(Bytes::from(body.to_string()))
        };
        let longest = "m".repeat(MAX_MODEL_LEN);
        assert_eq!(parse(longest.clone().into()).unwrap().model, longest);
        for bad in [
            serde_json::json!("m".repeat(MAX_MODEL_LEN + 1)),
            serde_json::json!("x".repeat(30 << 20)),
            serde_json::json!(42),
            serde_json::json!(["gpt-4o"]),
            serde_json::json!({"name": "gpt-4o"}),
            serde_json::Value::Null,
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.status().as_u16(), 400);
            assert!(e.to_string().contains("`model`"), "{e}");
        }
        let absent = super::parse(Bytes::from_static(br#"{"messages":[]}"#)).unwrap();
        assert_eq!(absent.model, "");
    }

    #[test]
    fn messages_must_be_objects_with_a_string_role() {
        let bad: [(&[u8], &str); 7] = [
            (br#"{"messages":["hi"]}"#, "messages"),
            (
                br#"{"messages":[{"role":"user","content":"a"},null]}"#,
                "messages",
            ),
            (br#"{"messages":[[{"role":"user"}]]}"#, "messages"),
            (br#"{"messages":[{"content":"no role"}]}"#, "messages"),
            (br#"{"messages":[{"role":7,"content":"a"}]}"#, "messages"),
            (br#"{"messages":[],"stream":"yes"}"#, "stream"),
            (br#"{"messages":[],"n":0}"#, "n"),
        ];
        for (body, param) in bad {
            let e = parse(Bytes::copy_from_slice(body)).unwrap_err();
            assert_eq!(e.status().as_u16(), 400);
            assert_eq!(
                e.body()["error"]["param"],
                param,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        for good in [
            &br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"n":2,"stream":null}"#[..],
            br#"{"messages":[{"role":"assistant","content":null,"tool_calls":[]}],"n":null,"stream":false}"#,
        ] {
            assert!(parse(Bytes::copy_from_slice(good)).is_ok());
        }
    }
}
