//! The gateway and `ctxgate replay` plan with the same function: every request of a conversation, sent through
//! the real gateway (in front of the mock upstream), reaches the upstream as exactly the bytes replay says it
//! would send, with the token count replay reports. A hand-made agent run always; the shared traces
//! (`../shared/traces`, or the directory in `CTXGATE_TRACES`) when present.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

mod common;

use common::Harness;
use ctxgate::config::{Config, Strategy};
use ctxgate::context::tokens::{Encoding, TokenCounter};
use ctxgate::replay::{replay_requests, Outcome, ReplayOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A model the shipped table does not know: its window is `context.default_context_window` on both sides.
const MODEL: &str = "agreement-model";
const WINDOW: u64 = 16_000;

/// Three tasks, each a run loop of `reads` file reads of ~`words` words, and a final answer.
fn agent_trace(reads: usize, words: usize) -> Value {
    let mut m = vec![json!({"role":"system","content":"You are a coding agent."})];
    for task in 0..3 {
        m.push(json!({"role":"user","content":format!("Task {task}: fix the failing test.")}));
        for i in 0..reads {
            let id = format!("call_{task}_{i}");
            m.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
                "function":{"name":"read_file","arguments":format!("{{\"path\":\"src/t{task}/f{i}.rs\"}}")}}]}));
            let text: Vec<String> = (0..words).map(|w| format!("line{w}")).collect();
            m.push(json!({"role":"tool","tool_call_id":id,"content":text.join(" ")}));
        }
        m.push(json!({"role":"assistant","content":format!("Task {task} is fixed.")}));
    }
    let tools = json!([{"type":"function","function":{"name":"read_file",
        "parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]);
    json!({"id":"agent","model":"gpt-4o","tools":tools,"messages":m})
}

fn config(strategy: Strategy) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.context.default_context_window = WINDOW;
        c.context.strategy = strategy;
    }
}

/// Sends every request of `trace` through a fresh gateway and checks each reaches the upstream as replay says.
/// Returns how many were rewritten.
async fn agree(name: &str, trace: &Value, strategy: Strategy) -> usize {
    let mut h = Harness::start_with(config(strategy)).await;
    let mut cfg = Config::default();
    config(strategy)(&mut cfg);
    let opts = ReplayOptions {
        model: Some(MODEL.into()),
        ..Default::default()
    };
    let (report, requests) = replay_requests(trace, &opts, &cfg).unwrap();
    assert_eq!(report.window, WINDOW);
    let (counter, encoding) = (TokenCounter::new(), Encoding::for_model(MODEL));
    for (step, req) in report.steps.iter().zip(&requests) {
        let at = format!("{name} ({}) step {}", strategy.as_str(), step.index);
        // no calibration: the planner works with the ratio replay assumes
        assert_eq!(h.state.counter.ratio(MODEL), 1.0, "{at}");
        let before = h.mock.requests().len();
        let resp = h.post_chat(req.client_body.clone()).await;
        let status = resp.status();
        resp.bytes().await.unwrap();
        let got = h.mock.requests();
        match (step.outcome, &req.upstream_body) {
            (Outcome::Reject, None) => {
                assert_eq!(status, 400, "{at}");
                assert_eq!(
                    got.len(),
                    before,
                    "{at}: a refused request reaches no upstream"
                );
            }
            (_, Some(expected)) => {
                assert_eq!(status, 200, "{at}");
                assert_eq!(got.len(), before + 1, "{at}: one upstream call");
                h.next_turn().await;
                let sent = &got[before].body;
                let (sent_json, expected_json): (Value, Value) = (
                    serde_json::from_slice(sent).unwrap(),
                    serde_json::from_slice(expected).unwrap(),
                );
                assert!(
                    sent_json == expected_json,
                    "{at}: the body sent upstream differs: {}",
                    first_difference(&sent_json, &expected_json)
                );
                assert!(sent.as_ref() == expected.as_slice(), "{at}: byte for byte");
                let tokens = counter.request_tokens(
                    encoding,
                    sent_json["messages"].as_array().unwrap(),
                    sent_json.get("tools"),
                );
                assert_eq!(tokens, step.upstream_tokens, "{at}: tokens sent upstream");
            }
            (outcome, None) => panic!("{at}: {outcome:?} without a body"),
        }
    }
    h.stop().await;
    report.totals.rewritten
}

/// Where two bodies differ, in a few words (the bodies are too long to print).
fn first_difference(sent: &Value, expected: &Value) -> String {
    let msgs = |v: &Value| v["messages"].as_array().cloned().unwrap_or_default();
    let (a, b) = (msgs(sent), msgs(expected));
    match a.iter().zip(&b).position(|(x, y)| x != y) {
        Some(i) => format!("message {i} of {} sent, {} expected", a.len(), b.len()),
        None if a.len() != b.len() => format!("{} messages sent, {} expected", a.len(), b.len()),
        None => "outside the messages".into(),
    }
}

#[tokio::test]
async fn gateway_sends_what_replay_plans_for_an_agent_run() {
    let trace = agent_trace(12, 300);
    for strategy in [Strategy::Hybrid, Strategy::Prune, Strategy::Off] {
        let rewritten = agree("agent", &trace, strategy).await;
        assert_eq!(
            rewritten > 0,
            strategy != Strategy::Off,
            "{}: {rewritten} rewritten",
            strategy.as_str()
        );
    }
}

fn trace_files() -> Option<Vec<PathBuf>> {
    let dir = std::env::var_os("CTXGATE_TRACES").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces"),
        PathBuf::from,
    );
    if !dir.is_dir() {
        println!(
            "note: {} not found; skipping the shared traces",
            dir.display()
        );
        return None;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    Some(files)
}

#[tokio::test]
async fn gateway_sends_what_replay_plans_for_the_shared_traces() {
    let Some(files) = trace_files() else {
        return;
    };
    let mut rewritten = 0;
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let trace: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        rewritten += agree(&name, &trace, Strategy::Hybrid).await;
    }
    assert!(
        files.is_empty() || rewritten > 0,
        "some request was rewritten"
    );
}
