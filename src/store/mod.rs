//! Durable history: the `Store` trait, its own row and record types, and its backends (embedded SQLite, memory).
//! The store depends on nothing above it: the session manager (which keeps the moka cache in front of it) converts
//! its message tree to and from [`NodeRow`]s.
//!
//! What every backend guarantees (the session manager relies on it):
//! - `write` never blocks: it queues (or applies) the batch and returns a receiver at once. A full queue refuses
//!   the batch at once with [`StoreError::QueueFull`] (the receiver is already resolved).
//! - A session's batches are applied in the order they were queued (a retried batch holds back the later batches
//!   of its sessions).
//! - A batch commits or fails on its own: a failing batch never fails another caller's batch committed with it.
//! - A transient failure (database busy, locked or read-only for a moment, I/O) does not drop a batch: the backend
//!   keeps it and retries, and its receiver resolves once it is committed. Only a batch that can never apply
//!   (or is still failing when the store shuts down) resolves with an error.
//! - A write for a session that does not exist (deleted by the admin API or the retention purge mid-turn) is a
//!   no-op: nodes and records are dropped, and a session row is only created by a write with `create: true`.
//! - Session rows never go backwards: a row is replaced only by one with a higher `version`, whatever order the
//!   batches arrive in.
//! - A barrier (an empty batch) resolves once every batch queued before it is committed.
//! - A store shared by several instances (Redis) says so ([`Store::shared`]) and answers [`Store::tail`]: what
//!   was appended to a session since a cursor, so that no instance serves a turn from a stale cache entry.

mod memory;
pub mod records;
mod redis;
pub mod rows;
mod sqlite;

pub use self::redis::RedisStore;
pub use memory::MemoryStore;
pub use records::{Compression, Record, RecordKind};
pub use rows::{NodeKind, NodeRow};
pub use sqlite::SqliteStore;

use crate::config::{StoreBackend, StoreConfig};
use crate::metrics::{self, Metrics, StoreMetrics};
use futures_util::future::BoxFuture;
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A store failure. Callers degrade to plain proxying; it never fails a chat request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend reported an error.
    #[error("{backend} store: {message}")]
    Backend {
        /// `sqlite`, `memory`, …
        backend: &'static str,
        /// What went wrong (never message content).
        message: String,
    },
    /// The store's worker is gone (shutting down or crashed).
    #[error("store worker is not running")]
    Closed,
    /// A session id belongs to another tenant.
    #[error("session belongs to another tenant")]
    TenantMismatch,
    /// The store did not answer within `store.timeout_ms` (the operation may still complete later).
    #[error("store did not answer within {0} ms")]
    Timeout(u64),
    /// The write queue holds `store.queue_capacity` batches: the batch was refused at once.
    #[error("store write queue is full")]
    QueueFull,
    /// The store's circuit breaker is open (an earlier operation timed out or failed and the background probe has
    /// not found the store healthy yet): not asked, or not waited for (a write stays queued).
    #[error("store unavailable (circuit open until a background probe finds it healthy); not waited for")]
    Unavailable,
}

/// A session's row: everything but its messages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionMeta {
    /// Public session id.
    pub id: String,
    /// The owner's tenant: HMAC-SHA256 (hex), under the per-install secret, of every credential header the
    /// requests carry (name and value), or `anonymous` when they carry none (see `session::tenant`).
    #[serde(skip)]
    pub tenant: String,
    /// The wire format its requests speak: `chat` or `anthropic`.
    pub dialect: String,
    /// Unix seconds of the first request.
    pub created_at: i64,
    /// Unix seconds of the latest request or reply.
    pub last_active: i64,
    /// Messages stored, all branches.
    pub message_count: u64,
    /// Rough token count of the current history.
    pub token_estimate: u64,
    /// The current leaf.
    #[serde(skip)]
    pub head: Option<String>,
    /// Bumped each time the row is rebuilt; a stored row is only replaced by one with a higher version, so
    /// writes applied out of order never move the metadata backwards.
    #[serde(skip)]
    pub version: u64,
    /// The strategy an operator pinned for this session (`PATCH /admin/sessions/{id}`), over the request header
    /// and the config; `None`: not pinned.
    pub strategy: Option<String>,
    /// The `last_active` of the idle period whose webhook is done (delivered, or refused by the receiver): the
    /// session is due again once it has been active since (`[hooks]`).
    pub idle_notified: Option<i64>,
}

/// A session as loaded from the store.
#[derive(Debug, Clone)]
pub struct StoredSession {
    /// Its row.
    pub meta: SessionMeta,
    /// Every node, all branches.
    pub nodes: Vec<NodeRow>,
    /// Compression records (rewrites and summaries), oldest first.
    pub compressions: Vec<Compression>,
    /// ctxgate's own exchanges with the model (recall rounds), oldest first.
    pub internal: Vec<serde_json::Value>,
}

/// How much of a session's stored history an instance has seen: entries of its append log (nodes) and records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Nodes stored.
    pub nodes: u64,
    /// Records stored.
    pub records: u64,
}

impl Cursor {
    /// The cursor after a whole load of `s`.
    pub fn of(s: &StoredSession) -> Cursor {
        Cursor {
            nodes: s.nodes.len() as u64,
            records: (s.compressions.len() + s.internal.len()) as u64,
        }
    }
}

/// What a shared store holds beyond a cursor.
#[derive(Debug, Clone)]
pub struct Tail {
    /// The session's row as stored now.
    pub meta: SessionMeta,
    /// Nodes appended since the cursor that the caller lacked.
    pub nodes: Vec<NodeRow>,
    /// Records appended since the cursor (the caller's own among them: it drops those it holds).
    pub records: Vec<Record>,
    /// The cursor now.
    pub cursor: Cursor,
}

/// The answer of [`Store::tail`].
#[derive(Debug, Clone)]
pub enum Fresh {
    /// The store is this instance's alone: its cache is always current.
    Local,
    /// The session is not in the store (deleted or expired, perhaps by another instance).
    Gone,
    /// What was appended since the cursor (possibly nothing); boxed: the other answers carry nothing.
    Tail(Box<Tail>),
}

/// The answer of [`Store::lock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// The store is this instance's alone: single flight within the process is enough.
    Local,
    /// Taken, with its fencing token (higher than every token handed out for that lock before).
    Acquired(u64),
    /// Another instance holds it.
    HeldElsewhere,
}

impl WriteOp {
    /// The session the op writes to.
    pub fn session(&self) -> &str {
        match self {
            WriteOp::Session { meta, .. } => &meta.id,
            WriteOp::Node { session, .. }
            | WriteOp::Turn { session, .. }
            | WriteOp::Record { session, .. } => session,
        }
    }
}

/// One write. The ops of a batch are applied in order, all or nothing.
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// Update a session's row when `meta.version` is newer than the stored one. Without `create`, a missing row
    /// stays missing (the session was deleted); with it, a missing row is created.
    Session {
        /// The row.
        meta: SessionMeta,
        /// Create the row when it does not exist (a new session's first write, or a rewrite after a lost write).
        create: bool,
    },
    /// Append a node (ignored when it exists: nodes are immutable).
    Node {
        /// Session id.
        session: String,
        /// The node.
        node: NodeRow,
    },
    /// Append a turn's record of what was sent upstream (JSON text, see `session::turns`). Turns are kept apart
    /// from the records: never loaded with the session, only read by [`Store::turns`].
    Turn {
        /// Session id.
        session: String,
        /// The turn record as JSON text.
        turn: String,
    },
    /// Append a record (compression or internal exchange).
    Record {
        /// Session id.
        session: String,
        /// Unix seconds.
        created_at: i64,
        /// The record.
        record: Record,
    },
}

/// A durable store of session histories. Writes are queued and committed per batch; the returned receiver
/// resolves once the batch is durable (see the module docs for the guarantees).
pub trait Store: Send + Sync + 'static {
    /// The backend's name for logs and metrics.
    fn backend(&self) -> &'static str;
    /// Queues a batch without blocking; resolves when it is committed (an empty batch: when everything queued
    /// before it is committed), or at once with [`StoreError::QueueFull`].
    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>>;
    /// Loads a session.
    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>>;
    /// Sessions by newest activity, paged; also returns the total.
    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>>;
    /// A page of a session's turn records (JSON text), oldest first, and how many it has (0 when it does not exist).
    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>>;
    /// Deletes a session; true when it existed.
    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>>;
    /// Deletes sessions idle since before `before` (unix seconds); returns how many.
    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>>;
    /// Whether other instances write to this store too (then cached sessions are checked with [`Store::tail`]).
    fn shared(&self) -> bool {
        false
    }
    /// What was appended to session `id` since `since`; nodes for which `have` is true are not fetched. A store
    /// that is not shared answers [`Fresh::Local`].
    fn tail(
        &self,
        _id: &str,
        _since: Cursor,
        _have: Box<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> BoxFuture<'static, Result<Fresh, StoreError>> {
        Box::pin(async { Ok(Fresh::Local) })
    }
    /// Takes lock `name` of session `id` for `ttl_ms` (it expires by itself: a crashed holder never blocks the
    /// others for longer), unless another instance holds it. A store that is not shared answers [`Lock::Local`].
    fn lock(
        &self,
        _id: &str,
        _name: &str,
        _ttl_ms: u64,
    ) -> BoxFuture<'static, Result<Lock, StoreError>> {
        Box::pin(async { Ok(Lock::Local) })
    }
    /// Releases lock `name` of session `id` if it is still held with `token` (never another holder's).
    fn unlock(
        &self,
        _id: &str,
        _name: &str,
        _token: u64,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
    /// Whether lock `name` of session `id` is held (by anyone).
    fn is_locked(&self, _id: &str, _name: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        Box::pin(async { Ok(false) })
    }
    /// Answers when the store does (for `/readyz`): by default a one-row listing, queued like any read.
    fn ping(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        let list = self.list(1, 0);
        Box::pin(async move { list.await.map(|_| ()) })
    }
}

/// Opens the configured backend.
pub fn open(cfg: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    open_instrumented(cfg, StoreMetrics::default())
}

/// Opens the configured backend for reading while a gateway may be running on it (`ctxgate sessions list`, `show`,
/// `export`, the source of `migrate`): a SQLite file is neither locked nor watched (see [`SqliteStore::open_reader`]);
/// the other backends open as [`open`] does.
pub fn open_reader(cfg: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    match cfg.backend {
        StoreBackend::Sqlite => Ok(Arc::new(SqliteStore::open_reader(
            &cfg.path,
            cfg.queue_capacity,
            StoreMetrics::default(),
        )?)),
        _ => open(cfg),
    }
}

/// Opens the configured backend, recording its operations' latency and errors in `metrics`.
pub fn open_with_metrics(
    cfg: &StoreConfig,
    metrics: &Metrics,
) -> Result<Arc<dyn Store>, StoreError> {
    open_instrumented(cfg, metrics.store_metrics(metrics_backend(cfg.backend)))
}

/// The metrics label of a configured backend.
pub fn metrics_backend(backend: StoreBackend) -> metrics::StoreBackend {
    match backend {
        StoreBackend::Memory => metrics::StoreBackend::Memory,
        StoreBackend::Sqlite => metrics::StoreBackend::Sqlite,
        StoreBackend::Redis => metrics::StoreBackend::Redis,
    }
}

fn open_instrumented(cfg: &StoreConfig, m: StoreMetrics) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match cfg.backend {
        StoreBackend::Memory => Arc::new(MemoryStore::with_metrics(m)),
        StoreBackend::Sqlite => Arc::new(SqliteStore::open_with(&cfg.path, cfg.queue_capacity, m)?),
        StoreBackend::Redis => Arc::new(RedisStore::open(cfg, m)?),
    })
}

/// Waits for a queued write.
pub async fn committed(rx: oneshot::Receiver<Result<(), StoreError>>) -> Result<(), StoreError> {
    rx.await.unwrap_or(Err(StoreError::Closed))
}
