//! `[models."<pattern>"]`: per-model overrides (the context window) keyed by exact name or glob pattern.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[models."<pattern>"]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The model's context window in tokens.
    pub context_window: u64,
}

/// The problems of the model table, as `models."<pattern>".<key>: …` lines.
pub fn problems(models: &BTreeMap<String, ModelEntry>, e: &mut Vec<String>) {
    for (pattern, m) in models {
        if pattern.is_empty() {
            e.push("models: a model pattern must not be empty".into());
        }
        if m.context_window < 256 {
            e.push(format!(
                "models.\"{pattern}\".context_window: must be at least 256 tokens"
            ));
        }
    }
}
