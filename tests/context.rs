//! The context engine through the gateway: rewriting over budget, the strategy header, refusal, records.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, session_header, Harness};
use ctxgate::context::shape::PLACEHOLDER_PREFIX;
use ctxgate::context::units::check_sequence;
use ctxgate::mock::MockReply;
use serde_json::{json, Value};

async fn small_window() -> Harness {
    Harness::start_with(|c| c.context.default_context_window = 8_000).await
}

async fn send(h: &Harness, body: &Value, extra: &[(&str, &str)]) -> reqwest::Response {
    let mut r = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-ctx")
        .header("x-session-id", "ctx-1");
    for (k, v) in extra {
        r = r.header(*k, *v);
    }
    r.json(body).send().await.unwrap()
}

#[tokio::test]
async fn an_oversized_request_is_rewritten_and_recorded() {
    let h = small_window().await;
    let messages = agent_history(14, 300);
    let body = json!({"model":"mock-model","messages":messages,"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}],"temperature":0.2});
    let resp = send(&h, &body, &[]).await;
    assert_eq!(resp.status(), 200);
    let sid = session_header(&resp);
    resp.text().await.unwrap();
    let sent = h.mock.requests()[0].json();
    let out = sent["messages"].as_array().unwrap();
    check_sequence(out).unwrap();
    assert!(out[0]["content"]
        .as_str()
        .unwrap()
        .starts_with("You are a coding agent."));
    assert_eq!(out[1], messages[1], "the task is kept");
    let cleared = out
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with(PLACEHOLDER_PREFIX))
        })
        .count();
    assert!(cleared >= 5, "old results cleared: {cleared}");
    assert_eq!(out.last(), messages.last(), "the newest result is whole");
    assert_eq!(sent["temperature"], 0.2, "other fields kept");
    let keys: Vec<&String> = sent.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["model", "messages", "tools", "temperature"],
        "field order kept"
    );

    // the admin API shows the full history and the record
    h.state.drain().await;
    let v: Value = h
        .client
        .get(h.url(&format!("/admin/sessions/{sid}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v["messages"].as_array().unwrap().len(),
        messages.len() + 1,
        "full history + reply"
    );
    assert!(
        v["messages"][3]["content"]
            .as_str()
            .unwrap()
            .starts_with("MARKER-0"),
        "stored whole"
    );
    let rec = &v["compressions"][0];
    assert_eq!(rec["stages"], json!(["cleared"]));
    assert!(rec["tokens_after"].as_u64() < rec["tokens_before"].as_u64());
    assert!(rec["pruned_call_ids"]
        .as_array()
        .unwrap()
        .contains(&json!("call_0")));
}

#[tokio::test]
async fn the_next_turn_sends_an_identical_prefix_and_adds_no_record() {
    let h = small_window().await;
    let mut messages = agent_history(14, 300);
    send(&h, &json!({"model":"mock-model","messages":messages}), &[])
        .await
        .text()
        .await
        .unwrap();
    messages.push(json!({"role":"assistant","content":"mock reply"}));
    messages.push(json!({"role":"user","content":"thanks, go on"}));
    send(&h, &json!({"model":"mock-model","messages":messages}), &[])
        .await
        .text()
        .await
        .unwrap();
    let reqs = h.mock.requests();
    let (a, b) = (reqs[0].json(), reqs[1].json());
    let (a, b) = (
        a["messages"].as_array().unwrap(),
        b["messages"].as_array().unwrap(),
    );
    assert_eq!(
        &b[..a.len()],
        &a[..],
        "turn two starts with turn one's request"
    );
    h.state.drain().await;
    let sid = h.state.sessions.list(10, 0).await.unwrap().0[0].id.clone();
    let v = h.state.sessions.view(&sid).await.unwrap().unwrap();
    assert_eq!(
        v.compressions.len(),
        1,
        "same cuts, same rewrite: one record"
    );
}

#[tokio::test]
async fn the_strategy_header_turns_rewriting_off_or_is_refused() {
    let h = small_window().await;
    let body = json!({"model":"mock-model","messages":agent_history(14, 300)});
    let raw = serde_json::to_vec(&body).unwrap();
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("x-ctxgate-strategy", "off")
        .header("content-type", "application/json")
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let req = &h.mock.requests()[0];
    assert_eq!(req.body.as_ref(), &raw[..], "off: the client's bytes");
    assert!(
        !req.headers.contains_key("x-ctxgate-strategy"),
        "our header stays with us"
    );
    let resp = send(&h, &body, &[("x-ctxgate-strategy", "shrink")]).await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-ctxgate-strategy"));
    assert_eq!(h.mock.requests().len(), 1);
}

#[tokio::test]
async fn a_request_that_cannot_fit_is_refused_without_calling_upstream() {
    let h = small_window().await;
    let huge = "word ".repeat(20_000);
    let body = json!({"model":"mock-model","messages":[{"role":"user","content":huge}]});
    h.mock.push(MockReply::completion("never"));
    let resp = send(&h, &body, &[]).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.headers().contains_key("x-ctxgate-session"));
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "context_length_exceeded");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("7600"),
        "{e}"
    );
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn models_from_the_table_and_config_set_the_window() {
    // gpt-4o has a 128k window in the shipped table: this request is far below it and goes through untouched
    let h = small_window().await;
    let body = json!({"model":"gpt-4o","messages":agent_history(14, 300)});
    let raw = serde_json::to_vec(&body).unwrap();
    h.post_chat(raw.clone()).await.text().await.unwrap();
    assert_eq!(h.mock.requests()[0].body.as_ref(), &raw[..]);
    // a config entry overrides the table
    let h = Harness::start_with(|c| {
        c.models.insert(
            "gpt-4o*".into(),
            ctxgate::config::ModelEntry {
                context_window: Some(8_000),
                ..Default::default()
            },
        );
    })
    .await;
    h.post_chat(raw.clone()).await.text().await.unwrap();
    assert_ne!(
        h.mock.requests()[0].body.as_ref(),
        &raw[..],
        "rewritten under the configured window"
    );
}
