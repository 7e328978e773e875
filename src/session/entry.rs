//! One cached session: its tree, records and write state (admitted, deleted, dirty), and what the cache weighs.

use super::tree::{approx_size, Tree};
use crate::store::{Compression, Cursor, NodeRow, Record, SessionMeta, WriteOp};
use parking_lot::Mutex;
use serde_json::Value;
use std::sync::atomic::{AtomicU32, Ordering};

/// One cached session.
pub struct SessionEntry {
    /// Public id.
    pub id: String,
    /// The owner's tenant: HMAC-SHA256 (hex), under the per-install secret, of every credential header its
    /// requests carry (name and value), or `anonymous` when they carry none (see `session::tenant`).
    pub tenant: String,
    /// The wire format of its requests (`chat`, `anthropic`).
    pub dialect: &'static str,
    /// Unix seconds of the first request.
    pub created_at: i64,
    pub(super) state: Mutex<EntryState>,
    pub(super) weight: AtomicU32,
}

pub(super) struct EntryState {
    pub(super) tree: Tree,
    pub(super) last_active: i64,
    pub(super) compressions: Vec<Compression>,
    pub(super) internal: Vec<Value>,
    /// Approximate bytes of `compressions` and `internal`.
    pub(super) records_weight: usize,
    /// Version of the newest row built (see [`SessionMeta::version`]).
    pub(super) version: u64,
    /// The session may be written: it was loaded from the store, or the upstream accepted its first request.
    pub(super) admitted: bool,
    /// Deleted (admin API or retention purge): nothing more is written for it.
    pub(super) deleted: bool,
    /// A write was refused: the next write rewrites the whole session (row, every node, `unsaved`).
    pub(super) dirty: bool,
    /// Records whose write was refused.
    pub(super) unsaved: Vec<WriteOp>,
    /// How much of the stored session this entry holds (a shared store appends from other instances too).
    pub(super) cursor: Cursor,
    /// The session was seen in the store (loaded, or found there since): when it is gone from a shared store, it
    /// was deleted or expired there.
    pub(super) in_store: bool,
    /// The strategy an operator pinned for the session (see [`SessionMeta::strategy`]).
    pub(super) strategy: Option<String>,
    /// See [`SessionMeta::idle_notified`].
    pub(super) idle_notified: Option<i64>,
}

impl EntryState {
    pub(super) fn new(tree: Tree, last_active: i64, admitted: bool) -> Self {
        Self {
            tree,
            last_active,
            compressions: Vec::new(),
            internal: Vec::new(),
            records_weight: 0,
            version: 0,
            admitted,
            deleted: false,
            dirty: false,
            unsaved: Vec::new(),
            cursor: Cursor::default(),
            in_store: false,
            strategy: None,
            idle_notified: None,
        }
    }

    /// Whether the entry holds this record already (records coming back from a shared store include its own).
    pub(super) fn has_record(&self, record: &Record) -> bool {
        match record {
            Record::Compression(c) => self.compressions.iter().any(|x| x == &**c),
            Record::Internal(v) => self.internal.contains(v),
        }
    }

    /// Writes may be queued for the session.
    pub(super) fn writable(&self) -> bool {
        self.admitted && !self.deleted
    }

    pub(super) fn push_record(&mut self, record: Record) {
        self.records_weight += record_weight(&record);
        match record {
            Record::Compression(c) => self.compressions.push(*c),
            Record::Internal(v) => self.internal.push(v),
        }
    }
}

/// Approximate bytes a record holds in memory (about twice its text, as for a parsed value).
fn record_weight(record: &Record) -> usize {
    let text = match record {
        Record::Compression(c) => c.approx_bytes(),
        Record::Internal(v) => approx_size(v),
    };
    text * 2 + 64
}

/// Bytes of an entry beyond its tree and records.
const ENTRY_OVERHEAD: usize = 512;

impl SessionEntry {
    pub(super) fn new(
        id: String,
        tenant: String,
        dialect: &'static str,
        created_at: i64,
        st: EntryState,
    ) -> Self {
        let e = Self {
            id,
            tenant,
            dialect,
            created_at,
            state: Mutex::new(st),
            weight: AtomicU32::new(0),
        };
        e.reweigh(&e.state.lock());
        e
    }

    pub(super) fn meta(&self, st: &EntryState) -> SessionMeta {
        let (history_len, history_bytes) = st.tree.history_stats();
        SessionMeta {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            dialect: self.dialect.to_string(),
            created_at: self.created_at,
            last_active: st.last_active,
            message_count: history_len as u64,
            token_estimate: (history_bytes / 4) as u64,
            head: st.tree.head().map(|h| h.to_string()),
            version: st.version,
            strategy: st.strategy.clone(),
            idle_notified: st.idle_notified,
        }
    }

    /// The row to write now: a new version, so it replaces every row built before it.
    pub(super) fn next_meta(&self, st: &mut EntryState) -> SessionMeta {
        st.version += 1;
        self.meta(st)
    }

    /// Every write that puts the session in the store whole: the row (created when missing), every node, and
    /// the records — all of them on admission, else those whose write was refused.
    pub(super) fn whole(&self, st: &mut EntryState, all_records: bool, now: i64) -> Vec<WriteOp> {
        let mut ops = vec![WriteOp::Session {
            meta: self.next_meta(st),
            create: true,
        }];
        ops.extend(st.tree.nodes().map(|n| WriteOp::Node {
            session: self.id.clone(),
            node: NodeRow::from(n),
        }));
        let unsaved = std::mem::take(&mut st.unsaved);
        if all_records {
            let record = |record: Record| WriteOp::Record {
                session: self.id.clone(),
                created_at: now,
                record,
            };
            ops.extend(
                st.compressions
                    .iter()
                    .map(|c| record(Record::from(c.clone()))),
            );
            ops.extend(
                st.internal
                    .iter()
                    .map(|v| record(Record::Internal(v.clone()))),
            );
        } else {
            ops.extend(unsaved);
        }
        st.dirty = false;
        ops
    }

    pub(super) fn reweigh(&self, st: &EntryState) {
        let w = st.tree.weight() + st.records_weight + ENTRY_OVERHEAD;
        self.weight
            .store(u32::try_from(w).unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    /// Bytes the cache counts for this session: its tree (nodes and prefix index), its records, and overhead.
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// The newest compression record, if any.
    pub fn last_compression(&self) -> Option<Compression> {
        self.state.lock().compressions.last().cloned()
    }

    /// Every compression record (rewrites and summaries), oldest first.
    pub fn compressions(&self) -> Vec<Compression> {
        self.state.lock().compressions.clone()
    }

    /// The strategy an operator pinned for the session, if any.
    pub fn pinned_strategy(&self) -> Option<crate::config::Strategy> {
        self.state
            .lock()
            .strategy
            .as_deref()
            .and_then(crate::config::Strategy::parse)
    }

    /// Runs `f` on the session's tree.
    pub fn with_tree<T>(&self, f: impl FnOnce(&Tree) -> T) -> T {
        f(&self.state.lock().tree)
    }
}
