//! The Redis backend (standalone or Cluster), for several ctxgate instances sharing one history: the same contract
//! as SQLite (see the module docs of `store`), writes applied by one task in per-session lanes (`worker.rs`), each
//! session's batch one Lua script on keys under the session's hash tag (`scripts.rs`), so atomic on Cluster too.
//!
//! Layout (`codec.rs`): per session `<prefix>{<id>}:meta|nodes|log|records|rids|turns`, expiring `store.retention_days`
//! after the session's last write (each write refreshes the TTL); one sorted set `<prefix>sessions` of ids by
//! `last_active` for `list` and `purge_idle` (on standalone Redis the session's script updates it; on Cluster it
//! lives in its own slot and is updated right after the session's script: a crash in between leaves it one write behind, repaired by the next write; ids whose session
//! expired or was deleted are dropped from it when met); `<prefix>secret`, the tenant secret every instance shares.
//!
//! Across instances: `log` is the session's append cursor. [`Store::tail`] returns what was appended since the
//! cursor an instance has seen (node ids first; only the nodes it lacks are then fetched), so an instance never
//! serves a turn from a stale cache entry.

mod codec;
mod conn;
mod queries;
mod scripts;
mod worker;

use super::WriteOp;
use super::{Cursor, Fresh, Lock, SessionMeta, Store, StoreError, StoredSession};
use crate::config::StoreConfig;
use crate::metrics::{StoreMetrics, StoreOp};
use codec::Keys;
use conn::Conn;
use futures_util::future::BoxFuture;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use worker::{err, Cmd, Worker};

/// How long a session's fencing counter is kept after its last lock (tokens only need to grow while locks held
/// with older ones may still be around).
const FENCE_KEEP_MS: u64 = 86_400_000;

/// Redis behind a writer task.
pub struct RedisStore {
    tx: mpsc::UnboundedSender<Cmd>,
    conn: Conn,
    keys: Keys,
    capacity: usize,
    queued: Arc<AtomicUsize>,
    metrics: StoreMetrics,
}

impl RedisStore {
    /// A store on the configured Redis (`store.redis_url`, or `store.redis_cluster_nodes`); connects lazily, so a
    /// Redis that is down only fails operations until it is back. Call within a tokio runtime.
    pub fn open(cfg: &StoreConfig, metrics: StoreMetrics) -> Result<Self, StoreError> {
        let conn = Conn::open(cfg).map_err(err)?;
        let keys = Keys::new(&cfg.redis_prefix);
        let ttl_ms = cfg.retention_days.saturating_mul(86_400_000);
        let queued = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = Worker::new(
            conn.clone(),
            keys.clone(),
            ttl_ms,
            metrics.clone(),
            queued.clone(),
        );
        let handle = tokio::runtime::Handle::try_current().map_err(|e| StoreError::Backend {
            backend: "redis",
            message: format!("the Redis store needs a tokio runtime: {e}"),
        })?;
        handle.spawn(worker.run(rx));
        Ok(Self {
            tx,
            conn,
            keys,
            capacity: cfg.queue_capacity.max(1),
            queued,
            metrics,
        })
    }

    /// The tenant secret (64 hex digits) every instance on this Redis shares: `fresh` is stored when there is none
    /// yet (`SET NX`), and whichever was stored first is returned. Blocks (a synchronous connection): call at start.
    pub fn shared_secret(cfg: &StoreConfig, fresh: &str) -> Result<String, StoreError> {
        conn::shared_secret(cfg, &Keys::new(&cfg.redis_prefix).secret(), fresh).map_err(err)
    }

    fn send<T>(
        &self,
        make: impl FnOnce(worker::Reply<T>) -> Cmd,
    ) -> BoxFuture<'static, Result<T, StoreError>>
    where
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(make(tx)).map_err(|_| StoreError::Closed);
        Box::pin(async move {
            sent?;
            rx.await.unwrap_or(Err(StoreError::Closed))
        })
    }
}

impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        if !ops.is_empty() {
            // Bounded like SQLite's queue: batches not finished yet, refused at once beyond the capacity.
            let before = self.queued.fetch_add(1, Ordering::Relaxed);
            if before >= self.capacity {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                self.metrics.error(StoreOp::Write);
                let _ = tx.send(Err(StoreError::QueueFull));
                return rx;
            }
        }
        // One id per record and turn, fixed now: a retried batch never stores one twice.
        let record_ids = ops
            .iter()
            .filter(|op| codec::needs_id(op))
            .map(|_| record_id())
            .collect();
        let writes = !ops.is_empty();
        if let Err(mpsc::error::SendError(Cmd::Write(_, _, tx))) =
            self.tx.send(Cmd::Write(ops, record_ids, tx))
        {
            if writes {
                self.queued.fetch_sub(1, Ordering::Relaxed);
            }
            let _ = tx.send(Err(StoreError::Closed));
        }
        rx
    }

    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        let id = id.to_string();
        self.send(move |r| Cmd::Load(id, r))
    }

    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        let (conn, keys, metrics) = (self.conn.clone(), self.keys.clone(), self.metrics.clone());
        Box::pin(async move {
            let started = Instant::now();
            let r = queries::list(&conn, &keys, limit, offset)
                .await
                .map_err(err);
            metrics.observe(StoreOp::List, started, r.is_ok());
            r
        })
    }

    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        let (conn, keys, metrics) = (self.conn.clone(), self.keys.clone(), self.metrics.clone());
        let id = id.to_string();
        Box::pin(async move {
            let started = Instant::now();
            let r = queries::turns(&conn, &keys, &id, offset, limit)
                .await
                .map_err(err);
            metrics.observe(StoreOp::Load, started, r.is_ok());
            r
        })
    }

    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let id = id.to_string();
        self.send(move |r| Cmd::Delete(id, r))
    }

    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        let (conn, keys, metrics) = (self.conn.clone(), self.keys.clone(), self.metrics.clone());
        Box::pin(async move {
            let started = Instant::now();
            let r = queries::purge(&conn, &keys, before).await.map_err(err);
            metrics.observe(StoreOp::Purge, started, r.is_ok());
            r
        })
    }

    fn shared(&self) -> bool {
        true
    }

    fn tail(
        &self,
        id: &str,
        since: Cursor,
        have: Box<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> BoxFuture<'static, Result<Fresh, StoreError>> {
        let (conn, keys, metrics) = (self.conn.clone(), self.keys.clone(), self.metrics.clone());
        let id = id.to_string();
        Box::pin(async move {
            let started = Instant::now();
            let r = queries::tail(&conn, &keys, &id, since, have)
                .await
                .map_err(err);
            metrics.observe(StoreOp::Load, started, r.is_ok());
            r
        })
    }

    fn lock(
        &self,
        id: &str,
        name: &str,
        ttl_ms: u64,
    ) -> BoxFuture<'static, Result<Lock, StoreError>> {
        let (conn, keys) = (self.conn.clone(), self.keys.lock(id, name));
        Box::pin(async move {
            let mut inv = scripts::LOCK.prepare_invoke();
            inv.key(&keys[0])
                .key(&keys[1])
                .arg(ttl_ms.max(1))
                .arg(FENCE_KEEP_MS.max(ttl_ms));
            let token: u64 = conn.script(&inv).await.map_err(err)?;
            Ok(if token == 0 {
                Lock::HeldElsewhere
            } else {
                Lock::Acquired(token)
            })
        })
    }

    fn unlock(
        &self,
        id: &str,
        name: &str,
        token: u64,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let (conn, keys) = (self.conn.clone(), self.keys.lock(id, name));
        Box::pin(async move {
            let mut inv = scripts::UNLOCK.prepare_invoke();
            inv.key(&keys[0]).arg(token);
            conn.script::<i64>(&inv).await.map(|_| ()).map_err(err)
        })
    }

    fn is_locked(&self, id: &str, name: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let (conn, keys) = (self.conn.clone(), self.keys.lock(id, name));
        Box::pin(async move {
            conn.query::<i64>(redis::cmd("EXISTS").arg(&keys[0]))
                .await
                .map(|n| n > 0)
                .map_err(err)
        })
    }

    fn ping(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        let conn = self.conn.clone();
        Box::pin(async move {
            conn.query::<String>(&redis::cmd("PING"))
                .await
                .map(|_| ())
                .map_err(err)
        })
    }
}

/// A fresh id for a record or turn: 128 random bits in hex. Without the system's randomness (never seen), the
/// clock and a per-process counter, which still never repeat within the process.
fn record_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b[..8].copy_from_slice(&nanos.to_be_bytes());
        b[8..].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    }
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::record_id;

    #[test]
    fn record_ids_are_128_bits_in_hex_and_never_repeat() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| record_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids
            .iter()
            .all(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())));
    }
}
