//! The OpenAI chat-completions dialect (`POST /v1/chat/completions`): its messages are already the neutral shape,
//! so a rewritten body is the client's fields with the rewritten messages; its answers are `chat.completion`
//! bodies and chunk streams ended by `[DONE]`.

mod assemble;
mod request;
pub mod rounds;
pub mod splice;
pub mod wire;

pub use assemble::MessageAssembler;
pub use request::{parse, MAX_MODEL_LEN};
pub use splice::{merge_usage, strip_injected, RoundEnd, StreamSplicer};
pub use wire::ChatWire;

use super::InjectedNames;
use serde_json::{Map, Value};

/// See [`super::Wire::may_add_tools`]: not with `n > 1`, `tool_choice: "none"` or a forced function, nor
/// when a client function has one of our names.
pub fn may_add_tools(body: &Map<String, Value>, names: &InjectedNames) -> Result<(), &'static str> {
    // Several choices would each need their own recall rounds; the rewrite still applies, without the tools.
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err("n > 1");
    }
    match body.get("tool_choice") {
        Some(Value::String(s)) if s == "none" => return Err("tool_choice none"),
        Some(Value::Object(_)) => return Err("tool_choice forces a function"),
        _ => {}
    }
    super::request::tools_leave_room(body.get("tools"), names, |t| {
        t.pointer("/function/name").and_then(Value::as_str)
    })
}
