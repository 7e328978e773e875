//! What recall rounds need of a dialect: the injected calls of an answer, the messages that carry ctxgate's
//! answers into the next request, the client's final JSON answer, and a splicer that turns the streams of several
//! upstream rounds into one client stream.

use super::shared::Spliced;
use super::{anthropic, responses, AssembledReply, Dialect, InjectedNames};
use crate::sse::SseEvent;
use bytes::Bytes;
use serde_json::{Map, Value};

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

impl Dialect {
    /// The splicer for a streamed request whose client body is `body`.
    pub fn splicer(self, names: InjectedNames, body: &Map<String, Value>) -> Box<dyn Splice> {
        match self {
            Dialect::Chat => Box::new(super::chat::rounds::ChatSplice::new(names, body)),
            Dialect::Anthropic => Box::new(Spliced(anthropic::splice::StreamSplicer::new(names))),
            Dialect::Responses => Box::new(Spliced(responses::splice::StreamSplicer::new(names))),
        }
    }

    /// The assistant message of a whole JSON answer, when it is one.
    pub fn answer_message(self, answer: &Value) -> Option<Value> {
        match self {
            Dialect::Chat => answer.pointer("/choices/0/message").cloned(),
            Dialect::Anthropic => super::anthropic::rounds::answer_message(answer),
            Dialect::Responses => super::responses::rounds::answer_message(answer),
        }
    }

    /// The injected calls of an assistant message (dialect shape), as neutral tool calls.
    pub fn injected_calls(self, message: &Value, names: &InjectedNames) -> Vec<Value> {
        match self {
            Dialect::Chat => names.injected_calls(message).into_iter().cloned().collect(),
            Dialect::Anthropic => super::anthropic::rounds::injected_calls(message, names),
            Dialect::Responses => super::responses::rounds::injected_calls(message, names),
        }
    }

    /// The messages that carry one round into the next request: the assistant's turn (only what led to ctxgate's
    /// calls) and ctxgate's answers (`results`, aligned with `calls`).
    pub fn round_messages(
        self,
        assistant: &Value,
        names: &InjectedNames,
        calls: &[Value],
        results: &[String],
    ) -> Vec<Value> {
        match self {
            Dialect::Chat => super::chat::rounds::round_messages(assistant, calls, results),
            Dialect::Anthropic => {
                super::anthropic::rounds::round_messages(assistant, names, calls, results)
            }
            Dialect::Responses => {
                super::responses::rounds::round_messages(assistant, names, calls, results)
            }
        }
    }

    /// Adds a round's `usage` into `acc`.
    pub fn add_usage(self, acc: &mut Option<Value>, usage: &Value) {
        match self {
            Dialect::Chat => super::chat::merge_usage(acc, usage),
            Dialect::Anthropic => super::anthropic::rounds::add_usage(acc, usage),
            Dialect::Responses => super::responses::rounds::add_usage(acc, usage),
        }
    }

    /// The client's final JSON answer: ctxgate's calls removed, usage summed over the rounds, the first round's id.
    pub fn finalize_answer(
        self,
        answer: Value,
        names: &InjectedNames,
        usage: Option<Value>,
        first_id: Option<Value>,
    ) -> Value {
        match self {
            Dialect::Chat => super::chat::rounds::finalize(answer, names, usage, first_id),
            Dialect::Anthropic => {
                super::anthropic::rounds::finalize(answer, names, usage, first_id)
            }
            Dialect::Responses => {
                super::responses::rounds::finalize(answer, names, usage, first_id)
            }
        }
    }
}
