//! A streaming client that closes its connection early, against an upstream that spaces its events out (as real
//! ones do): the reply is recorded whole once everything that carries content reached the client — Anthropic's
//! `message_delta` with its `stop_reason` (litellm stops reading there), chat's `finish_reason` chunk — and
//! partial when the client left before that.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Harness;
use ctxgate::mock::{chunk, AnthropicReply, MockReply};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Between two upstream events.
const SPACING: Duration = Duration::from_millis(150);

/// Posts `body` to `path` over a raw connection, reads the streamed answer until it holds the whole event that
/// contains `until`, then closes the connection. Returns the session the gateway named and what was read.
async fn leave_after(
    h: &Harness,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
    until: &str,
) -> (String, String) {
    let mut tcp = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let body = body.to_string();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        h.addr,
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 8192];
        loop {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the stream ended before {until}: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some(at) = text.find(until) {
                if text[at..].contains("\n\n") {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the event in time");
    drop(tcp); // the client goes away, the upstream still has events to send
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let session = text
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("x-ctxgate-session: "))
        .expect("the session header")
        .trim()
        .to_string();
    (session, text)
}

const ANTHROPIC: [(&str, &str); 2] = [
    ("x-api-key", "sk-ant-test-key"),
    ("anthropic-version", "2023-06-01"),
];

fn messages_body() -> Value {
    json!({"model":"claude-sonnet-4-5","max_tokens":256,"stream":true,
           "messages":[{"role":"user","content":"stream slowly"}]})
}

fn spaced(text: &str) -> AnthropicReply {
    AnthropicReply {
        input_tokens: Some(40),
        output_tokens: Some(9),
        delay: SPACING,
        ..AnthropicReply::text(text)
    }
}

async fn partial(h: &Harness, id: &str) -> Vec<u32> {
    h.state.drain().await;
    h.state.sessions.view(id).await.unwrap().unwrap().partial
}

/// litellm's way: it reads up to `message_delta` (the stop reason and the usage) and closes the connection, while
/// the upstream's `message_stop` is still on its way. Everything that carries content reached the client: the
/// reply is kept whole, with the usage `message_delta` reported, and no client is said to have gone away.
#[tokio::test]
async fn an_anthropic_client_that_leaves_after_message_delta_got_the_whole_reply() {
    let mut h = Harness::start().await;
    h.mock
        .push_anthropic(spaced("Every block of this answer reached the client."));
    let (id, text) = leave_after(
        &h,
        "/v1/messages",
        &ANTHROPIC,
        &messages_body(),
        "event: message_delta",
    )
    .await;
    assert!(
        !text.contains("message_stop"),
        "the client left before message_stop"
    );
    let turn = h.next_turn().await;
    assert!(turn.outcome.reply.complete, "{:?}", turn.outcome.reply);
    assert!(!turn.outcome.client_disconnected);
    let usage = turn.outcome.reply.usage.clone().unwrap();
    assert_eq!(
        (
            usage["input_tokens"].as_u64(),
            usage["output_tokens"].as_u64()
        ),
        (Some(40), Some(9)),
        "{usage}"
    );
    assert_eq!(
        partial(&h, &id).await,
        Vec::<u32>::new(),
        "the reply is kept whole"
    );
    let v = h.state.sessions.view(&id).await.unwrap().unwrap();
    assert_eq!(
        v.messages[1]["content"][0]["text"],
        "Every block of this answer reached the client."
    );
}

/// A client that left before `message_delta` did not get the whole reply: it is kept partial.
#[tokio::test]
async fn an_anthropic_client_that_leaves_before_message_delta_leaves_a_partial_reply() {
    let mut h = Harness::start().await;
    h.mock
        .push_anthropic(spaced("Only the start of this reached the client."));
    let (id, text) = leave_after(
        &h,
        "/v1/messages",
        &ANTHROPIC,
        &messages_body(),
        "event: content_block_delta",
    )
    .await;
    assert!(!text.contains("message_delta"));
    let turn = h.next_turn().await;
    assert!(!turn.outcome.reply.complete);
    assert!(turn.outcome.client_disconnected);
    assert_eq!(
        partial(&h, &id).await,
        [1],
        "the reply is kept as cut short"
    );
}

fn chat_stream() -> MockReply {
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    chunks.extend(
        ["All of ", "this arrived."]
            .iter()
            .map(|p| chunk(json!({"content": p}), None)),
    );
    chunks.push(chunk(json!({}), Some("stop")));
    chunks.push(json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1_700_000_000,
        "model": "mock-model", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}));
    MockReply::sse_chunks(&chunks, SPACING)
}

fn chat_body() -> Value {
    json!({"model":"m","stream":true,"stream_options":{"include_usage":true},
           "messages":[{"role":"user","content":"stream slowly"}]})
}

const CHAT: [(&str, &str); 1] = [("authorization", "Bearer sk-test-a")];

/// Chat completions: a client that stops at the `finish_reason` chunk (before the usage chunk and `[DONE]`) got
/// the whole reply: it is kept whole.
#[tokio::test]
async fn a_chat_client_that_leaves_after_the_finish_reason_got_the_whole_reply() {
    let mut h = Harness::start().await;
    h.mock.push(chat_stream());
    let (id, text) = leave_after(
        &h,
        "/v1/chat/completions",
        &CHAT,
        &chat_body(),
        "\"finish_reason\":\"stop\"",
    )
    .await;
    assert!(!text.contains("[DONE]") && !text.contains("prompt_tokens"));
    let turn = h.next_turn().await;
    assert!(turn.outcome.reply.complete, "{:?}", turn.outcome.reply);
    assert_eq!(
        partial(&h, &id).await,
        Vec::<u32>::new(),
        "the reply is kept whole"
    );
    let v = h.state.sessions.view(&id).await.unwrap().unwrap();
    assert_eq!(v.messages[1]["content"], "All of this arrived.");
}

/// … and one that left before it did not: partial.
#[tokio::test]
async fn a_chat_client_that_leaves_before_the_finish_reason_leaves_a_partial_reply() {
    let mut h = Harness::start().await;
    h.mock.push(chat_stream());
    let (id, text) = leave_after(&h, "/v1/chat/completions", &CHAT, &chat_body(), "All of ").await;
    assert!(!text.contains("finish_reason\":\"stop"));
    let turn = h.next_turn().await;
    assert!(!turn.outcome.reply.complete);
    assert!(turn.outcome.client_disconnected);
    assert_eq!(partial(&h, &id).await, [1]);
}

/// The same rule when it is the upstream that breaks after its closing `message_delta` (before `message_stop`):
/// the turn was recorded whole before `message_delta` went out; the client's stream still ends with an error event.
#[tokio::test]
async fn an_anthropic_stream_broken_after_message_delta_was_recorded_whole() {
    let mut h = Harness::start().await;
    let event = |kind: &str, data: Value| {
        (
            SPACING,
            bytes::Bytes::from(format!("event: {kind}\ndata: {data}\n\n")),
        )
    };
    h.mock.push(MockReply::Broken {
        content_type: "text/event-stream".into(),
        chunks: vec![
            event("message_start", json!({"type":"message_start","message":{"id":"msg_1","type":"message",
                "role":"assistant","model":"claude-sonnet-4-5","content":[],"usage":{"input_tokens":40,"output_tokens":1}}})),
            event("content_block_start", json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})),
            event("content_block_delta", json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Whole."}})),
            event("content_block_stop", json!({"type":"content_block_stop","index":0})),
            event("message_delta", json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}})),
        ],
    });
    let resp = h
        .post_json("/v1/messages", &ANTHROPIC, &messages_body())
        .await;
    let id = common::session_header(&resp);
    let text = tokio::time::timeout(Duration::from_secs(10), resp.text())
        .await
        .unwrap()
        .unwrap();
    assert!(
        text.contains("event: message_delta") && text.trim_end().ends_with('}'),
        "{text}"
    );
    assert!(
        text.contains("event: error"),
        "the client learns the stream broke: {text}"
    );
    let turn = h.next_turn().await;
    assert!(turn.outcome.reply.complete && turn.outcome.upstream_error.is_none());
    assert_eq!(turn.outcome.reply.usage.unwrap()["output_tokens"], 3);
    assert_eq!(partial(&h, &id).await, Vec::<u32>::new());
}
