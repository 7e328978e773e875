//! `context.on_overflow = "fallback"` in every dialect, with the operator's and the access log's lines: alone in its
//! test binary, because it captures the log with a scoped subscriber, and tests running beside it in the same
//! process can race it for the log's callsites (their events then never reach it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::fallback::{chat, model, posts, Call, AUTH};
use common::{Harness, Logged};
use ctxgate::config::OnOverflow;
use serde_json::{json, Value};

#[tokio::test]
async fn every_dialect_falls_back_with_its_header_and_log_lines() {
    let (logged, _log) = Logged::json();
    let h = Harness::start_with(|c| {
        c.context.on_overflow = OnOverflow::Fallback;
        c.context.default_context_window = 4_000;
        c.models
            .insert("small".into(), model(4_000, Some("large"), None));
        c.models.insert("large".into(), model(64_000, None, None));
    })
    .await;
    let chat_body = chat("small", 6_000);
    let messages = chat_body["messages"].as_array().unwrap()[1..].to_vec();
    let calls: Vec<Call> = vec![
        ("/v1/chat/completions", vec![AUTH], chat_body.clone()),
        (
            "/v1/messages",
            vec![
                ("x-api-key", "sk-ant-fallback"),
                ("anthropic-version", "2023-06-01"),
            ],
            json!({"model": "small", "max_tokens": 64, "system": "You are a careful assistant.", "messages": messages}),
        ),
        (
            "/v1/responses",
            vec![AUTH],
            json!({"model": "small", "instructions": "You are a careful assistant.", "input": messages}),
        ),
    ];
    for (i, (path, headers, body)) in calls.into_iter().enumerate() {
        let r = h.post_json(path, &headers, &body).await;
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["x-ctxgate-fallback"], "large", "{path}");
        r.text().await.unwrap();
        let sent = &posts(&h.mock)[i];
        assert_eq!(sent.json()["model"], "large", "{path}");
    }
    h.state.drain().await;
    let text = String::from_utf8(logged.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let of = |target: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|v| v["target"] == target && v["fields"]["fallback"] == "large")
            .collect()
    };
    // the operator's line and the access-log line of each request, both naming the two models
    for target in ["ctxgate::context", "ctxgate::access"] {
        let found = of(target);
        assert_eq!(found.len(), 3, "{target}: {text}");
        assert!(
            found.iter().all(|v| v["fields"]["model"] == "small"),
            "{text}"
        );
    }
    // never the content
    assert!(!text.contains("abc abc"));
}
