//! Reading a trace in any dialect ctxgate speaks: a chat-completions conversation (`messages`, `tools`), an
//! Anthropic Messages one (`system`, `messages` of content blocks, `tools` with `input_schema`) or a Responses one
//! (`instructions`, `input` items, `tools`). The format is detected from the trace's shape, its steps (where the
//! model answered) are found on the neutral form made by the dialect's own conversion, and each step's request is
//! the body the client sends in the dialect it is replayed in.

use crate::dialect::Dialect;
use serde_json::{Map, Value};

/// A parsed trace: its format, its items and the steps to replay.
#[derive(Debug)]
pub struct Trace<'a> {
    /// The trace object.
    obj: &'a Map<String, Value>,
    /// The dialect the trace is recorded in.
    pub format: Dialect,
    /// Its conversation: chat or Anthropic `messages`, Responses `input` items.
    items: &'a [Value],
    /// For every request, the number of items the client sends (the item at that index starts the answer).
    pub steps: Vec<usize>,
}

/// The dialect of the trace object `obj`: the first of [`Dialect::ALL`] that takes it as its own (Responses: an
/// `input` array and no `messages`; Anthropic: `messages` with Anthropic marks — a top-level `system`, a tool with
/// `input_schema`, a `tool_use` or `tool_result` block — and no chat ones; chat: any other `messages`).
pub fn detect(obj: &Map<String, Value>) -> Result<Dialect, String> {
    Dialect::ALL
        .into_iter()
        .find(|d| d.is_trace(obj))
        .ok_or_else(|| "not a trace: no \"messages\" or \"input\" array".into())
}

impl<'a> Trace<'a> {
    /// Reads `trace`: its format and its steps. `Err` when it is not a trace.
    pub fn read(trace: &'a Value) -> Result<Self, String> {
        let obj = trace
            .as_object()
            .ok_or("not a trace: expected a JSON object")?;
        let format = detect(obj)?;
        let items = obj
            .get(format.conversation_key())
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if let Some(i) = items.iter().position(|m| !m.is_object()) {
            let key = format.conversation_key();
            return Err(format!("not a trace: item {i} of `{key}` is not an object"));
        }
        let steps = steps(format, obj, items);
        Ok(Trace {
            obj,
            format,
            items,
            steps,
        })
    }

    /// Its conversation: every item (chat or Anthropic messages, Responses input items).
    pub fn items(&self) -> &'a [Value] {
        self.items
    }

    /// The trace's `id` (empty when it has none).
    pub fn id(&self) -> &str {
        self.obj.get("id").and_then(Value::as_str).unwrap_or("")
    }

    /// The first word of the trace's `model` (traces describe the model in prose).
    pub fn model(&self) -> Option<&str> {
        self.obj
            .get("model")
            .and_then(Value::as_str)
            .and_then(|m| m.split_whitespace().next())
    }

    /// The body the client sends at step `k` (the first `k` items) in `dialect`: the trace's own format, or, for a
    /// chat trace, the Anthropic or Responses request it stands for. `Err` when a non-chat trace is asked for in
    /// another dialect.
    pub fn body(
        &self,
        model: &str,
        k: usize,
        dialect: Dialect,
    ) -> Result<Map<String, Value>, String> {
        let items = Value::Array(self.items[..k].to_vec());
        let mut body = Map::new();
        body.insert("model".into(), Value::from(model));
        if self.format == Dialect::Chat {
            let body = Dialect::Chat.trace_body(self.obj, items, body);
            return Ok(if dialect == Dialect::Chat {
                body
            } else {
                dialect.chat_body_as(&body)
            });
        }
        if self.format == dialect {
            return Ok(dialect.trace_body(self.obj, items, body));
        }
        Err(format!(
            "the trace is {} conversation: it replays as {} only (the dialect option applies to chat traces)",
            self.format.describe(),
            self.format.as_str()
        ))
    }

    /// The answer of every step (aligned with `steps`): the neutral assistant message(s) the model wrote there —
    /// the chat message itself, the Anthropic message's conversion, the Responses items' group(s) starting there
    /// with each of their call items (answered or not).
    pub fn answers(&self) -> Vec<Vec<Value>> {
        let neutral = self.format.trace_answers(self.obj, self.items);
        let mut by_step: std::collections::BTreeMap<usize, Vec<Value>> = Default::default();
        for (k, m) in neutral {
            by_step.entry(k).or_default().push(m);
        }
        self.steps
            .iter()
            .map(|k| by_step.remove(k).unwrap_or_default())
            .collect()
    }
}

/// Where the model answered: for each neutral assistant message (the dialect's own conversion), the index of the
/// first client item it comes from; the client sent the items before it. In order, without repeats.
fn steps(format: Dialect, obj: &Map<String, Value>, items: &[Value]) -> Vec<usize> {
    let mut out: Vec<usize> = format
        .trace_answers(obj, items)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    out.dedup();
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: &Value) -> (Dialect, Vec<usize>) {
        let t = Trace::read(v).unwrap();
        (t.format, t.steps.clone())
    }

    #[test]
    fn formats_are_told_apart_by_their_shape() {
        let chat = json!({"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
                "function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c","content":"r"},{"role":"assistant","content":"done"}]});
        assert_eq!(read(&chat), (Dialect::Chat, vec![2, 4]));
        let anthropic = json!({"system":"s","messages":[{"role":"user","content":"u"},
            {"role":"assistant","content":[{"type":"tool_use","id":"c","name":"f","input":{}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":"r"}]},
            {"role":"assistant","content":[{"type":"text","text":"done"}]}]});
        assert_eq!(read(&anthropic), (Dialect::Anthropic, vec![1, 3]));
        let responses = json!({"instructions":"s","input":[
            {"type":"message","role":"user","content":[{"type":"input_text","text":"u"}]},
            {"type":"reasoning","id":"rs","summary":[]},
            {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"c","output":"r"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}]});
        // the reasoning item and its call are one answer
        assert_eq!(read(&responses), (Dialect::Responses, vec![1, 4]));
        let gemini = json!({"model":"gemini-2.5-flash","systemInstruction":{"parts":[{"text":"s"}]},"contents":[
            {"role":"user","parts":[{"text":"u"}]},
            {"role":"model","parts":[{"functionCall":{"id":"c","name":"f","args":{}},"thoughtSignature":"S"}]},
            {"role":"user","parts":[{"functionResponse":{"id":"c","name":"f","response":{"output":"r"}}}]},
            {"role":"model","parts":[{"text":"done"}]}],
            "tools":[{"functionDeclarations":[{"name":"f"}]}]});
        assert_eq!(read(&gemini), (Dialect::Gemini, vec![1, 3]));
        let t = Trace::read(&gemini).unwrap();
        let body = t.body("gemini-2.5-flash", 3, Dialect::Gemini).unwrap();
        // the model goes in the path; the system instruction and tools come with every step
        assert!(body.get("model").is_none());
        assert_eq!(body["contents"].as_array().unwrap().len(), 3);
        assert_eq!(body["systemInstruction"], gemini["systemInstruction"]);
        assert_eq!(body["tools"], gemini["tools"]);
        assert_eq!(t.answers()[0][0]["tool_calls"][0]["id"], "c");
        let from_chat = Trace::read(&chat)
            .unwrap()
            .body("m", 4, Dialect::Gemini)
            .unwrap();
        assert_eq!(
            from_chat["contents"][1]["parts"][0]["functionCall"]["id"],
            "c"
        );
        // each step's answer, neutral
        let answers = |v: &Value| Trace::read(v).unwrap().answers();
        let calls = |a: &[Vec<Value>]| a.iter().map(|m| m.len()).collect::<Vec<_>>();
        assert_eq!(calls(&answers(&chat)), [1, 1]);
        assert_eq!(answers(&chat)[1][0]["content"], "done");
        let a = answers(&anthropic);
        assert_eq!(a[0][0]["tool_calls"][0]["id"], "c");
        assert_eq!(a[1][0]["content"], "done");
        let a = answers(&responses);
        // the group, and its call on its own
        assert_eq!(calls(&a), [2, 1]);
        assert_eq!(a[0][0]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(a[1][0]["content"], "done");
        // plain text without a system prompt reads as chat (the same request either way)
        let plain =
            json!({"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"a"}]});
        assert_eq!(read(&plain).0, Dialect::Chat);
        // an Anthropic tool schema alone is enough
        let tools = json!({"tools":[{"name":"f","input_schema":{}}],"messages":[]});
        assert_eq!(read(&tools).0, Dialect::Anthropic);
    }

    #[test]
    fn non_traces_are_refused() {
        for (v, needle) in [
            (json!([1]), "JSON object"),
            (json!({"id":"x"}), "\"messages\""),
            (json!({"messages":[1]}), "item 0 of `messages`"),
            (
                json!({"input":[{"type":"message"}, 2]}),
                "item 1 of `input`",
            ),
        ] {
            let e = Trace::read(&v).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn native_bodies_carry_the_request_fields_and_other_dialects_are_refused() {
        let anthropic = json!({"id":"a","model":"claude-sonnet-4 (agent)","system":"s","max_tokens":512,
            "tools":[{"name":"f","input_schema":{}}],"provenance":"x",
            "messages":[{"role":"user","content":"u"},{"role":"assistant","content":"a"}]});
        let t = Trace::read(&anthropic).unwrap();
        assert_eq!(t.model(), Some("claude-sonnet-4"));
        let body = t.body("claude-sonnet-4", 1, Dialect::Anthropic).unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"model":"claude-sonnet-4","max_tokens":512,"system":"s",
                "messages":[{"role":"user","content":"u"}],"tools":[{"name":"f","input_schema":{}}]})
        );
        let e = t.body("m", 1, Dialect::Chat).unwrap_err();
        assert!(e.contains("Anthropic Messages"), "{e}");
        let responses = json!({"instructions":"s","input":[{"role":"user","content":"u"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}]}]});
        let t = Trace::read(&responses).unwrap();
        let body = t.body("gpt-5", 1, Dialect::Responses).unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"model":"gpt-5","instructions":"s","input":[{"role":"user","content":"u"}],"store":false})
        );
        assert!(t.body("gpt-5", 1, Dialect::Anthropic).is_err());
    }
}
