//! `context.on_overflow`: a request that fits only by dropping whole messages is refused in each dialect's own
//! error shape with nothing sent upstream (`refuse`), or sent with them dropped (`truncate`) and never silently:
//! `x-ctxgate-rewrite`, a warning log line and the turn's record say `truncated`, and the model is told and offered
//! the recall tools even when the client sent none — answered by ctxgate, never seen by the client. The pinned task
//! is aider's real request, not its few-shot example.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::Logged;

use common::{session_header, Harness};
use ctxgate::config::OnOverflow;
use ctxgate::mock::{chunk, MockReply};
use ctxgate::sse::SseParser;
use serde_json::{json, Value};
use std::time::Duration;

const EXAMPLE: &str = "Change get_factorial() to use math.factorial";
const TASK: &str = "Add a --verbose flag to main()";
const NEWEST: &str = "Now document the flag in the README.";
const DROPPED: &str = "[ctxgate] Earlier messages were dropped from this conversation";

/// Aider 0.86's second turn with the edit-block coder (`format_chat_chunks`: system, `example_messages`, the switch
/// to the real code base, the turns so far, the files added to the chat, the current request), no tools; the file
/// added is larger than the 4,000-token window. As (role, text) pairs, the system prompt first.
fn aider_turn() -> Vec<(&'static str, String)> {
    let file: String = (0..2_500)
        .map(|i| format!("    value_{i} = compute({i})\n"))
        .collect();
    vec![
        ("system", "Act as an expert software developer.\nAlways use best practices when coding.\nTake requests for changes to the supplied code.".into()),
        ("user", EXAMPLE.into()),
        ("assistant", "To make this change we need to modify `mathweb/flask/app.py` to:\n\n1. Import the math package.\n2. Remove the existing factorial() function.\n3. Update get_factorial() to call math.factorial instead.\n\nHere are the *SEARCH/REPLACE* blocks:\n\nmathweb/flask/app.py\n```python\n<<<<<<< SEARCH\nfrom flask import Flask\n=======\nimport math\nfrom flask import Flask\n>>>>>>> REPLACE\n```\n".into()),
        ("user", "Refactor hello() into its own file.".into()),
        ("assistant", "To make this change we need to modify `main.py` and make a new file `hello.py`:\n\n1. Make a new hello.py file with hello() in it.\n2. Remove hello() from main.py and replace it with an import.\n\nHere are the *SEARCH/REPLACE* blocks:\n\nhello.py\n```python\n<<<<<<< SEARCH\n=======\ndef hello():\n    \"print a greeting\"\n\n    print(\"hello\")\n>>>>>>> REPLACE\n```\n".into()),
        ("user", "I switched to a new code base. Please don't consider the above files or try to edit them any longer.".into()),
        ("assistant", "Ok.".into()),
        ("user", TASK.into()),
        ("assistant", "src/app.py\n```python\n<<<<<<< SEARCH\ndef main():\n=======\ndef main(verbose=False):\n>>>>>>> REPLACE\n```".into()),
        ("user", format!("I have *added these files to the chat* so you can go ahead and edit them.\n\n*Trust this message as the true contents of these files!*\n\nsrc/app.py\n```\ndef main():\n{file}```")),
        ("assistant", "Ok, any changes I propose will be to those files.".into()),
        ("user", NEWEST.into()),
    ]
}

fn chat_body(stream: bool) -> Value {
    let messages: Vec<Value> = aider_turn()
        .into_iter()
        .map(|(r, t)| json!({"role": r, "content": t}))
        .collect();
    json!({"model": "mock-model", "messages": messages, "stream": stream})
}

fn anthropic_body() -> Value {
    let turn = aider_turn();
    let messages: Vec<Value> = turn[1..]
        .iter()
        .map(|(r, t)| json!({"role": r, "content": t}))
        .collect();
    json!({"model": "mock-model", "max_tokens": 256, "system": turn[0].1, "messages": messages})
}

fn responses_body() -> Value {
    let turn = aider_turn();
    let input: Vec<Value> = turn[1..]
        .iter()
        .map(|(r, t)| json!({"role": r, "content": t}))
        .collect();
    json!({"model": "mock-model", "instructions": turn[0].1, "input": input})
}

/// A request: its path, headers and body.
type Call = (&'static str, Vec<(&'static str, &'static str)>, Value);

/// The same conversation in each dialect.
fn dialects() -> Vec<Call> {
    vec![
        (
            "/v1/chat/completions",
            vec![("authorization", "Bearer sk-overflow")],
            chat_body(false),
        ),
        (
            "/v1/messages",
            vec![
                ("x-api-key", "sk-ant-overflow"),
                ("anthropic-version", "2023-06-01"),
            ],
            anthropic_body(),
        ),
        (
            "/v1/responses",
            vec![("authorization", "Bearer sk-overflow")],
            responses_body(),
        ),
    ]
}

async fn gateway(on_overflow: OnOverflow) -> Harness {
    Harness::start_with(|c| {
        c.context.default_context_window = 4_000;
        c.context.on_overflow = on_overflow;
    })
    .await
}

#[tokio::test]
async fn refuse_answers_context_length_exceeded_in_each_dialects_shape_and_sends_nothing() {
    let h = gateway(OnOverflow::Refuse).await;
    for (path, headers, body) in dialects() {
        let r = h.post_json(path, &headers, &body).await;
        assert_eq!(r.status(), 400, "{path}");
        let v: Value = r.json().await.unwrap();
        match path {
            "/v1/messages" => {
                assert_eq!(v["type"], "error", "{v}");
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
                let m = v["error"]["message"].as_str().unwrap();
                // `prompt is too long: N tokens > M maximum`, as Anthropic says it (Claude Code reads it)
                let rest = m.strip_prefix("prompt is too long: ").expect(m);
                let (n, rest) = rest.split_once(" tokens > ").expect(m);
                let limit = rest.strip_suffix(" maximum").expect(m);
                assert!(
                    n.parse::<u64>().unwrap() > limit.parse::<u64>().unwrap(),
                    "{m}"
                );
                assert_eq!(limit, "3800", "the hard limit: 0.95 of the window");
            }
            _ => {
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
                assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
                let param = if path == "/v1/responses" {
                    "input"
                } else {
                    "messages"
                };
                assert_eq!(v["error"]["param"], param, "{v}");
                let m = v["error"]["message"].as_str().unwrap();
                assert!(m.contains("context.on_overflow"), "{m}");
            }
        }
    }
    assert!(h.mock.requests().is_empty(), "nothing went upstream");
    // A request that fits is not refused.
    let small = json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]});
    let r = h
        .post_json(
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-overflow")],
            &small,
        )
        .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn truncate_says_so_in_the_header_the_log_and_the_turn_record_in_every_dialect() {
    let (logged, _log) = Logged::json();
    let h = gateway(OnOverflow::Truncate).await;
    let mut sessions = Vec::new();
    for (i, (path, headers, body)) in dialects().into_iter().enumerate() {
        let r = h.post_json(path, &headers, &body).await;
        assert_eq!(r.status(), 200, "{path}");
        let rewrite = r.headers()["x-ctxgate-rewrite"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(rewrite.contains("truncated"), "{path}: {rewrite}");
        sessions.push(session_header(&r));
        r.text().await.unwrap();
        let sent = h.mock.requests()[i].json().to_string();
        assert!(
            sent.contains(TASK),
            "{path}: the task (aider's real request) is pinned"
        );
        assert!(
            !sent.contains(EXAMPLE),
            "{path}: aider's example is not the task"
        );
        assert!(sent.contains(NEWEST), "{path}");
        assert!(!sent.contains("value_2000"), "{path}: the file was dropped");
        assert!(sent.contains(DROPPED), "{path}: the model is told");
        assert!(
            sent.contains("search_history"),
            "{path}: and offered the tools"
        );
    }
    h.state.drain().await;
    for (sid, (path, _, _)) in sessions.iter().zip(dialects()) {
        let turns = h.get_json(&format!("/admin/sessions/{sid}/turns")).await;
        let stages = &turns["turns"][0]["stages"];
        assert!(
            stages.as_array().unwrap().iter().any(|s| s == "truncated"),
            "{path}: {turns}"
        );
    }
    let text = String::from_utf8(logged.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "ctxgate::context" && v["level"] == "WARN")
        .collect();
    assert_eq!(warnings.len(), 3, "one line per request: {text}");
    for w in &warnings {
        let f = &w["fields"];
        assert!(f["dropped_messages"].as_u64().unwrap() > 0, "{w}");
        assert!(
            f["message"]
                .as_str()
                .unwrap()
                .contains("context.on_overflow"),
            "{w}"
        );
        assert_eq!(f["recall_offered"], true, "{w}");
        assert!(
            !w.to_string().contains("value_1"),
            "no content in the log: {w}"
        );
    }
}

fn search_call(id: &str) -> Value {
    json!({"id": id, "type": "function",
        "function": {"name": "search_history", "arguments": "{\"query\":\"value_2000\"}"}})
}

#[tokio::test]
async fn a_client_without_tools_gets_recall_answered_in_proxy_and_sees_no_tool_call() {
    let h = gateway(OnOverflow::Truncate).await;
    h.mock.push(MockReply::message(
        json!({"role": "assistant", "content": null, "tool_calls": [search_call("s1")]}),
        "tool_calls",
    ));
    h.mock
        .push(MockReply::completion("value_2000 is compute(2000)."));
    let body = chat_body(false);
    assert!(body.get("tools").is_none());
    let r = h
        .post_json(
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-a")],
            &body,
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(
        !text.contains("search_history") && !text.contains("tool_calls"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "value_2000 is compute(2000)."
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 2, "ctxgate answered the call and asked again");
    let first = reqs[0].json();
    let names: Vec<&str> = first["tools"]
        .as_array()
        .expect("the recall tools, though the client sent none")
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["recall_tool_call", "search_history"]);
    let second = reqs[1].json();
    let answer = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == "s1")
        .expect("ctxgate's answer");
    assert!(
        answer["content"]
            .as_str()
            .unwrap()
            .contains("value_2000 = compute(2000)"),
        "the dropped file is searched: {answer}"
    );
}

#[tokio::test]
async fn a_streaming_client_without_tools_gets_one_clean_stream() {
    let h = gateway(OnOverflow::Truncate).await;
    let c1 = chunk(
        json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "s1", "type": "function",
            "function": {"name": "search_history", "arguments": ""}}]}),
        None,
    );
    let c2 = chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"query\":\"value_2000\"}"}}]}),
        None,
    );
    let c3 = chunk(json!({}), Some("tool_calls"));
    h.mock.push(MockReply::sse_chunks(
        &[c1, c2, c3],
        Duration::from_millis(2),
    ));
    h.mock.push(MockReply::sse_text(&["Found ", "it."], false));
    let r = h
        .post_json(
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-b")],
            &chat_body(true),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["x-ctxgate-rewrite"]
        .to_str()
        .unwrap()
        .contains("truncated"));
    let raw = r.bytes().await.unwrap();
    let text = String::from_utf8(raw.to_vec()).unwrap();
    assert!(
        !text.contains("search_history") && !text.contains("tool_calls"),
        "{text}"
    );
    let events = SseParser::new().feed(&raw);
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let content: String = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter_map(|c| {
            c.pointer("/choices/0/delta/content")?
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(content, "Found it.");
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[1]
        .json()
        .to_string()
        .contains("value_2000 = compute(2000)"));
}
