//! Where a Gemini request names its conversation: Gemini CLI sends no session identifier (its `session_id` is on
//! the Code Assist path only), so a conversation is the fingerprint of its opening — the `systemInstruction` and
//! the first user content (Gemini CLI's `<session_context>` part and the prompt). The model is left out: Gemini CLI
//! falls back to another model within a session.

use crate::message::canonical_json;
use crate::message::role;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Hex SHA-256 of `gemini`, the system instruction and the first user content of a request (`null` for either
/// when absent). Distinct from every other dialect's fingerprint: the hash opens with the dialect's name.
pub fn fingerprint(body: &Map<String, Value>) -> String {
    let mut h = Sha256::new();
    h.update(b"gemini\0");
    h.update(canonical_json(body.get("systemInstruction").unwrap_or(&Value::Null)).as_bytes());
    h.update([1]);
    let first = body
        .get("contents")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| matches!(role(c), "user" | "")))
        .and_then(|c| c.get("parts"));
    h.update(canonical_json(first.unwrap_or(&Value::Null)).as_bytes());
    hex::encode(h.finalize())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_opening_names_the_conversation() {
        let body = |sys: &str, first: &str, more: bool| {
            let mut contents = vec![json!({"role":"user","parts":[{"text":first}]})];
            if more {
                contents.push(json!({"role":"model","parts":[{"text":"a"}]}));
                contents.push(json!({"role":"user","parts":[{"text":"next"}]}));
            }
            json!({"systemInstruction":{"role":"user","parts":[{"text":sys}]},"contents":contents})
                .as_object()
                .unwrap()
                .clone()
        };
        let a = fingerprint(&body("s", "q", false));
        assert_eq!(a, fingerprint(&body("s", "q", true)));
        assert_ne!(a, fingerprint(&body("s2", "q", false)));
        assert_ne!(a, fingerprint(&body("s", "q2", false)));
        assert_eq!(a.len(), 64);
    }
}
