//! The memory backend: the same contract as SQLite, kept in process memory (lost on restart).

use super::{Record, SessionMeta, Store, StoreError, StoredSession, WriteOp};
use crate::metrics::{StoreMetrics, StoreOp};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Sessions in a `HashMap`.
#[derive(Default)]
pub struct MemoryStore {
    sessions: Arc<Mutex<HashMap<String, StoredSession>>>,
    /// Turn records per session (kept apart: never loaded with the session).
    turns: Arc<Mutex<HashMap<String, Vec<String>>>>,
    metrics: StoreMetrics,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store recording its operations in `metrics`.
    pub fn with_metrics(metrics: StoreMetrics) -> Self {
        Self {
            metrics,
            ..Self::default()
        }
    }
}

impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        let started = Instant::now();
        let mut map = self.sessions.lock();
        for op in ops {
            match op {
                WriteOp::Session { meta, create } => match map.get_mut(&meta.id) {
                    // Rows never go backwards: only a newer version replaces one.
                    Some(s) if s.meta.version < meta.version => {
                        s.meta = SessionMeta {
                            tenant: s.meta.tenant.clone(),
                            created_at: s.meta.created_at,
                            ..meta
                        }
                    }
                    Some(_) => {}
                    // A missing row is only created by a write that may create it (else: deleted mid-turn).
                    None if create => {
                        map.insert(
                            meta.id.clone(),
                            StoredSession {
                                meta,
                                nodes: Vec::new(),
                                compressions: Vec::new(),
                                internal: Vec::new(),
                            },
                        );
                    }
                    None => {}
                },
                WriteOp::Node { session, node } => {
                    if let Some(s) = map.get_mut(&session) {
                        if !s.nodes.iter().any(|n| n.id == node.id) {
                            s.nodes.push(node);
                        }
                    }
                }
                WriteOp::Turn { session, turn } => {
                    if map.contains_key(&session) {
                        self.turns.lock().entry(session).or_default().push(turn);
                    }
                }
                WriteOp::Record {
                    session, record, ..
                } => {
                    if let Some(s) = map.get_mut(&session) {
                        match record {
                            Record::Compression(c) => s.compressions.push(*c),
                            Record::Internal(v) => s.internal.push(v),
                        }
                    }
                }
            }
        }
        drop(map);
        self.metrics.observe(StoreOp::Write, started, true);
        let _ = tx.send(Ok(()));
        rx
    }

    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        let started = Instant::now();
        let r = self.sessions.lock().get(id).cloned();
        self.metrics.observe(StoreOp::Load, started, true);
        Box::pin(async move { Ok(r) })
    }

    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        let started = Instant::now();
        let mut all: Vec<SessionMeta> = self
            .sessions
            .lock()
            .values()
            .map(|s| s.meta.clone())
            .collect();
        all.sort_by(|a, b| {
            b.last_active
                .cmp(&a.last_active)
                .then_with(|| a.id.cmp(&b.id))
        });
        let total = all.len() as u64;
        let page = all
            .into_iter()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit as usize)
            .collect();
        self.metrics.observe(StoreOp::List, started, true);
        Box::pin(async move { Ok((page, total)) })
    }

    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        let started = Instant::now();
        let turns = self.turns.lock();
        let all = turns.get(id).map(Vec::as_slice).unwrap_or_default();
        let page = all
            .iter()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit as usize)
            .cloned()
            .collect();
        let total = all.len() as u64;
        drop(turns);
        self.metrics.observe(StoreOp::Load, started, true);
        Box::pin(async move { Ok((page, total)) })
    }

    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let started = Instant::now();
        let existed = self.sessions.lock().remove(id).is_some();
        self.turns.lock().remove(id);
        self.metrics.observe(StoreOp::Delete, started, true);
        Box::pin(async move { Ok(existed) })
    }

    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        let started = Instant::now();
        let mut map = self.sessions.lock();
        let n = map.len();
        map.retain(|_, s| s.meta.last_active >= before);
        let purged = (n - map.len()) as u64;
        self.turns.lock().retain(|id, _| map.contains_key(id));
        drop(map);
        self.metrics.observe(StoreOp::Purge, started, true);
        Box::pin(async move { Ok(purged) })
    }
}
