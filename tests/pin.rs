//! `PATCH /admin/sessions/{id}`: an operator pins a strategy for one session — over the request's
//! `x-ctxgate-strategy` header and the config — unpins it, and the pin is kept by the store (across a restart on
//! SQLite, across instances on Redis). Bad bodies and unknown sessions are refused; the route needs the admin token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::redis::RedisServer;
use common::{agent_history, session_header, test_config, Harness};
use ctxgate::config::{Config, StoreBackend};
use ctxgate::mock::MockUpstream;
use serde_json::{json, Value};

fn small(c: &mut Config) {
    c.context.default_context_window = 8_000;
}

/// Posts `messages` (growing: the same session) and returns the session id.
async fn chat(h: &Harness, messages: &[Value], header: Option<&str>) -> String {
    let mut r = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-pin")
        .header("x-session-id", "pin-1");
    if let Some(s) = header {
        r = r.header("x-ctxgate-strategy", s);
    }
    let resp = r
        .body(serde_json::to_vec(&json!({"model": "mock-model", "messages": messages})).unwrap())
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sid = session_header(&resp);
    resp.text().await.unwrap();
    sid
}

async fn patch(h: &Harness, sid: &str, body: &str) -> (u16, Value) {
    let r = h
        .client
        .patch(h.url(&format!("/admin/sessions/{sid}")))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The body the upstream received last, and whether it is the client's, byte for byte.
fn last_sent_as_is(h: &Harness, messages: &[Value]) -> bool {
    let last = h.mock.requests().last().unwrap().json();
    last["messages"] == json!(messages)
}

fn next(messages: &mut Vec<Value>, i: usize) {
    messages.push(json!({"role": "assistant", "content": "mock reply"}));
    messages.push(json!({"role": "user", "content": format!("go on {i}")}));
}

#[tokio::test]
async fn a_pinned_strategy_wins_over_the_header_and_unpinning_restores_the_config() {
    let h = Harness::start_with(small).await;
    let mut m = agent_history(14, 300);
    let sid = chat(&h, &m, None).await;
    assert!(!last_sent_as_is(&h, &m), "over the threshold: rewritten");

    let (status, meta) = patch(&h, &sid, r#"{"strategy": "off"}"#).await;
    assert_eq!(status, 200);
    assert_eq!(meta["strategy"], "off");
    assert_eq!(meta["id"], sid);
    next(&mut m, 1);
    chat(&h, &m, Some("prune")).await;
    assert!(
        last_sent_as_is(&h, &m),
        "pinned off: the client's own messages, whatever the header"
    );
    let shown: Value = h.get_json(&format!("/admin/sessions/{sid}")).await;
    assert_eq!(shown["strategy"], "off");
    let list: Value = h.get_json("/admin/sessions").await;
    assert_eq!(list["sessions"][0]["strategy"], "off");

    let (status, meta) = patch(&h, &sid, r#"{"strategy": null}"#).await;
    assert_eq!(status, 200);
    assert_eq!(meta["strategy"], Value::Null);
    next(&mut m, 2);
    chat(&h, &m, None).await;
    assert!(!last_sent_as_is(&h, &m), "unpinned: rewritten again");
    // A pin of a rewriting strategy over a header asking for none.
    patch(&h, &sid, r#"{"strategy": "prune"}"#).await;
    next(&mut m, 3);
    chat(&h, &m, Some("off")).await;
    assert!(
        !last_sent_as_is(&h, &m),
        "pinned prune wins over the header's off"
    );
}

#[tokio::test]
async fn bad_patches_are_refused_and_unknown_sessions_are_404() {
    let h = Harness::start_with(small).await;
    let sid = chat(&h, &agent_history(2, 10), None).await;
    for body in [
        "not json",
        "[]",
        "{}",
        r#"{"strategy": 1}"#,
        r#"{"strategy": "fast"}"#,
        r#"{"strategy": "off", "threshold": 0.5}"#,
    ] {
        let (status, v) = patch(&h, &sid, body).await;
        assert_eq!(status, 400, "{body}");
        assert!(v["error"]["message"].is_string(), "{body}: {v}");
    }
    let (_, v) = patch(&h, &sid, r#"{"strategy": "fast"}"#).await;
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown strategy \"fast\""));
    let (status, _) = patch(&h, "nope", r#"{"strategy": "off"}"#).await;
    assert_eq!(status, 404);
    let shown: Value = h.get_json(&format!("/admin/sessions/{sid}")).await;
    assert_eq!(shown["strategy"], Value::Null, "nothing was pinned");
}

#[tokio::test]
async fn patching_needs_the_admin_token() {
    let h = Harness::start_with(|c| c.admin.token = Some("admin-secret".into())).await;
    let url = h.url("/admin/sessions/x");
    let body = r#"{"strategy": "off"}"#;
    assert_eq!(
        h.client
            .patch(&url)
            .body(body)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let wrong = h
        .client
        .patch(&url)
        .bearer_auth("no")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    // With the token, the body must still say it is JSON.
    let untyped = h
        .client
        .patch(&url)
        .bearer_auth("admin-secret")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(untyped.status(), 415);
    let right = h
        .client
        .patch(&url)
        .bearer_auth("admin-secret")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 404);
}

#[tokio::test]
async fn a_pin_survives_a_restart_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    small(&mut cfg);
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = dir.path().join("ctx.db");
    let mut h = Harness::start_config(mock.clone(), cfg.clone()).await;
    let mut m = agent_history(14, 300);
    let sid = chat(&h, &m, None).await;
    assert_eq!(patch(&h, &sid, r#"{"strategy": "off"}"#).await.0, 200);
    h.stop().await;
    drop(h);
    let h = Harness::start_config(mock, cfg).await;
    next(&mut m, 1);
    assert_eq!(chat(&h, &m, None).await, sid);
    assert!(last_sent_as_is(&h, &m), "still pinned after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_on_redis_sees_the_pin() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    small(&mut cfg);
    cfg.store.backend = StoreBackend::Redis;
    cfg.store.redis_url = redis.url();
    let a = Harness::start_config(mock.clone(), cfg.clone()).await;
    let b = Harness::start_config(mock, cfg).await;
    let mut m = agent_history(14, 300);
    let sid = chat(&b, &m, None).await; // b has the session cached
    assert!(!last_sent_as_is(&b, &m));
    next(&mut m, 1);
    chat(&a, &m, None).await;
    assert_eq!(patch(&a, &sid, r#"{"strategy": "off"}"#).await.0, 200);
    next(&mut m, 2);
    assert_eq!(chat(&b, &m, None).await, sid);
    assert!(last_sent_as_is(&b, &m), "b saw a's pin");
}
