//! Which conversation a request belongs to: explicit header, well-known agent headers, or a fingerprint of its
//! opening; always namespaced by the caller's tenant, a keyed hash of its credentials (see [`super::tenant`]).

use super::tenant::{TenantKey, ANONYMOUS};
use super::{anthropic_id, responses_id};
use crate::config::SessionConfig;
use crate::dialect::Dialect;
use http::HeaderMap;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Agent headers honoured after `[session] header` in chat requests, in this order.
pub const AGENT_HEADERS: &[&str] = &[
    "helicone-session-id",
    "x-conversation-id",
    "session_id",
    "conversation_id",
];

/// A resolved session identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionIdentity {
    /// The caller's tenant: HMAC-SHA256 (hex) of its credential headers, or [`ANONYMOUS`].
    pub tenant: String,
    /// The public id: a short tenant prefix plus the client's id or a fingerprint; unique across tenants.
    pub id: String,
    /// How the id was found.
    pub source: IdSource,
    /// The wire format of the request.
    pub dialect: Dialect,
}

/// Where a session id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// The configured session header.
    Header,
    /// A client's own session header: one of [`AGENT_HEADERS`] (chat), `x-claude-code-session-id` (Anthropic) or
    /// one of [`super::responses_id::SESSION_HEADERS`] (Responses: Codex's `session-id`, `thread-id`).
    AgentHeader,
    /// The `session_id` inside an Anthropic request's `metadata.user_id` (Claude Code).
    Metadata,
    /// The body's `prompt_cache_key` (Responses).
    PromptCacheKey,
    /// A hash of model family, system prompt(s) and first user message.
    Fingerprint,
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The prefix of a tenant's session ids: 16 hex digits of its hash, or the whole [`ANONYMOUS`].
fn id_prefix(tenant: &str) -> &str {
    tenant.get(..16).unwrap_or(tenant)
}

/// Resolves the session of a request in `dialect`. `None`: the request is proxied without history (an anonymous
/// caller without a session header while `[session] anonymous_fingerprint` is off).
///
/// The id comes from, in this order: the configured `[session] header`; the dialect's own keys (chat: one of
/// [`AGENT_HEADERS`]; Anthropic: `x-claude-code-session-id`, then the `session_id` inside `metadata.user_id`, see
/// [`super::anthropic_id`]; Responses: Codex's `session-id`/`thread-id` headers, then `prompt_cache_key`, see
/// [`super::responses_id`]); else a fingerprint of the conversation's opening ([`fingerprint`] for chat,
/// [`super::anthropic_id::fingerprint`] for Anthropic, [`super::responses_id::fingerprint`] for Responses).
/// Always namespaced by the caller's tenant.
pub fn identify(
    headers: &HeaderMap,
    cfg: &SessionConfig,
    key: &TenantKey,
    dialect: Dialect,
    body: &Map<String, Value>,
) -> Option<SessionIdentity> {
    let tenant = key.tenant(headers);
    let prefix = id_prefix(&tenant);
    let header_value = |name: &str| headers.get(name).and_then(header_text);
    let named = |v: String, source: IdSource| SessionIdentity {
        id: scoped_id(prefix, &v),
        tenant: tenant.clone(),
        source,
        dialect,
    };
    if let Some(v) = header_value(&cfg.header) {
        return Some(named(v, IdSource::Header));
    }
    let client_key = match dialect {
        Dialect::Chat => AGENT_HEADERS
            .iter()
            .find_map(|h| header_value(h))
            .map(|v| (v, IdSource::AgentHeader)),
        Dialect::Anthropic => header_value(anthropic_id::CLAUDE_CODE_SESSION_HEADER)
            .map(|v| (v, IdSource::AgentHeader))
            .or_else(|| anthropic_id::metadata_session(body).map(|v| (v, IdSource::Metadata))),
        Dialect::Responses => responses_id::client_key(header_value, body),
    };
    if let Some((v, source)) = client_key {
        return Some(named(v, source));
    }
    if tenant == ANONYMOUS && !cfg.anonymous_fingerprint {
        return None;
    }
    let fp = match dialect {
        Dialect::Chat => fingerprint(body),
        Dialect::Anthropic => anthropic_id::fingerprint(body),
        Dialect::Responses => responses_id::fingerprint(body),
    };
    Some(SessionIdentity {
        id: format!("{prefix}-fp{}", &fp[..24]),
        tenant,
        source: IdSource::Fingerprint,
        dialect,
    })
}

/// A session header's value as text, trimmed; `None` when blank. Values beyond visible ASCII are kept, not
/// dropped: UTF-8 as it is (`client_id_part` hashes it into the id's safe form), other bytes by their hex, so that
/// two different values always name two different sessions.
fn header_text(v: &http::HeaderValue) -> Option<String> {
    let text = match std::str::from_utf8(v.as_bytes()) {
        Ok(s) => s.trim().to_string(),
        Err(_) => format!("\u{0}bytes:{}", hex::encode(v.as_bytes())),
    };
    (!text.is_empty()).then_some(text)
}

/// The session id for the client's id `v`: `<prefix>-<id>`. An id that already carries this tenant's prefix (our
/// own `x-ctxgate-session` sent back) is a fixed point; any other (another tenant's prefix included) is prefixed,
/// so nobody can name a session of another tenant.
fn scoped_id(prefix: &str, v: &str) -> String {
    let own = v
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
        .filter(|rest| !rest.is_empty());
    format!("{prefix}-{}", client_id_part(own.unwrap_or(v)))
}

/// The client's id as used in ours: kept as is when short and plain, hashed otherwise.
pub fn client_id_part(v: &str) -> String {
    let plain = v.len() <= 96
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if plain {
        v.to_string()
    } else {
        format!("h{}", &sha256_hex(v.as_bytes())[..24])
    }
}

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

/// Hash of model family, the system message(s) and the first user message. Remembered per opening
/// ([`super::opening_memo`]): an agent sends the same one with every request.
pub fn fingerprint(body: &Map<String, Value>) -> String {
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

/// JSON with object keys sorted, so equal values give equal text whatever the key order.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write_canonical(&m[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> SessionConfig {
        SessionConfig::default()
    }

    /// `identify` under a fixed key and the default config.
    fn ident(h: &HeaderMap, body: &Map<String, Value>) -> SessionIdentity {
        identify(
            h,
            &cfg(),
            &TenantKey::from_bytes([9; 32]).unwrap(),
            Dialect::Chat,
            body,
        )
        .unwrap()
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

    #[test]
    fn non_ascii_session_ids_are_kept_apart() {
        let body = json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
            .as_object()
            .cloned()
            .unwrap();
        let with = |name: &str, value: &[u8]| {
            let mut h = headers(&[("authorization", "Bearer a")]);
            h.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
            ident(&h, &body)
        };
        let one = with("x-session-id", "ä€😀-one".as_bytes());
        let two = with("x-session-id", "ä€😀-two".as_bytes());
        assert_eq!(one.source, IdSource::Header);
        assert_ne!(one.id, two.id, "two different ids stay two sessions");
        assert_eq!(one, with("x-session-id", "ä€😀-one".as_bytes()), "stable");
        // Not UTF-8 at all: still a session of its own, by its bytes.
        let raw_a = with("x-session-id", &[0xff, 0xfe, b'a']);
        let raw_b = with("x-session-id", &[0xff, 0xfe, b'b']);
        assert_eq!(raw_a.source, IdSource::Header);
        assert_ne!(raw_a.id, raw_b.id);
        // The id's safe form: plain ASCII, whatever was sent.
        for i in [&one, &two, &raw_a] {
            assert!(
                i.id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                "{}",
                i.id
            );
        }
        // A client's own session header too (Codex's `session-id` in a Responses request).
        let body = json!({"model":"gpt-5","input":"hi"})
            .as_object()
            .cloned()
            .unwrap();
        let key = TenantKey::from_bytes([9; 32]).unwrap();
        let mut h = headers(&[("authorization", "Bearer a")]);
        h.insert(
            "session-id",
            http::HeaderValue::from_bytes("ä€😀-one".as_bytes()).unwrap(),
        );
        let r1 = identify(&h, &cfg(), &key, Dialect::Responses, &body).unwrap();
        h.insert(
            "session-id",
            http::HeaderValue::from_bytes("ä€😀-two".as_bytes()).unwrap(),
        );
        let r2 = identify(&h, &cfg(), &key, Dialect::Responses, &body).unwrap();
        assert_eq!(r1.source, IdSource::AgentHeader);
        assert_ne!(r1.id, r2.id);
    }

    #[test]
    fn tenants_never_share_ids() {
        let body = json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
            .as_object()
            .cloned()
            .unwrap();
        let a = ident(
            &headers(&[("authorization", "Bearer a"), ("x-session-id", "s1")]),
            &body,
        );
        let b = ident(
            &headers(&[("authorization", "Bearer b"), ("x-session-id", "s1")]),
            &body,
        );
        assert_ne!(a.id, b.id);
        assert!(a.id.ends_with("-s1") && a.source == IdSource::Header);
        let fa = ident(&headers(&[("authorization", "Bearer a")]), &body);
        let fb = ident(&headers(&[("authorization", "Bearer b")]), &body);
        assert_ne!(fa.id, fb.id);
        assert_eq!(fa.source, IdSource::Fingerprint);
        assert!(!a.id.contains("Bearer") && !a.tenant.contains("Bearer"));
    }

    #[test]
    fn precedence_and_fingerprint_stability() {
        let body = json!({"model":"gpt-4o-2024-08-06","messages":[
            {"role":"system","content":"s"},{"role":"user","content":"q"}]})
        .as_object()
        .cloned()
        .unwrap();
        let later = json!({"model":"gpt-4o","messages":[
            {"role":"system","content":"s"},{"role":"user","content":"q"},
            {"role":"assistant","content":"a"},{"role":"user","content":"q2"}]})
        .as_object()
        .cloned()
        .unwrap();
        let h = headers(&[]);
        assert_eq!(ident(&h, &body).id, ident(&h, &later).id);
        let other = json!({"model":"gpt-4o","messages":[{"role":"system","content":"s"},{"role":"user","content":"other"}]}).as_object().cloned().unwrap();
        assert_ne!(ident(&h, &body).id, ident(&h, &other).id);
        let agent = ident(&headers(&[("helicone-session-id", "abc")]), &body);
        assert_eq!(agent.source, IdSource::AgentHeader);
        let both = ident(
            &headers(&[("helicone-session-id", "abc"), ("x-session-id", "x")]),
            &body,
        );
        assert!(both.id.ends_with("-x"));
        let weird = ident(&headers(&[("x-session-id", "a b/c")]), &body);
        assert!(!weird.id.contains(' ') && !weird.id.contains('/'));
    }

    #[test]
    fn every_credential_header_separates_tenants() {
        let body = json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
            .as_object()
            .cloned()
            .unwrap();
        for name in ["x-api-key", "api-key", "x-goog-api-key"] {
            let a = ident(&headers(&[(name, "key-a"), ("x-session-id", "s1")]), &body);
            let b = ident(&headers(&[(name, "key-b"), ("x-session-id", "s1")]), &body);
            assert_ne!(a.id, b.id, "{name}: same session id, other key");
            assert_ne!(a.tenant, b.tenant, "{name}");
            let fa = ident(&headers(&[(name, "key-a")]), &body);
            let fb = ident(&headers(&[(name, "key-b")]), &body);
            assert_ne!(fa.id, fb.id, "{name}: same fingerprint, other key");
            let again = ident(&headers(&[(name, "key-a"), ("x-session-id", "s1")]), &body);
            assert_eq!(a, again, "{name}: same key, same session");
        }
    }

    #[test]
    fn anonymous_callers_and_their_fingerprints() {
        let body = json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
            .as_object()
            .cloned()
            .unwrap();
        let key = TenantKey::from_bytes([9; 32]).unwrap();
        let anon = ident(&headers(&[]), &body);
        assert_eq!(anon.tenant, ANONYMOUS);
        assert_eq!(anon.source, IdSource::Fingerprint);
        assert!(anon.id.starts_with("anonymous-fp"), "{}", anon.id);
        let off = SessionConfig {
            anonymous_fingerprint: false,
            ..SessionConfig::default()
        };
        assert_eq!(
            identify(&headers(&[]), &off, &key, Dialect::Chat, &body),
            None
        );
        let named = identify(
            &headers(&[("x-session-id", "s1")]),
            &off,
            &key,
            Dialect::Chat,
            &body,
        )
        .unwrap();
        assert_eq!(named.id, "anonymous-s1");
        // callers with a credential keep their fingerprints
        let keyed = identify(
            &headers(&[("x-api-key", "k")]),
            &off,
            &key,
            Dialect::Chat,
            &body,
        )
        .unwrap();
        assert_eq!(keyed.source, IdSource::Fingerprint);
    }

    #[test]
    fn our_own_id_sent_back_is_a_fixed_point() {
        let body = json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
            .as_object()
            .cloned()
            .unwrap();
        for creds in [
            &[("authorization", "Bearer a")][..],
            &[("x-api-key", "k")],
            &[],
        ] {
            let with = |sid: &str| {
                let mut pairs = creds.to_vec();
                pairs.push(("x-session-id", sid));
                ident(&headers(&pairs), &body)
            };
            let fp = ident(&headers(creds), &body).id;
            for first in [with("conv-1").id, with("a b/c").id, fp] {
                let again = with(&first);
                assert_eq!(again.id, first, "sent back as x-session-id");
                assert_eq!(with(&again.id).id, first);
            }
        }
        // another tenant's id is only a name inside ours
        let a = with_auth("Bearer a", "conv-1", &body);
        let b = with_auth("Bearer b", &a.id, &body);
        assert_ne!(b.id, a.id);
        assert!(b.id.ends_with(&a.id) && b.id.starts_with(&b.tenant[..16]));
        let anon = ident(&headers(&[("x-session-id", &a.id)]), &body);
        assert_eq!(anon.id, format!("anonymous-{}", a.id));
        let into_anon = with_auth("Bearer a", "anonymous-conv-1", &body);
        assert_ne!(into_anon.id, "anonymous-conv-1");
    }

    fn with_auth(auth: &str, sid: &str, body: &Map<String, Value>) -> SessionIdentity {
        ident(
            &headers(&[("authorization", auth), ("x-session-id", sid)]),
            body,
        )
    }

    #[test]
    fn families_and_canonical_json() {
        assert_eq!(model_family("gpt-4o-2024-08-06"), "gpt-4o");
        assert_eq!(model_family("GPT-4.1"), "gpt-4.1");
        assert_eq!(model_family("o3-mini"), "o3-mini");
        assert_eq!(
            canonical_json(&json!({"b":1,"a":[{"d":2,"c":3}]})),
            r#"{"a":[{"c":3,"d":2}],"b":1}"#
        );
    }
}
