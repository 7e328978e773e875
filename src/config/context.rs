//! `[context]`: when and how far outgoing requests are rewritten (strategy, threshold, target, hard limit, the
//! cost model's cache price), with the rules that order the three fractions.

use super::kinds::TokenAmount;
use serde::{Deserialize, Serialize};

/// `[context]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// Rewrite strategy: `off`, `prune`, `summarize` or `hybrid`.
    pub strategy: Strategy,
    /// Fraction of the model's context window above which a request is rewritten.
    pub threshold: f64,
    /// Fraction of the window a rewrite aims for (the low-water mark), so later turns keep an identical prefix.
    /// A re-cut may stop above it (never above `threshold`) when the cost model finds a shallower one cheaper.
    pub target: f64,
    /// Price of a cached input token as a fraction of an uncached one, for the cost model that picks how deep a
    /// re-cut goes (0.1 for OpenAI and Anthropic cache reads; 0.25 or 0.5 for providers that discount less).
    pub cache_read_price: f64,
    /// Fraction of the window above which whole old messages are dropped as a last resort.
    pub hard_limit: f64,
    /// Context window, in tokens, of models not found in the model table.
    pub default_context_window: u64,
    /// Least a re-cut must remove, in tokens (`2000`) or as a fraction of the window (`0.05`): a re-cut that
    /// would remove less leaves the previous cut points (and the upstream's prompt cache) alone while the
    /// request fits under `hard_limit`.
    pub clear_at_least: TokenAmount,
    /// Rewrite a request holding more messages than this, as for the token threshold (unset: no limit); the
    /// rewrite then brings the count down to `max_messages × target / threshold`.
    pub max_messages: Option<usize>,
    /// What to do with a request that fits under `hard_limit` only by dropping whole old messages, or by cutting a
    /// task over `prune.max_pinned_tokens` to its head and tail (stage `truncated`): `truncate` drops them (the default: the conversation goes on, the task and the newest turn
    /// kept; the drop is named in `x-ctxgate-rewrite`, a warning log line and the turn's record, and the model is
    /// told and offered the recall tools to search what left), `refuse` answers `400 context_length_exceeded` in
    /// the API's own error shape and sends nothing upstream, as the provider would have (for clients that manage
    /// their context themselves, such as aider, which then asks its user to drop files), `fallback` sends it to
    /// the model's `[models."<pattern>"] fallback` (a larger window) and that model's upstream — whole if it fits
    /// there, else rewritten to that window, a chain followed while it still does not fit — and says so in
    /// `x-ctxgate-fallback`; a model without a fallback is truncated, as with `truncate`.
    pub on_overflow: OnOverflow,
}

/// What a request that would lose whole messages to the hard limit gets (`context.on_overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnOverflow {
    /// Drop the oldest whole messages (the task, system messages and the newest turn kept), and say so.
    Truncate,
    /// Refuse with `400 context_length_exceeded`; nothing is sent upstream.
    Refuse,
    /// Send it to the model's `[models] fallback` (a larger window) instead; truncate where none is set.
    Fallback,
}

impl OnOverflow {
    /// The value's name as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            OnOverflow::Truncate => "truncate",
            OnOverflow::Refuse => "refuse",
            OnOverflow::Fallback => "fallback",
        }
    }
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            strategy: Strategy::Hybrid,
            threshold: 0.8,
            target: 0.4,
            cache_read_price: 0.1,
            hard_limit: 0.95,
            default_context_window: 128_000,
            clear_at_least: TokenAmount::Fraction(0.1),
            max_messages: None,
            on_overflow: OnOverflow::Truncate,
        }
    }
}

/// The rewrite strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Never rewrite.
    Off,
    /// Tool-result clearing, run-loop pruning, then the hard limit.
    Prune,
    /// LLM summary of older history, then the hard limit.
    Summarize,
    /// Tool-result clearing, then a summary, then the hard limit.
    Hybrid,
}

impl Strategy {
    /// The strategy's name as used in config, headers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Off => "off",
            Strategy::Prune => "prune",
            Strategy::Summarize => "summarize",
            Strategy::Hybrid => "hybrid",
        }
    }

    /// Parses a strategy name (as in the `x-ctxgate-strategy` header).
    pub fn parse(s: &str) -> Option<Strategy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Some(Strategy::Off),
            "prune" => Some(Strategy::Prune),
            "summarize" => Some(Strategy::Summarize),
            "hybrid" => Some(Strategy::Hybrid),
            _ => None,
        }
    }
}

/// Whether `v` is a fraction in (0, 1].
fn fraction(v: f64) -> bool {
    v > 0.0 && v <= 1.0
}

impl ContextConfig {
    /// The problems of these settings, as `context.<key>: …` lines. `set(path)`: whether the file (or the
    /// environment) set that key, so that a rule between two keys names the one that was set.
    pub fn problems(&self, set: &dyn Fn(&str) -> bool, e: &mut Vec<String>) {
        for (name, v) in [
            ("threshold", self.threshold),
            ("target", self.target),
            ("hard_limit", self.hard_limit),
        ] {
            if !fraction(v) {
                e.push(format!("context.{name}: {v} must be a fraction in (0, 1]"));
            }
        }
        ordered(
            set,
            ("target", self.target),
            ("threshold", self.threshold),
            e,
        );
        ordered(
            set,
            ("threshold", self.threshold),
            ("hard_limit", self.hard_limit),
            e,
        );
        e.extend(self.clear_at_least.problem("context.clear_at_least"));
        if !(self.cache_read_price >= 0.0 && self.cache_read_price <= 1.0) {
            e.push(format!(
                "context.cache_read_price: {} must be a fraction in [0, 1]",
                self.cache_read_price
            ));
        }
        if self.max_messages.is_some_and(|m| m < 4) {
            e.push("context.max_messages: must be at least 4 messages".into());
        }
        if self.default_context_window < 256 {
            e.push("context.default_context_window: must be at least 256 tokens".into());
        }
    }
}

/// `low` must not exceed `high`: said of the key the file set (the other may be a default). Values already wrong
/// on their own (not fractions) are not compared: no derived complaints.
fn ordered(
    set: &dyn Fn(&str) -> bool,
    (low, lv): (&str, f64),
    (high, hv): (&str, f64),
    e: &mut Vec<String>,
) {
    if !(fraction(lv) && fraction(hv) && lv > hv) {
        return;
    }
    let (low_key, high_key) = (format!("context.{low}"), format!("context.{high}"));
    let default = |k: &str| if set(k) { "" } else { ", the default" };
    if set(&low_key) || !set(&high_key) {
        e.push(format!(
            "{low_key}: {lv} must not exceed {high_key} ({hv}{})",
            default(&high_key)
        ));
    } else {
        e.push(format!(
            "{high_key}: {hv} must not be below {low_key} ({lv}{})",
            default(&low_key)
        ));
    }
}
