//! The embedded SQLite backend: one worker thread owns the connection (WAL mode) and applies queued commands in
//! order, committing writes in small groups so that many sessions never queue on SQLite's lock. Each caller's
//! batch runs in its own savepoint inside the group's transaction, so one failing batch fails only its caller;
//! batches that failed for a transient reason (busy, locked, read-only, I/O) are kept and retried with backoff.

use super::{RecordKind, SessionMeta, Store, StoreError, StoredSession, WriteOp};
use crate::metrics::{StoreMetrics, StoreOp};
use crate::session::tree::{Node, NodeId, NodeKind};
use futures_util::future::BoxFuture;
use rusqlite::{params, Connection, DropBehavior, ErrorCode, OptionalExtension};
use std::collections::HashSet;
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Most commands applied in one transaction.
const GROUP: usize = 256;
/// Commands queued for the worker when no capacity is configured.
const DEFAULT_QUEUE: usize = 10_000;
/// First wait before retrying batches that failed for a transient reason; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between retries.
const RETRY_MAX: Duration = Duration::from_secs(2);

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Cmd {
    Write(Vec<WriteOp>, Reply<()>),
    Load(String, Reply<Option<StoredSession>>),
    List(u32, u64, Reply<(Vec<SessionMeta>, u64)>),
    Delete(String, Reply<bool>),
    Purge(i64, Reply<u64>),
    QueryOnly(bool, Reply<()>),
}

/// SQLite behind a worker thread.
pub struct SqliteStore {
    tx: mpsc::SyncSender<Cmd>,
    metrics: StoreMetrics,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        backend: "sqlite",
        message: e.to_string(),
    }
}

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
PRAGMA foreign_keys = ON;
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    last_active INTEGER NOT NULL,
    message_count INTEGER NOT NULL,
    token_estimate INTEGER NOT NULL,
    head TEXT,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions(last_active DESC);
CREATE TABLE IF NOT EXISTS nodes (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    node_id TEXT NOT NULL,
    parent_id TEXT,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    partial INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (session_id, node_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
";

/// Databases created before sessions had a version get the column (0: any newer write replaces the row).
fn migrate(conn: &Connection) -> Result<(), rusqlite::Error> {
    let has_version: i64 = conn.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name = 'version'",
        [],
        |r| r.get(0),
    )?;
    if has_version == 0 {
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0")?;
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating when missing) the database at `path` and starts its worker.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, DEFAULT_QUEUE, StoreMetrics::default())
    }

    /// Like [`SqliteStore::open`]; the worker records each operation's latency and errors in `metrics`.
    pub fn open_with_metrics(path: &Path, metrics: StoreMetrics) -> Result<Self, StoreError> {
        Self::open_with(path, DEFAULT_QUEUE, metrics)
    }

    /// Like [`SqliteStore::open_with_metrics`], queueing at most `queue_capacity` commands for the worker; beyond
    /// that, new commands are refused at once with [`StoreError::QueueFull`].
    pub fn open_with(
        path: &Path,
        queue_capacity: usize,
        metrics: StoreMetrics,
    ) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path)
            .map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        migrate(&conn).map_err(err)?;
        let (tx, rx) = mpsc::sync_channel::<Cmd>(queue_capacity.max(1));
        let worker_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("ctxgate-sqlite".into())
            .spawn(move || Worker::new(conn, worker_metrics).run(rx))
            .map_err(err)?;
        Ok(Self { tx, metrics })
    }

    /// Fault injection for tests: with `on`, the connection refuses every write (`PRAGMA query_only`), the way a
    /// database that became read-only fails; queued writes are kept and retried until it is turned off.
    #[doc(hidden)]
    pub fn set_query_only(&self, on: bool) -> BoxFuture<'static, Result<(), StoreError>> {
        self.send(StoreOp::Write, move |r| Cmd::QueryOnly(on, r))
    }

    fn send<T: Send + 'static>(
        &self,
        op: StoreOp,
        make: impl FnOnce(Reply<T>) -> Cmd,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (tx, rx) = oneshot::channel();
        let sent = match self.tx.try_send(make(tx)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.metrics.error(op);
                Err(StoreError::QueueFull)
            }
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Closed),
        };
        Box::pin(async move {
            sent?;
            rx.await.unwrap_or(Err(StoreError::Closed))
        })
    }
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        match self.tx.try_send(Cmd::Write(ops, tx)) {
            Ok(()) => {}
            Err(TrySendError::Full(Cmd::Write(_, tx))) => {
                self.metrics.error(StoreOp::Write);
                let _ = tx.send(Err(StoreError::QueueFull));
            }
            Err(TrySendError::Disconnected(Cmd::Write(_, tx))) => {
                let _ = tx.send(Err(StoreError::Closed));
            }
            Err(_) => {}
        }
        rx
    }

    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        let id = id.to_string();
        self.send(StoreOp::Load, move |r| Cmd::Load(id, r))
    }

    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        self.send(StoreOp::List, move |r| Cmd::List(limit, offset, r))
    }

    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let id = id.to_string();
        self.send(StoreOp::Delete, move |r| Cmd::Delete(id, r))
    }

    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.send(StoreOp::Purge, move |r| Cmd::Purge(before, r))
    }
}

/// One caller's batch.
struct Batch {
    ops: Vec<WriteOp>,
    reply: Reply<()>,
}

/// The worker thread's state: the connection, batches waiting for a retry, and barriers waiting for them.
struct Worker {
    conn: Connection,
    metrics: StoreMetrics,
    /// Batches that failed for a transient reason, oldest first.
    retry: Vec<Batch>,
    /// Empty batches (flushes) queued while retries were pending: answered once none is.
    barriers: Vec<Reply<()>>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl Worker {
    fn new(conn: Connection, metrics: StoreMetrics) -> Self {
        Self {
            conn,
            metrics,
            retry: Vec::new(),
            barriers: Vec::new(),
            retry_at: None,
            backoff: RETRY_FIRST,
        }
    }

    /// Runs until every sender is gone; whatever was queued is applied first, so nothing queued is lost.
    fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        loop {
            let first = match self.retry_at {
                None => match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                },
                Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                },
            };
            let mut writes: Vec<Batch> = Vec::new();
            if self.retry_at.is_some_and(|at| at <= Instant::now()) {
                self.retry_at = None;
                writes.append(&mut self.retry);
            }
            let mut next = first;
            // Group commit: take every write already queued (up to GROUP) into one transaction.
            while let Some(cmd) = next.take() {
                match cmd {
                    Cmd::Write(ops, reply) => {
                        writes.push(Batch { ops, reply });
                        if writes.len() < GROUP {
                            next = rx.try_recv().ok();
                        }
                    }
                    other => {
                        // Reads and deletes see every write queued before them.
                        self.commit_group(std::mem::take(&mut writes));
                        self.run_other(other);
                        next = rx.try_recv().ok();
                    }
                }
            }
            self.commit_group(writes);
        }
        self.shut_down();
    }

    /// The queue is closed: one last attempt at the batches still failing, then they are given up (logged).
    fn shut_down(mut self) {
        if !self.retry.is_empty() {
            let pending = std::mem::take(&mut self.retry);
            self.commit_group(pending);
        }
        if !self.retry.is_empty() {
            tracing::error!(
                batches = self.retry.len(),
                "sqlite: writes still failing at shutdown were lost"
            );
        }
        for b in self.retry.drain(..) {
            let _ = b.reply.send(Err(StoreError::Closed));
        }
        for r in self.barriers.drain(..) {
            let _ = r.send(Err(StoreError::Closed));
        }
    }

    fn commit_group(&mut self, writes: Vec<Batch>) {
        let (writes, barriers): (Vec<Batch>, Vec<Batch>) =
            writes.into_iter().partition(|b| !b.ops.is_empty());
        self.barriers.extend(barriers.into_iter().map(|b| b.reply));
        if !writes.is_empty() {
            // A session with a batch waiting for a retry keeps its order: its later batches wait behind it.
            let mut blocked: HashSet<String> = self
                .retry
                .iter()
                .flat_map(|b| b.ops.iter().map(|op| op_session(op).to_string()))
                .collect();
            let started = Instant::now();
            let results = commit_batches(&mut self.conn, &writes, &mut blocked);
            let mut failed = false;
            for (batch, result) in writes.into_iter().zip(results) {
                match result {
                    Outcome::Committed => {
                        let _ = batch.reply.send(Ok(()));
                    }
                    Outcome::Deferred => self.retry.push(batch),
                    Outcome::Failed(e) if transient(&e) => {
                        failed = true;
                        tracing::warn!(error = %e, "sqlite: write failed, kept for a retry");
                        self.retry.push(batch);
                    }
                    Outcome::Failed(e) => {
                        failed = true;
                        tracing::error!(error = %e, "sqlite: write cannot be applied; dropped");
                        let _ = batch.reply.send(Err(err(e)));
                    }
                }
            }
            self.metrics.observe(StoreOp::Write, started, !failed);
            if self.retry.is_empty() {
                self.backoff = RETRY_FIRST;
            } else if self.retry_at.is_none() {
                self.retry_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(RETRY_MAX);
            }
        }
        if self.retry.is_empty() {
            for r in self.barriers.drain(..) {
                let _ = r.send(Ok(()));
            }
        }
    }

    fn run_other(&mut self, cmd: Cmd) {
        if let Cmd::Delete(id, _) = &cmd {
            self.forget_retries(id);
        }
        run_other(&mut self.conn, cmd, &self.metrics);
    }

    /// A deleted session's writes waiting for a retry would only be dropped: answer them now.
    fn forget_retries(&mut self, id: &str) {
        let mut kept = Vec::with_capacity(self.retry.len());
        for mut b in self.retry.drain(..) {
            b.ops.retain(|op| op_session(op) != id);
            if b.ops.is_empty() {
                let _ = b.reply.send(Ok(()));
            } else {
                kept.push(b);
            }
        }
        self.retry = kept;
    }
}

fn op_session(op: &WriteOp) -> &str {
    match op {
        WriteOp::Session { meta, .. } => &meta.id,
        WriteOp::Node { session, .. } | WriteOp::Record { session, .. } => session,
    }
}

/// Failures that may go away by themselves: the batch is worth retrying.
fn transient(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::ReadOnly
                | ErrorCode::SystemIoFailure
                | ErrorCode::DiskFull
                | ErrorCode::CannotOpen
                | ErrorCode::OutOfMemory
                | ErrorCode::FileLockingProtocolFailed
        )
    )
}

/// What became of one batch of a group.
enum Outcome {
    Committed,
    /// Not tried: an earlier batch of the same session is waiting for a retry.
    Deferred,
    Failed(rusqlite::Error),
}

/// Applies each batch in its own savepoint of one transaction; returns each batch's outcome. A batch touching a
/// session in `blocked` is deferred; a batch failing for a transient reason blocks its sessions. When the
/// transaction itself fails (begin or commit), every batch gets that error.
fn commit_batches(
    conn: &mut Connection,
    writes: &[Batch],
    blocked: &mut HashSet<String>,
) -> Vec<Outcome> {
    let before = blocked.clone();
    let mut run = |conn: &mut Connection| -> Result<Vec<Outcome>, rusqlite::Error> {
        let mut tx = conn.transaction()?;
        let mut results = Vec::with_capacity(writes.len());
        for batch in writes {
            if batch.ops.iter().any(|op| blocked.contains(op_session(op))) {
                results.push(Outcome::Deferred);
                continue;
            }
            let mut sp = tx.savepoint()?;
            match batch.ops.iter().try_for_each(|op| apply(&sp, op)) {
                Ok(()) => {
                    sp.commit()?;
                    results.push(Outcome::Committed);
                }
                Err(e) => {
                    sp.set_drop_behavior(DropBehavior::Rollback);
                    sp.finish()?;
                    if transient(&e) {
                        blocked.extend(batch.ops.iter().map(|op| op_session(op).to_string()));
                    }
                    results.push(Outcome::Failed(e));
                }
            }
        }
        tx.commit()?;
        Ok(results)
    };
    match run(conn) {
        Ok(results) => results,
        Err(e) => {
            *blocked = before;
            let code = e.sqlite_error_code().unwrap_or(ErrorCode::Unknown);
            let message = e.to_string();
            writes
                .iter()
                .map(|_| {
                    Outcome::Failed(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error {
                            code,
                            extended_code: 0,
                        },
                        Some(message.clone()),
                    ))
                })
                .collect()
        }
    }
}

fn apply(conn: &Connection, op: &WriteOp) -> Result<(), rusqlite::Error> {
    match op {
        WriteOp::Session { meta: m, create } => {
            let sql = if *create {
                "INSERT INTO sessions (id, tenant, created_at, last_active, message_count, token_estimate, head, version)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(id) DO UPDATE SET last_active = excluded.last_active,
                   message_count = excluded.message_count, token_estimate = excluded.token_estimate,
                   head = excluded.head, version = excluded.version
                 WHERE excluded.version > sessions.version"
            } else {
                "UPDATE sessions SET last_active = ?4, message_count = ?5, token_estimate = ?6, head = ?7,
                   version = ?8
                 WHERE id = ?1 AND tenant = ?2 AND created_at = ?3 AND version < ?8"
            };
            conn.prepare_cached(sql)?.execute(params![
                m.id,
                m.tenant,
                m.created_at,
                m.last_active,
                m.message_count as i64,
                m.token_estimate as i64,
                m.head,
                m.version as i64
            ])?;
        }
        WriteOp::Node { session, node } => {
            conn.prepare_cached(
                "INSERT OR IGNORE INTO nodes (session_id, node_id, parent_id, position, kind, partial, created_at, message)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1)",
            )?
            .execute(params![
                session,
                &*node.id,
                node.parent.as_deref(),
                node.position,
                node.kind.as_str(),
                node.partial,
                node.created_at,
                node.message.to_string()
            ])?;
        }
        WriteOp::Record {
            kind,
            session,
            created_at,
            record,
        } => {
            conn.prepare_cached(
                "INSERT INTO records (session_id, seq, kind, created_at, record)
                 SELECT ?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM records WHERE session_id = ?1), ?2, ?3, ?4
                 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1)",
            )?
            .execute(params![session, kind.as_str(), created_at, record.to_string()])?;
        }
    }
    Ok(())
}

fn run_other(conn: &mut Connection, cmd: Cmd, metrics: &StoreMetrics) {
    let started = Instant::now();
    match cmd {
        Cmd::Write(..) => {}
        Cmd::QueryOnly(on, r) => {
            let res = conn.pragma_update(None, "query_only", on).map_err(err);
            let _ = r.send(res);
        }
        Cmd::Load(id, r) => {
            let res = load(conn, &id).map_err(err);
            metrics.observe(StoreOp::Load, started, res.is_ok());
            let _ = r.send(res);
        }
        Cmd::List(limit, offset, r) => {
            let res = list(conn, limit, offset).map_err(err);
            metrics.observe(StoreOp::List, started, res.is_ok());
            let _ = r.send(res);
        }
        Cmd::Delete(id, r) => {
            let res = conn
                .execute("DELETE FROM sessions WHERE id = ?1", params![id])
                .map(|n| n > 0)
                .map_err(err);
            metrics.observe(StoreOp::Delete, started, res.is_ok());
            let _ = r.send(res);
        }
        Cmd::Purge(before, r) => {
            let res = conn
                .execute(
                    "DELETE FROM sessions WHERE last_active < ?1",
                    params![before],
                )
                .map(|n| n as u64)
                .map_err(err);
            metrics.observe(StoreOp::Purge, started, res.is_ok());
            let _ = r.send(res);
        }
    }
}

fn meta_from_row(row: &rusqlite::Row<'_>) -> Result<SessionMeta, rusqlite::Error> {
    Ok(SessionMeta {
        id: row.get(0)?,
        tenant: row.get(1)?,
        created_at: row.get(2)?,
        last_active: row.get(3)?,
        message_count: row.get::<_, i64>(4)? as u64,
        token_estimate: row.get::<_, i64>(5)? as u64,
        head: row.get(6)?,
        version: row.get::<_, i64>(7)? as u64,
    })
}

const META_COLS: &str =
    "id, tenant, created_at, last_active, message_count, token_estimate, head, version";

fn load(conn: &Connection, id: &str) -> Result<Option<StoredSession>, rusqlite::Error> {
    let meta = conn
        .prepare_cached(&format!("SELECT {META_COLS} FROM sessions WHERE id = ?1"))?
        .query_row(params![id], meta_from_row)
        .optional()?;
    let Some(meta) = meta else { return Ok(None) };
    let mut stmt = conn.prepare_cached(
        "SELECT node_id, parent_id, position, kind, partial, created_at, message FROM nodes
         WHERE session_id = ?1 ORDER BY position, created_at",
    )?;
    let nodes = stmt
        .query_map(params![id], |row| {
            let text: String = row.get(6)?;
            let kind: String = row.get(3)?;
            Ok(Node {
                id: NodeId::from(row.get::<_, String>(0)?),
                parent: row.get::<_, Option<String>>(1)?.map(NodeId::from),
                position: row.get(2)?,
                kind: NodeKind::parse(&kind),
                partial: row.get(4)?,
                created_at: row.get(5)?,
                message: Arc::new(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut stmt =
        conn.prepare_cached("SELECT kind, record FROM records WHERE session_id = ?1 ORDER BY seq")?;
    let (mut compressions, mut internal) = (Vec::new(), Vec::new());
    let rows = stmt.query_map(params![id], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
    })?;
    for (kind, text) in rows.filter_map(Result::ok) {
        let Ok(v) = serde_json::from_str(&text) else {
            continue;
        };
        if kind == RecordKind::Internal.as_str() {
            internal.push(v);
        } else {
            compressions.push(v);
        }
    }
    Ok(Some(StoredSession {
        meta,
        nodes,
        compressions,
        internal,
    }))
}

fn list(
    conn: &Connection,
    limit: u32,
    offset: u64,
) -> Result<(Vec<SessionMeta>, u64), rusqlite::Error> {
    let total: i64 = conn.query_row("SELECT COUNT(*) FROM sessions", [], |r| r.get(0))?;
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {META_COLS} FROM sessions ORDER BY last_active DESC, id LIMIT ?1 OFFSET ?2"
    ))?;
    let rows = stmt
        .query_map(params![limit, offset as i64], meta_from_row)?
        .collect::<Result<Vec<_>, _>>()?;
    Ok((rows, total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::committed;
    use serde_json::json;

    fn node(id: &str, parent: Option<&str>, pos: u32) -> Node {
        Node {
            id: NodeId::from(id),
            parent: parent.map(NodeId::from),
            position: pos,
            message: Arc::new(json!({"role":"user","content":id})),
            kind: NodeKind::Client,
            partial: false,
            created_at: 1,
        }
    }

    fn meta(id: &str, last: i64) -> SessionMeta {
        SessionMeta {
            id: id.into(),
            tenant: "t".into(),
            created_at: 1,
            last_active: last,
            message_count: 2,
            token_estimate: 3,
            head: Some("b".into()),
            version: 1,
        }
    }

    fn create(m: SessionMeta) -> WriteOp {
        WriteOp::Session {
            meta: m,
            create: true,
        }
    }

    fn add(session: &str, n: Node) -> WriteOp {
        WriteOp::Node {
            session: session.into(),
            node: n,
        }
    }

    #[tokio::test]
    async fn write_reopen_list_delete_purge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ctx.db");
        {
            let s = SqliteStore::open(&path).unwrap();
            let ops = vec![
                create(meta("s1", 10)),
                WriteOp::Node {
                    session: "s1".into(),
                    node: node("a", None, 0),
                },
                WriteOp::Node {
                    session: "s1".into(),
                    node: node("b", Some("a"), 1),
                },
                WriteOp::Node {
                    session: "s1".into(),
                    node: node("b", Some("a"), 1),
                },
                WriteOp::Record {
                    kind: RecordKind::Compression,
                    session: "s1".into(),
                    created_at: 5,
                    record: json!({"x":1}),
                },
                WriteOp::Record {
                    kind: RecordKind::Internal,
                    session: "s1".into(),
                    created_at: 6,
                    record: json!({"y":2}),
                },
                create(meta("s2", 20)),
            ];
            committed(s.write(ops)).await.unwrap();
        }
        let s = SqliteStore::open(&path).unwrap();
        let loaded = s.load("s1").await.unwrap().unwrap();
        assert_eq!(loaded.nodes.len(), 2);
        assert_eq!(loaded.meta.head.as_deref(), Some("b"));
        assert_eq!(loaded.compressions, vec![json!({"x":1})]);
        assert_eq!(loaded.internal, vec![json!({"y":2})]);
        let (page, total) = s.list(10, 0).await.unwrap();
        assert_eq!(total, 2);
        assert_eq!(page[0].id, "s2");
        assert!(s.delete("s2").await.unwrap());
        assert!(!s.delete("s2").await.unwrap());
        assert_eq!(s.purge_idle(11).await.unwrap(), 1);
        assert!(s.load("s1").await.unwrap().is_none());
    }

    fn conn() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c
    }

    fn count(c: &Connection, sql: &str) -> i64 {
        c.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_write_for_a_vanished_session_does_not_fail_the_group() {
        let (tx_a, mut rx_a) = oneshot::channel();
        let (tx_b, mut rx_b) = oneshot::channel();
        let (tx_c, mut rx_c) = oneshot::channel();
        let mut w = Worker::new(conn(), StoreMetrics::default());
        w.commit_group(vec![
            Batch {
                ops: vec![create(meta("live", 1)), add("live", node("a", None, 0))],
                reply: tx_a,
            },
            // Deleted mid-turn: its reply and row update must be no-ops, not a failed group.
            Batch {
                ops: vec![
                    add("gone", node("r", None, 0)),
                    WriteOp::Record {
                        kind: RecordKind::Internal,
                        session: "gone".into(),
                        created_at: 1,
                        record: json!({}),
                    },
                    WriteOp::Session {
                        meta: meta("gone", 2),
                        create: false,
                    },
                ],
                reply: tx_b,
            },
            Batch {
                ops: vec![add("live", node("b", Some("a"), 1))],
                reply: tx_c,
            },
        ]);
        assert!(matches!(rx_a.try_recv(), Ok(Ok(()))));
        assert!(matches!(rx_b.try_recv(), Ok(Ok(()))));
        assert!(matches!(rx_c.try_recv(), Ok(Ok(()))));
        assert_eq!(
            count(
                &w.conn,
                "SELECT COUNT(*) FROM nodes WHERE session_id = 'live'"
            ),
            2
        );
        assert_eq!(
            count(&w.conn, "SELECT COUNT(*) FROM sessions WHERE id = 'gone'"),
            0
        );
        assert_eq!(
            count(
                &w.conn,
                "SELECT COUNT(*) FROM nodes WHERE session_id = 'gone'"
            ),
            0
        );
        assert_eq!(count(&w.conn, "SELECT COUNT(*) FROM records"), 0);
    }

    #[test]
    fn a_failing_batch_fails_only_its_caller() {
        let mut w = Worker::new(conn(), StoreMetrics::default());
        // A batch that can never apply: a trigger refuses its node.
        w.conn
            .execute_batch("CREATE TRIGGER refuse BEFORE INSERT ON nodes WHEN NEW.node_id = 'bad' BEGIN SELECT RAISE(ABORT, 'refused'); END;")
            .unwrap();
        let (tx_a, mut rx_a) = oneshot::channel();
        let (tx_b, mut rx_b) = oneshot::channel();
        w.commit_group(vec![
            Batch {
                ops: vec![create(meta("s", 1)), add("s", node("bad", None, 0))],
                reply: tx_a,
            },
            Batch {
                ops: vec![create(meta("t", 1)), add("t", node("ok", None, 0))],
                reply: tx_b,
            },
        ]);
        assert!(matches!(
            rx_a.try_recv(),
            Ok(Err(StoreError::Backend { .. }))
        ));
        assert!(matches!(rx_b.try_recv(), Ok(Ok(()))));
        // The failed batch left nothing behind, not even its row.
        assert_eq!(
            count(&w.conn, "SELECT COUNT(*) FROM sessions WHERE id = 's'"),
            0
        );
        assert_eq!(
            count(&w.conn, "SELECT COUNT(*) FROM nodes WHERE session_id = 't'"),
            1
        );
    }

    #[test]
    fn session_rows_never_go_backwards() {
        let mut w = Worker::new(conn(), StoreMetrics::default());
        let row = |v: u64, count: u64, head: &str| SessionMeta {
            version: v,
            message_count: count,
            head: Some(head.into()),
            ..meta("s", 1)
        };
        let (tx, _rx) = oneshot::channel();
        w.commit_group(vec![Batch {
            ops: vec![
                create(row(1, 1, "a")),
                WriteOp::Session {
                    meta: row(3, 3, "c"),
                    create: false,
                },
                // Built before the one above, applied after it: ignored.
                WriteOp::Session {
                    meta: row(2, 2, "b"),
                    create: false,
                },
                create(row(2, 2, "b")),
            ],
            reply: tx,
        }]);
        let stored = load(&w.conn, "s").unwrap().unwrap().meta;
        assert_eq!((stored.version, stored.message_count), (3, 3));
        assert_eq!(stored.head.as_deref(), Some("c"));
    }

    #[tokio::test]
    async fn a_transient_failure_is_retried_and_nothing_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(&dir.path().join("ctx.db")).unwrap();
        committed(s.write(vec![create(meta("s", 1)), add("s", node("a", None, 0))]))
            .await
            .unwrap();
        s.set_query_only(true).await.unwrap();
        let mut rx = s.write(vec![add("s", node("b", Some("a"), 1))]);
        let flushed = s.write(Vec::new());
        // Loads run after the writes queued before them: the write was tried, failed, and is kept.
        assert_eq!(s.load("s").await.unwrap().unwrap().nodes.len(), 1);
        assert!(
            rx.try_recv().is_err(),
            "not answered while it cannot commit"
        );
        s.set_query_only(false).await.unwrap();
        committed(rx).await.unwrap();
        committed(flushed).await.unwrap();
        assert_eq!(s.load("s").await.unwrap().unwrap().nodes.len(), 2);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctx.db");
        let s = SqliteStore::open_with(&path, 1, StoreMetrics::default()).unwrap();
        committed(s.write(vec![create(meta("s", 1))]))
            .await
            .unwrap();
        // Another connection holds the write lock: the worker waits on the first write it takes.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let rxs: Vec<_> = (0..5)
            .map(|i| s.write(vec![add("s", node(&format!("n{i}"), None, 0))]))
            .collect();
        let mut refused = 0;
        let mut accepted = Vec::new();
        for mut rx in rxs {
            match rx.try_recv() {
                Ok(Err(StoreError::QueueFull)) => refused += 1,
                _ => accepted.push(rx),
            }
        }
        assert!(
            refused >= 3,
            "at most one queued and one taken: {refused} refused"
        );
        other.execute_batch("COMMIT").unwrap();
        for rx in accepted {
            committed(rx).await.unwrap();
        }
    }

    #[test]
    fn old_databases_get_the_version_column() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at INTEGER NOT NULL,
             last_active INTEGER NOT NULL, message_count INTEGER NOT NULL, token_estimate INTEGER NOT NULL, head TEXT);
             INSERT INTO sessions VALUES ('s', 't', 1, 1, 2, 3, 'b');",
        )
        .unwrap();
        c.execute_batch(SCHEMA).unwrap();
        migrate(&c).unwrap();
        migrate(&c).unwrap();
        assert_eq!(load(&c, "s").unwrap().unwrap().meta.version, 0);
    }
}
