//! The mock upstream's Anthropic Messages API, spoken to directly (the client suites in `tests/clients/` reach it
//! through ctxgate): scripted replies over `/_mock/script` as JSON and as Anthropic's event stream, replies kept for
//! one model, errors, `count_tokens`, `HEAD`, the default answer and the recorded requests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ctxgate::mock::{estimate_tokens, AnthropicReply, MockUpstream};
use serde_json::{json, Value};

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

    async fn messages(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("x-api-key", "sk-ant-test")
            .header("anthropic-version", "2023-06-01")
            .header(
                "anthropic-beta",
                "claude-code-20250219,interleaved-thinking-2025-05-14",
            )
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

/// The `(event, data)` pairs of an event stream; each event's name is its data's `type`.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let (event, data) = block.split_once('\n').unwrap();
            let event = event.strip_prefix("event: ").unwrap().to_string();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], event.as_str());
            (event, data)
        })
        .collect()
}

fn request(stream: bool) -> Value {
    json!({"model": "claude-test", "max_tokens": 100, "stream": stream,
           "messages": [{"role": "user", "content": "run the tests"}]})
}

#[tokio::test]
async fn scripted_replies_stream_with_the_real_event_sequence_and_answer_json() {
    let m = Mock::start().await;
    let r = m
        .script(json!([
            {"anthropic": {"content": [
                {"type": "thinking", "thinking": "I should run them.", "signature": "EqQBCgIYAh=="},
                {"type": "text", "text": "Running the tests now."},
                {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "cargo test"}}],
             "usage": {"input_tokens": 321, "output_tokens": 45}}},
            {"anthropic": {"content": "All green."}},
        ]))
        .await;
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"queued": 2}));

    let r = m.messages("/v1/messages?beta=true", &request(true)).await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let ev = events(&r.text().await.unwrap());
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    let block = ["content_block_start", "content_block_delta"];
    assert_eq!(names[..4], ["message_start", "ping", block[0], block[1]]);
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert_eq!(ev[0].1["message"]["usage"]["input_tokens"], 321);
    assert_eq!(ev[0].1["message"]["model"], "claude-test");

    // Rebuild the message from the stream, as a client does.
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial = String::new();
    for (name, d) in &ev {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(d["index"], blocks.len(), "indexes are contiguous");
                blocks.push(d["content_block"].clone());
            }
            "content_block_delta" => {
                let b = blocks.last_mut().unwrap();
                let delta = &d["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => {
                        b["text"] = json!(format!(
                            "{}{}",
                            b["text"].as_str().unwrap(),
                            delta["text"].as_str().unwrap()
                        ))
                    }
                    "thinking_delta" => {
                        assert_eq!(b["signature"], "", "the signature comes after the thinking");
                        b["thinking"] = json!(format!(
                            "{}{}",
                            b["thinking"].as_str().unwrap(),
                            delta["thinking"].as_str().unwrap()
                        ));
                    }
                    "signature_delta" => b["signature"] = delta["signature"].clone(),
                    "input_json_delta" => partial.push_str(delta["partial_json"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                let b = blocks.last_mut().unwrap();
                if b["type"] == "tool_use" {
                    b["input"] = serde_json::from_str(&partial).unwrap();
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        blocks,
        [
            json!({"type": "thinking", "thinking": "I should run them.", "signature": "EqQBCgIYAh=="}),
            json!({"type": "text", "text": "Running the tests now."}),
            json!({"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "cargo test"}}),
        ]
    );
    let input_pieces = ev
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .count();
    assert!(input_pieces > 1, "the tool input comes in several pieces");
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 45);
    assert_eq!(delta["usage"]["input_tokens"], 321);

    // The second reply, asked for without streaming: one message body.
    let r = m.messages("/v1/messages", &request(false)).await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "message");
    assert_eq!(
        body["content"],
        json!([{"type": "text", "text": "All green."}])
    );
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(
        body["usage"]["input_tokens"],
        estimate_tokens(&request(false))
    );

    // Both recorded: body, query and headers as sent, and what was answered.
    let log = m.log().await;
    assert_eq!(log.len(), 2);
    assert_eq!(log[0]["uri"], "/v1/messages?beta=true");
    assert_eq!(log[0]["body"], request(true));
    assert_eq!(log[0]["headers"]["x-api-key"], "sk-ant-test");
    assert_eq!(log[0]["headers"]["anthropic-version"], "2023-06-01");
    assert_eq!(
        log[0]["headers"]["anthropic-beta"],
        "claude-code-20250219,interleaved-thinking-2025-05-14"
    );
    assert!(log[0]["reply"]["sse"]
        .as_str()
        .unwrap()
        .starts_with("event: message_start\n"));
    assert_eq!(log[1]["reply"]["status"], 200);
}

#[tokio::test]
async fn a_reply_for_one_model_waits_for_it_and_side_requests_get_the_default() {
    let m = Mock::start().await;
    m.script(json!({"anthropic": {"content": "for the main loop"}, "model": "claude-main"}))
        .await;
    let side = json!({"model": "claude-small", "max_tokens": 10, "messages": [{"role": "user", "content": "title?"}]});
    let r: Value = m
        .messages("/v1/messages", &side)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["content"][0]["text"], "mock reply");
    // count_tokens and HEAD never take a scripted reply either
    let count: Value = m
        .messages("/v1/messages/count_tokens", &side)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(count, json!({"input_tokens": estimate_tokens(&side)}));
    let head = m.client.head(m.url("/")).send().await.unwrap();
    assert_eq!(head.status(), 200);
    let main = json!({"model": "claude-main", "max_tokens": 10, "messages": [{"role": "user", "content": "go"}]});
    let r: Value = m
        .messages("/v1/messages", &main)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["content"][0]["text"], "for the main loop");
    assert_eq!(r["model"], "claude-main");
}

#[tokio::test]
async fn the_default_answer_ends_a_loop_and_its_usage_grows_with_the_request() {
    let m = Mock::start().await;
    let small = request(true);
    let mut big = request(true);
    big["messages"][0]["content"] = json!("many words ".repeat(2000));
    let mut usage = Vec::new();
    for body in [&small, &big] {
        let ev = events(&m.messages("/v1/messages", body).await.text().await.unwrap());
        let text: String = ev
            .iter()
            .filter_map(|(_, d)| d["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "mock reply");
        let delta = &ev[ev.len() - 2].1;
        assert_eq!(
            delta["delta"]["stop_reason"], "end_turn",
            "a client's loop ends here"
        );
        let count: Value = m
            .messages("/v1/messages/count_tokens", body)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(
            delta["usage"]["input_tokens"], count["input_tokens"],
            "count_tokens agrees with usage"
        );
        usage.push(count["input_tokens"].as_u64().unwrap());
    }
    assert!(usage[1] > usage[0] + 5000, "{usage:?}");
    // answers to different requests are different messages
    let ids: Vec<Value> = m
        .log()
        .await
        .iter()
        .filter(|r| r["uri"] == "/v1/messages")
        .map(|r| events(r["reply"]["sse"].as_str().unwrap())[0].1["message"]["id"].clone())
        .collect();
    assert_ne!(ids[0], ids[1]);
}

#[tokio::test]
async fn errors_come_in_anthropics_shape_as_answers_and_mid_stream() {
    let m = Mock::start().await;
    m.script(json!([
        {"anthropic_error": {"type": "overloaded_error", "message": "Overloaded"}, "headers": {"retry-after": "2"}},
        {"anthropic": {"content": [{"type": "text", "text": "half"}, {"type": "text", "text": "never"}],
                       "stream_error": {"after_blocks": 1, "type": "api_error", "message": "Internal server error"}}},
    ]))
    .await;
    let r = m.messages("/v1/messages", &request(true)).await;
    assert_eq!(r.status(), 529);
    assert_eq!(r.headers()["retry-after"], "2");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_mock"})
    );
    let r = m.messages("/v1/messages", &request(true)).await;
    assert_eq!(r.status(), 200, "the stream started fine");
    let ev = events(&r.text().await.unwrap());
    let (last, data) = ev.last().unwrap();
    assert_eq!(last, "error");
    assert_eq!(
        data,
        &json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}})
    );
    let text: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "half");
    assert!(!ev.iter().any(|(n, _)| n == "message_stop"));
}

#[tokio::test]
async fn rust_tests_script_anthropic_replies_directly() {
    let m = Mock::start().await;
    m.mock.push_anthropic(AnthropicReply::tool_use(
        "toolu_9",
        "read_file",
        json!({"path": "a.rs"}),
    ));
    let r: Value = m
        .messages("/v1/messages", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        r["content"],
        json!([{"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {"path": "a.rs"}}])
    );
    assert_eq!(r["stop_reason"], "tool_use");
    // an Anthropic reply is never taken by a chat completions request
    m.mock
        .push_anthropic(AnthropicReply::text("only for messages"));
    let chat: Value = m
        .client
        .post(m.url("/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(chat["choices"][0]["message"]["content"], "mock reply");
    let r: Value = m
        .messages("/v1/messages", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["content"][0]["text"], "only for messages");
}

#[tokio::test]
async fn bad_anthropic_specs_are_refused_and_nothing_is_queued() {
    let m = Mock::start().await;
    for bad in [
        json!({"anthropic": {"content": [{"type": "tool_use", "name": "x"}]}}),
        json!([{"anthropic": {"content": "ok"}}, {"anthropic_error": {"status": 500}}]),
        json!({"anthropic": {"content": "x"}, "model": ["m"]}),
    ] {
        let r = m.script(bad.clone()).await;
        assert_eq!(r.status(), 400, "{bad}");
        assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    }
    let r: Value = m
        .messages("/v1/messages", &request(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        r["content"][0]["text"], "mock reply",
        "a refused list queues nothing"
    );
}
