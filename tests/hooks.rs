//! The idle webhook against a local receiver: a signed export once per idle period, retried after a 5xx, not
//! after a 4xx, a new delivery after new activity, and a pending delivery that survives a restart (the store is
//! the only state).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::{test_config, Harness};
use ctxgate::config::{Config, DurationSpec, StoreBackend};
use ctxgate::mock::MockUpstream;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SECRET: &str = "hook-secret";

/// What the receiver got: headers, body, and the status it answered.
type Got = Vec<(HeaderMap, Vec<u8>, u16)>;

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Got>>,
    answers: Arc<Mutex<VecDeque<u16>>>,
}

impl Receiver {
    /// Starts on a loopback port; answers the queued statuses, then 200.
    async fn start(answers: &[u16]) -> (Receiver, String) {
        let r = Receiver::default();
        r.answers.lock().unwrap().extend(answers);
        let app = axum::Router::new()
            .route(
                "/idle",
                post(|State(r): State<Receiver>, headers: HeaderMap, body: axum::body::Bytes| async move {
                    let status = r.answers.lock().unwrap().pop_front().unwrap_or(200);
                    r.got.lock().unwrap().push((headers, body.to_vec(), status));
                    StatusCode::from_u16(status).unwrap()
                }),
            )
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/idle", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (r, url)
    }

    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    /// Waits (up to 20 s) until `n` requests arrived.
    async fn wait_for(&self, n: usize) {
        for _ in 0..200 {
            if self.count() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{} deliveries after 20 s, expected {n}", self.count());
    }
}

fn hooked(c: &mut Config, url: &str) {
    c.hooks.session_idle_url = Some(url.to_string());
    c.hooks.secret = Some(SECRET.into());
    c.hooks.session_idle_after = DurationSpec::from_secs(1);
    c.hooks.max_backoff = DurationSpec::from_secs(1);
}

async fn chat(h: &Harness, session: &str, text: &str) -> String {
    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": text}]});
    let (sid, r) = h.chat_ok("sk-hooks", session, &body).await;
    r.text().await.unwrap();
    sid
}

#[tokio::test]
async fn an_idle_session_is_posted_signed_retried_after_a_500_and_delivered_once() {
    let (rx, url) = Receiver::start(&[500]).await;
    let h = Harness::start_with(|c| hooked(c, &url)).await;
    let sid = chat(&h, "idle-1", "hello").await;
    rx.wait_for(2).await;
    // Several more sweeps: nothing more for this idle period.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let got = rx.got.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "a 500, then one delivery");
    assert_eq!((got[0].2, got[1].2), (500, 200));
    for (headers, body, _) in &got {
        let expected = ctxgate::hooks::signature(SECRET, body);
        assert_eq!(headers["x-ctxgate-signature"], expected.as_str());
        assert!(expected.starts_with("sha256=") && expected.len() == 7 + 64);
        assert_eq!(headers["x-ctxgate-session"], sid.as_str());
        assert_eq!(headers["content-type"], "application/x-ndjson");
    }
    assert_eq!(
        got[0].0["x-ctxgate-delivery"], got[1].0["x-ctxgate-delivery"],
        "one idle period"
    );
    // The body is the session's export.
    let text = String::from_utf8(got[1].1.clone()).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["ctxgate_export"], 1);
    assert_eq!(header["session"]["id"], sid);
    assert!(text.contains("hello"));
    assert_eq!(
        h.metric("ctxgate_hook_deliveries_total{outcome=\"delivered\"}")
            .await,
        1.0
    );
    assert_eq!(
        h.metric("ctxgate_hook_deliveries_total{outcome=\"retried\"}")
            .await,
        1.0
    );
    assert_eq!(h.metric("ctxgate_hook_pending_deliveries").await, 0.0);

    // Active again, then idle again: a new period, a new delivery.
    chat(&h, "idle-1", "hello again").await;
    rx.wait_for(3).await;
    let got = rx.got.lock().unwrap().clone();
    assert_ne!(
        got[2].0["x-ctxgate-delivery"],
        got[1].0["x-ctxgate-delivery"]
    );
    assert!(String::from_utf8_lossy(&got[2].1).contains("hello again"));
}

#[tokio::test]
async fn a_refusal_is_not_retried() {
    let (rx, url) = Receiver::start(&[400]).await;
    let h = Harness::start_with(|c| hooked(c, &url)).await;
    chat(&h, "idle-2", "hello").await;
    rx.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(rx.count(), 1);
    assert_eq!(
        h.metric("ctxgate_hook_deliveries_total{outcome=\"failed\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_pending_delivery_survives_a_restart_and_is_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctx.db");
    // A receiver that is not there (a port that was just closed).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/idle", l.local_addr().unwrap())
    };
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = db.clone();
    hooked(&mut cfg, &closed);
    let mut first = Harness::start_config(mock.clone(), cfg.clone()).await;
    chat(&first, "idle-3", "remember this").await;
    // Wait until it was tried (and failed) at least once.
    for _ in 0..200 {
        if first
            .metric("ctxgate_hook_deliveries_total{outcome=\"retried\"}")
            .await
            >= 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        first
            .metric("ctxgate_hook_deliveries_total{outcome=\"retried\"}")
            .await
            >= 1.0
    );
    assert_eq!(first.metric("ctxgate_hook_pending_deliveries").await, 1.0);
    first.stop().await;
    drop(first);

    let (rx, url) = Receiver::start(&[]).await;
    hooked(&mut cfg, &url);
    let second = Harness::start_config(mock, cfg).await;
    rx.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(rx.count(), 1, "delivered once after the restart");
    assert!(String::from_utf8_lossy(&rx.got.lock().unwrap()[0].1).contains("remember this"));
    drop(second);
}

#[test]
fn a_webhook_needs_a_secret_and_a_valid_duration() {
    let err = Config::from_toml_str(
        "[hooks]\nsession_idle_url = \"http://127.0.0.1:9/idle\"\nsession_idle_after = \"half an hour\"\n",
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("hooks.secret"), "{text}");
    assert!(text.contains("hooks.session_idle_after"), "{text}");
    let ok = Config::from_toml_str(
        "[hooks]\nsession_idle_url = \"https://example.com/idle\"\nsecret = \"s\"\nsession_idle_after = \"45m\"\n",
    )
    .unwrap();
    assert_eq!(ok.hooks.idle_after(), Duration::from_secs(2700));
    assert_eq!(ok.masked().hooks.secret.as_deref(), Some("***"));
}

/// A receiver that holds the first `hang` requests for 30 s (each delivery's timeout ends it first) and answers
/// 200 after; it notes when each request arrived and for which session.
#[derive(Clone)]
struct Hanging {
    got: Arc<Mutex<Vec<(std::time::Instant, String, u16)>>>,
    hang: usize,
}

impl Hanging {
    async fn start(hang: usize) -> (Hanging, String) {
        let r = Hanging {
            got: Arc::default(),
            hang,
        };
        let app = axum::Router::new()
            .route(
                "/idle",
                post(|State(r): State<Hanging>, headers: HeaderMap| async move {
                    let session = headers["x-ctxgate-session"].to_str().unwrap().to_string();
                    let status = {
                        let mut got = r.got.lock().unwrap();
                        let status = if got.len() < r.hang { 0 } else { 200 };
                        got.push((std::time::Instant::now(), session, status));
                        status
                    };
                    if status == 0 {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                    StatusCode::OK
                }),
            )
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/idle", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (r, url)
    }

    fn got(&self) -> Vec<(std::time::Instant, String, u16)> {
        self.got.lock().unwrap().clone()
    }
}

/// Issue 36, finding 7: a receiver that hangs costs one `timeout_secs` per sweep, not one per due session: the
/// due sessions are delivered concurrently (up to `hooks.concurrent_deliveries`), each still once per idle
/// period, and each hung one retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_receiver_costs_one_timeout_for_all_due_sessions_not_one_each() {
    const N: usize = 8;
    let (rx, url) = Hanging::start(N).await;
    let h = Harness::start_with(|c| {
        hooked(c, &url);
        c.hooks.timeout_secs = 1;
    })
    .await;
    let mut sids = Vec::new();
    for i in 0..N {
        sids.push(chat(&h, &format!("hang-{i}"), "hello").await);
    }
    // Every session's first attempt (each hangs until its 1 s timeout).
    for _ in 0..300 {
        if rx.got().len() >= N {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = rx.got();
    assert!(got.len() >= N, "{} attempts after 30 s", got.len());
    let first: std::collections::HashSet<&str> = got[..N].iter().map(|g| g.1.as_str()).collect();
    assert_eq!(first.len(), N, "one attempt per session first: {got:?}");
    // In series the last first attempt would start (N - 1) timeouts after the first: 7 s.
    let spread = got[N - 1].0 - got[0].0;
    eprintln!("the first attempts of {N} due sessions spread over {spread:?}");
    assert!(
        spread < Duration::from_millis(3500),
        "the first attempts of {N} due sessions spread over {spread:?}"
    );
    // Each is retried after its timeout and delivered once; then nothing more for this idle period.
    for _ in 0..300 {
        if rx.got().iter().filter(|g| g.2 == 200).count() >= N {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let got = rx.got();
    for sid in &sids {
        let delivered = got.iter().filter(|g| &g.1 == sid && g.2 == 200).count();
        assert_eq!(delivered, 1, "{sid}: {got:?}");
    }
    assert_eq!(
        got.len(),
        2 * N,
        "one hung attempt and one delivery each: {got:?}"
    );
    assert_eq!(
        h.metric("ctxgate_hook_deliveries_total{outcome=\"delivered\"}")
            .await,
        N as f64
    );
}
