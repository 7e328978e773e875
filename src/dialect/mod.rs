//! Dialects: the wire formats ctxgate speaks (OpenAI chat completions, Anthropic Messages). A dialect parses a
//! request body into the neutral conversation (`crate::message`), renders a rewritten conversation back into its
//! own bytes, and knows its answers: reply assembly, SSE events, recall rounds, errors and usage. Nothing outside
//! `dialect/` knows a wire format.

pub mod anthropic;
pub mod chat;
mod names;
pub mod reply;
pub mod request;
pub mod responses;
pub mod rounds;

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
}

/// Assembles the reply of one upstream answer from its SSE events.
pub trait Assemble: Send {
    /// Feeds one event; true when it ended the reply (`[DONE]`, `message_stop`).
    fn on_event(&mut self, ev: &SseEvent) -> bool;
    /// The reply assembled so far.
    fn finish(&mut self) -> AssembledReply;
}

impl Dialect {
    /// Its name in metrics labels, the admin API and logs: `chat`, `anthropic`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Anthropic => "anthropic",
        }
    }

    /// The dialect named `name` (as [`Dialect::as_str`] writes it); `chat` for anything else.
    pub fn named(name: &str) -> Dialect {
        match name {
            "anthropic" => Dialect::Anthropic,
            _ => Dialect::Chat,
        }
    }

    /// The messages a reply is kept as in the session: the assembled message itself, or (Responses) each of its
    /// output items, as the client will send them back.
    pub fn reply_messages(self, message: Value) -> Vec<Value> {
        match self {
            Dialect::Chat | Dialect::Anthropic => vec![message],
        }
    }

    /// The body field holding the conversation: `messages` (`input` for the Responses API).
    pub fn conversation_key(self) -> &'static str {
        match self {
            Dialect::Chat | Dialect::Anthropic => "messages",
        }
    }

    /// The API its requests go to.
    pub fn api(self) -> Api {
        match self {
            Dialect::Chat => Api::OpenAi,
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
        }
    }

    /// Parses and checks a request body (every field kept in its order).
    pub fn parse(self, raw: Bytes) -> Result<Request, GatewayError> {
        match self {
            Dialect::Chat => chat::parse(raw),
            Dialect::Anthropic => anthropic::parse(raw),
        }
    }

    /// The upstream path of a conversation request, below the dialect's base URL.
    pub fn upstream_path(self) -> &'static str {
        match self {
            Dialect::Chat => "chat/completions",
            Dialect::Anthropic => "messages",
        }
    }

    /// The path clients call, for logs.
    pub fn client_path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Anthropic => "/v1/messages",
        }
    }

    /// A tool definition in this dialect's shape.
    pub fn tool_def(self, name: &str, description: &str, parameters: Value) -> Value {
        match self {
            Dialect::Chat => serde_json::json!({"type": "function", "function": {
                "name": name, "description": description, "parameters": parameters}}),
            Dialect::Anthropic => serde_json::json!({
                "name": name, "description": description, "input_schema": parameters}),
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
        }
    }

    /// A fresh assembler of a streamed reply.
    pub fn assembler(self) -> Box<dyn Assemble> {
        match self {
            Dialect::Chat => Box::<chat::MessageAssembler>::default(),
            Dialect::Anthropic => Box::<anthropic::Assembler>::default(),
        }
    }

    /// The reply of a whole (non-streaming) answer body.
    pub fn reply_from_body(self, body: &[u8]) -> AssembledReply {
        match self {
            Dialect::Chat => chat::MessageAssembler::from_completion_body(body),
            Dialect::Anthropic => anthropic::reply_from_body(body),
        }
    }

    /// Our own error as this dialect's error body.
    pub fn error_body(self, e: &GatewayError) -> Value {
        match self {
            Dialect::Chat => e.body(),
            Dialect::Anthropic => anthropic::error_body(e),
        }
    }

    /// The SSE event that ends a stream the upstream broke, after a blank line closing the event the upstream
    /// left unfinished (when `mid_event`).
    pub fn error_event(self, e: &GatewayError, mid_event: bool) -> Bytes {
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DialectLabel;

    #[test]
    fn every_dialect_is_labelled_by_its_name() {
        for d in [Dialect::Chat, Dialect::Anthropic] {
            assert_eq!(DialectLabel::from(d).as_str(), d.as_str());
        }
        // `none` is no dialect's name (`responses` is the name of the dialect whose variant comes with its wire
        // pieces)
        assert!(DialectLabel::ALL
            .iter()
            .filter(|l| [Dialect::Chat, Dialect::Anthropic]
                .iter()
                .all(|d| DialectLabel::from(*d) != **l))
            .all(|l| [DialectLabel::NoDialect, DialectLabel::Responses].contains(l)));
    }
}
