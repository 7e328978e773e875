//! What the Gemini API accepts as a conversation, and what a rewrite must keep: the sequence rules Google's servers
//! enforce (a function call turn right after a user turn, answered by the next user turn with as many function
//! responses; no two `model` turns in a row), and the client's fields, tools, last content and thought signatures
//! kept as sent.

use super::convert::parts_of;
use crate::dialect::shared::check_fields;
use crate::message::role;
use serde_json::Value;
use std::collections::HashMap;

/// Checks `contents` against the API's sequence rules.
pub fn check_sequence(contents: &[Value]) -> Result<(), String> {
    if contents.is_empty() {
        return Err("contents is empty".into());
    }
    // The calls of the model content before, not answered yet.
    let mut open: Option<Vec<(Option<String>, String)>> = None;
    for (i, c) in contents.iter().enumerate() {
        let r = role(c);
        let r = if r.is_empty() { "user" } else { r };
        if r != "user" && r != "model" {
            return Err(format!(
                "contents[{i}]: role {r:?} is neither user nor model"
            ));
        }
        if i == 0 && r != "user" {
            return Err("contents[0] is not a user content".into());
        }
        let parts = parts_of(c);
        if parts.is_empty() {
            return Err(format!("contents[{i}] has no parts"));
        }
        // (id, name) of a call or a response
        let of = |p: &Value, what: &str| {
            let o = p.get(what);
            let field = |k: &str| {
                o.and_then(|o| o.get(k))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            };
            (field("id"), field("name").unwrap_or_default())
        };
        let responses: Vec<&Value> = parts
            .iter()
            .filter(|p| p.get("functionResponse").is_some())
            .collect();
        if r == "model" {
            if open.is_some() {
                return Err(format!(
                    "contents[{i}]: the function calls of contents[{}] are not answered by a user content",
                    i - 1
                ));
            }
            if i > 0 && role(&contents[i - 1]) == "model" {
                return Err(format!("contents[{i}]: two model contents in a row"));
            }
            let calls: Vec<(Option<String>, String)> = parts
                .iter()
                .filter(|p| p.get("functionCall").is_some())
                .map(|p| of(p, "functionCall"))
                .collect();
            open = (!calls.is_empty()).then_some(calls);
            continue;
        }
        match open.take() {
            Some(mut calls) => {
                if responses.len() != calls.len() {
                    return Err(format!(
                        "contents[{i}]: {} function responses for {} function calls",
                        responses.len(),
                        calls.len()
                    ));
                }
                for p in responses {
                    let (id, name) = of(p, "functionResponse");
                    // by id when the response has one, else the first call of its name
                    let at = match &id {
                        Some(id) => calls.iter().position(|(c, _)| c.as_ref() == Some(id)),
                        None => calls.iter().position(|(_, n)| *n == name),
                    };
                    match at {
                        Some(at) => {
                            calls.remove(at);
                        }
                        None => {
                            return Err(format!(
                                "contents[{i}]: a function response ({name}) answers no call of contents[{}]",
                                i - 1
                            ))
                        }
                    }
                }
            }
            None if !responses.is_empty() => {
                return Err(format!(
                    "contents[{i}]: function responses that follow no function call turn"
                ))
            }
            None => {}
        }
    }
    Ok(())
}

/// Checks that `sent`, the body sent upstream, keeps what a rewrite of `client`'s body must: every top-level field
/// but `contents` and `tools` (`systemInstruction`, `generationConfig`, `toolConfig`, … identical and in order),
/// the client's tools an identical prefix, the last content as sent, and every `thoughtSignature` on the part it
/// came with, byte-exact (a part's call arguments may be cleared).
pub fn check_rewrite(client: &Value, sent: &Value) -> Result<(), String> {
    let (Some(c), Some(s)) = (client.as_object(), sent.as_object()) else {
        return Err("a body is not a JSON object".into());
    };
    check_fields(c, s, "contents")?;
    let items = |o: &serde_json::Map<String, Value>| {
        o.get("contents")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (ci, si) = (items(c), items(s));
    if ci.last() != si.last() {
        return Err("the last content was not kept as it was".into());
    }
    let mut signed: HashMap<&str, Value> = HashMap::new();
    for p in ci.iter().flat_map(parts_of) {
        if let Some(sig) = p.get("thoughtSignature").and_then(Value::as_str) {
            signed.insert(sig, without_args(p));
        }
    }
    for p in si.iter().flat_map(parts_of) {
        if let Some(sig) = p.get("thoughtSignature").and_then(Value::as_str) {
            match signed.get(sig) {
                Some(orig) if *orig == without_args(p) => {}
                Some(_) => return Err(format!("the part signed {sig:?} was changed")),
                None => return Err(format!("thought signature {sig:?} is not the client's")),
            }
        }
    }
    Ok(())
}

/// A part without its call's `args` (what tool-input clearing may change).
fn without_args(p: &Value) -> Value {
    let mut p = p.clone();
    if let Some(fc) = p.get_mut("functionCall").and_then(Value::as_object_mut) {
        fc.remove("args");
    }
    p
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_sequence_rules() {
        let u = |t: &str| json!({"role":"user","parts":[{"text":t}]});
        let call =
            json!({"role":"model","parts":[{"functionCall":{"id":"a","name":"f","args":{}}}]});
        let resp = json!({"role":"user","parts":[{"functionResponse":{"id":"a","name":"f","response":{}}}]});
        let text = json!({"role":"model","parts":[{"text":"ok"}]});
        assert!(check_sequence(&[u("a"), call.clone(), resp.clone(), text.clone()]).is_ok());
        assert!(check_sequence(&[u("a"), u("b"), text.clone()]).is_ok());
        assert!(check_sequence(std::slice::from_ref(&text)).is_err());
        assert!(check_sequence(&[u("a"), text.clone(), text.clone()]).is_err());
        assert!(check_sequence(&[u("a"), call.clone(), u("b")]).is_err());
        assert!(check_sequence(&[u("a"), resp.clone()]).is_err());
        assert!(check_sequence(&[u("a"), call.clone(), text]).is_err());
        let by_name =
            json!({"role":"user","parts":[{"functionResponse":{"name":"f","response":{}}}]});
        assert!(check_sequence(&[u("a"), call.clone(), by_name]).is_ok());
        let two = json!({"role":"user","parts":[resp["parts"][0], resp["parts"][0]]});
        assert!(check_sequence(&[u("a"), call, two]).is_err());
        assert!(check_sequence(&[]).is_err());
    }

    #[test]
    fn a_rewrite_keeps_fields_the_last_content_and_signatures() {
        let signed =
            json!({"functionCall":{"id":"a","name":"f","args":{"x":1}},"thoughtSignature":"S"});
        let client = json!({"contents":[{"role":"user","parts":[{"text":"q"}]},{"role":"model","parts":[signed]},
            {"role":"user","parts":[{"text":"last"}]}],"generationConfig":{"temperature":0}});
        assert!(check_rewrite(&client, &client).is_ok());
        let mut cleared = client.clone();
        cleared["contents"][1]["parts"][0]["functionCall"]["args"] = json!({"cleared": true});
        assert!(check_rewrite(&client, &cleared).is_ok());
        let mut forged = client.clone();
        forged["contents"][1]["parts"][0]["thoughtSignature"] = json!("T");
        assert!(check_rewrite(&client, &forged).is_err());
        let mut moved = client.clone();
        moved["contents"][1]["parts"][0]["functionCall"]["name"] = json!("g");
        assert!(check_rewrite(&client, &moved).is_err());
        let mut config = client.clone();
        config["generationConfig"] = json!({});
        assert!(check_rewrite(&client, &config).is_err());
        let mut last = client.clone();
        last["contents"][2]["parts"][0]["text"] = json!("x");
        assert!(check_rewrite(&client, &last).is_err());
    }
}
