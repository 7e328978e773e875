//! The embedded SQLite backend: one worker thread owns the connection (WAL mode) and applies queued commands in
//! order, committing writes in small groups so that many sessions never queue on SQLite's lock. Each caller's
//! batch runs in its own savepoint inside the group's transaction, so one failing batch fails only its caller;
//! batches that failed for a transient reason (busy, locked, read-only, I/O) are kept and retried with backoff.
//! The database file is locked for one gateway (`file`); the worker notices when it is deleted or replaced and
//! writes it back from the open connection (`watch`, `restore`).

mod file;
mod restore;
mod watch;
mod worker;

use super::{NodeKind, NodeRow, Record, SessionMeta, Store, StoreError, StoredSession, WriteOp};
use crate::metrics::{StoreMetrics, StoreOp};
use futures_util::future::BoxFuture;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::mpsc::{self, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;
use watch::Watch;
use worker::Worker;

/// Commands queued for the worker when no capacity is configured.
const DEFAULT_QUEUE: usize = 10_000;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Cmd {
    Write(Vec<WriteOp>, Reply<()>),
    Load(String, Reply<Option<StoredSession>>),
    List(u32, u64, Reply<(Vec<SessionMeta>, u64)>),
    Turns(String, u64, u32, Reply<(Vec<String>, u64)>),
    Delete(String, Reply<bool>),
    Purge(i64, Reply<u64>),
    QueryOnly(bool, Reply<()>),
    Ping(Reply<()>),
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
    version INTEGER NOT NULL DEFAULT 0,
    dialect TEXT NOT NULL DEFAULT 'chat',
    strategy TEXT,
    idle_notified INTEGER
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
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    turn TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
";

/// Databases created before sessions had a version get the column (0: any newer write replaces the row); before
/// sessions had a dialect, theirs is `chat` (the only one there was); before strategy pins, none is pinned.
fn migrate(conn: &Connection) -> Result<(), rusqlite::Error> {
    for (column, ddl) in [
        (
            "version",
            "ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0",
        ),
        (
            "dialect",
            "ALTER TABLE sessions ADD COLUMN dialect TEXT NOT NULL DEFAULT 'chat'",
        ),
        ("strategy", "ALTER TABLE sessions ADD COLUMN strategy TEXT"),
        (
            "idle_notified",
            "ALTER TABLE sessions ADD COLUMN idle_notified INTEGER",
        ),
    ] {
        let has: i64 = conn.query_row(
            "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name = ?1",
            [column],
            |r| r.get(0),
        )?;
        if has == 0 {
            conn.execute_batch(ddl)?;
        }
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
    /// that, new commands are refused at once with [`StoreError::QueueFull`]. The file is locked first: refused
    /// (naming it) while another process holds it; the worker watches it for as long as the store is open.
    pub fn open_with(
        path: &Path,
        queue_capacity: usize,
        metrics: StoreMetrics,
    ) -> Result<Self, StoreError> {
        create_folder(path)?;
        let file = file::DbFile::lock(path)?;
        let conn = open_checked(path)?;
        Self::start(
            Worker::new(conn, metrics.clone()).watching(Watch::new(file, connect)),
            queue_capacity,
            metrics,
        )
    }

    /// Opens the database at `path` for reading while a gateway may hold it (`ctxgate sessions list`, `show`,
    /// `export`, the source of `migrate`): no lock is taken and the file is not watched.
    pub fn open_reader(
        path: &Path,
        queue_capacity: usize,
        metrics: StoreMetrics,
    ) -> Result<Self, StoreError> {
        create_folder(path)?;
        let conn = open_checked(path)?;
        Self::start(Worker::new(conn, metrics.clone()), queue_capacity, metrics)
    }

    fn start(
        worker: Worker,
        queue_capacity: usize,
        metrics: StoreMetrics,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::sync_channel::<Cmd>(queue_capacity.max(1));
        std::thread::Builder::new()
            .name("ctxgate-sqlite".into())
            .spawn(move || worker.run(rx))
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

/// Creates the database's folder when it is missing.
fn create_folder(path: &Path) -> Result<(), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    }
    Ok(())
}

/// Opens the database at `path` (creating it when missing), refusing a damaged one, with the schema and settings.
fn open_checked(path: &Path) -> Result<Connection, StoreError> {
    let conn =
        Connection::open(path).map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(err)?;
    check_integrity(&conn, path)?;
    prepare(&conn).map_err(err)?;
    Ok(conn)
}

/// Opens the database at `path` as [`open_checked`] does, without the integrity check (a file just written back).
fn connect(path: &Path) -> Result<Connection, String> {
    let conn =
        Connection::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    prepare(&conn).map_err(|e| e.to_string())?;
    Ok(conn)
}

/// The schema (created or migrated) and the connection's settings.
fn prepare(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.execute_batch(SCHEMA)?;
    migrate(conn)?;
    // Room for every statement the worker caches (a dozen), so none is parsed again.
    conn.set_prepared_statement_cache_capacity(32);
    Ok(())
}

/// Refuses a file that is not a sound SQLite database (`PRAGMA quick_check`), with what is wrong, the file, and
/// how to recover; other failures (permissions, a lock) are reported as they are.
fn check_integrity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let started = Instant::now();
    let verdict = conn.query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0));
    let problem = match verdict {
        Ok(v) if v == "ok" => {
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "store: integrity checked"
            );
            return Ok(());
        }
        Ok(v) => v,
        Err(rusqlite::Error::SqliteFailure(e, msg))
            if matches!(
                e.code,
                rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt
            ) =>
        {
            msg.unwrap_or_else(|| e.to_string())
        }
        Err(e) => return Err(err(format!("cannot read {}: {e}", path.display()))),
    };
    let p = path.display();
    Err(err(format!(
        "{p} is damaged or not a ctxgate database ({problem}); refusing to start on it. To recover: stop \
         ctxgate and move the file aside together with its -wal and -shm files (`mv {p} {p}.corrupt`, same for \
         {p}-wal and {p}-shm); then either start with an empty store, or first salvage what SQLite can still \
         read: `sqlite3 {p}.corrupt .recover | sqlite3 {p}`"
    )))
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

    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        let id = id.to_string();
        self.send(StoreOp::Load, move |r| Cmd::Turns(id, offset, limit, r))
    }

    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let id = id.to_string();
        self.send(StoreOp::Delete, move |r| Cmd::Delete(id, r))
    }

    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.send(StoreOp::Purge, move |r| Cmd::Purge(before, r))
    }

    /// Answers what the worker knows of the file (deleted and not written back: the reason) after a one-row read.
    fn ping(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        self.send(StoreOp::Probe, Cmd::Ping)
    }
}

fn run_other(conn: &mut Connection, cmd: Cmd, metrics: &StoreMetrics) {
    let started = Instant::now();
    match cmd {
        Cmd::Write(..) => {}
        Cmd::Ping(r) => {
            let res = conn
                .prepare_cached("SELECT 1 FROM sessions LIMIT 1")
                .and_then(|mut s| s.exists([]))
                .map(|_| ())
                .map_err(err);
            let _ = r.send(res);
        }
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
        Cmd::Turns(id, offset, limit, r) => {
            let res = turns(conn, &id, offset, limit).map_err(err);
            metrics.observe(StoreOp::Load, started, res.is_ok());
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
        dialect: row.get(8)?,
        strategy: row.get(9)?,
        idle_notified: row.get(10)?,
    })
}

const META_COLS: &str =
    "id, tenant, created_at, last_active, message_count, token_estimate, head, version, dialect, strategy, idle_notified";

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
            Ok(NodeRow {
                id: Arc::from(row.get::<_, String>(0)?),
                parent: row.get::<_, Option<String>>(1)?.map(Arc::from),
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
        match Record::parse(&kind, &text) {
            Ok(Record::Compression(c)) => compressions.push(*c),
            Ok(Record::Internal(v)) => internal.push(v),
            // Not logged with the parser's message: it may quote the record's content.
            Err(_) => {
                tracing::warn!(session = %id, kind = %kind, "sqlite: unreadable record skipped")
            }
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
        .query_map(
            params![limit, i64::try_from(offset).unwrap_or(i64::MAX)],
            meta_from_row,
        )?
        .collect::<Result<Vec<_>, _>>()?;
    Ok((rows, total as u64))
}

fn turns(
    conn: &Connection,
    id: &str,
    offset: u64,
    limit: u32,
) -> Result<(Vec<String>, u64), rusqlite::Error> {
    let total: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM turns WHERE session_id = ?1")?
        .query_row(params![id], |r| r.get(0))?;
    let mut stmt = conn.prepare_cached(
        "SELECT turn FROM turns WHERE session_id = ?1 ORDER BY seq LIMIT ?2 OFFSET ?3",
    )?;
    let rows = stmt
        .query_map(
            params![id, limit, i64::try_from(offset).unwrap_or(i64::MAX)],
            |r| r.get::<_, String>(0),
        )?
        .collect::<Result<Vec<_>, _>>()?;
    Ok((rows, total as u64))
}

#[cfg(test)]
mod file_tests;
#[cfg(test)]
mod tests;
