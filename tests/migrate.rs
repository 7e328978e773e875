//! `ctxgate sessions migrate`: SQLite → Redis and back, every session with its history, records and tenant secret
//! (the moved sessions still belong to their callers), verified by counts. Needs `redis-server` (skips without it,
//! unless `CTXGATE_REQUIRE_EXTERNAL=1`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::redis::RedisServer;
use common::{session_header, test_config, Harness};
use ctxgate::config::{Config, StoreBackend};
use ctxgate::mock::{MockReply, MockUpstream};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

async fn turn(h: &Harness, sid: &str, messages: &Value) -> String {
    let r = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-mig")
        .header("x-session-id", sid)
        .json(&json!({"model":"gpt-4o","messages":messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    session_header(&r)
}

async fn contents(h: &Harness, sid: &str) -> Vec<String> {
    let v: Value = h
        .client
        .get(h.url(&format!("/admin/sessions/{sid}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["messages"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect()
}

fn migrate(config: &Path, from: &str, to: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["sessions", "migrate", "--config"])
        .arg(config)
        .args(["--from", from, "--to", to])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "migrate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sqlite_config(mock: &MockUpstream, db: &Path) -> Config {
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = db.to_path_buf();
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_move_from_sqlite_to_redis_and_back() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("a").join("ctx.db");
    let mock = MockUpstream::start().await.unwrap();
    // Three sessions on SQLite, two turns each.
    let mut h = Harness::start_config(mock.clone(), sqlite_config(&mock, &db)).await;
    let mut sids = Vec::new();
    for s in 0..3 {
        let mut history = vec![json!({"role":"user","content":format!("s{s} q1")})];
        mock.push(MockReply::completion(&format!("s{s} a1")));
        turn(&h, &format!("conv-{s}"), &Value::Array(history.clone())).await;
        history.push(json!({"role":"assistant","content":format!("s{s} a1")}));
        history.push(json!({"role":"user","content":format!("s{s} q2")}));
        mock.push(MockReply::completion(&format!("s{s} a2")));
        sids.push(turn(&h, &format!("conv-{s}"), &Value::Array(history)).await);
    }
    h.stop().await;
    drop(h);

    // The config names the Redis prefix; the stores come from the command line.
    let config = dir.path().join("ctxgate.toml");
    std::fs::write(&config, "[store]\nredis_prefix = \"moved:\"\n").unwrap();
    let out = migrate(&config, &format!("sqlite:{}", db.display()), &redis.url());
    assert_eq!(
        out.trim(),
        "migrated 3 session(s): 12 message(s), 0 record(s), 6 turn(s); verified"
    );

    // On Redis: the same sessions, and the same callers still reach them (the tenant secret came along).
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Redis;
    cfg.store.redis_url = redis.url();
    cfg.store.redis_prefix = "moved:".into();
    let h = Harness::start_config(mock.clone(), cfg).await;
    assert_eq!(h.state.sessions.list(10, 0).await.unwrap().1, 3);
    assert_eq!(
        contents(&h, &sids[1]).await,
        ["s1 q1", "s1 a1", "s1 q2", "s1 a2"]
    );
    let history = json!([
        {"role":"user","content":"s1 q1"}, {"role":"assistant","content":"s1 a1"},
        {"role":"user","content":"s1 q2"}, {"role":"assistant","content":"s1 a2"},
        {"role":"user","content":"s1 q3"}]);
    mock.push(MockReply::completion("s1 a3"));
    assert_eq!(
        turn(&h, "conv-1", &history).await,
        sids[1],
        "the same session"
    );
    h.state.drain().await;
    assert_eq!(contents(&h, &sids[1]).await.len(), 6);
    drop(h);

    // And back, into a new SQLite database: everything, including the turn made on Redis.
    let back = dir.path().join("b").join("ctx.db");
    let out = migrate(&config, &redis.url(), &format!("sqlite:{}", back.display()));
    assert_eq!(
        out.trim(),
        "migrated 3 session(s): 14 message(s), 0 record(s), 7 turn(s); verified"
    );
    let h = Harness::start_config(mock.clone(), sqlite_config(&mock, &back)).await;
    assert_eq!(contents(&h, &sids[1]).await.len(), 6);
    assert_eq!(
        contents(&h, &sids[2]).await,
        ["s2 q1", "s2 a1", "s2 q2", "s2 a2"]
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/ctxgate.secret")).unwrap(),
        std::fs::read_to_string(dir.path().join("b/ctxgate.secret")).unwrap(),
        "the secret went there and back"
    );
    // A target holding another secret is refused.
    let other = dir.path().join("c").join("ctx.db");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::write(
        dir.path().join("c/ctxgate.secret"),
        format!("{}\n", "ab".repeat(32)),
    )
    .unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["sessions", "migrate", "--config"])
        .arg(&config)
        .args([
            "--from",
            &redis.url(),
            "--to",
            &format!("sqlite:{}", other.display()),
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("another tenant secret"));
}
