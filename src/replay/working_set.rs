//! The working set of a replayed step and how much of it the request sent keeps in view: the *facts* of the
//! recorded next assistant message (code-like strings it took from an earlier tool output), and which of them the
//! request sent upstream holds a source output of whole, or at least the string itself. Pure and deterministic.
//!
//! A **code-like string** is one of `context::digest::code_strings` (a path, a dotted, snake_case or CamelCase
//! name of 6+ characters, or a number of 4+ digits). A **fact** of step k is one in
//! the text or the tool-call arguments (each JSON string value) of the answer `messages[k]` that appears in an
//! earlier tool output of `messages[:k]` and in none of its user, system or assistant messages (text and tool-call
//! arguments). It is **whole** when the request sent holds one of the tool outputs it appears in unchanged (same
//! call id, same content), **shown** when whole or when the string appears anywhere in the body sent (a
//! placeholder, a fold line, a summary, a kept excerpt), and hidden otherwise (nothing is visible of a refused
//! request).

use crate::context::digest;
use memchr::memmem;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};

/// Between messages in a haystack: no code-like string spans it.
const SEPARATOR: char = '\u{0}';

/// What one step's request kept in view of the answer's facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorkingSet {
    /// Facts of the answer.
    pub facts: usize,
    /// Of them, those visible: a source output sent whole, or the string itself somewhere in the body sent.
    pub shown: usize,
    /// Of them, those with a source output sent whole.
    pub whole: usize,
    /// The facts not shown, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<String>,
    /// The facts shown only as the string (no source output sent whole), in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partial: Vec<String>,
}

/// A fact of an answer: the string and the earlier tool outputs it appears in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// The code-like string.
    pub text: String,
    /// Indices (in the messages before the answer) of the tool messages holding it.
    pub sources: Vec<usize>,
}

/// Adds the code-like strings of `text` to `out` (`context::digest::code_strings`: the digests that placeholders and
/// fold lines carry name the same strings).
pub fn code_strings(text: &str, out: &mut BTreeSet<String>) {
    out.extend(digest::code_strings(text).map(|(_, s)| s.to_string()));
}

/// The strings of a neutral message a model reads: its text (see [`text`]) and its tool calls' arguments.
fn texts(m: &Value) -> impl Iterator<Item = &str> {
    text(m).chain(arguments(m))
}

/// The text of a neutral message: string content, text and opaque parts, an assistant's opaque blocks.
fn text(m: &Value) -> impl Iterator<Item = &str> {
    let content = m.get("content");
    let whole = content.and_then(Value::as_str);
    let parts = content
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|p| {
            ["text", "content"]
                .into_iter()
                .filter_map(move |k| p.get(k).and_then(Value::as_str))
        });
    let opaque = m
        .get(crate::dialect::anthropic::convert::OPAQUE)
        .and_then(Value::as_str);
    whole.into_iter().chain(parts).chain(opaque)
}

/// The arguments of a message's tool calls, as sent (JSON text, or a custom tool's raw input).
fn arguments(m: &Value) -> impl Iterator<Item = &str> {
    m.get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.pointer("/function/arguments").and_then(Value::as_str))
}

/// The code-like strings of an answer: in its text, and in every string value of its tool-call arguments (their
/// JSON read, so that escapes such as `\n` do not glue onto a name; raw text when they are not JSON).
pub fn answer_strings(answer: &[Value]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for m in answer {
        for t in text(m) {
            code_strings(t, &mut out);
        }
        for args in arguments(m) {
            match serde_json::from_str::<Value>(args) {
                Ok(v) => string_leaves(&v, &mut |s| code_strings(s, &mut out)),
                Err(_) => code_strings(args, &mut out),
            }
        }
    }
    out
}

/// Calls `f` with every string and number in `v` (keys excluded); an explicit stack, no recursion.
fn string_leaves(v: &Value, f: &mut impl FnMut(&str)) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => f(s),
            Value::Number(n) => f(&n.to_string()),
            Value::Array(a) => stack.extend(a.iter().rev()),
            Value::Object(o) => stack.extend(o.values().rev()),
            _ => {}
        }
    }
}

fn is_tool(m: &Value) -> bool {
    crate::message::role(m) == "tool"
}

/// The facts of `answer` (the recorded next assistant message, neutral; several when its items make several)
/// given the messages before it, `prior` (neutral, as the client sent them), sorted by their text.
pub fn facts(prior: &[Value], answer: &[Value]) -> Vec<Fact> {
    let candidates = answer_strings(answer);
    if candidates.is_empty() {
        return Vec::new();
    }
    let (mut tools, mut others) = (String::new(), String::new());
    for m in prior {
        let hay = if is_tool(m) { &mut tools } else { &mut others };
        for t in texts(m) {
            hay.push_str(t);
            hay.push(SEPARATOR);
        }
    }
    let in_hay = |hay: &str, s: &str| memmem::find(hay.as_bytes(), s.as_bytes()).is_some();
    candidates
        .into_iter()
        .filter(|c| in_hay(&tools, c) && !in_hay(&others, c))
        .map(|text| {
            let sources = prior
                .iter()
                .enumerate()
                .filter(|(_, m)| is_tool(m) && texts(m).any(|t| in_hay(t, &text)))
                .map(|(i, _)| i)
                .collect();
            Fact { text, sources }
        })
        .collect()
}

/// What the request sent kept in view of `facts` (found over `prior`): `sent` is the conversation sent (neutral)
/// with the body sent upstream, `None` when the request was refused.
pub fn visibility(prior: &[Value], facts: &[Fact], sent: Option<(&[Value], &[u8])>) -> WorkingSet {
    let mut ws = WorkingSet {
        facts: facts.len(),
        ..WorkingSet::default()
    };
    let Some((messages, body)) = sent else {
        ws.hidden = facts.iter().map(|f| f.text.clone()).collect();
        return ws;
    };
    // the tool outputs sent, by call id
    let mut outputs: HashMap<&str, Vec<Option<&Value>>> = HashMap::new();
    for m in messages.iter().filter(|m| is_tool(m)) {
        outputs
            .entry(call_id(m))
            .or_default()
            .push(m.get("content"));
    }
    let sent_whole = |i: &usize| {
        prior.get(*i).is_some_and(|m| {
            outputs
                .get(call_id(m))
                .is_some_and(|sent| sent.contains(&m.get("content")))
        })
    };
    for f in facts {
        if f.sources.iter().any(sent_whole) {
            ws.whole += 1;
            ws.shown += 1;
        } else if memmem::find(body, f.text.as_bytes()).is_some() {
            ws.shown += 1;
            ws.partial.push(f.text.clone());
        } else {
            ws.hidden.push(f.text.clone());
        }
    }
    ws
}

fn call_id(m: &Value) -> &str {
    m.get("tool_call_id").and_then(Value::as_str).unwrap_or("")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strings(text: &str) -> Vec<String> {
        let mut out = BTreeSet::new();
        code_strings(text, &mut out);
        out.into_iter().collect()
    }

    #[test]
    fn code_like_strings_are_paths_names_and_long_numbers() {
        // paths, with or without a leading slash; the dotted file name inside is one too
        assert_eq!(
            strings("Now edit django/http/request.py."),
            ["django/http/request.py", "request.py"]
        );
        assert_eq!(strings("see /tmp and ~/x"), ["/tmp", "~/x"]);
        assert!(strings("w/ that, 1/2, <p>x</p>").is_empty());
        // numbers of 4+ digits, not inside a word, and not shorter ones
        assert_eq!(
            strings("lines 1088-1096, not 123 or abc12345"),
            ["1088", "1096"]
        );
        // dotted, snake_case and CamelCase names of 6+ characters; the parts of a dotted one that qualify
        assert_eq!(
            strings("raise django.core.exceptions.ImproperlyConfigured"),
            [
                "ImproperlyConfigured",
                "django.core.exceptions.ImproperlyConfigured"
            ]
        );
        assert_eq!(
            strings("TextEnum.B max_tokens getElementById HTTPError"),
            [
                "HTTPError",
                "TextEnum",
                "TextEnum.B",
                "getElementById",
                "max_tokens"
            ]
        );
        // short names, plain words, capitalised words, upper-case words and versions are not
        assert!(strings("a_b Foo.B Django README request version 1.2.3 e.g. __").is_empty());
    }

    fn tool(id: &str, content: &str) -> Value {
        json!({"role":"tool","tool_call_id":id,"content":content})
    }

    fn call(id: &str, args: &str) -> Value {
        json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
            "function":{"name":"run","arguments":args}}]})
    }

    fn prior() -> Vec<Value> {
        vec![
            json!({"role":"system","content":"You are an agent."}),
            json!({"role":"user","content":"Fix the bug in parse_header please."}),
            call("c1", r#"{"cmd":"grep -n parse_header src"}"#),
            tool(
                "c1",
                "src/http/request.py:1088: def parse_header\nsrc/http/request.py:1096: raise ImproperlyConfigured",
            ),
            call("c2", r#"{"cmd":"pytest"}"#),
            tool("c2", "FAILED test_enum: TextEnum.B != 'b' (ImproperlyConfigured)"),
        ]
    }

    fn answer() -> Vec<Value> {
        vec![call(
            "c3",
            r#"{"path":"src/http/request.py","line":1096,"note":"parse_header\nImproperlyConfigured, TextEnum.B"}"#,
        )]
    }

    #[test]
    fn facts_come_from_tool_outputs_and_not_from_other_messages() {
        let facts = facts(&prior(), &answer());
        let texts: Vec<&str> = facts.iter().map(|f| f.text.as_str()).collect();
        // parse_header is in the user's message: not a fact; the JSON escape does not glue `n` onto a name;
        // "request.py" is inside the path, itself a fact
        assert_eq!(
            texts,
            [
                "1096",
                "ImproperlyConfigured",
                "TextEnum",
                "TextEnum.B",
                "request.py",
                "src/http/request.py"
            ]
        );
        assert_eq!(facts[1].sources, [3, 5]);
        assert_eq!(facts[2].sources, [5]);
        // a string in no tool output is no fact; nor is anything of an answer without code-like strings
        assert!(
            super::facts(&prior(), &[json!({"role":"assistant","content":"Done."})]).is_empty()
        );
        let mut told = prior();
        told.push(json!({"role":"user","content":"the number is 1096"}));
        assert!(!super::facts(&told, &answer())
            .iter()
            .any(|f| f.text == "1096"));
    }

    #[test]
    fn whole_shown_and_hidden() {
        let prior = prior();
        let facts = facts(&prior, &answer());
        // everything sent: every fact whole
        let body = serde_json::to_vec(&prior).unwrap();
        let all = visibility(&prior, &facts, Some((&prior, &body)));
        assert_eq!((all.facts, all.shown, all.whole), (6, 6, 6));
        assert!(all.hidden.is_empty());
        // the grep's output cleared to a placeholder that names the path; the test output kept whole
        let mut sent = prior.clone();
        sent[3] = tool("c1", "[cleared: grep of src/http/request.py, 2 lines]");
        let body = serde_json::to_vec(&sent).unwrap();
        let ws = visibility(&prior, &facts, Some((&sent, &body)));
        // ImproperlyConfigured and TextEnum(.B): whole (the test output); the path and its file name: shown;
        // 1096: hidden
        assert_eq!((ws.facts, ws.shown, ws.whole), (6, 5, 3));
        assert_eq!(ws.hidden, ["1096"]);
        assert_eq!(ws.partial.len(), 2, "{:?}", ws.partial);
        assert!(ws.partial.iter().all(|p| p.contains("request.py")));
        // an output with the same call id but changed content is not whole
        let mut changed = prior.clone();
        changed[5] = tool("c2", "FAILED test_enum");
        changed[3] = tool("c1", "");
        let body = serde_json::to_vec(&changed).unwrap();
        let ws = visibility(&prior, &facts, Some((&changed, &body)));
        assert_eq!((ws.shown, ws.whole), (0, 0));
        assert_eq!(ws.hidden.len(), 6);
        // refused: nothing visible
        let ws = visibility(&prior, &facts, None);
        assert_eq!(
            (ws.facts, ws.shown, ws.whole, ws.hidden.len()),
            (6, 0, 0, 6)
        );
    }

    #[test]
    fn parts_and_custom_tool_inputs_are_read() {
        let prior = vec![
            json!({"role":"user","content":[{"type":"text","text":"go"}]}),
            call("c1", "*** Begin Patch"),
            json!({"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"wrote lib/core_utils.rs"}]}),
        ];
        // a custom tool's raw input (not JSON) is read as text
        let answer = [call("c2", "*** Update File: lib/core_utils.rs")];
        let f = facts(&prior, &answer);
        let texts: Vec<&str> = f.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(texts, ["core_utils", "core_utils.rs", "lib/core_utils.rs"]);
        assert!(f.iter().all(|f| f.sources == [2]));
    }
}
