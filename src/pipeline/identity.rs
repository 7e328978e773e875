//! The session a request belongs to: its dialect reads how the request names its conversation, `session/` scopes
//! that by tenant (neither knows the other).

use crate::config::SessionConfig;
use crate::dialect::naming::KeyKind;
use crate::dialect::Dialect;
use crate::session::{IdSource, Naming, SessionIdentity, TenantKey};
use http::HeaderMap;
use serde_json::{Map, Value};

/// Resolves the session of a request in `dialect` ([`crate::session::identify`], with the dialect's own keys and
/// fingerprint).
pub fn identify(
    headers: &HeaderMap,
    cfg: &SessionConfig,
    key: &TenantKey,
    dialect: Dialect,
    body: &Map<String, Value>,
) -> Option<SessionIdentity> {
    let naming = Naming {
        dialect: dialect.as_str(),
        client_key: |header: &dyn Fn(&str) -> Option<String>| {
            dialect
                .client_key(header, body)
                .map(|(id, kind)| (id, source(kind)))
        },
        fingerprint: || dialect.fingerprint(body),
    };
    crate::session::identify(headers, cfg, key, naming)
}

fn source(kind: KeyKind) -> IdSource {
    match kind {
        KeyKind::AgentHeader => IdSource::AgentHeader,
        KeyKind::Metadata => IdSource::Metadata,
        KeyKind::PromptCacheKey => IdSource::PromptCacheKey,
    }
}
