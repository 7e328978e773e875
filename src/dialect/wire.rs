//! What a dialect is: one implementation of [`Wire`] — everything the pipeline, the sessions, recall and replay
//! ask of a wire format — and the neutral form of its messages ([`Conversion`]). `Dialect` names an implementation;
//! adding a dialect is a folder implementing these two traits and its line in `Dialect::wire`.

use super::naming::KeyKind;
use super::request::Call;
use super::rounds::Splice;
use super::{Assemble, AssembledReply, InjectedNames, Request};
use crate::context::RewrittenBody;
use crate::error::GatewayError;
use crate::metrics::{DialectLabel, UnmanagedReason};
use crate::upstream::Api;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};
use std::any::Any;
use std::sync::Arc;

/// The neutral form of a dialect's messages, with where each neutral message comes from.
pub trait Conversion: std::fmt::Debug + Send + Sync + Any {
    /// The neutral messages.
    fn messages(&self) -> &[Value];
    /// The client message (its first item) the neutral message `i` comes from; `None` for one that comes from
    /// elsewhere in the body (a top-level system prompt).
    fn native_index(&self, i: usize) -> Option<usize>;
    /// The index of the first neutral message of client message `native` (the neutral length past the end).
    fn neutral_start(&self, native: usize) -> usize;
    /// Itself, for the dialect that made it to read its own fields back (`render`).
    fn as_any(&self) -> &dyn Any;
}

/// A wire format: one implementation per dialect, behind `Dialect`.
pub trait Wire: Sync {
    /// Its name in metrics labels, the admin API, the store and logs (`chat`, `anthropic`, …).
    fn name(&self) -> &'static str;
    /// Its `dialect` metric label.
    fn label(&self) -> DialectLabel;
    /// The format in words, for messages (`a chat-completions`).
    fn describe(&self) -> &'static str;
    /// The API its requests go to.
    fn api(&self) -> Api;
    /// `gen_ai.provider.name` of its API (the OpenTelemetry GenAI conventions' names).
    fn provider(&self) -> &'static str {
        match self.api() {
            Api::OpenAi => "openai",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gcp.gemini",
        }
    }
    /// Whether a rewrite keeps strict role order (see `context::roles`): no `system` message after the
    /// conversation began, no two user or assistant messages in a row.
    fn strict_roles(&self) -> bool;
    /// The body field holding the conversation (`messages`, `input`).
    fn conversation_key(&self) -> &'static str;
    /// The top-level body field holding the system prompt outside the conversation, if the dialect has one.
    fn system_key(&self) -> Option<&'static str>;
    /// The path clients call, for logs.
    fn client_path(&self) -> &'static str;
    /// Whether a POST to `path` (below the root, with `/v1`) is one of its conversation requests.
    fn serves(&self, path: &str) -> bool {
        path == self.client_path()
    }
    /// The path a client of `model` calls (`replay` parses its steps as sent there): [`Wire::client_path`] for
    /// a dialect whose model is in the body.
    fn call_path(&self, model: &str) -> String {
        let _ = model;
        self.client_path().to_string()
    }
    /// The upstream path of a conversation request, below its upstream's base URL (a request may name its own:
    /// `Request::path`).
    fn upstream_path(&self) -> &'static str;

    /// Parses and checks a request body (every field kept in its order) sent to `call`.
    fn parse(&self, raw: Bytes, call: &Call<'_>) -> Result<Request, GatewayError>;
    /// Parses a count request (`count_tokens`, `countTokens`) as the turn it counts, to be planned like one.
    fn parse_count(&self, raw: Bytes, call: &Call<'_>) -> Result<Request, GatewayError> {
        self.parse(raw, call)
    }
    /// The upstream path of a count request for `request` (below the base URL).
    fn count_path(&self, request: &Request) -> String {
        let _ = request;
        format!("{}/count_tokens", self.upstream_path())
    }
    /// The body of the count request sent upstream for the client's `client` body, whose turn would send
    /// `planned` (`rewritten`: the turn would be rewritten).
    fn count_body(&self, client: Bytes, planned: Bytes, rewritten: bool) -> Bytes {
        let _ = client;
        let _ = rewritten;
        planned
    }
    /// The neutral form of a conversation (`system`: the body's top-level system field; `native`: its
    /// conversation); `None` when its messages are neutral already (chat).
    fn convert(&self, system: Option<&Value>, native: &[Value]) -> Option<Arc<dyn Conversion>>;
    /// Why ctxgate does not manage a request with this body, when it does not: it leaves history upstream or
    /// asks for something other than an answer. Such a request is forwarded as sent.
    fn unmanaged_reason(&self, body: &Map<String, Value>) -> Option<UnmanagedReason> {
        let _ = body;
        None
    }
    /// Whether ctxgate manages a request with this body (see [`Wire::unmanaged_reason`]).
    fn managed(&self, body: &Map<String, Value>) -> bool {
        self.unmanaged_reason(body).is_none()
    }
    /// The neutral messages of one stored client message (a message may become several).
    fn neutral_of(&self, stored: &Value) -> Vec<Value>;
    /// Stored client messages `(position, message)` in the neutral shape (a message may become several, which
    /// keep its position), for recall and search.
    fn neutral_history(&self, stored: Vec<(u32, Arc<Value>)>) -> Vec<(u32, Arc<Value>)> {
        stored
            .into_iter()
            .flat_map(|(p, m)| {
                self.neutral_of(&m)
                    .into_iter()
                    .map(move |n| (p, Arc::new(n)))
            })
            .collect()
    }
    /// The messages a reply is kept as in the session, as the client will send them back.
    fn reply_messages(&self, message: Value) -> Vec<Value> {
        vec![message]
    }

    /// A tool definition in its shape.
    fn tool_def(&self, name: &str, description: &str, parameters: Value) -> Value;
    /// Whether ctxgate may add its own tools to a request whose client body is `body`: not when the client forbids
    /// tools or forces one, when a client tool already has one of their names, or when the client asks for several
    /// choices (only one choice's calls could be answered within the response).
    fn may_add_tools(
        &self,
        body: &Map<String, Value>,
        names: &InjectedNames,
    ) -> Result<(), &'static str>;
    /// Serialises a rewritten request (`request` is the client's): its bytes and the offset of the `]` closing
    /// its conversation (recall rounds append there).
    fn render(
        &self,
        request: &Request,
        body: &RewrittenBody<'_>,
    ) -> serde_json::Result<(Vec<u8>, usize)>;

    /// A fresh assembler of a streamed reply.
    fn assembler(&self) -> Box<dyn Assemble>;
    /// The reply of a whole (non-streaming) answer body.
    fn reply_from_body(&self, body: &[u8]) -> AssembledReply;
    /// Our own error as its error body.
    fn error_body(&self, e: &GatewayError) -> Value;
    /// Our own error as the stream event that ends a stream (without the blank lines around it), numbered
    /// `sequence` for a dialect that numbers its events.
    fn error_event_body(&self, e: &GatewayError, sequence: Option<u64>) -> Vec<u8>;

    /// The splicer for a streamed request whose client body is `body`.
    fn splicer(&self, names: InjectedNames, body: &Map<String, Value>) -> Box<dyn Splice>;
    /// The assistant message of a whole JSON answer, when it is one.
    fn answer_message(&self, answer: &Value) -> Option<Value>;
    /// The usage a whole JSON answer reports (`usage`), when it reports one.
    fn answer_usage(&self, answer: &Value) -> Option<Value> {
        answer.get("usage").filter(|u| u.is_object()).cloned()
    }
    /// The id of a whole JSON answer (`id`; `null` when it has none).
    fn answer_id(&self, answer: &Value) -> Value {
        answer.get("id").cloned().unwrap_or(Value::Null)
    }
    /// The injected calls of an assistant message (its shape), as neutral tool calls.
    fn injected_calls(&self, message: &Value, names: &InjectedNames) -> Vec<Value>;
    /// The messages that carry one round into the next request: the assistant's turn (only what led to ctxgate's
    /// calls) and ctxgate's answers (`results`, aligned with `calls`).
    fn round_messages(
        &self,
        assistant: &Value,
        names: &InjectedNames,
        calls: &[Value],
        results: &[String],
    ) -> Vec<Value>;
    /// Adds a round's usage into `acc`.
    fn add_usage(&self, acc: &mut Option<Value>, usage: &Value);
    /// The client's final JSON answer: ctxgate's calls removed, usage summed over the rounds, the first round's id.
    fn finalize_answer(
        &self,
        answer: Value,
        names: &InjectedNames,
        usage: Option<Value>,
        first_id: Option<Value>,
    ) -> Value;

    /// The id the request gives its conversation in the dialect's own keys, and where (`header` reads a header's
    /// value, trimmed, `None` when absent or blank).
    fn client_key(
        &self,
        header: &dyn Fn(&str) -> Option<String>,
        body: &Map<String, Value>,
    ) -> Option<(String, KeyKind)>;
    /// The request's headers with the credentials it sent elsewhere added as the header each stands for (the
    /// tenant is named by its credential headers): `None` when it sent them all as headers (every dialect but
    /// Gemini, whose key may come as the `key` query parameter).
    fn credential_headers(&self, headers: &HeaderMap, query: Option<&str>) -> Option<HeaderMap> {
        let _ = (headers, query);
        None
    }
    /// Hex SHA-256 of the conversation's opening; the same opening in two dialects is two fingerprints.
    fn fingerprint(&self, body: &Map<String, Value>) -> String;

    /// Whether a recorded trace object is in this format (`replay`; chat, asked last, takes the rest).
    fn is_trace(&self, obj: &Map<String, Value>) -> bool;
    /// A chat-completions body (a chat trace's step) as the request of this dialect it stands for.
    fn chat_body_as(&self, chat: &Map<String, Value>) -> Map<String, Value>;
    /// The body a client of this dialect sends at a step of a trace recorded in it: `body` holds the model,
    /// `items` the conversation so far, `trace` the trace object (its other request fields).
    fn trace_body(
        &self,
        trace: &Map<String, Value>,
        items: Value,
        body: Map<String, Value>,
    ) -> Map<String, Value>;
    /// The neutral assistant messages a trace recorded in this format holds, each with the index of the first
    /// client item it comes from (in order).
    fn trace_answers(&self, trace: &Map<String, Value>, items: &[Value]) -> Vec<(usize, Value)> {
        let Some(c) = self.convert(self.system_key().and_then(|k| trace.get(k)), items) else {
            return Vec::new();
        };
        c.messages()
            .iter()
            .enumerate()
            .filter(|(_, m)| crate::message::role(m) == "assistant")
            .filter_map(|(i, m)| Some((c.native_index(i)?, m.clone())))
            .collect()
    }
    /// Why the body `sent` upstream for the client's body `client` is not valid for the API or does not keep
    /// what a rewrite must keep (`replay`'s validity check); `Ok` when it is.
    fn check_sent(&self, client: &Value, sent: &Value) -> Result<(), String>;
}

/// The conversation of a body (`Value`) under `key` (none when it has none).
pub fn items_of<'a>(body: &'a Value, key: &str) -> &'a [Value] {
    body.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}
