//! The Anthropic Messages dialect (`POST /v1/messages`): its requests (converted to the neutral conversation and
//! rendered back with every untouched message borrowed), its answers (JSON and SSE), recall rounds and errors.

pub mod assemble;
pub mod convert;
pub mod errors;
pub mod from_chat;
mod rebuild;
pub mod request;
pub mod rounds;
pub mod session_id;
pub mod splice;
pub mod validate;
pub mod wire;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

pub use assemble::Assembler;
pub use wire::AnthropicWire;

use super::{Assemble, AssembledReply, Dialect, InjectedNames, Request};
use crate::context::RewrittenBody;
use crate::error::GatewayError;
use crate::sse::SseEvent;
use bytes::Bytes;
use convert::{Neutral, Origin};
use serde_json::{Map, Value};

/// The neutral form of a request's messages, with where each came from.
#[derive(Debug, Clone)]
pub struct Converted {
    neutral: Neutral,
    /// For each client message, the index of its first neutral message; one more entry: the neutral length.
    starts: Vec<usize>,
}

impl Converted {
    /// The conversion of `messages` (and the top-level `system`).
    pub fn new(system: Option<&Value>, messages: &[Value]) -> Self {
        let neutral = convert::to_neutral(system, messages);
        let mut starts = vec![usize::MAX; messages.len() + 1];
        for (i, o) in neutral.origins.iter().enumerate().rev() {
            if let Some(k) = native_of(*o) {
                if let Some(s) = starts.get_mut(k) {
                    *s = i;
                }
            }
        }
        let mut next = neutral.messages.len();
        for s in starts.iter_mut().rev() {
            if *s == usize::MAX {
                *s = next;
            }
            next = *s;
        }
        Self { neutral, starts }
    }

    /// The neutral messages.
    pub fn messages(&self) -> &[Value] {
        &self.neutral.messages
    }

    /// The client message the neutral message `i` comes from (`None`: the top-level `system`).
    pub fn native_index(&self, i: usize) -> Option<usize> {
        self.neutral.origins.get(i).copied().and_then(native_of)
    }

    /// The index of the first neutral message of client message `native` (the neutral length past the end).
    pub fn neutral_start(&self, native: usize) -> usize {
        self.starts
            .get(native)
            .copied()
            .unwrap_or(self.neutral.messages.len())
    }
}

fn native_of(o: Origin) -> Option<usize> {
    match o {
        Origin::System => None,
        Origin::Whole(k) | Origin::ToolResult(k, _) | Origin::Rest(k) => Some(k),
    }
}

impl super::Conversion for Converted {
    fn messages(&self) -> &[Value] {
        Converted::messages(self)
    }
    fn native_index(&self, i: usize) -> Option<usize> {
        Converted::native_index(self, i)
    }
    fn neutral_start(&self, native: usize) -> usize {
        Converted::neutral_start(self, native)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Parses and checks a Messages request.
pub fn parse(raw: Bytes) -> Result<Request, GatewayError> {
    let body = super::request::json_object(&raw)?;
    request::check(&body)?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(Request::new(Dialect::Anthropic, raw, body, stream, model))
}

/// The neutral messages of one stored client message.
pub fn neutral_of(message: &Value) -> Vec<Value> {
    convert::to_neutral(None, std::slice::from_ref(message)).messages
}

/// See `Wire::may_add_tools`: not with `tool_choice` `none` or forcing one tool, nor when a client tool has
/// one of our names.
pub fn may_add_tools(body: &Map<String, Value>, names: &InjectedNames) -> Result<(), &'static str> {
    match body
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str)
    {
        Some("none") => return Err("tool_choice none"),
        Some("tool") => return Err("tool_choice forces a tool"),
        _ => {}
    }
    super::request::tools_leave_room(body.get("tools"), names, |t| {
        t.get("name").and_then(Value::as_str)
    })
}

/// The rewritten body: the client's fields in their order (its `system` untouched; its `tools` with ours
/// appended), its messages rendered back from the rewritten neutral ones (untouched ones borrowed).
pub fn render(request: &Request, body: &RewrittenBody<'_>) -> serde_json::Result<(Vec<u8>, usize)> {
    let Some(converted) = request
        .converted()
        .and_then(|c| c.as_any().downcast_ref::<Converted>())
    else {
        return body.to_vec();
    };
    let messages = convert::from_neutral(
        request.native(),
        &converted.neutral,
        &body.messages,
        &body.sources,
    );
    body.to_vec_with(&messages)
}

/// The reply of a whole JSON answer.
pub fn reply_from_body(body: &[u8]) -> AssembledReply {
    assemble::from_body(body)
}

/// Our error in Anthropic's shape.
pub fn error_body(e: &GatewayError) -> Value {
    errors::error_body(e)
}

impl Assemble for Assembler {
    /// True for the event after which the reply is whole ([`Assembler::answered`]): the closing `message_delta`,
    /// else `message_stop`.
    fn on_event(&mut self, ev: &SseEvent) -> bool {
        let before = self.answered();
        Assembler::on_event(self, ev);
        let stop = ev.event.as_deref() == Some("message_stop")
            || (ev.event.is_none() && ev.data.contains("\"message_stop\""));
        !before && (self.answered() || stop)
    }

    fn finish(&mut self) -> AssembledReply {
        Assembler::finish(self)
    }
}
