//! What the fallback tests share (`tests/fallback.rs`, `tests/fallback_logs.rs`): models with a fallback, a
//! conversation over a small window, the POSTs a mock received.

use ctxgate::config::ModelEntry;
use ctxgate::mock::{MockUpstream, RecordedRequest};
use serde_json::{json, Value};

pub const AUTH: (&str, &str) = ("authorization", "Bearer sk-fallback");

pub fn model(window: u64, fallback: Option<&str>, upstream: Option<&str>) -> ModelEntry {
    ModelEntry {
        context_window: Some(window),
        fallback: fallback.map(str::to_string),
        upstream: upstream.map(str::to_string),
        ..ModelEntry::default()
    }
}

/// About `tokens` tokens of plain text (one per word).
pub fn text(tag: &str, tokens: usize) -> String {
    format!("{tag}: {}", "abc ".repeat(tokens))
}

/// A conversation whose second-newest user message carries a file of about `file` tokens (as aider adds files to
/// the chat), then the newest question: over the window, only dropping that message brings it under.
pub fn chat(model: &str, file: usize) -> Value {
    json!({"model": model, "messages": [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Add a --verbose flag to main()."},
        {"role": "assistant", "content": "Which file holds main()?"},
        {"role": "user", "content": text("src/app.py", file)},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "Now document the flag in the README."},
    ]})
}

/// A request: its path, headers and body.
pub type Call = (&'static str, Vec<(&'static str, &'static str)>, Value);

pub fn posts(m: &MockUpstream) -> Vec<RecordedRequest> {
    m.requests()
        .into_iter()
        .filter(|r| r.method == http::Method::POST)
        .collect()
}
