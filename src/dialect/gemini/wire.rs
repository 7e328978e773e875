//! The Gemini API as a [`Wire`]: the model and method from the path, contents converted to the neutral form and
//! rendered back part by part, its answers (a JSON body, an SSE stream, or one streamed JSON array), recall rounds,
//! errors in Google's shape, and the caller's key from `x-goog-api-key` or the `key` query parameter.

use super::endpoint::{Endpoint, Method};
use super::{assemble, errors, from_chat, rounds, session_id, validate, Converted};
use crate::context::RewrittenBody;
use crate::dialect::naming::KeyKind;
use crate::dialect::request::{json_object, Call};
use crate::dialect::rounds::Splice;
use crate::dialect::shared::fields::copy_fields;
use crate::dialect::shared::Spliced;
use crate::dialect::wire::{items_of, Conversion, Wire};
use crate::dialect::{Assemble, AssembledReply, InjectedNames, Request};
use crate::error::GatewayError;
use crate::metrics::DialectLabel;
use crate::upstream::{is_key_param, Api, GOOG_API_KEY};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value};
use std::sync::Arc;

/// The Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`).
pub struct GeminiWire;

/// The request fields a Gemini trace's steps carry besides `systemInstruction` and `contents`.
const TRACE_FIELDS: [&str; 3] = ["tools", "toolConfig", "generationConfig"];

impl Wire for GeminiWire {
    fn name(&self) -> &'static str {
        "gemini"
    }
    fn label(&self) -> DialectLabel {
        DialectLabel::Gemini
    }
    fn describe(&self) -> &'static str {
        "a Gemini API"
    }
    fn api(&self) -> Api {
        Api::Gemini
    }
    /// The note and a summary go in as `user` contents, which the API accepts anywhere a user turn may be;
    /// `convert::from_neutral` keeps its other rules (a user content first, no two `model` contents in a row).
    fn strict_roles(&self) -> bool {
        false
    }
    fn conversation_key(&self) -> &'static str {
        "contents"
    }
    fn system_key(&self) -> Option<&'static str> {
        Some("systemInstruction")
    }
    fn client_path(&self) -> &'static str {
        "/v1beta/models/{model}:generateContent"
    }
    /// `/{version}/models/{model}:generateContent`, `:streamGenerateContent`, `:countTokens`.
    fn serves(&self, path: &str) -> bool {
        Endpoint::of(path).is_some()
    }
    /// A model name Gemini's paths cannot carry (a `provider/model` of a recorded trace) with `-` for each
    /// character they cannot.
    fn call_path(&self, model: &str) -> String {
        let model: String = model
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        format!("/v1beta/models/{model}:generateContent")
    }
    /// Only the stem: every Gemini request names its own path, `{version}/models/{model}:{method}`
    /// (`Request::with_path` in `parse`), and so does a count (`count_path`).
    fn upstream_path(&self) -> &'static str {
        "v1beta/models"
    }

    /// The model and method from the path; `stream` for `:streamGenerateContent` (SSE with `alt=sse`, else one
    /// streamed JSON array).
    fn parse(&self, raw: Bytes, call: &Call<'_>) -> Result<Request, GatewayError> {
        let endpoint =
            Endpoint::of(call.path).ok_or_else(|| GatewayError::NotFound(call.path.into()))?;
        let body = json_object(&raw)?;
        super::request::check(&body)?;
        let stream = endpoint.method == Method::Stream;
        let model = endpoint.model.to_string();
        let path = endpoint.upstream_path();
        Ok(Request::new(crate::dialect::Dialect::Gemini, raw, body, stream, model).with_path(path))
    }
    /// `{contents}` (what `@google/genai` sends) counts as a request of those contents; `{generateContentRequest:
    /// {…}}` as that request.
    fn parse_count(&self, raw: Bytes, call: &Call<'_>) -> Result<Request, GatewayError> {
        let body = json_object(&raw)?;
        match body.get("generateContentRequest") {
            Some(Value::Object(inner)) => {
                let mut inner = inner.clone();
                inner.remove("model");
                let raw = Bytes::from(
                    serde_json::to_vec(&inner)
                        .map_err(|e| GatewayError::Internal(e.to_string()))?,
                );
                self.parse(raw, call)
            }
            Some(_) => Err(crate::dialect::request::bad(
                "`generateContentRequest` must be an object".into(),
                "generateContentRequest",
            )),
            None => self.parse(raw, call),
        }
    }
    fn count_path(&self, request: &Request) -> String {
        request.path.to_string()
    }
    /// The client's body when the turn would go as sent; else the planned request as `generateContentRequest`
    /// (which, unlike a bare `contents`, may carry the system instruction and the tools ctxgate adds).
    fn count_body(&self, client: Bytes, planned: Bytes, rewritten: bool) -> Bytes {
        if !rewritten {
            return client;
        }
        let Ok(Value::Object(mut inner)) = serde_json::from_slice::<Value>(&planned) else {
            return client;
        };
        inner.remove("model");
        let mut out = Map::new();
        out.insert("generateContentRequest".into(), Value::Object(inner));
        serde_json::to_vec(&Value::Object(out))
            .map(Bytes::from)
            .unwrap_or(client)
    }
    fn convert(&self, system: Option<&Value>, native: &[Value]) -> Option<Arc<dyn Conversion>> {
        Some(Arc::new(Converted::new(system, native)))
    }
    fn neutral_of(&self, stored: &Value) -> Vec<Value> {
        super::neutral_of(stored)
    }

    /// A tool of its own holding one declaration (the client's tools stay an identical prefix), its schema as
    /// `parametersJsonSchema` (the OpenAPI subset of `parameters` has no `additionalProperties`).
    fn tool_def(&self, name: &str, description: &str, parameters: Value) -> Value {
        serde_json::json!({"functionDeclarations": [{"name": name, "description": description,
            "parametersJsonSchema": parameters}]})
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
    fn error_body(&self, e: &GatewayError) -> Value {
        errors::error_body(e)
    }
    fn error_event_body(&self, e: &GatewayError, _: Option<u64>) -> Vec<u8> {
        let mut b = b"data: ".to_vec();
        b.extend(serde_json::to_vec(&errors::error_body(e)).unwrap_or_default());
        b
    }

    fn splicer(&self, names: InjectedNames, _: &Map<String, Value>) -> Box<dyn Splice> {
        Box::new(Spliced(super::splice::StreamSplicer::new(names)))
    }
    fn answer_message(&self, answer: &Value) -> Option<Value> {
        rounds::answer_message(answer)
    }
    /// `usageMetadata` (of the last chunk, for a streamed JSON array).
    fn answer_usage(&self, answer: &Value) -> Option<Value> {
        let last = match answer {
            Value::Array(chunks) => chunks
                .iter()
                .rev()
                .find(|c| c.get("usageMetadata").is_some())?,
            one => one,
        };
        last.get("usageMetadata").filter(|u| u.is_object()).cloned()
    }
    /// `responseId` (the first chunk's, for a streamed JSON array).
    fn answer_id(&self, answer: &Value) -> Value {
        let first = match answer {
            Value::Array(chunks) => chunks.first().unwrap_or(&Value::Null),
            one => one,
        };
        first.get("responseId").cloned().unwrap_or(Value::Null)
    }
    fn injected_calls(&self, message: &Value, names: &InjectedNames) -> Vec<Value> {
        rounds::injected_calls(message, names)
    }
    fn round_messages(
        &self,
        assistant: &Value,
        names: &InjectedNames,
        calls: &[Value],
        results: &[String],
    ) -> Vec<Value> {
        rounds::round_messages(assistant, names, calls, results)
    }
    fn add_usage(&self, acc: &mut Option<Value>, usage: &Value) {
        rounds::add_usage(acc, usage)
    }
    fn finalize_answer(
        &self,
        answer: Value,
        names: &InjectedNames,
        usage: Option<Value>,
        first_id: Option<Value>,
    ) -> Value {
        rounds::finalize(answer, names, usage, first_id)
    }

    /// None: Gemini CLI sends no session identifier (`[session] header` still names one).
    fn client_key(
        &self,
        _: &dyn Fn(&str) -> Option<String>,
        _: &Map<String, Value>,
    ) -> Option<(String, KeyKind)> {
        None
    }
    /// A key sent as the `key` query parameter stands for `x-goog-api-key` (the first one, when the request has
    /// no such header).
    fn credential_headers(&self, headers: &HeaderMap, query: Option<&str>) -> Option<HeaderMap> {
        if headers.contains_key(GOOG_API_KEY) {
            return None;
        }
        let key = query?
            .split('&')
            .find(|p| is_key_param(p))
            .map(|p| p.strip_prefix("key=").unwrap_or_default())?;
        let value = HeaderValue::from_str(key).ok()?;
        let mut out = headers.clone();
        out.insert(GOOG_API_KEY, value);
        Some(out)
    }
    fn fingerprint(&self, body: &Map<String, Value>) -> String {
        session_id::fingerprint(body)
    }

    /// `contents` and no `messages`.
    fn is_trace(&self, obj: &Map<String, Value>) -> bool {
        obj.get("messages").is_none() && obj.get("contents").is_some_and(Value::is_array)
    }
    fn chat_body_as(&self, chat: &Map<String, Value>) -> Map<String, Value> {
        from_chat::chat_to_gemini(chat)
    }
    /// The model is in the path, not the body.
    fn trace_body(
        &self,
        trace: &Map<String, Value>,
        items: Value,
        mut body: Map<String, Value>,
    ) -> Map<String, Value> {
        body.remove("model");
        copy_fields(trace, &mut body, &["systemInstruction"]);
        body.insert("contents".into(), items);
        copy_fields(trace, &mut body, &TRACE_FIELDS);
        body
    }
    fn check_sent(&self, client: &Value, sent: &Value) -> Result<(), String> {
        validate::check_sequence(items_of(sent, "contents"))
            .and_then(|()| validate::check_rewrite(client, sent))
    }
}
