//! Bad input, one table: every row is a kind of malformed or odd chat request and its documented outcome.
//!
//! - `Refused(status, param)`: ctxgate answers the 4xx itself, in OpenAI's error shape
//!   (`{"error":{message,type:"invalid_request_error",param,code}}`); nothing goes upstream, nothing is stored.
//! - `Http(status)`: the HTTP layer (hyper) refuses the request before ctxgate sees it: status only, empty body;
//!   nothing goes upstream, nothing is stored.
//! - `CutShort`: the client broke its own body off; it gets a 4xx in OpenAI's shape (today 400 "could not read
//!   the request body") or a closed connection, never a 5xx; nothing goes upstream, nothing is stored.
//! - `PassThrough`: well-formed enough for ctxgate (an object with a string `role` per message), so it goes
//!   upstream byte for byte and the upstream judges the rest (OpenAI answers 400 to e.g. number content; the mock
//!   here answers 200); the history is stored exactly as sent.
//! - `Accepted`: valid shapes; forwarded byte for byte, stored as sent.
//! - `Rewritten`: odd shapes inside a conversation long enough to be rewritten (planner, units, recall note and
//!   tools all see them): answered 200, the full history stored as sent.
//!
//! After the table: the upstream saw exactly the forwarded rows, and the store holds exactly their sessions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, Harness};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAX_BODY: u64 = 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Refused(u16, Option<&'static str>),
    Http(u16),
    CutShort,
    PassThrough,
    Accepted,
    Rewritten,
}
use Expect::*;

enum Input {
    /// A body, with the usual headers.
    Body(Vec<u8>),
    /// A body with an extra header (name, raw value bytes).
    Header(&'static str, Vec<u8>, Vec<u8>),
    /// Raw bytes on a fresh connection; `true`: half-close after writing.
    Raw(Vec<u8>, bool),
}

fn body(v: Value) -> Input {
    Input::Body(v.to_string().into_bytes())
}

fn msgs(m: Value) -> Input {
    body(json!({"model": "m", "messages": m}))
}

fn raw_head(extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-bad\r\ncontent-type: application/json\r\n{extra}"
    )
}

fn long_odd_conversation() -> Value {
    let mut m = agent_history(14, 300);
    // number and object content, duplicate call ids, a tool message answering nothing, an unknown role
    m[3]["content"] = json!(12345);
    m[5]["content"] = json!({"unexpected": "object"});
    m[6]["tool_calls"][0]["id"] = json!("call_1");
    m.push(json!({"role":"tool","tool_call_id":"nobody_called_this","content":"orphan"}));
    m.push(json!({"role":"wizard","content":[1, "two", {"type":"text","text":"three"}]}));
    m.push(json!({"role":"user","content":"go on"}));
    json!({"model": "mock-model", "messages": m})
}

fn table() -> Vec<(&'static str, Input, Expect)> {
    let ok = json!([{"role":"user","content":"hi"}]);
    let deep_inside = {
        let mut b = br#"{"model":"m","messages":[{"role":"user","content":"#.to_vec();
        b.extend(std::iter::repeat_n(b'[', 100_000));
        b
    };
    let mut bad_utf8 = br#"{"model":"m","messages":[{"role":"user","content":"caf"#.to_vec();
    bad_utf8.extend([0xC3, 0x28, 0xFF]);
    bad_utf8.extend(br#""}]}"#);
    let mut bom = vec![0xEF, 0xBB, 0xBF];
    bom.extend(json!({"messages": ok}).to_string().into_bytes());
    let ok_body = json!({"model":"m","messages":ok}).to_string();
    vec![
        // --- not a JSON object: 400
        ("empty body", Input::Body(vec![]), Refused(400, None)),
        (
            "whitespace only",
            Input::Body(b"  \n\t ".to_vec()),
            Refused(400, None),
        ),
        (
            "not JSON",
            Input::Body(b"hello".to_vec()),
            Refused(400, None),
        ),
        (
            "truncated JSON",
            Input::Body(br#"{"messages":[{"role":"us"#.to_vec()),
            Refused(400, None),
        ),
        (
            "trailing garbage",
            Input::Body(format!("{ok_body} x").into_bytes()),
            Refused(400, None),
        ),
        (
            "UTF-8 byte order mark",
            Input::Body(bom),
            Refused(400, None),
        ),
        (
            "invalid UTF-8 in a string",
            Input::Body(bad_utf8),
            Refused(400, None),
        ),
        (
            "lone surrogate escape",
            Input::Body(br#"{"messages":[{"role":"user","content":"\ud800"}]}"#.to_vec()),
            Refused(400, None),
        ),
        (
            "number out of range",
            Input::Body(br#"{"temperature":1e400,"messages":[]}"#.to_vec()),
            Refused(400, None),
        ),
        // serde_json's recursion limit (128) answers long before the stack could overflow
        (
            "100k nested arrays inside a message",
            Input::Body(deep_inside),
            Refused(400, None),
        ),
        (
            "100k nested arrays at the top",
            Input::Body(vec![b'['; 100_000]),
            Refused(400, None),
        ),
        (
            "an array at the top",
            body(json!([{"messages": []}])),
            Refused(400, None),
        ),
        (
            "a string at the top",
            body(json!("messages")),
            Refused(400, None),
        ),
        ("null at the top", body(Value::Null), Refused(400, None)),
        // --- `messages`: 400, param messages
        (
            "messages missing",
            body(json!({"model":"m"})),
            Refused(400, Some("messages")),
        ),
        (
            "messages null",
            body(json!({"messages":null})),
            Refused(400, Some("messages")),
        ),
        (
            "messages an object",
            body(json!({"messages":{"role":"user"}})),
            Refused(400, Some("messages")),
        ),
        (
            "messages a string",
            body(json!({"messages":"hi"})),
            Refused(400, Some("messages")),
        ),
        (
            "duplicate key, the last one not an array",
            Input::Body(br#"{"messages":[],"messages":5}"#.to_vec()),
            Refused(400, Some("messages")),
        ),
        (
            "a message that is a string",
            msgs(json!(["hi"])),
            Refused(400, Some("messages")),
        ),
        (
            "a message that is null",
            msgs(json!([{"role":"user","content":"a"}, null])),
            Refused(400, Some("messages")),
        ),
        (
            "a message that is an array",
            msgs(json!([[{"role":"user","content":"a"}]])),
            Refused(400, Some("messages")),
        ),
        (
            "a message without role",
            msgs(json!([{"content":"a"}])),
            Refused(400, Some("messages")),
        ),
        (
            "role a number",
            msgs(json!([{"role":1,"content":"a"}])),
            Refused(400, Some("messages")),
        ),
        (
            "role null",
            msgs(json!([{"role":null,"content":"a"}])),
            Refused(400, Some("messages")),
        ),
        (
            "role an object",
            msgs(json!([{"role":{"name":"user"},"content":"a"}])),
            Refused(400, Some("messages")),
        ),
        // --- options ctxgate reads: 400 with their param
        (
            "stream a string",
            body(json!({"messages":ok,"stream":"yes"})),
            Refused(400, Some("stream")),
        ),
        (
            "stream a number",
            body(json!({"messages":ok,"stream":1})),
            Refused(400, Some("stream")),
        ),
        (
            "n zero",
            body(json!({"messages":ok,"n":0})),
            Refused(400, Some("n")),
        ),
        (
            "n negative",
            body(json!({"messages":ok,"n":-1})),
            Refused(400, Some("n")),
        ),
        (
            "n a string",
            body(json!({"messages":ok,"n":"2"})),
            Refused(400, Some("n")),
        ),
        (
            "n a fraction",
            body(json!({"messages":ok,"n":1.5})),
            Refused(400, Some("n")),
        ),
        // --- size and headers
        (
            "body over server.max_body_bytes",
            msgs(json!([{"role":"user","content":"x".repeat(MAX_BODY as usize)}])),
            Refused(413, None),
        ),
        (
            "unknown strategy header",
            Input::Header(
                "x-ctxgate-strategy",
                b"shrink".to_vec(),
                ok_body.clone().into_bytes(),
            ),
            Refused(400, None),
        ),
        (
            "strategy header not UTF-8",
            Input::Header(
                "x-ctxgate-strategy",
                vec![b'p', 0xFF, b'e'],
                ok_body.clone().into_bytes(),
            ),
            Refused(400, None),
        ),
        (
            "a 1 MiB header",
            Input::Raw(
                format!(
                    "{}x-junk: {}\r\ncontent-length: {}\r\n\r\n{ok_body}",
                    raw_head(""),
                    "a".repeat(1 << 20),
                    ok_body.len()
                )
                .into_bytes(),
                false,
            ),
            Http(431),
        ),
        (
            "200 headers",
            Input::Raw(
                format!(
                    "{}{}content-length: {}\r\n\r\n{ok_body}",
                    raw_head(""),
                    (0..200)
                        .map(|i| format!("x-h{i}: v\r\n"))
                        .collect::<String>(),
                    ok_body.len()
                )
                .into_bytes(),
                false,
            ),
            Http(431),
        ),
        (
            "content-length not a number",
            Input::Raw(
                format!("{}content-length: ten\r\n\r\n{ok_body}", raw_head("")).into_bytes(),
                false,
            ),
            Http(400),
        ),
        // --- bodies the client breaks off
        (
            "chunk framing broken (chunk longer than its size)",
            Input::Raw(
                format!(
                    "{}transfer-encoding: chunked\r\n\r\n3\r\n{{\"messages\"\r\n0\r\n\r\n",
                    raw_head("")
                )
                .into_bytes(),
                false,
            ),
            CutShort,
        ),
        (
            "chunked body cut off, then the client closes",
            Input::Raw(
                format!(
                    "{}transfer-encoding: chunked\r\n\r\n40\r\n{{\"messages\":[",
                    raw_head("")
                )
                .into_bytes(),
                true,
            ),
            CutShort,
        ),
        (
            "content-length longer than the body, then the client closes",
            Input::Raw(
                format!("{}content-length: 500\r\n\r\n{ok_body}", raw_head("")).into_bytes(),
                true,
            ),
            CutShort,
        ),
        // --- shapes the upstream judges: forwarded byte for byte
        (
            "content a number",
            msgs(json!([{"role":"user","content":42}])),
            PassThrough,
        ),
        (
            "content an object",
            msgs(json!([{"role":"user","content":{"text":"hi"}}])),
            PassThrough,
        ),
        (
            "content parts that are not objects",
            msgs(json!([{"role":"user","content":[1, null, "x"]}])),
            PassThrough,
        ),
        (
            "an unknown role",
            msgs(json!([{"role":"wizard","content":"abracadabra"}])),
            PassThrough,
        ),
        (
            "duplicate tool call ids",
            msgs(json!([{"role":"user","content":"go"},
            {"role":"assistant","content":null,"tool_calls":[
                {"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},
                {"id":"c1","type":"function","function":{"name":"g","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"one"},
            {"role":"tool","tool_call_id":"c1","content":"two"}])),
            PassThrough,
        ),
        (
            "a tool message answering nothing",
            msgs(json!([{"role":"user","content":"go"},
            {"role":"tool","tool_call_id":"never_called","content":"orphan"}])),
            PassThrough,
        ),
        (
            "a tool message without tool_call_id",
            msgs(json!([{"role":"user","content":"go"},
            {"role":"tool","content":"who asked"}])),
            PassThrough,
        ),
        (
            "a NUL character in content",
            msgs(json!([{"role":"user","content":"a\u{0}b"}])),
            PassThrough,
        ),
        (
            "a content-type that is not JSON",
            Input::Header(
                "content-type",
                b"text/plain".to_vec(),
                ok_body.clone().into_bytes(),
            ),
            PassThrough,
        ),
        // --- allowed shapes
        ("content a string", msgs(ok.clone()), Accepted),
        (
            "content an array of text parts",
            msgs(
                json!([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]),
            ),
            Accepted,
        ),
        (
            "assistant null content with tool calls, then the result",
            msgs(json!([{"role":"user","content":"go"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"done"}])),
            Accepted,
        ),
        (
            "stream and n null",
            body(json!({"model":"m","messages":ok,"stream":null,"n":null})),
            Accepted,
        ),
        (
            "n 1 and stream false",
            body(json!({"model":"m","messages":ok,"stream":false,"n":1})),
            Accepted,
        ),
        // --- odd shapes through the planner
        (
            "odd shapes in a conversation that gets rewritten",
            body(long_odd_conversation()),
            Rewritten,
        ),
    ]
}

/// Sends raw bytes; the response's status and body, or `None` when the connection closed without one.
async fn raw(h: &Harness, bytes: &[u8], half_close: bool) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    // the server may answer (and close) before reading everything: a failed write is not the test's concern
    let _ = s.write_all(bytes).await;
    if half_close {
        let _ = s.shutdown().await;
    }
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if let Some(end) = find(&out, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&out[..end]).to_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if out.len() >= end + 4 + len {
                    break;
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer and no close within 10 s");
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn check_openai_error(name: &str, body: &str, param: Option<&str>) {
    let v: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {body}"));
    let e = &v["error"];
    assert!(e["message"].is_string(), "{name}: {v}");
    assert_eq!(e["type"], "invalid_request_error", "{name}: {v}");
    assert!(e.get("code").is_some(), "{name}: {v}");
    assert_eq!(
        e["param"],
        param.map_or(Value::Null, Value::from),
        "{name}: {v}"
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer_and_stores_nothing() {
    let h = Harness::start_with(|c| {
        c.server.max_body_bytes = MAX_BODY;
        c.context.default_context_window = 8_000;
    })
    .await;
    let rows = table();
    assert!(rows.len() >= 30);
    let mut forwarded = 0;
    let mut stored = BTreeSet::new();
    for (i, (name, input, expect)) in rows.into_iter().enumerate() {
        let sid = format!("bad-{i}");
        let before = h.mock.requests().len();
        let (status, text, session, sent) = match input {
            Input::Raw(bytes, half_close) => {
                let got = raw(&h, &bytes, half_close).await;
                let (status, text) = got.unwrap_or((0, String::new()));
                (status, text, None, None)
            }
            input => {
                let (extra, b) = match input {
                    Input::Body(b) => (None, b),
                    Input::Header(k, v, b) => (Some((k, v)), b),
                    Input::Raw(..) => unreachable!(),
                };
                let mut req = h
                    .client
                    .post(h.url("/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer sk-bad")
                    .header("x-session-id", &sid);
                if let Some((k, v)) = extra {
                    req = req.header(k, reqwest::header::HeaderValue::from_bytes(&v).unwrap());
                }
                let resp = req.body(b.clone()).send().await.unwrap();
                let session = resp
                    .headers()
                    .get("x-ctxgate-session")
                    .map(|v| v.to_str().unwrap().to_string());
                (
                    resp.status().as_u16(),
                    resp.text().await.unwrap(),
                    session,
                    Some(b),
                )
            }
        };
        assert!(status < 500, "{name}: {status} {text}");
        let reached = h.mock.requests().len() - before;
        match expect {
            Refused(code, param) => {
                assert_eq!(status, code, "{name}: {text}");
                check_openai_error(name, &text, param);
                assert_eq!(reached, 0, "{name}: nothing goes upstream");
            }
            Http(code) => {
                assert_eq!(status, code, "{name}: {text}");
                assert_eq!(reached, 0, "{name}");
            }
            CutShort => {
                assert!(
                    status == 0 || (400..500).contains(&status),
                    "{name}: {status} {text}"
                );
                if status != 0 {
                    check_openai_error(name, &text, None);
                }
                assert_eq!(reached, 0, "{name}");
            }
            PassThrough | Accepted | Rewritten => {
                assert_eq!(status, 200, "{name}: {text}");
                assert_eq!(reached, 1, "{name}");
                forwarded += 1;
                let sent = sent.unwrap();
                let upstream_got = h.mock.requests().last().unwrap().body.clone();
                if expect == Rewritten {
                    assert_ne!(upstream_got.as_ref(), &sent[..], "{name}: rewritten");
                } else {
                    assert_eq!(upstream_got.as_ref(), &sent[..], "{name}: byte for byte");
                }
                let id = session.unwrap_or_else(|| panic!("{name}: no session header"));
                h.state.drain().await;
                let view = h.state.sessions.view(&id).await.unwrap().unwrap();
                let mut want = serde_json::from_slice::<Value>(&sent).unwrap()["messages"]
                    .as_array()
                    .unwrap()
                    .clone();
                want.push(json!({"role":"assistant","content":"mock reply"}));
                assert_eq!(view.messages, want, "{name}: stored exactly as sent");
                stored.insert(id);
            }
        }
    }
    assert_eq!(
        h.mock.requests().len(),
        forwarded,
        "only the forwarded rows reached the upstream"
    );
    h.state.drain().await;
    let (list, total) = h.state.sessions.list(1000, 0).await.unwrap();
    let ids: BTreeSet<String> = list.into_iter().map(|m| m.id).collect();
    assert_eq!(
        ids, stored,
        "the store holds the forwarded rows' sessions and nothing else"
    );
    assert_eq!(total as usize, stored.len());
}
