//! `/v1/responses` over WebSocket: Codex's upgrade attempt is refused at once with 426 (it then falls back to
//! HTTP), without a trip upstream; every other `/v1/responses*` request still passes through.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Harness;
use ctxgate::mock::MockReply;
use serde_json::{json, Value};

/// Codex's handshake, as captured (`openai-beta: responses_websockets=…`).
fn upgrade(h: &Harness, path: &str) -> reqwest::RequestBuilder {
    h.client
        .get(h.url(path))
        .header("authorization", "Bearer sk-test")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("openai-beta", "responses_websockets=2026-02-06")
        .header("session-id", "019a-codex")
}

#[tokio::test]
async fn a_websocket_upgrade_is_refused_at_once_with_an_openai_error() {
    let h = Harness::start().await;
    let resp = upgrade(&h, "/v1/responses").send().await.unwrap();
    assert_eq!(resp.status(), 426);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "websocket_not_supported");
    assert_eq!(body["error"]["param"], Value::Null);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("POST /v1/responses"));
    // answered by ctxgate itself: the upstream never saw it
    assert!(h.mock.requests().is_empty(), "{:?}", h.mock.requests());
    // and again (Codex retries per turn): the same answer
    let again = upgrade(&h, "/v1/responses").send().await.unwrap();
    assert_eq!(again.status(), 426);
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn other_responses_requests_still_pass_through() {
    let h = Harness::start().await;
    let stored = json!({"id": "resp_1", "object": "response", "status": "completed", "output": []});
    // plain GET /v1/responses (no upgrade), retrieve, input items, delete, cancel, compact, and an upgrade header
    // on another path: all the upstream's
    // (method, path, with an upgrade header, the status the client gets: 0 any 2xx). `GET /v1/responses` and
    // `/compact` get the mock's own answers (relayed as they are); the others a scripted one.
    let calls: Vec<(reqwest::Method, &str, bool, u16)> = vec![
        (reqwest::Method::GET, "/v1/responses", false, 404),
        (reqwest::Method::GET, "/v1/responses/resp_1", false, 200),
        (
            reqwest::Method::GET,
            "/v1/responses/resp_1/input_items?limit=5",
            false,
            200,
        ),
        (reqwest::Method::DELETE, "/v1/responses/resp_1", false, 200),
        (
            reqwest::Method::POST,
            "/v1/responses/resp_1/cancel",
            false,
            200,
        ),
        (reqwest::Method::POST, "/v1/responses/compact", false, 0),
        (reqwest::Method::GET, "/v1/responses/resp_1", true, 200),
    ];
    for (i, (method, path, with_upgrade, status)) in calls.iter().enumerate() {
        let own = matches!(*path, "/v1/responses" | "/v1/responses/compact");
        if !own {
            h.mock.push(MockReply::json(200, stored.clone()));
        }
        let mut req = h
            .client
            .request(method.clone(), h.url(path))
            .header("authorization", "Bearer sk-test");
        if *with_upgrade {
            req = req
                .header("connection", "Upgrade")
                .header("upgrade", "websocket");
        }
        if *method == reqwest::Method::POST {
            req = req.body(r#"{"model":"gpt-5","input":[]}"#);
        }
        let resp = req.send().await.unwrap();
        if *status != 0 {
            assert_eq!(resp.status(), *status, "{method} {path}");
        } else {
            assert!(resp.status().is_success(), "{method} {path}");
        }
        let body = resp.json::<Value>().await.unwrap();
        if !own {
            assert_eq!(body, stored, "{method} {path}");
        }
        let seen = &h.mock.requests()[i];
        assert_eq!(seen.uri, *path);
        assert_eq!(seen.method, method.as_str());
        assert_eq!(seen.headers["authorization"], "Bearer sk-test");
    }
    assert_eq!(h.mock.requests().len(), calls.len());
}
