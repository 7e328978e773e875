//! The splicer of a streamed response with recall rounds ([`Splice`]: several upstream streams made one client
//! stream) and how a round ended ([`SpliceEnd`]); the rest of what recall rounds ask of a dialect (its calls, the
//! messages carrying ctxgate's answers, the final JSON answer) is in [`super::Wire`].

use super::AssembledReply;
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::Value;

/// How a streamed round ended.
#[derive(Debug)]
pub enum SpliceEnd {
    /// The round called ctxgate's tools and rounds are left: answer `calls` (neutral tool calls) and ask again;
    /// `assistant` is the round's answer as a message of the dialect.
    Continue {
        /// The round's assistant message (dialect shape).
        assistant: Value,
        /// Its injected calls, neutral (`{id, type, function: {name, arguments}}`).
        calls: Vec<Value>,
    },
    /// The response is over: send these bytes (then [`Splice::done`]).
    Finish(Vec<Bytes>),
}

/// Splices the SSE streams of successive upstream rounds into one client stream.
pub trait Splice: Send {
    /// One upstream event; returns the bytes the client gets now.
    fn on_event(&mut self, ev: &SseEvent) -> Vec<Bytes>;
    /// Ends the current round; `rounds_left`: whether another round may be made.
    fn end_round(&mut self, rounds_left: bool) -> SpliceEnd;
    /// Ends the response early (a follow-up round failed): the bytes that close it cleanly.
    fn abort(&mut self) -> Vec<Bytes>;
    /// The reply the client has been sent so far.
    fn reply(&self) -> AssembledReply;
    /// The stream's last bytes after a complete answer (`[DONE]` for chat; nothing when the tail ends it).
    fn done(&self) -> Option<Bytes>;
    /// The error event ending the client's stream, numbered in it, for a dialect that numbers its events.
    fn error_event(&mut self, e: &crate::error::GatewayError) -> Option<Bytes> {
        let _ = e;
        None
    }
    /// An event that keeps the client's stream alive while a follow-up round is in flight, if the dialect has one.
    fn keepalive(&self) -> Option<Bytes>;
}
