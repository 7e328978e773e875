//! The rewritten forms of single messages: a cleared tool result's placeholder and a past run loop's truncated
//! message. Pure string work, deterministic and idempotent.

use crate::message::message_text;
use serde_json::{Map, Value};

/// The visible marker ending a truncated message.
pub const TRUNCATED_MARKER: &str = "…[truncated]";
/// How every placeholder begins (so a placeholder is never cleared again).
pub const PLACEHOLDER_PREFIX: &str = "[ctxgate] Tool result cleared";

/// True when `m` is a tool message whose content is already one of our placeholders.
pub fn is_placeholder(m: &Value) -> bool {
    m.get("content")
        .and_then(Value::as_str)
        .is_some_and(|c| c.starts_with(PLACEHOLDER_PREFIX))
}

/// The tool message `m` with its content replaced by a short placeholder naming the call, the tool and the
/// result's size, and how to get it back (`recall_tool`, when the recall tool is offered in this request).
pub fn placeholder(m: &Value, tool_name: &str, recall_tool: Option<&str>) -> Value {
    let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
    let chars = match m.get("content") {
        Some(Value::String(s)) => s.chars().count(),
        _ => message_text(m).chars().count(),
    };
    let how = match recall_tool {
        Some(t) => format!(" Call `{t}` with call_id \"{id}\" to see it again."),
        None => " ctxgate keeps it in the conversation's full history.".to_string(),
    };
    let text = format!(
        "{PLACEHOLDER_PREFIX} to save context: call {id} ({tool_name}), {chars} characters.{how}"
    );
    with_content(m, text)
}

/// `m` with its text cut to `max_chars` characters and [`TRUNCATED_MARKER`] appended; content given as parts
/// becomes plain text. Unchanged when already short enough. Cutting the output again changes nothing.
pub fn truncated(m: &Value, max_chars: usize) -> Value {
    let text_only = matches!(
        m.get("content"),
        Some(Value::String(_)) | None | Some(Value::Null)
    );
    let text = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(_)) => message_text(&without_tool_calls(m)),
        _ => return m.clone(),
    };
    if text_only && text.chars().count() <= max_chars {
        return m.clone();
    }
    let mut cut: String = text.chars().take(max_chars).collect();
    if text.chars().count() > max_chars {
        cut.push_str(TRUNCATED_MARKER);
    }
    with_content(m, cut)
}

fn without_tool_calls(m: &Value) -> Value {
    let mut c = m.clone();
    if let Some(o) = c.as_object_mut() {
        o.remove("tool_calls");
    }
    c
}

/// `m` with `content` in place of its content (same key order; the old content is never copied).
fn with_content(m: &Value, content: String) -> Value {
    let mut content = Some(Value::String(content));
    let mut out = Map::new();
    for (k, v) in m.as_object().into_iter().flatten() {
        let v = match (k.as_str(), content.take()) {
            ("content", Some(c)) => c,
            (_, c) => {
                content = c;
                v.clone()
            }
        };
        out.insert(k.clone(), v);
    }
    if let Some(c) = content {
        out.insert("content".into(), c);
    }
    Value::Object(out)
}

/// A one-line digest of a call's arguments: compact, at most `max` characters.
pub fn digest(arguments: &str, max: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    for (i, word) in arguments.split_whitespace().enumerate() {
        for c in (i > 0).then_some(' ').into_iter().chain(word.chars()) {
            if chars == max {
                out.push('…');
                return out;
            }
            out.push(c);
            chars += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholder_names_call_tool_size_and_recall() {
        let m = json!({"role":"tool","tool_call_id":"call_7","content":"abcdef","name":"x"});
        let p = placeholder(&m, "read_file", Some("recall_tool_call"));
        let c = p["content"].as_str().unwrap();
        assert!(c.starts_with(PLACEHOLDER_PREFIX));
        assert!(c.contains("call_7") && c.contains("read_file") && c.contains("6 characters"));
        assert!(c.contains("recall_tool_call"));
        assert_eq!(p["tool_call_id"], "call_7");
        assert_eq!(p["name"], "x");
        assert!(is_placeholder(&p) && !is_placeholder(&m));
        let keys: Vec<&String> = p.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["role", "tool_call_id", "content", "name"],
            "field order kept"
        );
    }

    #[test]
    fn truncation_is_visible_and_idempotent() {
        let m = json!({"role":"user","content":"héllo wörld, this is long"});
        let t = truncated(&m, 5);
        assert_eq!(t["content"], "héllo…[truncated]");
        assert_eq!(truncated(&t, 5), t);
        assert_eq!(truncated(&m, 100), m);
        let parts = json!({"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"x"}}]});
        let t = truncated(&parts, 100);
        assert_eq!(t["content"], "abc");
        assert_eq!(truncated(&t, 100), t);
        let null = json!({"role":"assistant","content":null});
        assert_eq!(truncated(&null, 3), null);
    }

    #[test]
    fn digest_is_one_line_and_capped() {
        assert_eq!(digest("{\n  \"path\": \"a\"\n}", 80), "{ \"path\": \"a\" }");
        assert_eq!(digest(&"x".repeat(100), 10), format!("{}…", "x".repeat(10)));
    }
}
