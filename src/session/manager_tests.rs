//! Session manager tests: rows applied out of order, cache weights, refused writes, deletes mid-turn.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::session::identity::IdSource;
use crate::session::tree::raw_message_hashes;
use crate::store::records::{RewriteRecord, SummaryRecord};
use crate::store::{MemoryStore, StoredSession};
use futures_util::future::BoxFuture;
use serde_json::json;

fn ident(id: &str) -> SessionIdentity {
    SessionIdentity {
        tenant: "t".into(),
        id: id.into(),
        source: IdSource::Header,
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
    let (len, head) = entry.with_tree(|t| (t.len(), t.head().map(|h| h.to_string())));
    assert_eq!(stored.nodes.len(), len);
    assert_eq!(stored.meta.message_count, len as u64);
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

    // The same message serialised differently: no node, but the prefix index grows.
    sessions
        .record_request(&ident("w"), &m, &[42])
        .await
        .unwrap();
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
    /// Refuses the first `refuse` batches as a full queue would, then behaves like memory.
    struct Refusing {
        inner: MemoryStore,
        refuse: Mutex<usize>,
    }
    impl Store for Refusing {
        fn backend(&self) -> &'static str {
            "memory"
        }
        fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
            let mut left = self.refuse.lock();
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
        fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
            self.inner.delete(id)
        }
        fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
            self.inner.purge_idle(before)
        }
    }
    let store = Arc::new(Refusing {
        inner: MemoryStore::new(),
        refuse: Mutex::new(2),
    });
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
