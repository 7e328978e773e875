//! The OpenAI Responses dialect (`POST /v1/responses`): its input items converted to the neutral conversation and
//! rendered back with every untouched item borrowed, the request check and the validator of rewrites, its answers
//! (reply assembly, recall-round splicing, errors).

pub mod assemble;
pub mod convert;
pub mod errors;
pub mod from_chat;
mod rebuild;
pub mod request;
pub mod rounds;
pub mod session_id;
pub mod splice;
pub mod unmanaged;
pub mod validate;
pub mod wire;

pub use wire::ResponsesWire;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

use super::{Dialect, InjectedNames, Request};
use crate::context::RewrittenBody;
use crate::error::GatewayError;
use bytes::Bytes;
use convert::Neutral;
use serde_json::{Map, Value};

/// The neutral form of a request's input items, with where each came from.
#[derive(Debug, Clone)]
pub struct Converted {
    neutral: Neutral,
    /// For each input item, the index of the neutral message holding it; one more entry: the neutral length.
    starts: Vec<usize>,
}

impl Converted {
    /// The conversion of `input` (and the top-level `instructions`).
    pub fn new(instructions: Option<&Value>, input: &[Value]) -> Self {
        let neutral = convert::to_neutral(instructions, input);
        let mut starts = vec![usize::MAX; input.len() + 1];
        for (i, o) in neutral.origins.iter().enumerate() {
            if let Some(range) = o.items() {
                for k in range {
                    if let Some(s) = starts.get_mut(k) {
                        *s = (*s).min(i);
                    }
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

    /// The first input item of the neutral message `i` (`None`: the top-level `instructions`).
    pub fn native_index(&self, i: usize) -> Option<usize> {
        self.neutral
            .origins
            .get(i)
            .and_then(|o| o.items())
            .map(|r| r.start)
    }

    /// The index of the neutral message holding input item `native` (the neutral length past the end); a
    /// summary may end only where this is the first item of its message.
    pub fn neutral_start(&self, native: usize) -> usize {
        self.starts
            .get(native)
            .copied()
            .unwrap_or(self.neutral.messages.len())
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

/// Parses and checks a Responses request.
pub fn parse(raw: Bytes) -> Result<Request, GatewayError> {
    let body = super::request::json_object(&raw)?;
    request::check(&body)?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(Request::new(Dialect::Responses, raw, body, stream, model))
}

/// The neutral messages of one stored input item.
pub fn neutral_of(item: &Value) -> Vec<Value> {
    convert::neutral_of(item)
}

/// See `Wire::may_add_tools`: not with `tool_choice` `none` or forcing one tool, nor when a client tool has one
/// of our names.
pub fn may_add_tools(body: &Map<String, Value>, names: &InjectedNames) -> Result<(), &'static str> {
    match body.get("tool_choice") {
        Some(Value::String(s)) if s == "none" => return Err("tool_choice none"),
        Some(Value::Object(_)) => return Err("tool_choice forces a tool"),
        _ => {}
    }
    super::request::tools_leave_room(body.get("tools"), names, |t| {
        t.get("name").and_then(Value::as_str)
    })
}

/// The rewritten body: the client's fields in their order (`instructions` untouched; its `tools` with ours
/// appended), its input items rendered back from the rewritten neutral messages (untouched items borrowed).
pub fn render(request: &Request, body: &RewrittenBody<'_>) -> serde_json::Result<(Vec<u8>, usize)> {
    let Some(converted) = request
        .converted()
        .and_then(|c| c.as_any().downcast_ref::<Converted>())
    else {
        return body.to_vec();
    };
    let items = convert::from_neutral(
        request.native(),
        &converted.neutral,
        &body.messages,
        &body.sources,
    );
    body.to_vec_with(&items)
}
