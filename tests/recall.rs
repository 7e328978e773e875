//! The recall tools: offered with rewritten requests, answered by ctxgate, invisible to the client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, Harness};
use ctxgate::dialect::chat::MessageAssembler;
use ctxgate::mock::{chunk, MockReply};
use ctxgate::sse::SseParser;
use serde_json::{json, Value};
use std::time::Duration;

const RECALL: &str = "recall_tool_call";
const SEARCH: &str = "search_history";

fn body(stream: bool) -> Value {
    let mut b = json!({"model":"mock-model","messages":agent_history(14, 300),
        "tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]});
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

async fn harness() -> Harness {
    Harness::start_with(|c| c.context.default_context_window = 8_000).await
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id":id,"type":"function","function":{"name":name,"arguments":args.to_string()}})
}

fn calls_reply(calls: Vec<Value>) -> MockReply {
    MockReply::message(
        json!({"role":"assistant","content":null,"tool_calls":calls}),
        "tool_calls",
    )
}

async fn post(h: &Harness, key: &str, b: &Value) -> reqwest::Response {
    h.client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("x-session-id", "recall-1")
        .json(b)
        .send()
        .await
        .unwrap()
}

/// The tool messages ctxgate added to the upstream request `i`.
/// The message carrying ctxgate's recall note in a sent request (chat keeps strict role order: the note rides at
/// the end of the last message ctxgate wrote).
fn note_of(sent: &Value) -> Option<&Value> {
    sent["messages"].as_array()?.iter().find(|m| {
        m["content"]
            .as_str()
            .is_some_and(|c| c.contains("[ctxgate] Some earlier tool results"))
    })
}

fn answers(h: &Harness, i: usize) -> Vec<Value> {
    let sent = h.mock.requests()[i].json();
    let msgs = sent["messages"].as_array().unwrap().clone();
    // The client's messages (the note rides inside one of them).
    let n = body(false)["messages"].as_array().unwrap().len();
    msgs[n..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_recall_is_answered_and_the_client_gets_an_ordinary_answer() {
    let h = harness().await;
    h.mock.push(calls_reply(vec![call(
        "r1",
        RECALL,
        json!({"call_id":"call_0"}),
    )]));
    h.mock
        .push(MockReply::completion("The first file says MARKER-0."));
    let resp = post(&h, "sk-a", &body(false)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(!text.contains(RECALL) && !text.contains(SEARCH), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The first file says MARKER-0."
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["usage"]["total_tokens"], 30,
        "usage summed over both rounds"
    );
    assert_eq!(v["id"], "chatcmpl-mock");
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 2);
    let first = reqs[0].json();
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file", RECALL, SEARCH]);
    assert!(
        note_of(&first)
            .is_some_and(|n| n["content"].as_str().unwrap().contains("call_0 read_file")),
        "the note lists it"
    );
    assert_eq!(
        first["messages"][0],
        body(false)["messages"][0],
        "the client's system prompt is untouched"
    );
    let a = answers(&h, 1);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0]["tool_call_id"], "r1");
    // The call's original arguments and its result, verbatim, under plain labels.
    let client = body(false);
    let (made, result) = (&client["messages"][2], &client["messages"][3]);
    assert_eq!(made["tool_calls"][0]["id"], "call_0");
    assert_eq!(
        a[0]["content"].as_str().unwrap(),
        format!(
            "Arguments of call call_0 (read_file):\n{}\n\nResult:\n{}",
            made["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
            result["content"].as_str().unwrap()
        )
    );
    // the internal exchange is kept apart from the history
    h.state.drain().await;
    let sid = h.state.sessions.list(10, 0).await.unwrap().0[0].id.clone();
    let view = h.state.sessions.view(&sid).await.unwrap().unwrap();
    assert_eq!(view.internal.len(), 1);
    assert_eq!(view.internal[0]["by"], "ctxgate");
    let last = view.messages.last().unwrap();
    assert_eq!(last["content"], "The first file says MARKER-0.");
    assert!(!serde_json::to_string(&view.messages)
        .unwrap()
        .contains(RECALL));
}

#[tokio::test]
async fn two_rounds_parallel_recalls_unknown_ids_and_search() {
    let h = harness().await;
    h.mock.push(calls_reply(vec![
        call("r1", RECALL, json!({"call_id":"call_1"})),
        call("r2", RECALL, json!({"call_id":"call_does_not_exist"})),
    ]));
    h.mock.push(calls_reply(vec![call(
        "r3",
        SEARCH,
        json!({"query":"marker-2 line5"}),
    )]));
    h.mock.push(MockReply::completion("done"));
    let v: Value = post(&h, "sk-a", &body(false)).await.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "done");
    assert_eq!(h.mock.requests().len(), 3);
    let a = answers(&h, 1);
    assert_eq!(a.len(), 2, "both parallel calls answered");
    assert!(a[0]["content"].as_str().unwrap().contains("MARKER-1"));
    assert!(a[1]["content"].as_str().unwrap().starts_with("Not found"));
    let a = answers(&h, 2);
    let found: Value = serde_json::from_str(a[2]["content"].as_str().unwrap()).unwrap();
    assert_eq!(found["matches"][0]["call_id"], "call_2");
    assert!(found["matches"][0]["snippet"]
        .as_str()
        .unwrap()
        .contains("MARKER-2"));
}

#[tokio::test]
async fn a_recall_mixed_with_a_client_call_asks_again() {
    let h = harness().await;
    h.mock.push(calls_reply(vec![
        call("r1", RECALL, json!({"call_id":"call_0"})),
        call("c9", "read_file", json!({"path":"x.rs"})),
    ]));
    h.mock.push(calls_reply(vec![call(
        "c10",
        "read_file",
        json!({"path":"x.rs"}),
    )]));
    let v: Value = post(&h, "sk-a", &body(false)).await.json().await.unwrap();
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["id"], "c10", "the model reissued the client call");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let second = h.mock.requests()[1].json();
    // the client's messages (the note rides inside one of them)
    let sent_before = body(false)["messages"].as_array().unwrap().len();
    let assistant = &second["messages"].as_array().unwrap()[sent_before];
    assert_eq!(
        assistant["tool_calls"].as_array().unwrap().len(),
        1,
        "only our call goes into the exchange"
    );
}

#[tokio::test]
async fn recall_ids_of_another_tenant_are_not_found() {
    let h = harness().await;
    // tenant A's history holds SECRET-A; tenant B asks for A's call id
    let mut a_body = body(false);
    a_body["messages"][3]["content"] = json!(format!("SECRET-A {}", "word ".repeat(400)));
    post(&h, "sk-a", &a_body).await.text().await.unwrap();
    let mut b_body = body(false);
    for m in b_body["messages"].as_array_mut().unwrap() {
        if let Some(id) = m
            .get("tool_call_id")
            .and_then(Value::as_str)
            .map(str::to_string)
        {
            m["tool_call_id"] = json!(format!("b_{id}"));
        }
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for c in calls {
                c["id"] = json!(format!("b_{}", c["id"].as_str().unwrap()));
            }
        }
    }
    h.mock.push(calls_reply(vec![
        call("r1", RECALL, json!({"call_id":"call_0"})),
        call("r2", SEARCH, json!({"query":"SECRET-A"})),
    ]));
    h.mock.push(MockReply::completion("ok"));
    post(&h, "sk-b", &b_body).await.text().await.unwrap();
    let a = answers(&h, h.mock.requests().len() - 1);
    assert_eq!(a.len(), 2);
    assert!(
        a[0]["content"].as_str().unwrap().starts_with("Not found"),
        "{}",
        a[0]
    );
    let found: Value = serde_json::from_str(a[1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        found["total_matches"], 0,
        "nothing of tenant A reaches tenant B: {found}"
    );
}

#[tokio::test]
async fn no_injection_when_tools_are_forbidden_or_names_clash() {
    let h = harness().await;
    let mut b = body(false);
    b["tool_choice"] = json!("none");
    post(&h, "sk-a", &b).await.text().await.unwrap();
    let mut b = body(false);
    b["tools"] = json!([{"type":"function","function":{"name":RECALL,"parameters":{}}}]);
    post(&h, "sk-a", &b).await.text().await.unwrap();
    for r in h.mock.requests() {
        let sent = r.json();
        let tools = sent["tools"].to_string();
        assert!(!tools.contains(SEARCH), "not offered: {tools}");
        assert!(!sent["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("[ctxgate] Some earlier"));
    }
}

#[tokio::test]
async fn when_rounds_run_out_the_last_reply_is_returned_without_our_calls() {
    let h = harness().await;
    for i in 0..4 {
        h.mock.push(MockReply::message(
            json!({"role":"assistant","content":format!("try {i}"),"tool_calls":[call(&format!("r{i}"), RECALL, json!({"call_id":"call_0"}))]}),
            "tool_calls",
        ));
    }
    let v: Value = post(&h, "sk-a", &body(false)).await.json().await.unwrap();
    assert_eq!(h.mock.requests().len(), 4, "first round + max_rounds (3)");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "try 3");
    assert!(m.get("tool_calls").is_none());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

fn recall_stream(id: &str, call_id: &str, usage: u64) -> MockReply {
    let mut c1 = chunk(
        json!({"role":"assistant","content":null,"tool_calls":[{"index":0,"id":id,"type":"function","function":{"name":RECALL,"arguments":""}}]}),
        None,
    );
    c1["id"] = json!(format!("up-{id}"));
    let c2 = chunk(
        json!({"tool_calls":[{"index":0,"function":{"arguments":format!("{{\"call_id\":\"{call_id}\"}}")}}]}),
        None,
    );
    let c3 = chunk(json!({}), Some("tool_calls"));
    let u = json!({"id":"x","object":"chat.completion.chunk","created":1,"model":"mock-model","choices":[],"usage":{"prompt_tokens":usage,"completion_tokens":1,"total_tokens":usage+1}});
    MockReply::sse_chunks(&[c1, c2, c3, u], Duration::from_millis(2))
}

#[tokio::test]
async fn streaming_recall_rounds_are_spliced_into_one_clean_stream() {
    let h = harness().await;
    h.mock.push(recall_stream("r1", "call_0", 100));
    h.mock.push(recall_stream("r2", "call_1", 200));
    h.mock.push(MockReply::sse_text(&["Found ", "it."], true));
    let resp = post(&h, "sk-a", &body(true)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let raw = resp.bytes().await.unwrap();
    let text = String::from_utf8(raw.to_vec()).unwrap();
    assert!(!text.contains(RECALL) && !text.contains(SEARCH), "{text}");
    let mut parser = SseParser::new();
    let events = parser.feed(&raw);
    assert_eq!(events.iter().filter(|e| e.data == "[DONE]").count(), 1);
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    let mut asm = MessageAssembler::new();
    let (mut roles, mut finishes, mut usages) = (0, 0, 0);
    for c in &chunks {
        assert_eq!(c["id"], "up-r1", "one id: the first round's");
        assert_eq!(c["object"], "chat.completion.chunk");
        roles += usize::from(c.pointer("/choices/0/delta/role").is_some());
        finishes += usize::from(
            c.pointer("/choices/0/finish_reason")
                .is_some_and(|f| !f.is_null()),
        );
        if let Some(u) = c.get("usage").filter(|u| u.is_object()) {
            usages += 1;
            assert_eq!(u["total_tokens"], 100 + 1 + 200 + 1 + 10 + 2, "summed");
        }
        asm.on_chunk(c);
    }
    assert_eq!((roles, finishes, usages), (1, 1, 1));
    let reply = asm.finish();
    assert_eq!(reply.message["content"], "Found it.");
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
    assert_eq!(h.mock.requests().len(), 3);
    assert!(answers(&h, 2)
        .iter()
        .any(|a| a["content"].as_str().unwrap().contains("MARKER-1")));
    h.state.drain().await;
    let sid = h.state.sessions.list(10, 0).await.unwrap().0[0].id.clone();
    let view = h.state.sessions.view(&sid).await.unwrap().unwrap();
    assert_eq!(
        view.messages.last().unwrap()["content"],
        "Found it.",
        "the client's reply is recorded"
    );
    assert_eq!(view.internal.len(), 2);
}

#[tokio::test]
async fn streaming_client_calls_are_relayed_and_injected_ones_swallowed() {
    let h = harness().await;
    let c1 = chunk(json!({"role":"assistant","content":"Let me look. "}), None);
    let c2 = chunk(
        json!({"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":"}}]}),
        None,
    );
    let c3 = chunk(
        json!({"tool_calls":[{"index":1,"id":"r1","type":"function","function":{"name":SEARCH,"arguments":"{\"query\":\"x\"}"}}]}),
        None,
    );
    let c4 = chunk(
        json!({"tool_calls":[{"index":0,"function":{"arguments":"\"a.rs\"}"}}]}),
        None,
    );
    let c5 = chunk(json!({}), Some("tool_calls"));
    h.mock
        .push(MockReply::sse_chunks(&[c1, c2, c3, c4, c5], Duration::ZERO));
    let raw = post(&h, "sk-a", &body(true)).await.bytes().await.unwrap();
    let text = String::from_utf8(raw.to_vec()).unwrap();
    assert!(!text.contains(SEARCH), "{text}");
    let mut asm = MessageAssembler::new();
    for e in SseParser::new().feed(&raw) {
        asm.on_event_data(&e.data);
    }
    let reply = asm.finish();
    assert_eq!(
        reply.message["tool_calls"],
        json!([{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.rs\"}"}}])
    );
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        h.mock.requests().len(),
        1,
        "the client's call ends the response"
    );
}

/// The note rides at the end of the last cleared result (no message of its own: chat keeps strict role order),
/// whatever the client's system message (none, or one whose content is not text), which stays untouched (the
/// gateway's token estimate of such a request is checked against a full recount in debug builds).
#[tokio::test]
async fn the_note_rides_in_the_last_cleared_result() {
    for first in [None, Some(json!({"role": "system", "content": null}))] {
        let h = harness().await;
        let mut b = body(false);
        let msgs = b["messages"].as_array_mut().unwrap();
        msgs.remove(0);
        if let Some(s) = &first {
            msgs.insert(0, s.clone());
        }
        let resp = post(&h, "sk-a", &b).await;
        assert_eq!(resp.status(), 200, "{first:?}");
        let sent = h.mock.requests()[0].json();
        let note = note_of(&sent).expect("a note");
        assert!(
            note["content"]
                .as_str()
                .unwrap()
                .contains("call_0 read_file"),
            "{first:?}"
        );
        if let Some(s) = &first {
            assert_eq!(
                &sent["messages"][0], s,
                "the client's system message is untouched"
            );
        }
        let msgs = sent["messages"].as_array().unwrap();
        let at = msgs.iter().position(|m| m == note).unwrap();
        assert_eq!(note["role"], "tool");
        assert!(
            note["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("[ctxgate] Tool result cleared")),
            "inside a cleared result: {note}"
        );
        assert!(
            msgs[at + 1..].iter().all(|m| !m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("[ctxgate] Tool result cleared"))),
            "the last one"
        );
        assert!(
            msgs.iter().skip(1).all(|m| m["role"] != "system"),
            "no system message after the conversation began"
        );
        assert_eq!(
            msgs.len(),
            b["messages"].as_array().unwrap().len(),
            "no message added"
        );
    }
}
