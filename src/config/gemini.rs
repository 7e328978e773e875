//! `[gemini]`: the Gemini API that Gemini requests (`/v1beta/models/…`, `/v1/models/{model}:{method}`) are
//! forwarded to, and its key.

use super::checks::is_http_url;
use serde::{Deserialize, Serialize};

/// `[gemini]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GeminiConfig {
    /// Base URL of the Gemini API, without its version: a Gemini request to `/<version>/<rest>` (`/v1beta/models/
    /// gemini-2.5-pro:streamGenerateContent`, `/v1/models/…:generateContent`, any other `/v1beta/…`, or a
    /// `/v1/…` request carrying `x-goog-api-key`) is forwarded to `<base_url>/<version>/<rest>`, its query (`alt`,
    /// `key`) as sent. Timeouts are `[upstream]`'s.
    pub base_url: String,
    /// API key sent as `x-goog-api-key` only when the client sends no credential (neither `x-goog-api-key`, nor
    /// `Authorization`, nor a `key` query parameter).
    pub api_key: Option<String>,
}

impl Default for GeminiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://generativelanguage.googleapis.com".into(),
            api_key: None,
        }
    }
}

impl GeminiConfig {
    /// The problems of these settings, as `gemini.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if !is_http_url(&self.base_url) {
            e.push(format!(
                "gemini.base_url: {:?} is not an http(s) URL",
                self.base_url
            ));
        }
        if let Some(k) = &self.api_key {
            if k.trim().is_empty() || http::HeaderValue::from_str(k).is_err() {
                e.push("gemini.api_key: must be a non-empty printable string".into());
            }
        }
    }
}
