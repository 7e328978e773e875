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
        // `none` is no dialect's name
        assert!(DialectLabel::ALL
            .iter()
            .filter(|l| [Dialect::Chat, Dialect::Anthropic]
                .iter()
                .all(|d| DialectLabel::from(*d) != **l))
            .all(|l| *l == DialectLabel::NoDialect));
    }
}
