//! Typed configuration: one file per section owning its struct, defaults and `problems()`; embedded defaults, a
//! TOML file and `CTXGATE_<SECTION>__<KEY>` overrides loaded in one pass (`load.rs`, `env.rs`); the reference
//! rendered from the doc comments (`reference.rs`).
//!
//! Loading reports every problem at once, each with its key path: every key is first checked on its own
//! (unknown key, wrong type), then every section's values and rules.

mod admin;
mod anthropic;
mod checks;
mod context;
mod duration;
mod env;
pub mod fallbacks;
mod gemini;
mod hooks;
mod kinds;
mod load;
mod metrics;
mod models;
pub mod otel;
mod prune;
mod recall;
pub mod reference;
mod server;
mod session;
mod store;
mod summary;
#[cfg(test)]
mod tests;
mod upstream;
mod upstreams;

pub use admin::AdminConfig;
pub use anthropic::AnthropicConfig;
pub use context::{ContextConfig, OnOverflow, Strategy};
pub use duration::DurationSpec;
pub use env::ENV_PREFIX;
pub use gemini::GeminiConfig;
pub use hooks::HooksConfig;
pub use kinds::{TokenAmount, ToolSelection};
pub use metrics::MetricsConfig;
pub use models::{ModelEntry, Price, DEFAULT_CACHE_TTL};
pub use otel::OtelConfig;
pub use prune::PruneConfig;
pub use recall::RecallConfig;
pub use server::{parse_listen, LogFormat, ServerConfig};
pub use session::SessionConfig;
pub use store::{mask_url_password, StoreBackend, StoreConfig};
pub use summary::SummaryConfig;
pub use upstream::UpstreamConfig;
pub use upstreams::{NamedUpstream, UpstreamKind, DEFAULT_NAMES as DEFAULT_UPSTREAM_NAMES};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

/// The whole configuration. Every section and key is optional; missing ones take the documented defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The listening socket and request limits.
    pub server: ServerConfig,
    /// The LLM API that requests are forwarded to.
    pub upstream: UpstreamConfig,
    /// The Anthropic Messages API (`/v1/messages` and every request carrying `anthropic-version`).
    pub anthropic: AnthropicConfig,
    /// The Gemini API (`/v1beta/models/{model}:{method}` and the rest of `/v1beta/…`).
    pub gemini: GeminiConfig,
    /// How conversations are identified.
    pub session: SessionConfig,
    /// Where conversation history is kept.
    pub store: StoreConfig,
    /// The admin API.
    pub admin: AdminConfig,
    /// Prometheus metrics.
    pub metrics: MetricsConfig,
    /// When and how outgoing requests are rewritten.
    pub context: ContextConfig,
    /// Parameters of tool-result clearing and run-loop pruning.
    pub prune: PruneConfig,
    /// The recall and search tools ctxgate offers the model when it pruned something.
    pub recall: RecallConfig,
    /// LLM-written summaries of older history (strategies `summarize` and `hybrid`).
    pub summary: SummaryConfig,
    /// Per-model overrides, keyed by exact model name or glob pattern (`gpt-4o*`).
    pub models: BTreeMap<String, ModelEntry>,
    /// Named upstreams (`[upstreams.<name>]`) that `[models."<pattern>"] upstream = "<name>"` routes a model's
    /// conversation requests to; a model without a route goes to `[upstream]` / `[anthropic]`.
    pub upstreams: BTreeMap<String, NamedUpstream>,
    /// Webhooks: a session's export posted when it goes idle.
    pub hooks: HooksConfig,
    /// OpenTelemetry traces, exported over OTLP/HTTP (off unless an endpoint is configured).
    pub otel: OtelConfig,
}

/// Every problem found while loading a config, each naming its key path.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The size of a typical tool result (a file read, a command's output), in tokens, for [`Config::warnings`].
pub const TYPICAL_RESULT_TOKENS: u64 = 1_000;

impl Config {
    /// Semantic checks; reports every problem at once.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let e = self.problems(&|_: &str| true);
        if e.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(e))
        }
    }

    /// Every semantic problem, section by section, each naming its key path. `set(path)`: whether the file (or
    /// the environment) set that key; a rule between two keys names the one that was set, and a value already
    /// wrong on its own is not compared with others (no derived complaints).
    fn problems(&self, set: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut e = Vec::new();
        self.server.problems(&mut e);
        self.upstream.problems(&mut e);
        self.anthropic.problems(&mut e);
        self.gemini.problems(&mut e);
        self.session.problems(&mut e);
        self.store.problems(&mut e);
        self.admin.problems(&mut e);
        self.metrics.problems(&mut e);
        self.context.problems(set, &mut e);
        self.prune.problems(&mut e);
        self.recall.problems(&mut e);
        self.summary.problems(&mut e);
        models::problems(&self.models, &mut e);
        upstreams::problems(&self.upstreams, &self.models, &mut e);
        fallbacks::problems(&self.models, &mut e);
        self.hooks.problems(&mut e);
        self.otel.problems(&mut e);
        e
    }

    /// The listen address (validated by [`Config::validate`]).
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigErrors> {
        parse_listen(&self.server.listen).ok_or_else(|| {
            ConfigErrors(vec![format!(
                "server.listen: {:?} is not an address",
                self.server.listen
            )])
        })
    }

    /// Whether `/admin/*` serves loopback peers without a token: `admin.allow_loopback_without_token`, or when
    /// unset, whether `server.listen` is a loopback address.
    pub fn admin_loopback_without_token(&self) -> bool {
        self.admin.allow_loopback_without_token.unwrap_or_else(|| {
            parse_listen(&self.server.listen).is_some_and(|a| a.ip().is_loopback())
        })
    }

    /// Settings that are valid but will not do what an operator likely expects, one sentence each: a model's
    /// window so small that the tool results kept whole (`prune.keep_tool_results` of a typical
    /// [`TYPICAL_RESULT_TOKENS`]) already fill the rewrite's target, so clearing cannot act and a rewrite can
    /// only truncate.
    pub fn warnings(&self) -> Vec<String> {
        let kept = self.prune.keep_tool_results as u64 * TYPICAL_RESULT_TOKENS;
        let windows = std::iter::once((
            "context.default_context_window".to_string(),
            self.context.default_context_window,
        ))
        .chain(self.models.iter().filter_map(|(p, m)| {
            m.context_window
                .map(|w| (format!("models.\"{p}\".context_window"), w))
        }));
        let fallback = (self.context.on_overflow == OnOverflow::Fallback
            && !fallbacks::any(&self.models))
        .then(|| {
            "context.on_overflow = \"fallback\" but no [models] entry sets a fallback: every request that would \
             lose whole messages is truncated, as with \"truncate\""
                .to_string()
        });
        windows
            .filter_map(|(key, window)| {
                let target = (window as f64 * self.context.target) as u64;
                (target < kept).then(|| {
                    format!(
                        "{key} = {window}: the rewrite's target ({target} tokens, context.target {}) is smaller than \
                         the {} newest tool results kept whole (prune.keep_tool_results; ~{TYPICAL_RESULT_TOKENS} \
                         tokens each is typical), so clearing cannot bring a request down and rewrites will mostly \
                         truncate; lower prune.keep_tool_results or give the model a larger window",
                        self.context.target, self.prune.keep_tool_results
                    )
                })
            })
            .chain(fallback)
            .collect()
    }

    /// A copy with every secret replaced by `***`, safe to print or log.
    pub fn masked(&self) -> Config {
        let mut c = self.clone();
        for secret in [
            &mut c.upstream.api_key,
            &mut c.anthropic.api_key,
            &mut c.gemini.api_key,
            &mut c.summary.api_key,
            &mut c.admin.token,
            &mut c.hooks.secret,
        ] {
            if secret.is_some() {
                *secret = Some("***".into());
            }
        }
        for u in c.upstreams.values_mut() {
            if u.api_key.is_some() {
                u.api_key = Some("***".into());
            }
        }
        c.otel = c.otel.masked();
        c.store = c.store.masked();
        c
    }

    /// The config rendered as TOML (use on a [`Config::masked`] copy when printing).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}
