//! Which conversation a request belongs to: explicit header, well-known agent headers, or a fingerprint of its
//! opening; always namespaced by a SHA-256 of the caller's credential (the credential itself is never kept).

use http::HeaderMap;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Agent headers honoured after `[session] header`, in this order.
pub const AGENT_HEADERS: &[&str] = &[
    "helicone-session-id",
    "x-conversation-id",
    "session_id",
    "conversation_id",
];

/// A resolved session identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionIdentity {
    /// SHA-256 (hex) of the caller's Authorization header, or of the empty string when there is none.
    pub tenant: String,
    /// The public id: a short tenant prefix plus the client's id or a fingerprint; unique across tenants.
    pub id: String,
    /// How the id was found.
    pub source: IdSource,
}

/// Where a session id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// The configured session header.
    Header,
    /// One of [`AGENT_HEADERS`].
    AgentHeader,
    /// A hash of model family, system prompt and first user message.
    Fingerprint,
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The tenant hash of a request: SHA-256 of its Authorization header value.
pub fn tenant_hash(headers: &HeaderMap) -> String {
    let cred = headers
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    sha256_hex(cred)
}

/// Resolves the session of a chat request.
pub fn identify(
    headers: &HeaderMap,
    session_header: &str,
    body: &Map<String, Value>,
) -> SessionIdentity {
    let tenant = tenant_hash(headers);
    let prefix = &tenant[..16];
    let header_value = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    if let Some(v) = header_value(session_header) {
        return SessionIdentity {
            id: format!("{prefix}-{}", client_id_part(&v)),
            tenant,
            source: IdSource::Header,
        };
    }
    for h in AGENT_HEADERS {
        if let Some(v) = header_value(h) {
            return SessionIdentity {
                id: format!("{prefix}-{}", client_id_part(&v)),
                tenant,
                source: IdSource::AgentHeader,
            };
        }
    }
    SessionIdentity {
        id: format!("{prefix}-fp{}", &fingerprint(body)[..24]),
        tenant,
        source: IdSource::Fingerprint,
    }
}

/// The client's id as used in ours: kept as is when short and plain, hashed otherwise.
fn client_id_part(v: &str) -> String {
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

/// Hash of model family, the system message(s) and the first user message.
pub fn fingerprint(body: &Map<String, Value>) -> String {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let mut h = Sha256::new();
    h.update(model_family(model).as_bytes());
    h.update([0]);
    if let Some(msgs) = body.get("messages").and_then(Value::as_array) {
        for m in msgs {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("");
            if role == "system" || role == "developer" {
                h.update(canonical_json(m.get("content").unwrap_or(&Value::Null)).as_bytes());
                h.update([1]);
            } else if role == "user" {
                h.update(canonical_json(m.get("content").unwrap_or(&Value::Null)).as_bytes());
                break;
            }
        }
    }
    hex::encode(h.finalize())
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
    fn tenants_never_share_ids() {
        let body = json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
            .as_object()
            .cloned()
            .unwrap();
        let a = identify(
            &headers(&[("authorization", "Bearer a"), ("x-session-id", "s1")]),
            "x-session-id",
            &body,
        );
        let b = identify(
            &headers(&[("authorization", "Bearer b"), ("x-session-id", "s1")]),
            "x-session-id",
            &body,
        );
        assert_ne!(a.id, b.id);
        assert!(a.id.ends_with("-s1") && a.source == IdSource::Header);
        let fa = identify(
            &headers(&[("authorization", "Bearer a")]),
            "x-session-id",
            &body,
        );
        let fb = identify(
            &headers(&[("authorization", "Bearer b")]),
            "x-session-id",
            &body,
        );
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
        assert_eq!(
            identify(&h, "x-session-id", &body).id,
            identify(&h, "x-session-id", &later).id
        );
        let other = json!({"model":"gpt-4o","messages":[{"role":"system","content":"s"},{"role":"user","content":"other"}]}).as_object().cloned().unwrap();
        assert_ne!(
            identify(&h, "x-session-id", &body).id,
            identify(&h, "x-session-id", &other).id
        );
        let agent = identify(
            &headers(&[("helicone-session-id", "abc")]),
            "x-session-id",
            &body,
        );
        assert_eq!(agent.source, IdSource::AgentHeader);
        let both = identify(
            &headers(&[("helicone-session-id", "abc"), ("x-session-id", "x")]),
            "x-session-id",
            &body,
        );
        assert!(both.id.ends_with("-x"));
        let weird = identify(
            &headers(&[("x-session-id", "a b/c")]),
            "x-session-id",
            &body,
        );
        assert!(!weird.id.contains(' ') && !weird.id.contains('/'));
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
