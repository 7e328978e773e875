//! The provider's prompt cache made visible: `ctxgate_upstream_cached_tokens_total` and the upstream prompt tokens
//! it is a share of, from each dialect's usage (chat `prompt_tokens_details.cached_tokens`, Anthropic
//! `cache_read_input_tokens` over all input, Responses `input_tokens_details.cached_tokens`), for JSON and SSE
//! answers, every recall round counted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, Harness};
use ctxgate::metrics::names;
use ctxgate::mock::{chunk, AnthropicReply, MockReply, ResponsesReply};
use serde_json::{json, Value};
use std::time::Duration;

const CHAT_MODEL: &str = "mock-model";
const CLAUDE: &str = "claude-sonnet-4-5";
const CODEX: &str = "gpt-5-codex";

async fn harness() -> Harness {
    Harness::start_with(|c| {
        c.context.default_context_window = 8_000;
        for family in ["claude-*", "gpt-5*"] {
            c.models.insert(
                family.into(),
                ctxgate::config::ModelEntry {
                    context_window: Some(6_000),
                    ..Default::default()
                },
            );
        }
    })
    .await
}

/// The value of a per-model token counter for `model`'s label and `dialect` (0 before its first increase).
fn counter(h: &Harness, name: &str, dialect: &str, model: &str) -> f64 {
    let label = h.state.metrics.model_label(model);
    let series = format!("{name}{{dialect=\"{dialect}\",model=\"{label}\"}} ");
    let text = h.state.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// (cached, prompt) tokens counted so far for `dialect` and `model`.
fn counted(h: &Harness, dialect: &str, model: &str) -> (f64, f64) {
    (
        counter(h, names::UPSTREAM_CACHED_TOKENS_TOTAL, dialect, model),
        counter(h, names::UPSTREAM_PROMPT_TOKENS_TOTAL, dialect, model),
    )
}

/// Sends a conversation request to `path`, reads the whole answer and waits for its turn to be recorded.
async fn send(h: &mut Harness, path: &str, body: &Value) -> String {
    let resp = h
        .client
        .post(h.url(path))
        .header("authorization", "Bearer sk-cache-test")
        .header("x-api-key", "sk-ant-cache-test")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    h.next_turn().await;
    text
}

fn chat_usage(prompt: u64, cached: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// A chat answer carrying `message` (its delta, streamed) and `usage`, as JSON or as SSE.
fn chat_reply(message: Value, finish: &str, usage: Value, stream: bool) -> MockReply {
    if !stream {
        return MockReply::json(
            200,
            json!({"id": "chatcmpl-c", "object": "chat.completion", "created": 1, "model": CHAT_MODEL,
                   "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}),
        );
    }
    let mut delta = message;
    for call in delta["tool_calls"].as_array_mut().into_iter().flatten() {
        call["index"] = json!(0);
    }
    let mut last = chunk(json!({}), None);
    last["choices"] = json!([]);
    last["usage"] = usage;
    MockReply::sse_chunks(
        &[chunk(delta, None), chunk(json!({}), Some(finish)), last],
        Duration::ZERO,
    )
}

fn anthropic_reply(reply: AnthropicReply, input: u64, read: u64, written: u64) -> AnthropicReply {
    AnthropicReply {
        input_tokens: Some(input),
        cache_read_input_tokens: read,
        cache_creation_input_tokens: written,
        ..reply
    }
}

fn responses_reply(reply: ResponsesReply, input: u64, cached: u64) -> ResponsesReply {
    ResponsesReply {
        input_tokens: Some(input),
        cached_tokens: cached,
        ..reply
    }
}

#[tokio::test]
async fn each_dialect_counts_the_cached_tokens_of_its_json_and_sse_answers() {
    let mut h = harness().await;
    for stream in [false, true] {
        // chat: 800 of 1000 prompt tokens from the cache
        let before = counted(&h, "chat", CHAT_MODEL);
        h.mock.push(chat_reply(
            json!({"role": "assistant", "content": "ok"}),
            "stop",
            chat_usage(1000, 800),
            stream,
        ));
        let body = json!({"model": CHAT_MODEL, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]});
        send(&mut h, "/v1/chat/completions", &body).await;
        let after = counted(&h, "chat", CHAT_MODEL);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (800.0, 1000.0),
            "chat, stream {stream}"
        );

        // Anthropic: input 100 + cache writes 200 + cache reads 700; the ratio is reads over all input
        let before = counted(&h, "anthropic", CLAUDE);
        h.mock
            .push_anthropic(anthropic_reply(AnthropicReply::text("ok"), 100, 700, 200));
        let body = json!({"model": CLAUDE, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]});
        send(&mut h, "/v1/messages", &body).await;
        let after = counted(&h, "anthropic", CLAUDE);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (700.0, 1000.0),
            "anthropic, stream {stream}"
        );

        // Responses: 900 of 1000 input tokens from the cache
        let before = counted(&h, "responses", CODEX);
        h.mock
            .push_responses(responses_reply(ResponsesReply::text("ok"), 1000, 900));
        let body = json!({"model": CODEX, "stream": stream, "input": "hi"});
        send(&mut h, "/v1/responses", &body).await;
        let after = counted(&h, "responses", CODEX);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (900.0, 1000.0),
            "responses, stream {stream}"
        );
    }
    // The series are per model label and dialect: nothing leaked into another dialect's.
    assert_eq!(counted(&h, "chat", CLAUDE).0, 0.0);
    assert_eq!(counted(&h, "anthropic", CODEX).0, 0.0);
}

fn anthropic_history(turns: usize, words: usize) -> Vec<Value> {
    let mut m = vec![json!({"role": "user", "content": "Fix the failing build, please."})];
    for i in 0..turns {
        m.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Running step {i}.")},
            {"type": "tool_use", "id": format!("toolu_{i:02}"), "name": "Bash",
             "input": {"command": format!("make step{i}")}}]}));
        let out: String = (0..words).map(|w| format!("line{i}-{w} ")).collect();
        m.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i:02}"), "content": out}]}));
    }
    m
}

fn responses_history(turns: usize, words: usize) -> Vec<Value> {
    let mut m = vec![json!({"role": "user", "content": "Fix the failing build."})];
    for i in 0..turns {
        m.push(json!({"type": "function_call", "call_id": format!("call_{i:02}"), "name": "exec_command",
                      "arguments": format!("{{\"cmd\":\"make step{i}\"}}")}));
        let out: String = (0..words).map(|w| format!("line{i}-{w} ")).collect();
        m.push(json!({"type": "function_call_output", "call_id": format!("call_{i:02}"), "output": out}));
    }
    m
}

/// A rewritten request whose model calls the recall tool once: both rounds' usage is counted (Anthropic and
/// Responses tell the client only the last round's prompt figures; the metrics count what was sent).
#[tokio::test]
async fn every_recall_round_is_counted() {
    let mut h = harness().await;
    for stream in [false, true] {
        // chat
        let before = counted(&h, "chat", CHAT_MODEL);
        let recall = json!({"id": "r1", "type": "function", "function": {"name": "recall_tool_call",
            "arguments": "{\"call_id\":\"call_0\"}"}});
        h.mock.push(chat_reply(
            json!({"role": "assistant", "content": null, "tool_calls": [recall]}),
            "tool_calls",
            chat_usage(5000, 4000),
            stream,
        ));
        h.mock.push(chat_reply(
            json!({"role": "assistant", "content": "done"}),
            "stop",
            chat_usage(5200, 5000),
            stream,
        ));
        let mut body = json!({"model": CHAT_MODEL, "messages": agent_history(14, 300),
            "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]});
        body["stream"] = json!(stream);
        let text = send(&mut h, "/v1/chat/completions", &body).await;
        assert!(!text.contains("recall_tool_call"), "{text}");
        let after = counted(&h, "chat", CHAT_MODEL);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (9000.0, 10200.0),
            "chat, stream {stream}"
        );

        // Anthropic: (50 + 3000 read) then (80 + 3000 read + 60 written)
        let before = counted(&h, "anthropic", CLAUDE);
        h.mock.push_anthropic(anthropic_reply(
            AnthropicReply::tool_use(
                "toolu_recall",
                "recall_tool_call",
                json!({"call_id": "toolu_00"}),
            ),
            50,
            3000,
            0,
        ));
        h.mock
            .push_anthropic(anthropic_reply(AnthropicReply::text("done"), 80, 3000, 60));
        let body = json!({"model": CLAUDE, "max_tokens": 1024, "stream": stream,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": anthropic_history(8, 200)});
        let text = send(&mut h, "/v1/messages", &body).await;
        assert!(!text.contains("toolu_recall"), "{text}");
        let after = counted(&h, "anthropic", CLAUDE);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (6000.0, 3050.0 + 3140.0),
            "anthropic, stream {stream}"
        );

        // Responses: 2500 of 3000, then 2900 of 3100
        let before = counted(&h, "responses", CODEX);
        h.mock.push_responses(responses_reply(
            ResponsesReply::function_call(
                "call_recall",
                "recall_tool_call",
                &json!({"call_id": "call_00"}),
            ),
            3000,
            2500,
        ));
        h.mock
            .push_responses(responses_reply(ResponsesReply::text("done"), 3100, 2900));
        let body = json!({"model": CODEX, "stream": stream, "store": false,
            "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
            "input": responses_history(8, 200)});
        let text = send(&mut h, "/v1/responses", &body).await;
        assert!(!text.contains("call_recall"), "{text}");
        let after = counted(&h, "responses", CODEX);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (5400.0, 6100.0),
            "responses, stream {stream}"
        );
    }
    assert_eq!(
        h.mock.requests().len(),
        12,
        "every request went in two rounds"
    );
}
