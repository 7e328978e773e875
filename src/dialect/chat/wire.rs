//! Chat completions as a [`Wire`]: its messages are the neutral shape, so it converts nothing and renders the
//! client's fields with the rewritten messages.

use super::rounds::ChatSplice;
use super::MessageAssembler;
use crate::context::roles;
use crate::context::units::check_sequence;
use crate::context::RewrittenBody;
use crate::dialect::naming::{chat_fingerprint, KeyKind, AGENT_HEADERS};
use crate::dialect::request::Call;
use crate::dialect::rounds::Splice;
use crate::dialect::wire::{items_of, Conversion, Wire};
use crate::dialect::{Assemble, AssembledReply, InjectedNames, Request};
use crate::error::GatewayError;
use crate::message::role;
use crate::metrics::DialectLabel;
use crate::upstream::Api;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// OpenAI chat completions (`POST /v1/chat/completions`).
pub struct ChatWire;

/// Whether a trace object has chat-completions marks: a `tool` message, `tool_calls`, a tool with `function`.
pub fn has_chat_marks(obj: &Map<String, Value>) -> bool {
    let messages = obj.get("messages").and_then(Value::as_array);
    let tools = obj.get("tools").and_then(Value::as_array);
    messages.is_some_and(|ms| {
        ms.iter()
            .any(|m| role(m) == "tool" || m.get("tool_calls").is_some())
    }) || tools.is_some_and(|ts| ts.iter().any(|t| t.get("function").is_some()))
}

impl Wire for ChatWire {
    fn name(&self) -> &'static str {
        "chat"
    }
    fn label(&self) -> DialectLabel {
        DialectLabel::Chat
    }
    fn describe(&self) -> &'static str {
        "a chat-completions"
    }
    fn api(&self) -> Api {
        Api::OpenAi
    }
    /// OpenAI-compatible servers (vLLM, llama.cpp, Ollama with Mistral, Qwen or Gemma templates) refuse a `system`
    /// message after the conversation began or two user or assistant messages in a row.
    fn strict_roles(&self) -> bool {
        true
    }
    fn conversation_key(&self) -> &'static str {
        "messages"
    }
    fn system_key(&self) -> Option<&'static str> {
        None
    }
    fn client_path(&self) -> &'static str {
        "/v1/chat/completions"
    }
    fn upstream_path(&self) -> &'static str {
        "chat/completions"
    }

    fn parse(&self, raw: Bytes, _: &Call<'_>) -> Result<Request, GatewayError> {
        super::parse(raw)
    }
    fn convert(&self, _: Option<&Value>, _: &[Value]) -> Option<Arc<dyn Conversion>> {
        None
    }
    fn neutral_of(&self, stored: &Value) -> Vec<Value> {
        vec![stored.clone()]
    }
    fn neutral_history(&self, stored: Vec<(u32, Arc<Value>)>) -> Vec<(u32, Arc<Value>)> {
        stored
    }

    fn tool_def(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"type": "function", "function": {
            "name": name, "description": description, "parameters": parameters}})
    }
    fn may_add_tools(
        &self,
        body: &Map<String, Value>,
        names: &InjectedNames,
    ) -> Result<(), &'static str> {
        super::may_add_tools(body, names)
    }
    fn render(
        &self,
        _: &Request,
        body: &RewrittenBody<'_>,
    ) -> serde_json::Result<(Vec<u8>, usize)> {
        body.to_vec()
    }

    fn assembler(&self) -> Box<dyn Assemble> {
        Box::<MessageAssembler>::default()
    }
    fn reply_from_body(&self, body: &[u8]) -> AssembledReply {
        MessageAssembler::from_completion_body(body)
    }
    fn error_body(&self, e: &GatewayError) -> Value {
        e.body()
    }
    fn error_event_body(&self, e: &GatewayError, _: Option<u64>) -> Vec<u8> {
        let mut b = b"data: ".to_vec();
        b.extend(serde_json::to_vec(&e.body()).unwrap_or_default());
        b
    }

    fn splicer(&self, names: InjectedNames, body: &Map<String, Value>) -> Box<dyn Splice> {
        Box::new(ChatSplice::new(names, body))
    }
    fn answer_message(&self, answer: &Value) -> Option<Value> {
        answer.pointer("/choices/0/message").cloned()
    }
    fn injected_calls(&self, message: &Value, names: &InjectedNames) -> Vec<Value> {
        names.injected_calls(message).into_iter().cloned().collect()
    }
    fn round_messages(
        &self,
        assistant: &Value,
        _: &InjectedNames,
        calls: &[Value],
        results: &[String],
    ) -> Vec<Value> {
        super::rounds::round_messages(assistant, calls, results)
    }
    fn add_usage(&self, acc: &mut Option<Value>, usage: &Value) {
        super::merge_usage(acc, usage)
    }
    fn finalize_answer(
        &self,
        answer: Value,
        names: &InjectedNames,
        usage: Option<Value>,
        first_id: Option<Value>,
    ) -> Value {
        super::rounds::finalize(answer, names, usage, first_id)
    }

    /// One of [`AGENT_HEADERS`].
    fn client_key(
        &self,
        header: &dyn Fn(&str) -> Option<String>,
        _: &Map<String, Value>,
    ) -> Option<(String, KeyKind)> {
        AGENT_HEADERS
            .iter()
            .find_map(|h| header(h))
            .map(|v| (v, KeyKind::AgentHeader))
    }
    fn fingerprint(&self, body: &Map<String, Value>) -> String {
        chat_fingerprint(body)
    }

    fn is_trace(&self, obj: &Map<String, Value>) -> bool {
        obj.get("messages").is_some_and(Value::is_array)
    }
    fn chat_body_as(&self, chat: &Map<String, Value>) -> Map<String, Value> {
        chat.clone()
    }
    fn trace_body(
        &self,
        trace: &Map<String, Value>,
        items: Value,
        mut body: Map<String, Value>,
    ) -> Map<String, Value> {
        body.insert("messages".into(), items);
        if let Some(t) = trace.get("tools").filter(|t| !t.is_null()) {
            body.insert("tools".into(), t.clone());
        }
        body
    }
    fn trace_answers(&self, _: &Map<String, Value>, items: &[Value]) -> Vec<(usize, Value)> {
        items
            .iter()
            .enumerate()
            .filter(|(_, m)| role(m) == "assistant")
            .map(|(k, m)| (k, m.clone()))
            .collect()
    }
    fn check_sent(&self, client: &Value, sent: &Value) -> Result<(), String> {
        let items = items_of(sent, "messages");
        check_sequence(items).and_then(|()| roles::check_roles(items_of(client, "messages"), items))
    }
}
