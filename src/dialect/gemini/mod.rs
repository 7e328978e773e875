//! The Gemini API dialect (`POST /{version}/models/{model}:generateContent`, `:streamGenerateContent` with
//! `alt=sse` or as one streamed JSON array): where a request was sent (`endpoint.rs`), its checks, its contents
//! converted to the neutral conversation and rendered back with every untouched content borrowed (`convert.rs`),
//! the API's sequence rules (`validate.rs`), its answers (`assemble.rs`), recall rounds (`rounds.rs`, `splice.rs`),
//! errors in Google's shape, the opening's fingerprint, and chat traces as Gemini requests (`from_chat.rs`).

pub mod assemble;
pub mod convert;
pub mod endpoint;
pub mod errors;
pub mod from_chat;
pub mod request;
pub mod rounds;
pub mod session_id;
pub mod splice;
pub mod validate;
pub mod wire;

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

pub use wire::GeminiWire;

use super::{InjectedNames, Request};
use crate::context::RewrittenBody;
use convert::{Neutral, Origin};
use serde_json::{Map, Value};

/// The neutral form of a request's contents, with where each came from.
#[derive(Debug, Clone)]
pub struct Converted {
    neutral: Neutral,
    /// For each content, the index of its first neutral message; one more entry: the neutral length.
    starts: Vec<usize>,
}

impl Converted {
    /// The conversion of `contents` (and the `systemInstruction`).
    pub fn new(system: Option<&Value>, contents: &[Value]) -> Self {
        let neutral = convert::to_neutral(system, contents);
        let mut starts = vec![usize::MAX; contents.len() + 1];
        for (i, o) in neutral.origins.iter().enumerate().rev() {
            if let Some(s) = o.native().and_then(|k| starts.get_mut(k)) {
                *s = i;
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
}

impl super::Conversion for Converted {
    fn messages(&self) -> &[Value] {
        &self.neutral.messages
    }
    fn native_index(&self, i: usize) -> Option<usize> {
        self.neutral
            .origins
            .get(i)
            .copied()
            .and_then(Origin::native)
    }
    fn neutral_start(&self, native: usize) -> usize {
        self.starts
            .get(native)
            .copied()
            .unwrap_or(self.neutral.messages.len())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The neutral messages of one stored content (an id-less call's neutral id is positional, `call_0_<part>`, here).
pub fn neutral_of(content: &Value) -> Vec<Value> {
    convert::to_neutral(None, std::slice::from_ref(content)).messages
}

/// See `Wire::may_add_tools`: not when `toolConfig.functionCallingConfig` forbids calls (`NONE`) or limits them to
/// named functions, nor when a client declaration has one of our names.
pub fn may_add_tools(body: &Map<String, Value>, names: &InjectedNames) -> Result<(), &'static str> {
    let config = body
        .get("toolConfig")
        .and_then(|c| c.get("functionCallingConfig"));
    match config.and_then(|c| c.get("mode")).and_then(Value::as_str) {
        Some("NONE") => return Err("function calling mode NONE"),
        _ if config
            .and_then(|c| c.get("allowedFunctionNames"))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty()) =>
        {
            return Err("allowedFunctionNames limits the functions")
        }
        _ => {}
    }
    match body.get("tools") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(tools)) => {
            let clash = tools
                .iter()
                .filter_map(|t| t.get("functionDeclarations").and_then(Value::as_array))
                .flatten()
                .any(|d| {
                    d.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| names.is_injected(n))
                });
            if clash {
                Err("a client function has the same name")
            } else {
                Ok(())
            }
        }
        Some(_) => Err("client tools are not an array"),
    }
}

/// The rewritten body: the client's fields in their order (`systemInstruction` untouched; its `tools` with ours
/// appended), its contents rendered back from the rewritten neutral messages (untouched ones borrowed).
pub fn render(request: &Request, body: &RewrittenBody<'_>) -> serde_json::Result<(Vec<u8>, usize)> {
    let Some(converted) = request
        .converted()
        .and_then(|c| c.as_any().downcast_ref::<Converted>())
    else {
        return body.to_vec();
    };
    let contents = convert::from_neutral(
        request.native(),
        &converted.neutral,
        &body.messages,
        &body.sources,
    );
    body.to_vec_with(&contents)
}
