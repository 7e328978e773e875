//! What is recorded of a reply: error-ended streams are partial, empty replies store nothing; `n > 1` gets no
//! recall tools; a client leaving during JSON recall rounds still gets its turn recorded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, Harness};
use ctxgate::mock::{chunk, MockReply};
use ctxgate::session::manager::SessionView;
use serde_json::{json, Value};
use std::time::Duration;

const RECALL: &str = "recall_tool_call";

async fn chat(h: &Harness, sid: &str, body: &Value) -> (String, String) {
    let (id, resp) = h.chat_ok("sk-replies", sid, body).await;
    (id, resp.text().await.unwrap())
}

async fn view(h: &Harness, id: &str) -> SessionView {
    h.state.drain().await;
    h.state.sessions.view(id).await.unwrap().unwrap()
}

fn user(text: &str) -> Value {
    json!({"model":"m","stream":true,"messages":[{"role":"user","content":text}]})
}

/// An error event followed by `[DONE]` used to be stored as a complete reply.
#[tokio::test]
async fn an_error_event_then_done_is_recorded_partial() {
    let mut h = Harness::start().await;
    let err =
        json!({"error":{"message":"overloaded","type":"server_error","param":null,"code":null}});
    h.mock.push(MockReply::sse_chunks(
        &[
            chunk(json!({"role":"assistant","content":"half an ans"}), None),
            err,
        ],
        Duration::ZERO,
    ));
    let (id, text) = chat(&h, "err-done", &user("q")).await;
    assert!(
        text.contains("overloaded") && text.ends_with("data: [DONE]\n\n"),
        "relayed as is"
    );
    let turn = h.next_turn().await;
    assert!(!turn.outcome.reply.complete);
    let v = view(&h, &id).await;
    assert_eq!(v.messages.len(), 2);
    assert_eq!(v.messages[1]["content"], "half an ans");
    assert_eq!(v.partial, [1], "the reply is marked partial");
}

/// A bare `[DONE]` used to store an empty assistant message and move the head.
#[tokio::test]
async fn an_empty_reply_stores_nothing_and_the_head_stays() {
    let mut h = Harness::start().await;
    h.mock.push(MockReply::sse_chunks(&[], Duration::ZERO));
    h.mock.push(MockReply::sse_chunks(
        &[chunk(
            json!({"role":"assistant","content":""}),
            Some("stop"),
        )],
        Duration::ZERO,
    ));
    let (id, _) = chat(&h, "empty", &user("q")).await;
    h.next_turn().await;
    let (_, _) = chat(&h, "empty", &user("q")).await;
    h.next_turn().await;
    let v = view(&h, &id).await;
    assert_eq!(v.messages, [json!({"role":"user","content":"q"})]);
    assert_eq!(v.message_count, 1, "no empty assistant node");
    // the next turn continues from the user message, as if nothing had been answered
    let (_, _) = chat(
        &h,
        "empty",
        &json!({"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"},
            {"role":"user","content":"q2"}]}),
    )
    .await;
    let v = view(&h, &id).await;
    assert_eq!(v.messages.len(), 4);
    assert!(v.branches.is_empty(), "{:?}", v.branches);
}

fn long_body() -> Value {
    json!({"model":"mock-model","messages":agent_history(14, 300),
        "tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]})
}

async fn recall_harness() -> Harness {
    Harness::start_with(|c| c.context.default_context_window = 8_000).await
}

/// With `n > 1` the rewrite still applies but the recall tools are not offered: a call in `choices[1..]` could
/// not be answered within the response.
#[tokio::test]
async fn several_choices_get_the_rewrite_without_the_recall_tools() {
    let h = recall_harness().await;
    let mut body = long_body();
    body["n"] = json!(2);
    let (_, text) = chat(&h, "n2", &body).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "mock reply");
    let sent = h.mock.requests()[0].json();
    assert_ne!(
        sent["messages"], body["messages"],
        "the request was rewritten"
    );
    let names: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file"], "no recall tools with n > 1");
    assert!(!sent.to_string().contains(RECALL));
    // n = 1 still gets them
    body["n"] = json!(1);
    chat(&h, "n1", &body).await;
    assert!(h.mock.requests()[1].json()["tools"]
        .to_string()
        .contains(RECALL));
}

/// The JSON recall rounds used to run in the handler's future: a client leaving mid-round dropped them with the
/// turn's finisher, so the turn was neither recorded nor announced.
#[tokio::test]
async fn a_client_leaving_during_json_recall_rounds_still_gets_its_turn_recorded() {
    let mut h = recall_harness().await;
    h.mock.push(MockReply::message(
        json!({"role":"assistant","content":null,"tool_calls":[{"id":"r1","type":"function",
            "function":{"name":RECALL,"arguments":"{\"call_id\":\"call_0\"}"}}]}),
        "tool_calls",
    ));
    h.mock.push(
        MockReply::completion("answered after the client left").delayed(Duration::from_millis(500)),
    );
    let client = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-replies")
        .header("x-session-id", "leaver")
        .json(&long_body())
        .send();
    let client = tokio::spawn(client);
    // the client goes away once the second round is asked (its answer takes a while)
    while h.mock.requests().len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    let turn = h.next_turn().await;
    assert_eq!(
        turn.outcome.reply.message["content"],
        "answered after the client left"
    );
    let id = h.state.sessions.list(10, 0).await.unwrap().0[0].id.clone();
    let v = view(&h, &id).await;
    assert_eq!(
        v.messages.last().unwrap()["content"],
        "answered after the client left"
    );
    assert_eq!(v.internal.len(), 1, "the recall round is recorded too");
}
