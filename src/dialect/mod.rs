//! Dialects: the wire formats ctxgate speaks (OpenAI chat completions, Anthropic Messages, OpenAI Responses:
//! `chat/`, `anthropic/`, `responses/`; what the last two share in `shared/`). A dialect parses a
//! request body into the neutral conversation (`crate::message`), renders a rewritten conversation back into its
//! own bytes, and knows its answers: reply assembly, SSE events, recall rounds, errors and usage. Nothing outside
//! `dialect/` knows a wire format.

pub mod anthropic;
pub mod census;
pub mod chat;
pub mod gemini;
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
pub mod wire;

pub use names::InjectedNames;
pub use reply::{AssembledReply, MAX_ASSEMBLED_BYTES};
pub use request::Request;
pub use wire::{Conversion, Wire};

use crate::error::GatewayError;
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::{Map, Value};

/// A wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI chat completions (`POST /v1/chat/completions`).
    Chat,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
    /// OpenAI Responses (`POST /v1/responses`).
    Responses,
    /// The Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`).
    Gemini,
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
    /// Every dialect, in the order replay asks them whether a trace is theirs (chat, which takes the rest, last).
    pub const ALL: [Dialect; 4] = [
        Dialect::Responses,
        Dialect::Gemini,
        Dialect::Anthropic,
        Dialect::Chat,
    ];

    /// Its implementation: the one place that names each dialect's.
    pub fn wire(self) -> &'static dyn Wire {
        match self {
            Dialect::Chat => &chat::ChatWire,
            Dialect::Anthropic => &anthropic::AnthropicWire,
            Dialect::Responses => &responses::ResponsesWire,
            Dialect::Gemini => &gemini::GeminiWire,
        }
    }

    /// Its name in metrics labels, the admin API and logs: `chat`, `anthropic`, `responses`, `gemini`.
    pub fn as_str(self) -> &'static str {
        self.wire().name()
    }

    /// The dialect named `name` (as [`Dialect::as_str`] writes it), if any.
    pub fn from_name(name: &str) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// The dialect named `name` (as [`Dialect::as_str`] writes it); `chat` for anything else.
    pub fn named(name: &str) -> Dialect {
        Dialect::from_name(name).unwrap_or(Dialect::Chat)
    }

    /// The dialect whose conversation requests are POSTs to `path` (below the root, with `/v1`), if any.
    pub fn serving(path: &str) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.serves(path))
    }

    /// A stored history of dialect `name` as neutral messages, each with its position in the history; `None` for
    /// chat, whose messages are neutral (what `session::Sessions` finds a view's run loops on).
    pub fn history_as_neutral(name: &str, messages: &[Value]) -> Option<(Vec<Value>, Vec<usize>)> {
        let c = Dialect::named(name).convert(None, messages)?;
        let native = (0..c.messages().len())
            .map(|i| c.native_index(i).unwrap_or(0))
            .collect();
        Some((c.messages().to_vec(), native))
    }

    /// The id the request gives its conversation in this dialect's own keys, and where (see
    /// [`Wire::client_key`]).
    pub fn client_key(
        self,
        header: impl Fn(&str) -> Option<String>,
        body: &Map<String, Value>,
    ) -> Option<(String, naming::KeyKind)> {
        self.wire().client_key(&header, body)
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
        b.extend(self.error_event_body(e, sequence));
        b.extend_from_slice(b"\n\n");
        Bytes::from(b)
    }
}

/// A dialect is its implementation: the methods of [`Wire`] are called on it directly.
impl std::ops::Deref for Dialect {
    type Target = dyn Wire;

    fn deref(&self) -> &Self::Target {
        self.wire()
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
        d.label()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DialectLabel;

    #[test]
    fn every_dialect_is_labelled_by_its_name() {
        let all = Dialect::ALL;
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
