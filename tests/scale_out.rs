//! Several gateway instances on one Redis: any instance serves any turn of any session, with the full history,
//! recall and summaries; concurrent turns on two instances lose nothing. The tests start their own
//! `redis-server` (they skip without it, unless `CTXGATE_REQUIRE_EXTERNAL=1`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::redis::RedisServer;
use common::{support_chat, test_config, Harness};
use ctxgate::config::{Config, StoreBackend};
use ctxgate::mock::{MockReply, MockUpstream};
use serde_json::{json, Value};

fn redis_config(mock: &MockUpstream, redis: &RedisServer) -> Config {
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Redis;
    cfg.store.redis_url = redis.url();
    cfg
}

/// Two instances on one Redis and one mock upstream.
async fn pair(redis: &RedisServer, f: impl Fn(&mut Config)) -> (Harness, Harness) {
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = redis_config(&mock, redis);
    f(&mut cfg);
    let a = Harness::start_config(mock.clone(), cfg.clone()).await;
    let b = Harness::start_config(mock, cfg).await;
    (a, b)
}

async fn chat(h: &Harness, sid: &str, body: &Value) -> (String, Value) {
    let (id, resp) = h.chat_ok("sk-a", sid, body).await;
    (id, resp.json().await.unwrap())
}

async fn view(h: &Harness, sid: &str) -> Value {
    let r = h
        .client
        .get(h.url(&format!("/admin/sessions/{sid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn contents(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Six turns alternating between two instances, then the history at both and at a third starting cold.
async fn alternate(cfg: Config, mock: MockUpstream) {
    let a = Harness::start_config(mock.clone(), cfg.clone()).await;
    let b = Harness::start_config(mock.clone(), cfg.clone()).await;
    let mut history = vec![json!({"role":"system","content":"be brief"})];
    let mut sid = String::new();
    let mut expected = vec!["be brief".to_string()];
    for turn in 1..=6 {
        let h = if turn % 2 == 1 { &a } else { &b };
        let q = format!("question {turn}");
        history.push(json!({"role":"user","content": q}));
        h.mock
            .push(MockReply::completion(&format!("answer {turn}")));
        let (id, v) = chat(h, "conv-1", &json!({"model":"gpt-4o","messages":history})).await;
        history.push(v["choices"][0]["message"].clone());
        expected.extend([q, format!("answer {turn}")]);
        if turn > 1 {
            assert_eq!(id, sid, "both instances name the session alike");
        }
        sid = id;
    }
    a.state.drain().await;
    b.state.drain().await;
    let c = Harness::start_config(mock, cfg).await;
    for h in [&a, &b, &c] {
        let v = view(h, &sid).await;
        assert_eq!(contents(&v), expected);
        assert_eq!(v["message_count"], 13);
        assert!(v["branches"].as_array().unwrap().is_empty(), "{v}");
    }
}

#[tokio::test]
async fn turns_alternating_between_two_instances_keep_one_complete_history() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    alternate(redis_config(&mock, &redis), mock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_alternating_between_two_instances_on_a_redis_cluster() {
    let Some(cluster) = tokio::task::spawn_blocking(common::redis::RedisCluster::start)
        .await
        .unwrap()
    else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Redis;
    cfg.store.redis_cluster_nodes = cluster.urls();
    alternate(cfg, mock).await;
    drop(cluster);
}

#[tokio::test]
async fn a_turn_on_one_instance_sees_what_another_appended_since() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = pair(&redis, |_| {}).await;
    // B caches the session at its first turn; A then appends a branch B never saw.
    let first = json!([{"role":"user","content":"start"}]);
    let (sid, _) = chat(&b, "conv-2", &json!({"model":"gpt-4o","messages":first})).await;
    let edited = json!([{"role":"user","content":"start over"}]);
    a.mock.push(MockReply::completion("from A"));
    chat(&a, "conv-2", &json!({"model":"gpt-4o","messages":edited})).await;
    a.state.drain().await;
    // B's cached entry catches up: A's branch (and its newer head) are there without a reload.
    let v = view(&b, &sid).await;
    assert_eq!(contents(&v), ["start over", "from A"]);
    assert_eq!(v["branches"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["message_count"], 2,
        "the history's length, not every stored node"
    );
}

#[tokio::test]
async fn a_recall_on_one_instance_finds_a_result_first_seen_on_another() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = pair(&redis, |c| c.context.default_context_window = 8_000).await;
    let tools =
        json!([{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]);
    // B knows the session first (a small turn), then A records a long run whose results B never saw (both under
    // another model, whose window is large: the mock's token counts calibrate no estimate for mock-model).
    let opening = common::agent_history(0, 0);
    b.mock.push(MockReply::completion("ok"));
    let (sid, _) = chat(
        &b,
        "recall-x",
        &json!({"model":"gpt-4o","messages":opening,"tools":tools}),
    )
    .await;
    a.mock.push(MockReply::completion("read them"));
    chat(
        &a,
        "recall-x",
        &json!({"model":"gpt-4o","messages":common::agent_history(14, 300),"tools":tools}),
    )
    .await;
    a.state.drain().await;
    // On B the agent continues on another branch (the same calls with other results, as large): the model searches
    // the session's history for a result only A's run had.
    let mut other = common::agent_history(14, 300);
    for m in other.iter_mut() {
        let s = m
            .to_string()
            .replace("line", "text")
            .replace("MARKER-", "OTHER-");
        *m = serde_json::from_str(&s).unwrap();
    }
    let search = json!({"id":"r1","type":"function","function":{"name":"search_history","arguments":json!({"query":"MARKER-5 line7"}).to_string()}});
    b.mock.push(MockReply::message(
        json!({"role":"assistant","content":null,"tool_calls":[search]}),
        "tool_calls",
    ));
    b.mock.push(MockReply::completion("found it"));
    let n = b.mock.requests().len();
    let (id, v) = chat(
        &b,
        "recall-x",
        &json!({"model":"mock-model","messages":other,"tools":tools}),
    )
    .await;
    assert_eq!(id, sid);
    assert_eq!(v["choices"][0]["message"]["content"], "found it");
    let asked = b.mock.requests()[n + 1].json();
    let answer = asked["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tool_call_id"] == "r1")
        .cloned()
        .unwrap();
    let found: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
    assert_eq!(found["matches"][0]["call_id"], "call_5", "{found}");
    assert!(
        found["matches"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("MARKER-5"),
        "B answered from A's result: {found}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_turns_on_two_instances_lose_nothing() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = pair(&redis, |_| {}).await;
    // The session exists first, on A.
    let system = json!({"role":"system","content":"shared"});
    let (sid, _) = chat(
        &a,
        "busy",
        &json!({"model":"gpt-4o","messages":[system, {"role":"user","content":"u-init"}]}),
    )
    .await;
    let a = std::sync::Arc::new(a);
    let b = std::sync::Arc::new(b);
    let mut tasks = Vec::new();
    for i in 0..32 {
        let h = if i % 2 == 0 { a.clone() } else { b.clone() };
        let system = system.clone();
        tasks.push(tokio::spawn(async move {
            let msgs = json!([system, {"role":"user","content": format!("u{i}")}]);
            chat(&h, "busy", &json!({"model":"gpt-4o","messages":msgs}))
                .await
                .0
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), sid);
    }
    a.state.drain().await;
    b.state.drain().await;
    // 1 system + 33 questions + 33 replies, at both instances and in the stored row: one history of 3 messages
    // (its length is `message_count`) and 32 branches.
    let (list, _) = a.state.sessions.list(10, 0).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].message_count, 3);
    for h in [&a, &b] {
        let v = view(h, &sid).await;
        assert_eq!(v["message_count"], 3, "{}", h.addr);
        assert_eq!(v["messages"].as_array().unwrap().len(), 3, "{}", h.addr);
        let mut users: Vec<String> = v["branches"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|br| br["messages"].as_array().unwrap().clone())
            .chain(v["messages"].as_array().unwrap().clone())
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect();
        users.sort();
        users.dedup();
        assert_eq!(users.len(), 33, "every question is there");
    }
}

/// The sum of a metric's series whose labels contain `labels`.
fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_mid_run_degrades_to_proxying_and_history_resumes_after_it_restarts() {
    let Some(mut redis) = RedisServer::start_persistent() else {
        return;
    };
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = redis_config(&mock, &redis);
    cfg.store.timeout_ms = 300;
    let h = Harness::start_config(mock.clone(), cfg.clone()).await;
    let ready = |h: &Harness| {
        let req = h.client.get(h.url("/readyz"));
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(ready(&h).await.0, 200);
    let mut history = vec![json!({"role":"system","content":"be brief"})];
    let turn = |h: &Harness, n: usize, history: &mut Vec<Value>| {
        history.push(json!({"role":"user","content": format!("question {n}")}));
        h.mock.push(MockReply::completion(&format!("answer {n}")));
        let body = json!({"model":"gpt-4o","messages":history.clone()});
        let req = h
            .client
            .post(h.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-a")
            .header("x-session-id", "outage")
            .json(&body);
        async move {
            let started = std::time::Instant::now();
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let sid = r
                .headers()
                .get("x-ctxgate-session")
                .map(|v| v.to_str().unwrap().to_string());
            let v: Value = r.json().await.unwrap();
            (sid, v["choices"][0]["message"].clone(), started.elapsed())
        }
    };
    let (sid, reply, _) = turn(&h, 1, &mut history).await;
    let sid = sid.unwrap();
    history.push(reply);
    h.state.drain().await;

    // Redis goes away: requests are still answered (plain proxying), within the store timeout; /healthz and /readyz
    // stay 200, /readyz says why it is degraded; the failures are counted.
    redis.stop();
    for n in 2..=3 {
        let (_, reply, took) = turn(&h, n, &mut history).await;
        assert!(
            took < std::time::Duration::from_secs(3),
            "turn {n} took {took:?}"
        );
        history.push(reply);
    }
    let health = h.client.get(h.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let (status, why) = ready(&h).await;
    assert_eq!(status, 200);
    assert_eq!(why["status"], "degraded");
    assert_eq!(why["circuit"], "open");
    assert_eq!(why["store"], "redis");
    assert!(!why["reason"].as_str().unwrap().is_empty());
    let m = h.metrics_text().await;
    assert!(
        metric_sum(&m, "ctxgate_store_errors_total", r#"backend="redis""#) >= 1.0,
        "store errors are counted"
    );

    // Redis is back (with its data): ready again without a restart of ctxgate, and the history resumes — the
    // turns answered during the outage are recorded from the client's next request, which carries them.
    redis.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while ready(&h).await.1["status"] != "ready" {
        assert!(std::time::Instant::now() < deadline, "not ready again");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (sid4, reply, _) = turn(&h, 4, &mut history).await;
    assert_eq!(sid4.as_deref(), Some(sid.as_str()));
    history.push(reply);
    h.state.drain().await;
    let c = Harness::start_config(mock.clone(), cfg).await;
    let v = view(&c, &sid).await;
    let expected: Vec<String> = history
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(contents(&v), expected);
}

// --- summaries across instances ---------------------------------------------------------------------------------

const SUMMARIZER: &str = "summarizer-model";

/// Summary requests answered with `text` after `delay`; everything else as usual.
fn summarizer(mock: &MockUpstream, text: &'static str, delay: std::time::Duration) {
    mock.set_responder(std::sync::Arc::new(
        move |r: &ctxgate::mock::RecordedRequest| {
            (r.json()["model"] == SUMMARIZER).then(|| MockReply::completion(text).delayed(delay))
        },
    ));
}

fn summary_config(c: &mut Config) {
    c.context.default_context_window = 4_000; // support_chat(8) is over the threshold
    c.summary.model = Some(SUMMARIZER.into());
    c.summary.wait_ms = 5_000;
    c.summary.keep_recent = 4;
}

async fn send_sum(h: &Harness, messages: &[Value]) {
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-sum")
        .header("x-session-id", "sum-x")
        .json(&json!({"model":"mock-model","messages":messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// What the mock received: (summary requests, chat requests).
fn split_requests(mock: &MockUpstream) -> (Vec<Value>, Vec<Value>) {
    mock.requests()
        .iter()
        .map(|r| r.json())
        .partition(|v| v["model"] == SUMMARIZER)
}

const SUMMARY_MESSAGE: &str = "Summary of the earlier conversation: S-A";

/// Whether a sent message is ctxgate's summary (the recall note may ride at its end: strict role order).
fn is_summary(m: &Value) -> bool {
    m["role"] == "assistant"
        && m["content"].as_str().is_some_and(|c| {
            c == SUMMARY_MESSAGE || c.starts_with(&format!("{SUMMARY_MESSAGE}\n\n[ctxgate] "))
        })
}

#[tokio::test]
async fn a_summary_written_by_one_instance_is_used_by_another() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = pair(&redis, summary_config).await;
    summarizer(&a.mock, "S-A", std::time::Duration::ZERO);
    let mut m = support_chat(8);
    send_sum(&a, &m).await;
    a.state.drain().await;
    // B's turn (its first: the session is loaded from Redis, the summary with it).
    m.push(json!({"role":"assistant","content":"mock reply"}));
    m.push(json!({"role":"user","content":"thanks"}));
    send_sum(&b, &m).await;
    let (summaries, chats) = split_requests(&a.mock);
    assert_eq!(summaries.len(), 1, "B wrote no summary of its own");
    // After the system prompt, the task (pinned), then the summary.
    assert_eq!(chats[1]["messages"][1], m[1]);
    assert!(
        is_summary(&chats[1]["messages"][2]),
        "{}",
        chats[1]["messages"][2]
    );
    // A later turn on B, the session now cached there: the same summary, no new summary request.
    m.push(json!({"role":"assistant","content":"mock reply"}));
    m.push(json!({"role":"user","content":"one more"}));
    send_sum(&b, &m).await;
    let (summaries, chats) = split_requests(&a.mock);
    assert_eq!(summaries.len(), 1);
    assert!(
        is_summary(&chats[2]["messages"][2]),
        "{}",
        chats[2]["messages"][2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_summary_in_progress_on_one_instance_is_awaited_by_the_other() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = pair(&redis, summary_config).await;
    // Both instances know the session (a small first turn each, under another model: no calibration).
    let opening = support_chat(0);
    for h in [&a, &b] {
        let r = h
            .client
            .post(h.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-sum")
            .header("x-session-id", "sum-x")
            .json(&json!({"model":"gpt-4o","messages":opening}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    a.state.drain().await;
    b.state.drain().await;
    // Then both cross the threshold at once; the summary takes a while.
    summarizer(&a.mock, "S-A", std::time::Duration::from_millis(600));
    let m = support_chat(8);
    tokio::join!(send_sum(&a, &m), send_sum(&b, &m));
    let (summaries, chats) = split_requests(&a.mock);
    assert_eq!(summaries.len(), 1, "one summary for both instances");
    let crossing: Vec<&Value> = chats
        .iter()
        .filter(|c| c["model"] == "mock-model")
        .collect();
    assert_eq!(crossing.len(), 2);
    for c in crossing {
        assert!(
            is_summary(&c["messages"][2]),
            "each instance waited for the summary (summary.wait_ms): {}",
            c["messages"][2]
        );
    }
}
