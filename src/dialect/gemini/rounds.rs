//! Recall rounds in the Gemini API: ctxgate's own `functionCall` parts in an answer, the contents that answer them
//! in the next round (the model's content with its thought signatures, then one `user` content of
//! `functionResponse` parts), ctxgate's calls hidden from the client's JSON answer, and `usageMetadata` summed over
//! the rounds. The streaming side is `splice.rs`.

use super::assemble::merged;
use super::convert::parts_of;
use crate::dialect::reply::add_numbers;
use crate::dialect::InjectedNames;
use serde_json::{json, Value};

/// The prefix of the neutral id given to one of ctxgate's calls that came without an `id` (never sent back).
const NO_ID: &str = "ctxgate-call-";

/// True when `part` is a `functionCall` of one of ctxgate's tools.
pub fn is_injected_call(part: &Value, names: &InjectedNames) -> bool {
    part.pointer("/functionCall/name")
        .and_then(Value::as_str)
        .is_some_and(|n| names.is_injected(n))
}

/// The assistant message (`model` content) of a JSON answer, or of a streamed JSON array's chunks.
pub fn answer_message(answer: &Value) -> Option<Value> {
    merged(answer).pointer("/candidates/0/content").cloned()
}

/// ctxgate's `functionCall` parts of a `model` content, as neutral tool calls (an id-less call gets one of its
/// own, by its place in the content).
pub fn injected_calls(message: &Value, names: &InjectedNames) -> Vec<Value> {
    parts_of(message)
        .iter()
        .enumerate()
        .filter(|(_, p)| is_injected_call(p, names))
        .map(|(j, p)| {
            let fc = &p["functionCall"];
            let id = match fc.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => id.to_string(),
                _ => format!("{NO_ID}{j}"),
            };
            let args = fc.get("args").cloned().unwrap_or_else(|| json!({}));
            json!({"id": id, "type": "function", "function": {"name": fc["name"],
                "arguments": serde_json::to_string(&args).unwrap_or_default()}})
        })
        .collect()
}

/// The contents that carry one round into the next request: the round's `model` content without the client's
/// `functionCall` parts (the model asks for them again once it has ctxgate's answers), its thoughts and signatures
/// as they came; then one `user` content answering each of ctxgate's `calls` (`results` aligned with them).
pub fn round_messages(
    assistant: &Value,
    names: &InjectedNames,
    calls: &[Value],
    results: &[String],
) -> Vec<Value> {
    let kept: Vec<Value> = parts_of(assistant)
        .iter()
        .filter(|p| p.get("functionCall").is_none() || is_injected_call(p, names))
        .cloned()
        .collect();
    let mut model = assistant.clone();
    model["parts"] = Value::Array(kept);
    let responses: Vec<Value> = calls
        .iter()
        .zip(results)
        .map(|(c, r)| {
            let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
            let name = c.pointer("/function/name").cloned().unwrap_or_default();
            let mut fr = json!({"name": name, "response": {"output": r}});
            if !id.starts_with(NO_ID) {
                fr["id"] = json!(id);
            }
            json!({"functionResponse": fr})
        })
        .collect();
    vec![model, json!({"role": "user", "parts": responses})]
}

/// Adds a round's `usageMetadata` into `acc` (every count summed).
pub fn add_usage(acc: &mut Option<Value>, usage: &Value) {
    match acc {
        Some(a) => add_numbers(a, usage),
        None => *acc = Some(usage.clone()),
    }
}

/// The client's final JSON answer (one response; a streamed JSON array's chunks merged into one element of it):
/// ctxgate's calls removed from every candidate, `usageMetadata` summed over the rounds, the first round's
/// `responseId`.
pub fn finalize(
    answer: Value,
    names: &InjectedNames,
    usage: Option<Value>,
    first_id: Option<Value>,
) -> Value {
    let array = answer.is_array();
    let mut v = merged(&answer);
    if let Some(cands) = v.get_mut("candidates").and_then(Value::as_array_mut) {
        for c in cands {
            if let Some(parts) = c
                .pointer_mut("/content/parts")
                .and_then(Value::as_array_mut)
            {
                parts.retain(|p| !is_injected_call(p, names));
                if parts.is_empty() {
                    parts.push(json!({"text": ""}));
                }
            }
        }
    }
    if let Some(o) = v.as_object_mut() {
        if let Some(u) = usage {
            o.insert("usageMetadata".into(), u);
        }
        if let Some(id) = first_id.filter(|id| !id.is_null()) {
            o.insert("responseId".into(), id);
        }
    }
    if array {
        Value::Array(vec![v])
    } else {
        v
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::RecallConfig;

    fn names() -> InjectedNames {
        InjectedNames::from_config(&RecallConfig::default())
    }

    #[test]
    fn a_round_is_answered_and_hidden() {
        let n = names();
        let answer = json!({"candidates":[{"content":{"role":"model","parts":[
            {"text":"checking"},
            {"functionCall":{"id":"r1","name":"recall_tool_call","args":{"call_id":"c9"}},"thoughtSignature":"S"},
            {"functionCall":{"name":"recall_tool_call","args":{"call_id":"c8"}}},
            {"functionCall":{"id":"x","name":"run_shell_command","args":{}}}]},"finishReason":"STOP"}],
            "usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2},"responseId":"a"});
        let m = answer_message(&answer).unwrap();
        let calls = injected_calls(&m, &n);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["id"], "r1");
        assert_eq!(calls[0]["function"]["arguments"], "{\"call_id\":\"c9\"}");
        let next = round_messages(&m, &n, &calls, &["one".into(), "two".into()]);
        assert_eq!(next[0]["parts"].as_array().unwrap().len(), 3);
        assert_eq!(next[0]["parts"][1]["thoughtSignature"], "S");
        assert_eq!(
            next[1]["parts"][0]["functionResponse"],
            json!({"name":"recall_tool_call","response":{"output":"one"},"id":"r1"})
        );
        assert!(next[1]["parts"][1]["functionResponse"].get("id").is_none());
        let mut usage = None;
        add_usage(&mut usage, &answer["usageMetadata"]);
        add_usage(
            &mut usage,
            &json!({"promptTokenCount":20,"candidatesTokenCount":3}),
        );
        let last = finalize(answer.clone(), &n, usage, Some(json!("first")));
        assert_eq!(
            last["candidates"][0]["content"]["parts"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            last["usageMetadata"],
            json!({"promptTokenCount":30,"candidatesTokenCount":5})
        );
        assert_eq!(last["responseId"], "first");
        let arr = finalize(json!([answer]), &n, None, None);
        assert!(arr.is_array() && arr[0]["candidates"].is_array());
    }
}
