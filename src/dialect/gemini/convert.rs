//! Gemini contents ⇄ the neutral conversation: `to_neutral` maps a request's `systemInstruction` and `contents` onto
//! chat-completions-shaped messages the context engine plans on (remembering where each came from), and
//! `from_neutral` renders a rewrite back onto the client's own contents: untouched contents borrowed
//! (byte-identical), changed ones rebuilt part by part with what the neutral form cannot hold (thought parts,
//! `thoughtSignature`, `inlineData`, `fileData`, code execution, unknown parts and fields) carried as they were.
//!
//! A `model` content is one assistant message (its text, its `functionCall` parts as tool calls); each
//! `functionResponse` part of a `user` content is a `tool` message, and the content's other parts one user message
//! after them. A call without an `id` gets the neutral id `call_<content>_<part>`, and a response without one the
//! id of the earliest unanswered call of its name in the content before it; neither is ever written to the wire.

use crate::message::{role, Source, CONTINUES};
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// Key of a neutral assistant message holding the text of its parts the neutral form cannot show (thoughts, code,
/// unknown parts): counted as tokens, never rendered (the parts themselves are carried from the client's content).
pub const OPAQUE: &str = "ctxgate_opaque";

/// Text of the user content put first when a rewrite would otherwise open with a `model` content.
pub const TURN_NOTE: &str = "[ctxgate] Earlier messages were left out to fit the context window.";

/// Where a neutral message comes from in the client's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The `systemInstruction` (never rendered back: the body keeps its own).
    System,
    /// The whole content at this index.
    Whole(usize),
    /// The `functionResponse` part (content index, part index).
    Response(usize, usize),
    /// The parts other than `functionResponse` of a user content that also carries responses.
    Rest(usize),
}

impl Origin {
    /// The content index (`None` for the system instruction).
    pub fn native(self) -> Option<usize> {
        match self {
            Origin::System => None,
            Origin::Whole(i) | Origin::Response(i, _) | Origin::Rest(i) => Some(i),
        }
    }
}

/// A request's conversation in the neutral shape, with the origin of each message (aligned).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Neutral {
    /// The neutral messages.
    pub messages: Vec<Value>,
    /// Where each comes from.
    pub origins: Vec<Origin>,
}

impl Neutral {
    fn push(&mut self, m: Value, o: Origin) {
        self.messages.push(m);
        self.origins.push(o);
    }
}

/// The parts of a content (none when it has none).
pub fn parts_of(content: &Value) -> &[Value] {
    content
        .get("parts")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Whether a part is a thought (`thought: true`): never shown as the message's text.
fn is_thought(p: &Value) -> bool {
    p.get("thought").and_then(Value::as_bool) == Some(true)
}

/// The neutral id of the call in part `j` of content `i`: its own `id`, else `call_<i>_<j>`.
pub fn call_id(part: &Value, i: usize, j: usize) -> String {
    match part.pointer("/functionCall/id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => format!("call_{i}_{j}"),
    }
}

/// A `functionCall` part as a neutral tool call.
fn neutral_call(part: &Value, id: String) -> Value {
    let fc = part.get("functionCall").unwrap_or(&Value::Null);
    let name = fc.get("name").and_then(Value::as_str).unwrap_or_default();
    let args = fc.get("args").cloned().unwrap_or_else(|| json!({}));
    json!({"id": id, "type": "function", "function": {"name": name,
        "arguments": serde_json::to_string(&args).unwrap_or_default()}})
}

/// The text a `functionResponse` stands for: the `output` string Gemini CLI sends (`response: {output}`), else the
/// response's compact JSON.
pub fn response_text(part: &Value) -> String {
    let response = part.pointer("/functionResponse/response");
    match response {
        Some(Value::Object(o)) if o.len() == 1 => match o.get("output") {
            Some(Value::String(s)) => s.clone(),
            _ => serde_json::to_string(response.unwrap_or(&Value::Null)).unwrap_or_default(),
        },
        Some(v) => serde_json::to_string(v).unwrap_or_default(),
        None => String::new(),
    }
}

/// Text of what a part holds besides plain text, for counting: its string fields but signatures and base64 data.
fn opaque_part_text(p: &Value) -> String {
    crate::dialect::shared::opaque_text(p, &["thoughtSignature", "data", "mimeType", "id"])
}

/// The neutral content of a user content's non-response parts: their text joined, an image part per inline or
/// file data (the counter's flat price), other parts' text.
fn user_content<'v>(parts: impl Iterator<Item = &'v Value>) -> Value {
    let mut out = Vec::new();
    for p in parts {
        if let Some(t) = p.get("text").and_then(Value::as_str) {
            out.push(json!({"type": "text", "text": t}));
        } else if p.get("inlineData").is_some() || p.get("fileData").is_some() {
            out.push(json!({"type": "image_url", "image_url": {"url": ""}}));
        } else {
            out.push(json!({"type": "text", "text": opaque_part_text(p)}));
        }
    }
    match out.as_slice() {
        [one] if one.get("type").and_then(Value::as_str) == Some("text") => {
            one.get("text").cloned().unwrap_or_default()
        }
        _ => Value::Array(out),
    }
}

/// The neutral assistant message of a `model` content (`i`: its index, for ids).
fn assistant(content: &Value, i: usize) -> Value {
    let (mut text, mut opaque, mut calls) = (String::new(), String::new(), Vec::new());
    for (j, p) in parts_of(content).iter().enumerate() {
        if p.get("functionCall").is_some() {
            calls.push(neutral_call(p, call_id(p, i, j)));
        } else if let (Some(t), false) = (p.get("text").and_then(Value::as_str), is_thought(p)) {
            text.push_str(t);
        } else if !is_thought(p) {
            opaque.push_str(&opaque_part_text(p));
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert(
        "content".into(),
        if text.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::String(text)
        },
    );
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    if !opaque.is_empty() {
        m.insert(OPAQUE.into(), Value::String(opaque));
    }
    Value::Object(m)
}

/// The neutral conversation of a request's `systemInstruction` and `contents`. Deterministic; reads every part
/// once.
pub fn to_neutral(system: Option<&Value>, contents: &[Value]) -> Neutral {
    let mut n = Neutral::default();
    if let Some(s) = system.filter(|s| !s.is_null()) {
        let text: Vec<&str> = parts_of(s)
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        n.push(
            json!({"role": "system", "content": text.join("\n")}),
            Origin::System,
        );
    }
    // The calls of the latest model content not answered yet: (name, neutral id).
    let mut open: Vec<(String, String)> = Vec::new();
    for (i, c) in contents.iter().enumerate() {
        let parts = parts_of(c);
        if role(c) == "model" {
            let m = assistant(c, i);
            open = m
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .map(|call| {
                            let name = call.pointer("/function/name").and_then(Value::as_str);
                            let id = call.get("id").and_then(Value::as_str);
                            (
                                name.unwrap_or_default().to_string(),
                                id.unwrap_or_default().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            n.push(m, Origin::Whole(i));
            continue;
        }
        let responses = parts.iter().any(|p| p.get("functionResponse").is_some());
        if !responses {
            n.push(
                json!({"role": "user", "content": user_content(parts.iter())}),
                Origin::Whole(i),
            );
            continue;
        }
        for (j, p) in parts.iter().enumerate() {
            let Some(fr) = p.get("functionResponse") else {
                continue;
            };
            let name = fr.get("name").and_then(Value::as_str).unwrap_or_default();
            let id = match fr.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => {
                    open.retain(|(_, o)| o != id);
                    id.to_string()
                }
                _ => match open.iter().position(|(n, _)| n == name) {
                    Some(k) => open.remove(k).1,
                    None => format!("call_{i}_{j}"),
                },
            };
            n.push(
                json!({"role": "tool", "tool_call_id": id, "content": response_text(p)}),
                Origin::Response(i, j),
            );
        }
        let rest: Vec<&Value> = parts
            .iter()
            .filter(|p| p.get("functionResponse").is_none())
            .collect();
        if !rest.is_empty() {
            n.push(
                json!({"role": "user", "content": user_content(rest.into_iter()), CONTINUES: true}),
                Origin::Rest(i),
            );
        }
        open.clear();
    }
    n
}

/// The client's contents after a rewrite of their neutral form. `out[k]` is the k-th rewritten neutral message and
/// `sources[k]` where it came from. A content whose neutral messages are all present and unchanged is borrowed
/// (byte-identical); one partly changed or partly absent is rebuilt; added messages (a summary, a note) become
/// `user` contents with one text part; the system instruction is not rendered (the body keeps its own). The result
/// opens with a `user` content and has no two `model` contents in a row (they are merged).
pub fn from_neutral<'a>(
    native: &'a [Value],
    neutral: &Neutral,
    out: &[Cow<'_, Value>],
    sources: &[Source],
) -> Vec<Cow<'a, Value>> {
    let mut rendered = crate::dialect::shared::render::by_client_message(
        native,
        neutral.messages.len(),
        |j| neutral.origins.get(j).map(|o| o.native()),
        out,
        sources,
        |i, parts, total| render_one(native, neutral, i, parts, total),
        added,
    );
    merge_model_runs(&mut rendered);
    if rendered.first().is_some_and(|c| role(c) == "model") {
        rendered.insert(0, Cow::Owned(turn_note()));
    }
    rendered
}

/// The user content put first when a rewrite would otherwise open with a `model` content.
pub fn turn_note() -> Value {
    json!({"role": "user", "parts": [{"text": TURN_NOTE}]})
}

/// A message ctxgate added (a summary, a note) as a `user` content with one text part; `None` when it has no text.
pub fn added(m: &Value) -> Option<Value> {
    let text = crate::message::message_text(m);
    (!text.is_empty()).then(|| json!({"role": "user", "parts": [{"text": text}]}))
}

/// Two `model` contents in a row (their user turn left out) as one, its parts in order.
fn merge_model_runs(rendered: &mut Vec<Cow<'_, Value>>) {
    let mut k = 1;
    while k < rendered.len() {
        if role(&rendered[k - 1]) == "model" && role(&rendered[k]) == "model" {
            let next = rendered.remove(k);
            let prev = rendered[k - 1].to_mut();
            let mut parts = parts_of(prev).to_vec();
            parts.extend(parts_of(&next).iter().cloned());
            if let Some(o) = prev.as_object_mut() {
                o.insert("parts".into(), Value::Array(parts));
            }
        } else {
            k += 1;
        }
    }
}

/// Content `i` from the neutral messages of it present in the rewrite: borrowed when all `total` are there
/// unchanged.
fn render_one<'a>(
    native: &'a [Value],
    neutral: &Neutral,
    i: usize,
    parts: &[(usize, &Value)],
    total: usize,
) -> Option<Cow<'a, Value>> {
    let unchanged = |&(j, m): &(usize, &Value)| {
        neutral
            .messages
            .get(j)
            .is_some_and(|orig| std::ptr::eq(orig, m) || orig == m)
    };
    if parts.len() == total && parts.iter().all(unchanged) {
        return Some(Cow::Borrowed(&native[i]));
    }
    let present: Vec<(Origin, &Value, bool)> = parts
        .iter()
        .filter_map(|p| Some((*neutral.origins.get(p.0)?, p.1, unchanged(p))))
        .collect();
    rebuild(&native[i], i, &present).map(Cow::Owned)
}

/// Content `nat` (index `i`) with only the `present` neutral messages, as rewritten (`bool`: unchanged); `None`
/// when nothing of it is left to send. Every field but `parts` is kept, and every part the rewrite did not touch.
fn rebuild(nat: &Value, i: usize, present: &[(Origin, &Value, bool)]) -> Option<Value> {
    let old = parts_of(nat);
    let mut new_parts: Vec<Value> = Vec::with_capacity(old.len());
    if role(nat) == "model" {
        let &(_, m, same) = present.first()?;
        if same {
            return Some(nat.clone());
        }
        let calls = m.get("tool_calls").and_then(Value::as_array);
        let text = m.get("content").and_then(Value::as_str).unwrap_or_default();
        let old_text: String = old
            .iter()
            .filter(|p| !is_thought(p) && p.get("functionCall").is_none())
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        let mut text_done = false;
        for (j, p) in old.iter().enumerate() {
            if p.get("functionCall").is_some() {
                let id = call_id(p, i, j);
                let call = calls.and_then(|cs| {
                    cs.iter()
                        .find(|c| c.get("id").and_then(Value::as_str) == Some(&id))
                });
                if let Some(call) = call {
                    new_parts.push(with_arguments(p, call));
                }
            } else if p.get("text").is_some() && !is_thought(p) && text != old_text {
                // the text changed: one part holds the new text, where the first text part was
                if !text_done && !text.is_empty() {
                    let mut q = p.clone();
                    q["text"] = Value::String(text.to_string());
                    new_parts.push(q);
                }
                text_done = true;
            } else {
                new_parts.push(p.clone());
            }
        }
        if !text_done && text != old_text && !text.is_empty() {
            new_parts.insert(0, json!({"text": text}));
        }
    } else {
        for (j, p) in old.iter().enumerate() {
            if p.get("functionResponse").is_some() {
                let Some(&(_, m, same)) = present
                    .iter()
                    .find(|(o, _, _)| *o == Origin::Response(i, j))
                else {
                    continue;
                };
                new_parts.push(if same { p.clone() } else { with_response(p, m) });
            }
        }
        let rest = present
            .iter()
            .find(|(o, _, _)| matches!(o, Origin::Rest(_) | Origin::Whole(_)));
        if let Some(&(_, m, same)) = rest {
            let others = old.iter().filter(|p| p.get("functionResponse").is_none());
            if same {
                new_parts.extend(others.cloned());
            } else {
                let text = crate::message::message_text(m);
                let mut text_done = false;
                for p in others {
                    if p.get("text").is_some() {
                        if !text_done && !text.is_empty() {
                            let mut q = p.clone();
                            q["text"] = Value::String(text.clone());
                            new_parts.push(q);
                        }
                        text_done = true;
                    } else {
                        new_parts.push(p.clone());
                    }
                }
                if !text_done && !text.is_empty() {
                    new_parts.push(json!({"text": text}));
                }
            }
        }
    }
    if new_parts.is_empty() {
        return None;
    }
    let mut out = nat.as_object().cloned().unwrap_or_default();
    out.insert("parts".into(), Value::Array(new_parts));
    Some(Value::Object(out))
}

/// A `functionCall` part with the arguments of the rewritten neutral `call` (tool-input clearing): its `args` the
/// new arguments when they are a JSON object, else `{"input": <them>}`; unchanged arguments leave the part as it was.
fn with_arguments(part: &Value, call: &Value) -> Value {
    let new = call
        .pointer("/function/arguments")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let old = part
        .pointer("/functionCall/args")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if serde_json::to_string(&old).ok().as_deref() == Some(new) {
        return part.clone();
    }
    let args = match serde_json::from_str::<Value>(new) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"input": new}),
    };
    let mut p = part.clone();
    if let Some(fc) = p.get_mut("functionCall").and_then(Value::as_object_mut) {
        fc.insert("args".into(), args);
    }
    p
}

/// A `functionResponse` part whose result the rewrite replaced (a cleared or truncated result): its `response` the
/// neutral message's text as `{"output": …}`, its name, id and other fields kept.
fn with_response(part: &Value, m: &Value) -> Value {
    let text = crate::message::message_text(m);
    let mut p = part.clone();
    if let Some(fr) = p.get_mut("functionResponse").and_then(Value::as_object_mut) {
        fr.insert("response".into(), json!({"output": text}));
    }
    p
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn contents() -> Vec<Value> {
        vec![
            json!({"role":"user","parts":[{"text":"<session_context>"},{"text":"fix the bug"}]}),
            json!({"role":"model","parts":[{"text":"Reading."},{"functionCall":{"id":"c1","name":"read_file","args":{"path":"a.py"}},"thoughtSignature":"sig-1"}]}),
            json!({"role":"user","parts":[{"functionResponse":{"id":"c1","name":"read_file","response":{"output":"print(1)"}}}]}),
            json!({"role":"model","parts":[{"text":"why","thought":true},{"functionCall":{"name":"ls","args":{}}},{"functionCall":{"name":"ls","args":{"d":"x"}}}]}),
            json!({"role":"user","parts":[{"functionResponse":{"name":"ls","response":{"files":[1]}}},{"functionResponse":{"name":"ls","response":{"output":"x/"}}},{"text":"go on"}]}),
        ]
    }

    #[test]
    fn contents_become_neutral_messages_with_their_origins() {
        let sys = json!({"parts":[{"text":"be brief"}]});
        let n = to_neutral(Some(&sys), &contents());
        let roles: Vec<&str> = n.messages.iter().map(role).collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "tool",
                "assistant",
                "tool",
                "tool",
                "user"
            ]
        );
        assert_eq!(n.messages[2]["tool_calls"][0]["id"], "c1");
        assert_eq!(n.messages[2]["content"], "Reading.");
        assert_eq!(n.messages[3]["content"], "print(1)");
        // calls without ids: positional ids, and their responses matched by name in order
        assert_eq!(n.messages[4]["tool_calls"][0]["id"], "call_3_1");
        assert_eq!(n.messages[4]["tool_calls"][1]["id"], "call_3_2");
        assert_eq!(n.messages[5]["tool_call_id"], "call_3_1");
        assert_eq!(n.messages[5]["content"], "{\"files\":[1]}");
        assert_eq!(n.messages[6]["tool_call_id"], "call_3_2");
        assert_eq!(n.messages[7]["content"], "go on");
        assert_eq!(n.messages[7][CONTINUES], true);
        assert_eq!(n.origins[5], Origin::Response(4, 0));
        assert_eq!(n.origins[7], Origin::Rest(4));
    }

    #[test]
    fn untouched_contents_are_borrowed_and_changed_ones_keep_their_opaque_parts() {
        let native = contents();
        let n = to_neutral(None, &native);
        let out: Vec<Cow<'_, Value>> = n.messages.iter().map(Cow::Borrowed).collect();
        let sources: Vec<Source> = (0..n.messages.len()).map(Source::Client).collect();
        let back = from_neutral(&native, &n, &out, &sources);
        assert!(back
            .iter()
            .zip(&native)
            .all(|(b, c)| matches!(b, Cow::Borrowed(x) if std::ptr::eq(*x, c))));
        // clear the first result and the first call's input
        let mut out: Vec<Cow<'_, Value>> = n.messages.iter().map(Cow::Borrowed).collect();
        let mut tool = n.messages[2].clone();
        tool["content"] = json!("[ctxgate] Tool result cleared");
        out[2] = Cow::Owned(tool);
        let mut call = n.messages[1].clone();
        call["tool_calls"][0]["function"]["arguments"] = json!("{\"cleared\":true}");
        out[1] = Cow::Owned(call);
        let back = from_neutral(&native, &n, &out, &sources);
        assert_eq!(
            back[2]["parts"][0]["functionResponse"],
            json!({"id":"c1","name":"read_file","response":{"output":"[ctxgate] Tool result cleared"}})
        );
        assert_eq!(back[1]["parts"][1]["thoughtSignature"], "sig-1");
        assert_eq!(
            back[1]["parts"][1]["functionCall"]["args"],
            json!({"cleared": true})
        );
        assert_eq!(back[1]["parts"][0], json!({"text":"Reading."}));
        assert!(matches!(back[3], Cow::Borrowed(_)));
    }

    #[test]
    fn a_rewrite_opens_with_a_user_content_and_never_has_two_model_contents_in_a_row() {
        let native = contents();
        let n = to_neutral(None, &native);
        // keep the two assistant messages only, after a summary
        let out = vec![
            Cow::Owned(
                json!({"role":"assistant","content":"Summary of the earlier conversation: x"}),
            ),
            Cow::Borrowed(&n.messages[1]),
            Cow::Borrowed(&n.messages[3]),
        ];
        let sources = vec![Source::Added, Source::Client(1), Source::Client(3)];
        let back = from_neutral(&native, &n, &out, &sources);
        let roles: Vec<&str> = back.iter().map(|c| role(c)).collect();
        assert_eq!(roles, ["user", "model"]);
        assert_eq!(parts_of(&back[1]).len(), 2 + 3);
        let out = vec![Cow::Borrowed(&n.messages[1])];
        let back = from_neutral(&native, &n, &out, &[Source::Client(1)]);
        assert_eq!(back[0]["parts"][0]["text"], TURN_NOTE);
    }
}
