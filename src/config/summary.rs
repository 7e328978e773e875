//! `[summary]`: the model, API and prompt that write summaries of older history, their size, timing and
//! concurrency.

use super::checks::{is_bearer_credential, is_http_url};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[summary]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SummaryConfig {
    /// Model that writes summaries; unset turns summaries off (the engine then prunes only).
    pub model: Option<String>,
    /// Base URL of the API the summary requests go to; unset means the main upstream.
    pub base_url: Option<String>,
    /// API key for summary requests; unset means the client's own credentials (or `upstream.api_key`).
    pub api_key: Option<String>,
    /// Newest messages never summarized (more when needed so a tool call stays with its results).
    pub keep_recent: usize,
    /// Longest summary accepted, in tokens (`max_tokens` of the summary request).
    pub max_tokens: u64,
    /// Seconds a summary request may take.
    pub timeout_secs: u64,
    /// Fraction of the window at which the next summary is computed in the background, ahead of the threshold.
    pub precompute_at: f64,
    /// Milliseconds a request over the threshold may wait for a summary being computed (0: never wait; prune
    /// instead until it is ready).
    pub wait_ms: u64,
    /// File with the summary prompt; unset means the shipped `config/summary_prompt.txt`.
    pub prompt_file: Option<PathBuf>,
    /// Most summary requests in flight at once across all sessions; while every slot is taken no further summary
    /// starts (requests never wait for them: they are pruned meanwhile, and a later request starts the summary).
    pub max_concurrent: usize,
}

impl Default for SummaryConfig {
    fn default() -> Self {
        Self {
            model: None,
            base_url: None,
            api_key: None,
            keep_recent: 10,
            max_tokens: 1000,
            timeout_secs: 30,
            precompute_at: 0.75,
            wait_ms: 0,
            prompt_file: None,
            max_concurrent: 4,
        }
    }
}

impl SummaryConfig {
    /// The problems of these settings, as `summary.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if self.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            e.push(
                "summary.model: must not be empty (leave it unset to turn summaries off)".into(),
            );
        }
        if let Some(u) = self.base_url.as_deref().filter(|u| !is_http_url(u)) {
            e.push(format!("summary.base_url: {u:?} is not an http(s) URL"));
        }
        if self
            .api_key
            .as_deref()
            .is_some_and(|k| !is_bearer_credential(k))
        {
            e.push("summary.api_key: must be a non-empty printable string".into());
        }
        if self.max_tokens < 50 {
            e.push("summary.max_tokens: must be at least 50".into());
        }
        if self.timeout_secs == 0 {
            e.push("summary.timeout_secs: must be greater than 0".into());
        }
        if self.max_concurrent == 0 {
            e.push("summary.max_concurrent: must be at least 1".into());
        }
        if !(self.precompute_at > 0.0 && self.precompute_at <= 1.0) {
            e.push(format!(
                "summary.precompute_at: {} must be a fraction in (0, 1]",
                self.precompute_at
            ));
        }
        if let Some(p) = &self.prompt_file {
            match std::fs::read_to_string(p) {
                Ok(t) if !t.trim().is_empty() => {}
                Ok(_) => e.push(format!("summary.prompt_file: {} is empty", p.display())),
                Err(err) => e.push(format!(
                    "summary.prompt_file: cannot read {}: {err}",
                    p.display()
                )),
            }
        }
    }
}
