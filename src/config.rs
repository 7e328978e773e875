//! Typed configuration: embedded defaults, a TOML file, `CTXGATE_<SECTION>__<KEY>` overrides, validation.
//!
//! Loading reports every problem at once, each with its key path: every key is first checked on its own
//! (unknown key, wrong type), then the whole config is validated semantically.

pub use crate::config_kinds::{TokenAmount, ToolSelection};
pub use crate::otel::config::OtelConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

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
    /// Webhooks: a session's export posted when it goes idle.
    pub hooks: crate::hooks::HooksConfig,
    /// OpenTelemetry traces, exported over OTLP/HTTP (off unless an endpoint is configured).
    pub otel: OtelConfig,
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address and port to listen on: an IP address and port (`127.0.0.1:8787`, `[::1]:8787`, `0.0.0.0:8787`) or
    /// `localhost:PORT`.
    pub listen: String,
    /// Largest request body accepted, in bytes; larger bodies get 413.
    pub max_body_bytes: u64,
    /// Seconds that in-flight requests and streams may take to finish after SIGTERM/SIGINT.
    pub shutdown_grace_secs: u64,
    /// Log format: `text` (human) or `json`.
    pub log_format: LogFormat,
    /// Seconds, after the grace period, that shutdown waits for background work (turn records, summaries,
    /// compression records) and queued store writes to finish before the process exits.
    pub drain_secs: u64,
    /// Seconds a client may take to send a request's headers; slower connections are closed.
    pub header_read_timeout_secs: u64,
    /// Seconds a client may take to send a whole request body; slower requests get 408.
    pub body_read_timeout_secs: u64,
    /// Most client connections open at once; further connections wait in the listen queue. 0: no limit.
    pub max_connections: usize,
    /// Most requests in flight at once (streams count until they end); beyond it requests get 503 with
    /// `retry-after` at once. 0: no limit.
    pub max_in_flight: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8787".into(),
            max_body_bytes: 32 * 1024 * 1024,
            shutdown_grace_secs: 30,
            log_format: LogFormat::Text,
            drain_secs: 10,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 60,
            max_connections: 4096,
            max_in_flight: 1024,
        }
    }
}

/// Log output format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[upstream]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Base URL of the OpenAI-compatible API; `/v1/<rest>` is forwarded to `<base_url>/<rest>`.
    pub base_url: String,
    /// API key sent as `Authorization: Bearer …` only when the client sends no Authorization header.
    pub api_key: Option<String>,
    /// Seconds to wait for the upstream's response headers, and at most between two body chunks.
    pub timeout_secs: u64,
    /// Seconds to wait for a TCP/TLS connection to the upstream.
    pub connect_timeout_secs: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            timeout_secs: 600,
            connect_timeout_secs: 10,
        }
    }
}

/// `[anthropic]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AnthropicConfig {
    /// Base URL of the Anthropic Messages API; `/v1/<rest>` of an Anthropic request (`/v1/messages…`, or any
    /// request carrying an `anthropic-version` header) is forwarded to `<base_url>/<rest>`. Timeouts are
    /// `[upstream]`'s.
    pub base_url: String,
    /// API key sent as `x-api-key` only when the client sends no credential (neither `x-api-key` nor
    /// `Authorization`).
    pub api_key: Option<String>,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.anthropic.com/v1".into(),
            api_key: None,
        }
    }
}

/// `[session]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Request header that names the conversation explicitly.
    pub header: String,
    /// Identify conversations by a fingerprint of their opening also for callers that send no credential header
    /// (the "anonymous" tenant, e.g. clients of a gateway that adds `upstream.api_key` for them). Such callers
    /// share one namespace: two of them opening with the same system prompt and first message share a session.
    /// `false`: anonymous requests without a session header are proxied without history.
    pub anonymous_fingerprint: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            header: "x-session-id".into(),
            anonymous_fingerprint: true,
        }
    }
}

/// `[store]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Durable backend: `sqlite` (embedded, default), `redis` (shared by several instances) or `memory` (lost on
    /// restart).
    pub backend: StoreBackend,
    /// SQLite database file (created with its folder when missing).
    pub path: PathBuf,
    /// Bytes of message history kept in the in-memory cache in front of the store.
    pub cache_max_bytes: u64,
    /// Sessions idle for longer than this many days are purged; 0 keeps them forever. On Redis each session's keys
    /// also expire this long after its last write (the TTL is refreshed by every write).
    pub retention_days: u64,
    /// Milliseconds a request waits for the store (loading a session, committing a turn) before it is answered
    /// without history; the write still completes in the background when the store recovers.
    pub timeout_ms: u64,
    /// Most write batches queued for the store; beyond it new writes are refused at once (counted in
    /// `ctxgate_store_errors_total`) instead of growing memory without bound.
    pub queue_capacity: usize,
    /// Redis server with `backend = "redis"`: `redis://[user:password@]host:port/db`, or `rediss://…` for TLS.
    /// Ignored when `redis_cluster_nodes` is set.
    pub redis_url: String,
    /// Redis Cluster seed nodes (`["redis://host:port", …]`); when set, Redis Cluster mode and `redis_url` is
    /// ignored.
    pub redis_cluster_nodes: Vec<String>,
    /// Prefix of every key ctxgate writes in Redis (several deployments can share one Redis under different
    /// prefixes); must not contain `{` or `}` (a session's keys carry it in a hash tag).
    pub redis_prefix: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Sqlite,
            path: PathBuf::from("data/ctxgate.db"),
            cache_max_bytes: 256 * 1024 * 1024,
            retention_days: 30,
            timeout_ms: 2000,
            queue_capacity: 10_000,
            redis_url: "redis://127.0.0.1:6379/0".into(),
            redis_cluster_nodes: Vec::new(),
            redis_prefix: "ctxgate:".into(),
        }
    }
}

impl StoreConfig {
    /// The Redis keys' checks (`backend = "redis"`): URLs redis-rs accepts, a prefix that leaves the hash tags alone.
    fn check_redis(&self, e: &mut Vec<String>) {
        let bad_url = |u: &str| redis::Client::open(u).is_err();
        if self.redis_cluster_nodes.is_empty() {
            if bad_url(&self.redis_url) {
                e.push(format!(
                    "store.redis_url: {:?} is not a Redis URL (redis://host:port/db or rediss://… for TLS)",
                    mask_url_password(&self.redis_url)
                ));
            }
        } else {
            for n in self.redis_cluster_nodes.iter().filter(|n| bad_url(n)) {
                e.push(format!(
                    "store.redis_cluster_nodes: {:?} is not a Redis URL (redis://host:port)",
                    mask_url_password(n)
                ));
            }
        }
        if self.redis_prefix.contains(['{', '}']) {
            e.push("store.redis_prefix: must not contain `{` or `}` (they delimit the per-session hash tag)".into());
        }
    }
}

/// `url` with the password of its user info (`scheme://user:password@host`) replaced by `***`.
pub fn mask_url_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

/// Which durable store keeps the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// Embedded SQLite database (WAL mode).
    Sqlite,
    /// Process memory only; for tests and throwaway runs.
    Memory,
    /// Redis (standalone or Cluster), shared by several ctxgate instances.
    Redis,
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token required by `/admin/*`. When unset, the admin API is off unless
    /// `allow_loopback_without_token` lets loopback peers in.
    pub token: Option<String>,
    /// Without a token, serve `/admin/*` to loopback peers. Unset: true only when `server.listen` is a loopback
    /// address (a same-host reverse proxy or sidecar would otherwise make the admin API public).
    pub allow_loopback_without_token: Option<bool>,
    /// Host names (`["ctxgate.internal", "gw.example:8443"]`: as in the `Host` header, port optional) under which
    /// `/admin/*` (what the inspector shows) is served without a token, beyond the loopback names `localhost`,
    /// `127.0.0.1` and `[::1]`; a page on one of these names may also call the admin API. For operators who front
    /// the gateway with a name; without a token any other `Host` is refused (a DNS-rebinding guard).
    pub allowed_hosts: Vec<String>,
}

/// `[metrics]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address of a separate listener serving only `GET /metrics`; unset means the main listener only (which
    /// always serves `/metrics`).
    pub listen: Option<String>,
}

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
    /// Run loops older than this are dropped entirely (`90m`, `24h`, `7d`, or seconds); unset means no age limit.
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
        }
    }
}

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
    /// (0, 1]; 1 offers them from the threshold on. The default 0.1 is the measured best (docs/how-it-works.md).
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
            offer_at: 0.1,
        }
    }
}

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

/// `[models."<pattern>"]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The model's context window in tokens.
    pub context_window: u64,
}

/// A duration written as seconds (`3600`) or with a unit (`90s`, `30m`, `24h`, `7d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationSpec(pub u64);

impl DurationSpec {
    /// Parses `90`, `90s`, `30m`, `24h` or `7d`.
    pub fn parse(s: &str) -> Option<DurationSpec> {
        let s = s.trim();
        let (num, mult) = match s.chars().last()? {
            's' => (&s[..s.len() - 1], 1),
            'm' => (&s[..s.len() - 1], 60),
            'h' => (&s[..s.len() - 1], 3600),
            'd' => (&s[..s.len() - 1], 86_400),
            _ => (s, 1),
        };
        num.trim()
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .map(DurationSpec)
    }

    /// The duration in seconds.
    pub fn secs(self) -> u64 {
        self.0
    }
}

impl schemars::JsonSchema for DurationSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": ["string", "integer"],
            "description": "seconds, or a number with s, m, h or d (\"90m\", \"24h\", \"7d\")"
        })
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}s", self.0))
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(DurationSpec(n)),
            Raw::Str(s) => DurationSpec::parse(&s).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid duration {s:?}: use seconds or a number with s, m, h or d"
                ))
            }),
        }
    }
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

/// Prefix of environment variables that override config keys.
pub const ENV_PREFIX: &str = "CTXGATE_";

impl Config {
    /// Loads the config: defaults, then the file at `path` (if any), then `CTXGATE_<SECTION>__<KEY>` variables.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigErrors> {
        Self::load_from(path, std::env::vars())
    }

    /// Like [`Config::load`], with the environment given explicitly (for tests).
    pub fn load_from(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigErrors> {
        let mut table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    ConfigErrors(vec![format!(
                        "cannot read config file {}: {e}",
                        p.display()
                    )])
                })?;
                text.parse::<toml::Table>().map_err(|e| {
                    ConfigErrors(vec![format!("{}: {}", p.display(), e.to_string().trim())])
                })?
            }
            None => toml::Table::new(),
        };
        let mut errors = Vec::new();
        apply_env(&mut table, env, &mut errors);
        Self::from_table(table, errors)
    }

    /// The config of a parsed file (environment applied), checked in one pass: every key's type and name, then —
    /// with the keys found wrong left at their defaults — every value and cross-field rule, so that one message
    /// lists every problem. `errors`: problems found before (the environment's).
    fn from_table(mut table: toml::Table, mut errors: Vec<String>) -> Result<Config, ConfigErrors> {
        let set = set_keys(&table);
        for (section, key) in check_each_key(&table, &mut errors) {
            remove_key(&mut table, &section, key.as_deref());
        }
        match toml::Value::Table(table).try_into::<Config>() {
            Ok(config) => {
                errors.extend(config.problems(&|k: &str| set.contains(k)));
                if errors.is_empty() {
                    return Ok(config);
                }
            }
            Err(e) => errors.push(e.message().to_string()),
        }
        Err(ConfigErrors(errors))
    }

    /// Parses a config from TOML text (no environment overrides).
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigErrors> {
        let table = text
            .parse::<toml::Table>()
            .map_err(|e| ConfigErrors(vec![e.to_string().trim().to_string()]))?;
        Self::from_table(table, Vec::new())
    }

    /// Semantic checks; reports every problem at once.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let e = self.problems(&|_: &str| true);
        if e.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(e))
        }
    }

    /// Every semantic problem, each naming its key path. `set(path)`: whether the file (or the environment) set
    /// that key; a rule between two keys names the one that was set, and a value already wrong on its own is not
    /// compared with others (no derived complaints).
    fn problems(&self, set: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut e = Vec::new();
        if parse_listen(&self.server.listen).is_none() {
            e.push(format!(
                "server.listen: {:?} is not an address like 127.0.0.1:8787, [::1]:8787 or localhost:8787",
                self.server.listen
            ));
        }
        if self.server.max_body_bytes == 0 {
            e.push("server.max_body_bytes: must be greater than 0".into());
        }
        for (key, v) in [
            ("drain_secs", self.server.drain_secs),
            (
                "header_read_timeout_secs",
                self.server.header_read_timeout_secs,
            ),
            ("body_read_timeout_secs", self.server.body_read_timeout_secs),
        ] {
            if v == 0 {
                e.push(format!("server.{key}: must be greater than 0"));
            }
        }
        match reqwest::Url::parse(&self.upstream.base_url) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
            _ => e.push(format!(
                "upstream.base_url: {:?} is not an http(s) URL",
                self.upstream.base_url
            )),
        }
        match reqwest::Url::parse(&self.anthropic.base_url) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
            _ => e.push(format!(
                "anthropic.base_url: {:?} is not an http(s) URL",
                self.anthropic.base_url
            )),
        }
        if let Some(k) = &self.anthropic.api_key {
            if k.trim().is_empty() || http::HeaderValue::from_str(k).is_err() {
                e.push("anthropic.api_key: must be a non-empty printable string".into());
            }
        }
        if self.upstream.timeout_secs == 0 {
            e.push("upstream.timeout_secs: must be greater than 0".into());
        }
        if self.upstream.connect_timeout_secs == 0 {
            e.push("upstream.connect_timeout_secs: must be greater than 0".into());
        }
        if let Some(k) = &self.upstream.api_key {
            if k.trim().is_empty() || http::HeaderValue::from_str(&format!("Bearer {k}")).is_err() {
                e.push("upstream.api_key: must be a non-empty printable string".into());
            }
        }
        if http::HeaderName::from_bytes(self.session.header.as_bytes()).is_err() {
            e.push(format!(
                "session.header: {:?} is not a valid header name",
                self.session.header
            ));
        }
        if self.store.cache_max_bytes == 0 {
            e.push("store.cache_max_bytes: must be greater than 0".into());
        }
        if self.store.timeout_ms == 0 {
            e.push("store.timeout_ms: must be greater than 0".into());
        }
        if self.store.queue_capacity == 0 {
            e.push("store.queue_capacity: must be greater than 0".into());
        }
        if self.store.backend == StoreBackend::Sqlite && self.store.path.as_os_str().is_empty() {
            e.push("store.path: must not be empty with backend = \"sqlite\"".into());
        }
        if self.store.backend == StoreBackend::Redis {
            self.store.check_redis(&mut e);
        }
        if let Some(l) = &self.metrics.listen {
            if parse_listen(l).is_none() {
                e.push(format!(
                    "metrics.listen: {l:?} is not an address like 127.0.0.1:9187 or localhost:9187"
                ));
            }
        }
        if let Some(t) = &self.admin.token {
            if t.len() < 8 {
                e.push("admin.token: must be at least 8 characters".into());
            }
        }
        for h in &self.admin.allowed_hosts {
            if let Err(why) = check_host_name(h) {
                e.push(format!("admin.allowed_hosts: {h:?} {why}"));
            }
        }
        let c = &self.context;
        let fraction = |v: f64| v > 0.0 && v <= 1.0;
        for (name, v) in [
            ("threshold", c.threshold),
            ("target", c.target),
            ("hard_limit", c.hard_limit),
        ] {
            if !fraction(v) {
                e.push(format!("context.{name}: {v} must be a fraction in (0, 1]"));
            }
        }
        // `low` must not exceed `high`: said of the key the file set (the other may be a default).
        let mut ordered = |(low, lv): (&str, f64), (high, hv): (&str, f64)| {
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
        };
        ordered(("target", c.target), ("threshold", c.threshold));
        ordered(("threshold", c.threshold), ("hard_limit", c.hard_limit));
        e.extend(c.clear_at_least.problem("context.clear_at_least"));
        if !(c.cache_read_price >= 0.0 && c.cache_read_price <= 1.0) {
            e.push(format!(
                "context.cache_read_price: {} must be a fraction in [0, 1]",
                c.cache_read_price
            ));
        }
        if c.max_messages.is_some_and(|m| m < 4) {
            e.push("context.max_messages: must be at least 4 messages".into());
        }
        if self.prune.max_pinned_tokens < 64 {
            e.push("prune.max_pinned_tokens: must be at least 64 tokens".into());
        }
        if c.default_context_window < 256 {
            e.push("context.default_context_window: must be at least 256 tokens".into());
        }
        if self.prune.keep_run_loops == 0 {
            e.push("prune.keep_run_loops: must be at least 1 (the current run loop)".into());
        }
        if self.prune.keep_steps == 0 {
            e.push("prune.keep_steps: must be at least 1 (the step the model is answering)".into());
        }
        if self.prune.max_run_loops < self.prune.keep_run_loops {
            e.push(format!(
                "prune.max_run_loops: {} must not be below prune.keep_run_loops ({})",
                self.prune.max_run_loops, self.prune.keep_run_loops
            ));
        }
        if self.prune.max_message_length < 16 {
            e.push("prune.max_message_length: must be at least 16 characters".into());
        }
        let r = &self.recall;
        for (key, name) in [
            ("tool_name", &r.tool_name),
            ("search_tool_name", &r.search_tool_name),
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
        if r.tool_name == r.search_tool_name {
            e.push("recall.search_tool_name: must differ from recall.tool_name".into());
        }
        if !(r.offer_at > 0.0 && r.offer_at <= 1.0) {
            e.push(format!(
                "recall.offer_at: {} must be a fraction in (0, 1]",
                r.offer_at
            ));
        }
        if r.max_result_chars < 100 || r.max_search_chars < 100 {
            e.push(
                "recall.max_result_chars and recall.max_search_chars: must be at least 100".into(),
            );
        }
        let sm = &self.summary;
        if sm.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            e.push(
                "summary.model: must not be empty (leave it unset to turn summaries off)".into(),
            );
        }
        if let Some(u) = &sm.base_url {
            if !matches!(reqwest::Url::parse(u), Ok(u) if u.scheme() == "http" || u.scheme() == "https")
            {
                e.push(format!("summary.base_url: {u:?} is not an http(s) URL"));
            }
        }
        if let Some(k) = &sm.api_key {
            if k.trim().is_empty() || http::HeaderValue::from_str(&format!("Bearer {k}")).is_err() {
                e.push("summary.api_key: must be a non-empty printable string".into());
            }
        }
        if sm.max_tokens < 50 {
            e.push("summary.max_tokens: must be at least 50".into());
        }
        if sm.timeout_secs == 0 {
            e.push("summary.timeout_secs: must be greater than 0".into());
        }
        if sm.max_concurrent == 0 {
            e.push("summary.max_concurrent: must be at least 1".into());
        }
        if !(sm.precompute_at > 0.0 && sm.precompute_at <= 1.0) {
            e.push(format!(
                "summary.precompute_at: {} must be a fraction in (0, 1]",
                sm.precompute_at
            ));
        }
        if let Some(p) = &sm.prompt_file {
            match std::fs::read_to_string(p) {
                Ok(t) if !t.trim().is_empty() => {}
                Ok(_) => e.push(format!("summary.prompt_file: {} is empty", p.display())),
                Err(err) => e.push(format!(
                    "summary.prompt_file: cannot read {}: {err}",
                    p.display()
                )),
            }
        }
        for (pattern, m) in &self.models {
            if pattern.is_empty() {
                e.push("models: a model pattern must not be empty".into());
            }
            if m.context_window < 256 {
                e.push(format!(
                    "models.\"{pattern}\".context_window: must be at least 256 tokens"
                ));
            }
        }
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
        .chain(
            self.models
                .iter()
                .map(|(p, m)| (format!("models.\"{p}\".context_window"), m.context_window)),
        );
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
            .collect()
    }

    /// A copy with every secret replaced by `***`, safe to print or log.
    pub fn masked(&self) -> Config {
        let mut c = self.clone();
        if c.upstream.api_key.is_some() {
            c.upstream.api_key = Some("***".into());
        }
        if c.anthropic.api_key.is_some() {
            c.anthropic.api_key = Some("***".into());
        }
        if c.summary.api_key.is_some() {
            c.summary.api_key = Some("***".into());
        }
        if c.admin.token.is_some() {
            c.admin.token = Some("***".into());
        }
        if c.hooks.secret.is_some() {
            c.hooks.secret = Some("***".into());
        }
        c.otel = c.otel.masked();
        c.store.redis_url = mask_url_password(&c.store.redis_url);
        for n in &mut c.store.redis_cluster_nodes {
            *n = mask_url_password(n);
        }
        c
    }

    /// The config rendered as TOML (use on a [`Config::masked`] copy when printing).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

/// Whether `h` is a host as a `Host` header carries it: a name or an IP address (IPv6 in brackets), with an
/// optional port; no scheme, path or wildcard.
fn check_host_name(h: &str) -> Result<(), &'static str> {
    let (name, port) = match h.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, "")) if ip.parse::<std::net::Ipv6Addr>().is_ok() => (ip, None),
            Some((ip, tail))
                if ip.parse::<std::net::Ipv6Addr>().is_ok() && tail.starts_with(':') =>
            {
                (ip, tail.get(1..))
            }
            _ => return Err("is not a bracketed IPv6 address like [::1]"),
        },
        None => match h.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (h, None),
        },
    };
    if name.is_empty() {
        return Err("is empty: expected a host name like ctxgate.internal");
    }
    if !h.starts_with('[')
        && !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    {
        return Err("is not a host name: expected letters, digits, '-' and '.' (no scheme, path or wildcard)");
    }
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err("has a port that is not a number from 0 to 65535");
    }
    Ok(())
}

/// Overlays `CTXGATE_<SECTION>__<KEY>=value` variables onto the table. Values are read as TOML values when they
/// parse as one (`8787`, `true`, `0.7`) and as plain strings otherwise.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
    errors: &mut Vec<String>,
) {
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        // Variables without `__` (CTXGATE_REQUIRE_EXTERNAL, …) are not config keys.
        let Some((section, key)) = rest.split_once("__") else {
            continue;
        };
        let section = section.to_ascii_lowercase();
        let key = key.to_ascii_lowercase();
        if section.is_empty() || key.is_empty() || key.contains("__") {
            errors.push(format!(
                "{name}: environment overrides take the form CTXGATE_<SECTION>__<KEY>"
            ));
            continue;
        }
        let parsed = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(t) => {
                t.insert(key, parsed);
            }
            _ => errors.push(format!("{name}: `{section}` is not a section")),
        }
    }
}

/// Checks every key on its own against the schema, so that all unknown keys and bad values are reported together.
/// Checks every key of `table` on its own (its name and type), pushing one problem per wrong key with its full
/// path (`models."gpt-4o".context_window` for a model's field). Returns the wrong keys — `(section, key)`,
/// `(section, None)` for a whole section — so that the rest can still be checked.
fn check_each_key(table: &toml::Table, errors: &mut Vec<String>) -> Vec<(String, Option<String>)> {
    let fits = |section: &str, value: toml::Value| {
        let mut one = toml::Table::new();
        one.insert(section.to_string(), value);
        toml::Value::Table(one).try_into::<Config>().err()
    };
    let mut wrong = Vec::new();
    for (section, value) in table {
        let keys = match value {
            toml::Value::Table(keys) if !keys.is_empty() => keys,
            other => {
                if let Some(e) = fits(section, other.clone()) {
                    errors.push(format!("{section}: {}", e.message()));
                    wrong.push((section.clone(), None));
                }
                continue;
            }
        };
        for (key, v) in keys {
            let mut inner = toml::Table::new();
            inner.insert(key.clone(), v.clone());
            let Some(e) = fits(section, toml::Value::Table(inner)) else {
                continue;
            };
            wrong.push((section.clone(), Some(key.clone())));
            if section != "models" {
                errors.push(format!("{section}.{key}: {}", e.message()));
                continue;
            }
            // A model's entry: name the field that is wrong.
            let path = format!("models.\"{key}\"");
            let fields = match v {
                toml::Value::Table(fields) if !fields.is_empty() => fields,
                _ => {
                    errors.push(format!("{path}: {}", e.message()));
                    continue;
                }
            };
            for (field, fv) in fields {
                let mut entry = toml::Table::new();
                entry.insert(field.clone(), fv.clone());
                let mut inner = toml::Table::new();
                inner.insert(key.clone(), toml::Value::Table(entry));
                if let Some(e) = fits(section, toml::Value::Table(inner)) {
                    errors.push(format!("{path}.{field}: {}", e.message()));
                }
            }
        }
    }
    wrong
}

/// Removes `section.key` (or the whole section) from `table`.
fn remove_key(table: &mut toml::Table, section: &str, key: Option<&str>) {
    match key {
        None => {
            table.remove(section);
        }
        Some(k) => {
            if let Some(toml::Value::Table(keys)) = table.get_mut(section) {
                keys.remove(k);
            }
        }
    }
}

/// The `section.key` paths a parsed file (with the environment applied) sets.
fn set_keys(table: &toml::Table) -> std::collections::HashSet<String> {
    let mut set = std::collections::HashSet::new();
    for (section, value) in table {
        set.insert(section.clone());
        if let toml::Value::Table(keys) = value {
            set.extend(keys.keys().map(|k| format!("{section}.{k}")));
        }
    }
    set
}

/// A listen address: an IP address and port (`127.0.0.1:8787`, `[::1]:8787`, `0.0.0.0:8787`), or `localhost:PORT`
/// (the IPv4 loopback, 127.0.0.1). No other names: a listener's address is never left to a DNS lookup.
pub fn parse_listen(s: &str) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    host.eq_ignore_ascii_case("localhost")
        .then(|| SocketAddr::from(([127, 0, 0, 1], port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_addresses_and_localhost() {
        assert_eq!(
            parse_listen("127.0.0.1:8787"),
            Some(SocketAddr::from(([127, 0, 0, 1], 8787)))
        );
        assert_eq!(
            parse_listen("localhost:8787"),
            Some(SocketAddr::from(([127, 0, 0, 1], 8787)))
        );
        assert_eq!(
            parse_listen("LOCALHOST:0"),
            Some(SocketAddr::from(([127, 0, 0, 1], 0)))
        );
        assert!(parse_listen("[::1]:8787").is_some_and(|a| a.ip().is_loopback()));
        for bad in [
            "localhost",
            "example.com:80",
            "localhost:99999",
            ":8787",
            "127.0.0.1",
        ] {
            assert_eq!(parse_listen(bad), None, "{bad}");
        }
        let c = load("[server]\nlisten = \"localhost:8787\"\n", &[]).unwrap();
        assert!(c.admin_loopback_without_token(), "localhost is loopback");
        let e = load("[server]\nlisten = \"example.com:8787\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("localhost:8787"), "{e}");
    }

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        Config::load_from(
            Some(&p),
            env.iter().map(|(a, b)| (a.to_string(), b.to_string())),
        )
    }

    #[test]
    fn shipped_default_file_equals_embedded_defaults() {
        let text = include_str!("../config/ctxgate.toml");
        assert_eq!(Config::from_toml_str(text).unwrap(), Config::default());
    }

    #[test]
    fn allowed_hosts_are_host_names_with_an_optional_port() {
        let c = load(
            "[admin]\nallowed_hosts = [\"ctxgate.internal\", \"gw:8443\", \"[fd00::1]:80\", \"10.0.0.7\"]\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.admin.allowed_hosts.len(), 4);
        for bad in [
            "",
            "http://gw",
            "gw/admin",
            "*.example",
            "gw:99999",
            "[::1]x",
            "[nope]",
            "a b",
        ] {
            let err = load(&format!("[admin]\nallowed_hosts = [{bad:?}]\n"), &[]).unwrap_err();
            assert!(
                err.0.join("\n").contains("admin.allowed_hosts"),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn every_problem_is_reported_with_its_key_path() {
        let err = load(
            "[server]\nlisten = \"nope\"\nlisen = 1\n[upstream]\ntimeout_secs = \"x\"\n[bogus]\na = 1\n",
            &[],
        )
        .unwrap_err();
        let all = err.0.join("\n");
        assert!(all.contains("server.lisen"), "{all}");
        assert!(all.contains("upstream.timeout_secs"), "{all}");
        assert!(all.contains("bogus"), "{all}");
        // semantic problems are reported once the shape is right
        let err = load(
            "[server]\nlisten = \"nope\"\n[context]\nthreshold = 1.5\ntarget = 0.9\n",
            &[],
        )
        .unwrap_err();
        let all = err.0.join("\n");
        assert!(all.contains("server.listen"), "{all}");
        assert!(all.contains("context.threshold"), "{all}");
        assert_eq!(err.0.len(), 2, "{all}"); // listen, threshold: no derived complaint about hard_limit
        assert!(!all.contains("hard_limit"), "{all}");
    }

    #[test]
    fn a_window_too_small_for_clearing_is_warned_about() {
        let c = load("[models.\"tiny\"]\ncontext_window = 3000\n", &[]).unwrap();
        let w = c.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "models.\"tiny\".context_window = 3000: the rewrite's target (1200 tokens"
            ),
            "{w:?}"
        );
        let c = load(
            "[models.\"tiny\"]\ncontext_window = 3000\n[prune]\nkeep_tool_results = 1\n",
            &[],
        )
        .unwrap();
        assert!(c.warnings().is_empty(), "one kept result fits");
        assert!(Config::default().warnings().is_empty());
    }

    #[test]
    fn one_pass_reports_names_types_values_and_rules_together() {
        let err = load(
            "[server]\nlisten = \"nowhere\"\n[context]\nstrategy = \"summarise\"\nthreshold = 1.5\n\
             [models.\"gpt-4o-mini\"]\ncontext_window = \"big\"\n",
            &[("CTXGATE_STORE__TIMEOUT_MS", "0")],
        )
        .unwrap_err();
        let all = err.0.join("\n");
        for needle in [
            "context.strategy: unknown variant `summarise`",
            "models.\"gpt-4o-mini\".context_window: invalid type",
            "server.listen: \"nowhere\"",
            "context.threshold: 1.5 must be a fraction",
            "store.timeout_ms: must be greater than 0",
        ] {
            assert!(all.contains(needle), "missing {needle}: {all}");
        }
        assert_eq!(err.0.len(), 5, "{all}");
        // A rule between two keys names the one the file set, the other being a default.
        let err = load("[context]\nthreshold = 0.97\n", &[]).unwrap_err();
        assert_eq!(
            err.0,
            ["context.threshold: 0.97 must not exceed context.hard_limit (0.95, the default)"]
        );
        let err = load("[context]\nhard_limit = 0.5\n", &[]).unwrap_err();
        assert_eq!(
            err.0,
            ["context.hard_limit: 0.5 must not be below context.threshold (0.8, the default)"]
        );
    }

    #[test]
    fn env_overrides_file() {
        let c = load(
            "[upstream]\nbase_url = \"http://a.example/v1\"\n",
            &[
                ("CTXGATE_UPSTREAM__BASE_URL", "http://b.example/v1"),
                ("CTXGATE_SERVER__MAX_BODY_BYTES", "1024"),
                ("CTXGATE_REQUIRE_EXTERNAL", "1"),
                ("OTHER", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.upstream.base_url, "http://b.example/v1");
        assert_eq!(c.server.max_body_bytes, 1024);
        let err = load("", &[("CTXGATE_SERVER__NOPE", "1")]).unwrap_err();
        assert!(err.0[0].contains("server.nope"), "{:?}", err.0);
    }

    #[test]
    fn secrets_are_masked() {
        let c = load(
            "[upstream]\napi_key = \"sk-secret\"\n[admin]\ntoken = \"adm-secret-123\"\n",
            &[],
        )
        .unwrap();
        let shown = c.masked().to_toml();
        assert!(!shown.contains("sk-secret") && !shown.contains("adm-secret"));
        assert!(shown.contains("***"));
    }

    #[test]
    fn otel_is_off_by_default_and_its_header_values_are_masked() {
        assert_eq!(Config::default().otel.endpoint, None);
        let c = load(
            "[otel]\nendpoint = \"http://127.0.0.1:4318\"\nheaders = { x-honeycomb-team = \"hc-secret\" }\n",
            &[("CTXGATE_OTEL__SAMPLE_RATIO", "0.5")],
        )
        .unwrap();
        assert_eq!(c.otel.sample_ratio, 0.5);
        assert_eq!(c.otel.headers["x-honeycomb-team"], "hc-secret");
        let shown = c.masked().to_toml();
        assert!(
            !shown.contains("hc-secret") && shown.contains("x-honeycomb-team"),
            "{shown}"
        );
        let err = load("[otel]\nsample_ratio = 2.0\nendpont = \"x\"\n", &[]).unwrap_err();
        assert!(
            err.0.iter().any(|m| m.contains("otel.endpont")),
            "{:?}",
            err.0
        );
        let err = load("[otel]\nsample_ratio = 2.0\n", &[]).unwrap_err();
        assert!(
            err.0.iter().any(|m| m.contains("otel.sample_ratio")),
            "{:?}",
            err.0
        );
    }

    #[test]
    fn redis_keys_are_checked_and_their_passwords_masked() {
        let c = load(
            "[store]\nbackend = \"redis\"\nredis_url = \"redis://app:hunter2@db:6379/0\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.store.redis_prefix, "ctxgate:");
        let shown = c.masked().to_toml();
        assert!(!shown.contains("hunter2") && shown.contains("redis://app:***@db:6379/0"));
        let err = load(
            "[store]\nbackend = \"redis\"\nredis_url = \"http://db\"\nredis_prefix = \"a{b\"\n",
            &[],
        )
        .unwrap_err();
        assert!(
            err.0.iter().any(|m| m.contains("store.redis_url")),
            "{:?}",
            err.0
        );
        assert!(
            err.0.iter().any(|m| m.contains("store.redis_prefix")),
            "{:?}",
            err.0
        );
        let err = load(
            "[store]\nbackend = \"redis\"\nredis_cluster_nodes = [\"redis://a:1\", \"nope\"]\n",
            &[],
        )
        .unwrap_err();
        assert!(
            err.0
                .iter()
                .any(|m| m.contains("store.redis_cluster_nodes")),
            "{:?}",
            err.0
        );
        assert_eq!(mask_url_password("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(mask_url_password("redis://h:1/0"), "redis://h:1/0");
    }

    #[test]
    fn durations_and_models() {
        let c = load(
            "[prune]\nmax_age = \"7d\"\n[models.\"my-model*\"]\ncontext_window = 32000\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.prune.max_age, Some(DurationSpec(7 * 86_400)));
        assert_eq!(c.models["my-model*"].context_window, 32000);
        assert!(load("[prune]\nmax_age = \"soon\"\n", &[]).is_err());
        assert!(load("[models.\"x\"]\ncontext_windo = 1\n", &[]).is_err());
    }
}
