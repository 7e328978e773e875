//! Compressed request bodies (`Content-Encoding`): every coding, streamed or not, in every dialect, reaches the
//! upstream decoded and is managed (its history kept); a stack of codings is undone last first; a bomb is 413
//! within the body bound, an unknown coding 415, both in the dialect's shape; a passthrough body goes byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, session_header, Harness};
use ctxgate::mock::RecordedRequest;
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

fn encode(coding: &str, data: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        "br" => {
            let mut out = Vec::new();
            let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
            e.write_all(data).unwrap();
            drop(e);
            out
        }
        "zstd" => {
            ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
        }
        other => panic!("no encoder for {other}"),
    }
}

/// A stack as the header lists it: the first coding applied first.
fn encode_all(codings: &str, data: &[u8]) -> Vec<u8> {
    codings
        .split(',')
        .map(str::trim)
        .fold(data.to_vec(), |d, c| encode(c, &d))
}

const CODINGS: [&str; 4] = ["gzip", "deflate", "br", "zstd"];

#[derive(Clone, Copy, Debug)]
enum Dialect {
    Chat,
    Anthropic,
    Responses,
}

const DIALECTS: [Dialect; 3] = [Dialect::Chat, Dialect::Anthropic, Dialect::Responses];

impl Dialect {
    fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Anthropic => "/v1/messages",
            Dialect::Responses => "/v1/responses",
        }
    }

    /// A request of the dialect whose user message says `said`.
    fn body(self, said: &str, stream: bool) -> Value {
        match self {
            Dialect::Chat => json!({"model":"mock-model","stream":stream,
                "messages":[{"role":"system","content":"Be brief."},{"role":"user","content":said}]}),
            Dialect::Anthropic => {
                json!({"model":"claude-sonnet-4-5","max_tokens":256,"stream":stream,
                "system":"Be brief.","messages":[{"role":"user","content":said}]})
            }
            Dialect::Responses => {
                json!({"model":"mock-model","stream":stream,"instructions":"Be brief.",
                "input":[{"role":"user","content":said}]})
            }
        }
    }

    /// The conversation of a request as sent upstream.
    fn conversation(self, body: &Value) -> &Value {
        match self {
            Dialect::Chat | Dialect::Anthropic => &body["messages"],
            Dialect::Responses => &body["input"],
        }
    }

    fn headers(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Dialect::Anthropic => vec![
                ("x-api-key", "sk-ant-enc"),
                ("anthropic-version", "2023-06-01"),
            ],
            _ => vec![("authorization", "Bearer sk-enc")],
        }
    }

    /// The message of an error answer in the dialect's shape.
    fn error_message(self, v: &Value) -> String {
        if let Dialect::Anthropic = self {
            assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
        }
        assert!(v["error"]["type"].is_string(), "{v}");
        v["error"]["message"].as_str().unwrap().to_string()
    }
}

async fn post(
    h: &Harness,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> reqwest::Response {
    let mut req = h
        .client
        .post(h.url(path))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(body).send().await.unwrap()
}

/// The one request the upstream received last, on `path`.
fn last_upstream(h: &Harness, path: &str) -> RecordedRequest {
    let r = h.mock.requests().last().cloned().unwrap();
    assert_eq!(r.path(), path);
    r
}

/// What the upstream got is plain JSON: no `content-encoding`, a `content-length` (when one is sent) that is the
/// decoded body's.
fn assert_decoded(r: &RecordedRequest) {
    assert!(
        r.headers.get("content-encoding").is_none(),
        "{:?}",
        r.headers
    );
    if let Some(len) = r.headers.get("content-length") {
        assert_eq!(len.to_str().unwrap(), r.body.len().to_string());
    }
    assert!(r.json().is_object(), "JSON upstream");
}

#[tokio::test]
async fn every_coding_streamed_or_not_in_every_dialect_is_decoded_and_managed() {
    let mut h = Harness::start().await;
    for dialect in DIALECTS {
        for coding in CODINGS {
            for stream in [false, true] {
                let case = format!("{dialect:?}/{coding}/stream={stream}");
                let said = format!("compressed {case}: what is in the repository?");
                let body = dialect.body(&said, stream);
                let mut headers = dialect.headers();
                let sid = format!("enc-{dialect:?}-{coding}-{stream}");
                headers.push(("x-session-id", &sid));
                headers.push(("content-encoding", coding));
                let raw = serde_json::to_vec(&body).unwrap();
                let resp = post(&h, dialect.path(), &headers, encode(coding, &raw)).await;
                assert_eq!(resp.status(), 200, "{case}");
                let session = session_header(&resp);
                let is_sse = resp.headers()["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("text/event-stream");
                assert_eq!(is_sse, stream, "{case}");
                let text = resp.text().await.unwrap();
                assert!(text.contains("mock"), "{case}: {text}");
                h.next_turn().await;

                let up = last_upstream(&h, dialect.path());
                assert_decoded(&up);
                let sent = up.json();
                assert_eq!(
                    dialect.conversation(&sent),
                    dialect.conversation(&body),
                    "{case}"
                );
                assert_eq!(sent["stream"], stream, "{case}");

                // Managed: the turn is in the session's history.
                h.state.drain().await;
                let v = h.get_json(&format!("/admin/sessions/{session}")).await;
                let stored = v["messages"].to_string();
                assert!(stored.contains(&said), "{case}: {v}");
                assert!(stored.contains("mock"), "{case}: the reply kept too: {v}");
            }
        }
    }
}

#[tokio::test]
async fn a_compressed_long_run_is_rewritten_like_a_plain_one() {
    let h = Harness::start_with(|c| c.context.default_context_window = 8_000).await;
    let messages = agent_history(14, 300);
    let body = json!({"model":"mock-model","messages":messages});
    let raw = serde_json::to_vec(&body).unwrap();
    let resp = post(
        &h,
        "/v1/chat/completions",
        &[
            ("authorization", "Bearer sk-enc"),
            ("x-session-id", "enc-long"),
            ("content-encoding", "gzip"),
        ],
        encode("gzip", &raw),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let rewrite = resp.headers()["x-ctxgate-rewrite"]
        .to_str()
        .unwrap()
        .to_string();
    resp.text().await.unwrap();
    let up = last_upstream(&h, "/v1/chat/completions");
    assert_decoded(&up);
    assert!(up.body.len() < raw.len(), "rewritten: {rewrite}");
    let sent = up.json();
    assert_eq!(sent["messages"][1], messages[1], "the task is kept");
    assert_eq!(sent["messages"].as_array().unwrap().last(), messages.last());
}

#[tokio::test]
async fn count_tokens_decodes_its_body_too() {
    let h = Harness::start().await;
    let body = Dialect::Anthropic.body("how many tokens is this?", false);
    let mut headers = Dialect::Anthropic.headers();
    headers.push(("content-encoding", "br"));
    let raw = serde_json::to_vec(&body).unwrap();
    let resp = post(
        &h,
        "/v1/messages/count_tokens",
        &headers,
        encode("br", &raw),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert!(v["input_tokens"].as_u64().unwrap() > 0, "{v}");
    let up = last_upstream(&h, "/v1/messages/count_tokens");
    assert_decoded(&up);
    assert_eq!(up.json()["messages"], body["messages"]);
}

#[tokio::test]
async fn a_stack_of_codings_is_undone_last_first_and_identity_is_plain() {
    let h = Harness::start().await;
    let body = Dialect::Chat.body("stacked", false);
    let raw = serde_json::to_vec(&body).unwrap();
    for (header, data) in [
        ("gzip, br", encode_all("gzip, br", &raw)),
        ("deflate,zstd", encode_all("deflate, zstd", &raw)),
        ("identity", raw.clone()),
        ("identity, gzip", encode("gzip", &raw)),
    ] {
        let resp = post(
            &h,
            "/v1/chat/completions",
            &[
                ("authorization", "Bearer sk-enc"),
                ("content-encoding", header),
            ],
            data,
        )
        .await;
        assert_eq!(resp.status(), 200, "{header}");
        resp.text().await.unwrap();
        let up = last_upstream(&h, "/v1/chat/completions");
        assert_eq!(up.json()["messages"], body["messages"], "{header}");
        if header != "identity" {
            assert_decoded(&up);
        }
    }
    // Listed the wrong way round, the body is not what the header says: 400 naming the codings.
    let resp = post(
        &h,
        "/v1/chat/completions",
        &[
            ("authorization", "Bearer sk-enc"),
            ("content-encoding", "br, gzip"),
        ],
        encode_all("gzip, br", &raw),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("br, gzip"),
        "{v}"
    );
}

/// 100 MB of zeros, gzip'd to ~100 KB: refused with 413 in each dialect's shape once the decoded body passes
/// `server.max_body_bytes` (1 MiB here) — nothing goes upstream, the memory it held is given back (a plain request
/// that needs most of the budget is admitted right after), and the rejection is counted.
#[tokio::test]
async fn a_decompression_bomb_is_413_in_the_dialects_shape() {
    let h = Harness::start_with(|c| {
        c.server.max_body_bytes = 1 << 20;
        c.server.request_memory_bytes = 8 << 20;
    })
    .await;
    let bomb = encode("gzip", &vec![0u8; 100_000_000]);
    assert!(bomb.len() < 200_000, "{}", bomb.len());
    for dialect in DIALECTS {
        let mut headers = dialect.headers();
        headers.push(("content-encoding", "gzip"));
        // A guard against a hang, not a speed goal: the decoding stops at 1 MiB (milliseconds).
        let resp = tokio::time::timeout(
            Duration::from_secs(30),
            post(&h, dialect.path(), &headers, bomb.clone()),
        )
        .await
        .expect("answered");
        assert_eq!(resp.status(), 413, "{dialect:?}");
        let v: Value = resp.json().await.unwrap();
        let message = dialect.error_message(&v);
        assert!(message.contains("server.max_body_bytes"), "{message}");
        assert!(message.contains("gzip"), "{message}");
    }
    assert!(h.mock.requests().is_empty(), "nothing went upstream");
    let rejected = h
        .metric(
            r#"ctxgate_requests_rejected_total{dialect="chat",reason="too_large",route="chat"}"#,
        )
        .await;
    assert_eq!(rejected, 1.0);
    // The budget is whole again: a plain body close to the limit is admitted.
    let filler = "x".repeat(900_000);
    let resp = post(
        &h,
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-enc")],
        serde_json::to_vec(&Dialect::Chat.body(&filler, false)).unwrap(),
    )
    .await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn an_unknown_coding_is_415_naming_it_and_corrupt_data_is_400() {
    let h = Harness::start().await;
    for dialect in DIALECTS {
        let mut headers = dialect.headers();
        headers.push(("content-encoding", "xz"));
        let resp = post(&h, dialect.path(), &headers, b"\xfd7zXZ\0".to_vec()).await;
        assert_eq!(resp.status(), 415, "{dialect:?}");
        let v: Value = resp.json().await.unwrap();
        let message = dialect.error_message(&v);
        assert!(message.contains("\"xz\""), "{message}");

        let mut headers = dialect.headers();
        headers.push(("content-encoding", "zstd"));
        let raw = serde_json::to_vec(&dialect.body("hi", false)).unwrap();
        let resp = post(&h, dialect.path(), &headers, raw).await;
        assert_eq!(resp.status(), 400, "{dialect:?}");
        let v: Value = resp.json().await.unwrap();
        assert!(dialect.error_message(&v).contains("zstd"), "{v}");
    }
    assert!(h.mock.requests().is_empty(), "nothing went upstream");
}

#[tokio::test]
async fn a_passthrough_body_goes_byte_for_byte_with_its_coding() {
    let h = Harness::start().await;
    let raw =
        serde_json::to_vec(&json!({"model":"text-embedding-3-small","input":"hello"})).unwrap();
    for coding in CODINGS {
        let data = encode(coding, &raw);
        let resp = post(
            &h,
            "/v1/embeddings",
            &[
                ("authorization", "Bearer sk-enc"),
                ("content-encoding", coding),
            ],
            data.clone(),
        )
        .await;
        resp.bytes().await.unwrap();
        let up = last_upstream(&h, "/v1/embeddings");
        assert_eq!(up.body, data, "{coding}: the bytes as sent");
        assert_eq!(up.headers["content-encoding"], coding);
    }
    // An unknown coding is the upstream's business there.
    let resp = post(
        &h,
        "/v1/embeddings",
        &[
            ("authorization", "Bearer sk-enc"),
            ("content-encoding", "xz"),
        ],
        b"opaque".to_vec(),
    )
    .await;
    assert_ne!(resp.status(), 415);
    assert_eq!(last_upstream(&h, "/v1/embeddings").body, &b"opaque"[..]);
}
