//! The session manager: a byte-bounded moka cache of message trees over the durable store. Reconciles each
//! request with the stored tree, queues new nodes for writing without waiting, and commits the reply before the
//! turn is released to the client.

use super::identity::SessionIdentity;
use super::runloop::{message_text, run_loops};
use super::tree::{NodeId, Tree};
use crate::metrics::{CacheResult, SessionMetrics};
use crate::store::{committed, RecordKind, SessionMeta, Store, StoreError, WriteOp};
use moka::future::Cache;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Unix seconds now.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// One cached session.
pub struct SessionEntry {
    /// Public id.
    pub id: String,
    /// Owner's credential hash.
    pub tenant: String,
    /// Unix seconds of the first request.
    pub created_at: i64,
    state: Mutex<EntryState>,
    weight: AtomicU32,
}

struct EntryState {
    tree: Tree,
    last_active: i64,
    compressions: Vec<Value>,
    internal: Vec<Value>,
}

impl SessionEntry {
    fn meta(&self, st: &EntryState) -> SessionMeta {
        SessionMeta {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            created_at: self.created_at,
            last_active: st.last_active,
            message_count: st.tree.len() as u64,
            token_estimate: (st.tree.history_bytes() / 4) as u64,
            head: st.tree.head().map(|h| h.to_string()),
        }
    }

    fn reweigh(&self, st: &EntryState) {
        let w = u32::try_from(st.tree.weight() + 512).unwrap_or(u32::MAX);
        self.weight.store(w, Ordering::Relaxed);
    }

    /// The newest compression record, if any.
    pub fn last_compression(&self) -> Option<Value> {
        self.state.lock().compressions.last().cloned()
    }

    /// Every compression record (rewrites and summaries), oldest first.
    pub fn compressions(&self) -> Vec<Value> {
        self.state.lock().compressions.clone()
    }

    /// Runs `f` on the session's tree.
    pub fn with_tree<T>(&self, f: impl FnOnce(&Tree) -> T) -> T {
        f(&self.state.lock().tree)
    }
}

/// Where a request's messages landed in its session, for recording the reply.
#[derive(Clone)]
pub struct RequestMark {
    /// The session.
    pub entry: Arc<SessionEntry>,
    /// The node of the request's last message.
    pub leaf: Option<NodeId>,
    /// Messages of the request already stored before it.
    pub known: usize,
    /// Messages the request added.
    pub created: usize,
    /// Unix seconds each request message was first seen (aligned with the request's messages).
    pub first_seen: Vec<i64>,
    /// Node id of each request message (aligned with the request's messages).
    pub path: Vec<String>,
}

/// A session as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionView {
    /// Public id.
    pub id: String,
    /// Unix seconds of the first request.
    pub created_at: i64,
    /// Unix seconds of the latest activity.
    pub last_active: i64,
    /// Messages stored, all branches.
    pub message_count: u64,
    /// Rough token count of the history.
    pub token_estimate: u64,
    /// The full history (the path to the latest leaf), as OpenAI message objects.
    pub messages: Vec<Value>,
    /// Positions in `messages` of replies that were cut short.
    pub partial: Vec<u32>,
    /// The history's run loops (user message → tool calls → final reply), as a summary.
    pub run_loops: Vec<RunLoopView>,
    /// The other branches: where they leave the history and their messages from there.
    pub branches: Vec<BranchView>,
    /// Compression records, oldest first.
    pub compressions: Vec<Value>,
    /// ctxgate's own exchanges with the model (recall rounds), flagged as such; never part of `messages`.
    pub internal: Vec<Value>,
}

/// A run loop as the admin API shows it: positions, the tool calls, and short previews of its ends.
#[derive(Debug, Clone, Serialize)]
pub struct RunLoopView {
    /// Position of its first message.
    pub start: usize,
    /// One past its last message.
    pub end: usize,
    /// The opening user message, cut to a preview.
    pub user: Option<String>,
    /// The tool calls made (id, name, arguments, timestamp, position of the result).
    pub tool_calls: Vec<Value>,
    /// The final reply, cut to a preview; `null` while the loop is unfinished.
    pub final_reply: Option<String>,
}

/// Characters of a message shown in a run loop's preview.
const PREVIEW_CHARS: usize = 200;

fn preview(m: &Value) -> String {
    let text = message_text(m);
    let mut p: String = text.chars().take(PREVIEW_CHARS).collect();
    if text.chars().nth(PREVIEW_CHARS).is_some() {
        p.push('…');
    }
    p
}

fn run_loop_views(messages: &[Value], timestamps: &[i64]) -> Vec<RunLoopView> {
    run_loops(messages, Some(timestamps))
        .loops
        .into_iter()
        .map(|l| RunLoopView {
            start: l.start,
            end: l.end,
            user: l.user.map(|i| preview(&messages[i])),
            final_reply: l.final_reply.map(|i| preview(&messages[i])),
            tool_calls: l
                .tool_calls
                .iter()
                .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
                .collect(),
        })
        .collect()
}

/// A branch other than the current history.
#[derive(Debug, Clone, Serialize)]
pub struct BranchView {
    /// Id of the branch's leaf node.
    pub leaf: String,
    /// Position at which it leaves the current history.
    pub diverges_at: u32,
    /// Length of the path to its leaf.
    pub length: u32,
    /// Its messages from `diverges_at` on.
    pub messages: Vec<Value>,
}

/// Sessions: cache over store.
pub struct Sessions {
    store: Arc<dyn Store>,
    cache: Cache<String, Arc<SessionEntry>>,
    metrics: SessionMetrics,
}

impl Sessions {
    /// A manager over `store` caching at most `cache_max_bytes` of history.
    pub fn new(store: Arc<dyn Store>, cache_max_bytes: u64) -> Self {
        let cache = Cache::builder()
            .max_capacity(cache_max_bytes)
            .weigher(|_k: &String, v: &Arc<SessionEntry>| v.weight.load(Ordering::Relaxed))
            .build();
        Self {
            store,
            cache,
            metrics: SessionMetrics::default(),
        }
    }

    /// Counts cache hits and misses in `metrics`.
    pub fn with_metrics(mut self, metrics: SessionMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The durable store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Sessions and bytes currently cached.
    pub fn cache_stats(&self) -> (u64, u64) {
        (self.cache.entry_count(), self.cache.weighted_size())
    }

    /// Like [`Sessions::cache_stats`], after the cache's pending bookkeeping is applied (exact, for metrics).
    pub async fn cache_stats_now(&self) -> (u64, u64) {
        self.cache.run_pending_tasks().await;
        self.cache_stats()
    }

    async fn load_entry(&self, id: &str) -> Result<Option<Arc<SessionEntry>>, StoreError> {
        if let Some(e) = self.cache.get(id).await {
            self.metrics.lookup(CacheResult::Hit);
            return Ok(Some(e));
        }
        self.metrics.lookup(CacheResult::Miss);
        let store = self.store.clone();
        let key = id.to_string();
        let loaded = self
            .cache
            .try_get_with(key.clone(), async move {
                match store.load(&key).await? {
                    Some(s) => {
                        let head = s.meta.head.clone().map(NodeId::from);
                        let st = EntryState {
                            tree: Tree::from_nodes(s.nodes, head),
                            last_active: s.meta.last_active,
                            compressions: s.compressions,
                            internal: s.internal,
                        };
                        let e = SessionEntry {
                            id: s.meta.id,
                            tenant: s.meta.tenant,
                            created_at: s.meta.created_at,
                            state: Mutex::new(st),
                            weight: AtomicU32::new(0),
                        };
                        e.reweigh(&e.state.lock());
                        Ok(Arc::new(e))
                    }
                    None => Err(StoreError::Backend {
                        backend: "cache",
                        message: "not found".into(),
                    }),
                }
            })
            .await;
        match loaded {
            Ok(e) => Ok(Some(e)),
            Err(e) => match &*e {
                StoreError::Backend {
                    backend: "cache", ..
                } => Ok(None),
                other => Err(other.clone()),
            },
        }
    }

    async fn entry_for(
        &self,
        ident: &SessionIdentity,
        now: i64,
    ) -> Result<Arc<SessionEntry>, StoreError> {
        let entry = match self.load_entry(&ident.id).await? {
            Some(e) => e,
            None => {
                let fresh = Arc::new(SessionEntry {
                    id: ident.id.clone(),
                    tenant: ident.tenant.clone(),
                    created_at: now,
                    state: Mutex::new(EntryState {
                        tree: Tree::new(),
                        last_active: now,
                        compressions: Vec::new(),
                        internal: Vec::new(),
                    }),
                    weight: AtomicU32::new(512),
                });
                // Two first requests racing: both get the one that won.
                self.cache
                    .get_with(ident.id.clone(), async move { fresh })
                    .await
            }
        };
        if entry.tenant != ident.tenant {
            return Err(StoreError::TenantMismatch);
        }
        Ok(entry)
    }

    /// Reconciles a request's messages with the session and queues the new ones for writing (not awaited).
    pub async fn record_request(
        &self,
        ident: &SessionIdentity,
        messages: &[Value],
        raw_hashes: &[u64],
    ) -> Result<RequestMark, StoreError> {
        let now = now_secs();
        let entry = self.entry_for(ident, now).await?;
        let (mark, ops) = {
            let mut st = entry.state.lock();
            let appended = st.tree.append_request(messages, raw_hashes, now);
            st.last_active = now;
            let nodes = st.tree.path_to(appended.leaf.as_ref());
            let first_seen: Vec<i64> = nodes.iter().map(|n| n.created_at).collect();
            let path: Vec<String> = nodes.iter().map(|n| n.id.to_string()).collect();
            let mut ops = vec![WriteOp::Session(entry.meta(&st))];
            for id in &appended.created {
                if let Some(n) = st.tree.get(id) {
                    ops.push(WriteOp::Node {
                        session: entry.id.clone(),
                        node: n.clone(),
                    });
                }
            }
            entry.reweigh(&st);
            let mark = RequestMark {
                entry: entry.clone(),
                leaf: appended.leaf,
                known: appended.known,
                created: appended.created.len(),
                first_seen,
                path,
            };
            (mark, ops)
        };
        // Queued, not awaited: durability of the turn is awaited with the reply.
        drop(self.store.write(ops));
        if mark.created > 0 {
            self.cache.insert(entry.id.clone(), entry).await; // re-weigh
        }
        Ok(mark)
    }

    /// Appends the upstream's reply after the request's last message and waits until the whole turn is durable.
    pub async fn record_reply(
        &self,
        mark: &RequestMark,
        message: Value,
        partial: bool,
    ) -> Result<(), StoreError> {
        let now = now_secs();
        let entry = &mark.entry;
        let ops = {
            let mut st = entry.state.lock();
            let (id, new) = st
                .tree
                .append_reply(mark.leaf.clone(), message, partial, now);
            st.last_active = now;
            entry.reweigh(&st);
            let mut ops = Vec::with_capacity(2);
            if new {
                if let Some(n) = st.tree.get(&id) {
                    ops.push(WriteOp::Node {
                        session: entry.id.clone(),
                        node: n.clone(),
                    });
                }
            }
            ops.push(WriteOp::Session(entry.meta(&st)));
            ops
        };
        committed(self.store.write(ops)).await
    }

    /// Waits until every write queued so far is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        committed(self.store.write(Vec::new())).await
    }

    /// Appends a record (compression or internal exchange) to a session and waits until it is durable.
    pub async fn record(
        &self,
        mark: &RequestMark,
        kind: RecordKind,
        record: Value,
    ) -> Result<(), StoreError> {
        self.record_entry(&mark.entry, kind, record).await
    }

    /// Like [`Sessions::record`], for a session entry.
    pub async fn record_entry(
        &self,
        entry: &SessionEntry,
        kind: RecordKind,
        record: Value,
    ) -> Result<(), StoreError> {
        let now = now_secs();
        {
            let mut st = entry.state.lock();
            match kind {
                RecordKind::Compression => st.compressions.push(record.clone()),
                RecordKind::Internal => st.internal.push(record.clone()),
            }
        }
        committed(self.store.write(vec![WriteOp::Record {
            kind,
            session: entry.id.clone(),
            created_at: now,
            record,
        }]))
        .await
    }

    /// A cached or stored session entry, for background work and the admin API.
    pub async fn entry(&self, id: &str) -> Result<Option<Arc<SessionEntry>>, StoreError> {
        self.load_entry(id).await
    }

    /// The admin view of a session.
    pub async fn view(&self, id: &str) -> Result<Option<SessionView>, StoreError> {
        let Some(entry) = self.load_entry(id).await? else {
            return Ok(None);
        };
        let st = entry.state.lock();
        let meta = entry.meta(&st);
        let history = st.tree.history();
        let branches = st
            .tree
            .other_leaves()
            .into_iter()
            .map(|leaf| {
                let at = st.tree.divergence(leaf);
                BranchView {
                    leaf: leaf.id.to_string(),
                    diverges_at: at,
                    length: leaf.position + 1,
                    messages: st
                        .tree
                        .path_to(Some(&leaf.id))
                        .into_iter()
                        .filter(|n| n.position >= at)
                        .map(|n| (*n.message).clone())
                        .collect(),
                }
            })
            .collect();
        let messages: Vec<Value> = history.iter().map(|n| (*n.message).clone()).collect();
        let timestamps: Vec<i64> = history.iter().map(|n| n.created_at).collect();
        Ok(Some(SessionView {
            id: entry.id.clone(),
            created_at: entry.created_at,
            last_active: meta.last_active,
            message_count: meta.message_count,
            token_estimate: meta.token_estimate,
            partial: history
                .iter()
                .filter(|n| n.partial)
                .map(|n| n.position)
                .collect(),
            run_loops: run_loop_views(&messages, &timestamps),
            messages,
            branches,
            compressions: st.compressions.clone(),
            internal: st.internal.clone(),
        }))
    }

    /// Sessions by newest activity.
    pub async fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<SessionMeta>, u64), StoreError> {
        self.store.list(limit, offset).await
    }

    /// Removes a session from cache and store; true when it existed.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let cached = self.cache.remove(id).await.is_some();
        let stored = self.store.delete(id).await?;
        Ok(cached || stored)
    }

    /// Purges sessions idle for more than `days` days from store and cache; returns how many were purged.
    pub async fn purge_idle(&self, days: u64) -> Result<u64, StoreError> {
        let before = now_secs() - i64::try_from(days.saturating_mul(86_400)).unwrap_or(i64::MAX);
        let n = self.store.purge_idle(before).await?;
        let stale: Vec<Arc<String>> = self
            .cache
            .iter()
            .filter(|(_, e)| e.state.lock().last_active < before)
            .map(|(k, _)| k)
            .collect();
        for k in stale {
            self.cache.invalidate(k.as_str()).await;
        }
        Ok(n)
    }
}
