//! Gateway core: transparent forwarding, streaming relay, passthrough, errors, disconnects.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bytes::Bytes;
use common::Harness;
use ctxgate::mock::{chunk, MockReply};
use futures_util::StreamExt;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn chat_body_is_forwarded_byte_for_byte_and_answer_unchanged() {
    let h = Harness::start().await;
    // odd spacing, unknown fields, key order that a re-serialisation would not keep
    let body = "{ \"zeta_unknown\" : {\"b\":1,\"a\":2},\n \"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"hi \\u00e9\"}],\"x_vendor\":[1.50,2] }";
    h.mock.push(MockReply::Json {
        status: 200,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-request-id".into(), "req-123".into()),
            ("openai-processing-ms".into(), "42".into()),
        ],
        body: Bytes::from_static(b"{\"id\":\"c\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"yo\"},\"finish_reason\":\"stop\"}]}"),
        delay: Duration::ZERO,
    });
    let resp = h.post_chat(body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-123");
    assert_eq!(resp.headers()["openai-processing-ms"], "42");
    assert!(resp.headers().contains_key("x-ctxgate-session"));
    let text = resp.text().await.unwrap();
    assert_eq!(text, "{\"id\":\"c\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"yo\"},\"finish_reason\":\"stop\"}]}");
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].uri, "/v1/chat/completions");
    assert_eq!(reqs[0].body.as_ref(), body.as_bytes());
    assert_eq!(reqs[0].headers["authorization"], "Bearer sk-test-a");
}

#[tokio::test]
async fn sse_events_reach_the_client_unchanged() {
    let mut h = Harness::start().await;
    let raw: Vec<&'static [u8]> = vec![
        b": keep-alive\r\n\r\n",
        b"data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\r\n\r\n",
        b"data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel",
        b"lo\"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        b"data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
        b"data: [DONE]\n\n",
    ];
    h.mock.push(MockReply::Sse {
        chunks: raw
            .iter()
            .map(|c| (Duration::from_millis(5), Bytes::from_static(c)))
            .collect(),
        stall_after: false,
    });
    let resp = h
        .post_chat(r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}"#)
        .await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let got = resp.bytes().await.unwrap();
    assert_eq!(got, Bytes::from(raw.concat()));
    let turn = h.next_turn().await;
    let reply = turn.outcome.reply;
    assert_eq!(reply.message, json!({"role":"assistant","content":"Hello"}));
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
    assert_eq!(reply.prompt_tokens(), Some(9));
    assert!(reply.complete && !turn.outcome.client_disconnected);
}

#[tokio::test]
async fn chunks_are_relayed_as_they_arrive() {
    let h = Harness::start().await;
    let mut chunks = vec![(
        Duration::ZERO,
        Bytes::from(format!(
            "data: {}\n\n",
            chunk(json!({"content":"first"}), None)
        )),
    )];
    chunks.push((
        Duration::from_millis(800),
        Bytes::from_static(b"data: [DONE]\n\n"),
    ));
    h.mock.push(MockReply::Sse {
        chunks,
        stall_after: false,
    });
    let started = std::time::Instant::now();
    let resp = h
        .post_chat(r#"{"model":"m","stream":true,"messages":[]}"#)
        .await;
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("first"));
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "first chunk was held back: {:?}",
        started.elapsed()
    );
    while body.next().await.is_some() {}
}

#[tokio::test]
async fn tool_call_deltas_are_assembled() {
    let mut h = Harness::start().await;
    h.mock.push(MockReply::sse_chunks(
        &[
            chunk(json!({"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"read_file","arguments":""}}]}), None),
            chunk(json!({"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"ls","arguments":"{}"}}]}), None),
            chunk(json!({"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":"}}]}), None),
            chunk(json!({"tool_calls":[{"index":0,"function":{"arguments":"\"a.rs\"}"}}]}), Some("tool_calls")),
        ],
        Duration::ZERO,
    ));
    let resp = h
        .post_chat(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#)
        .await;
    resp.bytes().await.unwrap();
    let reply = h.next_turn().await.outcome.reply;
    assert_eq!(
        reply.message["tool_calls"],
        json!([
            {"id":"call_1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.rs\"}"}},
            {"id":"call_2","type":"function","function":{"name":"ls","arguments":"{}"}}
        ])
    );
}

#[tokio::test]
async fn error_inside_a_200_stream_is_relayed_and_seen() {
    let mut h = Harness::start().await;
    h.mock.push(MockReply::Sse {
        chunks: vec![
            (Duration::ZERO, Bytes::from(format!("data: {}\n\n", chunk(json!({"role":"assistant","content":"pa"}), None)))),
            (Duration::ZERO, Bytes::from_static(b"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n")),
        ],
        stall_after: false,
    });
    let resp = h
        .post_chat(r#"{"model":"m","stream":true,"messages":[]}"#)
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("overloaded"));
    let reply = h.next_turn().await.outcome.reply;
    assert_eq!(reply.error.unwrap()["message"], "overloaded");
    assert!(!reply.complete);
    assert_eq!(reply.message["content"], "pa");
}

#[tokio::test]
async fn passthrough_keeps_method_query_status_headers_and_body() {
    let h = Harness::start().await;
    let resp = h
        .client
        .get(h.url("/v1/models?limit=2"))
        .header("authorization", "Bearer k")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("mock-model"));
    let reqs = h.mock.requests();
    assert_eq!(reqs[0].uri, "/v1/models?limit=2");
    assert_eq!(reqs[0].headers["authorization"], "Bearer k");

    let err = json!({"error":{"message":"Rate limit reached for gpt-4o","type":"requests","param":null,"code":"rate_limit_exceeded"}});
    h.mock.push(MockReply::Json {
        status: 429,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("retry-after".into(), "7".into()),
        ],
        body: Bytes::from(err.to_string()),
        delay: Duration::ZERO,
    });
    let resp = h
        .client
        .post(h.url("/v1/embeddings"))
        .body("{\"input\":\"a\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    assert_eq!(resp.text().await.unwrap(), err.to_string());
    assert_eq!(h.mock.requests()[1].body.as_ref(), b"{\"input\":\"a\"}");
    assert_eq!(h.mock.requests()[1].method, "POST");
}

#[tokio::test]
async fn upstream_error_on_chat_is_relayed_with_session_header() {
    let h = Harness::start().await;
    let err = json!({"error":{"message":"Rate limit","type":"requests","param":null,"code":"rate_limit_exceeded"}});
    h.mock.push(MockReply::json(429, err.clone()));
    let resp = h.post_chat(r#"{"model":"m","messages":[]}"#).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("x-ctxgate-session"));
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap(), err);
}

async fn expect_error(resp: reqwest::Response, status: u16, kind: &str) -> serde_json::Value {
    assert_eq!(resp.status().as_u16(), status);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], kind, "{v}");
    for k in ["message", "type", "param", "code"] {
        assert!(v["error"].get(k).is_some(), "missing {k} in {v}");
    }
    v
}

#[tokio::test]
async fn own_errors_use_openai_shape() {
    let h = Harness::start_with(|c| c.server.max_body_bytes = 1000).await;
    expect_error(h.post_chat("not json").await, 400, "invalid_request_error").await;
    expect_error(h.post_chat("[1,2]").await, 400, "invalid_request_error").await;
    let v = expect_error(
        h.post_chat(r#"{"model":"m"}"#).await,
        400,
        "invalid_request_error",
    )
    .await;
    assert_eq!(v["error"]["param"], "messages");
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2000)
    );
    let v = expect_error(h.post_chat(big).await, 413, "invalid_request_error").await;
    assert_eq!(v["error"]["code"], "request_too_large");
    assert!(
        h.mock.requests().is_empty(),
        "nothing may reach the upstream"
    );
    let resp = h.client.get(h.url("/nope")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_timeout_is_504() {
    // a port nobody listens on
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", l.local_addr().unwrap());
    drop(l);
    let h = Harness::start_with(|c| c.upstream.base_url = dead).await;
    let v = expect_error(
        h.post_chat(r#"{"model":"m","messages":[]}"#).await,
        502,
        "upstream_error",
    )
    .await;
    assert_eq!(v["error"]["code"], "upstream_unreachable");
    let resp = h.client.get(h.url("/v1/models")).send().await.unwrap();
    assert_eq!(resp.status(), 502);

    let h = Harness::start_with(|c| c.upstream.timeout_secs = 1).await;
    h.mock
        .push(MockReply::completion("late").delayed(Duration::from_millis(2500)));
    let resp = h.post_chat(r#"{"model":"m","messages":[]}"#).await;
    assert!(resp.headers().contains_key("x-ctxgate-session"));
    let v = expect_error(resp, 504, "upstream_error").await;
    assert_eq!(v["error"]["code"], "upstream_timeout");
}

#[tokio::test]
async fn client_disconnect_drops_upstream_and_keeps_partial_message() {
    let mut h = Harness::start().await;
    h.mock.push(MockReply::Sse {
        chunks: vec![
            (
                Duration::ZERO,
                Bytes::from(format!(
                    "data: {}\n\n",
                    chunk(json!({"role":"assistant","content":"partial "}), None)
                )),
            ),
            (
                Duration::ZERO,
                Bytes::from(format!(
                    "data: {}\n\n",
                    chunk(json!({"content":"answer"}), None)
                )),
            ),
        ],
        stall_after: true,
    });
    let resp = h
        .post_chat(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#)
        .await;
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("answer") {
        seen.push_str(&String::from_utf8_lossy(
            &body.next().await.unwrap().unwrap(),
        ));
    }
    drop(body);
    let turn = h.next_turn().await;
    assert!(turn.outcome.client_disconnected);
    assert!(!turn.outcome.reply.complete);
    assert_eq!(turn.outcome.reply.message["content"], "partial answer");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while h.mock.streams_dropped() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "upstream stream was not dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn healthz_and_graceful_shutdown_lets_streams_finish() {
    let mut h = Harness::start().await;
    let resp = h.client.get(h.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "ok");
    let mut chunks = vec![(
        Duration::ZERO,
        Bytes::from(format!("data: {}\n\n", chunk(json!({"content":"a"}), None))),
    )];
    chunks.push((
        Duration::from_millis(400),
        Bytes::from_static(b"data: [DONE]\n\n"),
    ));
    h.mock.push(MockReply::Sse {
        chunks,
        stall_after: false,
    });
    let resp = h
        .post_chat(r#"{"model":"m","stream":true,"messages":[]}"#)
        .await;
    let mut body = resp.bytes_stream();
    body.next().await.unwrap().unwrap();
    let stop = tokio::spawn(async move {
        h.stop().await;
    });
    let mut rest = Vec::new();
    while let Some(c) = body.next().await {
        rest.extend_from_slice(&c.unwrap());
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    tokio::time::timeout(Duration::from_secs(5), stop)
        .await
        .unwrap()
        .unwrap();
}
