//! `[anthropic]`: the Anthropic Messages API that Anthropic requests are forwarded to, and its key.

use super::checks::is_http_url;
use serde::{Deserialize, Serialize};

/// `[anthropic]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AnthropicConfig {
    /// Base URL of the Anthropic Messages API; `/v1/<rest>` of an Anthropic request (`/v1/messages…`, or any
    /// request carrying an `anthropic-version` header) is forwarded to `<base_url>/<rest>`. Timeouts are
    /// `[upstream]`'s.
    pub base_url: String,
    /// API key sent as `x-api-key` only when the client sends no credential (neither `x-api-key` nor
    /// `Authorization`).
    pub api_key: Option<String>,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.anthropic.com/v1".into(),
            api_key: None,
        }
    }
}

impl AnthropicConfig {
    /// The problems of these settings, as `anthropic.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if !is_http_url(&self.base_url) {
            e.push(format!(
                "anthropic.base_url: {:?} is not an http(s) URL",
                self.base_url
            ));
        }
        if let Some(k) = &self.api_key {
            if k.trim().is_empty() || http::HeaderValue::from_str(k).is_err() {
                e.push("anthropic.api_key: must be a non-empty printable string".into());
            }
        }
    }
}
