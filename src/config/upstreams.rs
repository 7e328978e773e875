//! `[upstreams.<name>]`: named upstreams that `[models."<pattern>"] upstream = "<name>"` routes a model's
//! conversation requests to, beside the default `[upstream]` / `[anthropic]`.

use super::checks::{is_bearer_credential, is_http_url};
use super::{ModelEntry, UpstreamConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API an `[upstreams.<name>]` speaks: a request's dialect must be one of its kind's.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    /// An OpenAI-compatible API (OpenAI, vLLM, llama.cpp, Ollama, …): chat completions and Responses requests.
    #[default]
    Openai,
    /// The Anthropic Messages API: Messages requests (and `count_tokens`).
    Anthropic,
    /// The Gemini API: `generateContent` and `streamGenerateContent` requests (and `countTokens`); its base URL
    /// without the API version.
    Gemini,
}

impl UpstreamKind {
    /// The kind's name as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamKind::Openai => "openai",
            UpstreamKind::Anthropic => "anthropic",
            UpstreamKind::Gemini => "gemini",
        }
    }
}

/// `[upstreams.<name>]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NamedUpstream {
    /// Base URL of the API (required); a routed request to `/v1/<rest>` goes to `<base_url>/<rest>`.
    pub base_url: String,
    /// `openai` (chat completions and Responses requests; the default), `anthropic` (Messages requests) or
    /// `gemini` (Gemini API requests; the base URL without its version). A
    /// request of another dialect for a model routed here is refused with 400 (ctxgate does not translate between
    /// APIs).
    pub kind: UpstreamKind,
    /// API key sent in place of the client's own credential (its `Authorization` and `x-api-key` are dropped):
    /// as `Authorization: Bearer …` for `openai`, as `x-api-key` for `anthropic`, as `x-goog-api-key` for
    /// `gemini` (the client's `x-goog-api-key` and `key` query parameter dropped too). Unset: the client's
    /// credentials pass through. A secret: masked in `check-config` and never logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Seconds to wait for the response headers, and at most between two body chunks. Unset: `[upstream]`'s
    /// `timeout_secs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Seconds to wait for a TCP/TLS connection. Unset: `[upstream]`'s `connect_timeout_secs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
}

/// The names the default upstreams are known by (metrics, traces): `[upstream]`, `[anthropic]` and `[gemini]`. A named
/// upstream may not take them.
pub const DEFAULT_NAMES: [&str; 3] = ["default", "anthropic", "gemini"];

/// The longest name an upstream may have (it is a metric label value).
const MAX_NAME_LEN: usize = 64;

impl NamedUpstream {
    /// Its response timeout: its own, else `[upstream]`'s.
    pub fn timeout_secs(&self, default: &UpstreamConfig) -> u64 {
        self.timeout_secs.unwrap_or(default.timeout_secs)
    }

    /// Its connect timeout: its own, else `[upstream]`'s.
    pub fn connect_timeout_secs(&self, default: &UpstreamConfig) -> u64 {
        self.connect_timeout_secs
            .unwrap_or(default.connect_timeout_secs)
    }
}

/// The problems of the named upstreams and of the routes to them, as `upstreams.<name>.<key>: …` and
/// `models."<pattern>".upstream: …` lines.
pub fn problems(
    upstreams: &BTreeMap<String, NamedUpstream>,
    models: &BTreeMap<String, ModelEntry>,
    e: &mut Vec<String>,
) {
    for (name, u) in upstreams {
        let path = format!("upstreams.{name}");
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            e.push(format!(
                "{path}: an upstream's name is 1 to {MAX_NAME_LEN} letters, digits, '-', '_' or '.'"
            ));
        }
        if DEFAULT_NAMES.contains(&name.as_str()) {
            e.push(format!(
                "{path}: {name:?} is the name of a default upstream ([upstream] is \"default\", [anthropic] is \
                 \"anthropic\", [gemini] is \"gemini\"); choose another name"
            ));
        }
        if u.base_url.is_empty() {
            e.push(format!("{path}.base_url: required (the API's base URL)"));
        } else if !is_http_url(&u.base_url) {
            e.push(format!(
                "{path}.base_url: {:?} is not an http(s) URL",
                u.base_url
            ));
        } else if u.base_url.contains('?') {
            e.push(format!(
                "{path}.base_url: must not carry a query (put the key in api_key)"
            ));
        }
        if u.timeout_secs == Some(0) {
            e.push(format!("{path}.timeout_secs: must be greater than 0"));
        }
        if u.connect_timeout_secs == Some(0) {
            e.push(format!(
                "{path}.connect_timeout_secs: must be greater than 0"
            ));
        }
        if u.api_key
            .as_deref()
            .is_some_and(|k| !is_bearer_credential(k))
        {
            e.push(format!(
                "{path}.api_key: must be a non-empty printable string"
            ));
        }
    }
    for (pattern, m) in models {
        let Some(name) = &m.upstream else { continue };
        if !upstreams.contains_key(name) {
            let known: Vec<&str> = upstreams.keys().map(String::as_str).collect();
            e.push(format!(
                "models.\"{pattern}\".upstream: no upstream named {name:?} (define [upstreams.{name}]; defined: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
}
