//! Latency ctxgate adds per recall round: a rewritten request whose first answer calls the recall tool (so ctxgate
//! answers it and asks the upstream again) against the same request answered at once, both through the gateway,
//! alternately; minus the mock upstream's own time for the extra request (sent to it directly). JSON and SSE.
//! Run: `cargo bench --bench recall` (release build).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use ctxgate::app::AppState;
use ctxgate::config::{Config, StoreBackend};
use ctxgate::mock::{chunk, MockReply, MockUpstream, RecordedRequest, Responder};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A coding-agent history well over an 8k window, so that ctxgate clears old results and offers the recall tool.
fn history(marker: &str) -> Vec<Value> {
    let mut m = vec![
        json!({"role":"system","content":"You are a coding agent."}),
        json!({"role":"user","content":format!("{marker}: fix the failing test")}),
    ];
    for i in 0..14 {
        let id = format!("call_{i}");
        m.push(
            json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
            "function":{"name":"read_file","arguments":format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}),
        );
        let filler: Vec<String> = (0..300).map(|w| format!("line{w}")).collect();
        m.push(json!({"role":"tool","tool_call_id":id,"content":filler.join(" ")}));
    }
    m
}

/// Recall requests get a recall call first, then (after ctxgate's answer) the final text; plain ones the text.
fn responder(stream: bool) -> Responder {
    Arc::new(move |r: &RecordedRequest| {
        let v = r.json();
        let text = v["messages"].to_string();
        let answered = v["messages"].as_array()?.last()?["tool_call_id"] == "r1";
        let wants_recall = text.contains("RECALL") && !answered;
        Some(match (wants_recall, stream) {
            (true, false) => MockReply::message(
                json!({"role":"assistant","content":null,"tool_calls":[{"id":"r1","type":"function",
                    "function":{"name":"recall_tool_call","arguments":"{\"call_id\":\"call_0\"}"}}]}),
                "tool_calls",
            ),
            (true, true) => MockReply::sse_chunks(
                &[
                    chunk(
                        json!({"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"r1","type":"function",
                        "function":{"name":"recall_tool_call","arguments":"{\"call_id\":\"call_0\"}"}}]}),
                        None,
                    ),
                    chunk(json!({}), Some("tool_calls")),
                ],
                Duration::ZERO,
            ),
            (false, false) => MockReply::completion("done"),
            (false, true) => MockReply::sse_text(&["do", "ne"], false),
        })
    })
}

async fn time(client: &reqwest::Client, url: &str, body: &[u8]) -> Duration {
    let started = Instant::now();
    let resp = client
        .post(url)
        .header("authorization", "Bearer sk-bench")
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let bytes = resp.bytes().await.unwrap();
    assert!(!bytes.is_empty());
    started.elapsed()
}

fn median(v: &mut [Duration]) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

async fn run(stream: bool, n: usize) {
    let mock = MockUpstream::start().await.unwrap();
    mock.set_responder(responder(stream));
    let mut cfg = Config::default();
    cfg.upstream.base_url = mock.base_url();
    cfg.store.backend = StoreBackend::Memory;
    cfg.context.default_context_window = 8_000;
    let state = AppState::new(cfg).unwrap();
    let server = ctxgate::server::Server::bind(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let via = format!("http://{addr}/v1/chat/completions");
    let body = |marker: &str| {
        serde_json::to_vec(
            &json!({"model":"mock-model","stream":stream,"messages":history(marker)}),
        )
        .unwrap()
    };
    let (recall, plain) = (body("RECALL"), body("PLAIN"));
    // the second upstream request of a recall round, to time the mock alone on it
    time(&client, &via, &recall).await;
    let second = mock.requests().last().unwrap().body.clone();
    let direct = format!("{}/chat/completions", mock.base_url());
    let (mut r, mut p, mut d) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..(n + n / 10) {
        let (a, b, c) = (
            time(&client, &via, &recall).await,
            time(&client, &via, &plain).await,
            time(&client, &direct, &second).await,
        );
        if i >= n / 10 {
            r.push(a);
            p.push(b);
            d.push(c);
        }
    }
    let (r50, p50, d50) = (median(&mut r), median(&mut p), median(&mut d));
    println!(
        "{}: with one recall round {r50:>8.1} µs, without {p50:>8.1} µs, mock alone on the extra request {d50:>7.1} µs \
         => ctxgate's own cost per round {:>6.1} µs (medians of {n})",
        if stream { "SSE " } else { "JSON" },
        r50 - p50 - d50
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        run(false, 400).await;
        run(true, 400).await;
    });
}
