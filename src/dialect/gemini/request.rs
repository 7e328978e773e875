//! The checks of a Gemini `generateContent` body (the model and the method are in the path: see `endpoint.rs`):
//! `contents` an array of contents with a `user` or `model` role (or none, a user turn) and an array of part
//! objects; `systemInstruction` a content; `tools` an array.

use crate::dialect::request::bad;
use crate::error::GatewayError;
use serde_json::{Map, Value};

/// Checks a `generateContent` body.
pub fn check(body: &Map<String, Value>) -> Result<(), GatewayError> {
    let contents = match body.get("contents") {
        Some(Value::Array(c)) => c,
        Some(_) => {
            return Err(bad(
                "`contents` must be an array of contents".into(),
                "contents",
            ))
        }
        None => {
            return Err(bad(
                "missing required parameter: `contents`".into(),
                "contents",
            ))
        }
    };
    for (i, c) in contents.iter().enumerate() {
        let Value::Object(o) = c else {
            return Err(bad(format!("contents[{i}] must be an object"), "contents"));
        };
        match o.get("role") {
            None | Some(Value::Null) => {}
            Some(Value::String(r)) if r == "user" || r == "model" => {}
            Some(r) => {
                return Err(bad(
                    format!("contents[{i}].role must be `user` or `model`, not {r}"),
                    "contents",
                ))
            }
        }
        match o.get("parts") {
            Some(Value::Array(parts)) if parts.iter().all(Value::is_object) => {}
            _ => {
                return Err(bad(
                    format!("contents[{i}].parts must be an array of part objects"),
                    "contents",
                ))
            }
        }
    }
    if body
        .get("systemInstruction")
        .is_some_and(|s| !s.is_object() && !s.is_null())
    {
        return Err(bad(
            "`systemInstruction` must be a content object".into(),
            "systemInstruction",
        ));
    }
    if body
        .get("tools")
        .is_some_and(|t| !t.is_array() && !t.is_null())
    {
        return Err(bad("`tools` must be an array".into(), "tools"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_are_checked() {
        let ok = |v: Value| check(v.as_object().unwrap());
        assert!(ok(
            json!({"contents":[{"role":"user","parts":[{"text":"hi"}]},{"parts":[{"text":"x"}]}]})
        )
        .is_ok());
        assert!(ok(json!({})).is_err());
        assert!(ok(json!({"contents":{}})).is_err());
        assert!(ok(json!({"contents":[1]})).is_err());
        assert!(ok(json!({"contents":[{"role":"assistant","parts":[]}]})).is_err());
        assert!(ok(json!({"contents":[{"role":"user","parts":"hi"}]})).is_err());
        assert!(ok(json!({"contents":[{"role":"user","parts":["hi"]}]})).is_err());
        assert!(ok(json!({"contents":[],"systemInstruction":"be brief"})).is_err());
        assert!(ok(json!({"contents":[],"tools":{}})).is_err());
    }
}
