//! Checking an Anthropic Messages request body (`POST /v1/messages`, and `POST /v1/messages/count_tokens`, which has
//! no `max_tokens` or `stream`): what ctxgate relies on to read the conversation, refused with a 400 naming the
//! field. Anything else (block fields, tool schemas, `max_tokens`) is the upstream's to judge.

use crate::dialect::request::{bad, check_model_and_stream};
use crate::error::GatewayError;
use serde_json::{Map, Value};

/// Checks a parsed body: `model` a string of at most `MAX_MODEL_LEN` bytes; `messages` an array of objects with
/// a `role` of `user`, `assistant` or `system` and `content` a string or an array of objects each with a string
/// `type`; `system` absent, a string or an array; `stream` a boolean or null.
pub fn check(body: &Map<String, Value>) -> Result<(), GatewayError> {
    check_model_and_stream(body)?;
    match body.get("messages") {
        Some(Value::Array(messages)) => check_messages(messages)?,
        Some(_) => {
            return Err(bad(
                "`messages` must be an array of message objects".into(),
                "messages",
            ))
        }
        None => {
            return Err(bad(
                "missing required parameter: `messages`".into(),
                "messages",
            ))
        }
    }
    if body
        .get("system")
        .is_some_and(|s| !s.is_string() && !s.is_array())
    {
        return Err(bad(
            "`system` must be a string or an array of content blocks".into(),
            "system",
        ));
    }
    Ok(())
}

fn check_messages(messages: &[Value]) -> Result<(), GatewayError> {
    for (i, m) in messages.iter().enumerate() {
        let Value::Object(o) = m else {
            return Err(invalid(i, "it must be a message object".into()));
        };
        match o.get("role") {
            Some(Value::String(r)) if matches!(r.as_str(), "user" | "assistant" | "system") => {}
            Some(Value::String(r)) => {
                return Err(invalid(
                    i,
                    format!("its `role` must be `user`, `assistant` or `system`, not {r:?}"),
                ))
            }
            Some(_) => return Err(invalid(i, "its `role` must be a string".into())),
            None => return Err(invalid(i, "it has no `role`".into())),
        }
        match o.get("content") {
            Some(Value::String(_)) => {}
            Some(Value::Array(blocks)) => {
                for (b, block) in blocks.iter().enumerate() {
                    if !block.get("type").is_some_and(Value::is_string) {
                        return Err(invalid(
                            i,
                            format!("content[{b}] must be an object with a string `type`"),
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(invalid(
                    i,
                    "its `content` must be a string or an array of content blocks".into(),
                ))
            }
            None => return Err(invalid(i, "it has no `content`".into())),
        }
    }
    Ok(())
}

fn invalid(i: usize, problem: String) -> GatewayError {
    bad(
        format!("invalid message at messages[{i}]: {problem}"),
        "messages",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(o) => o,
            _ => unreachable!("test bodies are objects"),
        }
    }

    #[test]
    fn good_bodies_pass() {
        for good in [
            json!({"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}),
            json!({"model":"m","messages":[],"system":"s","stream":null}),
            json!({"model":"m","messages":[
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{}}]},
                {"role":"system","content":"mid"},
                {"role":"assistant","content":[{"type":"thinking","thinking":"","signature":"x"}]}],
                "system":[{"type":"text","text":"s"}],"stream":true}),
            // count_tokens: no max_tokens, no stream.
            json!({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[]}),
        ] {
            assert!(check(&body(good.clone())).is_ok(), "{good}");
        }
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let long = "m".repeat(crate::context::models::MAX_MODEL_LEN + 1);
        let ok = "m".repeat(crate::context::models::MAX_MODEL_LEN);
        assert!(check(&body(json!({"model":ok,"messages":[]}))).is_ok());
        let cases = [
            (json!({"messages":[]}), "model"),
            (json!({"model":long,"messages":[]}), "model"),
            (json!({"model":7,"messages":[]}), "model"),
            (json!({"model":"m"}), "messages"),
            (json!({"model":"m","messages":{}}), "messages"),
            (json!({"model":"m","messages":["hi"]}), "messages"),
            (
                json!({"model":"m","messages":[{"content":"x"}]}),
                "messages",
            ),
            (
                json!({"model":"m","messages":[{"role":"tool","content":"x"}]}),
                "messages",
            ),
            (
                json!({"model":"m","messages":[{"role":1,"content":"x"}]}),
                "messages",
            ),
            (
                json!({"model":"m","messages":[{"role":"user"}]}),
                "messages",
            ),
            (
                json!({"model":"m","messages":[{"role":"user","content":7}]}),
                "messages",
            ),
            (
                json!({"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}),
                "messages",
            ),
            (
                json!({"model":"m","messages":[{"role":"user","content":["x"]}]}),
                "messages",
            ),
            (
                json!({"model":"m","messages":[],"system":{"text":"s"}}),
                "system",
            ),
            (json!({"model":"m","messages":[],"stream":"yes"}), "stream"),
        ];
        for (b, param) in cases {
            let e = check(&body(b.clone())).unwrap_err();
            assert_eq!(e.status().as_u16(), 400, "{b}");
            assert_eq!(e.body()["error"]["param"], param, "{b}");
            assert!(
                e.to_string().contains(&format!("`{param}`")) || param == "messages",
                "{e}"
            );
        }
        let e = check(&body(
            json!({"model":"m","messages":[{"role":"user","content":"a"},{"role":"user"}]}),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("messages[1]"), "{e}");
    }
}
