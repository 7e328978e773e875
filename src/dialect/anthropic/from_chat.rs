//! Converts an OpenAI chat-completions request into the equivalent Anthropic Messages request, so that recorded
//! chat traces replay in both dialects. Deterministic: the same chat body always gives the same bytes.
//!
//! - Leading `system`/`developer` messages become the top-level `system` (text blocks); later ones stay in place
//!   as `role:"system"` messages (Anthropic's mid-conversation system messages).
//! - An assistant's text and `tool_calls` become `text` and `tool_use` blocks (`arguments` parsed into `input`).
//! - A run of consecutive `tool` messages becomes one user message of `tool_result` blocks (parallel results
//!   stay together, as Anthropic requires).
//! - `tools` become `{name, description, input_schema}`; `tool_choice`, `max_tokens`/`max_completion_tokens`
//!   (defaulted when missing), `temperature`, `top_p`, `stop`, `stream` and `user` map to their Anthropic
//!   counterparts; `model` is kept as is. Other fields have no Anthropic counterpart and are left out.

use serde_json::{json, Map, Value};

/// `max_tokens` when the chat request names none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The Anthropic Messages request equivalent to the chat request `chat_body` (see the module doc).
pub fn chat_to_anthropic(chat_body: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(model) = chat_body.get("model") {
        out.insert("model".into(), model.clone());
    }
    let max_tokens = ["max_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| chat_body.get(*k).filter(|v| v.is_u64()).cloned())
        .unwrap_or_else(|| json!(DEFAULT_MAX_TOKENS));
    out.insert("max_tokens".into(), max_tokens);
    let messages = chat_body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let (system, messages) = convert_messages(messages);
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = chat_body.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools.iter().filter_map(convert_tool).collect();
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(choice) = chat_body.get("tool_choice").and_then(convert_tool_choice) {
        out.insert("tool_choice".into(), choice);
    }
    for key in ["temperature", "top_p"] {
        if let Some(v) = chat_body.get(key).filter(|v| v.is_number()) {
            out.insert(key.into(), v.clone());
        }
    }
    let stop = match chat_body.get("stop") {
        Some(Value::String(s)) => vec![Value::String(s.clone())],
        Some(Value::Array(a)) => a.iter().filter(|s| s.is_string()).cloned().collect(),
        _ => Vec::new(),
    };
    if !stop.is_empty() {
        out.insert("stop_sequences".into(), Value::Array(stop));
    }
    if let Some(stream) = chat_body.get("stream").filter(|v| v.is_boolean()) {
        out.insert("stream".into(), stream.clone());
    }
    if let Some(user) = chat_body.get("user").filter(|v| v.is_string()) {
        out.insert("metadata".into(), json!({ "user_id": user }));
    }
    out
}

/// The top-level system blocks and the Anthropic messages of a chat conversation.
fn convert_messages(messages: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let mut system = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    let mut results: Vec<Value> = Vec::new();
    let mut opening = true;
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        if role == "tool" {
            results.push(tool_result(m));
            opening = false;
            continue;
        }
        if !results.is_empty() {
            out.push(json!({"role": "user", "content": std::mem::take(&mut results)}));
        }
        match role {
            "system" | "developer" if opening => system.extend(text_blocks(content)),
            "system" | "developer" => {
                out.push(json!({"role": "system", "content": plain_content(content)}));
            }
            "assistant" => {
                opening = false;
                out.push(assistant(m));
            }
            _ => {
                opening = false;
                out.push(json!({"role": "user", "content": user_content(content)}));
            }
        }
    }
    if !results.is_empty() {
        out.push(json!({"role": "user", "content": results}));
    }
    (system, out)
}

/// An assistant message as blocks: its text (when any), then one `tool_use` per tool call.
fn assistant(m: &Value) -> Value {
    let mut blocks = text_blocks(m.get("content").unwrap_or(&Value::Null));
    for call in m
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let f = call.get("function").unwrap_or(&Value::Null);
        blocks.push(json!({
            "type": "tool_use",
            "id": call.get("id").cloned().unwrap_or(Value::Null),
            "name": f.get("name").cloned().unwrap_or(Value::Null),
            "input": tool_input(f.get("arguments")),
        }));
    }
    if blocks.is_empty() {
        return json!({"role": "assistant", "content": ""});
    }
    json!({"role": "assistant", "content": blocks})
}

/// A call's `arguments` (a JSON text) as the `input` object: parsed; an argument text that is not a JSON object
/// (malformed, or another JSON value) is kept whole under `arguments`, since `input` must be an object.
fn tool_input(arguments: Option<&Value>) -> Value {
    match arguments {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ if s.trim().is_empty() => json!({}),
            _ => json!({ "arguments": s }),
        },
        Some(v @ Value::Object(_)) => v.clone(),
        None | Some(Value::Null) => json!({}),
        Some(other) => json!({ "arguments": other }),
    }
}

/// A tool message as a `tool_result` block.
fn tool_result(m: &Value) -> Value {
    let content = match m.get("content").unwrap_or(&Value::Null) {
        Value::String(s) => Value::String(s.clone()),
        Value::Null => Value::String(String::new()),
        other => Value::Array(text_blocks(other)),
    };
    json!({
        "type": "tool_result",
        "tool_use_id": m.get("tool_call_id").cloned().unwrap_or(Value::Null),
        "content": content,
    })
}

/// Chat content as Anthropic text blocks: a string is one block (none when empty); text parts become blocks,
/// other parts are dropped.
fn text_blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) if s.is_empty() => Vec::new(),
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .filter(|t| !t.is_empty())
            .map(|t| json!({"type": "text", "text": t}))
            .collect(),
        _ => Vec::new(),
    }
}

/// A mid-conversation system message's content: its text, as one string.
fn plain_content(content: &Value) -> Value {
    match content {
        Value::String(s) => Value::String(s.clone()),
        other => Value::String(
            text_blocks(other)
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    }
}

/// A user message's content: a string stays a string; parts become text and image blocks (a `data:` URL as a
/// base64 source, any other URL as a URL source); parts of other types are dropped.
fn user_content(content: &Value) -> Value {
    let Value::Array(parts) = content else {
        return match content {
            Value::String(s) => Value::String(s.clone()),
            _ => Value::String(String::new()),
        };
    };
    let blocks = parts
        .iter()
        .filter_map(|p| match p.get("type").and_then(Value::as_str) {
            Some("text") => p
                .get("text")
                .and_then(Value::as_str)
                .map(|t| json!({"type": "text", "text": t})),
            Some("image_url") => {
                let url = p.pointer("/image_url/url").and_then(Value::as_str)?;
                Some(json!({"type": "image", "source": image_source(url)}))
            }
            _ => None,
        })
        .collect();
    Value::Array(blocks)
}

fn image_source(url: &str) -> Value {
    let data = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"));
    match data {
        Some((media_type, data)) => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        None => json!({"type": "url", "url": url}),
    }
}

/// A chat tool as an Anthropic tool; `None` for tools that are not functions.
fn convert_tool(tool: &Value) -> Option<Value> {
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return None;
    }
    let f = tool.get("function")?;
    let mut out = Map::new();
    out.insert("name".into(), f.get("name")?.clone());
    if let Some(d) = f.get("description").filter(|d| d.is_string()) {
        out.insert("description".into(), d.clone());
    }
    let schema = f
        .get("parameters")
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    out.insert("input_schema".into(), schema);
    Some(Value::Object(out))
}

/// `tool_choice`: `auto`, `required` (→ `any`), `none`, or one named function (→ `tool`).
fn convert_tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(s) => match s.as_str() {
            "auto" => Some(json!({"type": "auto"})),
            "required" => Some(json!({"type": "any"})),
            "none" => Some(json!({"type": "none"})),
            _ => None,
        },
        Value::Object(_) => {
            let name = choice.pointer("/function/name")?;
            Some(json!({"type": "tool", "name": name}))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "from_chat_tests.rs"]
mod tests;
