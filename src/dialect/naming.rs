//! How a request names its conversation, in each dialect's terms: the client's own id (its agent's headers, its
//! body's keys) and a fingerprint of the conversation's opening. `session/` scopes what is found here by tenant
//! and reads no wire format itself.

#[cfg(test)]
use super::Dialect;
use crate::message::canonical_json;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Where a client's own id for its conversation was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// A client's own session header: one of [`AGENT_HEADERS`] (chat), `x-claude-code-session-id` (Anthropic) or
    /// one of [`crate::dialect::responses::session_id::SESSION_HEADERS`] (Responses: Codex's `session-id`, `thread-id`).
    AgentHeader,
    /// The `session_id` inside an Anthropic request's `metadata.user_id` (Claude Code).
    Metadata,
    /// The body's `prompt_cache_key` (Responses).
    PromptCacheKey,
}

/// Agent headers honoured after `[session] header` in chat requests, in this order.
pub const AGENT_HEADERS: &[&str] = &[
    "helicone-session-id",
    "x-conversation-id",
    "session_id",
    "conversation_id",
];

/// The model family: lower case, without a date or version suffix (`gpt-4o-2024-08-06` → `gpt-4o`).
pub fn model_family(model: &str) -> String {
    let m = model.trim().to_ascii_lowercase();
    let parts: Vec<&str> = m.split('-').collect();
    let mut end = parts.len();
    while end > 1 {
        let p = parts[end - 1];
        let is_date_part = !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() >= 2;
        if is_date_part || p == "latest" || p == "preview" {
            end -= 1;
        } else {
            break;
        }
    }
    parts[..end].join("-")
}

/// Hash of model family, the system message(s) and the first user message of a chat request. Remembered per
/// opening ([`super::opening_memo`]): an agent sends the same one with every request.
pub fn chat_fingerprint(body: &Map<String, Value>) -> String {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let family = Value::String(model_family(model));
    let family_name = family.as_str().unwrap_or("");
    let (mut system, mut user) = (Vec::new(), Vec::new());
    if let Some(msgs) = body.get("messages").and_then(Value::as_array) {
        for m in msgs {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("");
            if role == "system" || role == "developer" {
                system.push(m.get("content").unwrap_or(&Value::Null));
            } else if role == "user" {
                user.push(m.get("content").unwrap_or(&Value::Null));
                break;
            }
        }
    }
    super::opening_memo::remembered(&[&[&family], &system, &user], || {
        let mut h = Sha256::new();
        h.update(family_name.as_bytes());
        h.update([0]);
        for content in &system {
            h.update(canonical_json(content).as_bytes());
            h.update([1]);
        }
        for content in &user {
            h.update(canonical_json(content).as_bytes());
        }
        hex::encode(h.finalize())
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn families() {
        assert_eq!(model_family("gpt-4o-2024-08-06"), "gpt-4o");
        assert_eq!(model_family("GPT-4.1"), "gpt-4.1");
        assert_eq!(model_family("o3-mini"), "o3-mini");
    }

    #[test]
    fn each_dialect_finds_its_own_keys() {
        let none = |_: &str| None;
        let body =
            json!({"metadata": {"user_id": "{\"session_id\":\"s-1\"}"}, "prompt_cache_key": "k"});
        let body = body.as_object().unwrap();
        assert_eq!(Dialect::Chat.client_key(none, body), None);
        assert_eq!(
            Dialect::Anthropic.client_key(none, body),
            Some(("s-1".into(), KeyKind::Metadata))
        );
        assert_eq!(
            Dialect::Responses.client_key(none, body),
            Some(("k".into(), KeyKind::PromptCacheKey))
        );
        let helicone = |h: &str| (h == "helicone-session-id").then(|| "h-1".to_string());
        assert_eq!(
            Dialect::Chat.client_key(helicone, body),
            Some(("h-1".into(), KeyKind::AgentHeader))
        );
    }
}
