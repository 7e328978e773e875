//! The session manager: a byte-bounded moka cache of message trees over the durable store. Reconciles each
//! request with the stored tree, queues new nodes for writing without waiting, and commits the reply before the
//! turn is released to the client.
//!
//! A session has one entry in memory at a time, whatever races for it ([`Registry`]). A new session lives outside
//! the cache and the store until the upstream accepts its first request ([`Sessions::admit`]); waiting on the
//! store (cold loads, a turn's commit) is bounded by `store.timeout_ms`, and once a wait times out or fails the
//! store's circuit breaker ([`Breaker`]) spares the following requests any wait until a probe finds the store
//! healthy; writes are queued under the session's lock, so a session's rows are queued in the order they were
//! built. A write the store refused (full queue)
//! marks the session for a whole rewrite and keeps it in memory, evicted from the cache or not, until the
//! rewrite is queued: on its next write, once another write is accepted, or on flush.
//!
//! On a store shared by several instances (Redis), a cached entry is brought up to date before each use
//! ([`Store::tail`]: what other instances appended since the entry's cursor, only the missing nodes fetched), so no
//! instance serves a turn from a stale entry; a session gone from the store (deleted or expired elsewhere) starts
//! afresh.

use super::breaker::Breaker;
use super::entry::EntryState;
pub use super::entry::SessionEntry;
use super::identity::SessionIdentity;
use super::registry::Registry;
use super::tree::{NodeId, Tree};
use crate::context::runloop::run_loops;
use crate::message::message_text;
use crate::metrics::{CacheResult, SessionMetrics, StoreMetrics, StoreOp};
use crate::store::{
    committed, Compression, Cursor, Fresh, NodeRow, Record, SessionMeta, Store, StoreError,
    StoredSession, Tail, WriteOp,
};
use moka::future::Cache;
use moka::ops::compute::Op;
use serde::Serialize;
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Unix seconds now.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
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
    /// The wire format of its requests (`chat`, `anthropic`); `messages` are in its shape.
    pub dialect: &'static str,
    /// Unix seconds of the first request.
    pub created_at: i64,
    /// Unix seconds of the latest activity.
    pub last_active: i64,
    /// Messages stored, all branches.
    pub message_count: u64,
    /// Rough token count of the history.
    pub token_estimate: u64,
    /// The strategy an operator pinned for the session (`null`: none).
    pub strategy: Option<String>,
    /// Messages in the history (the path to the latest leaf): what `offset` and `limit` page through.
    pub total: u64,
    /// Position in the history of the first message of `messages`.
    pub offset: u64,
    /// Most messages asked for.
    pub limit: u32,
    /// The history's messages `offset..offset + limit`, as the client sent them (in its dialect's shape).
    pub messages: Vec<Value>,
    /// The node id of each message of `messages` (what a turn's `sent_from` refers to).
    pub ids: Vec<String>,
    /// Positions in the history of the replies of `messages` that were cut short.
    pub partial: Vec<u32>,
    /// The run loops (user message → tool calls → final reply) found in `messages`, as a summary, with positions
    /// in the history: a loop that began before the page starts at its first message (without its user message),
    /// one that goes on after it ends at its last.
    pub run_loops: Vec<RunLoopView>,
    /// The other branches: where they leave the history, and their messages from there (of a page: at most
    /// `limit` of each).
    pub branches: Vec<BranchView>,
    /// Compression records (rewrites and summaries), oldest first.
    pub compressions: Vec<Compression>,
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

/// A stored history of the named dialect as neutral messages, each with its position in the history; `None`
/// when the history is neutral already (chat). Handed in by the wiring (`dialect::Dialect::history_as_neutral`), so that
/// `session/` reads no wire format.
pub type NeutralHistory = fn(&str, &[Value]) -> Option<(Vec<Value>, Vec<usize>)>;

/// The run loops of messages in `dialect`'s shape that start at position `base` of a history, found on their
/// neutral form; positions are the history's.
fn run_loop_views(
    neutral_history: Option<NeutralHistory>,
    dialect: &str,
    messages: &[Value],
    timestamps: &[i64],
    base: usize,
) -> Vec<RunLoopView> {
    let converted = neutral_history.and_then(|f| f(dialect, messages));
    let (neutral, native_of): (&[Value], Vec<usize>) = match &converted {
        None => (messages, (0..messages.len()).collect()),
        Some((m, native)) => (m, native.clone()),
    };
    let native = |i: usize| native_of.get(i).copied().unwrap_or(i);
    let times: Vec<i64> = (0..neutral.len())
        .map(|i| timestamps.get(native(i)).copied().unwrap_or(0))
        .collect();
    let at = |i: usize| base + native(i);
    run_loops(neutral, Some(&times))
        .loops
        .into_iter()
        .map(|l| RunLoopView {
            start: at(l.start),
            end: base + native(l.end.saturating_sub(1)) + 1,
            user: l.user.map(|i| preview(&neutral[i])),
            final_reply: l.final_reply.map(|i| preview(&neutral[i])),
            tool_calls: l
                .tool_calls
                .iter()
                .map(|c| {
                    let mut v = serde_json::to_value(c).unwrap_or(Value::Null);
                    v["position"] = Value::from(at(c.position));
                    if let Some(r) = c.result {
                        v["result"] = Value::from(at(r));
                    }
                    v
                })
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

/// The entry of a session loaded from the store.
fn entry_from_stored(s: StoredSession) -> SessionEntry {
    let head = s.meta.head.clone().map(NodeId::from);
    let cursor = Cursor::of(&s);
    let tree = Tree::from_rows(s.nodes, head);
    let cyclic = tree.cyclic_nodes();
    if cyclic > 0 {
        tracing::warn!(
            session = %s.meta.id,
            nodes = cyclic,
            "store: the session's stored parents loop (written by hand or by an older version); its history stops \
             where the loop would repeat"
        );
    }
    let mut st = EntryState::new(tree, s.meta.last_active, true);
    st.version = s.meta.version;
    st.strategy = s.meta.strategy.clone();
    st.idle_notified = s.meta.idle_notified;
    st.cursor = cursor;
    st.in_store = true;
    for c in s.compressions {
        st.push_record(Record::from(c));
    }
    for i in s.internal {
        st.push_record(Record::Internal(i));
    }
    let dialect = dialect_name(&s.meta.dialect);
    SessionEntry::new(s.meta.id, s.meta.tenant, dialect, s.meta.created_at, st)
}

/// Merges what a shared store holds beyond the entry's cursor: nodes, records it lacks, and the row's version and
/// head when newer (so that this instance's next row replaces it). Returns whether the entry grew.
fn apply_tail(entry: &SessionEntry, t: Tail) -> bool {
    let mut st = entry.state.lock();
    let before = (st.tree.len(), st.compressions.len() + st.internal.len());
    st.tree.merge(t.nodes);
    for r in t.records {
        if !st.has_record(&r) {
            st.push_record(r);
        }
    }
    if t.meta.version > st.version {
        st.version = t.meta.version;
        st.strategy = t.meta.strategy.clone();
        st.idle_notified = t.meta.idle_notified;
        if let Some(h) = &t.meta.head {
            st.tree.set_head(h);
        }
    }
    st.last_active = st.last_active.max(t.meta.last_active);
    st.cursor = Cursor {
        nodes: st.cursor.nodes.max(t.cursor.nodes),
        records: st.cursor.records.max(t.cursor.records),
    };
    st.in_store = true;
    let grew = (st.tree.len(), st.compressions.len() + st.internal.len()) != before;
    if grew {
        entry.reweigh(&st);
    }
    grew
}

/// The names of the dialects a session's messages can be in, as requests carry them (`dialect::Dialect::as_str`;
/// `session/` does not import `dialect/`, and tests/gemini.rs holds the two lists equal).
pub const DIALECT_NAMES: [&str; 4] = ["chat", "anthropic", "responses", "gemini"];

/// A stored session's dialect as one of the names requests carry (`chat` for any it does not know).
fn dialect_name(stored: &str) -> &'static str {
    DIALECT_NAMES
        .into_iter()
        .find(|d| *d == stored)
        .unwrap_or("chat")
}

/// How many dialect-scoped ids (`<id>.<dialect>`) a request tries before it is proxied without history: a request
/// in another dialect than its session's starts a session of its own rather than mixing message shapes.
const DIALECT_SCOPES: usize = 3;

/// Sessions: cache over store.
pub struct Sessions {
    store: Arc<dyn Store>,
    cache: Cache<String, Arc<SessionEntry>>,
    metrics: SessionMetrics,
    store_metrics: StoreMetrics,
    /// How long a request waits for the store.
    timeout: Duration,
    /// Bounds every wait on the store; open after a timeout or failure, so that requests stop waiting on it.
    breaker: Breaker,
    /// Every entry in memory (new sessions the upstream has not accepted yet are never in the cache), and the
    /// sessions waiting for a rewrite.
    registry: Arc<Registry>,
    /// How a view finds its run loops in a history of another shape than chat's.
    neutral_history: Option<NeutralHistory>,
}

/// How long a request waits for the store unless configured (`store.timeout_ms`).
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2000);

/// Pause between attempts to queue a flush while the store's queue is full.
const FLUSH_RETRY: Duration = Duration::from_millis(20);

/// The cache of session entries, bounded by the heap bytes they hold (see [`SessionEntry::weight`]).
pub(super) fn session_cache(cache_max_bytes: u64) -> Cache<String, Arc<SessionEntry>> {
    Cache::builder()
        .max_capacity(cache_max_bytes)
        .weigher(|_k: &String, v: &Arc<SessionEntry>| v.weight.load(Ordering::Relaxed))
        .build()
}

impl Sessions {
    /// A manager over `store` caching at most `cache_max_bytes` of history (its real footprint in memory).
    pub fn new(store: Arc<dyn Store>, cache_max_bytes: u64) -> Self {
        let cache = session_cache(cache_max_bytes);
        let breaker = Breaker::new(&store, DEFAULT_TIMEOUT, StoreMetrics::default());
        Self {
            store,
            cache,
            metrics: SessionMetrics::default(),
            store_metrics: StoreMetrics::default(),
            timeout: DEFAULT_TIMEOUT,
            breaker,
            registry: Arc::new(Registry::new()),
            neutral_history: None,
        }
    }

    /// Reads stored histories of other dialects than chat as neutral messages with `f` (for the run loops of
    /// [`Sessions::view`]); without it they are read as they are.
    pub fn with_neutral_history(mut self, f: NeutralHistory) -> Self {
        self.neutral_history = Some(f);
        self
    }

    /// Counts cache hits and misses in `metrics`.
    pub fn with_metrics(mut self, metrics: SessionMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Counts store operations given up on after the timeout in `metrics` (`ctxgate_store_errors_total`).
    pub fn with_store_metrics(mut self, metrics: StoreMetrics) -> Self {
        self.store_metrics = metrics;
        self.breaker = Breaker::new(&self.store, self.timeout, self.store_metrics.clone());
        self
    }

    /// Waits at most `timeout` for the store (cold loads, a turn's commit, records); past it the caller goes on
    /// without history and the write, still queued, completes when the store recovers. Such a timeout (or a
    /// failure) opens the circuit breaker: later requests do not wait at all until a probe finds the store healthy.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.breaker = Breaker::new(&self.store, self.timeout, self.store_metrics.clone());
        self
    }

    /// The store's circuit breaker (open: requests do not wait on the store).
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
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

    /// Waits for the store at most the configured timeout, whatever the breaker's state (admin reads); past it,
    /// counts the operation as failed. A timeout or failure opens the breaker.
    async fn bounded<T>(
        &self,
        op: StoreOp,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.breaker.wait(op, fut).await
    }

    /// [`Sessions::bounded`] on the request path: while the breaker is open, the store is not asked (`start` is not
    /// called; a write it waits for stays queued) and [`StoreError::Unavailable`] comes back at once.
    async fn guarded<T, F>(&self, op: StoreOp, start: impl FnOnce() -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        self.breaker.guarded(op, start).await
    }

    /// Queues `ops` (under the session's lock, so a session's writes are queued in the order they were built).
    /// A dirty session is rewritten whole first; a refused write marks it dirty, keeps its records and keeps the
    /// entry in the registry's dirty set until a rewrite is queued.
    fn queue(
        &self,
        entry: &Arc<SessionEntry>,
        st: &mut EntryState,
        mut ops: Vec<WriteOp>,
        now: i64,
    ) -> oneshot::Receiver<Result<(), StoreError>> {
        let rewrite = st.dirty;
        if rewrite {
            let mut whole = entry.whole(st, false, now);
            whole.append(&mut ops);
            ops = whole;
        }
        let records: Vec<WriteOp> = ops
            .iter()
            .filter(|op| matches!(op, WriteOp::Record { .. }))
            .cloned()
            .collect();
        let mut rx = self.store.write(ops);
        match rx.try_recv() {
            Ok(Err(StoreError::QueueFull)) => {
                st.dirty = true;
                st.unsaved.extend(records);
                self.registry.keep_dirty(entry);
                tracing::warn!(
                    session = %entry.id,
                    "store: write queue full; the session is kept and rewritten whole once the queue has room"
                );
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(Err(StoreError::QueueFull));
                rx
            }
            accepted => {
                if rewrite {
                    self.registry.clear_dirty(entry);
                }
                match accepted {
                    Ok(other) => {
                        let (tx, rx) = oneshot::channel();
                        let _ = tx.send(other);
                        rx
                    }
                    Err(_) => rx,
                }
            }
        }
    }

    /// Queues the whole rewrite of sessions waiting for one (cached or evicted), until the store refuses one
    /// again; drops those deleted meanwhile. Returns whether every one is queued. Call holding no entry's lock.
    fn rewrite_dirty(&self) -> bool {
        let now = now_secs();
        for entry in self.registry.dirty() {
            let mut st = entry.state.lock();
            if !st.writable() || !st.dirty {
                self.registry.clear_dirty(&entry);
                continue;
            }
            let ops = entry.whole(&mut st, false, now);
            drop(self.queue(&entry, &mut st, ops, now));
            if st.dirty {
                return false;
            }
        }
        true
    }

    /// After a write the store accepted: the queue has room, so sessions waiting for a rewrite get it now.
    fn accepted_write(&self) {
        if self.registry.has_dirty() {
            self.rewrite_dirty();
        }
    }

    /// Re-inserts a cached entry so that the cache weighs it again; never re-adds one removed meanwhile.
    async fn reweigh_cached(&self, entry: &Arc<SessionEntry>) {
        let e = entry.clone();
        self.cache
            .entry_by_ref(&entry.id)
            .and_compute_with(|cur| async move {
                let same = cur.is_some_and(|c| Arc::ptr_eq(c.value(), &e));
                if same && !e.state.lock().deleted {
                    Op::Put(e)
                } else {
                    Op::Nop
                }
            })
            .await;
    }

    /// Brings a cached entry up to date with a shared store (other instances append to it): one read of what was
    /// appended since the entry's cursor, fetching only the nodes it lacks. Returns false when the session is gone
    /// from the store (deleted or expired elsewhere): the entry is forgotten. A store of this instance alone is
    /// not asked.
    async fn refresh(&self, entry: &Arc<SessionEntry>) -> Result<bool, StoreError> {
        if !self.store.shared() {
            return Ok(true);
        }
        let (since, admitted) = {
            let st = entry.state.lock();
            (st.cursor, st.admitted && !st.deleted)
        };
        if !admitted {
            return Ok(true);
        }
        let e = entry.clone();
        let have = Box::new(move |id: &str| e.state.lock().tree.get(id).is_some());
        let fresh = match self
            .guarded(StoreOp::Load, || self.store.tail(&entry.id, since, have))
            .await
        {
            // The store is down: the cached entry as it is (what other instances appended meanwhile is not there
            // to read either).
            Err(StoreError::Unavailable) => return Ok(true),
            other => other?,
        };
        match fresh {
            Fresh::Local => Ok(true),
            Fresh::Gone => {
                // Not written yet (a new session whose first write is still queued) is not gone.
                if !entry.state.lock().in_store {
                    return Ok(true);
                }
                tracing::info!(session = %entry.id, "session: gone from the shared store; starting afresh");
                self.registry.delete(&entry.id);
                self.cache.remove(&entry.id).await;
                entry.state.lock().deleted = true;
                Ok(false)
            }
            Fresh::Tail(t) => {
                let grew = apply_tail(entry, *t);
                if grew {
                    self.reweigh_cached(entry).await;
                }
                Ok(true)
            }
        }
    }

    /// Brings `entry` up to date with a shared store (what other instances appended: nodes, records such as their
    /// summaries); nothing to do for a store of this instance alone.
    pub async fn catch_up(&self, entry: &Arc<SessionEntry>) -> Result<(), StoreError> {
        self.refresh(entry).await.map(|_| ())
    }

    async fn load_entry(&self, id: &str) -> Result<Option<Arc<SessionEntry>>, StoreError> {
        if let Some(e) = self.cache.get(id).await {
            self.metrics.lookup(CacheResult::Hit);
            if !self.refresh(&e).await? {
                return Ok(None);
            }
            return Ok(Some(e));
        }
        self.metrics.lookup(CacheResult::Miss);
        let store = self.store.clone();
        let registry = self.registry.clone();
        let breaker = self.breaker.clone();
        let key = id.to_string();
        let loaded = self
            .cache
            .try_get_with(key.clone(), async move {
                // Still in memory (evicted while a turn or a pending rewrite holds it): that entry, not a copy.
                if let Some(e) = registry.admitted(&key) {
                    return Ok(e);
                }
                let stored = breaker.guarded(StoreOp::Load, || store.load(&key)).await?;
                // An entry registered while the store answered (a racing first request) wins over the row.
                match registry.get_or_register(&key, || stored.map(entry_from_stored)) {
                    Some(e) if e.state.lock().admitted => Ok(e),
                    _ => Err(StoreError::Backend {
                        backend: "cache",
                        message: "not found".into(),
                    }),
                }
            })
            .await;
        match loaded {
            // Perhaps an entry kept in memory while evicted: as current as a cached one must be.
            Ok(e) => Ok(self.refresh(&e).await?.then_some(e)),
            Err(e) => match &*e {
                StoreError::Backend {
                    backend: "cache", ..
                } => Ok(None),
                other => Err(other.clone()),
            },
        }
    }

    /// A new session, or the entry another request registered for it meanwhile (one lock around both, so racing
    /// first requests share one entry); kept out of the cache until admitted.
    fn fresh_entry(&self, ident: &SessionIdentity, now: i64) -> Arc<SessionEntry> {
        self.registry.get_or_create(&ident.id, || {
            SessionEntry::new(
                ident.id.clone(),
                ident.tenant.clone(),
                ident.dialect,
                now,
                EntryState::new(Tree::new(), now, false),
            )
        })
    }

    /// The session of `ident` as the store has it (loaded, or new). Its id may differ from `ident.id`: see
    /// [`DIALECT_SCOPES`].
    async fn entry_for(
        &self,
        ident: &SessionIdentity,
        now: i64,
    ) -> Result<Arc<SessionEntry>, StoreError> {
        // A session holds one dialect's messages: a request in another dialect under the same id starts a session
        // of its own, `<id>.<dialect>` (the id the answer's `x-ctxgate-session` then names).
        let mut ident = std::borrow::Cow::Borrowed(ident);
        for _ in 0..DIALECT_SCOPES {
            let entry = match self.load_entry(&ident.id).await? {
                Some(e) => e,
                None => self.fresh_entry(&ident, now),
            };
            if entry.tenant != ident.tenant {
                return Err(StoreError::TenantMismatch);
            }
            if entry.dialect == ident.dialect {
                return Ok(entry);
            }
            let scoped = format!("{}.{}", ident.id, ident.dialect);
            ident.to_mut().id = scoped;
        }
        Err(StoreError::Backend {
            backend: "session",
            message: "the session id names sessions of other dialects".into(),
        })
    }

    /// Reconciles a request's messages with the session and queues the new ones for writing (not awaited). A new
    /// session's messages are only written once [`Sessions::admit`] is called.
    pub async fn record_request(
        &self,
        ident: &SessionIdentity,
        messages: &[Value],
        raw_hashes: &[u64],
    ) -> Result<RequestMark, StoreError> {
        let now = now_secs();
        let entry = self.entry_for(ident, now).await?;
        let (mark, grew, accepted) = {
            let mut st = entry.state.lock();
            let before = st.tree.weight();
            let appended = st.tree.append_request(messages, raw_hashes, now);
            st.last_active = now;
            let nodes = st.tree.path_to(appended.leaf.as_ref());
            let first_seen: Vec<i64> = nodes.iter().map(|n| n.created_at).collect();
            let path: Vec<String> = nodes.iter().map(|n| n.id.to_string()).collect();
            // A request that adds no message (an identical resend, a retry) writes nothing: the row's new head and
            // activity go with the reply's write, which the turn waits for anyway.
            if st.writable() && !appended.created.is_empty() {
                let mut ops = vec![WriteOp::Session {
                    meta: entry.next_meta(&mut st),
                    create: false,
                }];
                for id in &appended.created {
                    if let Some(n) = st.tree.get(id) {
                        ops.push(WriteOp::Node {
                            session: entry.id.clone(),
                            node: NodeRow::from(n),
                        });
                    }
                }
                // Queued, not awaited: durability of the turn is awaited with the reply.
                drop(self.queue(&entry, &mut st, ops, now));
            }
            let accepted = st.writable() && !st.dirty;
            entry.reweigh(&st);
            let grew = st.admitted && st.tree.weight() != before;
            let mark = RequestMark {
                entry: entry.clone(),
                leaf: appended.leaf,
                known: appended.known,
                created: appended.created.len(),
                first_seen,
                path,
            };
            (mark, grew, accepted)
        };
        if accepted {
            self.accepted_write();
        }
        if grew {
            self.reweigh_cached(&entry).await;
        }
        Ok(mark)
    }

    /// The upstream accepted the request (2xx): a new session's first turn goes to the store and the cache.
    /// Nothing happens for a session already admitted (or deleted). Not awaited: the reply's commit is.
    pub async fn admit(&self, mark: &RequestMark) {
        let entry = &mark.entry;
        {
            let mut st = entry.state.lock();
            if st.admitted || st.deleted {
                return;
            }
            st.admitted = true;
            let now = now_secs();
            let ops = entry.whole(&mut st, true, now);
            drop(self.queue(entry, &mut st, ops, now));
            entry.reweigh(&st);
        }
        self.cache.insert(entry.id.clone(), entry.clone()).await;
    }

    /// Appends the upstream's reply after the request's last message and waits (at most the store timeout) until
    /// the whole turn is durable. A reply admits a new session (the upstream accepted it).
    pub async fn record_reply(
        &self,
        mark: &RequestMark,
        message: Value,
        partial: bool,
    ) -> Result<(), StoreError> {
        self.record_replies(mark, vec![message], partial, None)
            .await
    }

    /// [`Sessions::record_reply`] for a reply made of several messages (a Responses answer's output items), stored
    /// as a chain after the request's messages, in order.
    pub async fn record_replies(
        &self,
        mark: &RequestMark,
        messages: Vec<Value>,
        partial: bool,
        turn: Option<String>,
    ) -> Result<(), StoreError> {
        self.admit(mark).await;
        let now = now_secs();
        let entry = &mark.entry;
        let (rx, new, accepted) = {
            let mut st = entry.state.lock();
            let mut parent = mark.leaf.clone();
            let mut created = Vec::new();
            for message in messages {
                let (id, new) = st.tree.append_reply(parent, message, partial, now);
                if new {
                    created.push(id.clone());
                }
                parent = Some(id);
            }
            let new = !created.is_empty();
            st.last_active = now;
            entry.reweigh(&st);
            if !st.writable() {
                return Ok(());
            }
            let mut ops = Vec::with_capacity(created.len() + 2);
            for id in &created {
                if let Some(n) = st.tree.get(id) {
                    ops.push(WriteOp::Node {
                        session: entry.id.clone(),
                        node: NodeRow::from(n),
                    });
                }
            }
            if let Some(turn) = turn {
                ops.push(WriteOp::Turn {
                    session: entry.id.clone(),
                    turn,
                });
            }
            ops.push(WriteOp::Session {
                meta: entry.next_meta(&mut st),
                create: false,
            });
            let rx = self.queue(entry, &mut st, ops, now);
            (rx, new, !st.dirty)
        };
        if accepted {
            self.accepted_write();
        }
        if new {
            self.reweigh_cached(entry).await;
        }
        self.guarded(StoreOp::Write, || committed(rx)).await?;
        entry.state.lock().in_store = true;
        Ok(())
    }

    /// Waits until every write queued so far is committed; sessions whose writes were refused (cached or evicted
    /// since) are rewritten first, waiting for room in the queue. Not bounded by the store timeout: callers
    /// (shutdown) bound it themselves.
    pub async fn flush(&self) -> Result<(), StoreError> {
        while !self.rewrite_dirty() {
            tokio::time::sleep(FLUSH_RETRY).await;
        }
        loop {
            match committed(self.store.write(Vec::new())).await {
                Err(StoreError::QueueFull) => tokio::time::sleep(FLUSH_RETRY).await,
                other => return other,
            }
        }
    }

    /// Appends a turn's record to a session on its own (a turn whose reply is not stored) and waits (at most the
    /// store timeout) until it is durable. A session whose writes are held back (not admitted, or being rewritten
    /// after a refused write) does not keep it.
    pub async fn record_turn(
        &self,
        entry: &Arc<SessionEntry>,
        turn: String,
    ) -> Result<(), StoreError> {
        let now = now_secs();
        let rx = {
            let mut st = entry.state.lock();
            if !st.writable() {
                return Ok(());
            }
            let op = WriteOp::Turn {
                session: entry.id.clone(),
                turn,
            };
            self.queue(entry, &mut st, vec![op], now)
        };
        self.guarded(StoreOp::Write, || committed(rx)).await
    }

    /// Appends a record (compression or internal exchange) to a session and waits (at most the store timeout)
    /// until it is durable.
    pub async fn record(&self, mark: &RequestMark, record: Record) -> Result<(), StoreError> {
        self.record_entry(&mark.entry, record).await
    }

    /// Like [`Sessions::record`], for a session entry. A session not admitted yet keeps the record in memory; it
    /// is written with the session on admission (or never, when the upstream refuses it).
    pub async fn record_entry(
        &self,
        entry: &Arc<SessionEntry>,
        record: Record,
    ) -> Result<(), StoreError> {
        let now = now_secs();
        let rx = {
            let mut st = entry.state.lock();
            st.push_record(record.clone());
            entry.reweigh(&st);
            if !st.writable() {
                return Ok(());
            }
            let op = WriteOp::Record {
                session: entry.id.clone(),
                created_at: now,
                record,
            };
            self.queue(entry, &mut st, vec![op], now)
        };
        self.reweigh_cached(entry).await;
        self.guarded(StoreOp::Write, || committed(rx)).await
    }

    /// Pins `strategy` for session `id` (`None`: unpins it) and waits until the row is durable; returns the
    /// row (`None`: no such session).
    pub async fn pin_strategy(
        &self,
        id: &str,
        strategy: Option<crate::config::Strategy>,
    ) -> Result<Option<SessionMeta>, StoreError> {
        self.update_row(id, |st| {
            st.strategy = strategy.map(|s| s.as_str().to_string());
            true
        })
        .await
    }

    /// Marks the idle period of session `id` that began at `last_active` as notified (its webhook is done) and
    /// waits until the row is durable. False (nothing written) when the session is gone or was active since.
    pub async fn mark_idle_notified(&self, id: &str, last_active: i64) -> Result<bool, StoreError> {
        let row = self
            .update_row(id, |st| {
                let same_period = st.last_active == last_active;
                if same_period {
                    st.idle_notified = Some(last_active);
                }
                same_period
            })
            .await?;
        Ok(row.is_some_and(|m| m.idle_notified == Some(last_active)))
    }

    /// Changes session `id`'s row with `change` (which says whether it changed anything) and writes it with a new
    /// version, waiting until it is durable; returns the row (`None`: no such session). A session whose writes
    /// are held back keeps the change in memory: its next whole write carries it.
    async fn update_row(
        &self,
        id: &str,
        change: impl FnOnce(&mut EntryState) -> bool,
    ) -> Result<Option<SessionMeta>, StoreError> {
        let Some(entry) = self.load_entry(id).await? else {
            return Ok(None);
        };
        let now = now_secs();
        let (rx, meta) = {
            let mut st = entry.state.lock();
            if !change(&mut st) {
                return Ok(Some(entry.meta(&st)));
            }
            let meta = entry.next_meta(&mut st);
            if !st.writable() {
                return Ok(Some(meta));
            }
            let op = WriteOp::Session {
                meta: meta.clone(),
                create: false,
            };
            (self.queue(&entry, &mut st, vec![op], now), meta)
        };
        self.guarded(StoreOp::Write, || committed(rx)).await?;
        Ok(Some(meta))
    }

    /// A page of the turn records stored for session `id`, and how many there are.
    pub async fn stored_turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> Result<(Vec<String>, u64), StoreError> {
        self.bounded(StoreOp::Load, self.store.turns(id, offset, limit))
            .await
    }

    /// A cached or stored session entry, for background work and the admin API.
    pub async fn entry(&self, id: &str) -> Result<Option<Arc<SessionEntry>>, StoreError> {
        self.load_entry(id).await
    }

    /// The admin view of a session, its whole history.
    pub async fn view(&self, id: &str) -> Result<Option<SessionView>, StoreError> {
        self.view_page(id, None).await
    }

    /// The admin view of a session with messages `offset..offset + limit` of its history (`page`; `None`: all of
    /// them), and of each other branch at most `limit` messages: what the answer holds is bounded by the page,
    /// whatever the session's length.
    pub async fn view_page(
        &self,
        id: &str,
        page: Option<(u64, u32)>,
    ) -> Result<Option<SessionView>, StoreError> {
        let Some(entry) = self.load_entry(id).await? else {
            return Ok(None);
        };
        let st = entry.state.lock();
        let meta = entry.meta(&st);
        let history = st.tree.history();
        let total = history.len();
        let (offset, limit) = page.unwrap_or((0, u32::try_from(total).unwrap_or(u32::MAX)));
        // A branch shows as many messages as the page asked for (all of them for the whole view).
        let branch_cap = page.map_or(usize::MAX, |(_, limit)| limit as usize);
        let from = usize::try_from(offset).unwrap_or(usize::MAX).min(total);
        let to = from.saturating_add(limit as usize).min(total);
        let window = history.get(from..to).unwrap_or(&[]);
        let branches = st
            .tree
            .other_leaves()
            .into_iter()
            .map(|leaf| {
                let at = st.tree.divergence(leaf);
                BranchView {
                    leaf: leaf.id.to_string(),
                    diverges_at: at,
                    length: leaf.position.saturating_add(1),
                    messages: st
                        .tree
                        .path_to(Some(&leaf.id))
                        .into_iter()
                        .filter(|n| n.position >= at)
                        .take(branch_cap)
                        .map(|n| (*n.message).clone())
                        .collect(),
                }
            })
            .collect();
        let messages: Vec<Value> = window.iter().map(|n| (*n.message).clone()).collect();
        let timestamps: Vec<i64> = window.iter().map(|n| n.created_at).collect();
        let ids: Vec<String> = window.iter().map(|n| n.id.to_string()).collect();
        Ok(Some(SessionView {
            id: entry.id.clone(),
            dialect: entry.dialect,
            created_at: entry.created_at,
            last_active: meta.last_active,
            message_count: meta.message_count,
            token_estimate: meta.token_estimate,
            strategy: meta.strategy.clone(),
            total: total as u64,
            offset,
            limit,
            partial: window
                .iter()
                .filter(|n| n.partial)
                .map(|n| n.position)
                .collect(),
            run_loops: run_loop_views(
                self.neutral_history,
                entry.dialect,
                &messages,
                &timestamps,
                from,
            ),
            messages,
            ids,
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
        self.bounded(StoreOp::List, self.store.list(limit, offset))
            .await
    }

    /// Sessions whose id contains `q`, by newest activity, paged, and how many match: a scan of the store's
    /// listing (an admin search, not for the request path).
    pub async fn find(
        &self,
        q: &str,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<SessionMeta>, u64), StoreError> {
        const SCAN: u32 = 500;
        let (mut page, mut matched, mut at) = (Vec::new(), 0u64, 0u64);
        loop {
            let (rows, _) = self.list(SCAN, at).await?;
            if rows.is_empty() {
                return Ok((page, matched));
            }
            at += rows.len() as u64;
            for m in rows.into_iter().filter(|m| m.id.contains(q)) {
                if matched >= offset && page.len() < limit as usize {
                    page.push(m);
                }
                matched += 1;
            }
        }
    }

    /// Removes a session from cache and store; true when it existed. Turns still running on it write nothing
    /// more (their entry is marked deleted before the store's delete is queued).
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let live = self.registry.delete(id);
        let cached = self.cache.remove(id).await;
        if let Some(e) = &cached {
            e.state.lock().deleted = true;
        }
        let stored = self.bounded(StoreOp::Delete, self.store.delete(id)).await?;
        let admitted = live.is_some_and(|e| e.state.lock().admitted);
        Ok(cached.is_some() || admitted || stored)
    }

    /// Purges sessions idle for more than `days` days from store and cache; returns how many were purged.
    pub async fn purge_idle(&self, days: u64) -> Result<u64, StoreError> {
        let before = now_secs() - i64::try_from(days.saturating_mul(86_400)).unwrap_or(i64::MAX);
        // Marked deleted first, so that nothing queued after the purge writes them back.
        let stale: Vec<Arc<String>> = self
            .cache
            .iter()
            .filter(|(_, e)| {
                let mut st = e.state.lock();
                let idle = st.last_active < before;
                st.deleted |= idle;
                idle
            })
            .map(|(k, _)| k)
            .collect();
        // Sessions waiting for a rewrite, evicted from the cache or not, are purged too (never rewritten).
        for e in self.registry.dirty() {
            let mut st = e.state.lock();
            if st.last_active < before {
                st.deleted = true;
                self.registry.clear_dirty(&e);
            }
        }
        let n = self.store.purge_idle(before).await;
        for k in stale {
            self.cache.invalidate(k.as_str()).await;
        }
        n
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
