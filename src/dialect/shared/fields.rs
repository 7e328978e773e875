//! The top-level checks every rewrite of a client's body must pass, whatever the field its conversation is in.

use serde_json::{Map, Value};

/// The conversation of a body: the array under `key` (`messages`, `input`), empty when there is none.
pub fn conversation<'a>(o: &'a Map<String, Value>, key: &str) -> &'a [Value] {
    o.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Checks that `s`, the body sent upstream, keeps every top-level field of `c`, the client's body, but the
/// conversation (under `key`) and `tools`: identical, none added, in the same order; and the client's `tools` an
/// identical prefix of the sent ones (ctxgate may only append its own).
pub fn check_fields(
    c: &Map<String, Value>,
    s: &Map<String, Value>,
    key: &str,
) -> Result<(), String> {
    let skip = |k: &str| k == key || k == "tools";
    for (k, v) in c.iter().filter(|(k, _)| !skip(k)) {
        if s.get(k) != Some(v) {
            return Err(format!("top-level field `{k}` changed or missing"));
        }
    }
    if let Some(k) = s.keys().find(|k| !skip(k) && !c.contains_key(*k)) {
        return Err(format!("top-level field `{k}` was added"));
    }
    let order = |o: &Map<String, Value>| -> Vec<String> {
        o.keys().filter(|k| c.contains_key(*k)).cloned().collect()
    };
    if order(c) != order(s) {
        return Err("the client's top-level fields were reordered".into());
    }
    match (c.get("tools"), s.get("tools")) {
        (None | Some(Value::Null), _) => Ok(()),
        (Some(Value::Array(ct)), Some(Value::Array(st))) if st.starts_with(ct) => Ok(()),
        _ => Err("the client's `tools` are not an identical prefix of the tools sent".into()),
    }
}

/// Copies the non-null fields `keys` of `from` into `body` (a trace's request fields into a replayed step).
pub fn copy_fields(from: &Map<String, Value>, body: &mut Map<String, Value>, keys: &[&str]) {
    for key in keys {
        if let Some(v) = from.get(*key).filter(|v| !v.is_null()) {
            body.insert((*key).into(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn only_the_named_conversation_and_appended_tools_may_change() {
        let c = obj(json!({"model":"m","input":[1],"tools":[{"name":"a"}],"store":false}));
        let ok =
            obj(json!({"model":"m","input":[2],"tools":[{"name":"a"},{"name":"b"}],"store":false}));
        assert_eq!(check_fields(&c, &ok, "input"), Ok(()));
        // The same change under another conversation key is a changed field.
        assert!(check_fields(&c, &ok, "messages").is_err());
        let added =
            obj(json!({"model":"m","input":[1],"tools":[{"name":"a"}],"store":false,"x":1}));
        assert!(check_fields(&c, &added, "input").is_err());
        let reordered = obj(json!({"store":false,"model":"m","input":[1],"tools":[{"name":"a"}]}));
        assert!(check_fields(&c, &reordered, "input").is_err());
        let tools = obj(json!({"model":"m","input":[1],"tools":[{"name":"b"}],"store":false}));
        assert!(check_fields(&c, &tools, "input").is_err());
        assert_eq!(conversation(&c, "input"), [json!(1)]);
        assert!(conversation(&c, "messages").is_empty());
    }
}
