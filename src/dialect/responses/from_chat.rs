//! Converts an OpenAI chat-completions request into the equivalent Responses request, so that recorded chat traces
//! replay in the Responses dialect too. Deterministic: the same chat body always gives the same bytes.
//!
//! - The leading `system`/`developer` messages become `instructions` (their texts joined by a blank line); later
//!   ones stay in place as `developer` message items.
//! - User messages become `message` items of `input_text` (and `input_image`) parts; an assistant's text becomes
//!   a `message` item of `output_text` parts, and each of its `tool_calls` a `function_call` item
//!   (`call_id`, `name`, `arguments` as a JSON text), in that order.
//! - Tool messages become `function_call_output` items (`call_id`, `output` as text).
//! - `tools` become Responses function tools `{type:"function", name, description, parameters}` (with `strict`
//!   when the chat tool has it); `tool_choice`, `max_tokens`/`max_completion_tokens` (→ `max_output_tokens`),
//!   `temperature`, `top_p`, `parallel_tool_calls`, `reasoning_effort` (→ `reasoning.effort`) and `stream` map to
//!   their Responses counterparts; `model` is kept as is; `store` is `false` (the stateless way Codex calls, which
//!   ctxgate manages). Other fields have no Responses counterpart and are left out.

use serde_json::{json, Map, Value};

/// The Responses request equivalent to the chat request `chat_body` (see the module doc).
pub fn chat_to_responses(chat_body: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(model) = chat_body.get("model") {
        out.insert("model".into(), model.clone());
    }
    let messages = chat_body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let (instructions, input) = convert_messages(messages);
    if let Some(instructions) = instructions {
        out.insert("instructions".into(), Value::String(instructions));
    }
    out.insert("input".into(), Value::Array(input));
    if let Some(tools) = chat_body.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools.iter().filter_map(convert_tool).collect();
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(choice) = chat_body.get("tool_choice").and_then(convert_tool_choice) {
        out.insert("tool_choice".into(), choice);
    }
    if let Some(p) = chat_body
        .get("parallel_tool_calls")
        .filter(|v| v.is_boolean())
    {
        out.insert("parallel_tool_calls".into(), p.clone());
    }
    let max = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| chat_body.get(*k).filter(|v| v.is_u64()));
    if let Some(max) = max {
        out.insert("max_output_tokens".into(), max.clone());
    }
    for key in ["temperature", "top_p"] {
        if let Some(v) = chat_body.get(key).filter(|v| v.is_number()) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(effort) = chat_body.get("reasoning_effort").filter(|v| v.is_string()) {
        out.insert("reasoning".into(), json!({ "effort": effort }));
    }
    out.insert("store".into(), Value::Bool(false));
    if let Some(stream) = chat_body.get("stream").filter(|v| v.is_boolean()) {
        out.insert("stream".into(), stream.clone());
    }
    out
}

/// A function tool in the Responses shape (the shape of ctxgate's own recall tools in this dialect too).
pub fn function_tool(name: &str, description: &str, parameters: Value) -> Value {
    json!({"type": "function", "name": name, "description": description, "parameters": parameters})
}

/// The instructions and the input items of a chat conversation.
fn convert_messages(messages: &[Value]) -> (Option<String>, Vec<Value>) {
    let mut instructions: Vec<String> = Vec::new();
    let mut input = Vec::new();
    let mut opening = true;
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" if opening => instructions.push(text_of(content)),
            "system" | "developer" => input.push(message("developer", "input_text", content)),
            "assistant" => {
                opening = false;
                input.extend(assistant(m));
            }
            "tool" => {
                opening = false;
                input.push(json!({
                    "type": "function_call_output",
                    "call_id": m.get("tool_call_id").cloned().unwrap_or(Value::Null),
                    "output": text_of(content),
                }));
            }
            _ => {
                opening = false;
                input.push(user(content));
            }
        }
    }
    let instructions = (!instructions.is_empty()).then(|| instructions.join("\n\n"));
    (instructions, input)
}

/// A `message` item of `role` whose text parts are of type `part`.
fn message(role: &str, part: &str, content: &Value) -> Value {
    let parts: Vec<Value> = texts(content)
        .into_iter()
        .map(|t| json!({"type": part, "text": t}))
        .collect();
    json!({"type": "message", "role": role, "content": parts})
}

/// A user message as a `message` item: text parts as `input_text`, image parts as `input_image` (with their
/// `detail`); parts of other types are dropped.
fn user(content: &Value) -> Value {
    let Value::Array(parts) = content else {
        return message("user", "input_text", content);
    };
    let parts: Vec<Value> = parts
        .iter()
        .filter_map(|p| match p.get("type").and_then(Value::as_str) {
            Some("text") => p
                .get("text")
                .and_then(Value::as_str)
                .map(|t| json!({"type": "input_text", "text": t})),
            Some("image_url") => {
                let url = p.pointer("/image_url/url").and_then(Value::as_str)?;
                let mut part = json!({"type": "input_image", "image_url": url});
                if let Some(detail) = p.pointer("/image_url/detail").filter(|d| d.is_string()) {
                    part["detail"] = detail.clone();
                }
                Some(part)
            }
            _ => None,
        })
        .collect();
    json!({"type": "message", "role": "user", "content": parts})
}

/// An assistant message as items: a `message` of its text (when it has any), then one `function_call` per call.
fn assistant(m: &Value) -> Vec<Value> {
    let content = m.get("content").unwrap_or(&Value::Null);
    let mut items = Vec::new();
    if !texts(content).is_empty() {
        items.push(message("assistant", "output_text", content));
    }
    for call in m
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let f = call.get("function").unwrap_or(&Value::Null);
        let arguments = match f.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => "{}".to_string(),
            Some(other) => other.to_string(),
        };
        items.push(json!({
            "type": "function_call",
            "call_id": call.get("id").cloned().unwrap_or(Value::Null),
            "name": f.get("name").cloned().unwrap_or(Value::Null),
            "arguments": arguments,
        }));
    }
    if items.is_empty() {
        // an empty answer still takes its turn
        items.push(json!({"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": ""}]}));
    }
    items
}

/// The non-empty texts of chat content: a string, or the `text` of its parts.
fn texts(content: &Value) -> Vec<&str> {
    match content {
        Value::String(s) if s.is_empty() => Vec::new(),
        Value::String(s) => vec![s.as_str()],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .filter(|t| !t.is_empty())
            .collect(),
        _ => Vec::new(),
    }
}

/// Chat content as one text (parts joined by a newline).
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        other => texts(other).join("\n"),
    }
}

/// A chat tool as a Responses function tool; `None` for tools that are not functions.
fn convert_tool(tool: &Value) -> Option<Value> {
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return None;
    }
    let f = tool.get("function")?;
    let mut out = Map::new();
    out.insert("type".into(), json!("function"));
    out.insert("name".into(), f.get("name")?.clone());
    if let Some(d) = f.get("description").filter(|d| d.is_string()) {
        out.insert("description".into(), d.clone());
    }
    let parameters = f
        .get("parameters")
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    out.insert("parameters".into(), parameters);
    if let Some(strict) = f.get("strict").filter(|s| s.is_boolean()) {
        out.insert("strict".into(), strict.clone());
    }
    Some(Value::Object(out))
}

/// `tool_choice`: `auto`, `required` and `none` stay; one named function becomes `{type:"function", name}`.
fn convert_tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(s) if matches!(s.as_str(), "auto" | "required" | "none") => {
            Some(choice.clone())
        }
        Value::Object(_) => {
            let name = choice.pointer("/function/name")?;
            Some(json!({"type": "function", "name": name}))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "from_chat_tests.rs"]
mod tests;
