//! The Anthropic Messages dialect through the gateway: transparency, sessions, rewriting (valid for the API),
//! recall rounds in JSON and SSE, count_tokens, errors in Anthropic's shape.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{session_header, Harness};
use ctxgate::context::shape::PLACEHOLDER_PREFIX;
use ctxgate::dialect::anthropic::validate::{check_rewrite, check_sequence};
use ctxgate::mock::AnthropicReply;
use serde_json::{json, Value};

const SIG: &str = "EqQBCkgIARABGAIiQL0signature+byte/exact==";

/// A Claude Code-like history: a task, then `turns` rounds of thinking + a Bash call and its (long) result, the
/// last result still unanswered.
fn history(turns: usize, words: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role":"user","content":[{"type":"text","text":"Fix the failing build, please."}]}),
    ];
    for i in 0..turns {
        m.push(json!({"role":"assistant","content":[
            {"type":"thinking","thinking":format!("Step {i}: look at the logs."),"signature":format!("{SIG}{i}")},
            {"type":"text","text":format!("Running step {i}.")},
            {"type":"tool_use","id":format!("toolu_{i:02}"),"name":"Bash","input":{"command":format!("make step{i}")}}]}));
        let out: String = (0..words).map(|w| format!("line{i}-{w} ")).collect();
        m.push(json!({"role":"user","content":[
            {"type":"tool_result","tool_use_id":format!("toolu_{i:02}"),"content":out}]}));
    }
    m
}

fn body(messages: &[Value]) -> Value {
    json!({"model":"claude-sonnet-4-5","max_tokens":1024,
           "system":[{"type":"text","text":"You are Claude Code."},{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
           "tools":[{"name":"Bash","description":"Run a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}}],
           "metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"6f1c-claude-session\"}"},
           "messages":messages})
}

async fn post(h: &Harness, path: &str, body: &Value) -> reqwest::Response {
    let headers = [
        ("x-api-key", "sk-ant-test-key"),
        ("anthropic-version", "2023-06-01"),
        (
            "anthropic-beta",
            "interleaved-thinking-2025-05-14,fine-grained-tool-streaming",
        ),
    ];
    h.post_json(path, &headers, body).await
}

async fn small_window() -> Harness {
    common::small_window("claude-*", 6_000).await
}

#[tokio::test]
async fn an_untouched_request_goes_upstream_byte_for_byte_and_the_answer_comes_back_unchanged() {
    let h = Harness::start().await;
    h.mock.push_anthropic(AnthropicReply::text("Done."));
    let b = body(&history(2, 10));
    let raw = serde_json::to_vec(&b).unwrap();
    let resp = post(&h, "/v1/messages?beta=true", &b).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-ctxgate-session").is_some());
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["content"][0]["text"], "Done.");
    assert_eq!(answer["type"], "message");
    let rec = &h.mock.requests()[0];
    assert_eq!(rec.uri, "/v1/messages?beta=true", "the query as is");
    assert_eq!(&rec.body[..], &raw[..], "byte for byte");
    for (k, v) in [
        ("x-api-key", "sk-ant-test-key"),
        ("anthropic-version", "2023-06-01"),
        (
            "anthropic-beta",
            "interleaved-thinking-2025-05-14,fine-grained-tool-streaming",
        ),
    ] {
        assert_eq!(rec.headers.get(k).unwrap(), v, "{k}");
    }
}

#[tokio::test]
async fn claude_code_turns_share_one_session_and_the_admin_api_shows_anthropic_messages() {
    let mut h = Harness::start().await;
    let mut m = history(1, 5);
    h.mock.push_anthropic(AnthropicReply::text("First."));
    let r1 = post(&h, "/v1/messages", &body(&m)).await;
    let sid = session_header(&r1);
    r1.text().await.unwrap();
    h.next_turn().await;
    m.push(json!({"role":"assistant","content":[{"type":"text","text":"First."}]}));
    m.push(json!({"role":"user","content":"And now?"}));
    h.mock.push_anthropic(AnthropicReply::text("Second."));
    let r2 = post(&h, "/v1/messages", &body(&m)).await;
    assert_eq!(
        r2.headers()["x-ctxgate-session"],
        sid.as_str(),
        "metadata.user_id's session"
    );
    r2.text().await.unwrap();
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
    assert_eq!(v["dialect"], "anthropic");
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), m.len() + 1, "full history and the last reply");
    assert_eq!(
        msgs[1]["content"][0]["signature"],
        format!("{SIG}0"),
        "stored as sent"
    );
    assert_eq!(msgs.last().unwrap()["content"][0]["text"], "Second.");
}

#[tokio::test]
async fn over_the_threshold_old_results_are_cleared_inside_their_tool_result_and_the_request_stays_valid(
) {
    let h = small_window().await;
    h.mock.push_anthropic(AnthropicReply::text("ok"));
    let m = history(8, 200);
    let b = body(&m);
    let resp = post(&h, "/v1/messages", &b).await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    let sent = h.mock.requests()[0].json();
    check_rewrite(&b, &sent).unwrap();
    let out = sent["messages"].as_array().unwrap();
    check_sequence(out).unwrap();
    let placeholders = out
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|blk| blk["type"] == "tool_result")
        .filter(|blk| {
            blk["content"]
                .as_str()
                .is_some_and(|c| c.starts_with(PLACEHOLDER_PREFIX))
        })
        .count();
    // The oldest steps are folded (left out, a line each on the first result kept), the next cleared in place.
    let folded = out
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|blk| blk["type"] == "tool_result")
        .filter(|blk| {
            blk["content"]
                .as_str()
                .is_some_and(|c| c.contains(ctxgate::context::fold::FOLD_PREFIX))
        })
        .count();
    assert!(
        folded == 1,
        "old results folded ({folded}; {placeholders} more cleared in place)"
    );
    assert_eq!(out.last(), m.last(), "the newest result is whole");
    assert_eq!(sent["system"], b["system"], "system untouched");
    let tools = sent["tools"].as_array().unwrap();
    assert_eq!(
        tools[0], b["tools"][0],
        "the client's tools first, untouched"
    );
    assert!(
        tools
            .iter()
            .any(|t| t["name"] == "recall_tool_call" && t.get("input_schema").is_some()),
        "the recall tool is offered as an Anthropic tool"
    );
    assert!(sent.to_string().len() < b.to_string().len());
}

/// The answer calls the recall tool first; ctxgate answers it and the client gets one answer without it.
async fn recall_round_trip(stream: bool) {
    let h = small_window().await;
    let m = history(8, 200);
    let mut b = body(&m);
    b["stream"] = json!(stream);
    h.mock.push_anthropic(AnthropicReply::blocks(vec![
        json!({"type":"thinking","thinking":"I need the first output.","signature":SIG}),
        json!({"type":"tool_use","id":"toolu_recall","name":"recall_tool_call","input":{"call_id":"toolu_00"}}),
    ]));
    h.mock
        .push_anthropic(AnthropicReply::text("The first step printed line0-0."));
    let resp = post(&h, "/v1/messages", &b).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        !text.contains("recall_tool_call"),
        "our tool is hidden: {text}"
    );
    assert!(!text.contains("toolu_recall"));
    if stream {
        assert_eq!(text.matches("event: message_start").count(), 1, "{text}");
        assert_eq!(text.matches("event: message_stop").count(), 1, "{text}");
        assert_eq!(text.matches("event: message_delta").count(), 1, "{text}");
        let said: String = ctxgate::sse::SseParser::new()
            .feed(text.as_bytes())
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
            .filter(|v| v["delta"]["type"] == "text_delta")
            .map(|v| v["delta"]["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(said, "The first step printed line0-0.");
        // the mock pings once per answer; ctxgate pings while its follow-up round is in flight
        assert!(text.matches("event: ping").count() >= 3, "{text}");
        assert!(text.contains("\"index\":1"), "blocks numbered on: {text}");
        assert!(
            !text.contains("\"index\":2"),
            "no gap for our hidden block: {text}"
        );
    } else {
        let v: Value = serde_json::from_str(&text).unwrap();
        let content = v["content"].as_array().unwrap();
        assert!(content.iter().all(|c| c["type"] != "tool_use"), "{v}");
        assert_eq!(
            content.last().unwrap()["text"],
            "The first step printed line0-0."
        );
        assert_eq!(v["stop_reason"], "end_turn");
    }
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 2, "one follow-up");
    let second = reqs[1].json();
    let msgs = second["messages"].as_array().unwrap();
    check_sequence(msgs).unwrap();
    let (asst, answer) = (&msgs[msgs.len() - 2], &msgs[msgs.len() - 1]);
    assert_eq!(
        asst["content"][0]["signature"], SIG,
        "the thinking that led to the call, signed"
    );
    assert_eq!(asst["content"][1]["name"], "recall_tool_call");
    assert_eq!(answer["content"][0]["tool_use_id"], "toolu_recall");
    // The original arguments (the client's `input`, as its JSON text) and the original result, verbatim.
    let result: String = (0..200).map(|w| format!("line0-{w} ")).collect();
    assert_eq!(
        answer["content"][0]["content"],
        format!(
            "Arguments of call toolu_00 (Bash):\n{}\n\nResult:\n{result}",
            m[1]["content"][2]["input"]
        )
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
async fn an_unfittable_request_is_refused_as_claude_code_expects() {
    let h = Harness::start_with(|c| {
        c.context.default_context_window = 600;
        c.models.insert(
            "claude-*".into(),
            ctxgate::config::ModelEntry {
                context_window: Some(600),
                ..Default::default()
            },
        );
    })
    .await;
    let mut m = history(0, 0);
    m[0] = json!({"role":"user","content":"word ".repeat(3000)});
    let resp = post(&h, "/v1/messages", &body(&m)).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("prompt is too long: ")
            && msg.contains(" tokens > ")
            && msg.ends_with(" maximum"),
        "{msg}"
    );
    assert!(h.mock.requests().is_empty(), "never sent upstream");
}

#[tokio::test]
async fn bad_input_is_refused_in_anthropics_error_shape() {
    let h = Harness::start().await;
    for bad in [
        json!({"model":"claude-x"}),
        json!({"messages":[{"role":"robot","content":"x"}]}),
    ] {
        let resp = post(&h, "/v1/messages", &bad).await;
        assert_eq!(resp.status(), 400);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn count_tokens_counts_what_ctxgate_would_send() {
    let h = small_window().await;
    let m = history(8, 200);
    let mut b = body(&m);
    b.as_object_mut().unwrap().remove("max_tokens");
    let resp = post(&h, "/v1/messages/count_tokens", &b).await;
    assert_eq!(resp.status(), 200);
    let counted: Value = resp.json().await.unwrap();
    let rec = &h.mock.requests()[0];
    assert_eq!(rec.path(), "/v1/messages/count_tokens");
    let sent = rec.json();
    check_rewrite(&b, &sent).unwrap();
    assert!(
        sent.to_string().len() < b.to_string().len(),
        "the rewritten body is counted"
    );
    let whole = ctxgate::mock::estimate_tokens(&b);
    assert!(counted["input_tokens"].as_u64().unwrap() < whole);
    // a small request is counted as it is
    let small = body(&history(1, 3));
    post(&h, "/v1/messages/count_tokens", &small)
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(h.mock.requests()[1].json(), small);
}

#[tokio::test]
async fn claude_codes_base_url_check_is_answered() {
    let h = Harness::start().await;
    let resp = h.client.head(h.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// A support chat in Anthropic's shape: `loops` finished questions (one small tool call each), then a new one.
fn support(loops: usize) -> Vec<Value> {
    let mut m = Vec::new();
    for l in 0..loops {
        let id = format!("toolu_s{l}");
        m.push(json!({"role":"user","content":format!("question {l}: {}", "please help ".repeat(120))}));
        m.push(json!({"role":"assistant","content":[{"type":"tool_use","id":id,"name":"lookup","input":{"q":l}}]}));
        m.push(json!({"role":"user","content":[{"type":"tool_result","tool_use_id":id,"content":format!("RESULT-{l}")}]}));
        m.push(json!({"role":"assistant","content":[{"type":"text","text":format!("answer {l}: {}", "indeed ".repeat(120))}]}));
    }
    m.push(json!({"role":"user","content":"and now?"}));
    m
}

#[tokio::test]
async fn summaries_of_an_anthropic_conversation_are_written_by_a_claude_model_through_the_messages_api(
) {
    let h = Harness::start_with(|c| {
        c.models.insert(
            "claude-*".into(),
            ctxgate::config::ModelEntry {
                context_window: Some(4_000),
                ..Default::default()
            },
        );
        c.summary.model = Some("claude-haiku-4-5".into());
        c.summary.wait_ms = 5_000;
        c.summary.keep_recent = 4;
        c.context.strategy = ctxgate::config::Strategy::Summarize;
    })
    .await;
    let mut m = support(8);
    let resp = post(&h, "/v1/messages", &body(&m)).await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    let reqs = h.mock.requests();
    let summary = reqs
        .iter()
        .find(|r| r.json()["model"] == "claude-haiku-4-5")
        .expect("a summary request");
    assert_eq!(summary.path(), "/v1/messages", "an Anthropic call");
    assert!(summary.headers.contains_key("anthropic-version"));
    assert_eq!(
        summary.headers["x-api-key"], "sk-ant-test-key",
        "the client's own key"
    );
    let s = summary.json();
    assert!(
        s["system"].as_str().is_some_and(|p| !p.is_empty()),
        "the prompt as the system"
    );
    let transcript = s["messages"][0]["content"].as_str().unwrap();
    assert!(transcript.contains("question 0") && transcript.contains("RESULT-0"));
    assert!(s.get("thinking").is_none() && s.get("context_management").is_none());

    // the next turn is sent with the summary in place of what it covers, as a valid Messages request
    m.push(json!({"role":"assistant","content":[{"type":"text","text":"mock reply"}]}));
    m.push(json!({"role":"user","content":"thanks, one more thing"}));
    let b = body(&m);
    post(&h, "/v1/messages", &b).await.text().await.unwrap();
    let sent = h
        .mock
        .requests()
        .iter()
        .rev()
        .find(|r| r.json()["model"] == "claude-sonnet-4-5")
        .unwrap()
        .json();
    check_rewrite(&b, &sent).unwrap();
    let out = sent["messages"].as_array().unwrap();
    check_sequence(out).unwrap();
    assert_eq!(out[0], m[0], "the task (first user message) is pinned");
    assert!(
        out[1]
            .to_string()
            .contains("Summary of the earlier conversation"),
        "{}",
        out[1]
    );
    assert!(out.len() < m.len());
}

#[tokio::test]
async fn anthropic_requests_go_to_the_anthropic_base_url_with_its_key_only_when_the_client_sends_none(
) {
    let h = Harness::start_with(|c| {
        c.anthropic.base_url = format!("{}/ant", c.anthropic.base_url);
        c.anthropic.api_key = Some("sk-ant-gateway".into());
    })
    .await;
    let b = body(&history(1, 3));
    let bare = |path: &str| {
        h.client
            .post(h.url(path))
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&b).unwrap())
    };
    bare("/v1/messages")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    post(&h, "/v1/messages", &b).await.text().await.unwrap();
    h.client
        .get(h.url("/v1/models"))
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    h.client
        .get(h.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let reqs = h.mock.requests();
    let uris: Vec<&str> = reqs.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(
        uris,
        [
            "/v1/ant/messages",
            "/v1/ant/messages",
            "/v1/ant/models",
            "/v1/models"
        ]
    );
    assert_eq!(
        reqs[0].headers["x-api-key"], "sk-ant-gateway",
        "no credential: the gateway's key"
    );
    assert_eq!(
        reqs[1].headers["x-api-key"], "sk-ant-test-key",
        "the client's own key"
    );
    assert_eq!(reqs[1].headers.get_all("x-api-key").iter().count(), 1);
}
