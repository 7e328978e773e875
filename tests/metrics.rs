//! Metrics end to end: scripted traffic moves the exported values as expected; every metric the dashboards and
//! alert rules use is exported; promtool accepts the exposition, the rules and the config; a real Prometheus
//! scraping a running ctxgate answers the dashboard's queries.
//!
//! promtool and prometheus are found on PATH (Debian package `prometheus`); without them those tests skip with a
//! note, unless `CTXGATE_REQUIRE_EXTERNAL=1` (set by .ci/run) makes that a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, read_until_closed, Harness};
use ctxgate::config::{Config, ModelEntry};
use ctxgate::metrics::names;
use ctxgate::mock::{MockReply, MockUpstream};
use promql_parser::parser::Expr;
use promql_parser::util::{walk_expr, ExprVisitor};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const MODEL: &str = "gpt-4o-mini";
/// The model-table entry `MODEL` is labelled with (configured below with a small window).
const LABEL: &str = "gpt-4o*";

// --- the exposition, parsed -------------------------------------------------------------------------------

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text exposition format (enough of it for ctxgate's output: no escapes in label values).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap(),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').unwrap();
                    let labels = body
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").unwrap();
                            (k.to_string(), v.trim_end_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
            };
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect()
}

/// The sum of every series of `name` whose labels include `filters`.
fn sum(samples: &[Sample], name: &str, filters: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            filters
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

fn has(samples: &[Sample], name: &str, filters: &[(&str, &str)]) -> bool {
    samples.iter().any(|s| {
        s.name == name
            && filters
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

async fn scrape(h: &Harness) -> String {
    let resp = h.client.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    resp.text().await.unwrap()
}

/// Scrapes until nothing is in flight (a passthrough body is dropped just after its last byte), within 5 s.
async fn settled(h: &Harness) -> (String, Vec<Sample>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = scrape(h).await;
        let samples = parse(&text);
        if sum(&samples, names::REQUESTS_IN_FLIGHT, &[]) == 0.0 || Instant::now() > deadline {
            return (text, samples);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// --- scripted traffic -------------------------------------------------------------------------------------

fn config(mock: &MockUpstream) -> Config {
    let mut c = common::test_config(&mock.base_url());
    c.models.insert(
        LABEL.into(),
        ModelEntry {
            context_window: Some(8_000),
            ..Default::default()
        },
    );
    // `fb-small` falls back to `fb-large` (MODEL has no fallback: it is truncated or refused as before)
    c.context.on_overflow = ctxgate::config::OnOverflow::Fallback;
    for (name, window, fallback) in [
        ("fb-small", 1_000, Some("fb-large")),
        ("fb-large", 8_000, None),
    ] {
        c.models.insert(
            name.into(),
            ModelEntry {
                context_window: Some(window),
                fallback: fallback.map(str::to_string),
                ..Default::default()
            },
        );
    }
    c
}

async fn harness() -> Harness {
    let mock = MockUpstream::start().await.unwrap();
    let cfg = config(&mock);
    Harness::start_config(mock, cfg).await
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id":id,"type":"function","function":{"name":name,"arguments":args.to_string()}})
}

async fn chat(h: &Harness, session: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-metrics")
        .header("x-session-id", session)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

async fn get(h: &Harness, path: &str) -> u16 {
    let resp = h.client.get(h.url(path)).send().await.unwrap();
    let status = resp.status().as_u16();
    resp.bytes().await.unwrap();
    status
}

/// One round of every kind of traffic: plain, streamed, counted, rewritten with recall rounds, refused, failed
/// upstream, invalid, passthrough and admin. The mock's replies are queued right before the request they answer.
async fn script(h: &Harness) {
    let small = json!({"model":MODEL,"messages":[{"role":"user","content":"hi"}]});
    // plain: the mock's default completion (usage: its estimate of the prompt + 5 completion)
    let (s, _) = chat(h, "plain", small.to_string()).await;
    assert_eq!(s, 200);
    // the same session again, streamed (usage 10 + 2)
    let mut streamed = small.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (s, text) = chat(h, "plain", streamed.to_string()).await;
    assert_eq!(s, 200);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // big enough to be counted, small enough to go as it is; the upstream's count (900 for ~800 estimated
    // tokens, 600 of them read from its prompt cache) calibrates the estimate
    h.mock.push(MockReply::json(
        200,
        json!({"id":"chatcmpl-c","object":"chat.completion","created":1,"model":MODEL,
            "choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":900,"completion_tokens":5,"total_tokens":905,
                "prompt_tokens_details":{"cached_tokens":600}}}),
    ));
    let counted = json!({"model":MODEL,"messages":[{"role":"user","content":"word ".repeat(800)}]});
    let (s, _) = chat(h, "counted", counted.to_string()).await;
    assert_eq!(s, 200);
    // over the window: rewritten with the recall tools; the model calls them once (4 calls), then answers
    h.mock.push(MockReply::message(
        json!({"role":"assistant","content":null,"tool_calls":[
            call("r1", "recall_tool_call", json!({"call_id":"call_0"})),
            call("r2", "recall_tool_call", json!({"call_id":"call_nope"})),
            call("r3", "search_history", json!({"query":"MARKER-3"})),
            call("r4", "search_history", json!({"query":""})),
        ]}),
        "tool_calls",
    ));
    h.mock.push(MockReply::completion("done"));
    let big = json!({"model":MODEL,"messages":agent_history(14, 300),
        "tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]});
    let (s, text) = chat(h, "agent", big.to_string()).await;
    assert_eq!(s, 200, "{text}");
    assert!(text.contains("done"));
    // cannot fit even after dropping all it could: refused, never sent upstream
    let huge = json!({"model":MODEL,"messages":[{"role":"user","content":"word ".repeat(20_000)}]});
    let (s, _) = chat(h, "huge", huge.to_string()).await;
    assert_eq!(s, 400);
    // the upstream fails
    h.mock.push(MockReply::json(
        500,
        json!({"error":{"message":"boom","type":"server_error"}}),
    ));
    let (s, _) = chat(h, "failing", small.to_string()).await;
    assert_eq!(s, 500);
    // not a chat request: ctxgate's own 400
    let (s, _) = chat(h, "bad", "not json").await;
    assert_eq!(s, 400);
    // passthrough: a model list, then an upstream 404
    assert_eq!(get(h, "/v1/models").await, 200);
    h.mock.push(MockReply::json(
        404,
        json!({"error":{"message":"no such file"}}),
    ));
    assert_eq!(get(h, "/v1/files/file-x").await, 404);
    // an Anthropic Messages request, streamed (the mock's default answer)
    let anthropic = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let resp = h
        .client
        .post(h.url("/v1/messages"))
        .header("content-type", "application/json")
        .header("x-api-key", "sk-ant-metrics")
        .header("anthropic-version", "2023-06-01")
        .header("x-claude-code-session-id", "metrics-anthropic")
        .body(anthropic.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");
    // over its model's window: sent to the model's fallback
    let over =
        json!({"model":"fb-small","messages":[{"role":"user","content":"word ".repeat(1_500)}]});
    let (s, _) = chat(h, "fallback", over.to_string()).await;
    assert_eq!(s, 200);
    // admin (loopback, no token)
    assert_eq!(get(h, "/admin/sessions").await, 200);
    assert_eq!(get(h, "/admin/sessions/nope").await, 404);
}

#[tokio::test]
async fn scripted_traffic_moves_every_family() {
    let h = harness().await;
    script(&h).await;
    let (text, m) = settled(&h).await;
    let req = |route, status, stream| {
        sum(
            &m,
            names::REQUESTS_TOTAL,
            &[
                ("route", route),
                ("dialect", if route == "chat" { "chat" } else { "none" }),
                ("status", status),
                ("stream", stream),
            ],
        )
    };
    // traffic
    assert_eq!(
        req("chat", "2xx", "false"),
        4.0,
        "plain, counted, rewritten, fallen back"
    );
    assert_eq!(req("chat", "2xx", "true"), 1.0);
    assert_eq!(req("chat", "4xx", "false"), 2.0, "refused and invalid");
    assert_eq!(req("chat", "5xx", "false"), 1.0);
    assert_eq!(req("passthrough", "2xx", "false"), 1.0);
    assert_eq!(req("passthrough", "4xx", "false"), 1.0);
    assert_eq!(req("admin", "2xx", "false"), 1.0);
    assert_eq!(req("admin", "4xx", "false"), 1.0);
    assert_eq!(sum(&m, names::REQUESTS_IN_FLIGHT, &[]), 0.0);
    assert_eq!(sum(&m, names::ACTIVE_STREAMS, &[]), 0.0);
    // dialects: conversations are `chat` or `anthropic`; passthrough and admin are outside any dialect
    let anthropic = [("route", "chat"), ("dialect", "anthropic")];
    assert_eq!(sum(&m, names::REQUESTS_TOTAL, &anthropic), 1.0);
    let streamed = [("status", "2xx"), ("stream", "true")];
    assert_eq!(
        sum(
            &m,
            names::REQUESTS_TOTAL,
            &[anthropic[0], anthropic[1], streamed[0], streamed[1]]
        ),
        1.0
    );
    for (route, dialects) in [
        ("chat", &["chat", "anthropic"][..]),
        ("passthrough", &["none"][..]),
        ("admin", &["none"][..]),
    ] {
        let all = sum(&m, names::REQUESTS_TOTAL, &[("route", route)]);
        let labelled: f64 = dialects
            .iter()
            .map(|d| {
                sum(
                    &m,
                    names::REQUESTS_TOTAL,
                    &[("route", route), ("dialect", d)],
                )
            })
            .sum();
        assert!(all > 0.0 && labelled == all, "{route}: {labelled} of {all}");
    }
    assert_eq!(
        sum(
            &m,
            names::REQUESTS_TOTAL,
            &[("dialect", "anthropic"), ("route", "passthrough")]
        ),
        0.0
    );
    // latency: every chat request has a duration; the six that went upstream an upstream wait and an overhead
    let count = |name: &str, route| {
        let dialect = if route == "chat" { "chat" } else { "none" };
        sum(
            &m,
            &format!("{name}_count"),
            &[("route", route), ("dialect", dialect)],
        )
    };
    assert_eq!(count(names::REQUEST_DURATION_SECONDS, "chat"), 8.0);
    assert_eq!(count(names::UPSTREAM_DURATION_SECONDS, "chat"), 6.0);
    assert_eq!(count(names::OVERHEAD_SECONDS, "chat"), 6.0);
    // the request over `fb-small`'s window went to `fb-large`
    assert_eq!(
        sum(
            &m,
            names::FALLBACKS_TOTAL,
            &[("model", "fb-small"), ("fallback", "fb-large")]
        ),
        1.0
    );
    assert_eq!(count(names::OVERHEAD_SECONDS, "passthrough"), 2.0);
    assert_eq!(count(names::REQUEST_DURATION_SECONDS, "admin"), 2.0);
    let overhead = sum(
        &m,
        &format!("{}_sum", names::OVERHEAD_SECONDS),
        &[("route", "chat"), ("dialect", "chat")],
    );
    let total = sum(
        &m,
        &format!("{}_sum", names::REQUEST_DURATION_SECONDS),
        &[("route", "chat"), ("dialect", "chat")],
    );
    assert!(
        overhead > 0.0 && overhead < total,
        "overhead {overhead} of {total}"
    );
    for dialect in ["chat", "anthropic"] {
        assert_eq!(
            sum(
                &m,
                &format!("{}_count", names::STREAM_FIRST_BYTE_SECONDS),
                &[("dialect", dialect)]
            ),
            1.0,
            "{dialect}"
        );
    }
    assert_eq!(
        count(names::REQUEST_DURATION_SECONDS, "chat")
            + sum(
                &m,
                &format!("{}_count", names::REQUEST_DURATION_SECONDS),
                &anthropic
            ),
        sum(
            &m,
            &format!("{}_count", names::REQUEST_DURATION_SECONDS),
            &[("route", "chat")]
        )
    );
    // tokens: the upstream's counts (the small request's prompt counted by the mock for its default answers, 10
    // prompt per scripted call; 5 completion per JSON call, 2 for the stream); the
    // rewritten request counts the client's estimate, and its two rounds' usage
    let model = [("model", LABEL)];
    let small_prompt = ctxgate::mock::chat_prompt_tokens(
        &json!({"model":MODEL,"messages":[{"role":"user","content":"hi"}]}),
    ) as f64;
    assert_eq!(
        sum(&m, names::UPSTREAM_PROMPT_TOKENS_TOTAL, &model),
        2.0 * small_prompt + 900.0 + 20.0
    );
    assert_eq!(
        sum(&m, names::UPSTREAM_COMPLETION_TOKENS_TOTAL, &model),
        5.0 + 2.0 + 5.0 + 10.0
    );
    // the prompt cache: only the counted request reported cached tokens
    assert_eq!(
        sum(
            &m,
            names::UPSTREAM_CACHED_TOKENS_TOTAL,
            &[("model", LABEL), ("dialect", "chat")]
        ),
        600.0
    );
    let client = sum(&m, names::CLIENT_PROMPT_TOKENS_TOTAL, &model);
    let saved = sum(&m, names::SAVED_TOKENS_TOTAL, &model);
    assert!(client > 920.0 + 6_400.0, "client tokens {client}");
    assert!(saved > 0.0 && saved < client, "saved {saved} of {client}");
    let chat_model = [("model", LABEL), ("dialect", "chat")];
    assert_eq!(sum(&m, names::SAVED_TOKENS_TOTAL, &chat_model), saved);
    assert_eq!(
        sum(&m, names::CLIENT_PROMPT_TOKENS_TOTAL, &chat_model),
        client
    );
    assert!(has(&m, names::TOKEN_ESTIMATE_RATIO, &model));
    // compression and recall
    assert_eq!(
        sum(&m, names::REWRITES_TOTAL, &[("strategy", "hybrid")]),
        2.0
    );
    assert_eq!(
        sum(
            &m,
            names::REWRITES_TOTAL,
            &[("strategy", "hybrid"), ("outcome", "rejected")]
        ),
        1.0
    );
    let recall = |tool, outcome| {
        sum(
            &m,
            names::RECALL_CALLS_TOTAL,
            &[("tool", tool), ("outcome", outcome)],
        )
    };
    assert_eq!(recall("recall", "found"), 1.0);
    assert_eq!(recall("recall", "not_found"), 1.0);
    assert_eq!(recall("search", "found"), 1.0);
    assert_eq!(recall("search", "error"), 1.0);
    assert_eq!(sum(&m, names::RECALL_ROUNDS_TOTAL, &[]), 1.0);
    // summaries are off in this config: their series exist, at zero
    assert_eq!(sum(&m, names::SUMMARIZER_CALLS_TOTAL, &[]), 0.0);
    assert!(has(
        &m,
        names::SUMMARIZER_CALLS_TOTAL,
        &[("outcome", "failed")]
    ));
    // sessions and store: "plain" was found in the cache the second time
    assert!(sum(&m, names::SESSION_CACHE_LOOKUPS_TOTAL, &[("result", "hit")]) >= 1.0);
    assert!(
        sum(
            &m,
            names::SESSION_CACHE_LOOKUPS_TOTAL,
            &[("result", "miss")]
        ) >= 4.0
    );
    // "huge" (refused by ctxgate) and "failing" (the upstream's 500) were new sessions nobody accepted: not cached
    assert!(sum(&m, names::SESSIONS_CACHED, &[]) >= 3.0);
    assert!(sum(&m, names::SESSION_CACHE_BYTES, &[]) > 0.0);
    let store = |op| {
        sum(
            &m,
            &format!("{}_count", names::STORE_OPERATION_DURATION_SECONDS),
            &[("backend", "memory"), ("operation", op)],
        )
    };
    // two per stored turn at least (the refused "huge" and the failed "failing" first turns write nothing)
    assert!(store("write") >= 8.0, "writes {}", store("write"));
    assert!(store("load") >= 1.0);
    assert!(store("list") >= 1.0, "the admin listing");
    assert_eq!(sum(&m, names::STORE_ERRORS_TOTAL, &[]), 0.0);
    // errors
    assert_eq!(
        sum(
            &m,
            names::UPSTREAM_ERRORS_TOTAL,
            &[("route", "chat"), ("class", "5xx")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &m,
            names::UPSTREAM_ERRORS_TOTAL,
            &[("route", "passthrough"), ("class", "4xx")]
        ),
        1.0
    );
    assert_eq!(sum(&m, names::UPSTREAM_ERRORS_TOTAL, &[]), 2.0);
    assert_eq!(
        sum(
            &m,
            names::BUILD_INFO,
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    // bounded labels only: no session ids, keys, paths or unknown model names
    for secret in [
        "sk-metrics",
        "sk-ant-metrics",
        "metrics-anthropic",
        "agent",
        "counted",
        "file-x",
        "mock-model",
        "boom",
    ] {
        assert!(
            !text.contains(&format!("\"{secret}")),
            "{secret} leaked into a label"
        );
    }
    let models: BTreeSet<&str> = m
        .iter()
        .filter_map(|s| s.labels.get("model").map(String::as_str))
        .collect();
    // the Anthropic request's model under its shipped family entry; the fallback's two configured models
    assert_eq!(
        models,
        BTreeSet::from([LABEL, "claude-sonnet-4*", "fb-large", "fb-small", "other"])
    );
    // traffic created no series that cannot occur
    assert_only_possible(&m);
}

/// The rule a series breaks, if it is one that cannot occur (the rules of `src/metrics/possible.rs`, restated).
fn impossible(s: &Sample) -> Option<&'static str> {
    let l = |k: &str| s.labels.get(k).map(String::as_str);
    let family = s
        .name
        .trim_end_matches("_bucket")
        .trim_end_matches("_sum")
        .trim_end_matches("_count");
    let conversation =
        |d: Option<&str>| matches!(d, Some("chat" | "anthropic" | "responses" | "gemini"));
    let dialect = l("dialect");
    if let Some(route) = l("route") {
        let ok = match route {
            "chat" => conversation(dialect),
            "passthrough" => matches!(dialect, Some("none" | "anthropic" | "gemini")),
            _ => dialect == Some("none"),
        };
        if !ok {
            return Some("a route only takes its own dialects (chat: a conversation dialect; passthrough: none, or anthropic's count_tokens and gemini's countTokens; admin: none)");
        }
        if route == "admin"
            && [
                names::UPSTREAM_DURATION_SECONDS,
                names::OVERHEAD_SECONDS,
                names::UPSTREAM_ERRORS_TOTAL,
                names::REQUESTS_REJECTED_TOTAL,
            ]
            .contains(&family)
        {
            return Some("admin requests never go upstream nor are refused");
        }
        if family == names::REQUESTS_TOTAL
            && l("stream") == Some("true")
            && !(route == "chat" || (route == "passthrough" && dialect == Some("none")))
        {
            return Some("only chat and plain passthrough answers stream");
        }
        if family == names::REQUESTS_REJECTED_TOTAL
            && route == "passthrough"
            && l("reason") != Some("overloaded")
        {
            return Some("body timeouts are counted by the conversation pipeline only");
        }
        if family == names::UPSTREAM_ERRORS_TOTAL
            && route == "passthrough"
            && dialect != Some("none")
        {
            return Some("count_tokens failures are not counted as upstream errors");
        }
    }
    let conversation_only = [
        names::REWRITES_TOTAL,
        names::RECALL_CALLS_TOTAL,
        names::RECALL_ROUNDS_TOTAL,
        names::STREAM_FIRST_BYTE_SECONDS,
        names::CLIENT_PROMPT_TOKENS_TOTAL,
        names::UPSTREAM_PROMPT_TOKENS_TOTAL,
        names::UPSTREAM_CACHED_TOKENS_TOTAL,
        names::UPSTREAM_COMPLETION_TOKENS_TOTAL,
        names::SAVED_TOKENS_TOTAL,
    ];
    if conversation_only.contains(&family) && !conversation(dialect) {
        return Some("conversation families never have dialect none");
    }
    if family == names::UNMANAGED_REQUESTS_TOTAL && dialect != Some("responses") {
        return Some("only Responses requests are unmanaged");
    }
    if family == names::REWRITES_TOTAL && l("strategy") == Some("off") {
        return Some("strategy off never rewrites nor refuses");
    }
    if family == names::REWRITES_TOTAL
        && l("strategy") == Some("prune")
        && l("outcome") == Some("summarized")
    {
        return Some("strategy prune never summarises");
    }
    None
}

fn assert_only_possible(samples: &[Sample]) {
    let broken: Vec<String> = samples
        .iter()
        .filter_map(|s| impossible(s).map(|rule| format!("{} {:?}: {rule}", s.name, s.labels)))
        .collect();
    assert!(
        broken.is_empty(),
        "impossible series:\n{}",
        broken.join("\n")
    );
}

#[tokio::test]
async fn a_fresh_gateway_exports_only_series_that_can_occur() {
    let h = harness().await;
    let text = scrape(&h).await;
    let samples = parse(&text);
    assert_only_possible(&samples);
    let lines = text.lines().count();
    let zeros = samples.iter().filter(|s| s.value == 0.0).count();
    eprintln!(
        "fresh /metrics: {lines} lines, {} samples, {zeros} zero",
        samples.len()
    );
    // Every combination of every label was 1,573 lines (1,508 zero samples) on this configuration with three
    // dialects; a fourth (gemini) brought the possible ones from under 1,000 to 1,133.
    assert!(lines < 1_250, "{lines} lines");
    // Rare combinations appear only once they occur.
    assert!(!samples.iter().any(|s| matches!(
        s.labels.get("status").map(String::as_str),
        Some("1xx" | "3xx")
    )));
    // What alerts using rate() and the dashboards' panels look at is there from the start, at zero.
    for (name, filters) in [
        (
            names::REQUESTS_TOTAL,
            &[
                ("route", "chat"),
                ("dialect", "chat"),
                ("status", "5xx"),
                ("stream", "false"),
            ][..],
        ),
        (
            names::REQUESTS_TOTAL,
            &[
                ("route", "passthrough"),
                ("dialect", "none"),
                ("status", "2xx"),
                ("stream", "true"),
            ][..],
        ),
        (
            names::REQUESTS_REJECTED_TOTAL,
            &[
                ("route", "chat"),
                ("dialect", "responses"),
                ("reason", "body_timeout"),
            ][..],
        ),
        (
            names::REQUESTS_REJECTED_TOTAL,
            &[("route", "passthrough"), ("reason", "overloaded")][..],
        ),
        (
            "ctxgate_overhead_seconds_bucket",
            &[("route", "chat"), ("dialect", "anthropic"), ("le", "0.005")][..],
        ),
        (
            names::REWRITES_TOTAL,
            &[
                ("dialect", "chat"),
                ("strategy", "summarize"),
                ("outcome", "pruned"),
            ][..],
        ),
        (
            names::UPSTREAM_ERRORS_TOTAL,
            &[
                ("route", "passthrough"),
                ("dialect", "none"),
                ("class", "timeout"),
            ][..],
        ),
        (
            names::UNMANAGED_REQUESTS_TOTAL,
            &[("dialect", "responses"), ("reason", "conversation")][..],
        ),
        (
            names::RECALL_CALLS_TOTAL,
            &[
                ("dialect", "anthropic"),
                ("tool", "search"),
                ("outcome", "error"),
            ][..],
        ),
    ] {
        assert!(
            has(&samples, name, filters),
            "{name} {filters:?} missing at start"
        );
    }
}

#[tokio::test]
async fn unreachable_stalled_and_unknown_models_are_counted() {
    // a port nobody listens on
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", l.local_addr().unwrap());
    drop(l);
    let h = Harness::start_with(|c| c.upstream.base_url = dead).await;
    let (s, _) = chat(&h, "x", r#"{"model":"m","messages":[]}"#).await;
    assert_eq!(s, 502);
    assert_eq!(get(&h, "/v1/models").await, 502);
    let (_, m) = settled(&h).await;
    assert_eq!(
        sum(
            &m,
            names::UPSTREAM_ERRORS_TOTAL,
            &[("route", "chat"), ("class", "unreachable")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &m,
            names::UPSTREAM_ERRORS_TOTAL,
            &[("route", "passthrough"), ("class", "unreachable")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &m,
            names::REQUESTS_TOTAL,
            &[("route", "chat"), ("status", "5xx")]
        ),
        1.0
    );

    // a stream that stalls after its first chunk: interrupted after upstream.timeout_secs
    let h = Harness::start_with(|c| c.upstream.timeout_secs = 1).await;
    h.mock.push(MockReply::Sse {
        chunks: vec![(
            Duration::ZERO,
            bytes::Bytes::from(format!(
                "data: {}\n\n",
                ctxgate::mock::chunk(json!({"role":"assistant","content":"par"}), None)
            )),
        )],
        stall_after: true,
    });
    let body = json!({"model":"some-local-model","stream":true,"messages":[{"role":"user","content":"hi"}]});
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // the stream ends cleanly with an OpenAI-style error event (no `[DONE]`)
    let text = resp.text().await.unwrap();
    assert!(
        text.ends_with("\n\n") && text.contains(r#""code":"upstream_timeout""#),
        "{text}"
    );
    assert!(!text.contains("[DONE]"));
    let (_, m) = settled(&h).await;
    assert_eq!(
        sum(
            &m,
            names::UPSTREAM_ERRORS_TOTAL,
            &[("route", "chat"), ("class", "interrupted")]
        ),
        1.0
    );
    assert_eq!(sum(&m, names::ACTIVE_STREAMS, &[]), 0.0);
    assert_eq!(
        sum(
            &m,
            &format!("{}_count", names::STREAM_FIRST_BYTE_SECONDS),
            &[]
        ),
        1.0
    );
}

#[tokio::test]
async fn sqlite_operations_are_timed() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = config(&mock);
    cfg.store.backend = ctxgate::config::StoreBackend::Sqlite;
    cfg.store.path = dir.path().join("ctxgate.db");
    let h = Harness::start_config(mock, cfg).await;
    let (s, _) = chat(
        &h,
        "s",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(get(&h, "/admin/sessions").await, 200);
    let (_, m) = settled(&h).await;
    let ops = |op| {
        sum(
            &m,
            &format!("{}_count", names::STORE_OPERATION_DURATION_SECONDS),
            &[("backend", "sqlite"), ("operation", op)],
        )
    };
    assert!(ops("write") >= 1.0, "group commits {}", ops("write"));
    assert_eq!(ops("list"), 1.0);
    assert_eq!(
        sum(&m, names::STORE_ERRORS_TOTAL, &[("backend", "sqlite")]),
        0.0
    );
    assert!(has(
        &m,
        names::STORE_ERRORS_TOTAL,
        &[("backend", "sqlite"), ("operation", "load")]
    ));
}

#[tokio::test]
async fn a_separate_metrics_listener_serves_only_metrics() {
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = config(&mock);
    cfg.metrics.listen = Some("127.0.0.1:0".into());
    let state = ctxgate::app::AppState::new(cfg).unwrap();
    let server = ctxgate::server::Server::bind(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let main = server.local_addr().unwrap();
    let addr = server.metrics_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = client
        .get(format!("http://{main}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let text = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("ctxgate_build_info"), "{text}");
    let r = client
        .get(format!("http://{addr}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // the main listener serves /metrics too
    let r = client
        .get(format!("http://{main}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn unmanaged_series_exist_and_a_refused_websocket_is_counted() {
    let h = harness().await;
    // Every series that can occur exists from the start, at zero: each reason in the Responses dialect (the
    // only one whose history an upstream can keep), none in the others.
    let m = parse(&scrape(&h).await);
    for dialect in ["chat", "anthropic", "responses", "gemini"] {
        for reason in ["previous_response_id", "conversation", "compaction_trigger"] {
            let l = [("dialect", dialect), ("reason", reason)];
            let exists = has(&m, names::UNMANAGED_REQUESTS_TOTAL, &l);
            assert_eq!(exists, dialect == "responses", "{l:?}");
        }
    }
    assert_eq!(sum(&m, names::UNMANAGED_REQUESTS_TOTAL, &[]), 0.0);
    assert!(has(
        &m,
        names::REQUESTS_TOTAL,
        &[("route", "chat"), ("dialect", "responses")]
    ));
    // Codex's WebSocket attempt: answered 426 by ctxgate, counted as a passthrough client error.
    let r = h
        .client
        .get(h.url("/v1/responses"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 426);
    let (text, m) = settled(&h).await;
    let l = [
        ("route", "passthrough"),
        ("dialect", "none"),
        ("status", "4xx"),
    ];
    assert_eq!(sum(&m, names::REQUESTS_TOTAL, &l), 1.0, "{text}");
}

#[tokio::test]
async fn overload_and_slow_bodies_are_counted_as_rejections() {
    let h = Harness::start_with(|c| {
        c.server.max_in_flight = 1;
        c.server.body_read_timeout_secs = 1;
        c.server.max_messages = 2;
    })
    .await;
    // Every series that can occur exists from the start, at zero: admin requests are never refused, and only
    // conversation requests wait for their body (and are counted) before being handled.
    let m = parse(&scrape(&h).await);
    for route in ["chat", "passthrough", "admin"] {
        for reason in ["overloaded", "body_timeout", "too_large", "memory"] {
            let l = [("route", route), ("reason", reason)];
            let possible = route == "chat" || (route == "passthrough" && reason == "overloaded");
            assert_eq!(
                has(&m, names::REQUESTS_REJECTED_TOTAL, &l),
                possible,
                "{l:?}"
            );
        }
    }
    assert_eq!(sum(&m, names::REQUESTS_REJECTED_TOTAL, &[]), 0.0);

    // A chat request whose body never arrives holds no slot; it is refused with 408 at its deadline.
    let mut slow = TcpStream::connect(h.addr).await.unwrap();
    slow.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":\"m\",",
    )
    .await
    .unwrap();
    // A stream holds the only in-flight slot while it runs.
    h.mock.push(ctxgate::mock::MockReply::sse_chunks(
        &[ctxgate::mock::chunk(
            serde_json::json!({"content":"slow"}),
            None,
        )],
        Duration::from_millis(2500),
    ));
    let held = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    // Meanwhile: a chat request, a passthrough request and a GET on the chat path (a passthrough) are refused.
    let (s, _) = chat(&h, "busy", r#"{"model":"m","messages":[]}"#).await;
    assert_eq!(s, 503);
    assert_eq!(get(&h, "/v1/models").await, 503);
    assert_eq!(get(&h, "/v1/chat/completions").await, 503);
    // More messages than server.max_messages: 413, before any slot is asked for.
    let three = r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
    let (s, _) = chat(&h, "many", three).await;
    assert_eq!(s, 413);
    let (text, closed) = read_until_closed(&mut slow, Duration::from_secs(8)).await;
    assert!(closed && text.starts_with("HTTP/1.1 408"), "{text}");
    held.bytes().await.unwrap();

    let (text, m) = settled(&h).await;
    let rejected = |route, reason| {
        sum(
            &m,
            names::REQUESTS_REJECTED_TOTAL,
            &[("route", route), ("reason", reason)],
        )
    };
    assert_eq!(rejected("chat", "overloaded"), 1.0, "{text}");
    assert_eq!(rejected("passthrough", "overloaded"), 2.0, "{text}");
    assert_eq!(rejected("chat", "body_timeout"), 1.0, "{text}");
    assert_eq!(rejected("chat", "too_large"), 1.0, "{text}");
    assert_eq!(sum(&m, names::REQUESTS_REJECTED_TOTAL, &[]), 5.0, "{text}");
    // and still counted among the answered requests, by status class
    let req = |route, status| {
        sum(
            &m,
            names::REQUESTS_TOTAL,
            &[("route", route), ("status", status)],
        )
    };
    assert_eq!(req("chat", "5xx"), 1.0);
    assert_eq!(req("chat", "4xx"), 2.0);
    assert_eq!(req("passthrough", "5xx"), 2.0);
    assert_eq!(h.mock.requests().len(), 1, "only the stream went upstream");
}

#[tokio::test]
async fn the_metrics_listener_cuts_off_slow_and_silent_clients() {
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = config(&mock);
    cfg.metrics.listen = Some("127.0.0.1:0".into());
    cfg.server.header_read_timeout_secs = 1;
    let state = ctxgate::app::AppState::new(cfg).unwrap();
    let server = ctxgate::server::Server::bind(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.metrics_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    // headers started, never finished
    let mut partial = TcpStream::connect(addr).await.unwrap();
    partial
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // a connection that never sends a byte
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (_, closed) = read_until_closed(&mut partial, Duration::from_secs(8)).await;
    assert!(closed, "a scraper stuck in its headers is disconnected");
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(8)).await;
    assert!(closed, "a silent connection is disconnected");
    // scrapes still work
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains(names::BUILD_INFO));
    let _ = tx.send(());
    task.await.unwrap().unwrap();
    // and the listener is closed once `run` has returned
    assert!(TcpStream::connect(addr).await.is_err());
}

// --- dashboards and alert rules -----------------------------------------------------------------------------

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Grafana's variables, replaced by values that make each query plain PromQL.
fn substitute(expr: &str) -> String {
    let out = expr
        .replace("$__rate_interval", "1m")
        .replace("$__range", "1m")
        .replace("$instance", ".*")
        .replace("$dialect", ".*");
    assert!(!out.contains('$'), "unknown variable in {expr}");
    out
}

struct Panel {
    title: String,
    exprs: Vec<String>,
}

/// Every panel of the dashboard with its queries (variables substituted).
fn dashboard_panels() -> (Value, Vec<Panel>) {
    let text = std::fs::read_to_string(repo("dashboards/ctxgate-overview.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let panels = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
        .map(|p| Panel {
            title: p["title"].as_str().unwrap().to_string(),
            exprs: p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| substitute(t["expr"].as_str().unwrap()))
                .collect(),
        })
        .collect();
    (dash, panels)
}

/// The `expr` of every rule in `dashboards/alerts.yml` (single-line or block scalars).
fn alert_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(repo("dashboards/alerts.yml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        if let Some(rest) = line.trim_start().strip_prefix("expr:") {
            let rest = rest.trim();
            if rest == "|" || rest == ">" || rest == "|-" || rest == ">-" {
                let mut block = Vec::new();
                while i + 1 < lines.len()
                    && (lines[i + 1].trim().is_empty()
                        || lines[i + 1].len() - lines[i + 1].trim_start().len() > indent)
                {
                    i += 1;
                    block.push(lines[i].trim());
                }
                out.push(block.join("\n"));
            } else {
                out.push(rest.to_string());
            }
        }
        i += 1;
    }
    out
}

struct Names(BTreeSet<String>);

impl ExprVisitor for Names {
    type Error = ();

    fn pre_visit(&mut self, e: &Expr) -> Result<bool, ()> {
        match e {
            Expr::VectorSelector(v) => self.0.extend(v.name.clone()),
            Expr::MatrixSelector(m) => self.0.extend(m.vs.name.clone()),
            _ => {}
        }
        Ok(true)
    }
}

/// The metric names a PromQL expression reads; panics when it does not parse.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let ast = promql_parser::parser::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let mut v = Names(BTreeSet::new());
    walk_expr(&mut v, &ast).unwrap();
    v.0
}

/// A family's name for a sample name (`x_bucket` → `x`).
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|base| names::ALL.contains(base))
        .unwrap_or(name)
}

#[tokio::test]
async fn dashboards_and_alerts_use_only_exported_metrics() {
    let h = harness().await;
    script(&h).await;
    let (_, samples) = settled(&h).await;
    let exported: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();
    let (dash, panels) = dashboard_panels();
    let mut used = BTreeSet::new();
    for p in &panels {
        assert!(!p.exprs.is_empty(), "panel {} has no query", p.title);
        for e in &p.exprs {
            used.extend(metric_names(e));
        }
    }
    // the instance variable's query: label_values(<metric>, instance)
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(def) = v["definition"].as_str() {
            let inner = def
                .strip_prefix("label_values(")
                .and_then(|d| d.split(',').next())
                .unwrap();
            used.insert(inner.trim().to_string());
        }
    }
    let alerts = alert_exprs();
    assert!(alerts.len() >= 4, "{alerts:?}");
    for e in &alerts {
        used.extend(metric_names(e));
    }
    // `up` comes from Prometheus itself
    for name in used.iter().filter(|n| *n != "up") {
        assert!(
            exported.contains(name.as_str()),
            "{name} is queried but not exported"
        );
    }
    // and every exported family is shown on the dashboard
    let shown: BTreeSet<&str> = used.iter().map(|n| family(n)).collect();
    for name in names::ALL {
        assert!(shown.contains(name), "{name} is on no panel");
    }
    // datasource through the variable, rates over $__rate_interval
    let text = std::fs::read_to_string(repo("dashboards/ctxgate-overview.json")).unwrap();
    assert!(text.contains("\"uid\": \"${DS_PROMETHEUS}\""));
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap();
            assert!(
                !e.contains("rate(")
                    || e.contains("[$__rate_interval]")
                    || e.contains("[$__range]"),
                "{e}"
            );
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}");
        }
    }
}

// --- promtool and a real Prometheus -------------------------------------------------------------------------

/// `name` on PATH; `None` (with a note) when missing, a failure under `CTXGATE_REQUIRE_EXTERNAL=1`.
fn external(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("CTXGATE_REQUIRE_EXTERNAL").as_deref() == Ok("1") {
            panic!("{name} is not on PATH (CTXGATE_REQUIRE_EXTERNAL=1): install the Debian package `prometheus`");
        }
        // Straight to stderr, past the test harness's capture, so that the skip shows.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "note: {name} is not on PATH; skipping (install the Debian package `prometheus`)"
        );
    }
    found
}

fn run(cmd: &mut Command, stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(input) = stdin {
        pipe.write_all(input.as_bytes()).unwrap();
    }
    drop(pipe);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn promtool_accepts_the_exposition_rules_and_config() {
    let Some(promtool) = external("promtool") else {
        return;
    };
    let h = harness().await;
    script(&h).await;
    let (text, _) = settled(&h).await;
    let (ok, out) = run(
        Command::new(&promtool).args(["check", "metrics"]),
        Some(&text),
    );
    assert!(
        ok && out.trim().is_empty(),
        "promtool check metrics:\n{out}"
    );
    let (ok, out) = run(
        Command::new(&promtool)
            .args(["check", "rules"])
            .arg(repo("dashboards/alerts.yml")),
        None,
    );
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = run(
        Command::new(&promtool)
            .args(["test", "rules"])
            .arg(repo("dashboards/alerts_test.yml")),
        None,
    );
    assert!(ok, "promtool test rules:\n{out}");
    let (ok, out) = run(
        Command::new(&promtool)
            .args(["check", "config"])
            .arg(repo("dashboards/prometheus.yml")),
        None,
    );
    assert!(ok, "promtool check config:\n{out}");
}

/// Kills the child process when dropped (also when the test fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One instant query; the result vector's values (NaN included). Empty while Prometheus is not up yet.
async fn query(client: &reqwest::Client, base: &str, q: &str) -> Vec<f64> {
    let Ok(resp) = client
        .get(format!("{base}/api/v1/query"))
        .query(&[("query", q)])
        .send()
        .await
    else {
        return Vec::new();
    };
    // While it starts, Prometheus answers 503 "Service Unavailable" in plain text (seen once in a full run).
    if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        return Vec::new();
    }
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["status"], "success", "{q}: {v}");
    v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["value"][1]
                .as_str()
                .unwrap()
                .parse::<f64>()
                .unwrap_or(f64::NAN)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_answers_the_dashboard_queries() {
    let Some(prometheus) = external("prometheus") else {
        return;
    };
    let h = harness().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    std::fs::copy(repo("dashboards/alerts.yml"), dir.path().join("alerts.yml")).unwrap();
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - alerts.yml\n\
             scrape_configs:\n  - job_name: ctxgate\n    metrics_path: /metrics\n    static_configs:\n      \
             - targets: [\"{}\"]\n",
            h.addr
        ),
    )
    .unwrap();
    let _prom = Killed(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let wait = |what: &str| {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
    };
    // ready, and scraping ctxgate
    loop {
        wait("prometheus to scrape ctxgate");
        if query(&client, &base, "up{job=\"ctxgate\"}")
            .await
            .first()
            .is_some_and(|v| *v == 1.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // traffic between scrapes, so that rates see increases
    for _ in 0..3 {
        script(&h).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    // every query of every panel answers; the main ones with numbers
    let (_, panels) = dashboard_panels();
    let main = [
        "Requests / s",
        "Requests / s by route",
        "Requests / s by dialect",
        "Tokens saved / s by dialect",
        "Rewrites / s by dialect",
        "Overhead added by ctxgate (chat)",
        "Upstream wait (chat)",
        "Time to first byte (streams)",
        "Prompt tokens / s: client vs upstream",
        "Prompt cache hit ratio",
        "Tokens saved / s by model",
        "Rewrites / s by outcome",
        "Recall and search calls / s",
        "Cached sessions",
        "Upstream errors / s by class",
    ];
    for p in &panels {
        for e in &p.exprs {
            let values = loop {
                wait(&format!("data for panel {:?}: {e}", p.title));
                let values = query(&client, &base, e).await;
                let numbers = values.iter().any(|v| v.is_finite() && *v > 0.0);
                if !values.is_empty() && (!main.contains(&p.title.as_str()) || numbers) {
                    break values;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            assert!(!values.is_empty(), "{}: {e}", p.title);
        }
    }
    for title in main {
        assert!(
            panels.iter().any(|p| p.title == title),
            "no panel {title:?}"
        );
    }
    // the alert rules load and evaluate
    let v: Value = client
        .get(format!("{base}/api/v1/rules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rules = v["data"]["groups"][0]["rules"].as_array().unwrap();
    assert!(rules.len() >= 5);
    for r in rules {
        assert_ne!(r["health"], "err", "{r}");
    }
}

/// The calibration gauge appears with the first answer that reports usage, even when every request was small
/// enough to go upstream without being counted (the request is counted after its answer, once per model).
#[tokio::test]
async fn the_calibration_ratio_appears_with_the_first_calibrated_answer() {
    let h = harness().await;
    assert!(
        !scrape(&h).await.contains(names::TOKEN_ESTIMATE_RATIO),
        "no calibration before any answer"
    );
    // a few words: far under half the threshold in bytes, so never counted on the way up; the answer's count
    // (12 prompt tokens) is within the plausible range of the estimate
    h.mock.push(MockReply::json(
        200,
        json!({"id":"chatcmpl-r","object":"chat.completion","created":1,"model":MODEL,
            "choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}),
    ));
    let small = json!({"model":MODEL,"messages":[{"role":"user","content":"what is the capital of france"}]});
    let (s, _) = chat(&h, "ratio", small.to_string()).await;
    assert_eq!(s, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let samples = parse(&scrape(&h).await);
        let ratio = sum(&samples, names::TOKEN_ESTIMATE_RATIO, &[]);
        if ratio > 0.0 {
            assert!((0.5..=2.0).contains(&ratio), "{ratio}");
            break;
        }
        assert!(Instant::now() < deadline, "the ratio never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
