//! Why each cache miss happened (issue 39): each turn's record says where its request first differed from the
//! session's previous one and why — a client edit, a re-cut, a tools change, a gap past `[models] cache_ttl` — with
//! the cached and uncached tokens the provider reported and their price; `ctxgate_cache_miss_tokens_total` counts
//! the missed tokens by cause; check-config validates `cache_ttl`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, Harness};
use ctxgate::config::{Config, DurationSpec, ModelEntry, Price};
use ctxgate::metrics::names;
use ctxgate::mock::MockReply;
use serde_json::{json, Value};
use std::time::Duration;

const PRICE: Price = Price {
    input: Some(2.5),
    cached_input: Some(0.25),
    cache_write: None,
    output: Some(10.0),
};

async fn harness() -> Harness {
    Harness::start_with(|c| {
        c.context.default_context_window = 8_000;
        c.models.insert(
            "cm-*".into(),
            ModelEntry {
                context_window: Some(6_000),
                price: Some(PRICE),
                ..ModelEntry::default()
            },
        );
        c.models.insert(
            "cm-short".into(),
            ModelEntry {
                cache_ttl: Some(DurationSpec::from_secs(1)),
                ..ModelEntry::default()
            },
        );
    })
    .await
}

/// `ctxgate_cache_miss_tokens_total` of `model`'s label, the chat dialect and `cause` (0 before its first increase).
fn missed(h: &Harness, model: &str, cause: &str) -> u64 {
    let label = h.state.metrics.model_label(model);
    let series = format!(
        "{}{{cause=\"{cause}\",dialect=\"chat\",model=\"{label}\"}} ",
        names::CACHE_MISS_TOKENS_TOTAL
    );
    h.state
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Sends `messages` (with `tools`, and the strategy header when given) in `session`; waits for the turn's end.
async fn turn(
    h: &mut Harness,
    session: &str,
    body: Value,
    strategy: Option<&str>,
) -> (String, reqwest::header::HeaderMap) {
    let mut headers = vec![
        ("authorization", "Bearer sk-cache-miss"),
        ("x-session-id", session),
    ];
    if let Some(s) = strategy {
        headers.push(("x-ctxgate-strategy", s));
    }
    let resp = h.post_json("/v1/chat/completions", &headers, &body).await;
    assert_eq!(resp.status(), 200);
    let id = common::session_header(&resp);
    let headers = resp.headers().clone();
    let _ = resp.text().await.unwrap();
    h.next_turn().await;
    (id, headers)
}

async fn turns(h: &Harness, session: &str) -> Vec<Value> {
    h.get_json(&format!("/admin/sessions/{session}/turns?messages=false"))
        .await["turns"]
        .as_array()
        .unwrap()
        .clone()
}

fn user(t: &str) -> Value {
    json!({"role": "user", "content": t})
}

fn assistant(t: &str) -> Value {
    json!({"role": "assistant", "content": t})
}

fn usage_reply(prompt: u64, cached: u64) -> MockReply {
    MockReply::json(
        200,
        json!({"id": "chatcmpl-c", "object": "chat.completion", "created": 1, "model": "cm-model",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5,
                         "prompt_tokens_details": {"cached_tokens": cached}}}),
    )
}

#[tokio::test]
async fn an_extension_hits_and_a_client_edit_is_attributed_to_the_client() {
    let mut h = harness().await;
    let model = "cm-model";
    let sys = json!({"role": "system", "content": "You are terse."});
    let first = user("Fix the bug in parser.rs, please.");
    let edited = user("Fix the bug in lexer.rs, please.");
    let (session, _) = turn(
        &mut h,
        "cm-edit",
        json!({"model": model, "messages": [sys, first]}),
        None,
    )
    .await;
    turn(
        &mut h,
        "cm-edit",
        json!({"model": model, "messages": [sys, first, assistant("done"), user("and the tests?")]}),
        None,
    )
    .await;
    // the client rewrote its first question: 1000 prompt tokens, 100 read from the cache
    h.mock.push(usage_reply(1_000, 100));
    turn(
        &mut h,
        "cm-edit",
        json!({"model": model, "messages": [sys, edited, assistant("done"), user("and the tests?"),
                                            assistant("added"), user("thanks")]}),
        None,
    )
    .await;

    let turns = turns(&h, &session).await;
    assert_eq!(turns.len(), 3);
    // the first turn has nothing to compare with; the second extends it exactly
    let c0 = &turns[0]["cache"];
    assert!(
        c0.get("cause").is_none() && c0.get("gap_ms").is_none(),
        "{c0}"
    );
    let c1 = &turns[1]["cache"];
    assert!(c1.get("cause").is_none(), "{c1}");
    assert!(c1.get("index").is_none(), "{c1}");
    assert!(c1["gap_ms"].as_u64().is_some(), "{c1}");
    // a hit says only when it came (and what the provider reported, which this mock does not)
    assert_eq!(c1.as_object().unwrap().len(), 1, "{c1}");

    // the edit: message 1, at the first byte where the two versions' JSON differ
    let c2 = &turns[2]["cache"];
    assert_eq!(c2["cause"], "client", "{c2}");
    assert_eq!(c2["part"], "messages", "{c2}");
    assert_eq!(c2["index"], 1, "{c2}");
    let (a, b) = (
        serde_json::to_vec(&first).unwrap(),
        serde_json::to_vec(&edited).unwrap(),
    );
    let byte = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert_eq!(c2["byte"], byte, "{c2}");
    // what the provider reported: 900 uncached, missed; priced
    assert_eq!(c2["cached_tokens"], 100, "{c2}");
    assert_eq!(c2["uncached_tokens"], 900, "{c2}");
    assert_eq!(c2["missed_tokens"], 900, "{c2}");
    assert!(c2.get("estimated").is_none(), "{c2}");
    let d = &c2["dollars"];
    let close = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-12;
    assert!(close(&d["cached"], 100.0 * 0.25 / 1e6), "{d}");
    assert!(close(&d["uncached"], 900.0 * 2.5 / 1e6), "{d}");
    assert!(close(&d["missed"], 900.0 * 2.25 / 1e6), "{d}");

    assert_eq!(missed(&h, model, "client"), 900);
    // the analysis changes nothing sent: each request reached the upstream byte for byte as posted
    let sent = h.mock.requests();
    assert_eq!(sent.len(), 3);
    let last = json!({"model": model, "messages": [sys, edited, assistant("done"), user("and the tests?"),
                                                   assistant("added"), user("thanks")]});
    assert_eq!(sent[2].body, serde_json::to_vec(&last).unwrap());
    for cause in ["gap", "model", "tools", "recut"] {
        assert_eq!(missed(&h, model, cause), 0, "{cause}");
    }
}

#[tokio::test]
async fn a_tools_change_is_attributed_to_the_tools() {
    let mut h = harness().await;
    let model = "cm-model";
    let tool = |name: &str| json!([{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]);
    let (session, _) = turn(
        &mut h,
        "cm-tools",
        json!({"model": model, "tools": tool("read_file"), "messages": [user("hello")]}),
        None,
    )
    .await;
    turn(
        &mut h,
        "cm-tools",
        json!({"model": model, "tools": tool("read_file"),
               "messages": [user("hello"), assistant("hi"), user("go")]}),
        None,
    )
    .await;
    turn(
        &mut h,
        "cm-tools",
        json!({"model": model, "tools": tool("write_file"),
               "messages": [user("hello"), assistant("hi"), user("go"), assistant("ok"), user("more")]}),
        None,
    )
    .await;
    let turns = turns(&h, &session).await;
    assert!(turns[1]["cache"].get("cause").is_none(), "{}", turns[1]);
    let c = &turns[2]["cache"];
    assert_eq!(c["cause"], "tools", "{c}");
    assert_eq!(c["part"], "tools", "{c}");
    assert!(c.get("index").is_none(), "{c}");
    // the mock reports no cached tokens: the whole prompt, estimated
    assert_eq!(c["estimated"], true, "{c}");
    let tokens = c["missed_tokens"].as_u64().unwrap();
    assert!(tokens > 0, "{c}");
    assert_eq!(missed(&h, model, "tools"), tokens);
    assert_eq!(missed(&h, model, "client"), 0);
}

#[tokio::test]
async fn a_gap_past_the_cache_ttl_is_a_gap() {
    let mut h = harness().await;
    let model = "cm-short"; // cache_ttl = "1s"
    let (session, _) = turn(
        &mut h,
        "cm-gap",
        json!({"model": model, "messages": [user("hello")]}),
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    h.mock.push(usage_reply(50, 0));
    turn(
        &mut h,
        "cm-gap",
        json!({"model": model, "messages": [user("hello"), assistant("hi"), user("still there?")]}),
        None,
    )
    .await;
    let turns = turns(&h, &session).await;
    let c = &turns[1]["cache"];
    assert_eq!(c["cause"], "gap", "{c}");
    assert_eq!(c["cache_ttl_secs"], 1, "{c}");
    assert!(c["gap_ms"].as_u64().unwrap() >= 1_000, "{c}");
    // an exact extension otherwise: no first difference
    assert!(c.get("index").is_none(), "{c}");
    assert_eq!(c["missed_tokens"], 50, "{c}");
    assert_eq!(missed(&h, model, "gap"), 50);
}

#[tokio::test]
async fn a_re_cut_is_attributed_to_ctxgate_and_its_stage() {
    let mut h = harness().await;
    let model = "cm-model";
    // a history well over the 6000-token window, sent first with rewriting off, then with it on
    let mut messages = agent_history(30, 120);
    messages.push(user("Go on."));
    let (session, resp) = turn(
        &mut h,
        "cm-recut",
        json!({"model": model, "messages": messages}),
        Some("off"),
    )
    .await;
    assert!(!resp.contains_key("x-ctxgate-rewrite"));
    messages.push(assistant("Looking."));
    messages.push(user("Continue."));
    h.mock.push(usage_reply(3_000, 0));
    let (_, resp) = turn(
        &mut h,
        "cm-recut",
        json!({"model": model, "messages": messages}),
        None,
    )
    .await;
    assert!(resp.contains_key("x-ctxgate-rewrite"));
    let turns = turns(&h, &session).await;
    let c = &turns[1]["cache"];
    assert!(c["byte"].as_u64().is_some(), "{c}");
    assert_eq!(c["cause"], "recut", "{c}");
    let stages: Vec<&str> = turns[1]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(
        stages.contains(&c["stage"].as_str().unwrap()),
        "{c} {stages:?}"
    );
    // the first element the rewrite changed, at a byte within it (the recall tools came too)
    assert_eq!(c["part"], "tools", "{c}");
    let index = c["index"].as_u64().unwrap();
    assert!(index >= 2, "{c}");
    assert_eq!(c["missed_tokens"], 3_000, "{c}");
    assert_eq!(missed(&h, model, "recut"), 3_000);
    assert_eq!(missed(&h, model, "client"), 0);
}

#[test]
fn check_config_validates_cache_ttl() {
    let problems = |text: &str| Config::from_toml_str(text).unwrap_err().0.join("\n");
    let all = problems("[models.\"m*\"]\ncache_ttl = \"0s\"\n");
    assert!(all.contains("models.\"m*\".cache_ttl"), "{all}");
    let all = problems("[models.\"m*\"]\ncache_ttl = \"8d\"\n");
    assert!(all.contains("models.\"m*\".cache_ttl"), "{all}");
    let all = problems("[models.\"m*\"]\ncache_ttl = \"300\"\n");
    assert!(all.contains("cache_ttl"), "{all}");
    let all = problems("[models.\"m*\"]\ncache_ttl = 300\n");
    assert!(all.contains("cache_ttl"), "{all}");
    let c = Config::from_toml_str("[models.\"m*\"]\ncache_ttl = \"1h\"\n").unwrap();
    assert_eq!(
        c.models["m*"].cache_ttl.map(|t| t.duration()),
        Some(Duration::from_secs(3_600))
    );
}

#[tokio::test]
async fn an_anthropic_system_prompt_change_is_the_clients() {
    let mut h = harness().await;
    let model = "cm-claude";
    let post = |system: &'static str, messages: Value| json!({"model": model, "max_tokens": 64, "system": system, "messages": messages});
    let headers = [
        ("x-api-key", "sk-ant-cache-miss"),
        ("anthropic-version", "2023-06-01"),
        ("x-session-id", "cm-anthropic"),
    ];
    let bodies = [
        post("Be terse.", json!([user("hello")])),
        post(
            "Be terse.",
            json!([user("hello"), assistant("hi"), user("go")]),
        ),
        post(
            "Be verbose.",
            json!([
                user("hello"),
                assistant("hi"),
                user("go"),
                assistant("ok"),
                user("more")
            ]),
        ),
    ];
    let mut session = String::new();
    for body in &bodies {
        let resp = h.post_json("/v1/messages", &headers, body).await;
        assert_eq!(resp.status(), 200);
        session = common::session_header(&resp);
        resp.text().await.unwrap();
        h.next_turn().await;
    }
    let turns = turns(&h, &session).await;
    assert!(turns[1]["cache"].get("cause").is_none(), "{}", turns[1]);
    let c = &turns[2]["cache"];
    assert_eq!(c["cause"], "client", "{c}");
    assert_eq!(c["part"], "system", "{c}");
    // the mock reports cache reads (none): the uncached tokens are the missed ones
    assert_eq!(c["cached_tokens"], 0, "{c}");
    assert_eq!(c["missed_tokens"], c["uncached_tokens"], "{c}");
    let label = h.state.metrics.model_label(model);
    let series = format!(
        "{}{{cause=\"client\",dialect=\"anthropic\",model=\"{label}\"}} ",
        names::CACHE_MISS_TOKENS_TOTAL
    );
    let counted: u64 = h
        .state
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&series).map(|v| v.trim().parse().unwrap()))
        .unwrap();
    assert_eq!(counted, c["missed_tokens"].as_u64().unwrap());
    assert!(counted > 0);
}
