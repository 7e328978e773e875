//! The per-turn record through the gateway: for every dialect, `GET /admin/sessions/{id}/turns` gives exactly what
//! the upstream received on each turn (unrewritten, cleared, summarised), where each element came from, the recall
//! calls answered, paging and auth.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{session_header, Harness};
use ctxgate::mock::{MockReply, RecordedRequest};
use serde_json::{json, Value};
use std::sync::Arc;

const SUMMARIZER: &str = "summarizer-model";

/// One dialect's requests: where they go, their headers, their conversation key and how a body is built.
struct Dialect {
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    key: &'static str,
    body: fn(&[Value]) -> Value,
    /// A task, then `turns` rounds of a tool call and its (long) result.
    history: fn(usize, usize) -> Vec<Value>,
    /// The client's next message after an answer (`answer`: the upstream's JSON).
    follow_up: fn(&Value) -> Vec<Value>,
}

fn out(i: usize, words: usize) -> String {
    (0..words).map(|w| format!("line{i}-{w} ")).collect()
}

const CHAT: Dialect = Dialect {
    path: "/v1/chat/completions",
    headers: &[
        ("authorization", "Bearer sk-turns"),
        ("x-session-id", "turns-chat"),
    ],
    key: "messages",
    body: |m| json!({"model": "mock-model", "messages": m}),
    history: |turns, words| {
        let mut m = vec![
            json!({"role": "system", "content": "You are a coding agent."}),
            json!({"role": "user", "content": "Fix the failing build."}),
        ];
        for i in 0..turns {
            let id = format!("call_{i}");
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "shell", "arguments": format!("{{\"cmd\":\"make step{i}\"}}")}}]}));
            m.push(json!({"role": "tool", "tool_call_id": id, "content": out(i, words)}));
        }
        m
    },
    follow_up: |answer| {
        vec![
            answer["choices"][0]["message"].clone(),
            json!({"role": "user", "content": "Go on with the next step."}),
        ]
    },
};

const ANTHROPIC: Dialect = Dialect {
    path: "/v1/messages",
    headers: &[
        ("x-api-key", "sk-ant-turns"),
        ("anthropic-version", "2023-06-01"),
    ],
    key: "messages",
    body: |m| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "You are Claude Code.",
               "metadata": {"user_id": "{\"session_id\":\"turns-anthropic\"}"}, "messages": m})
    },
    history: |turns, words| {
        let mut m = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "Fix the failing build."}]}),
        ];
        for i in 0..turns {
            let id = format!("toolu_{i:02}");
            m.push(json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": format!("Step {i}."), "signature": format!("sig{i}==")},
                {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": format!("make step{i}")}}]}));
            m.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": out(i, words)}]}));
        }
        m
    },
    follow_up: |answer| {
        vec![
            json!({"role": "assistant", "content": answer["content"]}),
            json!({"role": "user", "content": [{"type": "text", "text": "Go on with the next step."}]}),
        ]
    },
};

const RESPONSES: Dialect = Dialect {
    path: "/v1/responses",
    headers: &[
        ("authorization", "Bearer sk-turns"),
        ("session-id", "turns-responses"),
    ],
    key: "input",
    body: |m| json!({"model": "gpt-5-codex", "instructions": "You are Codex.", "input": m, "store": false}),
    history: |turns, words| {
        let mut m = vec![
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the failing build."}]}),
        ];
        for i in 0..turns {
            m.push(json!({"type": "function_call", "call_id": format!("call_{i:02}"), "name": "exec_command",
                          "arguments": format!("{{\"cmd\":\"make step{i}\"}}")}));
            m.push(json!({"type": "function_call_output", "call_id": format!("call_{i:02}"), "output": out(i, words)}));
        }
        m
    },
    follow_up: |answer| {
        let mut items: Vec<Value> = answer["output"].as_array().cloned().unwrap_or_default();
        items.push(json!({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "Go on with the next step."}]}));
        items
    },
};

async fn harness(store: Option<&std::path::Path>) -> Harness {
    let path = store.map(|p| p.join("ctxgate.db"));
    let h = Harness::start_with(move |c| {
        c.context.default_context_window = 6_000;
        for pattern in ["claude-*", "gpt-5*"] {
            c.models.insert(
                pattern.into(),
                ctxgate::config::ModelEntry {
                    context_window: Some(6_000),
                    ..Default::default()
                },
            );
        }
        c.summary.model = Some(SUMMARIZER.into());
        c.summary.wait_ms = 5_000;
        if let Some(p) = path {
            c.store.backend = ctxgate::config::StoreBackend::Sqlite;
            c.store.path = p;
        }
    })
    .await;
    // Summary requests are answered apart from the conversation's scripted replies.
    h.mock.set_responder(Arc::new(|r: &RecordedRequest| {
        (r.json()["model"] == SUMMARIZER).then(|| {
            MockReply::completion("The agent ran make steps 0 to 3; all failed on linking.")
        })
    }));
    h
}

async fn post(h: &Harness, d: &Dialect, body: &Value, extra: &[(&str, &str)]) -> (String, Value) {
    let mut r = h.client.post(h.url(d.path));
    for (k, v) in d.headers.iter().chain(extra) {
        r = r.header(*k, *v);
    }
    let resp = r.json(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let sid = session_header(&resp);
    (sid, resp.json().await.unwrap())
}

async fn turns(h: &Harness, sid: &str, query: &str) -> Value {
    let resp = h
        .client
        .get(h.url(&format!("/admin/sessions/{sid}/turns{query}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

fn conversation_requests(h: &Harness) -> Vec<RecordedRequest> {
    h.mock
        .requests()
        .into_iter()
        .filter(|r| r.json()["model"] != SUMMARIZER)
        .collect()
}

/// Drives a session of dialect `d`: a small first request (under the threshold), then a long one (old results
/// cleared), its follow-up, and one with a summary; each turn's record must hold exactly what the upstream got.
async fn every_turn_is_recorded_as_sent(d: &Dialect, store: Option<&std::path::Path>) {
    let h = harness(store).await;
    let small = (d.history)(1, 20);
    let (sid, _) = post(&h, d, &(d.body)(&small), &[]).await;
    let mut long = (d.history)(8, 200);
    let (sid2, answer) = post(&h, d, &(d.body)(&long), &[]).await;
    assert_eq!(sid, sid2, "one session");
    long.extend((d.follow_up)(&answer));
    let (_, answer) = post(&h, d, &(d.body)(&long), &[]).await;
    long.extend((d.follow_up)(&answer));
    post(
        &h,
        d,
        &(d.body)(&long),
        &[("x-ctxgate-strategy", "summarize")],
    )
    .await;
    h.state.drain().await;

    let sent = conversation_requests(&h);
    assert_eq!(sent.len(), 4);
    let page = turns(&h, &sid, "?limit=500").await;
    assert_eq!(page["total"], 4);
    let recorded = page["turns"].as_array().unwrap();
    assert_eq!(recorded.len(), 4);
    for (i, (turn, req)) in recorded.iter().zip(&sent).enumerate() {
        // Numbered from 1, as the inspector and the README's tour count them.
        assert_eq!(turn["turn"], i + 1);
        assert_eq!(turn["status"], 200);
        assert_eq!(
            turn["messages_sent"],
            req.json()[d.key],
            "turn {i}: what the upstream received"
        );
        assert_eq!(
            turn["sent_from"].as_array().unwrap().len(),
            turn["messages_sent"].as_array().unwrap().len()
        );
        assert!(turn["tokens"]["client"].as_u64().unwrap() > 0);
        assert!(turn["tokens"]["window"].as_u64().unwrap() == 6_000);
    }
    let kinds = |t: &Value| -> Vec<String> {
        t["sent_from"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["kind"].as_str().map(str::to_string))
            .collect()
    };
    // The small request went as it was: every element one of the session's nodes.
    assert_eq!(recorded[0]["rewritten"], false);
    assert!(kinds(&recorded[0]).is_empty());
    assert!(recorded[0]["sent_from"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["node"].is_string()));
    // The long ones: old results cleared, each standing for one of the client's messages.
    for t in &recorded[1..3] {
        assert_eq!(t["rewritten"], true, "{t}");
        assert!(kinds(t).iter().any(|k| k == "cleared"), "{:?}", kinds(t));
        assert!(t["tokens"]["sent"].as_u64() < t["tokens"]["client"].as_u64());
        for f in t["sent_from"].as_array().unwrap() {
            if f["kind"] == "cleared" {
                assert_eq!(f["replaces"].as_array().unwrap().len(), 1, "{f}");
            }
        }
    }
    // The summarised one: a summary standing for the messages it covers.
    let last = &recorded[3];
    assert_eq!(last["strategy"], "summarize");
    let summary = last["sent_from"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "summary")
        .unwrap_or_else(|| panic!("a summary was sent: {:?}", kinds(last)));
    assert!(
        summary["replaces"].as_array().unwrap().len() > 2,
        "{summary}"
    );
    assert!(last["summary_upto"].as_u64().unwrap() > 0);

    // Paging, and the figures alone.
    let one = turns(&h, &sid, "?offset=2&limit=1").await;
    assert_eq!(one["total"], 4);
    assert_eq!(one["turns"].as_array().unwrap().len(), 1);
    // `offset` counts the turns skipped: the third turn.
    assert_eq!(one["turns"][0]["turn"], 3);
    assert_eq!(
        one["turns"][0]["messages_sent"],
        recorded[2]["messages_sent"]
    );
    let figures = turns(&h, &sid, "?messages=false").await;
    assert!(figures["turns"][1].get("messages_sent").is_none());
    assert!(figures["turns"][1].get("sent_from").is_none());
    assert_eq!(figures["turns"][1]["tokens"], recorded[1]["tokens"]);
}

#[tokio::test]
async fn chat_turns_are_recorded_as_sent() {
    every_turn_is_recorded_as_sent(&CHAT, None).await;
}

#[tokio::test]
async fn chat_turns_are_recorded_as_sent_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    every_turn_is_recorded_as_sent(&CHAT, Some(dir.path())).await;
}

#[tokio::test]
async fn anthropic_turns_are_recorded_as_sent() {
    every_turn_is_recorded_as_sent(&ANTHROPIC, None).await;
}

#[tokio::test]
async fn responses_turns_are_recorded_as_sent() {
    every_turn_is_recorded_as_sent(&RESPONSES, None).await;
}

#[tokio::test]
async fn a_turn_lists_the_recall_calls_ctxgate_answered() {
    let h = harness(None).await;
    h.mock.push(MockReply::message(
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "r1", "type": "function",
            "function": {"name": "recall_tool_call", "arguments": "{\"call_id\":\"call_0\"}"}}]}),
        "tool_calls",
    ));
    h.mock
        .push(MockReply::completion("Step 0 printed line0-0."));
    let (sid, _) = post(&h, &CHAT, &(CHAT.body)(&(CHAT.history)(8, 200)), &[]).await;
    h.state.drain().await;
    let page = turns(&h, &sid, "").await;
    assert_eq!(page["total"], 1, "one turn, however many rounds");
    let t = &page["turns"][0];
    assert_eq!(t["recall_rounds"], 1);
    assert_eq!(t["recall_calls"][0]["name"], "recall_tool_call");
    assert_eq!(
        t["recall_calls"][0]["arguments"],
        json!({"call_id": "call_0"})
    );
    let first = &conversation_requests(&h)[0];
    assert_eq!(
        t["messages_sent"],
        first.json()["messages"],
        "the first round's request"
    );
}

#[tokio::test]
async fn a_failed_turn_is_recorded_too_and_unknown_sessions_are_404() {
    let h = harness(None).await;
    let (sid, _) = post(&h, &CHAT, &(CHAT.body)(&(CHAT.history)(1, 5)), &[]).await;
    h.mock
        .push(MockReply::json(500, json!({"error": {"message": "boom"}})));
    let mut r = h.client.post(h.url(CHAT.path));
    for (k, v) in CHAT.headers {
        r = r.header(*k, *v);
    }
    let mut m = (CHAT.history)(1, 5);
    m.push(json!({"role": "user", "content": "again"}));
    assert_eq!(r.json(&(CHAT.body)(&m)).send().await.unwrap().status(), 500);
    h.state.drain().await;
    let page = turns(&h, &sid, "").await;
    assert_eq!(page["total"], 2);
    assert_eq!(page["turns"][1]["status"], 500);
    assert_eq!(page["turns"][1]["messages_sent"], json!(m));
    let resp = h
        .client
        .get(h.url("/admin/sessions/nope/turns"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn turns_need_the_admin_token() {
    let h = Harness::start_with(|c| c.admin.token = Some("admin-secret".into())).await;
    let url = h.url("/admin/sessions/x/turns");
    assert_eq!(h.client.get(&url).send().await.unwrap().status(), 401);
    let wrong = h.client.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let right = h
        .client
        .get(&url)
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 404, "authenticated: no such session");
}
