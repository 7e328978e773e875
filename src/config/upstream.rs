//! `[upstream]`: the OpenAI-compatible API requests are forwarded to, its key and timeouts.

use super::checks::{is_bearer_credential, is_http_url};
use serde::{Deserialize, Serialize};

/// `[upstream]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Base URL of the OpenAI-compatible API; `/v1/<rest>` is forwarded to `<base_url>/<rest>`.
    pub base_url: String,
    /// API key sent as `Authorization: Bearer …` only when the client sends no Authorization header.
    pub api_key: Option<String>,
    /// Seconds to wait for the upstream's response headers, and at most between two body chunks.
    pub timeout_secs: u64,
    /// Seconds to wait for a TCP/TLS connection to the upstream.
    pub connect_timeout_secs: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            timeout_secs: 600,
            connect_timeout_secs: 10,
        }
    }
}

impl UpstreamConfig {
    /// The problems of these settings, as `upstream.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if !is_http_url(&self.base_url) {
            e.push(format!(
                "upstream.base_url: {:?} is not an http(s) URL",
                self.base_url
            ));
        }
        if self.timeout_secs == 0 {
            e.push("upstream.timeout_secs: must be greater than 0".into());
        }
        if self.connect_timeout_secs == 0 {
            e.push("upstream.connect_timeout_secs: must be greater than 0".into());
        }
        if self
            .api_key
            .as_deref()
            .is_some_and(|k| !is_bearer_credential(k))
        {
            e.push("upstream.api_key: must be a non-empty printable string".into());
        }
    }
}
