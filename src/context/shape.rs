//! The rewritten forms of single messages: a cleared tool result's placeholder, a past tool call's cleared
//! arguments, a past run loop's truncated message and the pinned task's head and tail. Pure string work,
//! deterministic and idempotent.

use crate::message::{field, message_text};
use serde_json::{Map, Value};

/// The visible marker ending a truncated message.
pub const TRUNCATED_MARKER: &str = "…[truncated]";
/// How every placeholder begins (so a placeholder is never cleared again).
pub const PLACEHOLDER_PREFIX: &str = "[ctxgate] Tool result cleared";

/// True when `m` is a tool message whose content is already one of our placeholders.
pub fn is_placeholder(m: &Value) -> bool {
    field(m, "content")
        .and_then(Value::as_str)
        .is_some_and(|c| c.starts_with(PLACEHOLDER_PREFIX))
}

/// The tool message `m` with its content replaced by a short placeholder naming the call, the tool and the
/// result's size, and how to get it back (`recall_tool`, when the recall tool is offered in this request).
pub fn placeholder(m: &Value, tool_name: &str, recall_tool: Option<&str>) -> Value {
    placeholder_with_digest(m, tool_name, recall_tool, 0)
}

/// [`placeholder`], naming besides up to about `digest_tokens` tokens of the result's distinctive strings
/// (`prune.digest_tokens`: paths, names, numbers, most used first; see [`super::digest`]), so that the model
/// knows what the recall would give back.
pub fn placeholder_with_digest(
    m: &Value,
    tool_name: &str,
    recall_tool: Option<&str>,
    digest_tokens: u64,
) -> Value {
    placeholder_naming(m, tool_name, recall_tool, &digest_words(m, digest_tokens))
}

/// The distinctive strings of `m`'s text a placeholder names, up to about `digest_tokens` tokens of them.
pub fn digest_words(m: &Value, digest_tokens: u64) -> Vec<Box<str>> {
    if digest_tokens == 0 {
        return Vec::new();
    }
    super::digest::distinctive(&text_of(m), digest_tokens)
        .into_iter()
        .map(Box::from)
        .collect()
}

fn text_of(m: &Value) -> std::borrow::Cow<'_, str> {
    match field(m, "content") {
        Some(Value::String(s)) => std::borrow::Cow::Borrowed(s.as_str()),
        _ => std::borrow::Cow::Owned(message_text(m)),
    }
}

/// [`placeholder`] naming `words` (from [`digest_words`]).
pub fn placeholder_naming(
    m: &Value,
    tool_name: &str,
    recall_tool: Option<&str>,
    words: &[Box<str>],
) -> Value {
    with_content(m, placeholder_text(m, tool_name, recall_tool, words))
}

/// The text of [`placeholder_naming`]'s placeholder (see [`with_content`] to put it in place).
pub fn placeholder_text(
    m: &Value,
    tool_name: &str,
    recall_tool: Option<&str>,
    words: &[Box<str>],
) -> String {
    let id = field(m, "tool_call_id")
        .and_then(Value::as_str)
        .unwrap_or("");
    let chars = text_of(m).chars().count();
    let naming = if words.is_empty() {
        String::new()
    } else {
        format!(", naming {}", words.join(", "))
    };
    let how = match recall_tool {
        Some(t) => format!(" Call `{t}` with call_id \"{id}\" to see it again."),
        None => " ctxgate keeps it in the conversation's full history.".to_string(),
    };
    format!(
        "{PLACEHOLDER_PREFIX} to save context: call {id} ({tool_name}), {chars} characters{naming}.{how}"
    )
}

/// `m` with its text cut to `max_chars` characters and [`TRUNCATED_MARKER`] appended; content given as parts
/// becomes plain text. Unchanged when already short enough. Cutting the output again changes nothing.
pub fn truncated(m: &Value, max_chars: usize) -> Value {
    let text_only = matches!(
        field(m, "content"),
        Some(Value::String(_)) | None | Some(Value::Null)
    );
    let text = match field(m, "content") {
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
pub fn with_content(m: &Value, content: String) -> Value {
    let mut content = Some(Value::String(content));
    let mut out = Map::with_capacity(m.as_object().map_or(0, Map::len) + 1);
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

/// The key opening every cleared-arguments placeholder (so cleared arguments are never cleared again).
pub const CLEARED_INPUT_KEY: &str = "ctxgate_cleared_input";

/// True when `arguments` is one of our cleared-arguments placeholders.
pub fn is_cleared_input(arguments: &str) -> bool {
    arguments.starts_with(&format!("{{\"{CLEARED_INPUT_KEY}\""))
}

/// The arguments of call `id` (tool `tool`, `tokens` tokens) replaced by a short JSON object naming them, so
/// the call stays a valid call (arguments a JSON object string) and the model can ask for them back.
pub fn cleared_input(id: &str, tool: &str, tokens: u64, recall_tool: Option<&str>) -> String {
    let how = match recall_tool {
        Some(t) => format!("removed to save space; call {t} with this call_id to see them"),
        None => "removed to save space".to_string(),
    };
    let mut o = Map::new();
    o.insert(CLEARED_INPUT_KEY.into(), Value::String(how));
    o.insert("call_id".into(), Value::String(id.into()));
    o.insert("tool".into(), Value::String(tool.into()));
    o.insert("tokens".into(), Value::from(tokens));
    Value::Object(o).to_string()
}

/// The assistant message `m` with the arguments of its tool calls at `calls` (positions in `tool_calls`, each
/// with its tool's name and its arguments' tokens) replaced by [`cleared_input`]; every other field kept in
/// place.
pub fn clear_inputs(m: &Value, calls: &[(usize, u64)], recall_tool: Option<&str>) -> Value {
    let mut out = m.clone();
    let Some(list) = out.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return out;
    };
    for &(at, tokens) in calls {
        let Some(call) = list.get_mut(at) else {
            continue;
        };
        let id = field(call, "id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let Some(function) = call.get_mut("function").and_then(Value::as_object_mut) else {
            continue;
        };
        let tool = function
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if let Some(args) = function.get_mut("arguments") {
            *args = Value::String(cleared_input(&id, &tool, tokens, recall_tool));
        }
    }
    out
}

/// The marker standing for the middle of a pinned message that was left out.
pub const PINNED_MARKER: &str =
    "characters of this message left out to save space; ctxgate keeps the whole]…";

/// `m` (the pinned first user message) cut to about `keep_chars` characters: its head and its tail around a
/// visible marker; content given as parts becomes plain text. Unchanged when already short enough.
pub fn pinned(m: &Value, keep_chars: usize) -> Value {
    let text = match field(m, "content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(_)) => message_text(m),
        _ => return m.clone(),
    };
    let total = text.chars().count();
    if total <= keep_chars {
        return m.clone();
    }
    let head_len = keep_chars * 2 / 3;
    let tail_len = keep_chars - head_len;
    let head: String = text.chars().take(head_len).collect();
    let tail: String = text.chars().skip(total - tail_len).collect();
    let left_out = total - head_len - tail_len;
    with_content(m, format!("{head}\n…[{left_out} {PINNED_MARKER}\n{tail}"))
}

/// A one-line digest of a call's arguments: its words joined by single spaces, cut after `max` characters with
/// `…` when anything follows.
pub fn digest(arguments: &str, max: usize) -> String {
    let mut out = String::with_capacity(max.min(arguments.len()) + '…'.len_utf8());
    let mut chars = 0;
    for (i, word) in arguments.split_whitespace().enumerate() {
        let sep = usize::from(i > 0);
        // Whole words while they fit (most do): one copy each instead of a push per character.
        let len = if word.is_ascii() {
            word.len()
        } else {
            word.chars().count()
        };
        if chars + sep + len <= max {
            if sep == 1 {
                out.push(' ');
            }
            out.push_str(word);
            chars += sep + len;
            continue;
        }
        let room = max - chars;
        out.extend(
            (i > 0)
                .then_some(' ')
                .into_iter()
                .chain(word.chars())
                .take(room),
        );
        out.push('…');
        return out;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_placeholder_with_a_digest_names_the_results_distinctive_strings() {
        let m = json!({"role":"tool","tool_call_id":"call_7","content":
            "src/app/views.py:120: def handle_request(self):\nsrc/app/views.py:188: raise ImproperlyConfigured"});
        let plain = placeholder(&m, "grep", Some("recall_tool_call"));
        let with = placeholder_with_digest(&m, "grep", Some("recall_tool_call"), 16);
        let text = |v: &Value| v["content"].as_str().unwrap_or_default().to_string();
        assert!(!text(&plain).contains("naming"), "{}", text(&plain));
        let t = text(&with);
        assert!(
            t.starts_with(PLACEHOLDER_PREFIX) && is_placeholder(&with),
            "{t}"
        );
        assert!(
            t.contains("naming src/app/views.py, ") && t.contains("handle_request"),
            "{t}"
        );
        assert!(t.ends_with("Call `recall_tool_call` with call_id \"call_7\" to see it again."));
        assert_eq!(
            with,
            placeholder_with_digest(&m, "grep", Some("recall_tool_call"), 16)
        );
        // a digest of 0 tokens is the plain placeholder
        assert_eq!(
            plain,
            placeholder_with_digest(&m, "grep", Some("recall_tool_call"), 0)
        );
    }

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
    fn cleared_inputs_are_valid_json_objects_naming_the_call() {
        let m = json!({"role":"assistant","content":"writing","tool_calls":[
            {"id":"c1","type":"function","function":{"name":"write_file","arguments":"{\"path\":\"a\",\"text\":\"long\"}"}},
            {"id":"c2","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b\"}"}}]});
        let c = clear_inputs(&m, &[(0, 7012)], Some("recall_tool_call"));
        let args = c["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap();
        let parsed: Value = serde_json::from_str(args).unwrap();
        assert!(parsed.is_object() && is_cleared_input(args));
        assert_eq!(parsed["call_id"], "c1");
        assert_eq!(parsed["tool"], "write_file");
        assert_eq!(parsed["tokens"], 7012);
        assert!(parsed[CLEARED_INPUT_KEY]
            .as_str()
            .unwrap()
            .contains("recall_tool_call"));
        assert_eq!(
            c["tool_calls"][1], m["tool_calls"][1],
            "other calls untouched"
        );
        assert_eq!(c["content"], "writing");
        assert_eq!(clear_inputs(&c, &[(0, 7012)], Some("recall_tool_call")), c);
        assert!(!is_cleared_input("{\"path\":\"b\"}"));
    }

    #[test]
    fn pinned_keeps_head_and_tail() {
        let text = format!("HEAD {} TAIL", "middle ".repeat(1000));
        let m = json!({"role":"user","content":text});
        let p = pinned(&m, 300);
        let c = p["content"].as_str().unwrap();
        assert!(c.starts_with("HEAD ") && c.ends_with(" TAIL") && c.contains(PINNED_MARKER));
        assert!(c.chars().count() < 300 + 120);
        assert_eq!(pinned(&m, 100_000), m, "short enough: unchanged");
        assert_eq!(pinned(&m, 300), p, "deterministic");
    }

    /// The digest as first written, a character at a time: the oracle of the word-at-a-time one.
    fn digest_by_char(arguments: &str, max: usize) -> String {
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

    proptest::proptest! {
        #[test]
        fn digest_equals_the_char_by_char_digest(
            text in "[ a\\n\\té日{}\":,]{0,40}",
            max in 0usize..20,
        ) {
            proptest::prop_assert_eq!(digest(&text, max), digest_by_char(&text, max));
        }
    }

    #[test]
    fn digest_is_one_line_and_capped() {
        assert_eq!(digest("{\n  \"path\": \"a\"\n}", 80), "{ \"path\": \"a\" }");
        assert_eq!(digest(&"x".repeat(100), 10), format!("{}…", "x".repeat(10)));
    }
}
