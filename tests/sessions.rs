//! Sessions through the HTTP gateway: durable history, restart, tenants, deletion, streams, partial replies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bytes::Bytes;
use common::{session_header, test_config, Harness};
use ctxgate::config::StoreBackend;
use ctxgate::mock::{chunk, MockReply, MockUpstream};
use serde_json::{json, Value};
use std::time::Duration;

async fn chat(
    h: &Harness,
    key: &str,
    sid: Option<&str>,
    messages: &Value,
    stream: bool,
) -> (String, Value) {
    let body = json!({"model": "gpt-4o", "messages": messages, "stream": stream});
    let resp = h.chat_as(key, sid, &body).await;
    let id = session_header(&resp);
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (id, v)
}

async fn admin(h: &Harness, path: &str) -> reqwest::Response {
    h.client.get(h.url(path)).send().await.unwrap()
}

fn contents(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn three_turns_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctx.db");
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = db.clone();
    let mut h = Harness::start_config(mock.clone(), cfg.clone()).await;
    let mut history = vec![json!({"role":"system","content":"be brief"})];
    let mut sid = String::new();
    for turn in 1..=3 {
        history.push(json!({"role":"user","content": format!("question {turn}")}));
        mock.push(MockReply::completion(&format!("answer {turn}")));
        let (id, v) = chat(
            &h,
            "sk-a",
            Some("conv-1"),
            &Value::Array(history.clone()),
            false,
        )
        .await;
        history.push(v["choices"][0]["message"].clone());
        sid = id;
    }
    h.stop().await;
    drop(h);

    let h = Harness::start_config(mock, cfg).await;
    let v: Value = admin(&h, &format!("/admin/sessions/{sid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        contents(&v),
        [
            "be brief",
            "question 1",
            "answer 1",
            "question 2",
            "answer 2",
            "question 3",
            "answer 3"
        ]
    );
    assert_eq!(v["id"], sid);
    assert_eq!(v["branches"], json!([]));
    assert_eq!(v["compressions"], json!([]));
    let loops = v["run_loops"].as_array().unwrap();
    assert_eq!(loops.len(), 3, "one run loop per question");
    assert_eq!(loops[1]["user"], "question 2");
    assert_eq!(loops[1]["final_reply"], "answer 2");
    assert_eq!(
        (loops[1]["start"].as_u64(), loops[1]["end"].as_u64()),
        (Some(3), Some(5))
    );
    let list: Value = admin(&h, "/admin/sessions").await.json().await.unwrap();
    assert_eq!(list["total"], 1);
    assert_eq!(list["sessions"][0]["id"], sid);
    assert_eq!(list["sessions"][0]["message_count"], 7);
}

#[tokio::test]
async fn tenants_with_the_same_session_id_are_isolated() {
    let h = Harness::start().await;
    let m = |t: &str| json!([{"role":"user","content": t}]);
    let (a, _) = chat(&h, "sk-tenant-a", Some("shared"), &m("from a"), false).await;
    let (b, _) = chat(&h, "sk-tenant-b", Some("shared"), &m("from b"), false).await;
    assert_ne!(a, b);
    let va: Value = admin(&h, &format!("/admin/sessions/{a}"))
        .await
        .json()
        .await
        .unwrap();
    let vb: Value = admin(&h, &format!("/admin/sessions/{b}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(contents(&va), ["from a", "mock reply"]);
    assert_eq!(contents(&vb), ["from b", "mock reply"]);
    // same opening without a header: fingerprints differ by tenant too
    let (fa, _) = chat(&h, "sk-tenant-a", None, &m("same"), false).await;
    let (fb, _) = chat(&h, "sk-tenant-b", None, &m("same"), false).await;
    assert_ne!(fa, fb);
    let body = serde_json::to_string(
        &admin(&h, "/admin/sessions")
            .await
            .json::<Value>()
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(
        !body.contains("sk-tenant"),
        "credentials must never be exposed"
    );
}

#[tokio::test]
async fn delete_removes_the_session() {
    let h = Harness::start().await;
    let (id, _) = chat(
        &h,
        "sk",
        Some("gone"),
        &json!([{"role":"user","content":"x"}]),
        false,
    )
    .await;
    assert_eq!(
        admin(&h, &format!("/admin/sessions/{id}")).await.status(),
        200
    );
    let resp = h
        .client
        .delete(h.url(&format!("/admin/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        admin(&h, &format!("/admin/sessions/{id}")).await.status(),
        404
    );
    let resp = h
        .client
        .delete(h.url(&format!("/admin/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn streamed_reply_is_recorded_whole_and_regenerate_is_a_branch() {
    let h = Harness::start().await;
    let msgs = json!([{"role":"user","content":"stream please"}]);
    h.mock
        .push(MockReply::sse_text(&["Hello", ", ", "world"], true));
    let (id, _) = chat(&h, "sk", Some("s"), &msgs, true).await;
    // the reply is committed before the client gets [DONE]: visible at once
    let v: Value = admin(&h, &format!("/admin/sessions/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(contents(&v), ["stream please", "Hello, world"]);
    assert_eq!(v["partial"], json!([]));
    // regenerate: same request, new answer → the old one becomes another branch
    h.mock.push(MockReply::completion("second try"));
    chat(&h, "sk", Some("s"), &msgs, false).await;
    let v: Value = admin(&h, &format!("/admin/sessions/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(contents(&v), ["stream please", "second try"]);
    assert_eq!(v["branches"][0]["messages"][0]["content"], "Hello, world");
    assert_eq!(v["branches"][0]["diverges_at"], 1);
    assert_eq!(
        v["message_count"], 2,
        "the history's length (3 messages stored)"
    );
}

#[tokio::test]
async fn client_disconnect_is_recorded_as_partial() {
    let h = Harness::start().await;
    h.mock.push(MockReply::Sse {
        chunks: vec![(
            Duration::ZERO,
            Bytes::from(format!(
                "data: {}\n\n",
                chunk(json!({"role":"assistant","content":"half an"}), None)
            )),
        )],
        stall_after: true,
    });
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("x-session-id", "p")
        .json(&json!({"model":"m","stream":true,"messages":[{"role":"user","content":"q"}]}))
        .send()
        .await
        .unwrap();
    let id = session_header(&resp);
    let mut body = resp.bytes_stream();
    use futures_util::StreamExt;
    body.next().await.unwrap().unwrap();
    drop(body);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let v: Value = admin(&h, &format!("/admin/sessions/{id}"))
            .await
            .json()
            .await
            .unwrap();
        if v["messages"].as_array().unwrap().len() == 2 {
            assert_eq!(v["messages"][1]["content"], "half an");
            assert_eq!(v["partial"], json!([1]));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "partial reply not recorded: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn concurrent_requests_on_one_session_lose_nothing() {
    let h = Harness::start().await;
    let base = vec![
        json!({"role":"system","content":"s"}),
        json!({"role":"user","content":"go"}),
    ];
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mut m = base.clone();
        m.push(json!({"role":"assistant","content":"ok"}));
        m.push(json!({"role":"user","content": format!("parallel {i}")}));
        let client = h.client.clone();
        let url = h.url("/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            client
                .post(url)
                .header("x-session-id", "par")
                .json(&json!({"model":"m","messages":m}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let list: Value = admin(&h, "/admin/sessions").await.json().await.unwrap();
    let id = list["sessions"][0]["id"].as_str().unwrap().to_string();
    let v: Value = admin(&h, &format!("/admin/sessions/{id}"))
        .await
        .json()
        .await
        .unwrap();
    // s, go, ok shared once; 16 user messages, each with one reply (identical replies under different parents):
    // one of them the history (its length is `message_count`), the other 15 branches.
    assert_eq!(v["message_count"], 5);
    assert_eq!(v["messages"].as_array().unwrap().len(), 5);
    assert_eq!(v["branches"].as_array().unwrap().len(), 15);
}

#[tokio::test]
async fn admin_requires_the_token_when_one_is_set() {
    let h = Harness::start_with(|c| c.admin.token = Some("admin-secret-token".into())).await;
    assert_eq!(admin(&h, "/admin/sessions").await.status(), 401);
    let bad = h
        .client
        .get(h.url("/admin/sessions"))
        .bearer_auth("wrong-token-xx")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);
    let ok = h
        .client
        .get(h.url("/admin/sessions"))
        .bearer_auth("admin-secret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

/// Store write batches recorded so far (the memory backend observes one per batch).
async fn store_writes(h: &Harness) -> f64 {
    let text = h
        .client
        .get(h.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("ctxgate_store_operation_duration_seconds_count")
                && l.contains("operation=\"write\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An identical resend (a retry) adds no message: only the reply's batch is written (the request's, which would
/// only move the row's head and activity, is left to it), and the history and row stay right.
#[tokio::test]
async fn an_identical_resend_writes_one_batch() {
    let h = Harness::start().await;
    let msgs = json!([{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]);
    // (A turn's answer is released once its writes are committed: no need to wait for the store.)
    let (sid, _) = chat(&h, "sk-resend", Some("resend"), &msgs, false).await;
    let before = store_writes(&h).await;
    chat(&h, "sk-resend", Some("resend"), &msgs, false).await;
    assert_eq!(
        store_writes(&h).await - before,
        1.0,
        "the reply's batch only"
    );
    let v: Value = admin(&h, &format!("/admin/sessions/{sid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(contents(&v), ["be brief", "hello", "mock reply"]);
    assert_eq!(v["message_count"], 3);
    // A request that adds a message still writes it at once (before the upstream answers).
    let before = store_writes(&h).await;
    let more = json!([{"role":"system","content":"be brief"},{"role":"user","content":"hello"},
        {"role":"assistant","content":"mock reply"},{"role":"user","content":"again"}]);
    chat(&h, "sk-resend", Some("resend"), &more, false).await;
    assert_eq!(
        store_writes(&h).await - before,
        2.0,
        "the request's batch and the reply's"
    );
}

/// Sixteen requests of one conversation in flight together, launched newest first, so that the shortest (a
/// prefix of the others, whose reply is already stored) finishes last: the history stays the longest one, before
/// and after a restart, and `message_count` is always the history's length.
#[tokio::test]
async fn a_prefix_answered_last_never_rewinds_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = dir.path().join("ctx.db");
    let mut h = Harness::start_config(mock.clone(), cfg.clone()).await;
    // Request k: the system prompt, k earlier questions each with the mock's answer, then question k.
    let request = |k: usize| {
        let mut m = vec![json!({"role":"system","content":"s"})];
        for i in 0..k {
            m.push(json!({"role":"user","content": format!("q{i}")}));
            m.push(json!({"role":"assistant","content":"mock reply"}));
        }
        m.push(json!({"role":"user","content": format!("q{k}")}));
        Value::Array(m)
    };
    for _ in 0..16 {
        mock.push(MockReply::completion("mock reply").delayed(Duration::from_millis(300)));
    }
    let mut tasks = Vec::new();
    for k in (0..16).rev() {
        let client = h.client.clone();
        let url = h.url("/v1/chat/completions");
        let body = json!({"model": "gpt-4o", "messages": request(k)});
        tasks.push(tokio::spawn(async move {
            let resp = client
                .post(url)
                .header("x-session-id", "rewind")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            session_header(&resp)
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut sid = String::new();
    for t in tasks {
        sid = t.await.unwrap();
    }
    // The longest request (31 messages) and its answer.
    let expected = 2 * 15 + 2 + 1;
    let check = |v: &Value| {
        assert_eq!(v["messages"].as_array().unwrap().len(), expected, "{v}");
        assert_eq!(v["message_count"], expected);
        assert_eq!(v["messages"][expected - 2]["content"], "q15");
    };
    check(
        &admin(&h, &format!("/admin/sessions/{sid}"))
            .await
            .json()
            .await
            .unwrap(),
    );
    h.stop().await;
    drop(h);
    let h = Harness::start_config(mock, cfg).await;
    check(
        &admin(&h, &format!("/admin/sessions/{sid}"))
            .await
            .json()
            .await
            .unwrap(),
    );
    let list: Value = admin(&h, "/admin/sessions").await.json().await.unwrap();
    assert_eq!(list["sessions"][0]["message_count"], expected);
}

/// One session id used from chat, Anthropic and Responses requests (same credentials): each dialect keeps its own
/// session, `<id>.<dialect>` for the ones after the first, and every view holds its own dialect's messages.
#[tokio::test]
async fn one_id_in_three_dialects_keeps_three_sessions() {
    let h = Harness::start().await;
    let send = |path: &str, body: Value| {
        h.client
            .post(h.url(path))
            .header("authorization", "Bearer sk-same")
            .header("x-session-id", "shared")
            .json(&body)
            .send()
    };
    let chat = send(
        "/v1/chat/completions",
        json!({"model":"gpt-4o","messages":[{"role":"user","content":"from chat"}]}),
    )
    .await
    .unwrap();
    let anthropic = send(
        "/v1/messages",
        json!({"model":"claude-sonnet-4-5","max_tokens":64,
               "messages":[{"role":"user","content":[{"type":"text","text":"from anthropic"}]}]}),
    )
    .await
    .unwrap();
    let responses = send(
        "/v1/responses",
        json!({"model":"gpt-5","input":[{"role":"user","content":[{"type":"input_text","text":"from responses"}]}]}),
    )
    .await
    .unwrap();
    let (c, a, r) = (
        session_header(&chat),
        session_header(&anthropic),
        session_header(&responses),
    );
    for resp in [chat, anthropic, responses] {
        assert_eq!(resp.status(), 200);
        resp.text().await.unwrap();
    }
    assert!(c.ends_with("-shared"), "{c}");
    assert_eq!(a, format!("{c}.anthropic"));
    assert_eq!(r, format!("{c}.responses"));
    h.state.sessions.flush().await.unwrap();
    for (sid, dialect, first) in [
        (&c, "chat", "from chat"),
        (&a, "anthropic", "from anthropic"),
        (&r, "responses", "from responses"),
    ] {
        let v: Value = admin(&h, &format!("/admin/sessions/{sid}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(v["dialect"], dialect, "{v}");
        assert_eq!(v["message_count"], 2, "{v}");
        assert!(v.to_string().contains(first), "{v}");
        for other in ["from chat", "from anthropic", "from responses"] {
            assert!(
                other == first || !v.to_string().contains(other),
                "{sid} holds {other}: {v}"
            );
        }
    }
    // The scoped id sent back is a fixed point: the Anthropic session continues.
    let again = h
        .client
        .post(h.url("/v1/messages"))
        .header("authorization", "Bearer sk-same")
        .header("x-session-id", &a)
        .json(&json!({"model":"claude-sonnet-4-5","max_tokens":64,
               "messages":[{"role":"user","content":[{"type":"text","text":"from anthropic"}]},
                           {"role":"assistant","content":[{"type":"text","text":"mock reply"}]},
                           {"role":"user","content":"more"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(session_header(&again), a);
}

/// The admin API takes the id a client sent: exactly one session with that raw id (any tenant) is found by it;
/// several are listed in the 404; none points at `?q=`.
#[tokio::test]
async fn the_admin_api_finds_a_session_by_the_id_the_client_sent() {
    let h = Harness::start().await;
    let msgs = json!([{"role":"user","content":"hello"}]);
    let (solo, _) = chat(&h, "sk-a", Some("solo"), &msgs, false).await;
    assert!(solo.ends_with("-solo") && solo != "solo", "{solo}");
    let (twin_a, _) = chat(&h, "sk-a", Some("twin"), &msgs, false).await;
    let (twin_b, _) = chat(&h, "sk-b", Some("twin"), &msgs, false).await;
    h.state.sessions.flush().await.unwrap();
    let v: Value = admin(&h, "/admin/sessions/solo")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["id"], solo);
    assert_eq!(admin(&h, "/admin/sessions/solo/turns").await.status(), 200);
    assert_eq!(admin(&h, "/admin/sessions/solo/export").await.status(), 200);
    let many = admin(&h, "/admin/sessions/twin").await;
    assert_eq!(many.status(), 404);
    let text = many.text().await.unwrap();
    assert!(
        text.contains("2 sessions") && text.contains(&twin_a) && text.contains(&twin_b),
        "{text}"
    );
    let none = admin(&h, "/admin/sessions/nobody").await;
    assert_eq!(none.status(), 404);
    assert!(none.text().await.unwrap().contains("?q=nobody"));
    // The full id still works, and a delete by the raw id removes the one session.
    assert_eq!(
        admin(&h, &format!("/admin/sessions/{twin_a}"))
            .await
            .status(),
        200
    );
    let del = h
        .client
        .delete(h.url("/admin/sessions/solo"))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    assert_eq!(
        admin(&h, &format!("/admin/sessions/{solo}")).await.status(),
        404
    );
}

/// A long session is shown a page at a time (issue 36, finding 7c: a 400k-message session was answered whole, 46 MB
/// at 1.08 GB RSS): `messages`, `ids`, `partial` and `run_loops` of the page asked for (`limit`, `offset`; by default
/// the first 500), `total` for the client to page on, each branch's messages at most a page; the pages together
/// are the whole history.
#[tokio::test]
async fn a_long_session_is_shown_a_page_at_a_time() {
    let h = Harness::start().await;
    let long = |edit: &str| -> Value {
        let mut m: Vec<Value> = (0..1_200)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                json!({"role": role, "content": format!("message {i} {}", "x".repeat(200))})
            })
            .collect();
        m[1]["content"] = json!(edit);
        Value::Array(m)
    };
    h.mock.push(MockReply::completion("first"));
    let (sid, _) = chat(&h, "sk-a", Some("long"), &long("original"), false).await;
    h.mock.push(MockReply::completion("second"));
    chat(&h, "sk-a", Some("long"), &long("edited"), false).await;
    h.state.drain().await;

    let whole = h.state.sessions.view(&sid).await.unwrap().unwrap();
    assert_eq!(whole.messages.len(), 1_201);
    let r = admin(&h, &format!("/admin/sessions/{sid}")).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (&v["total"], &v["offset"], &v["limit"]),
        (&json!(1_201), &json!(0), &json!(500)),
        "the page and the total"
    );
    assert_eq!(v["messages"].as_array().unwrap().len(), 500);
    assert_eq!(v["ids"].as_array().unwrap().len(), 500);
    let branch = &v["branches"][0];
    assert_eq!(branch["diverges_at"], 1);
    assert_eq!(branch["length"], 1_201);
    assert_eq!(
        branch["messages"].as_array().unwrap().len(),
        500,
        "a branch shows at most a page"
    );
    // The whole view (what this route answered before it was paged) is more than twice the page.
    let whole_bytes = serde_json::to_string(&whole).unwrap().len();
    assert!(
        text.len() * 2 < whole_bytes,
        "the answer ({} bytes) is a page, not the whole view ({whole_bytes} bytes)",
        text.len()
    );

    // Paged through, the pages are the history, in order, with their ids and run loops where they are.
    let (mut messages, mut ids) = (Vec::new(), Vec::new());
    let mut offset = 0;
    loop {
        let v = h
            .get_json(&format!("/admin/sessions/{sid}?limit=300&offset={offset}"))
            .await;
        assert_eq!(v["total"], 1_201);
        let page = v["messages"].as_array().unwrap();
        if page.is_empty() {
            break;
        }
        for l in v["run_loops"].as_array().unwrap() {
            let start = l["start"].as_u64().unwrap();
            assert!(start >= offset && start < offset + 300, "{l}");
        }
        messages.extend(page.iter().cloned());
        ids.extend(v["ids"].as_array().unwrap().iter().cloned());
        offset += page.len() as u64;
    }
    assert_eq!(messages, whole.messages);
    assert_eq!(ids, json!(whole.ids).as_array().unwrap().clone());
    assert_eq!(messages[1]["content"], "edited");

    for (query, param) in [
        ("limit=0", "limit"),
        ("limit=5001", "limit"),
        ("offset=-1", "offset"),
    ] {
        let r = admin(&h, &format!("/admin/sessions/{sid}?{query}")).await;
        assert_eq!(r.status(), 400, "{query}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{query}");
    }
}
