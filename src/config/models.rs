//! `[models."<pattern>"]`: per-model overrides (the context window, the upstream) keyed by exact name or glob
//! pattern.

use super::duration::DurationSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[models."<pattern>"]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The model's context window in tokens. Unset: the next entry that matches the model and sets one (the
    /// built-in table's), else `context.default_context_window`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// The `[upstreams.<name>]` this model's conversation requests go to. Unset: the next entry that matches the
    /// model and sets one, else the default `[upstream]` (chat completions, Responses) or `[anthropic]` (Messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The model a request goes to when it cannot fit this model's window under `context.on_overflow =
    /// "fallback"` (it would lose whole messages to the hard limit): a model of the table with a larger window,
    /// which may have its own fallback (the chain is followed while the request still does not fit). The request
    /// goes with its `model` replaced, to the fallback's upstream. Unset: the next entry that matches the model and
    /// sets one, else none (such a request is then truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The model's list price in US dollars per million tokens, for `ctxgate_spend_dollars_total`,
    /// `ctxgate_saved_dollars_total` and each session's cost: `{ input = 2.5, cached_input = 0.25,
    /// cache_write = 3.125, output = 10.0 }`. Any key may be left out: `input` and `output` then count 0,
    /// `cached_input` and `cache_write` the `input` price. Unset: the next entry that matches the model and sets one
    /// (the built-in table has list prices of well-known models), else the model is not priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// How long the provider keeps this model's prompt cache between two requests: a duration, a whole number
    /// and a unit (`"5m"`, `"1h"`). A turn that comes longer than this after its session's previous one is counted
    /// as a cache miss of cause `gap` (`ctxgate_cache_miss_tokens_total`, the turn's `cache` record). Unset: the
    /// next entry that matches the model and sets one, else `"5m"` (the default lifetime of OpenAI's and
    /// Anthropic's prompt caches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ttl: Option<DurationSpec>,
}

/// The provider's prompt-cache lifetime of a model without a `cache_ttl`.
pub const DEFAULT_CACHE_TTL: DurationSpec = DurationSpec::from_secs(5 * 60);
/// The longest `cache_ttl` (OpenAI's extended prompt caching keeps a prefix up to 24 hours).
const MAX_CACHE_TTL: DurationSpec = DurationSpec::from_secs(7 * 86_400);

/// `[models."<pattern>"] price`: US dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Uncached input (prompt) tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<f64>,
    /// Input tokens read from the provider's prompt cache (unset: the `input` price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Input tokens written to the provider's prompt cache (Anthropic's `cache_creation_input_tokens`; unset: the
    /// `input` price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Output (completion) tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
}

impl ModelEntry {
    /// An entry that sets the context window only.
    pub fn window(context_window: u64) -> ModelEntry {
        ModelEntry {
            context_window: Some(context_window),
            ..ModelEntry::default()
        }
    }
}

/// The problems of the model table, as `models."<pattern>".<key>: …` lines.
pub fn problems(models: &BTreeMap<String, ModelEntry>, e: &mut Vec<String>) {
    for (pattern, m) in models {
        if pattern.is_empty() {
            e.push("models: a model pattern must not be empty".into());
        }
        if m.context_window.is_some_and(|w| w < 256) {
            e.push(format!(
                "models.\"{pattern}\".context_window: must be at least 256 tokens"
            ));
        }
        if m.cache_ttl
            .is_some_and(|t| t.duration().is_zero() || t > MAX_CACHE_TTL)
        {
            e.push(format!(
                "models.\"{pattern}\".cache_ttl: must be more than 0 and at most \"7d\""
            ));
        }
        if let Some(p) = &m.price {
            let keys = [
                ("input", p.input),
                ("cached_input", p.cached_input),
                ("cache_write", p.cache_write),
                ("output", p.output),
            ];
            for (key, v) in keys {
                if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                    e.push(format!(
                        "models.\"{pattern}\".price.{key}: must be a non-negative number of US dollars per \
                         million tokens"
                    ));
                }
            }
        }
    }
}
