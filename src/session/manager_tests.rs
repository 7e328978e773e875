//! Session manager tests: rows applied out of order, cache weights, refused writes (also of sessions the cache
//! evicted), deletes mid-turn, racing first requests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::session::identity::IdSource;
use crate::session::tree::raw_message_hashes;
use crate::store::records::{RewriteRecord, SummaryRecord};
use crate::store::{MemoryStore, StoredSession};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::json;

fn ident(id: &str) -> SessionIdentity {
    SessionIdentity {
        tenant: "t".into(),
        id: id.into(),
        source: IdSource::Header,
        dialect: "chat",
    }
}

fn raw(m: &[Value]) -> Vec<u64> {
    raw_message_hashes(json!({ "messages": m }).to_string().as_bytes())
}

/// Answers every write at once but applies the batches that update a session only at a barrier, newest
/// first: the order in which concurrent turns' writes could reach a store when built under the lock and queued
/// after it. (Batches that create a session are applied at once.)
struct Reversing {
    inner: MemoryStore,
    held: Mutex<Vec<Vec<WriteOp>>>,
}

impl Store for Reversing {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        let creates = ops
            .iter()
            .any(|op| matches!(op, WriteOp::Session { create: true, .. }));
        if ops.is_empty() || creates {
            let held = std::mem::take(&mut *self.held.lock());
            for batch in held.into_iter().rev() {
                drop(self.inner.write(batch));
            }
            return self.inner.write(ops);
        }
        self.held.lock().push(ops);
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Ok(()));
        rx
    }

    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        self.inner.load(id)
    }

    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        self.inner.list(limit, offset)
    }

    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        self.inner.turns(id, offset, limit)
    }

    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.inner.delete(id)
    }

    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.inner.purge_idle(before)
    }
}

#[tokio::test]
async fn rows_applied_out_of_order_never_move_the_session_backwards() {
    let store = Arc::new(Reversing {
        inner: MemoryStore::new(),
        held: Mutex::new(Vec::new()),
    });
    let sessions = Sessions::new(store.clone(), 1 << 20);
    let mut history = vec![json!({"role":"user","content":"q0"})];
    let mark = sessions
        .record_request(&ident("s"), &history, &raw(&history))
        .await
        .unwrap();
    sessions
        .record_reply(&mark, json!({"role":"assistant","content":"a0"}), false)
        .await
        .unwrap();
    sessions.flush().await.unwrap();
    history.push(json!({"role":"assistant","content":"a0"}));
    for i in 1..=8 {
        history.push(json!({"role":"user","content":format!("q{i}")}));
        let mark = sessions
            .record_request(&ident("s"), &history, &raw(&history))
            .await
            .unwrap();
        let reply = json!({"role":"assistant","content":format!("a{i}")});
        sessions
            .record_reply(&mark, reply.clone(), false)
            .await
            .unwrap();
        history.push(reply);
    }
    sessions.flush().await.unwrap();
    let stored = store.load("s").await.unwrap().unwrap();
    let entry = sessions.entry("s").await.unwrap().unwrap();
    let (len, history, head) =
        entry.with_tree(|t| (t.len(), t.history().len(), t.head().map(|h| h.to_string())));
    assert_eq!(stored.nodes.len(), len);
    assert_eq!(stored.meta.message_count, history as u64);
    assert_eq!(stored.meta.head, head);
}

#[tokio::test]
async fn the_cache_weighs_records_and_the_prefix_index() {
    let sessions = Sessions::new(Arc::new(MemoryStore::new()), 1 << 30);
    let m = vec![json!({"role":"user","content":"q"})];
    let mark = sessions
        .record_request(&ident("w"), &m, &raw(&m))
        .await
        .unwrap();
    sessions.admit(&mark).await;
    let entry = mark.entry.clone();
    let (_, cached) = sessions.cache_stats_now().await;
    let start = entry.weight();
    assert_eq!(cached, u64::from(start));

    // The same message serialised differently: no node, but the prefix index grows (weighed as its table grows).
    for k in 0..8 {
        sessions
            .record_request(&ident("w"), &m, &[42 + k])
            .await
            .unwrap();
    }
    let after_index = entry.weight();
    assert!(after_index > start, "the prefix index is weighed");

    let record = SummaryRecord {
        summary: "x".repeat(10_000),
        ..SummaryRecord::default()
    };
    sessions
        .record_entry(&entry, Record::from(Compression::Summary(record)))
        .await
        .unwrap();
    let after_record = entry.weight();
    assert!(after_record >= after_index + 20_000, "records are weighed");
    let (_, cached) = sessions.cache_stats_now().await;
    assert_eq!(
        cached,
        u64::from(after_record),
        "the cache sees the new weight"
    );
}

#[tokio::test]
async fn a_refused_write_is_rewritten_with_the_next_one() {
    let store = Gate::refusing(2);
    let sessions = Sessions::new(store.clone(), 1 << 20);
    let m = vec![json!({"role":"user","content":"q"})];
    let mark = sessions
        .record_request(&ident("r"), &m, &raw(&m))
        .await
        .unwrap();
    let record = Compression::Rewrite(RewriteRecord {
        cuts: vec![1],
        ..RewriteRecord::default()
    });
    sessions
        .record(&mark, Record::from(record.clone()))
        .await
        .unwrap();
    // Admission and the reply are refused: nothing stored yet, the session is marked for a rewrite.
    let refused = sessions
        .record_reply(&mark, json!({"role":"assistant","content":"a"}), false)
        .await;
    assert!(matches!(refused, Err(StoreError::QueueFull)));
    assert!(store.load("r").await.unwrap().is_none());
    sessions.flush().await.unwrap();
    let stored = store.load("r").await.unwrap().unwrap();
    assert_eq!(stored.nodes.len(), 2);
    assert_eq!(stored.meta.message_count, 2);
    assert_eq!(stored.compressions, vec![record]);
}

#[tokio::test]
async fn a_session_deleted_mid_turn_stays_deleted() {
    let store = Arc::new(MemoryStore::new());
    let sessions = Sessions::new(store.clone(), 1 << 20);
    let m = vec![json!({"role":"user","content":"q"})];
    let mark = sessions
        .record_request(&ident("d"), &m, &raw(&m))
        .await
        .unwrap();
    sessions
        .record_reply(&mark, json!({"role":"assistant","content":"a"}), false)
        .await
        .unwrap();
    let mut next = m.clone();
    next.push(json!({"role":"assistant","content":"a"}));
    next.push(json!({"role":"user","content":"q2"}));
    let mark = sessions
        .record_request(&ident("d"), &next, &raw(&next))
        .await
        .unwrap();
    assert!(sessions.delete("d").await.unwrap());
    sessions
        .record_reply(&mark, json!({"role":"assistant","content":"a2"}), false)
        .await
        .unwrap();
    sessions
        .record(&mark, Record::Internal(json!({})))
        .await
        .unwrap();
    sessions.flush().await.unwrap();
    assert!(store.load("d").await.unwrap().is_none(), "not written back");
}

/// Refuses writes (as a full queue does) while it has refusals left; otherwise memory. Empty writes (flush
/// barriers) pass.
struct Gate {
    inner: MemoryStore,
    refusals_left: Mutex<usize>,
}

impl Gate {
    /// Refuses the next `n` writes.
    fn refusing(n: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            refusals_left: Mutex::new(n),
        })
    }

    /// Refuses every write until [`Gate::open`].
    fn closed() -> Arc<Self> {
        Self::refusing(usize::MAX)
    }

    fn open(&self) {
        *self.refusals_left.lock() = 0;
    }
}

impl Store for Gate {
    fn backend(&self) -> &'static str {
        "memory"
    }
    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        let mut left = self.refusals_left.lock();
        if *left > 0 && !ops.is_empty() {
            *left -= 1;
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Err(StoreError::QueueFull));
            return rx;
        }
        self.inner.write(ops)
    }
    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        self.inner.load(id)
    }
    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        self.inner.list(limit, offset)
    }

    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        self.inner.turns(id, offset, limit)
    }
    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.inner.delete(id)
    }
    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.inner.purge_idle(before)
    }
}

/// The compression record the eviction tests keep with a refused session.
fn cuts_record() -> Compression {
    Compression::Rewrite(RewriteRecord {
        cuts: vec![1],
        ..RewriteRecord::default()
    })
}

/// A turn on session `id` whose writes the closed `Gate` refuses, then the cache evicts the session (the cache
/// holds 1 byte) and every handle on the entry is dropped.
async fn refused_then_evicted(sessions: &Sessions, id: &str) -> Vec<Value> {
    let m = vec![json!({"role":"user","content":"q"})];
    let mark = sessions
        .record_request(&ident(id), &m, &raw(&m))
        .await
        .unwrap();
    sessions
        .record(&mark, Record::from(cuts_record()))
        .await
        .unwrap();
    let refused = sessions
        .record_reply(&mark, json!({"role":"assistant","content":"a"}), false)
        .await;
    assert!(matches!(refused, Err(StoreError::QueueFull)));
    drop(mark);
    assert_eq!(sessions.cache_stats_now().await.0, 0, "evicted");
    assert!(sessions.cache.get(id).await.is_none());
    vec![m[0].clone(), json!({"role":"assistant","content":"a"})]
}

#[tokio::test]
async fn a_refused_session_evicted_from_the_cache_is_still_flushed_whole() {
    let store = Gate::closed();
    let sessions = Sessions::new(store.clone(), 1);
    refused_then_evicted(&sessions, "ev").await;
    assert!(store.load("ev").await.unwrap().is_none());
    store.open();
    sessions.flush().await.unwrap();
    let stored = store.load("ev").await.unwrap().expect("flushed");
    assert_eq!(stored.nodes.len(), 2);
    assert_eq!(stored.meta.message_count, 2);
    assert_eq!(stored.compressions, vec![cuts_record()]);
}

#[tokio::test]
async fn a_refused_session_evicted_from_the_cache_is_rewritten_once_the_store_takes_writes() {
    let store = Gate::closed();
    let sessions = Sessions::new(store.clone(), 1);
    refused_then_evicted(&sessions, "ev").await;
    store.open();
    // Another session's turn is accepted: the queue has room, the evicted session is rewritten (no flush).
    let m = vec![json!({"role":"user","content":"other"})];
    let mark = sessions
        .record_request(&ident("other"), &m, &raw(&m))
        .await
        .unwrap();
    sessions
        .record_reply(&mark, json!({"role":"assistant","content":"b"}), false)
        .await
        .unwrap();
    let stored = store.load("ev").await.unwrap().expect("rewritten");
    assert_eq!(stored.nodes.len(), 2);
    assert_eq!(stored.meta.message_count, 2);
    assert_eq!(stored.compressions, vec![cuts_record()]);
}

#[tokio::test]
async fn a_refused_session_evicted_from_the_cache_keeps_its_entry() {
    let store = Gate::closed();
    let sessions = Sessions::new(store.clone(), 1);
    let mut history = refused_then_evicted(&sessions, "ev").await;
    // The next turn finds the same history (and the record), not an empty session.
    history.push(json!({"role":"user","content":"q2"}));
    let mark = sessions
        .record_request(&ident("ev"), &history, &raw(&history))
        .await
        .unwrap();
    assert_eq!(mark.known, 2, "the evicted entry's history");
    assert_eq!(mark.entry.compressions(), vec![cuts_record()]);
    store.open();
    sessions
        .record_reply(&mark, json!({"role":"assistant","content":"a2"}), false)
        .await
        .unwrap();
    sessions.flush().await.unwrap();
    let stored = store.load("ev").await.unwrap().unwrap();
    assert_eq!(stored.nodes.len(), 4);
    assert_eq!(stored.meta.message_count, 4);
    assert_eq!(stored.compressions, vec![cuts_record()]);
}

#[tokio::test]
async fn a_refused_session_deleted_after_eviction_is_not_written_back() {
    let store = Gate::closed();
    let sessions = Sessions::new(store.clone(), 1);
    refused_then_evicted(&sessions, "ev").await;
    store.open();
    assert!(sessions.delete("ev").await.unwrap(), "it existed");
    sessions.flush().await.unwrap();
    assert!(store.load("ev").await.unwrap().is_none());
}

/// Memory, except that once armed, the next load answers only after the next write is applied.
struct LoadAfterWrite {
    inner: Arc<MemoryStore>,
    armed: std::sync::atomic::AtomicBool,
    loading: Arc<tokio::sync::Notify>,
    written: Arc<tokio::sync::Notify>,
}

impl Store for LoadAfterWrite {
    fn backend(&self) -> &'static str {
        "memory"
    }
    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        let rx = self.inner.write(ops);
        self.written.notify_one();
        rx
    }
    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        if !self.armed.swap(false, Ordering::SeqCst) {
            return self.inner.load(id);
        }
        let (loading, written) = (self.loading.clone(), self.written.clone());
        let (inner, id) = (self.inner.clone(), id.to_string());
        Box::pin(async move {
            loading.notify_one();
            written.notified().await;
            inner.load(&id).await
        })
    }
    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        self.inner.list(limit, offset)
    }

    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        self.inner.turns(id, offset, limit)
    }
    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.inner.delete(id)
    }
    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.inner.purge_idle(before)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_loading_while_the_first_one_is_admitted_shares_its_entry() {
    let store = Arc::new(LoadAfterWrite {
        inner: Arc::new(MemoryStore::new()),
        armed: std::sync::atomic::AtomicBool::new(false),
        loading: Arc::new(tokio::sync::Notify::new()),
        written: Arc::new(tokio::sync::Notify::new()),
    });
    let sessions = Arc::new(Sessions::new(store.clone(), 1 << 20));
    let m = vec![json!({"role":"user","content":"q"})];
    let first = sessions
        .record_request(&ident("race"), &m, &raw(&m))
        .await
        .unwrap();
    // A second first request misses the cache and loads; the store answers once the first is admitted.
    store.armed.store(true, Ordering::SeqCst);
    let second = tokio::spawn({
        let (sessions, m) = (sessions.clone(), m.clone());
        async move {
            sessions
                .record_request(&ident("race"), &m, &raw(&m))
                .await
                .unwrap()
        }
    });
    store.loading.notified().await;
    sessions.admit(&first).await;
    let second = second.await.unwrap();
    assert!(
        Arc::ptr_eq(&first.entry, &second.entry),
        "one entry for the session, not a second one loaded from the row"
    );
    let cached = sessions.entry("race").await.unwrap().unwrap();
    assert!(Arc::ptr_eq(&first.entry, &cached));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_first_requests_share_one_entry_and_one_history() {
    for round in 0..20 {
        let store = Arc::new(MemoryStore::new());
        let sessions = Arc::new(Sessions::new(store.clone(), 1 << 20));
        let id = format!("race-{round}");
        let m = vec![json!({"role":"user","content":"q"})];
        let barrier = Arc::new(tokio::sync::Barrier::new(32));
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (sessions, m, barrier, id) =
                    (sessions.clone(), m.clone(), barrier.clone(), id.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mark = sessions
                        .record_request(&ident(&id), &m, &raw(&m))
                        .await
                        .unwrap();
                    let reply = json!({"role":"assistant","content":format!("a{i}")});
                    sessions.record_reply(&mark, reply, false).await.unwrap();
                    mark.entry
                })
            })
            .collect();
        let mut entries = Vec::new();
        for t in tasks {
            entries.push(t.await.unwrap());
        }
        assert!(
            entries.iter().all(|e| Arc::ptr_eq(e, &entries[0])),
            "one entry"
        );
        sessions.flush().await.unwrap();
        let cached = sessions.entry(&id).await.unwrap().unwrap();
        assert!(Arc::ptr_eq(&cached, &entries[0]));
        let (len, history, head) =
            cached.with_tree(|t| (t.len(), t.history().len(), t.head().map(|h| h.to_string())));
        assert_eq!(len, 33, "the question once, every reply a branch");
        let stored = store.load(&id).await.unwrap().unwrap();
        assert_eq!(stored.nodes.len(), len);
        assert_eq!(stored.meta.message_count, history as u64);
        assert_eq!(stored.meta.head, head);
    }
}

/// A client that compacts or clears its own history (Claude Code's auto-compact, `/clear`) keeps its session id but
/// sends a history that does not extend the stored one: a new branch of the session tree, not an append, and
/// nothing of the old history is lost or mixed into the new one.
#[tokio::test]
async fn a_history_that_is_not_an_extension_forks_the_session() {
    let store = Arc::new(MemoryStore::new());
    let sessions = Sessions::new(store.clone(), 1 << 20);
    let id = ident("cc-session");
    let long = vec![
        json!({"role":"system","content":"You are Claude Code."}),
        json!({"role":"user","content":"fix the bug"}),
        json!({"role":"assistant","content":null,"tool_calls":[{"id":"t1","type":"function",
            "function":{"name":"Read","arguments":"{\"path\":\"a.rs\"}"}}]}),
        json!({"role":"tool","tool_call_id":"t1","content":"fn main() {}"}),
    ];
    let mark = sessions
        .record_request(&id, &long, &raw(&long))
        .await
        .unwrap();
    assert_eq!((mark.known, mark.created), (0, 4));
    let reply = json!({"role":"assistant","content":"fixed"});
    sessions.record_reply(&mark, reply, false).await.unwrap();

    // Auto-compact: the same session, the system prompt kept, the history replaced by a summary.
    let compacted = vec![
        long[0].clone(),
        json!({"role":"user","content":"This session is being continued: the bug in a.rs was fixed."}),
        json!({"role":"user","content":"now add a test"}),
    ];
    let fork = sessions
        .record_request(&id, &compacted, &raw(&compacted))
        .await
        .unwrap();
    assert_eq!(fork.known, 1, "only the system prompt is shared");
    assert_eq!(
        fork.created, 2,
        "the summary and the new question are new nodes"
    );
    assert_eq!(
        fork.path.len(),
        3,
        "the request's own path, not the old history"
    );
    assert_eq!(fork.path[0], mark.path[0]);
    assert!(fork.path[1..].iter().all(|n| !mark.path.contains(n)));
    assert!(Arc::ptr_eq(&fork.entry, &mark.entry), "one session");

    let view = sessions.view("cc-session").await.unwrap().unwrap();
    assert_eq!(
        view.messages, compacted,
        "the history follows the newest request"
    );
    assert_eq!(view.message_count, 3, "the history's length");
    assert_eq!(view.branches.len(), 1, "nothing overwritten");
    let old = &view.branches[0];
    assert_eq!((old.diverges_at, old.length), (1, 5));
    assert_eq!(old.messages[0]["content"], "fix the bug");
    assert_eq!(old.messages[3]["content"], "fixed");

    // `/clear`: a fresh opening under the same id is one more branch, from the root.
    let cleared = vec![json!({"role":"user","content":"start over"})];
    let clear = sessions
        .record_request(&id, &cleared, &raw(&cleared))
        .await
        .unwrap();
    assert_eq!((clear.known, clear.created), (0, 1));
    // The compacted branch grows by appends again.
    let mut next = compacted.clone();
    next.push(json!({"role":"assistant","content":"added"}));
    next.push(json!({"role":"user","content":"thanks"}));
    let grown = sessions
        .record_request(&id, &next, &raw(&next))
        .await
        .unwrap();
    assert_eq!((grown.known, grown.created), (3, 2));
    assert_eq!(grown.path[..3], fork.path[..]);
    sessions.flush().await.unwrap();
    let stored = store.load("cc-session").await.unwrap().unwrap();
    assert_eq!(stored.nodes.len(), 10);
    let view = sessions.view("cc-session").await.unwrap().unwrap();
    assert_eq!(view.messages, next);
    assert_eq!(
        view.branches.len(),
        2,
        "the compacted-away history and the cleared one"
    );
}
