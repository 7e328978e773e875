//! The mock upstream's HTTP control API (`/_mock/*`), which the client-library suites in `tests/clients/` use to
//! script the standalone `ctxgate mock-upstream`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Harness;
use serde_json::{json, Value};

async fn control(h: &Harness, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let url = format!("http://{}{path}", h.mock.addr);
    let mut req = h.client.request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.json().await.unwrap()
}

#[tokio::test]
async fn scripted_replies_are_answered_in_order_and_recorded() {
    let h = Harness::start().await;
    let completion = json!({"id":"chatcmpl-s","object":"chat.completion","created":1,"model":"m",
        "choices":[{"index":0,"message":{"role":"assistant","content":"scripted"},"finish_reason":"stop"}]});
    let chunk = json!({"id":"chatcmpl-t","object":"chat.completion.chunk","created":2,"model":"m",
        "choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]});
    let usage = json!({"prompt_tokens":3,"completion_tokens":1,"total_tokens":4});
    let queued = control(
        &h,
        reqwest::Method::POST,
        "/_mock/script",
        Some(json!([
            {"status": 429, "body": {"error": {"message": "slow down", "type": "requests"}},
             "headers": {"retry-after": "7"}},
            {"json": completion},
            {"sse": [chunk], "usage": usage},
        ])),
    )
    .await;
    assert_eq!(queued["queued"], 3);

    // Through the gateway: the 429 with its header, then the completion, then the stream, each untouched.
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
    let r = h.post_chat(body).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["message"],
        "slow down"
    );
    let r = h.post_chat(body).await;
    assert_eq!(r.json::<Value>().await.unwrap(), completion);
    let r = h
        .post_chat(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"s"}]}"#)
        .await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let usage_chunk = json!({"id":"chatcmpl-t","object":"chat.completion.chunk","created":2,"model":"m",
        "choices":[],"usage":usage});
    assert_eq!(
        text,
        format!("data: {chunk}\n\ndata: {usage_chunk}\n\ndata: [DONE]\n\n")
    );
    // The script is used up: the default reply again.
    let r = h.post_chat(body).await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["choices"][0]["message"]["content"],
        "mock reply"
    );

    let log = control(&h, reqwest::Method::GET, "/_mock/requests", None).await;
    let log = log.as_array().unwrap();
    assert_eq!(log.len(), 4, "control calls are not recorded");
    assert_eq!(log[0]["method"], "POST");
    assert_eq!(log[0]["uri"], "/v1/chat/completions");
    assert_eq!(
        log[0]["raw"], body,
        "the client's bytes, forwarded untouched"
    );
    assert_eq!(log[0]["body"]["messages"][0]["content"], "hello");
    assert_eq!(log[0]["headers"]["authorization"], "Bearer sk-test-a");
    assert_eq!(log[0]["reply"]["status"], 429);
    assert_eq!(log[1]["reply"]["body"], completion.to_string());
    assert_eq!(log[2]["reply"]["sse"], text);
    assert_eq!(log[3]["reply"]["status"], 200);

    control(&h, reqwest::Method::POST, "/_mock/reset", None).await;
    let log = control(&h, reqwest::Method::GET, "/_mock/requests", None).await;
    assert_eq!(log, json!([]));
}

#[tokio::test]
async fn bad_specs_are_refused_and_nothing_is_queued() {
    let h = Harness::start().await;
    for bad in [
        json!({"nothing": 1}),
        json!([{"json": {}}, {"status": 99, "body": {}}]),
        json!({"sse": "not a list"}),
        json!([1]),
    ] {
        let r = h
            .client
            .post(format!("http://{}/_mock/script", h.mock.addr))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    }
    let r = h
        .post_chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#)
        .await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["choices"][0]["message"]["content"],
        "mock reply",
        "a refused list queues nothing"
    );
}

/// The mock's default answers behave like the real APIs: a chat completion reports `prompt_tokens` counted with
/// the model's tokenizer, and a request without `model`
/// gets a 400 in its API's shape.
#[tokio::test]
async fn default_answers_estimate_prompt_tokens_and_refuse_a_missing_model() {
    let h = Harness::start().await;
    let base = format!("http://{}", h.mock.addr);
    let post = |path: &str, body: Value| h.client.post(format!("{base}{path}")).json(&body).send();
    let short = json!({"model":"m","messages":[{"role":"user","content":"hi"}]});
    let long = json!({"model":"m","messages":[{"role":"user","content":"word ".repeat(400)}]});
    let tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    let a: Value = post("/v1/chat/completions", short.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let b: Value = post("/v1/chat/completions", long.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tokens(&a), ctxgate::mock::chat_prompt_tokens(&short));
    assert_eq!(tokens(&b), ctxgate::mock::chat_prompt_tokens(&long));
    assert!(tokens(&b) > 400 && tokens(&a) < 20, "{a} {b}");
    assert_eq!(b["usage"]["total_tokens"], tokens(&b) + 5);
    // The stream's usage chunk says the same.
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let text = post("/v1/chat/completions", streamed)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(&format!("\"prompt_tokens\":{}", tokens(&b))),
        "{text}"
    );
    for (path, body, shape) in [
        (
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":"hi"}]}),
            "openai",
        ),
        ("/v1/responses", json!({"input":"hi"}), "openai"),
        (
            "/v1/messages",
            json!({"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}),
            "anthropic",
        ),
    ] {
        let resp = post(path, body).await.unwrap();
        assert_eq!(resp.status(), 400, "{path}");
        let v: Value = resp.json().await.unwrap();
        if shape == "anthropic" {
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], "invalid_request_error");
        } else {
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            assert_eq!(v["error"]["param"], "model");
        }
    }
}
