//! The connection to Redis: redis-rs's connection manager (standalone; reconnects by itself) or its async Cluster
//! connection (follows the slot map, reconnects by itself), behind one type; which failures are worth a retry.

use crate::config::StoreConfig;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, RetryMethod, ScriptInvocation};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Longest wait between reconnection attempts of the standalone connection manager.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);

/// A clonable handle on Redis, standalone or Cluster.
#[derive(Clone)]
pub(super) enum Conn {
    /// One server through the connection manager (lazy: connects on first use).
    Single(ConnectionManager),
    /// A Cluster: the connection is made on first use (and again after a failed attempt).
    Cluster(Arc<(ClusterClient, OnceCell<ClusterConnection>)>),
}

/// How long one Redis command may take before it fails (and the connection is re-established): the store timeout,
/// at least half a second.
fn response_timeout(cfg: &StoreConfig) -> Duration {
    Duration::from_millis(cfg.timeout_ms.max(500))
}

impl Conn {
    /// A handle for the configured Redis; connects lazily, so a Redis that is down at start only fails requests.
    pub(super) fn open(cfg: &StoreConfig) -> RedisResult<Conn> {
        let timeout = response_timeout(cfg);
        if cfg.redis_cluster_nodes.is_empty() {
            let client = redis::Client::open(cfg.redis_url.as_str())?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(timeout))
                .set_connection_timeout(Some(timeout))
                .set_max_delay(RECONNECT_MAX_DELAY);
            Ok(Conn::Single(client.get_connection_manager_lazy(config)?))
        } else {
            let client = ClusterClient::builder(cfg.redis_cluster_nodes.clone())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .build()?;
            Ok(Conn::Cluster(Arc::new((client, OnceCell::new()))))
        }
    }

    async fn cluster(
        client: &ClusterClient,
        cell: &OnceCell<ClusterConnection>,
    ) -> RedisResult<ClusterConnection> {
        cell.get_or_try_init(|| client.get_async_connection())
            .await
            .cloned()
    }

    /// Runs one command.
    pub(super) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(cluster) => {
                let mut c = Self::cluster(&cluster.0, &cluster.1).await?;
                cmd.query_async(&mut c).await
            }
        }
    }

    /// Runs a script (EVALSHA, loading it when the server lacks it).
    pub(super) async fn script<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self {
            Conn::Single(c) => inv.invoke_async(&mut c.clone()).await,
            Conn::Cluster(cluster) => {
                let mut c = Self::cluster(&cluster.0, &cluster.1).await?;
                inv.invoke_async(&mut c).await
            }
        }
    }
}

impl Conn {
    /// Whether every key lives on one server (keys of different slots may meet in one script).
    pub(super) fn standalone(&self) -> bool {
        matches!(self, Conn::Single(_))
    }
}

/// Failures that may go away by themselves (connection lost or refused, timeouts, a server loading its data or
/// failing over, a Cluster moving slots): the batch is kept and retried. Script and data errors are not.
pub(super) fn transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || !matches!(e.retry_method(), RetryMethod::NoRetry)
}

/// The tenant secret every instance shares, kept at `key` (created by the first instance, `SET NX`): read at start
/// over a short-lived synchronous connection.
pub(super) fn shared_secret(cfg: &StoreConfig, key: &str, fresh: &str) -> RedisResult<String> {
    let timeout = response_timeout(cfg);
    let set = redis::cmd("SET").arg(key).arg(fresh).arg("NX").clone();
    let get = redis::cmd("GET").arg(key).clone();
    if cfg.redis_cluster_nodes.is_empty() {
        let client = redis::Client::open(cfg.redis_url.as_str())?;
        let mut c = client.get_connection_with_timeout(timeout)?;
        c.set_read_timeout(Some(timeout))?;
        c.set_write_timeout(Some(timeout))?;
        set.query::<redis::Value>(&mut c)?;
        get.query(&mut c)
    } else {
        let client = ClusterClient::builder(cfg.redis_cluster_nodes.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()?;
        let mut c = client.get_connection()?;
        set.query::<redis::Value>(&mut c)?;
        get.query(&mut c)
    }
}
