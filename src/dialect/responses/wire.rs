//! OpenAI Responses as a [`Wire`]: input items converted to the neutral form and rendered back item by item,
//! requests that keep their history upstream left unmanaged, its answers (kept as their output items), recall
//! rounds with renumbered events, errors, session keys and traces.

use super::convert::{self, Kind};
use super::from_chat::{chat_to_responses, function_tool};
use super::splice::StreamSplicer;
use super::{assemble, errors, session_id, validate, Converted};
use crate::context::RewrittenBody;
use crate::dialect::naming::KeyKind;
use crate::dialect::request::Call;
use crate::dialect::rounds::Splice;
use crate::dialect::shared::fields::copy_fields;
use crate::dialect::shared::Spliced;
use crate::dialect::wire::{items_of, Conversion, Wire};
use crate::dialect::{Assemble, AssembledReply, InjectedNames, Request};
use crate::error::GatewayError;
use crate::message::role;
use crate::metrics::{DialectLabel, UnmanagedReason};
use crate::upstream::Api;
use bytes::Bytes;
use serde_json::{Map, Value};
use std::sync::Arc;

/// OpenAI Responses (`POST /v1/responses`).
pub struct ResponsesWire;

/// Top-level request fields of a Responses trace carried into every request (besides `model`, `instructions`,
/// `input`; `store` is always `false`: a replayed request carries its whole history).
const TRACE_FIELDS: [&str; 5] = [
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "include",
];

impl Wire for ResponsesWire {
    fn name(&self) -> &'static str {
        "responses"
    }
    fn label(&self) -> DialectLabel {
        DialectLabel::Responses
    }
    fn describe(&self) -> &'static str {
        "a Responses"
    }
    fn api(&self) -> Api {
        Api::OpenAi
    }
    /// Its OpenAI-compatible servers refuse what chat's do (see `context::roles`).
    fn strict_roles(&self) -> bool {
        true
    }
    fn conversation_key(&self) -> &'static str {
        "input"
    }
    fn system_key(&self) -> Option<&'static str> {
        Some("instructions")
    }
    fn client_path(&self) -> &'static str {
        "/v1/responses"
    }
    fn upstream_path(&self) -> &'static str {
        "responses"
    }

    fn parse(&self, raw: Bytes, _: &Call<'_>) -> Result<Request, GatewayError> {
        super::parse(raw)
    }
    fn convert(&self, system: Option<&Value>, native: &[Value]) -> Option<Arc<dyn Conversion>> {
        Some(Arc::new(Converted::new(system, native)))
    }
    fn unmanaged_reason(&self, body: &Map<String, Value>) -> Option<UnmanagedReason> {
        super::unmanaged::unmanaged_reason(body)
    }
    /// Also not a string `input`: a single fresh question, nothing to manage.
    fn managed(&self, body: &Map<String, Value>) -> bool {
        self.unmanaged_reason(body).is_none() && body.get("input").is_some_and(Value::is_array)
    }
    fn neutral_of(&self, stored: &Value) -> Vec<Value> {
        super::neutral_of(stored)
    }
    /// Each of its output items.
    fn reply_messages(&self, message: Value) -> Vec<Value> {
        assemble::output_items(&message).to_vec()
    }

    fn tool_def(&self, name: &str, description: &str, parameters: Value) -> Value {
        function_tool(name, description, parameters)
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
        Box::<assemble::Assembler>::default()
    }
    fn reply_from_body(&self, body: &[u8]) -> AssembledReply {
        assemble::from_body(body)
    }
    /// OpenAI's shape, with `input` as the parameter of an unfittable request.
    fn error_body(&self, e: &GatewayError) -> Value {
        errors::error_body(e)
    }
    fn error_event_body(&self, e: &GatewayError, sequence: Option<u64>) -> Vec<u8> {
        let mut v = errors::error_value(e);
        if let (Some(n), Some(o)) = (sequence, v.as_object_mut()) {
            o.insert("sequence_number".into(), Value::from(n));
        }
        let mut b = b"event: error\ndata: ".to_vec();
        b.extend(serde_json::to_vec(&v).unwrap_or_default());
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

    /// Codex's `session-id`/`thread-id` headers, then `prompt_cache_key`.
    fn client_key(
        &self,
        header: &dyn Fn(&str) -> Option<String>,
        body: &Map<String, Value>,
    ) -> Option<(String, KeyKind)> {
        session_id::client_key(header, body)
    }
    fn fingerprint(&self, body: &Map<String, Value>) -> String {
        session_id::fingerprint(body)
    }

    /// An `input` array and no `messages`.
    fn is_trace(&self, obj: &Map<String, Value>) -> bool {
        obj.get("messages").is_none() && obj.get("input").is_some_and(Value::is_array)
    }
    fn chat_body_as(&self, chat: &Map<String, Value>) -> Map<String, Value> {
        chat_to_responses(chat)
    }
    fn trace_body(
        &self,
        trace: &Map<String, Value>,
        items: Value,
        mut body: Map<String, Value>,
    ) -> Map<String, Value> {
        copy_fields(trace, &mut body, &["instructions"]);
        body.insert("input".into(), items);
        copy_fields(trace, &mut body, &TRACE_FIELDS);
        body.insert("store".into(), Value::Bool(false));
        body
    }
    /// Each assistant group starting at an item, with each of its call items on its own (an unanswered one has no
    /// neutral tool call).
    fn trace_answers(&self, trace: &Map<String, Value>, items: &[Value]) -> Vec<(usize, Value)> {
        let n = convert::to_neutral(trace.get("instructions"), items);
        let mut out = Vec::new();
        for (m, o) in n.messages.into_iter().zip(n.origins) {
            let Some(range) = o.items().filter(|_| role(&m) == "assistant") else {
                continue;
            };
            let start = range.start;
            out.push((start, m));
            let calls = items.get(range).unwrap_or_default().iter();
            let calls = calls.filter(|it| convert::kind(it) == Kind::Call);
            out.extend(calls.flat_map(convert::neutral_of).map(|c| (start, c)));
        }
        out
    }
    fn check_sent(&self, client: &Value, sent: &Value) -> Result<(), String> {
        let items = items_of(sent, "input");
        validate::check_sequence(items)
            .and_then(|()| validate::check_rewrite(client, sent))
            .and_then(|()| validate::check_roles(items_of(client, "input"), items))
    }
}
