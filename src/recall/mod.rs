//! The recall tools: injected into rewritten requests so the model can fetch what was pruned, and answered by
//! ctxgate itself from the session's full history; the client never sees them.

mod answer;
#[cfg(test)]
mod folded_tests;
mod inject;

pub use crate::dialect::InjectedNames;
pub use answer::{answer_call, answer_call_with_outcome, Answered, HistorySource, LazyHistory};
pub use inject::{
    can_inject, inject, reserve_tokens, Injection, Offer, Recallable, DROPPED_PREFIX, NOTE_PREFIX,
};
