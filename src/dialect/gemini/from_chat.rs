//! Converts an OpenAI chat-completions request into the equivalent Gemini `generateContent` body, so that recorded
//! chat traces replay as Gemini requests. Deterministic. System messages become the `systemInstruction` (their text
//! joined); user text a `user` content; an assistant's text and `tool_calls` a `model` content of a text part and
//! `functionCall` parts (ids kept, `arguments` parsed into `args`); a run of `tool` messages one `user` content of
//! `functionResponse` parts (`response: {output}`, the call's name and id); `tools` one tool of
//! `functionDeclarations` (`parametersJsonSchema`). The model goes in the path, not the body.

use crate::message::role;
use serde_json::{json, Map, Value};

/// The text of a chat message's content (a string, or its text parts joined); not its tool calls.
fn message_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The Gemini body equivalent to the chat request `chat_body` (see the module doc).
pub fn chat_to_gemini(chat_body: &Map<String, Value>) -> Map<String, Value> {
    let messages = chat_body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut system = Vec::new();
    let mut contents: Vec<Value> = Vec::new();
    let mut names: Map<String, Value> = Map::new();
    let mut responses: Vec<Value> = Vec::new();
    let flush = |responses: &mut Vec<Value>, contents: &mut Vec<Value>| {
        if !responses.is_empty() {
            contents.push(json!({"role": "user", "parts": std::mem::take(responses)}));
        }
    };
    for m in messages {
        match role(m) {
            "system" | "developer" => system.push(message_text(m)),
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let name = names.get(id).cloned().unwrap_or_else(|| json!(""));
                responses.push(json!({"functionResponse": {"id": id, "name": name,
                    "response": {"output": message_text(m)}}}));
            }
            "assistant" => {
                flush(&mut responses, &mut contents);
                let mut parts = Vec::new();
                let text = message_text(m);
                if !text.is_empty() {
                    parts.push(json!({"text": text}));
                }
                for c in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
                    let name = c
                        .pointer("/function/name")
                        .cloned()
                        .unwrap_or_else(|| json!(""));
                    names.insert(id.to_string(), name.clone());
                    let args = c
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    parts.push(json!({"functionCall": {"id": id, "name": name, "args": args}}));
                }
                if parts.is_empty() {
                    parts.push(json!({"text": ""}));
                }
                contents.push(json!({"role": "model", "parts": parts}));
            }
            _ => {
                flush(&mut responses, &mut contents);
                contents.push(json!({"role": "user", "parts": [{"text": message_text(m)}]}));
            }
        }
    }
    flush(&mut responses, &mut contents);
    let mut out = Map::new();
    if !system.is_empty() {
        out.insert(
            "systemInstruction".into(),
            json!({"parts": [{"text": system.join("\n\n")}]}),
        );
    }
    out.insert("contents".into(), Value::Array(contents));
    let declarations: Vec<Value> = chat_body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let f = t.get("function")?;
            Some(json!({"name": f.get("name")?, "description": f.get("description").cloned().unwrap_or_default(),
                "parametersJsonSchema": f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}))}))
        })
        .collect();
    if !declarations.is_empty() {
        out.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations}]),
        );
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_trace_converts_into_a_valid_sequence() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut seen = 0;
        for e in entries.flatten() {
            if e.path().extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap();
            let trace: Value = serde_json::from_str(&text).unwrap();
            let Some(obj) = trace.as_object() else {
                continue;
            };
            if obj.get("messages").is_none() {
                continue;
            }
            let body = chat_to_gemini(obj);
            let contents = body["contents"].as_array().unwrap();
            // a trace ends with the model's answer: the request is every content before a model content
            let mut end = contents.len();
            while end > 0 && role(&contents[end - 1]) == "model" {
                end -= 1;
            }
            if let Err(err) = super::super::validate::check_sequence(&contents[..end]) {
                panic!("{:?}: {err}", e.path());
            }
            seen += 1;
        }
        assert!(seen > 0 || !dir.exists());
    }

    #[test]
    fn calls_and_results_keep_their_ids_and_names() {
        let chat = json!({"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":"q"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"d\":\"x\"}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"a b"},
            {"role":"assistant","content":"done"}],
            "tools":[{"type":"function","function":{"name":"ls","parameters":{"type":"object"}}}]});
        let g = chat_to_gemini(chat.as_object().unwrap());
        assert_eq!(g["systemInstruction"]["parts"][0]["text"], "be brief");
        assert_eq!(
            g["contents"][1]["parts"][0]["functionCall"],
            json!({"id":"c1","name":"ls","args":{"d":"x"}})
        );
        assert_eq!(
            g["contents"][2]["parts"][0]["functionResponse"],
            json!({"id":"c1","name":"ls","response":{"output":"a b"}})
        );
        assert_eq!(g["tools"][0]["functionDeclarations"][0]["name"], "ls");
        assert!(g.get("model").is_none());
    }
}
