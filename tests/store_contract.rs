//! The store contract (see `ctxgate::store`), one suite run against every backend: memory, SQLite, Redis and a
//! 3-node Redis Cluster (the Redis runs skip without `redis-server`, unless `CTXGATE_REQUIRE_EXTERNAL=1`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::redis::{RedisCluster, RedisServer};
use ctxgate::config::{StoreBackend, StoreConfig};
use ctxgate::store::{
    committed, Compression, Cursor, Fresh, Lock, MemoryStore, NodeKind, NodeRow, Record,
    SessionMeta, SqliteStore, Store, WriteOp,
};
use serde_json::json;
use std::sync::Arc;

fn meta(id: &str, version: u64, last_active: i64, count: u64) -> SessionMeta {
    SessionMeta {
        id: id.into(),
        tenant: "tenant-a".into(),
        dialect: "chat".into(),
        created_at: 100,
        last_active,
        message_count: count,
        token_estimate: 10 * count,
        head: Some(format!("n{count}")),
        version,
        strategy: None,
        idle_notified: None,
    }
}

fn session(meta: SessionMeta, create: bool) -> WriteOp {
    WriteOp::Session { meta, create }
}

fn node(session: &str, i: u32, text: &str) -> WriteOp {
    WriteOp::Node {
        session: session.into(),
        node: NodeRow {
            id: Arc::from(format!("n{i}")),
            parent: (i > 1).then(|| Arc::from(format!("n{}", i - 1))),
            position: i - 1,
            kind: if i % 2 == 0 {
                NodeKind::Reply
            } else {
                NodeKind::Client
            },
            partial: false,
            created_at: 100 + i64::from(i),
            message: Arc::new(json!({"role": "user", "content": text})),
        },
    }
}

fn summary(text: &str) -> Record {
    Record::from(
        serde_json::from_value::<Compression>(
            json!({"kind":"summary","summary":text,"covers":{"upto":2,"upto_node":"n2"}}),
        )
        .unwrap(),
    )
}

fn record(session: &str, r: Record) -> WriteOp {
    WriteOp::Record {
        session: session.into(),
        created_at: 100,
        record: r,
    }
}

async fn write(store: &dyn Store, ops: Vec<WriteOp>) {
    committed(store.write(ops)).await.unwrap();
}

fn texts(nodes: &[NodeRow]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = nodes
        .iter()
        .map(|n| {
            (
                n.id.to_string(),
                n.message["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Rows, nodes (immutable), compression and internal records round-trip; a load is whole.
async fn round_trip(store: &dyn Store) {
    write(
        store,
        vec![
            session(meta("s1", 1, 200, 2), true),
            node("s1", 1, "hello"),
            node("s1", 2, "world"),
            record("s1", summary("S")),
            record("s1", Record::Internal(json!({"by":"ctxgate","round":1}))),
        ],
    )
    .await;
    // A node id already stored is never written again.
    write(store, vec![node("s1", 2, "changed"), node("s1", 3, "more")]).await;
    let s = store.load("s1").await.unwrap().unwrap();
    assert_eq!(s.meta.id, "s1");
    assert_eq!(s.meta.tenant, "tenant-a");
    assert_eq!(s.meta.dialect, "chat");
    assert_eq!((s.meta.created_at, s.meta.last_active), (100, 200));
    assert_eq!(s.meta.head.as_deref(), Some("n2"));
    assert_eq!(s.meta.version, 1);
    assert_eq!(
        texts(&s.nodes),
        [("n1", "hello"), ("n2", "world"), ("n3", "more")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let n2 = s.nodes.iter().find(|n| &*n.id == "n2").unwrap();
    assert_eq!(n2.parent.as_deref(), Some("n1"));
    assert_eq!(
        (n2.position, n2.kind, n2.created_at),
        (1, NodeKind::Reply, 102)
    );
    assert_eq!(s.compressions.len(), 1);
    assert!(matches!(&s.compressions[0], Compression::Summary(x) if x.summary == "S"));
    assert_eq!(s.internal, [json!({"by":"ctxgate","round":1})]);
    assert!(store.load("nope").await.unwrap().is_none());
}

/// Writes for a session that does not exist store nothing; only `create` makes a row.
async fn missing_sessions_are_no_ops(store: &dyn Store) {
    write(
        store,
        vec![
            session(meta("ghost", 5, 300, 1), false),
            node("ghost", 1, "x"),
            record("ghost", summary("lost")),
        ],
    )
    .await;
    assert!(store.load("ghost").await.unwrap().is_none());
    write(store, vec![session(meta("ghost", 1, 300, 0), true)]).await;
    let s = store.load("ghost").await.unwrap().unwrap();
    assert!(s.nodes.is_empty() && s.compressions.is_empty());
}

/// A row is only replaced by a higher version, whatever order the batches come in.
async fn rows_never_go_backwards(store: &dyn Store) {
    write(store, vec![session(meta("v", 1, 100, 1), true)]).await;
    let rxs: Vec<_> = [3u64, 2, 5, 4]
        .iter()
        .map(|v| store.write(vec![session(meta("v", *v, 100 + *v as i64, *v), false)]))
        .collect();
    for rx in rxs {
        committed(rx).await.unwrap();
    }
    // A re-create of an existing row with an older version changes nothing either.
    write(store, vec![session(meta("v", 2, 999, 2), true)]).await;
    let m = store.load("v").await.unwrap().unwrap().meta;
    assert_eq!((m.version, m.last_active, m.message_count), (5, 105, 5));
}

/// Batches of a session apply in order; a barrier resolves after everything queued before it.
async fn order_and_barriers(store: &dyn Store) {
    write(store, vec![session(meta("o", 1, 100, 0), true)]).await;
    let mut rxs = Vec::new();
    for i in 1..=50u32 {
        rxs.push(store.write(vec![
            node("o", i, &format!("m{i}")),
            session(
                meta("o", u64::from(i) + 1, 100 + i64::from(i), u64::from(i)),
                false,
            ),
        ]));
    }
    committed(store.write(Vec::new())).await.unwrap();
    let s = store.load("o").await.unwrap().unwrap();
    assert_eq!(
        s.nodes.len(),
        50,
        "the barrier resolved before every batch was committed"
    );
    assert_eq!(s.meta.version, 51);
    assert_eq!(s.meta.head.as_deref(), Some("n50"));
    for rx in rxs {
        committed(rx).await.unwrap();
    }
}

/// Listing by newest activity with a total; deleting; purging idle sessions.
async fn list_delete_purge(store: &dyn Store) {
    for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
        write(
            store,
            vec![
                session(meta(id, 1, 1000 + i as i64 * 10, 1), true),
                node(id, 1, "x"),
            ],
        )
        .await;
    }
    let (page, total) = store.list(2, 0).await.unwrap();
    assert_eq!(total, 4);
    assert_eq!(
        page.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        ["d", "c"]
    );
    let (page, _) = store.list(10, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        ["b", "a"]
    );
    assert!(store.delete("c").await.unwrap());
    assert!(!store.delete("c").await.unwrap());
    assert!(store.load("c").await.unwrap().is_none());
    // Writes after the delete are no-ops.
    write(
        store,
        vec![node("c", 2, "late"), session(meta("c", 9, 2000, 2), false)],
    )
    .await;
    assert!(store.load("c").await.unwrap().is_none());
    // "a" (1000) and "b" (1010) are idle before 1015; "d" (1030) is not.
    assert_eq!(store.purge_idle(1015).await.unwrap(), 2);
    let (page, total) = store.list(10, 0).await.unwrap();
    assert_eq!(total, 1);
    assert_eq!(page[0].id, "d");
    assert!(store.load("a").await.unwrap().is_none());
    assert!(store.load("d").await.unwrap().is_some());
}

/// A shared store answers what was appended since a cursor, fetching only the nodes the caller lacks; one that is
/// not shared answers `Local`.
async fn tails(store: &dyn Store) {
    write(
        store,
        vec![
            session(meta("t", 1, 100, 2), true),
            node("t", 1, "a"),
            node("t", 2, "b"),
        ],
    )
    .await;
    let loaded = store.load("t").await.unwrap().unwrap();
    let seen = Cursor::of(&loaded);
    write(
        store,
        vec![
            node("t", 3, "c"),
            node("t", 4, "d"),
            record("t", summary("T")),
            session(meta("t", 2, 150, 4), false),
        ],
    )
    .await;
    let have = Box::new(|id: &str| id == "n3");
    match store.tail("t", seen, have).await.unwrap() {
        Fresh::Local => assert!(!store.shared(), "{} is shared", store.backend()),
        Fresh::Gone => panic!("the session is there"),
        Fresh::Tail(t) => {
            assert!(store.shared());
            assert_eq!(texts(&t.nodes), [("n4".to_string(), "d".to_string())]);
            assert_eq!(t.records, [summary("T")]);
            assert_eq!(
                t.cursor,
                Cursor {
                    nodes: 4,
                    records: 1
                }
            );
            assert_eq!((t.meta.version, t.meta.head.as_deref()), (2, Some("n4")));
            match store
                .tail("t", t.cursor, Box::new(|_| false))
                .await
                .unwrap()
            {
                Fresh::Tail(t2) => assert!(t2.nodes.is_empty() && t2.records.is_empty()),
                _ => panic!("expected an empty tail"),
            }
            assert!(store.delete("t").await.unwrap());
            assert!(matches!(
                store
                    .tail("t", t.cursor, Box::new(|_| false))
                    .await
                    .unwrap(),
                Fresh::Gone
            ));
        }
    }
    store.ping().await.unwrap();
}

/// Locks with expiry and fencing tokens on a shared store; `Local` on one that is not.
async fn locks(store: &dyn Store) {
    let first = store.lock("l", "summary", 60_000).await.unwrap();
    if !store.shared() {
        assert_eq!(first, Lock::Local);
        return;
    }
    let Lock::Acquired(t1) = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        store.lock("l", "summary", 60_000).await.unwrap(),
        Lock::HeldElsewhere
    );
    assert!(store.is_locked("l", "summary").await.unwrap());
    // Another session's lock, another lock name: independent.
    assert!(matches!(
        store.lock("m", "summary", 60_000).await.unwrap(),
        Lock::Acquired(_)
    ));
    // Only the holder's token releases it.
    store.unlock("l", "summary", t1 + 100).await.unwrap();
    assert!(store.is_locked("l", "summary").await.unwrap());
    store.unlock("l", "summary", t1).await.unwrap();
    assert!(!store.is_locked("l", "summary").await.unwrap());
    let Lock::Acquired(t2) = store.lock("l", "summary", 50).await.unwrap() else {
        panic!("free again")
    };
    assert!(t2 > t1, "fencing tokens grow");
    // It expires by itself.
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    assert!(!store.is_locked("l", "summary").await.unwrap());
    // A holder whose lock expired cannot release the next holder's.
    let Lock::Acquired(t3) = store.lock("l", "summary", 60_000).await.unwrap() else {
        panic!("expired")
    };
    store.unlock("l", "summary", t2).await.unwrap();
    assert!(store.is_locked("l", "summary").await.unwrap());
    assert!(t3 > t2);
}

fn turn(session: &str, text: &str) -> WriteOp {
    WriteOp::Turn {
        session: session.into(),
        turn: json!({"head": text}).to_string(),
    }
}

/// Turn records: appended in order, paged, never loaded with the session, gone with it.
async fn turns_kept_apart(store: &dyn Store) {
    write(
        store,
        vec![
            session(meta("t", 1, 100, 1), true),
            node("t", 1, "hi"),
            turn("t", "a"),
        ],
    )
    .await;
    write(
        store,
        vec![turn("t", "b"), turn("t", "c"), turn("nope", "x")],
    )
    .await;
    let (page, total) = store.turns("t", 0, 10).await.unwrap();
    let heads: Vec<String> = page
        .iter()
        .map(|t| {
            serde_json::from_str::<serde_json::Value>(t).unwrap()["head"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        (heads, total),
        (vec!["a".into(), "b".into(), "c".into()], 3)
    );
    let (page, total) = store.turns("t", 1, 1).await.unwrap();
    assert_eq!((page.len(), total), (1, 3));
    assert!(page[0].contains("\"b\""));
    assert_eq!(store.turns("t", 5, 10).await.unwrap(), (vec![], 3));
    assert_eq!(
        store.turns("nope", 0, 10).await.unwrap(),
        (vec![], 0),
        "no session, no turn"
    );
    let loaded = store.load("t").await.unwrap().unwrap();
    assert!(loaded.compressions.is_empty() && loaded.internal.is_empty());
    assert_eq!(loaded.nodes.len(), 1);
    assert!(store.delete("t").await.unwrap());
    assert_eq!(
        store.turns("t", 0, 10).await.unwrap(),
        (vec![], 0),
        "deleted with the session"
    );
    write(
        store,
        vec![session(meta("old", 1, 10, 0), true), turn("old", "z")],
    )
    .await;
    assert_eq!(store.turns("old", 0, 10).await.unwrap().1, 1);
    store.purge_idle(50).await.unwrap();
    assert_eq!(
        store.turns("old", 0, 10).await.unwrap().1,
        0,
        "purged with the session"
    );
}

/// A session's strategy pin goes with its row: set, kept by newer rows that carry it, cleared by one without it.
async fn strategy_pins(store: &dyn Store) {
    write(store, vec![session(meta("p", 1, 100, 0), true)]).await;
    let pinned = SessionMeta {
        strategy: Some("off".into()),
        ..meta("p", 2, 101, 0)
    };
    write(store, vec![session(pinned.clone(), false)]).await;
    assert_eq!(
        store
            .load("p")
            .await
            .unwrap()
            .unwrap()
            .meta
            .strategy
            .as_deref(),
        Some("off")
    );
    assert_eq!(
        store.list(10, 0).await.unwrap().0[0].strategy.as_deref(),
        Some("off")
    );
    let stale = SessionMeta {
        strategy: None,
        ..meta("p", 1, 102, 0)
    };
    write(store, vec![session(stale, false)]).await;
    assert_eq!(
        store
            .load("p")
            .await
            .unwrap()
            .unwrap()
            .meta
            .strategy
            .as_deref(),
        Some("off"),
        "an older row does not clear it"
    );
    write(store, vec![session(meta("p", 3, 103, 0), false)]).await;
    assert_eq!(store.load("p").await.unwrap().unwrap().meta.strategy, None);
}

/// Any id keeps the contract, even one a Redis Cluster hash tag could not hold as it is (`}` first: the tag would
/// be empty and the session's keys spread over several slots).
async fn odd_ids(store: &dyn Store) {
    let ids = ["}x", "}", "a}b", "{", "x{}y", "}{"];
    for id in ids {
        write(
            store,
            vec![
                session(meta(id, 1, 100, 1), true),
                node(id, 1, "hi"),
                record(id, summary("S")),
                turn(id, "a"),
            ],
        )
        .await;
        let s = store.load(id).await.unwrap().unwrap();
        assert_eq!((s.meta.id.as_str(), s.nodes.len()), (id, 1), "{id:?}");
        assert_eq!(s.compressions.len(), 1, "{id:?}");
        assert_eq!(store.turns(id, 0, 10).await.unwrap().1, 1, "{id:?}");
        if let Lock::Acquired(t) = store.lock(id, "summary", 60_000).await.unwrap() {
            store.unlock(id, "summary", t).await.unwrap();
        }
    }
    let (listed, _) = store.list(100, 0).await.unwrap();
    let mut listed: Vec<String> = listed.into_iter().map(|m| m.id).collect();
    listed.sort();
    let mut want = ids.map(String::from).to_vec();
    want.sort();
    assert_eq!(listed, want);
    for id in ids {
        assert!(store.delete(id).await.unwrap(), "{id:?}");
        assert!(store.load(id).await.unwrap().is_none(), "{id:?}");
    }
}

async fn contract(make: impl Fn() -> Arc<dyn Store>) {
    odd_ids(&*make()).await;
    strategy_pins(&*make()).await;
    turns_kept_apart(&*make()).await;
    round_trip(&*make()).await;
    missing_sessions_are_no_ops(&*make()).await;
    rows_never_go_backwards(&*make()).await;
    order_and_barriers(&*make()).await;
    list_delete_purge(&*make()).await;
    tails(&*make()).await;
    locks(&*make()).await;
}

#[tokio::test]
async fn memory_keeps_the_contract() {
    contract(|| Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn sqlite_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    contract(|| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(SqliteStore::open(&dir.path().join(format!("s{i}.db"))).unwrap())
    })
    .await;
}

/// A Redis store config; each store of a suite gets its own prefix (a fresh keyspace on the same server).
fn redis_config(url: Option<String>, nodes: Vec<String>, prefix: String) -> StoreConfig {
    let mut c = StoreConfig {
        backend: StoreBackend::Redis,
        redis_cluster_nodes: nodes,
        redis_prefix: prefix,
        ..StoreConfig::default()
    };
    if let Some(u) = url {
        c.redis_url = u;
    }
    c
}

#[tokio::test]
async fn redis_keeps_the_contract() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let n = std::sync::atomic::AtomicUsize::new(0);
    contract(|| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cfg = redis_config(Some(server.url()), Vec::new(), format!("t{i}:"));
        ctxgate::store::open(&cfg).unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_keeps_the_contract() {
    let Some(cluster) = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
    else {
        return;
    };
    let n = std::sync::atomic::AtomicUsize::new(0);
    contract(|| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cfg = redis_config(None, cluster.urls(), format!("c{i}:"));
        ctxgate::store::open(&cfg).unwrap()
    })
    .await;
    drop(cluster);
}

/// Redis away: a queued batch is kept and retried until Redis is back (the session's later batches wait behind
/// it, a barrier waits for it, other callers see the failure only as waiting), then everything is there in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_writes_queued_while_it_is_down_are_retried_until_it_is_back() {
    let Some(mut server) = RedisServer::start_persistent() else {
        return;
    };
    let mut cfg = redis_config(Some(server.url()), Vec::new(), "r:".into());
    cfg.timeout_ms = 200;
    let store = ctxgate::store::open(&cfg).unwrap();
    write(
        &*store,
        vec![session(meta("w", 1, 100, 1), true), node("w", 1, "before")],
    )
    .await;
    server.stop();
    let first = store.write(vec![
        node("w", 2, "during"),
        session(meta("w", 2, 200, 2), false),
    ]);
    let second = store.write(vec![
        node("w", 3, "after"),
        session(meta("w", 3, 300, 3), false),
    ]);
    let mut barrier = store.write(Vec::new());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        barrier.try_recv().is_err(),
        "the barrier waits for the retried batches"
    );
    assert!(store.ping().await.is_err());
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    committed(first).await.unwrap();
    committed(second).await.unwrap();
    committed(barrier).await.unwrap();
    let s = store.load("w").await.unwrap().unwrap();
    assert_eq!(
        texts(&s.nodes),
        [("n1", "before"), ("n2", "during"), ("n3", "after")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(s.meta.version, 3);
    drop(server);
}
