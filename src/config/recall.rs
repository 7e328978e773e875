//! `[recall]`: the recall and search tools offered to the model when something was pruned, and their limits.

use serde::{Deserialize, Serialize};

/// `[recall]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RecallConfig {
    /// Inject the recall and search tools into rewritten requests.
    pub enabled: bool,
    /// Name of the injected tool that returns a pruned tool result by its call id.
    pub tool_name: String,
    /// Name of the injected tool that searches the session's full history.
    pub search_tool_name: String,
    /// Most extra upstream round trips made to answer recall and search calls within one client request.
    pub max_rounds: u32,
    /// Characters of a recalled tool result returned to the model (the rest is cut with a marker).
    pub max_result_chars: usize,
    /// Characters of search results returned to the model.
    pub max_search_chars: usize,
    /// Recallable calls listed in the system note (newest first).
    pub max_note_calls: usize,
    /// Fraction of `context.threshold` from which the recall tools are offered before the first rewrite: a request
    /// that has tools of its own and at least `offer_at × threshold` tokens is sent with ctxgate's tools appended
    /// (its messages untouched), so the first rewrite finds them in the provider's prompt cache instead of missing
    /// it from position 0. Once offered they stay, byte-identical, in every later request of the session. In
    /// (0, 1]. The default 1 offers them from the threshold on, so a request that needs no rewrite reaches the
    /// upstream byte for byte; 0.1 is the cheapest on long agent runs (measured in docs/how-it-works.md, "Tools
    /// that never flicker") at ~210 tokens more per request on conversations that never reach the threshold.
    pub offer_at: f64,
}

impl Default for RecallConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            tool_name: "recall_tool_call".into(),
            search_tool_name: "search_history".into(),
            max_rounds: 3,
            max_result_chars: 20_000,
            max_search_chars: 4_000,
            max_note_calls: 50,
            offer_at: 1.0,
        }
    }
}

impl RecallConfig {
    /// The problems of these settings, as `recall.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        for (key, name) in [
            ("tool_name", &self.tool_name),
            ("search_tool_name", &self.search_tool_name),
        ] {
            let ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                e.push(format!(
                    "recall.{key}: {name:?} must be 1-64 letters, digits, '_' or '-' (OpenAI function name rules)"
                ));
            }
        }
        if self.tool_name == self.search_tool_name {
            e.push("recall.search_tool_name: must differ from recall.tool_name".into());
        }
        if !(self.offer_at > 0.0 && self.offer_at <= 1.0) {
            e.push(format!(
                "recall.offer_at: {} must be a fraction in (0, 1]",
                self.offer_at
            ));
        }
        if self.max_result_chars < 100 || self.max_search_chars < 100 {
            e.push(
                "recall.max_result_chars and recall.max_search_chars: must be at least 100".into(),
            );
        }
    }
}
