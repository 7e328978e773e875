//! Anthropic Messages as a [`Wire`]: converted to the neutral form and rendered back block by block, its own
//! answers, recall rounds, errors, session keys and traces.

use super::from_chat::{chat_to_anthropic, DEFAULT_MAX_TOKENS};
use super::session_id::{fingerprint, metadata_session, CLAUDE_CODE_SESSION_HEADER};
use super::splice::StreamSplicer;
use super::{validate, Assembler, Converted};
use crate::context::RewrittenBody;
use crate::dialect::naming::KeyKind;
use crate::dialect::request::Call;
use crate::dialect::rounds::Splice;
use crate::dialect::shared::fields::copy_fields;
use crate::dialect::shared::Spliced;
use crate::dialect::wire::{items_of, Conversion, Wire};
use crate::dialect::{Assemble, AssembledReply, InjectedNames, Request};
use crate::error::GatewayError;
use crate::metrics::DialectLabel;
use crate::upstream::Api;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Anthropic Messages (`POST /v1/messages`).
pub struct AnthropicWire;

/// The request fields an Anthropic trace's steps carry besides `system`, `messages` and `max_tokens`.
const TRACE_FIELDS: [&str; 4] = ["tools", "tool_choice", "thinking", "temperature"];

impl Wire for AnthropicWire {
    fn name(&self) -> &'static str {
        "anthropic"
    }
    fn label(&self) -> DialectLabel {
        DialectLabel::Anthropic
    }
    fn describe(&self) -> &'static str {
        "an Anthropic Messages"
    }
    fn api(&self) -> Api {
        Api::Anthropic
    }
    /// Anthropic keeps its own layout (the note and a summary as user text blocks, which its API accepts).
    fn strict_roles(&self) -> bool {
        false
    }
    fn conversation_key(&self) -> &'static str {
        "messages"
    }
    fn system_key(&self) -> Option<&'static str> {
        Some("system")
    }
    fn client_path(&self) -> &'static str {
        "/v1/messages"
    }
    /// `/v1/messages`, and `/v1/messages/count_tokens`, planned like a turn.
    fn serves(&self, path: &str) -> bool {
        matches!(path, "/v1/messages" | "/v1/messages/count_tokens")
    }
    fn upstream_path(&self) -> &'static str {
        "messages"
    }

    fn parse(&self, raw: Bytes, _: &Call<'_>) -> Result<Request, GatewayError> {
        super::parse(raw)
    }
    fn convert(&self, system: Option<&Value>, native: &[Value]) -> Option<Arc<dyn Conversion>> {
        Some(Arc::new(Converted::new(system, native)))
    }
    fn neutral_of(&self, stored: &Value) -> Vec<Value> {
        super::neutral_of(stored)
    }

    fn tool_def(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"name": name, "description": description, "input_schema": parameters})
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
        request: &Request,
        body: &RewrittenBody<'_>,
    ) -> serde_json::Result<(Vec<u8>, usize)> {
        super::render(request, body)
    }

    fn assembler(&self) -> Box<dyn Assemble> {
        Box::<Assembler>::default()
    }
    fn reply_from_body(&self, body: &[u8]) -> AssembledReply {
        super::reply_from_body(body)
    }
    fn error_body(&self, e: &GatewayError) -> Value {
        super::error_body(e)
    }
    fn error_event_body(&self, e: &GatewayError, _: Option<u64>) -> Vec<u8> {
        let mut b = b"event: error\ndata: ".to_vec();
        b.extend(serde_json::to_vec(&super::error_body(e)).unwrap_or_default());
        b
    }

    fn splicer(&self, names: InjectedNames, _: &Map<String, Value>) -> Box<dyn Splice> {
        Box::new(Spliced(StreamSplicer::new(names)))
    }
    fn answer_message(&self, answer: &Value) -> Option<Value> {
        super::rounds::answer_message(answer)
    }
    fn injected_calls(&self, message: &Value, names: &InjectedNames) -> Vec<Value> {
        super::rounds::injected_calls(message, names)
    }
    fn round_messages(
        &self,
        assistant: &Value,
        names: &InjectedNames,
        calls: &[Value],
        results: &[String],
    ) -> Vec<Value> {
        super::rounds::round_messages(assistant, names, calls, results)
    }
    fn add_usage(&self, acc: &mut Option<Value>, usage: &Value) {
        super::rounds::add_usage(acc, usage)
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

    /// `x-claude-code-session-id`, then the `session_id` inside `metadata.user_id`.
    fn client_key(
        &self,
        header: &dyn Fn(&str) -> Option<String>,
        body: &Map<String, Value>,
    ) -> Option<(String, KeyKind)> {
        header(CLAUDE_CODE_SESSION_HEADER)
            .map(|v| (v, KeyKind::AgentHeader))
            .or_else(|| metadata_session(body).map(|v| (v, KeyKind::Metadata)))
    }
    fn fingerprint(&self, body: &Map<String, Value>) -> String {
        fingerprint(body)
    }

    /// `messages` with Anthropic marks (a top-level `system`, a tool with `input_schema`, a `tool_use` or
    /// `tool_result` block) and no chat ones.
    fn is_trace(&self, obj: &Map<String, Value>) -> bool {
        let Some(messages) = obj.get("messages").and_then(Value::as_array) else {
            return false;
        };
        let tools = obj.get("tools").and_then(Value::as_array);
        let block = |m: &Value| {
            m.get("content").and_then(Value::as_array).is_some_and(|b| {
                b.iter().any(|b| {
                    matches!(
                        b.get("type").and_then(Value::as_str),
                        Some("tool_use" | "tool_result")
                    )
                })
            })
        };
        let marks = obj.get("system").is_some_and(|s| !s.is_null())
            || tools.is_some_and(|ts| ts.iter().any(|t| t.get("input_schema").is_some()))
            || messages.iter().any(block);
        marks && !crate::dialect::chat::wire::has_chat_marks(obj)
    }
    fn chat_body_as(&self, chat: &Map<String, Value>) -> Map<String, Value> {
        chat_to_anthropic(chat)
    }
    fn trace_body(
        &self,
        trace: &Map<String, Value>,
        items: Value,
        mut body: Map<String, Value>,
    ) -> Map<String, Value> {
        let max = trace.get("max_tokens").filter(|v| v.is_u64());
        let max = max.cloned().unwrap_or(Value::from(DEFAULT_MAX_TOKENS));
        body.insert("max_tokens".into(), max);
        copy_fields(trace, &mut body, &["system"]);
        body.insert("messages".into(), items);
        copy_fields(trace, &mut body, &TRACE_FIELDS);
        body
    }
    fn check_sent(&self, client: &Value, sent: &Value) -> Result<(), String> {
        validate::check_sequence(items_of(sent, "messages"))
            .and_then(|()| validate::check_rewrite(client, sent))
    }
}
