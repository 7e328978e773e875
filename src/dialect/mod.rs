//! Dialects: the wire formats ctxgate speaks (OpenAI chat completions, Anthropic Messages). A dialect parses a
//! request body into the neutral conversation (`crate::message`), renders a rewritten conversation back into its
//! own bytes, and knows its answers: reply assembly, SSE events, errors and usage. Nothing outside `dialect/`
//! knows a wire format.

pub mod anthropic;

/// A wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI chat completions (`POST /v1/chat/completions`).
    Chat,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
}

impl Dialect {
    /// Its name in metrics labels, the admin API and logs: `chat`, `anthropic`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Anthropic => "anthropic",
        }
    }
}
