//! `[store]`: the durable backend (SQLite, Redis, memory), its cache, retention, timeouts and Redis addresses;
//! Redis passwords masked wherever a URL is shown.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[store]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Durable backend: `sqlite` (embedded, default), `redis` (shared by several instances) or `memory` (lost on
    /// restart).
    pub backend: StoreBackend,
    /// SQLite database file (created with its folder when missing).
    pub path: PathBuf,
    /// Bytes of memory the cache of message history in front of the store may take: what its sessions really
    /// hold (parsed messages, node ids, indexes, bookkeeping), so a container is sized by it (docs/operations.md,
    /// "Memory").
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

impl StoreConfig {
    /// The problems of these settings, as `store.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if self.cache_max_bytes == 0 {
            e.push("store.cache_max_bytes: must be greater than 0".into());
        }
        if self.timeout_ms == 0 {
            e.push("store.timeout_ms: must be greater than 0".into());
        }
        if self.queue_capacity == 0 {
            e.push("store.queue_capacity: must be greater than 0".into());
        }
        if self.backend == StoreBackend::Sqlite && self.path.as_os_str().is_empty() {
            e.push("store.path: must not be empty with backend = \"sqlite\"".into());
        }
        if self.backend == StoreBackend::Redis {
            self.check_redis(e);
        }
    }

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

    /// A copy with the Redis URLs' passwords masked.
    pub fn masked(&self) -> StoreConfig {
        let mut c = self.clone();
        c.redis_url = mask_url_password(&c.redis_url);
        for n in &mut c.redis_cluster_nodes {
            *n = mask_url_password(n);
        }
        c
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
