//! Checking a Responses request body (`POST /v1/responses`): what ctxgate relies on to read the conversation,
//! refused with a 400 naming the field; and whether ctxgate may manage the conversation at all. Anything else
//! (item fields, tool schemas, `reasoning`) is the upstream's to judge.

use crate::dialect::request::{bad, check_model_and_stream};
use crate::error::GatewayError;
use serde_json::{Map, Value};

/// Checks a parsed body: `model` a string of at most `MAX_MODEL_LEN` bytes; `input` a string or an array of
/// objects each with a string `type` or (the shorthand message form) a string `role`; `instructions` a string or
/// null; `stream` a boolean or null.
pub fn check(body: &Map<String, Value>) -> Result<(), GatewayError> {
    check_model_and_stream(body)?;
    match body.get("input") {
        Some(Value::String(_)) => {}
        Some(Value::Array(items)) => check_items(items)?,
        Some(_) => {
            return Err(bad(
                "`input` must be a string or an array of input items".into(),
                "input",
            ))
        }
        None => return Err(bad("missing required parameter: `input`".into(), "input")),
    }
    if body
        .get("instructions")
        .is_some_and(|s| !s.is_string() && !s.is_null())
    {
        return Err(bad(
            "`instructions` must be a string".into(),
            "instructions",
        ));
    }
    Ok(())
}

fn check_items(items: &[Value]) -> Result<(), GatewayError> {
    for (i, it) in items.iter().enumerate() {
        let Value::Object(o) = it else {
            return Err(invalid(i, "it must be an object".into()));
        };
        match (o.get("type"), o.get("role")) {
            (Some(Value::String(_)), _) | (None, Some(Value::String(_))) => {}
            (Some(_), _) => return Err(invalid(i, "its `type` must be a string".into())),
            (None, Some(_)) => return Err(invalid(i, "its `role` must be a string".into())),
            (None, None) => return Err(invalid(i, "it has no `type`".into())),
        }
    }
    Ok(())
}

fn invalid(i: usize, problem: String) -> GatewayError {
    bad(
        format!("invalid input item at input[{i}]: {problem}"),
        "input",
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
            json!({"model":"gpt-5","input":"hi"}),
            json!({"model":"m","input":[],"instructions":null,"stream":null}),
            json!({"model":"m","instructions":"be brief","stream":true,"input":[
                {"role":"user","content":"hi"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}],"phase":"final_answer"},
                {"type":"reasoning","summary":[],"encrypted_content":"gAAA"},
                {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":"c","output":"x"},
                {"type":"compaction","encrypted_content":"e"},
                {"type":"some_future_item"}]}),
        ] {
            assert!(check(&body(good.clone())).is_ok(), "{good}");
        }
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let long = "m".repeat(crate::context::models::MAX_MODEL_LEN + 1);
        let ok = "m".repeat(crate::context::models::MAX_MODEL_LEN);
        assert!(check(&body(json!({"model":ok,"input":[]}))).is_ok());
        let cases = [
            (json!({"input":[]}), "model"),
            (json!({"model":long,"input":[]}), "model"),
            (json!({"model":7,"input":[]}), "model"),
            (json!({"model":"m"}), "input"),
            (json!({"model":"m","input":{}}), "input"),
            (json!({"model":"m","input":7}), "input"),
            (json!({"model":"m","input":["hi"]}), "input"),
            (json!({"model":"m","input":[{"content":"x"}]}), "input"),
            (json!({"model":"m","input":[{"type":7}]}), "input"),
            (
                json!({"model":"m","input":[{"role":1,"content":"x"}]}),
                "input",
            ),
            (
                json!({"model":"m","input":[],"instructions":["s"]}),
                "instructions",
            ),
            (json!({"model":"m","input":[],"stream":"yes"}), "stream"),
        ];
        for (b, param) in cases {
            let e = check(&body(b.clone())).unwrap_err();
            assert_eq!(e.status().as_u16(), 400, "{b}");
            assert_eq!(e.body()["error"]["param"], param, "{b}");
            assert!(
                e.to_string().contains(&format!("`{param}`")) || param == "input",
                "{e}"
            );
        }
        let e = check(&body(
            json!({"model":"m","input":[{"role":"user","content":"a"},{}]}),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("input[1]"), "{e}");
    }

    fn managed(b: &Map<String, Value>) -> bool {
        super::super::unmanaged::unmanaged_reason(b).is_none()
    }

    #[test]
    fn server_state_and_remote_compaction_are_not_managed() {
        assert!(managed(&body(json!({"model":"m","input":"hi"}))));
        assert!(managed(&body(
            json!({"model":"m","input":[],"previous_response_id":null})
        )));
        assert!(!managed(&body(
            json!({"model":"m","input":"hi","previous_response_id":"resp_1"})
        )));
        assert!(!managed(&body(
            json!({"model":"m","input":"hi","conversation":"conv_1"})
        )));
        let trig = json!({"model":"m","input":[{"role":"user","content":"a"},{"type":"compaction_trigger"}]});
        assert!(!managed(&body(trig)));
        let mid = json!({"model":"m","input":[{"type":"compaction_trigger"},{"role":"user","content":"a"}]});
        // a trigger anywhere (the API only accepts one last) is left for the upstream to judge, unrewritten
        assert!(!managed(&body(mid)));
    }
}
