//! The adapter that puts a dialect's own stream splicer (Anthropic's, Responses') behind the dialect-neutral
//! [`Splice`]: how a round ended, the calls made neutral, the stream kept alive with the dialect's own event.

use crate::dialect::rounds::{Splice, SpliceEnd};
use crate::dialect::AssembledReply;
use crate::error::GatewayError;
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::Value;

/// How a round of a dialect's stream splicer ended: [`SpliceEnd`], its calls in the dialect's own shape (see
/// [`StreamSplice::neutral_call`]).
pub use crate::dialect::rounds::SpliceEnd as RoundEnd;

/// A dialect's splicer of the SSE streams of successive upstream rounds into one client stream.
pub trait StreamSplice: Send {
    /// One upstream event; returns the encoded events the client gets now.
    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes>;
    /// Ends the current upstream round. `rounds_left`: whether another round may be made.
    fn end_round(&mut self, rounds_left: bool) -> RoundEnd;
    /// Ends the client stream cleanly after a failed follow-up round (or a round cut short).
    fn abort(&mut self) -> Vec<Bytes>;
    /// The reply as the client saw it so far, with the usage of each upstream round that ended.
    fn reply(&self) -> AssembledReply;
    /// The event that keeps the client's stream alive while a follow-up round is in flight.
    fn keepalive() -> Bytes;
    /// The error event ending the client's stream, numbered in it, for a dialect that numbers its events.
    fn error_event(&mut self, e: &GatewayError) -> Option<Bytes> {
        let _ = e;
        None
    }
    /// A call of [`RoundEnd::Continue`] as a neutral tool call (`{id, type, function: {name, arguments}}`); calls
    /// that are neutral already stay as they are.
    fn neutral_call(call: Value) -> Value {
        call
    }
}

/// A dialect's [`StreamSplice`] as the dialect-neutral [`Splice`].
pub struct Spliced<S>(pub S);

impl<S: StreamSplice> Splice for Spliced<S> {
    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes> {
        self.0.on_event(ev)
    }

    fn end_round(&mut self, rounds_left: bool) -> SpliceEnd {
        match self.0.end_round(rounds_left) {
            RoundEnd::Continue { assistant, calls } => SpliceEnd::Continue {
                assistant,
                calls: calls.into_iter().map(S::neutral_call).collect(),
            },
            RoundEnd::Finish(tail) => SpliceEnd::Finish(tail),
        }
    }

    fn abort(&mut self) -> Vec<Bytes> {
        self.0.abort()
    }

    fn reply(&self) -> AssembledReply {
        self.0.reply()
    }

    fn done(&self) -> Option<Bytes> {
        None
    }

    fn error_event(&mut self, e: &GatewayError) -> Option<Bytes> {
        self.0.error_event(e)
    }

    fn keepalive(&self) -> Option<Bytes> {
        Some(S::keepalive())
    }
}

/// ctxgate's answers to a round's neutral `calls` (`results` aligned with them), as (call id, result).
pub fn answers(calls: &[Value], results: &[String]) -> Vec<(String, String)> {
    calls
        .iter()
        .zip(results)
        .map(|(c, r)| {
            let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
            (id.to_string(), r.clone())
        })
        .collect()
}
