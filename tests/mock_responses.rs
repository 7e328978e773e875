//! The mock upstream's OpenAI Responses API, spoken to directly (the client suites in `tests/clients/` reach it
//! through ctxgate): scripted replies over `/_mock/script` as JSON and as the Responses event stream, replies that
//! fit only `POST …/responses`, errors, `input_tokens`, `compact`, `compaction_trigger`, the WebSocket upgrade and
//! the default answer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ctxgate::mock::{MockReply, MockUpstream, ResponsesReply};
use serde_json::{json, Value};
use std::time::Duration;

struct Mock {
    mock: MockUpstream,
    client: reqwest::Client,
}

impl Mock {
    async fn start() -> Mock {
        Mock {
            mock: MockUpstream::start().await.unwrap(),
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.mock.addr)
    }

    async fn script(&self, specs: Value) -> reqwest::Response {
        self.client
            .post(self.url("/_mock/script"))
            .json(&specs)
            .send()
            .await
            .unwrap()
    }

    async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .bearer_auth("sk-test")
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn log(&self) -> Vec<Value> {
        let r = self
            .client
            .get(self.url("/_mock/requests"))
            .send()
            .await
            .unwrap();
        r.json::<Value>().await.unwrap().as_array().unwrap().clone()
    }
}

/// The `(event, data)` pairs of an event stream; each event's name is its data's `type`, sequence numbers count.
fn events(text: &str) -> Vec<(String, Value)> {
    let ev: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let (event, data) = block.split_once('\n').unwrap();
            let event = event.strip_prefix("event: ").unwrap().to_string();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], event.as_str());
            (event, data)
        })
        .collect();
    for (i, (_, d)) in ev.iter().enumerate() {
        assert_eq!(d["sequence_number"], i);
    }
    ev
}

fn request(stream: bool) -> Value {
    json!({"model": "gpt-test", "stream": stream, "store": false, "instructions": "be brief",
           "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run ls"}]}],
           "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]})
}

#[tokio::test]
async fn scripted_replies_stream_with_the_real_event_sequence_and_answer_json() {
    let m = Mock::start().await;
    let call = json!({"responses": {"output": [
        {"type": "reasoning", "encrypted_content": "gAAAA-enc", "summary": [{"type": "summary_text", "text": "plan"}]},
        {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": {"command": ["ls"]}}],
        "usage": {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 512}}}});
    let r = m.script(json!([call.clone(), call])).await;
    assert_eq!(r.status(), 200);

    let r = m.post("/v1/responses", &request(true)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let ev = events(&r.text().await.unwrap());
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    assert!(names.contains(&"response.reasoning_summary_part.added"));
    assert!(
        names
            .iter()
            .filter(|n| **n == "response.function_call_arguments.delta")
            .count()
            > 1
    );
    let completed = &ev.last().unwrap().1;
    assert_eq!(completed["type"], "response.completed");
    let response = &completed["response"];
    assert_eq!(response["output"][0]["encrypted_content"], "gAAAA-enc");
    assert_eq!(response["output"][1]["arguments"], r#"{"command":["ls"]}"#);
    assert_eq!(response["usage"]["input_tokens"], 900);
    assert_eq!(
        response["usage"]["input_tokens_details"]["cached_tokens"],
        512
    );
    assert_eq!(response["instructions"], "be brief");
    assert_eq!(response["prompt_cache_key"], Value::Null);

    let r = m.post("/v1/responses", &request(false)).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["output"][1]["call_id"], "call_1");
    let log = m.log().await;
    assert_eq!(log.len(), 2);
    let at: Vec<u64> = log
        .iter()
        .map(|r| r["received_ms"].as_u64().unwrap())
        .collect();
    assert!(
        at[0] > 1_700_000_000_000 && at[0] <= at[1],
        "arrival times: {at:?}"
    );
}

#[tokio::test]
async fn responses_replies_fit_only_responses_requests() {
    let m = Mock::start().await;
    m.script(json!({"responses": {"output": "for responses"}}))
        .await;
    // a chat request, the token count and a WebSocket upgrade do not take it
    let chat = m
        .post(
            "/v1/chat/completions",
            &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    let chat: Value = chat.json().await.unwrap();
    assert_eq!(chat["choices"][0]["message"]["content"], "mock reply");
    let count: Value = m
        .post("/v1/responses/input_tokens", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(count["object"], "response.input_tokens");
    assert!(count["input_tokens"].as_u64().unwrap() > 10);
    let ws = tokio::time::timeout(
        Duration::from_secs(5),
        m.client
            .get(m.url("/v1/responses"))
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .send(),
    )
    .await
    .expect("the upgrade is answered at once")
    .unwrap();
    assert_eq!(ws.status(), 404);
    let err: Value = ws.json().await.unwrap();
    assert!(err["error"]["message"].is_string());
    // the same upgrade attempt without its Upgrade header (a proxy drops it as hop-by-hop) does not take it either
    let plain = m.client.get(m.url("/v1/responses")).send().await.unwrap();
    assert_eq!(plain.status(), 404);
    // a request ending with a compaction_trigger does not take a reply without a compaction item
    let mut trigger = request(false);
    trigger["input"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "compaction_trigger"}));
    let compacted: Value = m
        .post("/v1/responses", &trigger)
        .await
        .json()
        .await
        .unwrap();
    let out = compacted["output"].as_array().unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["type"], "compaction");
    let body: Value = m
        .post("/v1/responses", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["output"][0]["content"][0]["text"], "for responses");
}

#[tokio::test]
async fn the_default_answer_and_its_usage_grows_with_the_request() {
    let m = Mock::start().await;
    let small: Value = m
        .post("/v1/responses", &request(false))
        .await
        .json()
        .await
        .unwrap();
    let mut big = request(false);
    big["input"][0]["content"][0]["text"] = json!("word ".repeat(2000));
    let big: Value = m.post("/v1/responses", &big).await.json().await.unwrap();
    assert_eq!(small["output"][0]["content"][0]["text"], "mock reply");
    let tokens = |b: &Value| b["usage"]["input_tokens"].as_u64().unwrap();
    assert!(tokens(&big) > tokens(&small) + 2000);
    let r = m.post("/v1/responses", &request(true)).await;
    let ev = events(&r.text().await.unwrap());
    let said: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(said, "mock reply");
    let compact: Value = m
        .post("/v1/responses/compact", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(compact["object"], "response.compaction");
    let kinds: Vec<&str> = compact["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["message", "compaction"]);
    assert_eq!(compact["output"][0]["content"][0]["text"], "run ls");
}

#[tokio::test]
async fn errors_come_in_openais_shape_as_answers_and_mid_stream() {
    let m = Mock::start().await;
    m.script(json!([
        {"responses_error": {"code": "rate_limit_exceeded", "message": "slow down"}, "headers": {"retry-after": "2"}},
        {"responses": {"output": "half", "error": {"after_items": 1, "code": "server_error", "message": "broke"}}},
        {"responses": {"output": "half", "failed": {"after_items": 0, "code": "server_error", "message": "failed"}}},
    ]))
    .await;
    let r = m.post("/v1/responses", &request(true)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!({"error": {"message": "slow down", "type": "requests", "param": null, "code": "rate_limit_exceeded"}})
    );
    let ev = events(
        &m.post("/v1/responses", &request(true))
            .await
            .text()
            .await
            .unwrap(),
    );
    let (name, data) = ev.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["message"], "broke");
    assert!(ev.iter().any(|(n, _)| n == "response.output_text.done"));
    let ev = events(
        &m.post("/v1/responses", &request(true))
            .await
            .text()
            .await
            .unwrap(),
    );
    let (name, data) = ev.last().unwrap();
    assert_eq!(name, "response.failed");
    assert_eq!(data["response"]["error"]["message"], "failed");
    let log = m.log().await;
    assert!(log[1]["reply"]["sse"]
        .as_str()
        .unwrap()
        .contains("event: error"));
}

#[tokio::test]
async fn rust_tests_script_responses_replies_directly() {
    let m = Mock::start().await;
    m.mock.push_responses(ResponsesReply::function_call(
        "call_9",
        "lookup",
        &json!({"q": "x"}),
    ));
    m.mock.push(MockReply::completion("for chat"));
    // the chat reply queued second still answers the chat request first in line for it
    let chat: Value = m
        .post(
            "/v1/chat/completions",
            &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(chat["choices"][0]["message"]["content"], "for chat");
    let body: Value = m
        .post("/v1/responses", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["output"][0]["type"], "function_call");
    assert_eq!(body["output"][0]["arguments"], r#"{"q":"x"}"#);
    assert_eq!(m.mock.requests().len(), 2);
}

#[tokio::test]
async fn bad_responses_specs_are_refused_and_nothing_is_queued() {
    let m = Mock::start().await;
    for bad in [
        json!({"responses": {}}),
        json!({"responses": {"output": [{"type": "custom_tool_call", "name": "x"}]}}),
        json!([{"responses": {"output": "ok"}}, {"responses_error": {"message": "no code"}}]),
    ] {
        let r = m.script(bad.clone()).await;
        assert_eq!(r.status(), 400, "{bad}");
    }
    let body: Value = m
        .post("/v1/responses", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["output"][0]["content"][0]["text"], "mock reply");
}
