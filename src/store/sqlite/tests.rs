//! SQLite backend tests: reopen, group commits with failing and vanished-session batches, monotonic rows,
//! retries, the queue bound and the schema migration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::worker::{Batch, Worker};
use super::*;
use crate::store::records::{Covers, SummaryRecord};
use crate::store::{committed, Compression};
use serde_json::json;

fn node(id: &str, parent: Option<&str>, pos: u32) -> NodeRow {
    NodeRow {
        id: Arc::from(id),
        parent: parent.map(Arc::from),
        position: pos,
        message: Arc::new(json!({"role":"user","content":id})),
        kind: NodeKind::Client,
        partial: false,
        created_at: 1,
    }
}

fn summary() -> Compression {
    Compression::Summary(SummaryRecord {
        summary: "the story so far".into(),
        covers: Covers {
            from: 0,
            upto: 1,
            upto_node: "a".into(),
        },
        ..SummaryRecord::default()
    })
}

fn meta(id: &str, last: i64) -> SessionMeta {
    SessionMeta {
        id: id.into(),
        tenant: "t".into(),
        dialect: "anthropic".into(),
        created_at: 1,
        last_active: last,
        message_count: 2,
        token_estimate: 3,
        head: Some("b".into()),
        version: 1,
        strategy: None,
        idle_notified: None,
    }
}

fn create(m: SessionMeta) -> WriteOp {
    WriteOp::Session {
        meta: m,
        create: true,
    }
}

fn add(session: &str, n: NodeRow) -> WriteOp {
    WriteOp::Node {
        session: session.into(),
        node: n,
    }
}

#[tokio::test]
async fn write_reopen_list_delete_purge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/ctx.db");
    {
        let s = SqliteStore::open(&path).unwrap();
        let ops = vec![
            create(meta("s1", 10)),
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
                session: "s1".into(),
                created_at: 5,
                record: Record::from(summary()),
            },
            WriteOp::Record {
                session: "s1".into(),
                created_at: 6,
                record: Record::Internal(json!({"y":2})),
            },
            create(meta("s2", 20)),
        ];
        committed(s.write(ops)).await.unwrap();
    }
    let s = SqliteStore::open(&path).unwrap();
    let loaded = s.load("s1").await.unwrap().unwrap();
    assert_eq!(loaded.nodes.len(), 2);
    assert_eq!(loaded.meta.head.as_deref(), Some("b"));
    assert_eq!(loaded.compressions, vec![summary()]);
    assert_eq!(loaded.internal, vec![json!({"y":2})]);
    let (page, total) = s.list(10, 0).await.unwrap();
    assert_eq!(total, 2);
    assert_eq!(page[0].id, "s2");
    assert!(s.delete("s2").await.unwrap());
    assert!(!s.delete("s2").await.unwrap());
    assert_eq!(s.purge_idle(11).await.unwrap(), 1);
    assert!(s.load("s1").await.unwrap().is_none());
}

fn conn() -> Connection {
    let c = Connection::open_in_memory().unwrap();
    c.execute_batch(SCHEMA).unwrap();
    c
}

fn count(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn a_write_for_a_vanished_session_does_not_fail_the_group() {
    let (tx_a, mut rx_a) = oneshot::channel();
    let (tx_b, mut rx_b) = oneshot::channel();
    let (tx_c, mut rx_c) = oneshot::channel();
    let mut w = Worker::new(conn(), StoreMetrics::default());
    w.commit_group(vec![
        Batch {
            ops: vec![create(meta("live", 1)), add("live", node("a", None, 0))],
            reply: tx_a,
        },
        // Deleted mid-turn: its reply and row update must be no-ops, not a failed group.
        Batch {
            ops: vec![
                add("gone", node("r", None, 0)),
                WriteOp::Record {
                    session: "gone".into(),
                    created_at: 1,
                    record: Record::Internal(json!({})),
                },
                WriteOp::Turn {
                    session: "gone".into(),
                    turn: "{}".into(),
                },
                WriteOp::Session {
                    meta: meta("gone", 2),
                    create: false,
                },
            ],
            reply: tx_b,
        },
        Batch {
            ops: vec![add("live", node("b", Some("a"), 1))],
            reply: tx_c,
        },
    ]);
    assert!(matches!(rx_a.try_recv(), Ok(Ok(()))));
    assert!(matches!(rx_b.try_recv(), Ok(Ok(()))));
    assert!(matches!(rx_c.try_recv(), Ok(Ok(()))));
    assert_eq!(
        count(
            &w.conn,
            "SELECT COUNT(*) FROM nodes WHERE session_id = 'live'"
        ),
        2
    );
    assert_eq!(
        count(&w.conn, "SELECT COUNT(*) FROM sessions WHERE id = 'gone'"),
        0
    );
    assert_eq!(
        count(
            &w.conn,
            "SELECT COUNT(*) FROM nodes WHERE session_id = 'gone'"
        ),
        0
    );
    assert_eq!(count(&w.conn, "SELECT COUNT(*) FROM records"), 0);
    assert_eq!(count(&w.conn, "SELECT COUNT(*) FROM turns"), 0);
}

#[test]
fn turns_and_records_are_numbered_per_session_in_order() {
    let turn = |s: &str, t: &str| WriteOp::Turn {
        session: s.into(),
        turn: t.into(),
    };
    let record = |s: &str, at: i64| WriteOp::Record {
        session: s.into(),
        created_at: at,
        record: Record::Internal(json!({ "at": at })),
    };
    let mut w = Worker::new(conn(), StoreMetrics::default());
    let mut group = |batches: Vec<Vec<WriteOp>>| {
        let mut replies = Vec::new();
        let batches = batches
            .into_iter()
            .map(|ops| {
                let (reply, rx) = oneshot::channel();
                replies.push(rx);
                Batch { ops, reply }
            })
            .collect();
        w.commit_group(batches);
        for mut rx in replies {
            assert!(matches!(rx.try_recv(), Ok(Ok(()))));
        }
    };
    group(vec![
        vec![create(meta("a", 1)), turn("a", "a1"), record("a", 1)],
        vec![create(meta("b", 1)), turn("b", "b1"), turn("b", "b2")],
    ]);
    group(vec![
        vec![turn("a", "a2"), record("a", 2), record("a", 3)],
        vec![turn("b", "b3")],
        vec![turn("a", "a3")],
    ]);
    let rows = |sql: &str| -> Vec<(String, i64, String)> {
        let mut st = w.conn.prepare(sql).unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let own = |v: &[(&str, i64, &str)]| -> Vec<(String, i64, String)> {
        v.iter()
            .map(|(s, n, t)| (s.to_string(), *n, t.to_string()))
            .collect()
    };
    assert_eq!(
        rows("SELECT session_id, seq, turn FROM turns ORDER BY session_id, seq"),
        own(&[
            ("a", 1, "a1"),
            ("a", 2, "a2"),
            ("a", 3, "a3"),
            ("b", 1, "b1"),
            ("b", 2, "b2"),
            ("b", 3, "b3"),
        ])
    );
    assert_eq!(
        rows("SELECT session_id, seq, CAST(created_at AS TEXT) FROM records ORDER BY session_id, seq"),
        own(&[("a", 1, "1"), ("a", 2, "2"), ("a", 3, "3")])
    );
}

#[test]
fn a_failing_batch_fails_only_its_caller() {
    let mut w = Worker::new(conn(), StoreMetrics::default());
    // A batch that can never apply: a trigger refuses its node.
    w.conn
        .execute_batch("CREATE TRIGGER refuse BEFORE INSERT ON nodes WHEN NEW.node_id = 'bad' BEGIN SELECT RAISE(ABORT, 'refused'); END;")
        .unwrap();
    let (tx_a, mut rx_a) = oneshot::channel();
    let (tx_b, mut rx_b) = oneshot::channel();
    w.commit_group(vec![
        Batch {
            ops: vec![create(meta("s", 1)), add("s", node("bad", None, 0))],
            reply: tx_a,
        },
        Batch {
            ops: vec![create(meta("t", 1)), add("t", node("ok", None, 0))],
            reply: tx_b,
        },
    ]);
    assert!(matches!(
        rx_a.try_recv(),
        Ok(Err(StoreError::Backend { .. }))
    ));
    assert!(matches!(rx_b.try_recv(), Ok(Ok(()))));
    // The failed batch left nothing behind, not even its row.
    assert_eq!(
        count(&w.conn, "SELECT COUNT(*) FROM sessions WHERE id = 's'"),
        0
    );
    assert_eq!(
        count(&w.conn, "SELECT COUNT(*) FROM nodes WHERE session_id = 't'"),
        1
    );
}

#[test]
fn session_rows_never_go_backwards() {
    let mut w = Worker::new(conn(), StoreMetrics::default());
    let row = |v: u64, count: u64, head: &str| SessionMeta {
        version: v,
        message_count: count,
        head: Some(head.into()),
        ..meta("s", 1)
    };
    let (tx, _rx) = oneshot::channel();
    w.commit_group(vec![Batch {
        ops: vec![
            create(row(1, 1, "a")),
            WriteOp::Session {
                meta: row(3, 3, "c"),
                create: false,
            },
            // Built before the one above, applied after it: ignored.
            WriteOp::Session {
                meta: row(2, 2, "b"),
                create: false,
            },
            create(row(2, 2, "b")),
        ],
        reply: tx,
    }]);
    let stored = load(&w.conn, "s").unwrap().unwrap().meta;
    assert_eq!((stored.version, stored.message_count), (3, 3));
    assert_eq!(stored.head.as_deref(), Some("c"));
}

#[tokio::test]
async fn a_transient_failure_is_retried_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&dir.path().join("ctx.db")).unwrap();
    committed(s.write(vec![create(meta("s", 1)), add("s", node("a", None, 0))]))
        .await
        .unwrap();
    s.set_query_only(true).await.unwrap();
    let mut rx = s.write(vec![add("s", node("b", Some("a"), 1))]);
    let flushed = s.write(Vec::new());
    // Loads run after the writes queued before them: the write was tried, failed, and is kept.
    assert_eq!(s.load("s").await.unwrap().unwrap().nodes.len(), 1);
    assert!(
        rx.try_recv().is_err(),
        "not answered while it cannot commit"
    );
    s.set_query_only(false).await.unwrap();
    committed(rx).await.unwrap();
    committed(flushed).await.unwrap();
    assert_eq!(s.load("s").await.unwrap().unwrap().nodes.len(), 2);
}

#[tokio::test]
async fn a_full_queue_refuses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctx.db");
    let s = SqliteStore::open_with(&path, 1, StoreMetrics::default()).unwrap();
    committed(s.write(vec![create(meta("s", 1))]))
        .await
        .unwrap();
    // Another connection holds the write lock: the worker blocks on the first group it takes, so the queue
    // (capacity 1) fills up however many writes the worker took into that group before blocking.
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut accepted = Vec::new();
    let mut n = 0;
    let mut write = |accepted: &mut Vec<_>| {
        n += 1;
        let mut rx = s.write(vec![add("s", node(&format!("n{n}"), None, 0))]);
        match rx.try_recv() {
            Ok(Err(StoreError::QueueFull)) => true,
            _ => {
                accepted.push(rx);
                false
            }
        }
    };
    // The worker may still be taking queued writes into its group before it blocks on the lock; once it is
    // blocked, the queue stays full and every write is refused at once.
    let mut refused_in_a_row = 0;
    for _ in 0..200 {
        // Bounded: an unbounded queue never refuses, and the test fails instead of looping.
        if !(0..10_000).any(|_| write(&mut accepted)) {
            break;
        }
        refused_in_a_row = (0..5).take_while(|_| write(&mut accepted)).count();
        if refused_in_a_row == 5 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        refused_in_a_row, 5,
        "a blocked store's full queue refuses at once"
    );
    assert!(
        accepted.len() <= 2 * (super::worker::GROUP + 1),
        "writes are accepted only while the worker takes them: {} accepted",
        accepted.len()
    );
    other.execute_batch("COMMIT").unwrap();
    for rx in accepted {
        committed(rx).await.unwrap();
    }
}

#[test]
fn old_databases_get_the_version_column() {
    let c = Connection::open_in_memory().unwrap();
    c.execute_batch(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at INTEGER NOT NULL,
         last_active INTEGER NOT NULL, message_count INTEGER NOT NULL, token_estimate INTEGER NOT NULL, head TEXT);
         INSERT INTO sessions VALUES ('s', 't', 1, 1, 2, 3, 'b');",
    )
    .unwrap();
    c.execute_batch(SCHEMA).unwrap();
    migrate(&c).unwrap();
    migrate(&c).unwrap();
    let m = load(&c, "s").unwrap().unwrap().meta;
    assert_eq!(
        (m.version, m.dialect.as_str()),
        (0, "chat"),
        "old rows are chat sessions"
    );
}

/// Records written before compression records were typed: a rewrite had no `kind` (and, before summaries, four
/// cuts and no `summary_upto`); fields this version does not know are kept.
#[tokio::test]
async fn records_in_the_old_shape_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let old_rewrite = json!({"strategy": "hybrid", "stages": ["cleared"], "messages_before": 18,
        "messages_after": 18, "tokens_before": 13817, "tokens_after": 6432, "context_window": 16000,
        "cleared_results": 5, "pruned_loops": 0, "dropped_loops": 0, "dropped_messages": 0,
        "pruned_call_ids": ["toolu_01"], "cuts": [12, 0, 0, 0], "at": 7, "model": "m",
        "recall_offered": true, "from_the_future": {"a": 1}});
    let old_summary = json!({"kind": "summary", "at": 8, "strategy": "summarize", "summary": "S",
        "covers": {"from": 0, "upto": 2, "upto_node": "b"}, "incremental_from": null, "messages_before": 2,
        "messages_after": 1, "tokens_before": 40, "tokens_after": 9, "model": "sm", "latency_ms": 12,
        "precomputed": false});
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c.execute(
            "INSERT INTO sessions (id, tenant, created_at, last_active, message_count, token_estimate, head, version) VALUES ('s', 't', 1, 1, 0, 0, NULL, 1)",
            [],
        )
        .unwrap();
        for (seq, kind, record) in [
            (1, "compression", old_rewrite.to_string()),
            (2, "compression", old_summary.to_string()),
            (3, "compression", "not json".to_string()),
            (4, "compression", json!({"kind": "unheard_of"}).to_string()),
            (5, "internal", json!({"by": "ctxgate"}).to_string()),
        ] {
            c.execute(
                "INSERT INTO records VALUES ('s', ?1, ?2, 1, ?3)",
                params![seq, kind, record],
            )
            .unwrap();
        }
    }
    let s = SqliteStore::open(&path).unwrap();
    let loaded = s.load("s").await.unwrap().unwrap();
    assert_eq!(
        loaded.compressions.len(),
        2,
        "unreadable records are skipped"
    );
    let Compression::Rewrite(r) = &loaded.compressions[0] else {
        panic!(
            "a record without kind is a rewrite: {:?}",
            loaded.compressions[0]
        );
    };
    assert_eq!(r.cuts, [12, 0, 0, 0]);
    assert_eq!(
        (r.summary_upto, r.tokens_after, r.recall_offered),
        (0, 6432, true)
    );
    assert_eq!(r.extra["from_the_future"], json!({"a": 1}));
    let Compression::Summary(sm) = &loaded.compressions[1] else {
        panic!("a summary: {:?}", loaded.compressions[1]);
    };
    assert_eq!(
        (sm.summary.as_str(), sm.covers.upto_node.as_str()),
        ("S", "b")
    );
    assert_eq!(loaded.internal, vec![json!({"by": "ctxgate"})]);
    // Shown (and written back) with the same fields, the rewrite now tagged.
    let mut shown = serde_json::to_value(&loaded.compressions[0]).unwrap();
    assert_eq!(shown["kind"], "rewrite");
    assert_eq!(shown["summary_upto"], 0);
    let o = shown.as_object_mut().unwrap();
    o.remove("kind");
    o.remove("summary_upto");
    assert_eq!(shown, old_rewrite);
    assert_eq!(
        serde_json::to_value(&loaded.compressions[1]).unwrap(),
        old_summary
    );
}

#[test]
fn batches_queued_together_share_one_commit() {
    let resolver: crate::metrics::ModelResolver = Box::new(|_: &str| None);
    let metrics = crate::metrics::Metrics::new(resolver).unwrap();
    let worker = Worker::new(
        conn(),
        metrics.store_metrics(crate::metrics::StoreBackend::Sqlite),
    );
    let (tx, rx) = mpsc::sync_channel(64);
    let mut replies = Vec::new();
    for i in 0..20 {
        let (reply, done) = oneshot::channel();
        let id = format!("s{i}");
        let ops = vec![create(meta(&id, 1)), add(&id, node("a", None, 0))];
        tx.send(Cmd::Write(ops, reply)).unwrap();
        replies.push(done);
    }
    drop(tx);
    // Every batch was queued before the worker started: one transaction takes them all.
    worker.run(rx);
    for mut r in replies {
        assert!(matches!(r.try_recv(), Ok(Ok(()))));
    }
    let commits = metrics
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "ctxgate_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"write\"} ",
            )
            .map(str::to_owned)
        })
        .unwrap();
    assert_eq!(commits, "1");
}
