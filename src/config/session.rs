//! `[session]`: how conversations are identified (the explicit header, fingerprints for anonymous callers).

use serde::{Deserialize, Serialize};

/// `[session]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Request header that names the conversation explicitly.
    pub header: String,
    /// Identify conversations by a fingerprint of their opening also for callers that send no credential header
    /// (the "anonymous" tenant, e.g. clients of a gateway that adds `upstream.api_key` for them). Such callers
    /// share one namespace: two of them opening with the same system prompt and first message share a session.
    /// `false`: anonymous requests without a session header are proxied without history.
    pub anonymous_fingerprint: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            header: "x-session-id".into(),
            anonymous_fingerprint: true,
        }
    }
}

impl SessionConfig {
    /// The problems of these settings, as `session.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if http::HeaderName::from_bytes(self.header.as_bytes()).is_err() {
            e.push(format!(
                "session.header: {:?} is not a valid header name",
                self.header
            ));
        }
    }
}
