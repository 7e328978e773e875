//! LLM summaries through the gateway: written when the threshold is crossed (or ahead of it), cached, incremental,
//! recorded, and never a reason for a request to fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{support_chat, Harness};
use ctxgate::context::units::check_sequence;
use ctxgate::mock::{MockReply, RecordedRequest};
use ctxgate::session::SessionView;
use ctxgate::store::records::SummaryRecord;
use ctxgate::store::Compression;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const SUMMARIZER: &str = "summarizer-model";

fn is_summary(r: &RecordedRequest) -> bool {
    r.json()["model"] == SUMMARIZER
}

/// Answers summary requests with `text` (after `delay`), or with `status` when it is not 200.
fn summarizer(h: &Harness, status: u16, text: &'static str, delay: Duration) {
    h.mock.set_responder(Arc::new(move |r: &RecordedRequest| {
        if !is_summary(r) {
            return None;
        }
        let reply = if status == 200 {
            MockReply::completion(text)
        } else {
            MockReply::json(
                status,
                json!({"error":{"message":"boom","type":"server_error"}}),
            )
        };
        Some(reply.delayed(delay))
    }));
}

async fn harness(wait_ms: u64, timeout_secs: u64) -> Harness {
    Harness::start_with(|c| {
        c.context.default_context_window = 4_000; // support_chat(6) ≈ 0.67 of it, support_chat(8) ≈ 0.88
        c.summary.model = Some(SUMMARIZER.into());
        c.summary.wait_ms = wait_ms;
        c.summary.timeout_secs = timeout_secs;
        c.summary.keep_recent = 4;
        c.summary.precompute_at = 0.6; // support_chat(6) is past it
    })
    .await
}

async fn send(h: &Harness, messages: &[Value]) -> Value {
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-sum")
        .header("x-session-id", "sum-1")
        .json(&json!({"model":"mock-model","messages":messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "a summary never fails the request");
    resp.json().await.unwrap()
}

fn chats(h: &Harness) -> Vec<Value> {
    h.mock
        .requests()
        .iter()
        .filter(|r| !is_summary(r))
        .map(|r| r.json())
        .collect()
}

fn summaries(h: &Harness) -> Vec<Value> {
    h.mock
        .requests()
        .iter()
        .filter(|r| is_summary(r))
        .map(|r| r.json())
        .collect()
}

/// The summary records among a session's compression records.
fn stored_summaries(v: &SessionView) -> Vec<&SummaryRecord> {
    v.compressions
        .iter()
        .filter_map(|c| match c {
            Compression::Summary(s) => Some(s),
            Compression::Rewrite(_) => None,
        })
        .collect()
}

async fn session(h: &Harness) -> SessionView {
    h.state.drain().await;
    let id = h.state.sessions.list(10, 0).await.unwrap().0[0].id.clone();
    h.state.sessions.view(&id).await.unwrap().unwrap()
}

#[tokio::test]
async fn crossing_the_threshold_replaces_old_history_by_the_summary_then_reuses_it() {
    let h = harness(5_000, 30).await;
    summarizer(
        &h,
        200,
        "Goals: travel help. Calls: call_0 looked up q0.",
        Duration::ZERO,
    );
    let mut m = support_chat(8);
    send(&h, &m).await;
    let s = summaries(&h);
    assert_eq!(s.len(), 1);
    let prompt = s[0]["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.contains("call call_0 lookup"),
        "the prompt names the call ids: {prompt}"
    );
    assert!(s[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("call id"));
    assert_eq!(s[0]["max_tokens"], 1000);
    let sent = &chats(&h)[0]["messages"];
    let out = sent.as_array().unwrap();
    check_sequence(out).unwrap();
    assert_eq!(out[0], m[0], "the client's system prompt, untouched");
    assert_eq!(out[1], m[1], "the task, pinned");
    // strict role order: the summary where its messages were, as an assistant message, the recall note at its end
    assert_eq!(out[2]["role"], "assistant");
    let summary = out[2]["content"].as_str().unwrap();
    assert!(summary.starts_with(
        "Summary of the earlier conversation: Goals: travel help. Calls: call_0 looked up q0.\n\n[ctxgate]"
    ));
    assert!(
        out[1..].iter().all(|x| x["role"] != "system"),
        "no system message after the task"
    );
    assert_eq!(out.last(), m.last());
    // the next turn: same prefix, the cached summary, no new summary request
    m.push(json!({"role":"assistant","content":"mock reply"}));
    m.push(json!({"role":"user","content":"thanks"}));
    send(&h, &m).await;
    assert_eq!(summaries(&h).len(), 1, "cached");
    let second = &chats(&h)[1]["messages"];
    assert_eq!(second.as_array().unwrap()[..3], out[..3], "the same prefix");
    let v = session(&h).await;
    let rec = stored_summaries(&v)[0];
    assert_eq!(rec.model, SUMMARIZER);
    assert!(!rec.precomputed);
    assert!(rec.covers.upto > 0);
    assert!(rec.tokens_before > rec.tokens_after);
    let shown = serde_json::to_value(rec).unwrap();
    assert!(shown["latency_ms"].is_u64());
    assert!(v.compressions.iter().any(
        |r| matches!(r, Compression::Rewrite(r) if r.stages.iter().any(|s| s == "summarized"))
    ));
    assert_eq!(
        v.messages.len(),
        m.len() + 1,
        "the full history stays whole"
    );
}

#[tokio::test]
async fn later_summaries_are_made_from_the_previous_one() {
    let h = harness(5_000, 30).await;
    summarizer(&h, 200, "S1 (call_0)", Duration::ZERO);
    let mut m = support_chat(8);
    send(&h, &m).await;
    for l in 8..20 {
        m.pop();
        m.extend(support_chat(l + 1).drain(1 + 4 * l..));
        send(&h, &m).await;
    }
    let s = summaries(&h);
    assert!(s.len() >= 2, "{} summaries", s.len());
    let second = s[1]["messages"][1]["content"].as_str().unwrap();
    assert!(
        second.starts_with("Previous summary:\nS1 (call_0)\n\nNew messages:"),
        "{second}"
    );
    assert!(
        !second.contains("[1] user: question 0"),
        "only the newly aged messages"
    );
}

#[tokio::test]
async fn a_summary_precomputed_in_the_background_serves_the_threshold_turn() {
    let h = harness(0, 30).await;
    summarizer(&h, 200, "Precomputed (call_0).", Duration::ZERO);
    let m = support_chat(6); // ~0.7 of the window: past precompute_at, under the threshold
    send(&h, &m).await;
    h.state.drain().await; // the background summary is stored
    assert_eq!(summaries(&h).len(), 1);
    assert_eq!(
        chats(&h)[0]["messages"],
        json!(m),
        "under the threshold: sent as is"
    );
    let mut m2 = m.clone();
    m2.pop();
    m2.extend(support_chat(8).drain(1 + 4 * 6..));
    send(&h, &m2).await;
    assert_eq!(
        summaries(&h).len(),
        1,
        "no synchronous summary call at the threshold"
    );
    let sent = &chats(&h)[1]["messages"];
    assert_eq!(
        sent[2]["content"],
        "Summary of the earlier conversation: Precomputed (call_0)."
    );
    let v = session(&h).await;
    assert!(stored_summaries(&v)[0].precomputed);
}

#[tokio::test]
async fn failed_slow_or_empty_summaries_fall_back_to_pruning() {
    for (status, text, delay, timeout, outcome) in [
        (500, "", Duration::ZERO, 30, "failed"),
        (200, "late", Duration::from_millis(2_500), 1, "timeout"),
        (200, "   ", Duration::ZERO, 30, "empty"),
    ] {
        let h = harness(3_000, timeout).await;
        summarizer(&h, status, text, delay);
        let m = support_chat(8);
        let v = send(&h, &m).await;
        assert_eq!(v["choices"][0]["message"]["content"], "mock reply");
        let sent = &chats(&h)[0]["messages"];
        let out = sent.as_array().unwrap();
        check_sequence(out).unwrap();
        assert!(out.len() < m.len(), "pruned instead ({status}, {text:?})");
        assert!(!sent
            .to_string()
            .contains("Summary of the earlier conversation"));
        let v = session(&h).await;
        assert!(stored_summaries(&v).is_empty());
        let series = format!("ctxgate_summarizer_calls_total{{outcome=\"{outcome}\"}}");
        assert_eq!(h.metric(&series).await, 1.0, "{series}");
    }
}

#[tokio::test]
async fn an_operator_can_compress_a_session_now() {
    let h = harness(0, 30).await;
    summarizer(&h, 200, "Manual summary (call_1).", Duration::ZERO);
    let m = support_chat(3);
    h.client
        .post(h.url("/v1/chat/completions"))
        .header("x-session-id", "manual")
        .json(&json!({"model":"gpt-4o","messages":m}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let id = h.state.sessions.list(10, 0).await.unwrap().0[0].id.clone();
    let resp = h
        .client
        .post(h.url(&format!("/admin/sessions/{id}/compress")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let rec: Value = resp.json().await.unwrap();
    assert_eq!(rec["summary"], "Manual summary (call_1).");
    assert_eq!(rec["kind"], "summary");
    let v = session(&h).await;
    assert!(matches!(
        v.compressions.last().unwrap(),
        Compression::Summary(s) if s.summary == "Manual summary (call_1)."
    ));
    let missing = h
        .client
        .post(h.url("/admin/sessions/nope/compress"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}
