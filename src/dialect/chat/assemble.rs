//! Assembles the assistant message from chat-completion chunks (streaming) or a whole completion body.

use crate::dialect::AssembledReply;

use serde_json::{json, Map, Value};

#[derive(Debug, Default, Clone)]
struct ToolCallAcc {
    id: String,
    kind: String,
    name: String,
    arguments: String,
}

/// Accumulates chunk deltas of the first choice (`index` 0) into one assistant message.
#[derive(Debug, Default)]
pub struct MessageAssembler {
    role: Option<String>,
    content: Option<String>,
    refusal: Option<String>,
    /// Tool calls in order of first appearance, keyed by their `index`.
    tool_calls: Vec<(u64, ToolCallAcc)>,
    function_call: Option<ToolCallAcc>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    id: Option<String>,
    model: Option<String>,
    error: Option<Value>,
    done: bool,
    chunks: usize,
    /// Bytes of message text taken in so far (content, refusal, calls).
    size: usize,
    /// The message went over [`MAX_ASSEMBLED_BYTES`]: it is no longer assembled.
    overflow: bool,
    /// Tool-call deltas that belonged to no call (left out).
    stray_deltas: usize,
}

use crate::dialect::MAX_ASSEMBLED_BYTES;

impl MessageAssembler {
    /// A fresh assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the `data` of one SSE event.
    pub fn on_event_data(&mut self, data: &str) {
        let trimmed = data.trim();
        if trimmed == "[DONE]" {
            self.done = true;
            return;
        }
        if trimmed.is_empty() {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(trimmed) else {
            return;
        };
        self.on_chunk(&v);
    }

    /// Feeds one parsed chunk object.
    pub fn on_chunk(&mut self, v: &Value) {
        self.chunks += 1;
        if let Some(err) = v.get("error") {
            self.error = Some(err.clone());
            return;
        }
        if self.id.is_none() {
            self.id = v.get("id").and_then(Value::as_str).map(str::to_string);
        }
        if self.model.is_none() {
            self.model = v.get("model").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choices) = v.get("choices").and_then(Value::as_array) else {
            return;
        };
        for choice in choices {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(fr) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(fr.to_string());
            }
            if let Some(delta) = choice.get("delta") {
                self.on_delta(delta);
            }
        }
    }

    fn on_delta(&mut self, delta: &Value) {
        if self.overflow {
            return;
        }
        self.size += delta_size(delta);
        if self.size > MAX_ASSEMBLED_BYTES {
            self.overflow = true;
            self.content = None;
            self.refusal = None;
            self.tool_calls = Vec::new();
            self.function_call = None;
            return;
        }
        if let Some(r) = delta.get("role").and_then(Value::as_str) {
            self.role = Some(r.to_string());
        }
        if let Some(c) = delta.get("content").and_then(Value::as_str) {
            self.content.get_or_insert_with(String::new).push_str(c);
        }
        if let Some(c) = delta.get("refusal").and_then(Value::as_str) {
            self.refusal.get_or_insert_with(String::new).push_str(c);
        }
        if let Some(fc) = delta.get("function_call") {
            merge_function(self.function_call.get_or_insert_with(Default::default), fc);
        }
        let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) else {
            return;
        };
        for (pos, call) in calls.iter().enumerate() {
            // `index` is required by the spec; fall back to the position for lenient upstreams.
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(pos as u64);
            let acc = match self.tool_calls.iter().position(|(i, _)| *i == index) {
                Some(p) => &mut self.tool_calls[p].1,
                // A delta for an index no call opened, that opens none either (no `id`, no name): it belongs to no
                // call (an upstream's bug, or a forged `index`); left out rather than made a call without a name.
                None if !opens_call(call) => {
                    self.stray_deltas += 1;
                    continue;
                }
                None => {
                    self.tool_calls.push((index, ToolCallAcc::default()));
                    let last = self.tool_calls.len() - 1;
                    &mut self.tool_calls[last].1
                }
            };
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                if acc.id.is_empty() {
                    acc.id = id.to_string();
                }
            }
            if let Some(t) = call.get("type").and_then(Value::as_str) {
                acc.kind = t.to_string();
            }
            if let Some(f) = call.get("function") {
                merge_function(acc, f);
            }
        }
    }

    /// Parses a whole (non-streaming) chat.completion body.
    pub fn from_completion_body(body: &[u8]) -> AssembledReply {
        // The usual body through typed fields (a tenth of the work of a whole `Value` tree); anything unusual (an
        // `error` member, a field of an unexpected type, a duplicate) through the tree, which decides.
        if memchr::memmem::find(body, b"\"error\"").is_none() {
            if let Ok(c) = serde_json::from_slice::<Completion>(body) {
                let choice = c.choices.and_then(|c| c.into_iter().next());
                let complete = choice.is_some();
                let (message, finish_reason) = match choice {
                    Some(c) => (c.message.unwrap_or(Value::Null), c.finish_reason),
                    None => (Value::Null, None),
                };
                return AssembledReply {
                    message,
                    finish_reason: finish_reason.and_then(string),
                    usage: c.usage.filter(Value::is_object),
                    id: c.id.and_then(string),
                    model: c.model.and_then(string),
                    error: None,
                    complete,
                    chunks: 0,
                    round_usage: Vec::new(),
                };
            }
        }
        Self::from_tree(body)
    }

    /// [`Self::from_completion_body`] through a whole `Value` tree: any body.
    fn from_tree(body: &[u8]) -> AssembledReply {
        let Ok(Value::Object(mut v)) = serde_json::from_slice::<Value>(body) else {
            return AssembledReply::default();
        };
        if let Some(err) = v.remove("error") {
            return AssembledReply {
                error: Some(err),
                ..Default::default()
            };
        }
        // Taken out of the parsed body, not copied.
        let mut choice = match v.remove("choices") {
            Some(Value::Array(c)) => c.into_iter().next(),
            _ => None,
        };
        let string = |v: Option<Value>| v.and_then(string);
        AssembledReply {
            message: choice
                .as_mut()
                .and_then(|c| c.get_mut("message"))
                .map(Value::take)
                .unwrap_or(Value::Null),
            finish_reason: string(
                choice
                    .as_mut()
                    .and_then(|c| c.get_mut("finish_reason"))
                    .map(Value::take),
            ),
            usage: v.remove("usage").filter(|u| u.is_object()),
            id: string(v.remove("id")),
            model: string(v.remove("model")),
            error: None,
            complete: choice.is_some(),
            chunks: 0,
            round_usage: Vec::new(),
        }
    }

    /// The message assembled so far (also valid for a stream cut short). A message over
    /// [`MAX_ASSEMBLED_BYTES`] comes back as `null` and not complete: nothing of it is recorded.
    pub fn finish(&self) -> AssembledReply {
        if self.overflow {
            return AssembledReply {
                message: Value::Null,
                finish_reason: self.finish_reason.clone(),
                usage: self.usage.clone(),
                id: self.id.clone(),
                model: self.model.clone(),
                error: self.error.clone(),
                complete: false,
                chunks: self.chunks,
                round_usage: Vec::new(),
            };
        }
        let mut m = Map::new();
        m.insert(
            "role".into(),
            Value::String(self.role.clone().unwrap_or_else(|| "assistant".into())),
        );
        m.insert(
            "content".into(),
            self.content
                .clone()
                .map(Value::String)
                .unwrap_or(Value::Null),
        );
        if let Some(r) = &self.refusal {
            m.insert("refusal".into(), Value::String(r.clone()));
        }
        // A call that never got a name is no call a history can carry (the API would refuse it when resent).
        let named = || self.tool_calls.iter().filter(|(_, c)| !c.name.is_empty());
        let nameless = self.tool_calls.len() - named().count();
        if nameless > 0 || self.stray_deltas > 0 {
            tracing::warn!(
                nameless_calls = nameless,
                stray_deltas = self.stray_deltas,
                "relay: streamed tool calls without a name or a call to belong to were left out of the recorded reply"
            );
        }
        if named().next().is_some() {
            let calls: Vec<Value> = named()
                .map(|(_, c)| {
                    json!({
                        "id": c.id,
                        "type": if c.kind.is_empty() { "function" } else { c.kind.as_str() },
                        "function": {"name": c.name, "arguments": c.arguments},
                    })
                })
                .collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(fc) = &self.function_call {
            m.insert(
                "function_call".into(),
                json!({"name": fc.name, "arguments": fc.arguments}),
            );
        }
        AssembledReply {
            message: Value::Object(m),
            finish_reason: self.finish_reason.clone(),
            usage: self.usage.clone(),
            id: self.id.clone(),
            model: self.model.clone(),
            error: self.error.clone(),
            // An error event means the reply was cut short, even when `[DONE]` follows it; a call left out means
            // the recorded message is not the one the client got.
            complete: (self.done || self.finish_reason.is_some())
                && self.error.is_none()
                && nameless == 0,
            chunks: self.chunks,
            round_usage: Vec::new(),
        }
    }
}

/// Whether a tool-call delta can open a call: it carries the call's `id` or its function's name.
fn opens_call(call: &Value) -> bool {
    call.get("id").and_then(Value::as_str).is_some()
        || call
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .is_some()
}

/// Bytes of text a delta adds (its strings, roughly).
fn delta_size(delta: &Value) -> usize {
    match delta {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(delta_size).sum(),
        Value::Object(o) => o.values().map(delta_size).sum(),
        _ => 0,
    }
}

fn merge_function(acc: &mut ToolCallAcc, f: &Value) {
    if let Some(n) = f.get("name").and_then(Value::as_str) {
        // Names normally arrive once; some upstreams repeat the whole name in every delta.
        if acc.name != n {
            acc.name.push_str(n);
        }
    }
    if let Some(a) = f.get("arguments").and_then(Value::as_str) {
        acc.arguments.push_str(a);
    }
}

/// The fields of a chat.completion body that a reply is made of; the rest is skipped unparsed.
#[derive(serde::Deserialize)]
struct Completion {
    choices: Option<Vec<Choice>>,
    usage: Option<Value>,
    id: Option<Value>,
    model: Option<Value>,
}

/// The fields of a choice that a reply is made of.
#[derive(serde::Deserialize)]
struct Choice {
    message: Option<Value>,
    finish_reason: Option<Value>,
}

/// The string of a JSON string; `None` for anything else.
fn string(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typed_reading_of_a_completion_agrees_with_the_tree() {
        let bodies = [
            r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls","logprobs":null}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            r#"{"choices":[]}"#,
            r#"{"choices":[{"message":null,"finish_reason":7}],"usage":null,"id":5,"model":null}"#,
            r#"{"choices":[{"finish_reason":"stop"},{"message":{"role":"assistant","content":"second"}}]}"#,
            r#"{"choices":[null]}"#,
            r#"{"choices":{"0":{}}}"#,
            r#"{"choices":[{"message":{"role":"assistant","content":"a \"error\" in text"}}],"id":"x"}"#,
            r#"{"error":null,"choices":[{"message":{"role":"assistant","content":"x"}}]}"#,
            r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#,
            r#"{"id":"a","id":"b","choices":[]}"#,
            r#"{"usage":[1,2],"choices":[{"message":{"content":"u"}}]}"#,
            r#"[1,2]"#,
            r#"not json"#,
            "",
        ];
        for b in bodies {
            assert_eq!(
                MessageAssembler::from_completion_body(b.as_bytes()),
                MessageAssembler::from_tree(b.as_bytes()),
                "{b}"
            );
        }
        let r = MessageAssembler::from_completion_body(bodies[0].as_bytes());
        assert!(r.complete && r.finish_reason.as_deref() == Some("tool_calls"));
        assert_eq!(r.message["tool_calls"][0]["function"]["name"], "f");
    }

    fn feed(events: &[Value]) -> AssembledReply {
        let mut a = MessageAssembler::new();
        for e in events {
            a.on_event_data(&e.to_string());
        }
        a.on_event_data("[DONE]");
        a.finish()
    }

    fn chunk(delta: Value, finish: Option<&str>) -> Value {
        json!({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",
               "choices":[{"index":0,"delta":delta,"finish_reason":finish}]})
    }

    #[test]
    fn content_and_usage() {
        let r = feed(&[
            chunk(json!({"role":"assistant","content":""}), None),
            chunk(json!({"content":"Hel"}), None),
            chunk(json!({"content":"lo"}), Some("stop")),
            json!({"id":"c1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}),
        ]);
        assert_eq!(r.message, json!({"role":"assistant","content":"Hello"}));
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        assert_eq!(r.prompt_tokens(), Some(5));
        assert!(r.complete);
    }

    #[test]
    fn interleaved_parallel_tool_calls_in_pieces() {
        let r = feed(&[
            chunk(
                json!({"role":"assistant","content":null,"tool_calls":[
                {"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":""}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls":[
                {"index":1,"id":"call_b","type":"function","function":{"name":"grep","arguments":"{\"q\""}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls":[{"index":1,"function":{"arguments":":1}"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls":[{"index":0,"function":{"arguments":"\"a\"}"}}]}),
                Some("tool_calls"),
            ),
        ]);
        assert_eq!(
            r.message["tool_calls"],
            json!([
                {"id":"call_a","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}},
                {"id":"call_b","type":"function","function":{"name":"grep","arguments":"{\"q\":1}"}},
            ])
        );
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    }

    /// A delta for an index no call opened, carrying only arguments (here a forged `index` of 4,000,000,000),
    /// belongs to no call: it is left out, not recorded as a call without a name; a call that never got a name is
    /// left out and the reply is not complete.
    #[test]
    fn a_delta_for_no_call_is_left_out_and_a_nameless_call_is_not_recorded() {
        let r = feed(&[
            chunk(
                json!({"role":"assistant","tool_calls":[
                {"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":"{}"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls":[{"index":4_000_000_000u64,"function":{"arguments":"{\"x\":1}"}}]}),
                Some("tool_calls"),
            ),
        ]);
        assert_eq!(
            r.message["tool_calls"],
            json!([{"id":"call_a","type":"function","function":{"name":"read","arguments":"{}"}}])
        );
        assert!(r.complete);
        let r = feed(&[chunk(
            json!({"role":"assistant","tool_calls":[
                {"index":4_000_000_000u64,"id":"call_x","function":{"arguments":"{}"}}]}),
            Some("tool_calls"),
        )]);
        assert!(r.message.get("tool_calls").is_none(), "{}", r.message);
        assert!(!r.complete);
    }

    #[test]
    fn whole_call_in_one_delta_and_refusal() {
        let r = feed(&[
            chunk(
                json!({"role":"assistant","tool_calls":[
                {"index":0,"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]}),
                None,
            ),
            chunk(json!({"refusal":"no"}), Some("stop")),
        ]);
        assert_eq!(r.message["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(r.message["refusal"], "no");
    }

    #[test]
    fn error_inside_stream_and_cut_stream() {
        let mut a = MessageAssembler::new();
        a.on_event_data(&chunk(json!({"content":"par"}), None).to_string());
        let partial = a.finish();
        assert!(!partial.complete);
        assert_eq!(partial.message["content"], "par");
        a.on_event_data(r#"{"error":{"message":"overloaded","type":"server_error"}}"#);
        assert_eq!(a.finish().error.unwrap()["message"], "overloaded");
        a.on_event_data("[DONE]");
        assert!(
            !a.finish().complete,
            "an error then [DONE] is still cut short"
        );
    }

    #[test]
    fn a_message_over_the_bound_is_not_assembled() {
        let mut a = MessageAssembler::new();
        let piece = "z".repeat(1024 * 1024);
        a.on_chunk(&chunk(json!({"role":"assistant","content":"start"}), None));
        for _ in 0..20 {
            a.on_chunk(&chunk(json!({"content": piece}), None));
            let held = a.content.as_ref().map_or(0, String::len);
            assert!(held <= MAX_ASSEMBLED_BYTES, "{held}");
        }
        a.on_chunk(&chunk(
            json!({"tool_calls":[{"index":0,"id":"c","function":{"arguments":piece}}]}),
            None,
        ));
        assert!(a.tool_calls.is_empty());
        a.on_event_data("[DONE]");
        let r = a.finish();
        assert!(r.message.is_null() && !r.complete && r.is_empty());
    }

    #[test]
    fn anthropic_usage_counts_the_cached_prompt_too() {
        let reply = |usage: Value| AssembledReply {
            usage: Some(usage),
            ..Default::default()
        };
        let r = reply(json!({"input_tokens":12,"cache_read_input_tokens":3000,
            "cache_creation_input_tokens":400,"output_tokens":7}));
        assert_eq!(r.prompt_tokens(), Some(3412));
        assert_eq!(r.completion_tokens(), Some(7));
        let r = reply(json!({"input_tokens":12,"cache_read_input_tokens":null,"output_tokens":1}));
        assert_eq!(r.prompt_tokens(), Some(12));
        // chat's own fields win, and a usage with neither says nothing
        let r = reply(
            json!({"prompt_tokens":5,"input_tokens":9,"completion_tokens":2,"output_tokens":8}),
        );
        assert_eq!(
            (r.prompt_tokens(), r.completion_tokens()),
            (Some(5), Some(2))
        );
        let r = reply(json!({"total_tokens":5}));
        assert_eq!((r.prompt_tokens(), r.completion_tokens()), (None, None));
    }

    #[test]
    fn whole_body() {
        let body = json!({"id":"x","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3}});
        let r = MessageAssembler::from_completion_body(body.to_string().as_bytes());
        assert_eq!(r.message["content"], "hi");
        assert!(r.complete);
        assert_eq!(r.prompt_tokens(), Some(3));
    }
}
