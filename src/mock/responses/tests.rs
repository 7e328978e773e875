//! Unit tests of the mock's Responses API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn events(reply: &MockReply) -> Vec<(String, Value)> {
    let MockReply::Sse { chunks, .. } = reply else {
        panic!("not a stream: {reply:?}")
    };
    chunks
        .iter()
        .map(|(_, b)| {
            let text = std::str::from_utf8(b).unwrap();
            let (event, data) = text.trim_end().split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            let event = event.strip_prefix("event: ").unwrap().to_string();
            assert_eq!(
                data["type"],
                event.as_str(),
                "event name and data type agree"
            );
            (event, data)
        })
        .collect()
}

fn json_body(reply: &MockReply) -> (u16, Value) {
    let MockReply::Json { status, body, .. } = reply else {
        panic!("not JSON: {reply:?}")
    };
    (*status, serde_json::from_slice(body).unwrap())
}

fn full_reply() -> ResponsesReply {
    ResponsesReply::from_spec(&json!({"output": [
        {"type": "reasoning", "encrypted_content": "gAAAA-secret",
         "summary": [{"type": "summary_text", "text": "thinking it over"}]},
        {"type": "message", "text": "Running it.", "phase": "commentary"},
        {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": {"command": ["echo", "hi"]}},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
    ], "usage": {"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1000},
                 "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20}}}))
    .unwrap()
}

#[test]
fn a_stream_has_the_real_event_sequence() {
    let request = json!({"model": "gpt-x", "stream": true, "input": "hi", "tools": [{"type": "function", "name": "shell"}]});
    let ev = events(&full_reply().render(&request));
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..3],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added"
        ]
    );
    assert_eq!(names.last(), Some(&"response.completed"));
    for (i, (_, d)) in ev.iter().enumerate() {
        assert_eq!(d["sequence_number"], i, "sequence numbers count the events");
    }
    for (name, d) in &ev[2..ev.len() - 1] {
        assert!(d["output_index"].is_u64(), "{name} has an output_index");
        if !name.starts_with("response.output_item.") {
            assert!(d["item_id"].is_string(), "{name} has an item_id");
        }
    }
    let of = |i: u64| -> Vec<&(String, Value)> {
        ev.iter().filter(|(_, d)| d["output_index"] == i).collect()
    };
    // reasoning: the added item lacks the encrypted content, the done item has it; summary parts in between
    let rs = of(0);
    assert!(rs[0].1["item"].get("encrypted_content").is_none());
    assert_eq!(
        rs.last().unwrap().1["item"]["encrypted_content"],
        "gAAAA-secret"
    );
    let summary: String = rs
        .iter()
        .filter(|(n, _)| n == "response.reasoning_summary_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(summary, "thinking it over");
    assert!(rs
        .iter()
        .any(|(n, _)| n == "response.reasoning_summary_part.done"));
    // message: part added, text deltas, text done, part done, item done
    let msg: Vec<&str> = of(1).iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        msg[..2],
        ["response.output_item.added", "response.content_part.added"]
    );
    assert_eq!(
        msg[msg.len() - 3..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done"
        ]
    );
    assert_eq!(of(1).last().unwrap().1["item"]["phase"], "commentary");
    // function call: arguments in several pieces that join to the arguments
    let fc = of(2);
    assert_eq!(fc[0].1["item"]["arguments"], "");
    let parts: Vec<&str> = fc
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert!(parts.len() > 1);
    assert_eq!(
        serde_json::from_str::<Value>(&parts.concat()).unwrap(),
        json!({"command": ["echo", "hi"]})
    );
    let done = fc
        .iter()
        .find(|(n, _)| n == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(done.1["arguments"], parts.concat());
    // custom tool call: input deltas then done
    let ctc = of(3);
    let input: String = ctc
        .iter()
        .filter(|(n, _)| n == "response.custom_tool_call_input.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(input, "*** Begin Patch\n*** End Patch");
    // completed: the whole response, output equal to the items done, usage with its details
    let completed = &ev.last().unwrap().1["response"];
    let done_items: Vec<&Value> = ev
        .iter()
        .filter(|(n, _)| n == "response.output_item.done")
        .map(|(_, d)| &d["item"])
        .collect();
    assert_eq!(
        completed["output"]
            .as_array()
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
        done_items
    );
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["model"], "gpt-x");
    assert_eq!(
        completed["usage"],
        json!({"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1000, "cache_write_tokens": 0},
               "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20}, "total_tokens": 1250})
    );
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(ev[0].1["response"]["output"], json!([]));
}

#[test]
fn json_answers_carry_the_whole_response_and_usage_grows_with_the_request() {
    let small = json!({"model": "m", "input": "y"});
    let big = json!({"model": "m", "input": [{"role": "user", "content": "x".repeat(4000)}]});
    let reply = ResponsesReply::text("hello");
    let (status, body) = json_body(&reply.render(&big));
    assert_eq!(status, 200);
    assert_eq!(body["object"], "response");
    assert_eq!(body["output"][0]["content"][0]["text"], "hello");
    assert_eq!(body["output"][0]["status"], "completed");
    let (_, other) = json_body(&reply.render(&small));
    assert_ne!(
        body["id"], other["id"],
        "each turn's response has its own id"
    );
    let tokens = |b: &Value| b["usage"]["input_tokens"].as_u64().unwrap();
    assert!(tokens(&body) >= 1000 && tokens(&other) < 10);
}

#[test]
fn failures_end_the_stream_and_fail_a_json_request() {
    let spec = json!({"output": [{"type": "message", "text": "x"}],
                      "error": {"after_items": 1, "code": "server_error", "message": "boom"}});
    let reply = ResponsesReply::from_spec(&spec).unwrap();
    let ev = events(&reply.render(&json!({"stream": true})));
    let (name, data) = ev.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["code"], "server_error");
    assert_eq!(data["message"], "boom");
    assert_eq!(data["error"]["message"], "boom");
    assert_eq!(data["error"]["type"], "server_error");
    assert!(ev.iter().any(|(n, _)| n == "response.output_item.done"));
    assert!(!ev.iter().any(|(n, _)| n == "response.completed"));
    let (status, body) = json_body(&reply.render(&json!({})));
    assert_eq!(status, 500);
    assert_eq!(body["error"]["type"], "server_error");

    let spec = json!({"output": "partial", "failed": {"after_items": 0, "code": "rate_limit_exceeded", "message": "slow"}});
    let reply = ResponsesReply::from_spec(&spec).unwrap();
    let ev = events(&reply.render(&json!({"stream": true})));
    let (name, data) = ev.last().unwrap();
    assert_eq!(name, "response.failed");
    assert_eq!(data["response"]["status"], "failed");
    assert_eq!(
        data["response"]["error"],
        json!({"code": "rate_limit_exceeded", "message": "slow"})
    );
    assert_eq!(data["response"]["output"], json!([]));
    assert_eq!(json_body(&reply.render(&json!({}))).0, 429);
}

#[test]
fn compaction_answers() {
    let trigger =
        json!({"input": [{"role": "user", "content": "hi"}, {"type": "compaction_trigger"}]});
    assert!(asks_compaction(&trigger));
    assert!(!asks_compaction(&json!({"input": "hi"})));
    let (_, body) = json_body(&ResponsesReply::compaction(&trigger).render(&trigger));
    let out = body["output"].as_array().unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["type"], "compaction");
    assert!(out[0]["encrypted_content"].as_str().unwrap().len() > 10);

    let request = json!({"model": "m", "input": [
        {"role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"role": "user", "content": [{"type": "input_text", "text": "second"}]}]});
    let (status, body) = json_body(&compact(&request));
    assert_eq!(status, 200);
    assert_eq!(body["object"], "response.compaction");
    let out = body["output"].as_array().unwrap();
    let kinds: Vec<&str> = out.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["message", "message", "compaction"]);
    assert_eq!(out[0]["content"][0]["text"], "first");
    assert_eq!(out[1]["content"][0]["text"], "second");
    assert!(body["usage"]["input_tokens"].as_u64().unwrap() > 10);
}

#[test]
fn input_tokens_and_errors() {
    let (_, body) = json_body(&input_tokens(&json!({"input": "hi ".repeat(100)})));
    assert_eq!(body["object"], "response.input_tokens");
    assert!(body["input_tokens"].as_u64().unwrap() >= 75);
    let e = ResponsesError::from_spec(
        &json!({"code": "context_length_exceeded", "message": "too long"}),
    )
    .unwrap();
    assert_eq!(e.status, 400);
    assert_eq!(
        e.body(),
        json!({"error": {"message": "too long", "type": "invalid_request_error", "param": null,
                         "code": "context_length_exceeded"}})
    );
    assert_eq!(json_body(&no_websocket()).0, 404);
}

#[test]
fn bad_specs_are_refused() {
    for bad in [
        json!("text"),
        json!({}),
        json!({"output": [{"type": "function_call", "name": "f"}]}),
        json!({"output": [{"text": "no type"}]}),
        json!({"output": "x", "usage": {"input_tokens": "many"}}),
        json!({"output": "x", "error": {"message": "no code"}}),
        json!({"output": "x", "failed": {"code": "x", "status": 200}}),
    ] {
        assert!(ResponsesReply::from_spec(&bad).is_err(), "{bad}");
    }
}
