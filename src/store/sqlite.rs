//! The embedded SQLite backend: one worker thread owns the connection (WAL mode) and applies queued commands in
//! order, committing writes in small groups so that many sessions never queue on SQLite's lock.

use super::{RecordKind, SessionMeta, Store, StoreError, StoredSession, WriteOp};
use crate::metrics::{StoreMetrics, StoreOp};
use crate::session::tree::{Node, NodeId, NodeKind};
use futures_util::future::BoxFuture;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Most commands applied in one transaction.
const GROUP: usize = 256;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Cmd {
    Write(Vec<WriteOp>, Reply<()>),
    Load(String, Reply<Option<StoredSession>>),
    List(u32, u64, Reply<(Vec<SessionMeta>, u64)>),
    Delete(String, Reply<bool>),
    Purge(i64, Reply<u64>),
}

/// SQLite behind a worker thread.
pub struct SqliteStore {
    tx: mpsc::Sender<Cmd>,
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
    head TEXT
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

impl SqliteStore {
    /// Opens (creating when missing) the database at `path` and starts its worker.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_metrics(path, StoreMetrics::default())
    }

    /// Like [`SqliteStore::open`]; the worker records each operation's latency and errors in `metrics`.
    pub fn open_with_metrics(path: &Path, metrics: StoreMetrics) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path)
            .map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        check_integrity(&conn, path)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        let (tx, rx) = mpsc::channel::<Cmd>();
        std::thread::Builder::new()
            .name("ctxgate-sqlite".into())
            .spawn(move || worker(conn, rx, metrics))
            .map_err(err)?;
        Ok(Self { tx })
    }

    fn send<T: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<T>) -> Cmd,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(make(tx)).is_ok();
        Box::pin(async move {
            if !sent {
                return Err(StoreError::Closed);
            }
            rx.await.unwrap_or(Err(StoreError::Closed))
        })
    }
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
        if let Err(mpsc::SendError(Cmd::Write(_, tx))) = self.tx.send(Cmd::Write(ops, tx)) {
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
        self.send(move |r| Cmd::List(limit, offset, r))
    }

    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let id = id.to_string();
        self.send(move |r| Cmd::Delete(id, r))
    }

    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.send(move |r| Cmd::Purge(before, r))
    }
}

/// Runs until every sender is gone; whatever was queued is applied first, so nothing queued is lost.
fn worker(mut conn: Connection, rx: mpsc::Receiver<Cmd>, metrics: StoreMetrics) {
    while let Ok(first) = rx.recv() {
        let mut writes: Vec<(Vec<WriteOp>, Reply<()>)> = Vec::new();
        let mut next = Some(first);
        // Group commit: take every write already queued (up to GROUP) into one transaction.
        while let Some(cmd) = next.take() {
            match cmd {
                Cmd::Write(ops, reply) => {
                    writes.push((ops, reply));
                    if writes.len() < GROUP {
                        next = rx.try_recv().ok();
                    }
                }
                other => {
                    // Reads and deletes see every write queued before them.
                    commit_group(&mut conn, std::mem::take(&mut writes), &metrics);
                    run_other(&mut conn, other, &metrics);
                    next = rx.try_recv().ok();
                }
            }
        }
        commit_group(&mut conn, writes, &metrics);
    }
}

fn commit_group(
    conn: &mut Connection,
    writes: Vec<(Vec<WriteOp>, Reply<()>)>,
    metrics: &StoreMetrics,
) {
    if writes.is_empty() {
        return;
    }
    let started = Instant::now();
    let result = (|| -> Result<(), rusqlite::Error> {
        let tx = conn.transaction()?;
        for (ops, _) in &writes {
            for op in ops {
                apply(&tx, op)?;
            }
        }
        tx.commit()
    })();
    let result = result.map_err(err);
    metrics.observe(StoreOp::Write, started, result.is_ok());
    if let Err(e) = &result {
        tracing::error!(error = %e, writes = writes.len(), "sqlite: group commit failed");
    }
    for (_, reply) in writes {
        let _ = reply.send(result.clone());
    }
}

fn apply(tx: &rusqlite::Transaction<'_>, op: &WriteOp) -> Result<(), rusqlite::Error> {
    match op {
        WriteOp::Session(m) => {
            tx.prepare_cached(
                "INSERT INTO sessions (id, tenant, created_at, last_active, message_count, token_estimate, head)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(id) DO UPDATE SET last_active = excluded.last_active,
                   message_count = excluded.message_count, token_estimate = excluded.token_estimate,
                   head = excluded.head",
            )?
            .execute(params![
                m.id,
                m.tenant,
                m.created_at,
                m.last_active,
                m.message_count as i64,
                m.token_estimate as i64,
                m.head
            ])?;
        }
        WriteOp::Node { session, node } => {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO nodes (session_id, node_id, parent_id, position, kind, partial, created_at, message)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
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
            tx.prepare_cached(
                "INSERT INTO records (session_id, seq, kind, created_at, record)
                 VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM records WHERE session_id = ?1), ?2, ?3, ?4)",
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
    })
}

const META_COLS: &str = "id, tenant, created_at, last_active, message_count, token_estimate, head";

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
        }
    }

    #[tokio::test]
    async fn write_reopen_list_delete_purge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ctx.db");
        {
            let s = SqliteStore::open(&path).unwrap();
            let ops = vec![
                WriteOp::Session(meta("s1", 10)),
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
                WriteOp::Session(meta("s2", 20)),
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
}
