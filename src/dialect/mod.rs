//! Dialects: the wire formats ctxgate speaks (OpenAI chat completions, Anthropic Messages, OpenAI Responses:
//! `chat/`, `anthropic/`, `responses/`; what the last two share in `shared/`). A dialect parses a
//! request body into the neutral conversation (`crate::message`), renders a rewritten conversation back into its
//! own bytes, and knows its answers: reply assembly, SSE events, recall rounds, errors and usage. Nothing outside
//! `dialect/` knows a wire format.

pub mod anthropic;
pub mod census;
pub mod chat;
mod names;
pub mod naming;
mod opening_memo;
pub(crate) mod parse_memo;
pub mod raw_scan;
pub mod reply;
pub mod request;
pub mod responses;
pub mod rounds;
pub mod shared;

pub use names::InjectedNames;
pub use reply::{AssembledReply, MAX_ASSEMBLED_BYTES};
pub use request::Request;

use crate::context::RewrittenBody;
use crate::error::GatewayError;
use crate::sse::SseEvent;
use crate::upstream::Api;
use bytes::Bytes;
use serde_json::{Map, Value};
use std::sync::Arc;

/// A wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI chat completions (`POST /v1/chat/completions`).
    Chat,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
    /// OpenAI Responses (`POST /v1/responses`).
    Responses,
}

/// Assembles the reply of one upstream answer from its SSE events.
pub trait Assemble: Send {
    /// The sequence number the stream's next event would carry, for a dialect that numbers its events.
    fn next_sequence_number(&self) -> Option<u64> {
        None
    }
    /// Feeds one event; true when it is the one after which the reply is whole for the client: its last event
    /// that carries content or usage (chat: `[DONE]`, as the usage chunk follows `finish_reason`; Anthropic: the
    /// closing `message_delta`, else `message_stop`; Responses: `response.completed`, its other terminal events
    /// and `error`). Whatever follows it carries nothing the reply is made of.
    fn on_event(&mut self, ev: &SseEvent) -> bool;
    /// The reply assembled so far.
    fn finish(&mut self) -> AssembledReply;
}

impl Dialect {
    /// Its name in metrics labels, the admin API and logs: `chat`, `anthropic`, `responses`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Anthropic => "anthropic",
            Dialect::Responses => "responses",
        }
    }

    /// Whether a rewrite keeps strict role order (see `context::roles`): chat completions and Responses, whose
    /// OpenAI-compatible servers (vLLM, llama.cpp, Ollama with Mistral, Qwen or Gemma templates) refuse a `system`
    /// message after the conversation began or two user or assistant messages in a row. Anthropic keeps its own
    /// layout (the note and a summary as user text blocks, which its API accepts).
    pub fn strict_roles(self) -> bool {
        !matches!(self, Dialect::Anthropic)
    }

    /// The dialect named `name` (as [`Dialect::as_str`] writes it); `chat` for anything else.
    pub fn named(name: &str) -> Dialect {
        match name {
            "anthropic" => Dialect::Anthropic,
            "responses" => Dialect::Responses,
            _ => Dialect::Chat,
        }
    }

    /// The messages a reply is kept as in the session: the assembled message itself, or (Responses) each of its
    /// output items, as the client will send them back.
    pub fn reply_messages(self, message: Value) -> Vec<Value> {
        match self {
            Dialect::Chat | Dialect::Anthropic => vec![message],
            Dialect::Responses => responses::assemble::output_items(&message).to_vec(),
        }
    }

    /// The neutral form of a stored history (the client's own messages, no top-level system or instructions);
    /// `None` when it is neutral already (chat).
    pub fn convert_history(self, messages: &[Value]) -> Option<request::Conversion> {
        match self {
            Dialect::Chat => None,
            Dialect::Anthropic => Some(request::Conversion::Anthropic(anthropic::Converted::new(
                None, messages,
            ))),
            Dialect::Responses => Some(request::Conversion::Responses(responses::Converted::new(
                None, messages,
            ))),
        }
    }

    /// A stored history of dialect `name` as neutral messages, each with its position in the history; `None` for
    /// chat, whose messages are neutral (what `session::Sessions` finds a view's run loops on).
    pub fn history_as_neutral(name: &str, messages: &[Value]) -> Option<(Vec<Value>, Vec<usize>)> {
        let c = Dialect::named(name).convert_history(messages)?;
        let native = (0..c.messages().len())
            .map(|i| c.native_index(i).unwrap_or(0))
            .collect();
        Some((c.messages().to_vec(), native))
    }

    /// The body field holding the conversation: `messages` (`input` for the Responses API).
    pub fn conversation_key(self) -> &'static str {
        match self {
            Dialect::Chat | Dialect::Anthropic => "messages",
            Dialect::Responses => "input",
        }
    }

    /// The top-level body field holding the system prompt outside the conversation, if the dialect has one:
    /// `system` (Anthropic), `instructions` (Responses); chat's system messages are in `messages`.
    pub fn system_key(self) -> Option<&'static str> {
        match self {
            Dialect::Chat => None,
            Dialect::Anthropic => Some("system"),
            Dialect::Responses => Some("instructions"),
        }
    }

    /// `gen_ai.provider.name` of the dialect's API: `openai` or `anthropic`.
    pub fn provider(self) -> &'static str {
        match self.api() {
            Api::OpenAi => "openai",
            Api::Anthropic => "anthropic",
        }
    }

    /// The API its requests go to.
    pub fn api(self) -> Api {
        match self {
            Dialect::Chat | Dialect::Responses => Api::OpenAi,
            Dialect::Anthropic => Api::Anthropic,
        }
    }

    /// Stored client messages `(position, message)` in the neutral shape (a message may become several, which
    /// keep its position), for recall and search.
    pub fn neutral_history(self, stored: Vec<(u32, Arc<Value>)>) -> Vec<(u32, Arc<Value>)> {
        match self {
            Dialect::Chat => stored,
            Dialect::Anthropic => stored
                .into_iter()
                .flat_map(|(p, m)| {
                    anthropic::neutral_of(&m)
                        .into_iter()
                        .map(move |n| (p, Arc::new(n)))
                })
                .collect(),
            // rconv: one stored input item → its neutral messages
            Dialect::Responses => stored
                .into_iter()
                .flat_map(|(p, m)| {
                    responses::neutral_of(&m)
                        .into_iter()
                        .map(move |n| (p, Arc::new(n)))
                })
                .collect(),
        }
    }

    /// Parses and checks a request body (every field kept in its order).
    pub fn parse(self, raw: Bytes) -> Result<Request, GatewayError> {
        match self {
            Dialect::Chat => chat::parse(raw),
            Dialect::Anthropic => anthropic::parse(raw),
            // rconv
            Dialect::Responses => responses::parse(raw),
        }
    }

    /// The upstream path of a conversation request, below the dialect's base URL.
    pub fn upstream_path(self) -> &'static str {
        match self {
            Dialect::Chat => "chat/completions",
            Dialect::Anthropic => "messages",
            Dialect::Responses => "responses",
        }
    }

    /// The path clients call, for logs.
    pub fn client_path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Anthropic => "/v1/messages",
            Dialect::Responses => "/v1/responses",
        }
    }

    /// A tool definition in this dialect's shape.
    pub fn tool_def(self, name: &str, description: &str, parameters: Value) -> Value {
        match self {
            Dialect::Chat => serde_json::json!({"type": "function", "function": {
                "name": name, "description": description, "parameters": parameters}}),
            Dialect::Anthropic => serde_json::json!({
                "name": name, "description": description, "input_schema": parameters}),
            Dialect::Responses => {
                responses::from_chat::function_tool(name, description, parameters)
            }
        }
    }

    /// Whether ctxgate may add its own tools to a request whose client body is `body`: not when the client forbids
    /// tools or forces one, when a client tool already has one of their names, or when the client asks for several
    /// choices (only one choice's calls could be answered within the response).
    pub fn may_add_tools(
        self,
        body: &Map<String, Value>,
        names: &InjectedNames,
    ) -> Result<(), &'static str> {
        match self {
            Dialect::Chat => chat::may_add_tools(body, names),
            Dialect::Anthropic => anthropic::may_add_tools(body, names),
            // rconv (or the lead): tool_choice none / a forced tool, name clash (tools' `name` at top level)
            Dialect::Responses => responses::may_add_tools(body, names),
        }
    }

    /// Serialises a rewritten request (`request` is the client's): its bytes and the offset of the `]` closing
    /// its messages (recall rounds append there).
    pub fn render(
        self,
        request: &Request,
        body: &RewrittenBody<'_>,
    ) -> serde_json::Result<(Vec<u8>, usize)> {
        match self {
            Dialect::Chat => body.to_vec(),
            Dialect::Anthropic => anthropic::render(request, body),
            // rconv
            Dialect::Responses => responses::render(request, body),
        }
    }

    /// A fresh assembler of a streamed reply.
    pub fn assembler(self) -> Box<dyn Assemble> {
        match self {
            Dialect::Chat => Box::<chat::MessageAssembler>::default(),
            Dialect::Anthropic => Box::<anthropic::Assembler>::default(),
            // rstream: responses/assemble.rs
            Dialect::Responses => Box::<responses::assemble::Assembler>::default(),
        }
    }

    /// The reply of a whole (non-streaming) answer body.
    pub fn reply_from_body(self, body: &[u8]) -> AssembledReply {
        match self {
            Dialect::Chat => chat::MessageAssembler::from_completion_body(body),
            Dialect::Anthropic => anthropic::reply_from_body(body),
            // rstream: responses/assemble.rs
            Dialect::Responses => responses::assemble::from_body(body),
        }
    }

    /// Our own error as this dialect's error body.
    pub fn error_body(self, e: &GatewayError) -> Value {
        match self {
            Dialect::Chat => e.body(),
            Dialect::Anthropic => anthropic::error_body(e),
            // rstream: OpenAI's shape, with `input` as the parameter of an unfittable request
            Dialect::Responses => responses::errors::error_body(e),
        }
    }

    /// The SSE event that ends a stream the upstream broke, after a blank line closing the event the upstream
    /// left unfinished (when `mid_event`).
    pub fn error_event(self, e: &GatewayError, mid_event: bool) -> Bytes {
        self.error_event_at(e, mid_event, None)
    }

    /// [`Dialect::error_event`] numbered `sequence` (Responses events carry the stream's next sequence number).
    pub fn error_event_at(self, e: &GatewayError, mid_event: bool, sequence: Option<u64>) -> Bytes {
        let mut b = Vec::new();
        if mid_event {
            b.extend_from_slice(b"\n\n");
        }
        match self {
            Dialect::Chat => {
                b.extend_from_slice(b"data: ");
                b.extend(serde_json::to_vec(&e.body()).unwrap_or_default());
            }
            Dialect::Anthropic => {
                b.extend_from_slice(b"event: error\ndata: ");
                b.extend(serde_json::to_vec(&anthropic::error_body(e)).unwrap_or_default());
            }
            Dialect::Responses => {
                let mut v = responses::errors::error_value(e);
                if let (Some(n), Some(o)) = (sequence, v.as_object_mut()) {
                    o.insert("sequence_number".into(), Value::from(n));
                }
                b.extend_from_slice(b"event: error\ndata: ");
                b.extend(serde_json::to_vec(&v).unwrap_or_default());
            }
        }
        b.extend_from_slice(b"\n\n");
        Bytes::from(b)
    }
}

impl Assemble for chat::MessageAssembler {
    fn on_event(&mut self, ev: &SseEvent) -> bool {
        self.on_event_data(&ev.data);
        ev.data.trim() == "[DONE]"
    }

    fn finish(&mut self) -> AssembledReply {
        chat::MessageAssembler::finish(self)
    }
}

/// A dialect's `dialect` metric label: its own name (the metrics module knows nothing of dialects).
impl From<Dialect> for crate::metrics::DialectLabel {
    fn from(d: Dialect) -> Self {
        match d {
            Dialect::Chat => crate::metrics::DialectLabel::Chat,
            Dialect::Anthropic => crate::metrics::DialectLabel::Anthropic,
            Dialect::Responses => crate::metrics::DialectLabel::Responses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DialectLabel;

    #[test]
    fn every_dialect_is_labelled_by_its_name() {
        let all = [Dialect::Chat, Dialect::Anthropic, Dialect::Responses];
        for d in all {
            assert_eq!(DialectLabel::from(d).as_str(), d.as_str());
            assert_eq!(Dialect::named(d.as_str()), d);
        }
        // `none` is no dialect's name
        assert!(DialectLabel::ALL
            .iter()
            .filter(|l| all.iter().all(|d| DialectLabel::from(*d) != **l))
            .all(|l| *l == DialectLabel::NoDialect));
    }
}
