//! `[prune]`: tool-result and tool-input clearing, run-loop pruning and folding, the age limit, the pinned task.

use super::duration::DurationSpec;
use super::kinds::ToolSelection;
use serde::{Deserialize, Serialize};

/// `[prune]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PruneConfig {
    /// Newest tool results kept in full by tool-result clearing.
    pub keep_tool_results: usize,
    /// Tool results smaller than this many tokens are never cleared.
    pub min_result_tokens: u64,
    /// Characters kept of a past run loop's user message and final reply.
    pub max_message_length: usize,
    /// Newest run loops (the current one included) kept whole by run-loop pruning.
    pub keep_run_loops: usize,
    /// Newest steps (a tool call with its results) of a run loop never folded: a deep re-cut folds older steps
    /// into one line each (call id, tool, a gist of the arguments) to reach `context.target`.
    pub keep_steps: usize,
    /// Run loops beyond this many (counting from the newest) are dropped entirely.
    pub max_run_loops: usize,
    /// Run loops older than this are dropped entirely: a duration, a whole number and a unit (`"90m"`, `"24h"`,
    /// `"7d"`); unset means no age limit.
    pub max_age: Option<DurationSpec>,
    /// The first user message (the task) is never cleared, cut or dropped; one larger than this many tokens is
    /// sent as its head and tail around a marker once the rewrite reaches it (the whole stays recallable).
    pub max_pinned_tokens: u64,
    /// Clear the arguments of past tool calls (beyond the newest `keep_tool_results`): `true`, `false`, or a
    /// list of tool names. Cleared arguments become a short JSON placeholder; the recall tool returns them.
    pub clear_tool_inputs: ToolSelection,
    /// Tool-call arguments smaller than this many tokens are never cleared.
    pub min_input_tokens: u64,
    /// Tools whose calls and results are never cleared.
    pub exclude_tools: Vec<String>,
    /// Tokens (about) of a cleared result's distinctive strings — paths, dotted, snake_case and CamelCase names,
    /// numbers of 4+ digits, most used first — that its placeholder names, so the model knows what the recall
    /// would give back. 0: the placeholder names only the call, the tool and the size.
    pub digest_tokens: u64,
    /// Clear tool results least recently used first — the result the agent's newest messages name (a path,
    /// a name, a number of it, or its call id in a recall) kept longest — instead of oldest first. The order is
    /// taken at each re-cut, so requests between two re-cuts keep an identical prefix.
    pub clear_by_use: bool,
}

impl Default for PruneConfig {
    fn default() -> Self {
        Self {
            keep_tool_results: 3,
            min_result_tokens: 100,
            max_message_length: 2000,
            keep_run_loops: 2,
            keep_steps: 3,
            max_run_loops: 50,
            max_age: None,
            max_pinned_tokens: 4000,
            clear_tool_inputs: ToolSelection::All(true),
            min_input_tokens: 200,
            exclude_tools: Vec::new(),
            digest_tokens: 48,
            clear_by_use: true,
        }
    }
}

impl PruneConfig {
    /// The problems of these settings, as `prune.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if self.max_pinned_tokens < 64 {
            e.push("prune.max_pinned_tokens: must be at least 64 tokens".into());
        }
        if self.keep_run_loops == 0 {
            e.push("prune.keep_run_loops: must be at least 1 (the current run loop)".into());
        }
        if self.keep_steps == 0 {
            e.push("prune.keep_steps: must be at least 1 (the step the model is answering)".into());
        }
        if self.max_run_loops < self.keep_run_loops {
            e.push(format!(
                "prune.max_run_loops: {} must not be below prune.keep_run_loops ({})",
                self.max_run_loops, self.keep_run_loops
            ));
        }
        if self.max_message_length < 16 {
            e.push("prune.max_message_length: must be at least 16 characters".into());
        }
    }
}
