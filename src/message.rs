//! The dialect-neutral conversation: messages in the chat-completions shape (roles `system`/`developer`, `user`,
//! `assistant` with `tool_calls`, `tool` with `tool_call_id`), the ground floor every other module reads. A
//! dialect (`dialect/`) converts its own messages into this shape and back; what it cannot express (signed
//! thinking, server tool blocks, images, unknown blocks) stays in the dialect's own message, which is carried
//! byte-exact when the engine leaves the message alone.

use serde_json::Value;

/// Key a dialect sets (to `true`) on a user message that continues the turn before it rather than opening a new
/// one: text sent together with tool results (Anthropic puts both in one user message).
pub const CONTINUES: &str = "ctxgate_continues";

/// How the summary message ctxgate writes in place of older history begins (what marks it as ctxgate's).
pub const SUMMARY_PREFIX: &str = "Summary of the earlier conversation: ";

/// Where a message of a rewritten conversation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The client's message at this index of the (neutral) request, as it was or rewritten (cleared, truncated).
    Client(usize),
    /// A message ctxgate added (a summary, the recall note).
    Added,
}

/// Field `key` of object `v`. A message or a tool call has a handful of fields: a linear scan finds one faster
/// than hashing the key (the map's SipHash), and the planner looks up roles thousands of times per request.
pub fn field<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    match v {
        Value::Object(o) if o.len() <= 8 => {
            o.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
        }
        other => other.get(key),
    }
}

/// The role of a message (`""` when absent).
pub fn role(m: &Value) -> &str {
    field(m, "role").and_then(Value::as_str).unwrap_or("")
}

/// True for `system` and `developer` messages: instructions, never pruned.
pub fn is_system(m: &Value) -> bool {
    matches!(role(m), "system" | "developer")
}

/// The tool calls of an assistant message (empty for any other message).
pub fn tool_calls(m: &Value) -> &[Value] {
    if role(m) != "assistant" {
        return &[];
    }
    field(m, "tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The text of a message: string content, text parts, refusal and tool-call arguments.
pub fn message_text(m: &Value) -> String {
    let mut out = String::new();
    match m.get("content") {
        Some(Value::String(s)) => out.push_str(s),
        Some(Value::Array(parts)) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(t);
                }
            }
        }
        _ => {}
    }
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            // `get` rather than `Value::pointer`, which allocates per path segment
            let function = c.get("function");
            let of = |k: &str| function.and_then(|f| f.get(k)).and_then(Value::as_str);
            let (name, args) = (of("name").unwrap_or(""), of("arguments").unwrap_or(""));
            out.reserve(name.len() + args.len() + 3);
            out.push('\n');
            out.push_str(name);
            out.push('(');
            out.push_str(args);
            out.push(')');
        }
    }
    out
}

/// True for a user message that opens a new turn (a run loop): not one that continues the turn before it.
pub fn opens_turn(m: &Value) -> bool {
    role(m) == "user" && !field(m, CONTINUES).is_some_and(|v| v == &Value::Bool(true))
}

/// The id of the call a `tool` message answers (`""` when absent).
pub fn tool_call_id(m: &Value) -> &str {
    field(m, "tool_call_id")
        .and_then(Value::as_str)
        .unwrap_or("")
}
/// JSON with object keys sorted, so equal values give equal text whatever the key order.
pub fn canonical_json(v: &Value) -> String {
    let bytes = canonical_json_bytes(v);
    // serde_json writes UTF-8 only; the lossy path is never taken.
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`canonical_json`] as bytes, for hashing: the same text, without the UTF-8 check of a `String`.
pub fn canonical_json_bytes(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_canonical(v, &mut out);
    out
}

/// Appends `v`'s [`canonical_json`] to `out`: its objects' keys sorted; keys, strings and numbers as serde_json
/// writes them (compact).
pub fn write_canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(m) => write_canonical_object(m.iter(), out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(x, out);
            }
            out.push(b']');
        }
        other => write_leaf(other, out),
    }
}

/// Appends the canonical JSON of an object made of `fields` (distinct keys) to `out`, without building it.
pub fn write_canonical_object<'a>(
    fields: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut Vec<u8>,
) {
    let mut fields: Vec<(&String, &Value)> = fields.collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push(b'{');
    for (i, (k, x)) in fields.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_leaf(k, out);
        out.push(b':');
        write_canonical(x, out);
    }
    out.push(b'}');
}

/// A key or a scalar as compact JSON. Writing to a `Vec` cannot fail, nor can a string, number, bool or null.
fn write_leaf<T: serde::Serialize + ?Sized>(v: &T, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, v);
}

#[cfg(test)]
mod canonical_tests {
    use super::*;
    use serde_json::json;

    /// The writer this one replaced (keys and scalars through `Display`): the text must be the same.
    fn through_display(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    through_display(&m[k.as_str()], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    through_display(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }

    #[test]
    fn canonical_json_is_the_display_text_with_sorted_keys() {
        let values = [
            json!({"b": 1, "a": [{"d": 2.5, "c": -3}], "é": "\u{1}\u{1f}\"\\/\n\r\t\u{8}\u{c}", "": null}),
            json!([
                "🚀",
                true,
                false,
                null,
                1e300,
                -0.0,
                18446744073709551615u64,
                -9223372036854775808i64,
                {}
            ]),
            json!("plain"),
            json!({"z": {"y": {"x": [[], {}, ""]}}, "Z": "upper sorts first", "a b": "\u{2028}\u{7f}"}),
        ];
        for v in values {
            let mut old = String::new();
            through_display(&v, &mut old);
            assert_eq!(canonical_json(&v), old);
            assert_eq!(canonical_json_bytes(&v), old.into_bytes());
        }
    }
}
