//! `[models."<pattern>"]`: per-model overrides (the context window, the upstream) keyed by exact name or glob
//! pattern.

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
    }
}
