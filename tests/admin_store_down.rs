//! The admin API while the store is out: with the store's circuit open (or a store that fails), every admin route
//! that needs the store answers 503 with `retry-after` and a message saying the store is unavailable, in the
//! gateway's JSON error shape — not 500 `internal error` — and answers as before once the store is back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::test_config;
use ctxgate::app::AppState;
use ctxgate::mock::{MockReply, MockUpstream};
use ctxgate::store::{MemoryStore, SessionMeta, Store, StoreError, StoredSession, WriteOp};
use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A memory store that, while `down`, fails every operation at once (as a database whose file went read-only or
/// a Redis that refuses does).
struct Flaky {
    inner: MemoryStore,
    down: AtomicBool,
}

fn outage() -> StoreError {
    StoreError::Backend {
        backend: "memory",
        message: "injected outage".into(),
    }
}

fn failed<T: Send + 'static>() -> BoxFuture<'static, Result<T, StoreError>> {
    Box::pin(async { Err(outage()) })
}

impl Flaky {
    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }
}

impl Store for Flaky {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        if self.is_down() {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Err(outage()));
            return rx;
        }
        self.inner.write(ops)
    }

    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        if self.is_down() {
            return failed();
        }
        self.inner.load(id)
    }

    fn list(
        &self,
        limit: u32,
        offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        if self.is_down() {
            return failed();
        }
        self.inner.list(limit, offset)
    }

    fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        if self.is_down() {
            return failed();
        }
        self.inner.turns(id, offset, limit)
    }

    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        if self.is_down() {
            return failed();
        }
        self.inner.delete(id)
    }

    fn purge_idle(&self, before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        if self.is_down() {
            return failed();
        }
        self.inner.purge_idle(before)
    }

    fn ping(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        if self.is_down() {
            return failed();
        }
        self.inner.ping()
    }
}

/// An admin request: method, path and, for a state change, its content type and body.
type Call = (reqwest::Method, String, Option<(&'static str, Vec<u8>)>);

async fn serve(state: Arc<AppState>) -> SocketAddr {
    let server = ctxgate::server::Server::bind(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(futures_util::future::pending::<()>()));
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_503_with_retry_after_while_the_store_is_unavailable() {
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.store.timeout_ms = 500;
    let store = Arc::new(Flaky {
        inner: MemoryStore::new(),
        down: AtomicBool::new(false),
    });
    let state = AppState::with_store(cfg, store.clone()).unwrap();
    let addr = serve(state.clone()).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = |path: &str| format!("http://{addr}{path}");

    // A session, stored.
    mock.push(MockReply::completion("stored"));
    let r = client
        .post(url("/v1/chat/completions"))
        .header("x-session-id", "down")
        .json(&json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r.headers()["x-ctxgate-session"]
        .to_str()
        .unwrap()
        .to_string();
    state.drain().await;
    let export = client
        .get(url(&format!("/admin/sessions/{sid}/export")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();

    // The store goes out; the next turn's write fails and opens the circuit.
    store.down.store(true, Ordering::SeqCst);
    mock.push(MockReply::completion("not stored"));
    let r = client
        .post(url("/v1/chat/completions"))
        .header("x-session-id", "down")
        .json(
            &json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "stored"}, {"role": "user", "content": "again"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "chat is answered without the store");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !state.sessions.breaker().is_open() {
        assert!(Instant::now() < deadline, "the circuit did not open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let json_body = "application/json";
    let calls: Vec<Call> = vec![
        (reqwest::Method::GET, "/admin/sessions".into(), None),
        (reqwest::Method::GET, "/admin/sessions?q=down".into(), None),
        (
            reqwest::Method::GET,
            "/admin/sessions/anonymous-not-cached".into(),
            None,
        ),
        (
            reqwest::Method::GET,
            format!("/admin/sessions/{sid}/turns"),
            None,
        ),
        (
            reqwest::Method::PATCH,
            format!("/admin/sessions/{sid}"),
            Some((json_body, br#"{"strategy": "prune"}"#.to_vec())),
        ),
        (
            reqwest::Method::GET,
            format!("/admin/sessions/{sid}/export"),
            None,
        ),
        (
            reqwest::Method::POST,
            "/admin/sessions/import?replace=true".into(),
            Some(("application/x-ndjson", export.to_vec())),
        ),
        (
            reqwest::Method::DELETE,
            format!("/admin/sessions/{sid}"),
            None,
        ),
    ];
    for (method, path, body) in &calls {
        let mut req = client.request(method.clone(), url(path));
        if let Some((kind, bytes)) = body {
            req = req.header("content-type", *kind).body(bytes.clone());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 503, "{method} {path}: {v}");
        let secs: u64 = retry
            .as_deref()
            .unwrap_or_else(|| panic!("{method} {path}: no retry-after"))
            .parse()
            .unwrap();
        assert!(
            (1..=30).contains(&secs),
            "{method} {path}: retry-after {secs}"
        );
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("the session store is unavailable"),
            "{method} {path}: {v}"
        );
        assert_eq!(v["error"]["type"], "server_error", "{method} {path}");
        assert_eq!(v["error"]["code"], "store_unavailable", "{method} {path}");
    }

    // Back: the probe closes the circuit and the admin API answers as before.
    store.down.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(20);
    while state.sessions.breaker().is_open() {
        assert!(Instant::now() < deadline, "the circuit did not close");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = client
        .get(url(&format!("/admin/sessions/{sid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
