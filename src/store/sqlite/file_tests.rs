//! The database file under a running store: another file moved over it is left alone while writes are held, and
//! the database is written back once that file is moved aside.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::store::committed;
use std::time::Duration;

fn meta(id: &str) -> SessionMeta {
    SessionMeta {
        id: id.into(),
        tenant: "t".into(),
        dialect: "chat".into(),
        created_at: 1,
        last_active: 1,
        message_count: 1,
        token_estimate: 1,
        head: None,
        version: 1,
        strategy: None,
        idle_notified: None,
    }
}

fn node(id: &str) -> WriteOp {
    WriteOp::Node {
        session: "s".into(),
        node: NodeRow {
            id: Arc::from(id),
            parent: None,
            position: 0,
            message: Arc::new(serde_json::json!({"role": "user", "content": id})),
            kind: NodeKind::Client,
            partial: false,
            created_at: 1,
        },
    }
}

/// Waits (up to 10 s) until a ping answers as `ok` says; returns the answer.
async fn ping_until(s: &SqliteStore, ok: bool) -> Result<(), StoreError> {
    for _ in 0..100 {
        let r = s.ping().await;
        if r.is_ok() == ok {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the ping did not become {}",
        if ok { "ok" } else { "an error" }
    );
}

fn count(path: &Path, table: &str) -> i64 {
    let c = Connection::open(path).unwrap();
    c.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

#[tokio::test]
async fn a_file_moved_over_the_database_is_left_alone_and_writes_wait_until_it_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctx.db");
    let s = SqliteStore::open(&path).unwrap();
    committed(s.write(vec![
        WriteOp::Session {
            meta: meta("s"),
            create: true,
        },
        node("a"),
    ]))
    .await
    .unwrap();
    let other = dir.path().join("other.db");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE theirs (x); INSERT INTO theirs VALUES (1);")
        .unwrap();
    let theirs = std::fs::read(&other).unwrap();
    std::fs::rename(&other, &path).unwrap();

    let e = ping_until(&s, false).await.unwrap_err().to_string();
    assert!(
        e.contains("no longer the database") && e.contains(&path.display().to_string()),
        "{e}"
    );
    let mut held = s.write(vec![node("b")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        held.try_recv().is_err(),
        "not acknowledged while the file is another's"
    );
    assert!(s.load("s").await.is_err(), "reads say why");
    assert!(
        std::fs::read(&path).unwrap() == theirs,
        "the other file is left as it was"
    );
    // And opened, it is what it was: the store's write-ahead log, still named after the path, was emptied.
    assert_eq!(count(&path, "theirs"), 1);

    std::fs::rename(&path, dir.path().join("theirs.db")).unwrap();
    tokio::time::timeout(Duration::from_secs(10), committed(held))
        .await
        .expect("the held write is committed once the database is written back")
        .unwrap();
    ping_until(&s, true).await.unwrap();
    assert_eq!(s.load("s").await.unwrap().unwrap().nodes.len(), 2);
    // On disk at store.path: both nodes, the one written before and the one held.
    assert_eq!(count(&path, "nodes"), 2);
    assert!(std::fs::read(dir.path().join("theirs.db")).unwrap() == theirs);
}
