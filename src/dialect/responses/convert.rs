//! Responses input items ⇄ the neutral conversation. `to_neutral` maps `instructions` and the `input` items onto
//! chat-completions-shaped messages (each remembering the RANGE of items it stands for); `from_neutral` renders a
//! rewrite back onto the client's items: untouched ones borrowed (byte-identical), changed ones rebuilt
//! (`rebuild`), left-out ones removed with everything that must go with them.
//!
//! Mapping: `instructions` → one neutral system message (never rendered back: the body keeps its own). A `message`
//! item (or the `{role, content}` shorthand) of role `user` → a user message; `system`/`developer` → a system
//! message (never pruned). A run of `reasoning` items, assistant `message` items and `function_call` /
//! `custom_tool_call` items → ONE neutral assistant message (text joined, calls as parallel tool calls); the
//! `function_call_output` / `custom_tool_call_output` items right after it → one tool message each. Only calls
//! answered in that run of outputs become neutral tool calls (an unanswered call item is carried with its message);
//! an opaque item right after a reasoning item (a hosted tool call it produced) belongs to the group too.
//! Opaque items (`compaction`, `compaction_trigger`, `item_reference`, outputs of no call of the group before them,
//! and every unknown type) → a neutral system message of their own (the engine never drops, reorders or changes a
//! system message), except inside an open tool loop (between a group's calls and its last output), where an
//! opaque item joins the next neutral message's range (the previous one's at the end of the run) so the neutral
//! sequence stays valid: there it goes and stays with that message. Reasoning items' text and encrypted content
//! count no tokens (only their items are carried, never changed).

use super::rebuild::{added, rebuild};
use crate::message::Source;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::HashSet;

/// Where a neutral message comes from in the client's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The top-level `instructions` (never rendered back).
    Instructions,
    /// The input items `start..end`.
    Items {
        /// First item.
        start: usize,
        /// One past the last item.
        end: usize,
    },
}

impl Origin {
    /// The input items it stands for (`None` for `instructions`).
    pub fn items(self) -> Option<std::ops::Range<usize>> {
        match self {
            Origin::Instructions => None,
            Origin::Items { start, end } => Some(start..end),
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
    fn push(&mut self, m: Value, start: usize, end: usize) {
        self.messages.push(m);
        self.origins.push(Origin::Items { start, end });
    }
}

/// What an input item is, for the conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A `message` of role `user` (or an unknown role).
    User,
    /// A `message` of role `system` or `developer`.
    System,
    /// A `message` of role `assistant`.
    Assistant,
    /// A `reasoning` item.
    Reasoning,
    /// A `function_call` or `custom_tool_call`.
    Call,
    /// A `function_call_output` or `custom_tool_call_output`.
    Output,
    /// Anything else: carried byte-exact, never changed.
    Opaque,
}

/// The kind of an input item (`{role, content}` without a `type` is a message).
pub fn kind(item: &Value) -> Kind {
    let t = item.get("type").and_then(Value::as_str);
    let role = item.get("role").and_then(Value::as_str);
    match (t, role) {
        (Some("message") | None, Some("assistant")) => Kind::Assistant,
        (Some("message") | None, Some("system" | "developer")) => Kind::System,
        (Some("message") | None, Some(_)) => Kind::User,
        (Some("reasoning"), _) => Kind::Reasoning,
        (Some("function_call" | "custom_tool_call"), _) => Kind::Call,
        (Some("function_call_output" | "custom_tool_call_output"), _) => Kind::Output,
        _ => Kind::Opaque,
    }
}

/// The `call_id` of a call or output item (`""` when absent).
pub fn call_id(item: &Value) -> &str {
    item.get("call_id").and_then(Value::as_str).unwrap_or("")
}

/// The items of an `input`: the array, or a string as one user message in the shorthand form.
pub fn input_items(input: Option<&Value>) -> Cow<'_, [Value]> {
    match input {
        Some(Value::Array(a)) => Cow::Borrowed(a.as_slice()),
        Some(Value::String(s)) => Cow::Owned(vec![json!({"role":"user","content":s})]),
        _ => Cow::Owned(Vec::new()),
    }
}

/// The neutral conversation of a request's `instructions` and `input` items. Deterministic; reads each item once.
pub fn to_neutral(instructions: Option<&Value>, input: &[Value]) -> Neutral {
    let mut n = Neutral::default();
    if let Some(Value::String(s)) = instructions {
        n.messages.push(json!({"role":"system","content":s}));
        n.origins.push(Origin::Instructions);
    }
    let mut i = 0;
    while i < input.len() {
        let item = &input[i];
        match kind(item) {
            Kind::User | Kind::System => {
                let r = if kind(item) == Kind::User {
                    "user"
                } else {
                    "system"
                };
                n.push(
                    json!({"role":r,"content":content(item.get("content"))}),
                    i,
                    i + 1,
                );
                i += 1;
            }
            Kind::Opaque | Kind::Output => {
                n.push(
                    json!({"role":"system","content":opaque_text(item)}),
                    i,
                    i + 1,
                );
                i += 1;
            }
            Kind::Assistant | Kind::Reasoning | Kind::Call => i = group(&mut n, input, i),
        }
    }
    n
}

/// The assistant group starting at `start` and the tool messages of its outputs; the index after them.
fn group(n: &mut Neutral, input: &[Value], start: usize) -> usize {
    let mut j = start;
    // Reasoning, assistant messages and calls; an opaque item right after a reasoning item is what it produced.
    while j < input.len()
        && match kind(&input[j]) {
            Kind::Assistant | Kind::Reasoning | Kind::Call => true,
            Kind::Opaque => kind(&input[j - 1]) == Kind::Reasoning,
            _ => false,
        }
    {
        j += 1;
    }
    let mut k = j;
    let mut answered: HashSet<&str> = HashSet::new();
    while k < input.len() && matches!(kind(&input[k]), Kind::Output | Kind::Opaque) {
        if kind(&input[k]) == Kind::Output {
            answered.insert(call_id(&input[k]));
        }
        k += 1;
    }
    let (mut texts, mut calls, mut ids) = (Vec::new(), Vec::new(), HashSet::new());
    for it in &input[start..j] {
        match kind(it) {
            Kind::Assistant => texts.push(text_of(it.get("content"))),
            Kind::Call if answered.contains(call_id(it)) && ids.insert(call_id(it)) => {
                calls.push(tool_call(it));
            }
            _ => {}
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), "assistant".into());
    let text = (!texts.is_empty()).then(|| Value::String(texts.join("\n")));
    m.insert("content".into(), text.unwrap_or(Value::Null));
    if calls.is_empty() {
        n.push(Value::Object(m), start, j);
        return j;
    }
    m.insert("tool_calls".into(), Value::Array(calls));
    n.push(Value::Object(m), start, j);
    // The outputs: one tool message each for the group's calls (first answer only); the rest join a neighbour.
    let mut pending = j;
    for (x, it) in input.iter().enumerate().take(k).skip(j) {
        if kind(it) == Kind::Output && ids.remove(call_id(it)) {
            let out = content(it.get("output"));
            n.push(
                json!({"role":"tool","tool_call_id":call_id(it),"content":out}),
                pending,
                x + 1,
            );
            pending = x + 1;
        }
    }
    if pending < k {
        if let Some(Origin::Items { end, .. }) = n.origins.last_mut() {
            *end = k;
        }
    }
    k
}

/// The neutral tool call of a `function_call` / `custom_tool_call` item (its `arguments` / `input` as arguments).
fn tool_call(it: &Value) -> Value {
    let args = match it.get("arguments").or_else(|| it.get("input")) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    json!({"id":call_id(it),"type":"function",
        "function":{"name":it.get("name").cloned().unwrap_or(Value::Null),"arguments":args}})
}

/// The neutral tool message of an output item.
fn tool_message(it: &Value) -> Value {
    json!({"role":"tool","tool_call_id":call_id(it),"content":content(it.get("output"))})
}

/// The neutral message of one stored client item on its own, for recall and search: a call item an assistant
/// message with that tool call, an output item a tool message, anything else as in [`to_neutral`].
pub fn neutral_of(item: &Value) -> Vec<Value> {
    match kind(item) {
        Kind::Call => {
            vec![json!({"role":"assistant","content":null,"tool_calls":[tool_call(item)]})]
        }
        Kind::Output => vec![tool_message(item)],
        _ => to_neutral(None, std::slice::from_ref(item)).messages,
    }
}

/// Neutral content of a message or output: its string, or parts (`text`, `image`, others as `{type, content}`).
fn content(c: Option<&Value>) -> Value {
    let Some(Value::Array(parts)) = c else {
        return Value::String(match c {
            Some(Value::String(s)) => s.clone(),
            Some(other) => opaque_text(other),
            None => String::new(),
        });
    };
    let parts: Vec<Value> = parts
        .iter()
        .map(|p| match p.get("type").and_then(Value::as_str).unwrap_or("") {
            "input_text" | "output_text" | "text" => {
                json!({"type":"text","text":p.get("text").and_then(Value::as_str).unwrap_or("")})
            }
            "input_image" => json!({"type":"image"}),
            t => json!({"type":t,"content":opaque_text(p)}),
        })
        .collect();
    Value::Array(parts)
}

/// The text of an assistant message's content: its string or its text parts joined by newlines.
fn text_of(c: Option<&Value>) -> String {
    match c {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            texts.join("\n")
        }
        _ => String::new(),
    }
}

/// Fields whose strings are not text the model reads (ids, encrypted or base64 data).
const NOT_TEXT: [&str; 8] = [
    "type",
    "id",
    "call_id",
    "encrypted_content",
    "file_data",
    "image_url",
    "file_id",
    "status",
];

/// The strings of an item a model reads, in document order, joined by newlines; an explicit stack, no recursion.
pub(super) fn opaque_text(v: &Value) -> String {
    crate::dialect::shared::opaque_text(v, &NOT_TEXT)
}

/// The client's items after a rewrite of their neutral form (`out[k]` rewritten, `sources[k]` where it came from).
/// A neutral message present and unchanged renders its items borrowed; a changed one rebuilds them (`rebuild`); a
/// left-out one renders nothing; an added one (summary, note) becomes a `developer` message item with one
/// `input_text` part; `instructions` is not rendered (the body keeps its own).
pub fn from_neutral<'a>(
    native: &'a [Value],
    neutral: &Neutral,
    out: &[Cow<'_, Value>],
    sources: &[Source],
) -> Vec<Cow<'a, Value>> {
    let mut rendered: Vec<Cow<'a, Value>> = Vec::with_capacity(native.len() + 2);
    for (k, m) in out.iter().enumerate() {
        let j = match sources.get(k) {
            Some(Source::Client(j)) => *j,
            _ => {
                rendered.extend(added(m.as_ref()).map(Cow::Owned));
                continue;
            }
        };
        let Some(Origin::Items { start, end }) = neutral.origins.get(j).copied() else {
            continue;
        };
        let Some(items) = native.get(start..end) else {
            continue;
        };
        let orig = neutral.messages.get(j);
        if orig.is_some_and(|o| std::ptr::eq(o, m.as_ref()) || o == m.as_ref()) {
            rendered.extend(items.iter().map(Cow::Borrowed));
        } else {
            rendered.extend(rebuild(items, orig, m.as_ref()));
        }
    }
    rendered
}
