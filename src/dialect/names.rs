//! The names of the tools ctxgate adds to rewritten requests (`[recall] tool_name`, `search_tool_name`), for
//! recognising their calls in any dialect.

use crate::config::RecallConfig;
use serde_json::Value;

/// The names of the injected tools, for recognising their calls.
#[derive(Debug, Clone)]
pub struct InjectedNames {
    /// `[recall] tool_name`.
    pub recall: String,
    /// `[recall] search_tool_name`.
    pub search: String,
}

impl InjectedNames {
    /// From config.
    pub fn from_config(cfg: &RecallConfig) -> Self {
        Self {
            recall: cfg.tool_name.clone(),
            search: cfg.search_tool_name.clone(),
        }
    }

    /// True when `name` is one of ours.
    pub fn is_injected(&self, name: &str) -> bool {
        name == self.recall || name == self.search
    }

    /// The tool calls of a chat-completions (or neutral) assistant message that are ours.
    pub fn injected_calls<'a>(&self, message: &'a Value) -> Vec<&'a Value> {
        message
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .filter(|c| {
                        c.pointer("/function/name")
                            .and_then(Value::as_str)
                            .is_some_and(|n| self.is_injected(n))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}
