//! Where an Anthropic Messages request names its conversation: Claude Code's session header, the `session_id`
//! inside `metadata.user_id`, or a fingerprint of its opening (top-level `system` and first user message).

use crate::dialect::naming::model_family;
use crate::message::canonical_json;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Claude Code's session header: one uuid per process, sent with every request.
pub const CLAUDE_CODE_SESSION_HEADER: &str = "x-claude-code-session-id";

/// The session id a client put in `metadata.user_id`, if any. Claude Code sends a JSON string
/// `{"device_id":…,"account_uuid":…,"session_id":…}`; older versions sent `user_<hash>_account_<uuid>_session_<uuid>`.
/// Any other user id (a plain end-user name) names no session: `None`.
pub fn metadata_session(body: &Map<String, Value>) -> Option<String> {
    let user_id = body.get("metadata")?.get("user_id")?.as_str()?.trim();
    let id = if user_id.starts_with('{') {
        let v: Value = serde_json::from_str(user_id).ok()?;
        v.get("session_id")?.as_str()?.trim().to_string()
    } else {
        let rest = user_id.strip_prefix("user_")?;
        let (account, session) = rest.rsplit_once("_session_")?;
        if !account.contains("_account_") && !account.starts_with("account_") {
            return None;
        }
        session.trim().to_string()
    };
    (!id.is_empty()).then_some(id)
}

/// Hash of the model family, the top-level `system` and the first user message of an Anthropic request. Content is
/// compared as blocks without their `cache_control` (Claude Code moves its breakpoint every turn), and a string
/// is the same as one text block. Distinct from every chat fingerprint: the hash opens with the dialect's name.
pub fn fingerprint(body: &Map<String, Value>) -> String {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let mut h = Sha256::new();
    h.update(b"anthropic\0");
    h.update(model_family(model).as_bytes());
    h.update([0]);
    if let Some(system) = body.get("system") {
        h.update(canonical_json(&blocks(system)).as_bytes());
    }
    h.update([1]);
    let first_user = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|msgs| {
            msgs.iter()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        });
    if let Some(m) = first_user {
        h.update(canonical_json(&blocks(m.get("content").unwrap_or(&Value::Null))).as_bytes());
    }
    hex::encode(h.finalize())
}

/// Content as a list of blocks without `cache_control`: a string is one text block.
fn blocks(content: &Value) -> Value {
    match content {
        Value::String(s) => serde_json::json!([{"type": "text", "text": s}]),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|b| match b {
                    Value::Object(o) => Value::Object(
                        o.iter()
                            .filter(|(k, _)| k.as_str() != "cache_control")
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    ),
                    other => other.clone(),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::SessionConfig;
    use crate::dialect::Dialect;
    use crate::pipeline::identity::identify;
    use crate::session::TenantKey;
    use crate::session::{IdSource, SessionIdentity};
    use http::HeaderMap;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn ident(
        dialect: Dialect,
        pairs: &[(&str, &str)],
        body: &Map<String, Value>,
    ) -> SessionIdentity {
        let key = TenantKey::from_bytes([9; 32]).unwrap();
        identify(
            &headers(pairs),
            &SessionConfig::default(),
            &key,
            dialect,
            body,
        )
        .unwrap()
    }

    const USER_ID: &str = r#"{"device_id":"d1","account_uuid":"a1","session_id":"5e55-1"}"#;

    fn claude_body(user_id: &str) -> Map<String, Value> {
        obj(json!({
            "model": "claude-sonnet-4-5-20250929",
            "max_tokens": 32000,
            "system": [{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.330"},
                       {"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
            "messages": [{"role":"user","content":[{"type":"text","text":"fix the bug"}]}],
            "metadata": {"user_id": user_id}
        }))
    }

    #[test]
    fn metadata_user_id_in_both_forms() {
        assert_eq!(
            metadata_session(&claude_body(USER_ID)).as_deref(),
            Some("5e55-1")
        );
        let old = "user_0123abcd_account_7f1e-aa_session_9c2d-bb";
        assert_eq!(
            metadata_session(&claude_body(old)).as_deref(),
            Some("9c2d-bb")
        );
        let no_account = "user_0123abcd_account__session_9c2d-bb";
        assert_eq!(
            metadata_session(&claude_body(no_account)).as_deref(),
            Some("9c2d-bb")
        );
        for none in [
            "alice",
            "user_alice",
            "user_x_session_y",
            r#"{"device_id":"d1"}"#,
            r#"{"session_id":""}"#,
            r#"{"session_id":7}"#,
            "{not json",
            "user_h_account_a_session_",
        ] {
            assert_eq!(metadata_session(&claude_body(none)), None, "{none}");
        }
        let mut not_a_string = claude_body(USER_ID);
        not_a_string.insert("metadata".into(), json!({"user_id": {"session_id": "s"}}));
        assert_eq!(metadata_session(&not_a_string), None);
    }

    #[test]
    fn precedence_header_then_claude_code_header_then_metadata_then_fingerprint() {
        let body = claude_body(USER_ID);
        let auth = ("x-api-key", "sk-ant-1");
        let cc = ("x-claude-code-session-id", "cc-uuid");
        let all = ident(
            Dialect::Anthropic,
            &[auth, cc, ("x-session-id", "mine")],
            &body,
        );
        assert!(all.id.ends_with("-mine") && all.source == IdSource::Header);
        let header = ident(Dialect::Anthropic, &[auth, cc], &body);
        assert!(header.id.ends_with("-cc-uuid") && header.source == IdSource::AgentHeader);
        let meta = ident(Dialect::Anthropic, &[auth], &body);
        assert!(meta.id.ends_with("-5e55-1") && meta.source == IdSource::Metadata);
        assert_eq!(meta.tenant, header.tenant);
        // the same uuid in the header or in the metadata names the same session
        let same = ident(
            Dialect::Anthropic,
            &[auth, ("x-claude-code-session-id", "5e55-1")],
            &body,
        );
        assert_eq!(same.id, meta.id);
        let fp = ident(Dialect::Anthropic, &[auth], &claude_body("alice"));
        assert_eq!(fp.source, IdSource::Fingerprint);
        assert!(fp.id.contains("-fp"));
        // chat ignores the Anthropic keys; Anthropic ignores chat's agent headers
        let chat = ident(Dialect::Chat, &[auth, cc], &body);
        assert_eq!(chat.source, IdSource::Fingerprint);
        let helicone = ident(
            Dialect::Anthropic,
            &[auth, ("helicone-session-id", "h")],
            &claude_body("alice"),
        );
        assert_eq!(helicone.id, fp.id);
        // namespaced by tenant
        let other = ident(Dialect::Anthropic, &[("x-api-key", "sk-ant-2"), cc], &body);
        assert_ne!(other.id, header.id);
        let other_meta = ident(Dialect::Anthropic, &[("x-api-key", "sk-ant-2")], &body);
        assert_ne!(other_meta.id, meta.id);
    }

    #[test]
    fn fingerprint_follows_the_opening_not_the_breakpoints() {
        let first = claude_body("alice");
        let mut later = first.clone();
        // turn 2: the date suffix differs, the breakpoint moved off the first user block, the history grew, the
        // first user message's string form
        later.insert("model".into(), json!("claude-sonnet-4-5"));
        later.insert(
            "messages".into(),
            json!([
                {"role":"user","content":"fix the bug"},
                {"role":"assistant","content":[{"type":"text","text":"done"}]},
                {"role":"user","content":[{"type":"text","text":"thanks","cache_control":{"type":"ephemeral"}}]}
            ]),
        );
        assert_eq!(fingerprint(&first), fingerprint(&later));
        let mut first_cached = first.clone();
        first_cached["messages"][0]["content"][0]["cache_control"] = json!({"type":"ephemeral"});
        assert_eq!(fingerprint(&first), fingerprint(&first_cached));

        let mut other_system = first.clone();
        other_system["system"][1]["text"] = json!("You are someone else.");
        assert_ne!(fingerprint(&first), fingerprint(&other_system));
        let mut other_user = first.clone();
        other_user["messages"][0]["content"][0]["text"] = json!("write docs");
        assert_ne!(fingerprint(&first), fingerprint(&other_user));
        let mut other_model = first.clone();
        other_model.insert("model".into(), json!("claude-haiku-4-5-20251001"));
        assert_ne!(fingerprint(&first), fingerprint(&other_model));
        let mut string_system = first.clone();
        string_system.insert("system".into(), json!("You are Claude Code."));
        let mut block_system = first.clone();
        block_system.insert(
            "system".into(),
            json!([{"type":"text","text":"You are Claude Code."}]),
        );
        assert_eq!(fingerprint(&string_system), fingerprint(&block_system));
        assert_ne!(fingerprint(&string_system), fingerprint(&first));
        let mut no_system = first.clone();
        no_system.remove("system");
        assert_ne!(fingerprint(&no_system), fingerprint(&first));
    }

    #[test]
    fn same_opening_in_two_dialects_is_two_sessions() {
        let body =
            obj(json!({"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}));
        let auth = [("x-api-key", "k")];
        let chat = ident(Dialect::Chat, &auth, &body);
        let anthropic = ident(Dialect::Anthropic, &auth, &body);
        assert_eq!(chat.source, IdSource::Fingerprint);
        assert_eq!(anthropic.source, IdSource::Fingerprint);
        assert_ne!(chat.id, anthropic.id);
    }
}
