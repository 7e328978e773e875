//! Live reload (SIGHUP, `POST /admin/config/reload`): the config file is read again (with the same `CTXGATE_*`
//! environment layering as at start) and checked whole; the running config comes back with `[context]`,
//! `[prune]`, `[summary]`, `[recall]`, `[models]` and `[upstreams]` replaced, for its owner (`app::AppState::reload_config`) to
//! swap into the snapshot requests take when they start (a request in flight keeps its own); every other changed
//! key needs a restart and is named, not applied. A file with problems changes nothing and every problem is
//! reported.

use crate::config::Config;
use crate::metrics::{Metrics, ReloadOutcome};
use parking_lot::Mutex;
use serde_json::Value;
use std::path::PathBuf;

/// The sections a reload applies.
pub const RELOADABLE: &[&str] = &[
    "context",
    "prune",
    "summary",
    "recall",
    "models",
    "upstreams",
];

/// Where the running config came from.
pub struct Source {
    /// The file it was loaded from (`None`: embedded defaults and the environment only).
    path: Mutex<Option<PathBuf>>,
    /// The config as loaded at start, before command-line overrides (what a restart would load again): keys
    /// outside the reloadable sections are compared with it.
    started: Mutex<Config>,
    /// One reload at a time.
    busy: tokio::sync::Mutex<()>,
}

impl Source {
    /// A source for a config that came from nowhere in particular (tests): reloads re-read the environment.
    pub fn new(started: Config) -> Source {
        Source {
            path: Mutex::new(None),
            started: Mutex::new(started),
            busy: tokio::sync::Mutex::new(()),
        }
    }

    /// Names the file the config was loaded from and the config as loaded there (before command-line overrides).
    pub fn set(&self, path: Option<PathBuf>, loaded: Config) {
        *self.path.lock() = path;
        *self.started.lock() = loaded;
    }

    /// Holds off other reloads until the guard is dropped (the owner of the live config reads and swaps under it).
    pub async fn one_at_a_time(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.busy.lock().await
    }

    /// Reads the file again and hands back `running` with its reloadable sections replaced, validated whole, and
    /// what changed; `Err` with every problem when the file is refused. Applies nothing.
    pub fn read(&self, running: &Config) -> Result<(Config, Reloaded), Vec<String>> {
        let path = self.path.lock().clone();
        let new = Config::load(path.as_deref()).map_err(|e| e.0)?;
        let (old, new_v) = (to_value(running), to_value(&new));
        let started = to_value(&self.started.lock());
        let mut changed = Vec::new();
        let mut restart_required = Vec::new();
        if let (Value::Object(old_o), Value::Object(new_o), Value::Object(start_o)) =
            (&old, &new_v, &started)
        {
            for (section, value) in new_o {
                if RELOADABLE.contains(&section.as_str()) {
                    diff(section, old_o.get(section), Some(value), &mut changed);
                } else {
                    diff(
                        section,
                        start_o.get(section),
                        Some(value),
                        &mut restart_required,
                    );
                }
            }
        }
        // The running config, with the reloadable sections replaced.
        let mut next = running.clone();
        next.context = new.context;
        next.prune = new.prune;
        next.summary = new.summary;
        next.recall = new.recall;
        next.models = new.models;
        next.upstreams = new.upstreams;
        next.validate().map_err(|e| e.0)?;
        let report = Reloaded {
            reloaded: true,
            changed,
            restart_required,
        };
        Ok((next, report))
    }
}

/// What a reload did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reloaded {
    /// Always true (a rejected reload is an error).
    pub reloaded: bool,
    /// The keys whose new values are in force (`section.key`).
    pub changed: Vec<String>,
    /// Keys that differ from the running process but need a restart; not applied.
    pub restart_required: Vec<String>,
}

/// Logs and counts a reload's outcome.
pub fn record(result: &Result<Reloaded, Vec<String>>, metrics: &Metrics) {
    match result {
        Ok(r) => {
            metrics.reload(ReloadOutcome::Applied);
            tracing::info!(
                changed = ?r.changed,
                restart_required = ?r.restart_required,
                "config: reloaded"
            );
            if !r.restart_required.is_empty() {
                tracing::warn!(keys = ?r.restart_required, "config: these changes need a restart; not applied");
            }
        }
        Err(problems) => {
            metrics.reload(ReloadOutcome::Rejected);
            for p in problems {
                tracing::warn!(problem = %p, "config: reload refused; the running config is kept");
            }
        }
    }
}

fn to_value(c: &Config) -> Value {
    serde_json::to_value(c).unwrap_or(Value::Null)
}

/// The dotted paths under `at` where `a` and `b` differ (a whole value for a key only one side has).
fn diff(at: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<String>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                diff(&format!("{at}.{k}"), x.get(k), y.get(k), out);
            }
        }
        (x, y) if x != y => out.push(at.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_are_named_by_their_dotted_path() {
        let mut out = Vec::new();
        diff(
            "context",
            Some(&json!({"threshold": 0.8, "target": 0.4, "x": {"a": 1}})),
            Some(&json!({"threshold": 0.5, "target": 0.4, "x": {"a": 2, "b": 1}})),
            &mut out,
        );
        assert_eq!(out, ["context.threshold", "context.x.a", "context.x.b"]);
    }
}
