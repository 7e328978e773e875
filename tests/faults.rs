//! Upstream faults: refused connections, a stream reset midway, HTML with 200, no headers ever, a huge body. Each
//! gets a clear answer in OpenAI's shape or is relayed as is; none panics, none records a made-up reply.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bytes::Bytes;
use common::{session_header, Harness};
use ctxgate::mock::{chunk, MockReply};
use ctxgate::session::manager::SessionView;
use ctxgate::sse::{SseParser, MAX_LINE_BYTES};
use serde_json::{json, Value};
use std::time::Duration;

fn body(stream: bool) -> String {
    json!({"model":"m","stream":stream,"messages":[{"role":"user","content":"hello"}]}).to_string()
}

/// The answer within `secs` seconds, or a failed test (never a hung one).
async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("no answer in time")
}

async fn expect_error(resp: reqwest::Response, status: u16, code: &str) {
    assert_eq!(resp.status().as_u16(), status);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "upstream_error", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].is_string() && v["error"].get("param").is_some());
}

async fn session(h: &Harness, resp: &reqwest::Response) -> String {
    let _ = h;
    session_header(resp)
}

async fn view(h: &Harness, id: &str) -> SessionView {
    h.state.drain().await;
    h.state.sessions.view(id).await.unwrap().unwrap()
}

#[tokio::test]
async fn refused_connections_answer_502() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", l.local_addr().unwrap());
    drop(l);
    let h = Harness::start_with(|c| c.upstream.base_url = dead).await;
    for stream in [false, true] {
        let resp = within(10, h.post_chat(body(stream))).await;
        expect_error(resp, 502, "upstream_unreachable").await;
    }
}

/// The client gets the partial stream, then `data: {"error":{…}}` and a clean end of the body (no `[DONE]`: the
/// reply is not complete); the partial reply is recorded marked partial.
#[tokio::test]
async fn a_stream_reset_midway_ends_with_an_error_event_and_a_partial_reply() {
    let mut h = Harness::start().await;
    h.mock.push(MockReply::sse_broken(&[
        chunk(json!({"role":"assistant","content":"Hello "}), None),
        chunk(json!({"content":"wor"}), None),
    ]));
    let resp = within(10, h.post_chat(body(true))).await;
    assert_eq!(resp.status(), 200);
    let id = session(&h, &resp).await;
    let raw = within(10, resp.bytes())
        .await
        .expect("a clean end of the body");
    let events = SseParser::new().feed(&raw);
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events[1].data.contains("wor"));
    let last: Value = serde_json::from_str(&events[2].data).unwrap();
    assert_eq!(last["error"]["type"], "upstream_error", "{last}");
    assert_eq!(last["error"]["code"], "upstream_unreachable");
    assert!(!raw.ends_with(b"data: [DONE]\n\n"));
    let turn = h.next_turn().await;
    assert!(!turn.outcome.reply.complete);
    assert!(turn.outcome.upstream_error.is_some());
    let v = view(&h, &id).await;
    assert_eq!(v.messages[1]["content"], "Hello wor");
    assert_eq!(v.partial, [1]);
}

/// A stream broken inside an event: a blank line closes the unfinished event before the error event.
#[tokio::test]
async fn a_stream_reset_inside_an_event_still_ends_with_a_readable_error_event() {
    let h = Harness::start().await;
    let whole = format!(
        "data: {}\n\n",
        chunk(json!({"role":"assistant","content":"a"}), None)
    );
    h.mock.push(MockReply::Broken {
        content_type: "text/event-stream".into(),
        chunks: vec![
            (Duration::ZERO, Bytes::from(whole)),
            (
                Duration::ZERO,
                Bytes::from_static(b"data: {\"choices\":[{\"ind"),
            ),
        ],
    });
    let raw = within(10, within(10, h.post_chat(body(true))).await.bytes())
        .await
        .unwrap();
    let events = SseParser::new().feed(&raw);
    let last: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    assert_eq!(last["error"]["code"], "upstream_unreachable", "{raw:?}");
}

/// A JSON body cannot be mended: the client's connection is aborted, nothing is recorded of the reply.
#[tokio::test]
async fn a_json_body_reset_midway_aborts_the_client_body() {
    let mut h = Harness::start().await;
    h.mock.push(MockReply::Broken {
        content_type: "application/json".into(),
        chunks: vec![(
            Duration::ZERO,
            Bytes::from_static(b"{\"id\":\"x\",\"choices\":[{\"mess"),
        )],
    });
    let resp = within(10, h.post_chat(body(false))).await;
    let id = session(&h, &resp).await;
    assert!(
        within(10, resp.bytes()).await.is_err(),
        "the body is cut, not ended"
    );
    let turn = h.next_turn().await;
    assert!(turn.outcome.reply.is_empty());
    assert_eq!(view(&h, &id).await.messages.len(), 1, "no reply recorded");
}

/// A whole JSON body followed by a reset (the upstream announced more than it sent): the client gets no body (its
/// connection is aborted, the answer was gathered first), so the reply must not count as complete: the turn says
/// `complete=false` and the stored reply is marked partial.
#[tokio::test]
async fn a_whole_json_body_then_a_reset_is_recorded_partial_not_complete() {
    let mut h = Harness::start().await;
    let whole = json!({"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,
        "message":{"role":"assistant","content":"never delivered"},"finish_reason":"stop"}]});
    h.mock.push(MockReply::Broken {
        content_type: "application/json".into(),
        chunks: vec![(Duration::ZERO, Bytes::from(whole.to_string()))],
    });
    let resp = within(10, h.post_chat(body(false))).await;
    let id = session(&h, &resp).await;
    assert!(
        within(10, resp.bytes()).await.is_err(),
        "the body is cut, not ended"
    );
    let turn = h.next_turn().await;
    assert!(turn.outcome.upstream_error.is_some());
    assert!(
        !turn.outcome.reply.complete,
        "a reply the client never got is not complete"
    );
    let v = view(&h, &id).await;
    assert_eq!(v.messages.len(), 2, "{:?}", v.messages);
    assert_eq!(v.partial, [1], "the stored reply is marked partial");
}

/// HTML with 200 (a captive portal, a misconfigured base URL): relayed as is, nothing assembled or recorded.
#[tokio::test]
async fn html_with_200_is_relayed_as_is() {
    let mut h = Harness::start().await;
    let html = "<html><body>Sign in to continue</body></html>";
    for stream in [false, true] {
        h.mock.push(MockReply::Json {
            status: 200,
            headers: vec![("content-type".into(), "text/html; charset=utf-8".into())],
            body: Bytes::from(html),
            delay: Duration::ZERO,
        });
        let resp = within(10, h.post_chat(body(stream))).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/html; charset=utf-8");
        let id = session(&h, &resp).await;
        assert_eq!(resp.text().await.unwrap(), html);
        let turn = h.next_turn().await;
        assert!(turn.outcome.reply.is_empty() && !turn.outcome.reply.complete);
        assert_eq!(view(&h, &id).await.messages.len(), 1, "nothing assembled");
    }
}

/// An upstream that accepts the connection and never answers: 504 after `upstream.timeout_secs`.
#[tokio::test]
async fn an_upstream_that_never_sends_headers_gets_504() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        loop {
            let (c, _) = listener.accept().await.unwrap();
            conns.push(c); // read nothing, answer nothing
        }
    });
    let h = Harness::start_with(|c| {
        c.upstream.base_url = base;
        c.upstream.timeout_secs = 1;
    })
    .await;
    for stream in [false, true] {
        let resp = within(10, h.post_chat(body(stream))).await;
        expect_error(resp, 504, "upstream_timeout").await;
    }
    held.abort();
}

/// A JSON answer longer than what the relay gathers before sending (1 MiB) is relayed on from there, whole, and
/// recorded; one cut after that much is aborted like a short one.
#[tokio::test]
async fn a_json_answer_past_the_gathered_part_is_relayed_on_and_recorded() {
    let mut h = Harness::start().await;
    let long = "z".repeat(2 * 1024 * 1024);
    let reply = MockReply::completion(&long);
    let MockReply::Json { body: sent, .. } = &reply else {
        unreachable!()
    };
    let sent = sent.clone();
    h.mock.push(reply);
    let resp = within(30, h.post_chat(body(false))).await;
    let id = session(&h, &resp).await;
    assert_eq!(
        within(30, resp.bytes()).await.unwrap(),
        sent,
        "byte for byte"
    );
    let turn = h.next_turn().await;
    assert!(turn.outcome.reply.complete);
    let messages = view(&h, &id).await.messages;
    assert_eq!(messages.len(), 2, "the reply is recorded");
    assert_eq!(
        messages[1]["content"].as_str().map(str::len),
        Some(long.len())
    );

    let mut cut = b"{\"id\":\"x\",\"choices\":[{\"message\":{\"content\":\"".to_vec();
    cut.extend(std::iter::repeat_n(b'q', 1536 * 1024));
    h.mock.push(MockReply::Broken {
        content_type: "application/json".into(),
        chunks: vec![(Duration::ZERO, Bytes::from(cut))],
    });
    let resp = within(10, h.post_chat(body(false))).await;
    assert_eq!(resp.status(), 200);
    assert!(
        within(10, resp.bytes()).await.is_err(),
        "the body is cut, not ended"
    );
    let turn = h.next_turn().await;
    assert!(turn.outcome.reply.is_empty() && !turn.outcome.reply.complete);
}

/// A body over the tap's bound is relayed whole but neither assembled nor recorded.
#[tokio::test]
async fn a_huge_json_body_is_relayed_whole_and_not_recorded() {
    let mut h = Harness::start().await;
    let huge = "x".repeat(ctxgate::relay::MAX_TAPPED_JSON + 1024);
    let reply = MockReply::completion(&huge);
    let MockReply::Json { body: sent, .. } = &reply else {
        unreachable!()
    };
    let len = sent.len();
    h.mock.push(reply);
    let resp = within(30, h.post_chat(body(false))).await;
    let id = session(&h, &resp).await;
    let got = within(30, resp.bytes()).await.unwrap();
    assert_eq!(got.len(), len, "relayed whole");
    let turn = h.next_turn().await;
    assert_eq!(turn.outcome.bytes, len as u64);
    assert!(turn.outcome.reply.is_empty(), "not assembled");
    assert_eq!(view(&h, &id).await.messages.len(), 1, "not recorded");
}

/// A stream with one event over the parser's line bound: relayed whole; the event is dropped from the assembled
/// reply, the rest is assembled.
#[tokio::test]
async fn a_huge_stream_event_is_relayed_and_left_out_of_the_reply() {
    let mut h = Harness::start().await;
    let big = chunk(json!({"content":"y".repeat(MAX_LINE_BYTES + 10)}), None);
    let chunks = [
        chunk(json!({"role":"assistant","content":"small "}), None),
        big,
        chunk(json!({"content":"end"}), Some("stop")),
    ];
    h.mock.push(MockReply::sse_chunks(&chunks, Duration::ZERO));
    let resp = within(30, h.post_chat(body(true))).await;
    let id = session(&h, &resp).await;
    let got = within(30, resp.bytes()).await.unwrap();
    assert!(got.len() > MAX_LINE_BYTES && got.ends_with(b"data: [DONE]\n\n"));
    let turn = h.next_turn().await;
    assert_eq!(turn.outcome.reply.message["content"], "small end");
    assert!(turn.outcome.reply.complete);
    assert_eq!(view(&h, &id).await.messages[1]["content"], "small end");
}

/// The same within recall rounds (their stream is re-serialised by the splicer): an error event, a clean end, the
/// partial reply recorded.
#[tokio::test]
async fn a_stream_reset_during_recall_rounds_ends_with_an_error_event() {
    let mut h = Harness::start_with(|c| c.context.default_context_window = 8_000).await;
    h.mock.push(MockReply::sse_broken(&[
        chunk(json!({"role":"assistant","content":"Part"}), None),
        chunk(json!({"content":"ial"}), None),
    ]));
    let b = json!({"model":"mock-model","stream":true,"messages":common::agent_history(14, 300)});
    let resp = within(30, h.post_chat(b.to_string())).await;
    let id = session(&h, &resp).await;
    let raw = within(30, resp.bytes())
        .await
        .expect("a clean end of the body");
    assert!(
        h.mock.requests()[0].json()["tools"]
            .to_string()
            .contains("recall_tool_call"),
        "recall was offered"
    );
    let events = SseParser::new().feed(&raw);
    let last: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    assert_eq!(last["error"]["code"], "upstream_unreachable", "{last}");
    assert!(!raw.ends_with(b"data: [DONE]\n\n"));
    let turn = h.next_turn().await;
    assert!(!turn.outcome.reply.complete);
    let v = view(&h, &id).await;
    assert_eq!(v.messages.last().unwrap()["content"], "Partial");
    assert_eq!(v.partial, [v.messages.len() as u32 - 1]);
}

/// A stream whose message grows past the assembler's bound, in ordinary-sized events: relayed whole, not
/// assembled, not recorded.
#[tokio::test]
async fn a_huge_streamed_reply_is_relayed_whole_and_not_recorded() {
    let mut h = Harness::start().await;
    let piece = "w".repeat(1024 * 1024);
    let mut chunks = vec![chunk(json!({"role":"assistant","content":""}), None)];
    let n = ctxgate::dialect::MAX_ASSEMBLED_BYTES / piece.len() + 2;
    chunks.extend((0..n).map(|_| chunk(json!({"content": piece}), None)));
    chunks.push(chunk(json!({}), Some("stop")));
    h.mock.push(MockReply::sse_chunks(&chunks, Duration::ZERO));
    let resp = within(30, h.post_chat(body(true))).await;
    let id = session(&h, &resp).await;
    let got = within(30, resp.bytes()).await.unwrap();
    assert!(got.len() > n * piece.len() && got.ends_with(b"data: [DONE]\n\n"));
    let turn = h.next_turn().await;
    assert!(turn.outcome.reply.is_empty() && !turn.outcome.reply.complete);
    assert_eq!(view(&h, &id).await.messages.len(), 1, "not recorded");
}
