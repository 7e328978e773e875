//! Server limits against misbehaving or too many clients: header and body read deadlines, `max_in_flight`,
//! `max_connections`, bounded buffering for a client that stops reading, and non-POST chat methods passed through.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::Logged;

use common::{read_until_closed, session_header, Harness};
use ctxgate::mock::MockReply;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn slow_headers_are_cut_off() {
    let h = Harness::start_with(|c| c.server.header_read_timeout_secs = 1).await;
    // headers started, never finished
    let mut partial = TcpStream::connect(h.addr).await.unwrap();
    partial
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n",
        )
        .await
        .unwrap();
    // a connection that never sends a byte
    let mut silent = TcpStream::connect(h.addr).await.unwrap();
    let (_, closed) = read_until_closed(&mut partial, Duration::from_secs(8)).await;
    assert!(closed, "a client stuck in its headers is disconnected");
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(8)).await;
    assert!(closed, "a silent client is disconnected");
    // the server still serves others
    let ok = h.client.get(h.url("/healthz")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn a_slow_chat_body_gets_408_in_openai_shape() {
    let h = Harness::start_with(|c| c.server.body_read_timeout_secs = 1).await;
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":\"m\",",
    )
    .await
    .unwrap();
    let (text, _) = read_until_closed(&mut tcp, Duration::from_secs(8)).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "request_timeout");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(h.mock.requests().is_empty(), "nothing went upstream");
}

/// Twice `max_in_flight` connections send a chat request's headers and then one byte of its body a second (no
/// credentials needed), and as many do so on a passthrough path: they hold no in-flight slot (a conversation request
/// takes one once its body has arrived; a passthrough one when its body, streamed to the upstream, ends), so a
/// normal client keeps being answered while they trickle; each chat one still gets its 408 at the body deadline.
#[tokio::test]
async fn slow_bodies_hold_no_slot_and_a_normal_client_keeps_being_answered() {
    const SLOTS: usize = 4;
    let h = Harness::start_with(|c| {
        c.server.max_in_flight = SLOTS;
        c.server.body_read_timeout_secs = 6;
    })
    .await;
    let mut slow = Vec::new();
    let mut passthrough = Vec::new();
    for _ in 0..2 * SLOTS {
        let mut tcp = TcpStream::connect(h.addr).await.unwrap();
        tcp.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{",
        )
        .await
        .unwrap();
        slow.push(tcp);
        let mut tcp = TcpStream::connect(h.addr).await.unwrap();
        tcp.write_all(
            b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{",
        )
        .await
        .unwrap();
        passthrough.push(tcp);
    }
    let trickle = tokio::spawn(async move {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for tcp in slow.iter_mut().chain(passthrough.iter_mut()) {
                let _ = tcp.write_all(b" ").await;
            }
        }
        slow
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body =
        json!({"model":"mock-model","messages":[{"role":"user","content":"hi"}]}).to_string();
    for i in 0..6 {
        let r = h.post_chat(body.clone()).await;
        assert_eq!(r.status(), 200, "request {i} while slow bodies trickle");
        let models = h.client.get(h.url("/v1/models")).send().await.unwrap();
        assert_eq!(
            models.status(),
            200,
            "passthrough {i} while slow bodies trickle"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut slow = trickle.await.unwrap();
    // The trickling clients get their 408 at the body deadline, each.
    for tcp in &mut slow {
        let (text, _) = read_until_closed(tcp, Duration::from_secs(10)).await;
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    }
}

/// A conversation request of many tiny messages (here 30,000, over the default `server.max_messages` of 20,000;
/// a body of 1.2 MB that the gateway once parsed into ~75 MB, and 400,000 of them into 0.89 GB) is refused with
/// 413 naming the limit before it is parsed, in its API's shape; four at once change nothing for another tenant,
/// whose turns keep being answered and stored; nothing of theirs reaches the upstream or the store.
#[tokio::test]
async fn a_request_of_too_many_messages_is_413_before_parsing_and_others_are_served() {
    let h = Harness::start().await;
    let many: Vec<Value> = (0..30_000)
        .map(|i| json!({"role":"user","content":format!("m{i}")}))
        .collect();
    let chat = json!({"model":"mock-model","messages":many}).to_string();
    let anthropic = json!({"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":
        (0..30_000).map(|i| json!({"type":"text","text":format!("b{i}")})).collect::<Vec<_>>()}]})
    .to_string();
    let big = (0..4).map(|k| {
        let (path, body) = if k % 2 == 0 {
            ("/v1/chat/completions", chat.clone())
        } else {
            ("/v1/messages", anthropic.clone())
        };
        h.client
            .post(h.url(path))
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .header("authorization", format!("Bearer attacker-{k}"))
            .body(body)
            .send()
    });
    let victim = async {
        let mut ids = Vec::new();
        for i in 0..5 {
            let r = h
                .client
                .post(h.url("/v1/chat/completions"))
                .header("authorization", "Bearer victim")
                .json(&json!({"model":"mock-model","messages":[{"role":"user","content":format!("q{i}")}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            ids.push(session_header(&r));
        }
        ids
    };
    let (answers, ids) = tokio::join!(futures_util::future::join_all(big), victim);
    for (k, r) in answers.into_iter().enumerate() {
        let r = r.unwrap();
        assert_eq!(r.status(), 413, "request {k}");
        assert!(r.headers().get("x-ctxgate-session").is_none());
        let e: Value = r.json().await.unwrap();
        let text = e.to_string();
        // 30,000 messages, or one message and its 30,000 blocks
        let counted = if k % 2 == 0 { "30000" } else { "30001" };
        assert!(
            text.contains("server.max_messages") && text.contains(counted),
            "{text}"
        );
        let kind = if k % 2 == 0 {
            &e["error"]["code"]
        } else {
            &e["error"]["type"]
        };
        assert_eq!(kind, "request_too_large", "{text}");
    }
    assert_eq!(
        h.mock.requests().len(),
        5,
        "only the victim's turns went upstream"
    );
    h.state.drain().await;
    for id in ids {
        assert!(h.state.sessions.view(&id).await.unwrap().is_some());
    }
}

#[tokio::test]
async fn beyond_max_in_flight_requests_get_503_with_retry_after_until_a_stream_ends() {
    let h = Harness::start_with(|c| c.server.max_in_flight = 1).await;
    // One stream holds the only slot while it runs.
    h.mock.push(MockReply::sse_chunks(
        &[ctxgate::mock::chunk(json!({"content":"slow"}), None)],
        Duration::from_millis(1500),
    ));
    let body =
        json!({"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}]});
    let held = h.post_chat(body.to_string()).await;
    assert_eq!(held.status(), 200);

    // A request without a body is refused at once. (One with a body takes its slot once the body has arrived:
    // see `slow_bodies_hold_no_slot_and_a_normal_client_keeps_being_answered`.)
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("refused without waiting for the body")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).to_lowercase();
    assert!(text.starts_with("http/1.1 503"), "{text}");
    assert!(text.contains("retry-after: 1"), "{text}");

    let refused = h.post_chat(body.to_string()).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let e: Value = refused.json().await.unwrap();
    assert_eq!(e["error"]["code"], "overloaded");
    assert_eq!(e["error"]["type"], "server_error");
    // an Anthropic client is refused in its own API's error shape
    let anthropic = h
        .client
        .post(h.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(anthropic.status(), 503);
    assert_eq!(anthropic.headers()["retry-after"], "1");
    let e: Value = anthropic.json().await.unwrap();
    assert_eq!(
        (&e["type"], &e["error"]["type"]),
        (&json!("error"), &json!("overloaded_error"))
    );
    // passthrough shares the limit; health and metrics do not
    let models = h.client.get(h.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 503);
    // a passthrough body takes its slot when it ends: none is free, so 503 too
    let upload = h
        .client
        .post(h.url("/v1/files"))
        .header("content-type", "application/json")
        .body("{\"purpose\":\"x\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 503);
    assert_eq!(upload.headers()["retry-after"], "1");
    let metrics = h.client.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.unwrap();
    assert!(
        text.lines().any(|l| l.starts_with("ctxgate_requests_total")
            && l.contains("dialect=\"chat\",route=\"chat\"")
            && l.contains("status=\"5xx\"")
            && l.ends_with(" 1"))
            && text.lines().any(|l| l.starts_with("ctxgate_requests_total")
                && l.contains("dialect=\"none\",route=\"passthrough\"")
                && l.contains("status=\"5xx\",stream=\"false\"")
                && l.ends_with(" 3")),
        "refusals are counted: {text}"
    );

    // The stream ends: its slot is free again.
    held.text().await.unwrap();
    let mut again = None;
    for _ in 0..50 {
        let r = h.post_chat(body.to_string()).await;
        if r.status() == 200 {
            again = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "the slot is released when the stream ends");
}

/// `GET path` on a new connection (keep-alive asked for): what came back, and whether the gateway closed it
/// within `within`.
async fn get_on_new_connection(h: &Harness, path: &str, within: Duration) -> (String, bool) {
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_until_closed(&mut tcp, within).await
}

/// What was logged, shared with the subscriber that writes it.

#[tokio::test]
async fn beyond_max_connections_only_the_probes_are_answered_until_one_closes() {
    let logged = Logged::default();
    // The test runtime has one thread: the server's tasks log here too.
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(logged.clone())
            .with_ansi(false)
            .finish(),
    );
    let h = Harness::start_with(|c| {
        c.server.max_connections = 1;
        c.server.header_read_timeout_secs = 30;
    })
    .await;
    let first = TcpStream::connect(h.addr).await.unwrap();
    // give the accept loop time to take the first connection
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The probes are answered at once on a connection beyond the limit, which is then closed.
    for path in ["/healthz", "/readyz"] {
        let (text, closed) = get_on_new_connection(&h, path, Duration::from_secs(3)).await;
        assert!(closed && text.starts_with("HTTP/1.1 200"), "{path}: {text}");
    }
    // Anything else: 503 with retry-after, at once; nothing reaches the upstream.
    let (text, closed) = get_on_new_connection(&h, "/v1/models", Duration::from_secs(3)).await;
    assert!(closed && text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("retry-after: 1"), "{text}");
    assert!(text.contains("server.max_connections"), "{text}");
    assert!(h.mock.requests().is_empty());
    // The operator is told, once.
    let log = String::from_utf8(logged.0.lock().unwrap().clone()).unwrap();
    let warnings = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("server.max_connections reached"))
        .count();
    assert_eq!(warnings, 1, "{log}");
    // Once the first connection closes, a new one is served in full.
    drop(first);
    let mut served = String::new();
    for _ in 0..50 {
        let (text, _) = get_on_new_connection(&h, "/v1/models", Duration::from_secs(3)).await;
        if text.starts_with("HTTP/1.1 200") {
            served = text;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!served.is_empty(), "the slot is free again");
    assert_eq!(h.mock.requests().len(), 1);
}

#[tokio::test]
async fn a_flood_of_idle_connections_does_not_delay_the_probes() {
    let h = Harness::start_with(|c| {
        c.server.max_connections = 4;
        c.server.header_read_timeout_secs = 60;
    })
    .await;
    // Idle connections (nothing sent) beyond the limit and beyond the probes' reserve.
    let flood = 4 + ctxgate::server::PROBE_RESERVE + 150;
    let mut idle = Vec::with_capacity(flood);
    for _ in 0..flood {
        idle.push(TcpStream::connect(h.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    for path in ["/healthz", "/readyz"] {
        let (text, closed) = get_on_new_connection(&h, path, Duration::from_secs(15)).await;
        assert!(
            closed && text.starts_with("HTTP/1.1 200"),
            "{path}: {text:?}"
        );
    }
    let took = started.elapsed();
    println!("{flood} idle connections over max_connections = 4: /healthz and /readyz in {took:?}");
    // The reserve turns over every second (a connection of it must send its request within 1 s): far below the
    // 60 s header deadline the idle connections would otherwise hold their place for.
    assert!(took < Duration::from_secs(6), "{took:?}");
    drop(idle);
}

#[tokio::test]
async fn get_and_other_methods_on_chat_completions_pass_through() {
    let h = Harness::start().await;
    h.mock.push(MockReply::json(
        200,
        json!({"object":"list","data":[{"id":"chatcmpl-1","object":"chat.completion"}]}),
    ));
    let list = h
        .client
        .get(h.url("/v1/chat/completions?limit=2&model=gpt-4o"))
        .header("authorization", "Bearer sk-test-a")
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    let v: Value = list.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "chatcmpl-1");
    h.mock.push(MockReply::json(
        200,
        json!({"id":"chatcmpl-1","object":"chat.completion.deleted","deleted":true}),
    ));
    let del = h
        .client
        .delete(h.url("/v1/chat/completions/chatcmpl-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].method, http::Method::GET);
    assert_eq!(reqs[0].uri, "/v1/chat/completions?limit=2&model=gpt-4o");
    assert_eq!(
        reqs[0].headers["authorization"], "Bearer sk-test-a",
        "credentials forwarded"
    );
    assert_eq!(reqs[1].method, http::Method::DELETE);
    assert_eq!(reqs[1].uri, "/v1/chat/completions/chatcmpl-1");
    assert!(
        h.state.sessions.list(10, 0).await.unwrap().0.is_empty(),
        "no session for a passthrough"
    );
}

/// A client that stops reading a stream: the gateway reads the upstream only as far as the client's socket and a
/// bounded buffer allow (hyper's backpressure), not the whole stream into memory.
#[tokio::test]
async fn a_client_that_stops_reading_does_not_make_the_gateway_read_ahead() {
    const CHUNK: usize = 16 * 1024;
    const CHUNKS: usize = 8 * 1024; // 128 MiB in all
    let produced = Arc::new(AtomicUsize::new(0));
    let upstream = {
        let produced = produced.clone();
        let app = axum::Router::new().fallback(move || {
            let produced = produced.clone();
            async move {
                let stream = futures_util::stream::iter(0..CHUNKS).map(move |i| {
                    produced.fetch_add(1, Ordering::SeqCst);
                    let piece = "x".repeat(CHUNK - 64);
                    Ok::<_, std::io::Error>(format!(
                        "data: {}\n\n",
                        json!({"choices":[{"index":0,"delta":{"content":format!("{i}{piece}")}}]})
                    ))
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(axum::body::Body::from_stream(stream))
                    .unwrap()
            }
        });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        addr
    };
    let mock = ctxgate::mock::MockUpstream::start().await.unwrap();
    let cfg = common::test_config(&format!("http://{upstream}/v1"));
    let h = Harness::start_config(mock, cfg).await;
    let mut resp = h
        .post_chat(
            json!({"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}]})
                .to_string(),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    // stop reading; let every buffer on the way fill up
    let mut last = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = produced.load(Ordering::SeqCst);
        if now == last && now > 0 {
            break;
        }
        last = now;
    }
    let read_ahead = produced.load(Ordering::SeqCst) * CHUNK;
    eprintln!("upstream produced {read_ahead} bytes ahead of a stalled client");
    assert!(
        read_ahead < 48 * 1024 * 1024,
        "the gateway read {read_ahead} bytes ahead of the client"
    );
    assert!(produced.load(Ordering::SeqCst) < CHUNKS);
    drop(resp);
}

/// A stream still running when the grace period ends gets an error event (code `shutting_down`) and a clean end;
/// its partial reply is recorded during the drain, before `run` returns.
#[tokio::test]
async fn a_stream_past_the_grace_period_is_closed_and_recorded_partial_before_run_returns() {
    let mut h = Harness::start_with(|c| {
        c.server.shutdown_grace_secs = 1;
        c.server.drain_secs = 5;
    })
    .await;
    h.mock.push(MockReply::Sse {
        chunks: vec![
            (
                Duration::ZERO,
                format!(
                    "data: {}\n\n",
                    ctxgate::mock::chunk(json!({"role":"assistant","content":"first words"}), None)
                )
                .into(),
            ),
            (
                Duration::from_secs(60),
                format!(
                    "data: {}\n\n",
                    ctxgate::mock::chunk(json!({"content":" never sent"}), None)
                )
                .into(),
            ),
        ],
        stall_after: false,
    });
    let resp = h
        .post_chat(
            json!({"model":"mock-model","stream":true,"messages":[{"role":"user","content":"tell me"}]})
                .to_string(),
        )
        .await;
    let sid = session_header(&resp);
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("first words"));
    let state = h.state.clone();
    tokio::time::timeout(Duration::from_secs(10), h.stop())
        .await
        .expect("run returns after grace + drain");
    // the client's stream was cut: with the error event first, then a clean end of the body
    let mut rest = Vec::new();
    while let Some(c) = body.next().await {
        rest.extend_from_slice(&c.expect("a clean end, not a broken connection"));
    }
    let rest = String::from_utf8_lossy(&rest);
    let event: Value = serde_json::from_str(
        rest.trim()
            .strip_prefix("data: ")
            .expect("an SSE error event"),
    )
    .unwrap();
    assert_eq!(event["error"]["code"], "shutting_down", "{rest}");
    assert!(!rest.contains("[DONE]"), "the reply is not complete");
    // recorded by the drain, before `run` returned: no further waiting here
    let v = state.sessions.view(&sid).await.unwrap().unwrap();
    assert_eq!(v.messages.len(), 2, "{:?}", v.messages);
    assert_eq!(v.messages[1]["content"], "first words");
    assert_eq!(v.partial, [1]);
}

/// The drain is bounded by `server.drain_secs`: work that never ends is given up (and reported), the queued store
/// writes are still committed, and shutdown completes.
#[tokio::test]
async fn the_drain_gives_up_on_work_that_never_ends_and_still_commits_the_store() {
    let mut h = Harness::start_with(|c| c.server.drain_secs = 1).await;
    let resp = h
        .post_chat(
            json!({"model":"mock-model","messages":[{"role":"user","content":"hi"}]}).to_string(),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let sid = session_header(&resp);
    resp.text().await.unwrap();
    h.state.tasks.spawn(std::future::pending::<()>());
    let drained = tokio::time::timeout(
        Duration::from_secs(10),
        h.state.drain_within(Duration::from_secs(1)),
    )
    .await
    .expect("the drain ends at its deadline");
    assert_eq!(drained.tasks_left, 1, "{drained:?}");
    assert!(drained.store_flushed && !drained.complete(), "{drained:?}");
    let v = h.state.sessions.view(&sid).await.unwrap().unwrap();
    assert_eq!(v.messages.len(), 2);
    tokio::time::timeout(Duration::from_secs(10), h.stop())
        .await
        .expect("shutdown completes despite the stuck task");
}
