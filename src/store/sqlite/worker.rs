//! The SQLite worker thread: group commits with a savepoint per caller's batch, retries of batches that failed
//! for a transient reason (in each session's order), barriers that wait for them; and, once a second, a look at
//! the database file (`watch`): while it is deleted and not written back, writes are held and the rest is
//! answered with why.

use super::watch::Watch;
use super::{err, run_other, Cmd, Reply};
use crate::metrics::{StoreMetrics, StoreOp};
use crate::store::{StoreError, WriteOp};
use rusqlite::{params, Connection, ErrorCode};
use std::collections::HashSet;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Most commands applied in one transaction.
pub(super) const GROUP: usize = 256;
/// Longest a group waits for more batches under concurrent load.
const LINGER: Duration = Duration::from_micros(500);
/// First wait before retrying batches that failed for a transient reason; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between retries.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// One caller's batch.
pub(super) struct Batch {
    pub(super) ops: Vec<WriteOp>,
    pub(super) reply: Reply<()>,
}

/// The worker thread's state: the connection, batches waiting for a retry, and barriers waiting for them.
pub(super) struct Worker {
    pub(super) conn: Connection,
    metrics: StoreMetrics,
    /// Batches that failed for a transient reason, oldest first.
    retry: Vec<Batch>,
    /// Empty batches (flushes) queued while retries were pending: answered once none is.
    barriers: Vec<Reply<()>>,
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Batches in the last group committed.
    last_group: usize,
    /// The database file, when the store holds one (not in tests over an in-memory connection, nor for readers).
    /// After `conn`: the file's lock is released only once the connection is closed.
    watch: Option<Watch>,
}

impl Worker {
    pub(super) fn new(conn: Connection, metrics: StoreMetrics) -> Self {
        Self {
            conn,
            metrics,
            retry: Vec::new(),
            barriers: Vec::new(),
            retry_at: None,
            backoff: RETRY_FIRST,
            last_group: 0,
            watch: None,
        }
    }

    /// Watches the database file (see [`Watch`]).
    pub(super) fn watching(mut self, watch: Watch) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Why the store cannot take writes now (the database file is deleted and not written back), if it cannot.
    fn failure(&self) -> Option<StoreError> {
        self.watch.as_ref()?.failure().map(err)
    }

    /// Looks at the database file when it is due (or with `now`); once it is mended, held writes go at once.
    fn look_at_the_file(&mut self, now: bool) {
        let Some(watch) = self.watch.as_mut() else {
            return;
        };
        if !now && Instant::now() < watch.next {
            return;
        }
        if watch.check(&mut self.conn) && !self.retry.is_empty() {
            self.retry_at = Some(Instant::now());
            self.backoff = RETRY_FIRST;
        }
    }

    /// Runs until every sender is gone; whatever was queued is applied first, so nothing queued is lost.
    pub(super) fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        loop {
            let wake = match (self.retry_at, self.watch.as_ref().map(|w| w.next)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let first = match wake {
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
            self.look_at_the_file(false);
            let mut writes: Vec<Batch> = Vec::new();
            if self.retry_at.is_some_and(|at| at <= Instant::now()) {
                self.retry_at = None;
                writes.append(&mut self.retry);
            }
            let mut next = first;
            // Group commit: take every write already queued (up to GROUP) into one transaction. Under concurrent
            // load (the last group had several batches), when the queue runs dry before the group's deadline, sleep
            // until it and take what came meanwhile: a commit costs as much as several batches, the callers are
            // waiting for it anyway, and batches queued while the thread sleeps do not wake it (a blocking receive
            // here would be woken once per batch).
            let mut linger = (self.last_group > 1).then(|| Instant::now() + LINGER);
            while let Some(cmd) = next.take() {
                match cmd {
                    Cmd::Write(ops, reply) => {
                        writes.push(Batch { ops, reply });
                        if writes.len() < GROUP {
                            next = rx.try_recv().ok().or_else(|| {
                                let wait = linger.take()?.saturating_duration_since(Instant::now());
                                if !wait.is_zero() {
                                    std::thread::sleep(wait);
                                }
                                rx.try_recv().ok()
                            });
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
            self.last_group = writes.len();
            self.commit_group(writes);
        }
        self.shut_down();
    }

    /// The queue is closed: one last attempt at the batches still failing, then they are given up (logged).
    fn shut_down(mut self) {
        if self.failure().is_some() {
            self.look_at_the_file(true);
        }
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

    pub(super) fn commit_group(&mut self, writes: Vec<Batch>) {
        let (writes, barriers): (Vec<Batch>, Vec<Batch>) =
            writes.into_iter().partition(|b| !b.ops.is_empty());
        self.barriers.extend(barriers.into_iter().map(|b| b.reply));
        if let Some(failure) = self.failure() {
            // Held, not acknowledged: applied to a connection whose file is gone, they would be lost.
            self.retry.extend(writes);
            if !self.retry.is_empty() && self.retry_at.is_none() {
                self.retry_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(RETRY_MAX);
            }
            let answer = if self.retry.is_empty() {
                Ok(())
            } else {
                Err(failure)
            };
            for r in self.barriers.drain(..) {
                let _ = r.send(answer.clone());
            }
            return;
        }
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
        // While the file is deleted and not written back: answered with why (a write is held, by `commit_group`).
        let cmd = match (self.failure(), cmd) {
            (None, cmd) | (Some(_), cmd @ (Cmd::Write(..) | Cmd::QueryOnly(..))) => cmd,
            (Some(e), Cmd::Ping(r)) => return drop(r.send(Err(e))),
            (Some(e), Cmd::Load(_, r)) => return drop(r.send(Err(e))),
            (Some(e), Cmd::List(_, _, r)) => return drop(r.send(Err(e))),
            (Some(e), Cmd::Turns(_, _, _, r)) => return drop(r.send(Err(e))),
            (Some(e), Cmd::Delete(_, r)) => return drop(r.send(Err(e))),
            (Some(e), Cmd::Purge(_, r)) => return drop(r.send(Err(e))),
        };
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
        WriteOp::Node { session, .. }
        | WriteOp::Turn { session, .. }
        | WriteOp::Record { session, .. } => session,
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
    // The group's transaction and each batch's savepoint are cached prepared statements: parsing `SAVEPOINT` and
    // `RELEASE` for every batch was a tenth of the gateway's CPU per small request.
    let exec = |conn: &Connection, sql: &str| conn.prepare_cached(sql)?.execute([]).map(|_| ());
    let mut run = |conn: &mut Connection| -> Result<Vec<Outcome>, rusqlite::Error> {
        exec(conn, "BEGIN")?;
        let mut results = Vec::with_capacity(writes.len());
        for batch in writes {
            if batch.ops.iter().any(|op| blocked.contains(op_session(op))) {
                results.push(Outcome::Deferred);
                continue;
            }
            exec(conn, "SAVEPOINT batch")?;
            match batch.ops.iter().try_for_each(|op| apply(conn, op)) {
                Ok(()) => {
                    exec(conn, "RELEASE batch")?;
                    results.push(Outcome::Committed);
                }
                Err(e) => {
                    exec(conn, "ROLLBACK TO batch")?;
                    exec(conn, "RELEASE batch")?;
                    if transient(&e) {
                        blocked.extend(batch.ops.iter().map(|op| op_session(op).to_string()));
                    }
                    results.push(Outcome::Failed(e));
                }
            }
        }
        exec(conn, "COMMIT")?;
        Ok(results)
    };
    let outcome = run(conn);
    if outcome.is_err() && !conn.is_autocommit() {
        // The group failed as a whole (say, COMMIT on a full disk): leave no transaction open.
        let _ = exec(conn, "ROLLBACK");
    }
    match outcome {
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

/// A session's next turn, numbered after its last one, in one statement: the number is a scalar subquery of a
/// one-row `VALUES` (an `INSERT … SELECT` reading the table it writes would go through a temporary table, and a
/// separate `SELECT MAX` cost a statement of its own per turn). For a session that is gone (deleted mid-turn) the
/// number is NULL and `OR IGNORE` skips the row (`seq` is `NOT NULL`): a no-op, as for the other writes.
const NUMBERED_TURN: &str = "INSERT OR IGNORE INTO turns (session_id, seq, turn) VALUES (?1,
      CASE WHEN EXISTS (SELECT 1 FROM sessions WHERE id = ?1)
        THEN (SELECT COALESCE(MAX(seq), 0) + 1 FROM turns WHERE session_id = ?1) END,
      ?2)";

/// A session's next record, numbered as [`NUMBERED_TURN`] numbers turns.
const NUMBERED_RECORD: &str =
    "INSERT OR IGNORE INTO records (session_id, seq, kind, created_at, record) VALUES (?1,
      CASE WHEN EXISTS (SELECT 1 FROM sessions WHERE id = ?1)
        THEN (SELECT COALESCE(MAX(seq), 0) + 1 FROM records WHERE session_id = ?1) END,
      ?2, ?3, ?4)";

fn apply(conn: &Connection, op: &WriteOp) -> Result<(), rusqlite::Error> {
    match op {
        WriteOp::Session { meta: m, create } => {
            let sql = if *create {
                "INSERT INTO sessions (id, tenant, created_at, last_active, message_count, token_estimate, head, version,
                   dialect, strategy, idle_notified)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT(id) DO UPDATE SET last_active = excluded.last_active,
                   message_count = excluded.message_count, token_estimate = excluded.token_estimate,
                   head = excluded.head, version = excluded.version, strategy = excluded.strategy,
                   idle_notified = excluded.idle_notified
                 WHERE excluded.version > sessions.version"
            } else {
                "UPDATE sessions SET last_active = ?4, message_count = ?5, token_estimate = ?6, head = ?7,
                   version = ?8, strategy = ?10, idle_notified = ?11
                 WHERE id = ?1 AND tenant = ?2 AND created_at = ?3 AND version < ?8 AND dialect = ?9"
            };
            conn.prepare_cached(sql)?.execute(params![
                m.id,
                m.tenant,
                m.created_at,
                m.last_active,
                m.message_count as i64,
                m.token_estimate as i64,
                m.head,
                m.version as i64,
                m.dialect,
                m.strategy,
                m.idle_notified
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
                // serde_json's own writer: the same compact text as `Display`, without the formatter adapter
                serde_json::to_string(&*node.message)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?
            ])?;
        }
        WriteOp::Turn { session, turn } => {
            conn.prepare_cached(NUMBERED_TURN)?
                .execute(params![session, turn])?;
        }
        WriteOp::Record {
            session,
            created_at,
            record,
        } => {
            conn.prepare_cached(NUMBERED_RECORD)?.execute(params![
                session,
                record.kind().as_str(),
                created_at,
                record.to_json()
            ])?;
        }
    }
    Ok(())
}
