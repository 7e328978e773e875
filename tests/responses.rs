//! The OpenAI Responses dialect through the gateway: transparency, sessions, rewriting (valid for the API), recall
//! rounds in JSON and SSE, requests whose history the upstream keeps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{session_header, Harness};
use ctxgate::context::shape::PLACEHOLDER_PREFIX;
use ctxgate::dialect::responses::validate::{check_rewrite, check_sequence};
use ctxgate::mock::ResponsesReply;
use serde_json::{json, Value};

/// A Codex-like input: a task, then `turns` rounds of reasoning + a shell call and its (long) output.
fn history(turns: usize, words: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"type":"message","role":"user","content":[{"type":"input_text","text":"Fix the failing build."}]}),
    ];
    for i in 0..turns {
        m.push(json!({"type":"reasoning","id":format!("rs_{i}"),"summary":[],"encrypted_content":format!("gAAAA{i}==")}));
        m.push(
            json!({"type":"function_call","id":format!("fc_{i}"),"call_id":format!("call_{i:02}"),
            "name":"exec_command","arguments":format!("{{\"cmd\":\"make step{i}\"}}")}),
        );
        let out: String = (0..words).map(|w| format!("line{i}-{w} ")).collect();
        m.push(
            json!({"type":"function_call_output","call_id":format!("call_{i:02}"),"output":out}),
        );
    }
    m
}

fn body(input: &[Value]) -> Value {
    json!({"model":"gpt-5-codex","instructions":"You are Codex.","input":input,
           "tools":[{"type":"function","name":"exec_command","description":"Run","parameters":{"type":"object"}}],
           "store":false,"include":["reasoning.encrypted_content"],"prompt_cache_key":"sess-1"})
}

async fn post(h: &Harness, body: &Value) -> reqwest::Response {
    let headers = [
        ("authorization", "Bearer sk-test"),
        ("session-id", "codex-session-1"),
    ];
    h.post_json("/v1/responses", &headers, body).await
}

async fn small_window() -> Harness {
    common::small_window("gpt-5*", 6_000).await
}

#[tokio::test]
async fn an_untouched_request_goes_upstream_byte_for_byte_in_a_session_of_its_own() {
    let mut h = Harness::start().await;
    h.mock.push_responses(ResponsesReply::text("Done."));
    let b = body(&history(2, 10));
    let raw = serde_json::to_vec(&b).unwrap();
    let resp = post(&h, &b).await;
    assert_eq!(resp.status(), 200);
    let sid = session_header(&resp);
    assert!(sid.ends_with("-codex-session-1"), "{sid}");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["object"], "response");
    assert_eq!(&h.mock.requests()[0].body[..], &raw[..], "byte for byte");
    h.next_turn().await;
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
    assert_eq!(v["dialect"], "responses");
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(
        &msgs[..7],
        &b["input"].as_array().unwrap()[..],
        "the items as sent"
    );
    assert!(msgs.len() > 7, "and the answer's output items");
}

#[tokio::test]
async fn over_the_threshold_old_outputs_are_cleared_and_the_input_stays_valid() {
    let h = small_window().await;
    h.mock.push_responses(ResponsesReply::text("ok"));
    let input = history(8, 200);
    let b = body(&input);
    let resp = post(&h, &b).await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    let sent = h.mock.requests()[0].json();
    check_rewrite(&b, &sent).unwrap();
    let out = sent["input"].as_array().unwrap();
    check_sequence(out).unwrap();
    let cleared = out
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .filter(|i| {
            i["output"]
                .as_str()
                .is_some_and(|o| o.starts_with(PLACEHOLDER_PREFIX))
        })
        .count();
    // The oldest steps are folded (left out, a line each on the first output kept), later ones cleared in place.
    let folded = out
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .filter(|i| {
            i["output"]
                .as_str()
                .is_some_and(|o| o.contains(ctxgate::context::fold::FOLD_PREFIX))
        })
        .count();
    assert!(
        folded == 1,
        "old outputs folded ({folded}; {cleared} more cleared in place)"
    );
    assert_eq!(out.last(), input.last(), "the newest output is whole");
    assert_eq!(sent["instructions"], b["instructions"]);
    let tools = sent["tools"].as_array().unwrap();
    assert_eq!(tools[0], b["tools"][0]);
    assert!(tools
        .iter()
        .any(|t| t["name"] == "recall_tool_call" && t["type"] == "function"));
}

async fn recall_round_trip(stream: bool) {
    let h = small_window().await;
    let mut b = body(&history(8, 200));
    b["stream"] = json!(stream);
    h.mock.push_responses(ResponsesReply::items(vec![
        json!({"type":"reasoning","id":"rs_r","summary":[],"encrypted_content":"gAAAArecall=="}),
        json!({"type":"function_call","id":"fc_r","call_id":"call_recall","name":"recall_tool_call",
               "arguments":"{\"call_id\":\"call_00\"}"}),
    ]));
    h.mock
        .push_responses(ResponsesReply::text("The first step printed line0-0."));
    let resp = post(&h, &b).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        !text.contains("call_recall") && !text.contains("gAAAArecall"),
        "{text}"
    );
    if stream {
        assert_eq!(text.matches("event: response.created").count(), 1, "{text}");
        assert_eq!(
            text.matches("event: response.completed").count(),
            1,
            "{text}"
        );
        let mut last = None;
        for e in ctxgate::sse::SseParser::new().feed(text.as_bytes()) {
            let Ok(v) = serde_json::from_str::<Value>(&e.data) else {
                continue;
            };
            if let Some(n) = v["sequence_number"].as_u64() {
                assert!(
                    last.is_none_or(|l| n == l + 1),
                    "sequence numbers without gaps: {text}"
                );
                last = Some(n);
            }
        }
    } else {
        let v: Value = serde_json::from_str(&text).unwrap();
        let output = v["output"].as_array().unwrap();
        assert!(output.iter().all(|i| i["type"] != "function_call"), "{v}");
    }
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 2, "one follow-up");
    let second = reqs[1].json();
    let items = second["input"].as_array().unwrap();
    check_sequence(items).unwrap();
    let n = items.len();
    assert_eq!(
        items[n - 3]["encrypted_content"],
        "gAAAArecall==",
        "the reasoning that led to the call"
    );
    assert_eq!(items[n - 2]["name"], "recall_tool_call");
    assert_eq!(items[n - 1]["call_id"], "call_recall");
    // The original arguments and result, verbatim.
    let result: String = (0..200).map(|w| format!("line0-{w} ")).collect();
    assert_eq!(
        items[n - 1]["output"],
        format!("Arguments of call call_00 (exec_command):\n{{\"cmd\":\"make step0\"}}\n\nResult:\n{result}")
    );
}

#[tokio::test]
async fn a_recall_call_is_answered_by_ctxgate_in_a_json_answer() {
    recall_round_trip(false).await;
}

#[tokio::test]
async fn a_recall_call_is_answered_by_ctxgate_within_one_stream() {
    recall_round_trip(true).await;
}

#[tokio::test]
async fn history_kept_by_the_upstream_is_forwarded_as_sent_and_counted() {
    let h = small_window().await;
    let mut b = body(&history(8, 200));
    b["previous_response_id"] = json!("resp_earlier");
    let raw = serde_json::to_vec(&b).unwrap();
    post(&h, &b).await.text().await.unwrap();
    assert_eq!(&h.mock.requests()[0].body[..], &raw[..], "not rewritten");
    let metrics = h
        .client
        .get(h.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ctxgate_unmanaged_requests_total")
                && l.contains("reason=\"previous_response_id\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
}
