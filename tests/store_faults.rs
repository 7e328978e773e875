//! Store faults and the session manager's writes: a store that never answers or turns read-only mid-run never
//! stalls chat; writes refused by a full queue are not lost when the cache evicts their session; requests the
//! upstream refuses store nothing; concurrent turns never move a session's row backwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::test_config;
use ctxgate::app::AppState;
use ctxgate::config::{Config, StoreBackend};
use ctxgate::metrics::StoreMetrics;
use ctxgate::mock::{MockReply, MockUpstream};
use ctxgate::store::{SessionMeta, SqliteStore, Store, StoreError, StoredSession, WriteOp};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The store bound used by these tests.
const BOUND_MS: u64 = 200;
/// A chat must have answered within this, else the store stalled it (a stuck store stalls it forever). Far above
/// the bound plus the mock's answer: the first request of a test binary may wait for the tokenizer's tables, built
/// unoptimised in a test build, and at a load of ~10 that once took more than 5 s.
const ANSWERED_WITHIN: Duration = Duration::from_secs(20);

/// A store that never answers: loads (optionally) and writes never resolve.
struct Stuck {
    hang_loads: bool,
    held: Mutex<Vec<oneshot::Sender<Result<(), StoreError>>>>,
}

impl Stuck {
    fn new(hang_loads: bool) -> Arc<Self> {
        Arc::new(Self {
            hang_loads,
            held: Mutex::new(Vec::new()),
        })
    }
}

impl Store for Stuck {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn write(&self, _ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        self.held.lock().push(tx);
        rx
    }

    fn load(&self, _id: &str) -> BoxFuture<'static, Result<Option<StoredSession>, StoreError>> {
        if self.hang_loads {
            Box::pin(futures_util::future::pending())
        } else {
            Box::pin(async { Ok(None) })
        }
    }

    fn list(
        &self,
        _limit: u32,
        _offset: u64,
    ) -> BoxFuture<'static, Result<(Vec<SessionMeta>, u64), StoreError>> {
        Box::pin(futures_util::future::pending())
    }

    fn turns(
        &self,
        _id: &str,
        _offset: u64,
        _limit: u32,
    ) -> BoxFuture<'static, Result<(Vec<String>, u64), StoreError>> {
        Box::pin(futures_util::future::pending())
    }

    fn delete(&self, _id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        Box::pin(futures_util::future::pending())
    }

    fn purge_idle(&self, _before: i64) -> BoxFuture<'static, Result<u64, StoreError>> {
        Box::pin(futures_util::future::pending())
    }
}

/// The gateway over `state` on port 0; the server runs until the test ends.
async fn serve(state: Arc<AppState>) -> SocketAddr {
    let server = ctxgate::server::Server::bind(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(futures_util::future::pending::<()>()));
    addr
}

fn config(mock: &MockUpstream) -> Config {
    let mut cfg = test_config(&mock.base_url());
    cfg.store.timeout_ms = BOUND_MS;
    cfg.store.retention_days = 0;
    cfg
}

/// One chat turn; returns the status, the session id and the body (JSON or the SSE text).
async fn chat(
    addr: SocketAddr,
    sid: &str,
    messages: &[Value],
    stream: bool,
) -> (u16, String, String) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let send = async {
        let resp = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("authorization", "Bearer sk-test-a")
            .header("x-session-id", sid)
            .json(&json!({"model": "gpt-4o", "messages": messages, "stream": stream}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let id = resp
            .headers()
            .get("x-ctxgate-session")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, id, resp.text().await.unwrap())
    };
    tokio::time::timeout(ANSWERED_WITHIN, send)
        .await
        .expect("the chat did not answer: the store stalled it")
}

fn user(i: usize) -> Value {
    json!({"role": "user", "content": format!("question {i}")})
}

async fn metrics_text(addr: SocketAddr) -> String {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_store_that_never_answers_loads_does_not_stall_chat() {
    let mock = MockUpstream::start().await.unwrap();
    let state = AppState::with_store(config(&mock), Stuck::new(true)).unwrap();
    let addr = serve(state).await;
    mock.push(MockReply::completion("json answer"));
    let (status, _, body) = chat(addr, "cold-1", &[user(1)], false).await;
    assert_eq!(status, 200);
    assert!(body.contains("json answer"));
    mock.push(MockReply::sse_text(&["streamed ", "answer"], false));
    let (status, _, body) = chat(addr, "cold-2", &[user(1)], true).await;
    assert_eq!(status, 200);
    assert!(body.contains("streamed ") && body.contains("[DONE]"));
    let m = metrics_text(addr).await;
    assert!(
        counter(
            &m,
            "ctxgate_store_errors_total{backend=\"memory\",operation=\"load\"}"
        ) >= 1,
        "a load given up on is counted"
    );
    assert_eq!(
        counter(&m, "ctxgate_store_circuit_open"),
        1,
        "the load given up on opened the circuit: the second session was not loaded at all"
    );
}

#[tokio::test]
async fn a_store_that_never_commits_does_not_stall_chat() {
    let mock = MockUpstream::start().await.unwrap();
    let state = AppState::with_store(config(&mock), Stuck::new(false)).unwrap();
    let addr = serve(state).await;
    let mut history = vec![user(1)];
    for turn in 0..2 {
        mock.push(MockReply::completion(&format!("answer {turn}")));
        let (status, _, body) = chat(addr, "stuck", &history, false).await;
        assert_eq!(status, 200);
        assert!(body.contains(&format!("answer {turn}")));
        history.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
        history.push(user(turn + 2));
    }
    mock.push(MockReply::sse_text(&["streamed"], false));
    let (status, _, body) = chat(addr, "stuck", &history, true).await;
    assert_eq!(status, 200);
    assert!(body.contains("streamed") && body.contains("[DONE]"));
    let m = metrics_text(addr).await;
    assert!(
        counter(
            &m,
            "ctxgate_store_errors_total{backend=\"memory\",operation=\"write\"}"
        ) >= 1,
        "a turn's commit given up on is counted"
    );
    assert_eq!(
        counter(&m, "ctxgate_store_circuit_open"),
        1,
        "it opened the circuit: the later turns' commits were not waited for"
    );
}

#[tokio::test]
async fn a_store_turned_read_only_mid_run_keeps_chat_answering_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctx.db");
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = config(&mock);
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = path.clone();
    let store = Arc::new(SqliteStore::open_with(&path, 1000, StoreMetrics::default()).unwrap());
    let state = AppState::with_store(cfg.clone(), store.clone()).unwrap();
    let addr = serve(state.clone()).await;

    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    let mut sid = String::new();
    for turn in 1..=4 {
        if turn == 2 {
            // Every write fails from here on (SQLITE_READONLY), as with a disk remounted read-only.
            store.set_query_only(true).await.unwrap();
        }
        sid = answered_turn(&mock, addr, "ro", &mut history, turn).await;
    }
    // The store recovers: the writes it refused were kept and are committed now.
    store.set_query_only(false).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), state.sessions.flush())
        .await
        .expect("flush did not finish")
        .unwrap();

    // Restart over the same file: the whole conversation is there.
    assert_restored(cfg, &sid, &history).await;
}

/// One chat and how long it took to answer whole; `sid`: the `x-session-id` header, if any.
async fn timed_chat(
    addr: SocketAddr,
    sid: Option<&str>,
    messages: &[Value],
    stream: bool,
) -> Duration {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut req = client
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer sk-test-a")
        .json(&json!({"model": "gpt-4o", "messages": messages, "stream": stream}));
    if let Some(sid) = sid {
        req = req.header("x-session-id", sid);
    }
    let started = Instant::now();
    let resp = tokio::time::timeout(ANSWERED_WITHIN, req.send())
        .await
        .expect("the chat did not answer")
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    started.elapsed()
}

async fn readyz(addr: SocketAddr) -> (u16, Value) {
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_waited_for_once_and_what_was_answered_meanwhile_lands_after_it() {
    // A bound long enough that a request waiting for it cannot pass for a fast one, even on a loaded machine.
    const TIMEOUT: Duration = Duration::from_millis(1200);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctx.db");
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = config(&mock);
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = path.clone();
    cfg.store.timeout_ms = TIMEOUT.as_millis() as u64;
    let store = Arc::new(SqliteStore::open_with(&path, 1000, StoreMetrics::default()).unwrap());
    let state = AppState::with_store(cfg.clone(), store.clone()).unwrap();
    let addr = serve(state).await;

    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    let sid = answered_turn(&mock, addr, "outage", &mut history, 1).await;
    let (status, ready) = readyz(addr).await;
    assert_eq!((status, ready["status"].as_str()), (200, Some("ready")));
    assert_eq!(
        counter(&metrics_text(addr).await, "ctxgate_store_circuit_open"),
        0
    );

    // Every write fails from here on (SQLITE_READONLY), kept by the store's worker for a retry. The first turn
    // waits for its commit up to the bound: that opens the circuit.
    store.set_query_only(true).await.unwrap();
    answered_turn(&mock, addr, "outage", &mut history, 2).await;

    // The following requests do not wait on the store at all: the cached session (JSON and stream), a new session,
    // a request without a session header.
    let fast = TIMEOUT / 4;
    for turn in 3..=8 {
        let started = Instant::now();
        answered_turn(&mock, addr, "outage", &mut history, turn).await;
        let took = started.elapsed();
        assert!(
            took < fast,
            "turn {turn} of the cached session took {took:?} during the outage"
        );
    }
    for (sid, stream) in [
        (Some("new-during-outage"), false),
        (None, true),
        (None, false),
    ] {
        if stream {
            mock.push(MockReply::sse_text(&["streamed"], false));
        } else {
            mock.push(MockReply::completion("plain"));
        }
        let took = timed_chat(addr, sid, &[user(99)], stream).await;
        assert!(
            took < fast,
            "{sid:?} (stream: {stream}) took {took:?} during the outage"
        );
    }

    // /readyz stays 200 (the gateway serves) and says why it is degraded, at once; so does the gauge.
    let started = Instant::now();
    let (status, ready) = readyz(addr).await;
    assert!(started.elapsed() < fast, "readyz waited on the store");
    assert_eq!(status, 200);
    assert_eq!(ready["status"], "degraded", "{ready}");
    assert_eq!(ready["circuit"], "open", "{ready}");
    assert_eq!(ready["store"], "sqlite");
    assert!(
        ready["reason"].as_str().unwrap().contains("write"),
        "{ready}"
    );
    assert_eq!(
        counter(&metrics_text(addr).await, "ctxgate_store_circuit_open"),
        1
    );

    // The store recovers: the background probe closes the circuit once every write queued meanwhile is
    // committed, with no request and no flush to push it.
    store.set_query_only(false).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while readyz(addr).await.1["status"] != "ready" {
        assert!(
            Instant::now() < deadline,
            "the circuit did not close after the store recovered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        counter(&metrics_text(addr).await, "ctxgate_store_circuit_open"),
        0
    );
    assert_restored(cfg.clone(), &sid, &history).await;

    // Closed again: a turn waits for its commit as before, and the session goes on from where it was.
    let started = Instant::now();
    answered_turn(&mock, addr, "outage", &mut history, 9).await;
    assert!(started.elapsed() < TIMEOUT);
    let restarted = AppState::new(cfg).unwrap();
    let stored = restarted
        .sessions
        .store()
        .load(&sid)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.nodes.len(),
        history.len(),
        "the turn after the outage is durable"
    );
}

/// SQLite behind a gate that, while closed, refuses every write at once as a full queue does.
struct FullQueue {
    inner: Arc<SqliteStore>,
    closed: AtomicBool,
}

impl Store for FullQueue {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn write(&self, ops: Vec<WriteOp>) -> oneshot::Receiver<Result<(), StoreError>> {
        if self.closed.load(Ordering::SeqCst) {
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

#[tokio::test]
async fn writes_refused_by_a_full_queue_survive_the_cache_evicting_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctx.db");
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = config(&mock);
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = path.clone();
    // Every session is evicted as soon as the cache does its bookkeeping.
    cfg.store.cache_max_bytes = 1;
    let store = Arc::new(FullQueue {
        inner: Arc::new(SqliteStore::open_with(&path, 1000, StoreMetrics::default()).unwrap()),
        closed: AtomicBool::new(true),
    });
    let state = AppState::with_store(cfg.clone(), store.clone()).unwrap();
    let addr = serve(state.clone()).await;

    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    let mut sid = String::new();
    for turn in 1..=2 {
        sid = answered_turn(&mock, addr, "evicted", &mut history, turn).await;
    }
    assert_eq!(
        state.sessions.cache_stats_now().await.0,
        0,
        "the session was evicted"
    );
    // The queue has room again; shutdown's drain rewrites the evicted session.
    store.closed.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), state.drain())
        .await
        .expect("drain did not finish");

    assert_restored(cfg, &sid, &history).await;
}

#[tokio::test]
async fn new_sessions_the_upstream_refuses_store_nothing() {
    let mock = MockUpstream::start().await.unwrap();
    let state = AppState::new(config(&mock)).unwrap();
    let addr = serve(state.clone()).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        mock.push(MockReply::json(
            401,
            json!({"error": {"message": "bad key", "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ));
        let (status, id, _) = chat(addr, &format!("rotating-{i}"), &[user(i)], i % 2 == 0).await;
        assert_eq!(status, 401);
        ids.push(id);
    }
    let (_, total) = state.sessions.list(100, 0).await.unwrap();
    assert_eq!(total, 0, "nothing stored for refused first requests");
    assert_eq!(
        state.sessions.cache_stats_now().await.0,
        0,
        "nothing cached"
    );
    for id in &ids {
        assert!(state.sessions.store().load(id).await.unwrap().is_none());
    }

    // A first turn the upstream accepts is stored whole.
    mock.push(MockReply::completion("welcome"));
    let first = [json!({"role": "system", "content": "s"}), user(1)];
    let (status, id, _) = chat(addr, "accepted", &first, false).await;
    assert_eq!(status, 200);
    state.sessions.flush().await.unwrap();
    let stored = state.sessions.store().load(&id).await.unwrap().unwrap();
    assert_eq!(stored.nodes.len(), 3);
    assert_eq!(stored.meta.message_count, 3);
    let (_, total) = state.sessions.list(100, 0).await.unwrap();
    assert_eq!(total, 1);

    // An existing session keeps recording its requests whatever the upstream answers.
    mock.push(MockReply::json(500, json!({"error": {"message": "down"}})));
    let second = [
        first[0].clone(),
        first[1].clone(),
        json!({"role": "assistant", "content": "welcome"}),
        user(2),
    ];
    let (status, _, _) = chat(addr, "accepted", &second, false).await;
    assert_eq!(status, 500);
    state.sessions.flush().await.unwrap();
    let stored = state.sessions.store().load(&id).await.unwrap().unwrap();
    assert_eq!(stored.nodes.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_turns_leave_the_stored_row_matching_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = config(&mock);
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = dir.path().join("ctx.db");
    cfg.store.timeout_ms = 10_000;
    let state = AppState::new(cfg.clone()).unwrap();
    let addr = serve(state.clone()).await;
    let base = vec![json!({"role": "system", "content": "s"}), user(0)];
    let (_, sid, _) = chat(addr, "par", &base, false).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mut m = base.clone();
        m.push(json!({"role": "assistant", "content": "ok"}));
        m.push(user(100 + i));
        tasks.push(tokio::spawn(async move {
            chat(addr, "par", &m, i % 2 == 0).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().0, 200);
    }
    state.sessions.flush().await.unwrap();
    let entry = state.sessions.entry(&sid).await.unwrap().unwrap();
    let (len, history, head) =
        entry.with_tree(|t| (t.len(), t.history().len(), t.head().map(|h| h.to_string())));

    let restarted = AppState::new(cfg).unwrap();
    let loaded = restarted
        .sessions
        .store()
        .load(&sid)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(loaded.nodes.len(), len);
    assert_eq!(
        loaded.meta.message_count, history as u64,
        "the row counts the history's messages"
    );
    assert_eq!(
        loaded.meta.head, head,
        "the row's head is the newest turn's"
    );
    assert!(loaded
        .nodes
        .iter()
        .any(|n| Some(n.id.to_string()) == loaded.meta.head));
}

/// A new gateway over the same store finds session `sid` whole: every message of `history`, in order.
async fn assert_restored(cfg: Config, sid: &str, history: &[Value]) {
    let restarted = AppState::new(cfg).unwrap();
    let loaded = restarted
        .sessions
        .store()
        .load(sid)
        .await
        .unwrap()
        .expect("the session was written");
    assert_eq!(loaded.nodes.len(), history.len());
    assert_eq!(loaded.meta.message_count, history.len() as u64);
    let view = restarted.sessions.view(sid).await.unwrap().unwrap();
    let contents: Vec<&str> = view
        .messages
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = history
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, expected);
}

/// Turn `turn` of session `session` (JSON on odd turns, streamed on even ones): the user message and the answer
/// are appended to `history` once the client got the whole answer; returns the session id.
async fn answered_turn(
    mock: &MockUpstream,
    addr: SocketAddr,
    session: &str,
    history: &mut Vec<Value>,
    turn: usize,
) -> String {
    history.push(user(turn));
    let stream = turn % 2 == 0;
    if stream {
        mock.push(MockReply::sse_text(&[&format!("answer {turn}")], false));
    } else {
        mock.push(MockReply::completion(&format!("answer {turn}")));
    }
    let (status, id, body) = chat(addr, session, history, stream).await;
    assert_eq!(status, 200);
    assert!(body.contains(&format!("answer {turn}")));
    history.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
    id
}
