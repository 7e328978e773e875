//! Where an OpenAI Responses request names its conversation: Codex's session headers, the body's
//! `prompt_cache_key`, or a fingerprint of its opening (`instructions` and the first user message item).

use crate::dialect::naming::{model_family, KeyKind};
use crate::message::canonical_json;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// Session headers honoured (after `[session] header`) in Responses requests, in this order: Codex sends
/// `session-id` and `thread-id` with every request (its older versions `session_id`); `thread_id` is the same
/// name in the older spelling.
pub const SESSION_HEADERS: &[&str] = &["session-id", "session_id", "thread-id", "thread_id"];

/// The body key Codex sets to its session id (and other clients to a stable per-conversation key).
pub const PROMPT_CACHE_KEY: &str = "prompt_cache_key";

/// The conversation a Responses request names itself, and how: the first of [`SESSION_HEADERS`] with a value
/// (`header` reads one, trimmed, `None` when absent or empty), else a non-empty `prompt_cache_key`.
pub fn client_key(
    header: impl Fn(&str) -> Option<String>,
    body: &Map<String, Value>,
) -> Option<(String, KeyKind)> {
    SESSION_HEADERS
        .iter()
        .find_map(|h| header(h))
        .map(|v| (v, KeyKind::AgentHeader))
        .or_else(|| {
            body.get(PROMPT_CACHE_KEY)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| (v.to_string(), KeyKind::PromptCacheKey))
        })
}

/// Hash of the model family, `instructions` and the first user message item of a Responses request (an `input`
/// string is that message). Content is compared as parts, a string being one `input_text` part, so both
/// spellings of a message agree; items' `id`s and `status` are left out. Distinct from every chat and Anthropic
/// fingerprint: the hash opens with the dialect's name.
pub fn fingerprint(body: &Map<String, Value>) -> String {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let mut h = Sha256::new();
    h.update(b"responses\0");
    h.update(model_family(model).as_bytes());
    h.update([0]);
    if let Some(instructions) = body.get("instructions") {
        h.update(canonical_json(&parts(instructions)).as_bytes());
    }
    h.update([1]);
    let first_user = match body.get("input") {
        Some(s @ Value::String(_)) => Some(parts(s)),
        Some(Value::Array(items)) => items
            .iter()
            .find(|i| is_user_message(i))
            .map(|i| parts(i.get("content").unwrap_or(&Value::Null))),
        _ => None,
    };
    if let Some(content) = first_user {
        h.update(canonical_json(&content).as_bytes());
    }
    hex::encode(h.finalize())
}

/// A user `message` item (`type` is optional in the short form `{role, content}`).
fn is_user_message(item: &Value) -> bool {
    item.get("role").and_then(Value::as_str) == Some("user")
        && item
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(|t| t == "message")
}

/// Content as a list of parts: a string is one `input_text` part.
fn parts(content: &Value) -> Value {
    match content {
        Value::String(s) => json!([{"type": "input_text", "text": s}]),
        other => other.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::dialect::anthropic::session_id::fingerprint as anthropic_fingerprint;
    use crate::dialect::naming::chat_fingerprint;
    use crate::session::IdSource;
    use std::collections::HashMap;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn key(pairs: &[(&str, &str)], body: &Map<String, Value>) -> Option<(String, KeyKind)> {
        let h: HashMap<&str, &str> = pairs.iter().copied().collect();
        client_key(
            |name| {
                h.get(name)
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
            },
            body,
        )
    }

    /// A first Codex turn (as captured from Codex 0.169, texts cut).
    fn codex_body() -> Map<String, Value> {
        obj(json!({
            "model": "gpt-5.1-codex",
            "instructions": "You are Codex, based on GPT-5.",
            "input": [
                {"type": "message", "role": "developer",
                 "content": [{"type": "input_text", "text": "<permissions instructions>"}]},
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "run echo hi"}]}
            ],
            "tools": [], "tool_choice": "auto", "parallel_tool_calls": false, "store": false,
            "stream": true, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "019a6f6e-cache"
        }))
    }

    #[test]
    fn codex_headers_then_prompt_cache_key() {
        let body = codex_body();
        assert_eq!(
            key(&[("session-id", "s1"), ("thread-id", "t1")], &body),
            Some(("s1".into(), KeyKind::AgentHeader))
        );
        assert_eq!(
            key(&[("session_id", "old"), ("thread-id", "t1")], &body),
            Some(("old".into(), KeyKind::AgentHeader))
        );
        assert_eq!(
            key(&[("thread-id", "t1")], &body),
            Some(("t1".into(), KeyKind::AgentHeader))
        );
        assert_eq!(
            key(&[("session-id", " "), ("thread_id", "t2")], &body),
            Some(("t2".into(), KeyKind::AgentHeader))
        );
        assert_eq!(
            key(&[], &body),
            Some(("019a6f6e-cache".into(), KeyKind::PromptCacheKey))
        );
        // chat's agent headers are not Responses' keys
        assert_eq!(
            key(&[("helicone-session-id", "h")], &body),
            Some(("019a6f6e-cache".into(), KeyKind::PromptCacheKey))
        );
        for none in [json!(""), json!("  "), json!(7), Value::Null] {
            let mut b = body.clone();
            b.insert(PROMPT_CACHE_KEY.into(), none.clone());
            assert_eq!(key(&[], &b), None, "{none}");
        }
        let mut b = body.clone();
        b.insert(PROMPT_CACHE_KEY.into(), json!(" k "));
        assert_eq!(key(&[], &b), Some(("k".into(), KeyKind::PromptCacheKey)));
    }

    #[test]
    fn fingerprint_follows_the_opening() {
        let first = codex_body();
        // a later turn: the history grew (reasoning, calls, outputs, answers), the model's date suffix came, the
        // first user message in its short form with ids
        let mut later = first.clone();
        later.insert("model".into(), json!("gpt-5.1-codex-2025-11-13"));
        later.insert(
            "input".into(),
            json!([
                {"type": "message", "role": "developer",
                 "content": [{"type": "input_text", "text": "<permissions instructions>"}]},
                {"role": "user", "content": "run echo hi"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "hi"},
                {"type": "message", "role": "assistant", "phase": "final_answer",
                 "content": [{"type": "output_text", "text": "done"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]}
            ]),
        );
        assert_eq!(fingerprint(&first), fingerprint(&later));
        let mut string_input = first.clone();
        string_input.insert("input".into(), json!("run echo hi"));
        assert_eq!(fingerprint(&first), fingerprint(&string_input));

        let mut other_user = first.clone();
        other_user["input"][1]["content"][0]["text"] = json!("write docs");
        assert_ne!(fingerprint(&first), fingerprint(&other_user));
        let mut other_instructions = first.clone();
        other_instructions.insert("instructions".into(), json!("You are someone else."));
        assert_ne!(fingerprint(&first), fingerprint(&other_instructions));
        let mut no_instructions = first.clone();
        no_instructions.remove("instructions");
        assert_ne!(fingerprint(&first), fingerprint(&no_instructions));
        let mut other_model = first.clone();
        other_model.insert("model".into(), json!("o3"));
        assert_ne!(fingerprint(&first), fingerprint(&other_model));
        // an item of another type with role user is no user message
        let mut not_a_message = first.clone();
        not_a_message["input"][1]["type"] = json!("item_reference");
        assert_ne!(fingerprint(&first), fingerprint(&not_a_message));
    }

    #[test]
    fn identify_keys_responses_sessions_by_header_then_codex_then_cache_key_then_fingerprint() {
        use crate::config::SessionConfig;
        use crate::dialect::Dialect;
        use crate::pipeline::identity::identify;
        use crate::session::TenantKey;
        let key = TenantKey::from_bytes([9; 32]).unwrap();
        let ident = |pairs: &[(&str, &str)], body: &Map<String, Value>| {
            let mut h = http::HeaderMap::new();
            for (k, v) in pairs {
                h.insert(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            identify(
                &h,
                &SessionConfig::default(),
                &key,
                Dialect::Responses,
                body,
            )
            .unwrap()
        };
        let body = codex_body();
        let auth = ("authorization", "Bearer sk-a");
        let sid = ("session-id", "019a-s");
        let mine = ident(&[auth, sid, ("x-session-id", "mine")], &body);
        assert!(mine.id.ends_with("-mine") && mine.source == IdSource::Header);
        let codex = ident(&[auth, sid, ("thread-id", "019a-t")], &body);
        assert!(codex.id.ends_with("-019a-s") && codex.source == IdSource::AgentHeader);
        assert_eq!(codex.dialect, "responses");
        let cache = ident(&[auth], &body);
        assert!(cache.id.ends_with("-019a6f6e-cache") && cache.source == IdSource::PromptCacheKey);
        let mut bare = body.clone();
        bare.remove(PROMPT_CACHE_KEY);
        let fp = ident(&[auth], &bare);
        assert_eq!(fp.source, IdSource::Fingerprint);
        assert!(fp.id.contains("-fp"));
        // the same key names the same session whether it came as a header or as the cache key
        assert_eq!(
            ident(&[auth, ("session-id", "019a6f6e-cache")], &bare).id,
            cache.id
        );
        // namespaced by tenant
        let other = ident(&[("authorization", "Bearer sk-b"), sid], &body);
        assert_ne!(other.id, codex.id);
        assert_ne!(ident(&[("authorization", "Bearer sk-b")], &bare).id, fp.id);
        // chat keeps its own keys: Codex's headers are not among them
        let chat = identify(
            &{
                let mut h = http::HeaderMap::new();
                h.insert("authorization", "Bearer sk-a".parse().unwrap());
                h.insert("session-id", "019a-s".parse().unwrap());
                h
            },
            &SessionConfig::default(),
            &key,
            Dialect::Chat,
            &body,
        )
        .unwrap();
        assert_eq!(chat.source, IdSource::Fingerprint);
    }

    #[test]
    fn the_same_opening_in_other_dialects_is_another_fingerprint() {
        let body = obj(
            json!({"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}],
                              "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_ne!(fingerprint(&body), chat_fingerprint(&body));
        assert_ne!(fingerprint(&body), anthropic_fingerprint(&body));
    }
}
