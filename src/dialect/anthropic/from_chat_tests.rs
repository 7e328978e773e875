//! Tests of the chat → Anthropic conversion: a recorded trace's opening, and the shapes traces lack.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

/// The opening of `/work/shared/traces/taubench_airline_gpt4o_task11_trial2.json` (tau-bench, MIT; long texts cut):
/// system prompt, user turns, text and tool-call answers, tool results, and two of its tools.
fn trace_excerpt() -> Map<String, Value> {
    obj(json!({
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "# Airline Agent Policy\n\nThe current time is 2024-05-15 15:00:00 EST."},
            {"role": "user", "content": "Hi! I'd like to book the same flights as my current reservation for my friend Ivan."},
            {"role": "assistant", "content": "To assist you with booking the same flights for your friend Ivan, I'll need your user ID."},
            {"role": "user", "content": "I don't remember the reservation ID at the moment, but my user ID is ivan_muller_7015."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_HGn16KZh9oNCruxsMJ4gYXan",
                "type": "function", "function": {"name": "get_user_details",
                "arguments": "{\"user_id\":\"ivan_muller_7015\"}"}}]},
            {"role": "tool", "tool_call_id": "call_HGn16KZh9oNCruxsMJ4gYXan",
             "content": "{\"name\": {\"first_name\": \"Ivan\", \"last_name\": \"Muller\"}}"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_2RsC2M8hCVti5gri5Jjj0FRm",
                "type": "function", "function": {"name": "get_reservation_details",
                "arguments": "{\"reservation_id\":\"G72NSF\"}"}}]},
            {"role": "tool", "tool_call_id": "call_2RsC2M8hCVti5gri5Jjj0FRm",
             "content": "{\"reservation_id\": \"G72NSF\", \"origin\": \"DTW\", \"destination\": \"SEA\"}"},
            {"role": "assistant", "content": "To book the same flights for your friend Ivan, here are the details."}
        ],
        "tools": [
            {"type": "function", "function": {"name": "get_user_details",
             "description": "(tau-bench airline tool; parameter schema inferred from observed calls, types approximate)",
             "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "search_direct_flight",
             "description": "(tau-bench airline tool; parameter schema inferred from observed calls, types approximate)",
             "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                 "destination": {"type": "string"}, "date": {"type": "string"}}}}}
        ]
    }))
}

/// Anthropic's pairing rule: every `tool_use` is answered by a `tool_result` in the next message (a user
/// message), and every `tool_result` answers a `tool_use` of the message before.
fn check_pairs(messages: &[Value]) {
    let blocks = |m: &Value, ty: &str, key: &str| -> Vec<String> {
        m["content"]
            .as_array()
            .map(|b| {
                b.iter()
                    .filter(|b| b["type"] == ty)
                    .map(|b| b[key].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    for (i, m) in messages.iter().enumerate() {
        let uses = blocks(m, "tool_use", "id");
        let results_next = messages
            .get(i + 1)
            .map(|n| blocks(n, "tool_result", "tool_use_id"))
            .unwrap_or_default();
        assert_eq!(uses, results_next, "messages.{i}");
        if !results_next.is_empty() {
            assert_eq!(messages[i + 1]["role"], "user");
        }
        let results = blocks(m, "tool_result", "tool_use_id");
        let uses_before = i
            .checked_sub(1)
            .map(|p| blocks(&messages[p], "tool_use", "id"))
            .unwrap_or_default();
        assert_eq!(results, uses_before, "messages.{i}");
    }
}

#[test]
fn a_recorded_trace_converts_exactly() {
    let out = chat_to_anthropic(&trace_excerpt());
    let want = json!({
        "model": "gpt-4o",
        "max_tokens": DEFAULT_MAX_TOKENS,
        "system": [{"type": "text", "text": "# Airline Agent Policy\n\nThe current time is 2024-05-15 15:00:00 EST."}],
        "messages": [
            {"role": "user", "content": "Hi! I'd like to book the same flights as my current reservation for my friend Ivan."},
            {"role": "assistant", "content": [{"type": "text",
                "text": "To assist you with booking the same flights for your friend Ivan, I'll need your user ID."}]},
            {"role": "user", "content": "I don't remember the reservation ID at the moment, but my user ID is ivan_muller_7015."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_HGn16KZh9oNCruxsMJ4gYXan",
                "name": "get_user_details", "input": {"user_id": "ivan_muller_7015"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_HGn16KZh9oNCruxsMJ4gYXan",
                "content": "{\"name\": {\"first_name\": \"Ivan\", \"last_name\": \"Muller\"}}"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_2RsC2M8hCVti5gri5Jjj0FRm",
                "name": "get_reservation_details", "input": {"reservation_id": "G72NSF"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_2RsC2M8hCVti5gri5Jjj0FRm",
                "content": "{\"reservation_id\": \"G72NSF\", \"origin\": \"DTW\", \"destination\": \"SEA\"}"}]},
            {"role": "assistant", "content": [{"type": "text",
                "text": "To book the same flights for your friend Ivan, here are the details."}]}
        ],
        "tools": [
            {"name": "get_user_details",
             "description": "(tau-bench airline tool; parameter schema inferred from observed calls, types approximate)",
             "input_schema": {"type": "object", "properties": {"user_id": {"type": "string"}}}},
            {"name": "search_direct_flight",
             "description": "(tau-bench airline tool; parameter schema inferred from observed calls, types approximate)",
             "input_schema": {"type": "object", "properties": {"origin": {"type": "string"},
                 "destination": {"type": "string"}, "date": {"type": "string"}}}}
        ]
    });
    // the same bytes: values and field order
    assert_eq!(
        serde_json::to_string(&out).unwrap(),
        serde_json::to_string(&want).unwrap()
    );
    check_pairs(out["messages"].as_array().unwrap());
}

#[test]
fn the_replay_prefixes_of_a_trace_convert_deterministically() {
    // Replay sends messages[..k] for every assistant message k: each prefix converts to a prefix of the whole.
    let body = trace_excerpt();
    let all = body["messages"].as_array().unwrap().clone();
    let whole = chat_to_anthropic(&body)["messages"].clone();
    for k in (0..all.len()).filter(|&k| all[k]["role"] == "assistant") {
        let mut prefix = body.clone();
        prefix.insert("messages".into(), Value::Array(all[..k].to_vec()));
        let a = chat_to_anthropic(&prefix);
        let b = chat_to_anthropic(&prefix);
        assert_eq!(
            serde_json::to_vec(&a).unwrap(),
            serde_json::to_vec(&b).unwrap()
        );
        let msgs = a["messages"].as_array().unwrap();
        assert_eq!(msgs[..], whole.as_array().unwrap()[..msgs.len()], "k={k}");
        assert_eq!(msgs.last().unwrap()["role"], "user", "k={k}");
        check_pairs(msgs);
    }
}

#[test]
fn parallel_calls_system_messages_images_and_options() {
    let body = obj(json!({
        "model": "claude-sonnet-4-5",
        "max_completion_tokens": 1000,
        "temperature": 0.2,
        "stop": "END",
        "stream": true,
        "user": "u-42",
        "tool_choice": "required",
        "parallel_tool_calls": true,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": [{"type": "text", "text": "tools first"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "what is in these?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
            ]},
            {"role": "assistant", "content": "Looking.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "not json"}},
                {"id": "c3", "type": "function", "function": {"name": "list", "arguments": ""}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "A"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "B"}]},
            {"role": "tool", "tool_call_id": "c3", "content": null},
            {"role": "system", "content": "the user changed the task"},
            {"role": "user", "content": "continue"}
        ],
        "tools": [
            {"type": "function", "function": {"name": "read", "parameters": {"type": "object",
                "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
            {"type": "function", "function": {"name": "list"}},
            {"type": "custom", "custom": {"name": "grammar"}}
        ]
    }));
    let out = chat_to_anthropic(&body);
    let keys: Vec<&str> = out.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "model",
            "max_tokens",
            "system",
            "messages",
            "tools",
            "tool_choice",
            "temperature",
            "stop_sequences",
            "stream",
            "metadata"
        ]
    );
    assert_eq!(out["model"], "claude-sonnet-4-5");
    assert_eq!(out["max_tokens"], 1000);
    assert_eq!(
        out["system"],
        json!([{"type": "text", "text": "be brief"}, {"type": "text", "text": "tools first"}])
    );
    assert_eq!(out["tool_choice"], json!({"type": "any"}));
    assert_eq!(out["stop_sequences"], json!(["END"]));
    assert_eq!(out["metadata"], json!({"user_id": "u-42"}));
    let msgs = out["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 5);
    assert_eq!(
        msgs[0]["content"],
        json!([
            {"type": "text", "text": "what is in these?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}}
        ])
    );
    assert_eq!(
        msgs[1]["content"],
        json!([
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "a"}},
            {"type": "tool_use", "id": "c2", "name": "read", "input": {"arguments": "not json"}},
            {"type": "tool_use", "id": "c3", "name": "list", "input": {}}
        ])
    );
    // three parallel results in one user message, in order
    assert_eq!(
        msgs[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "A"},
            {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": "B"}]},
            {"type": "tool_result", "tool_use_id": "c3", "content": ""}
        ]})
    );
    assert_eq!(
        msgs[3],
        json!({"role": "system", "content": "the user changed the task"})
    );
    assert_eq!(msgs[4], json!({"role": "user", "content": "continue"}));
    check_pairs(msgs);
    assert_eq!(
        out["tools"],
        json!([
            {"name": "read", "input_schema": {"type": "object",
                "properties": {"path": {"type": "string"}}, "required": ["path"]}},
            {"name": "list", "input_schema": {"type": "object", "properties": {}}}
        ])
    );
}

#[test]
fn defaults_and_tool_choice_forms() {
    let minimal = chat_to_anthropic(&obj(json!({"model": "m", "messages": []})));
    assert_eq!(
        Value::Object(minimal),
        json!({"model": "m", "max_tokens": DEFAULT_MAX_TOKENS, "messages": []})
    );
    let with = |choice: Value| {
        chat_to_anthropic(&obj(
            json!({"model": "m", "messages": [], "tool_choice": choice}),
        ))
        .get("tool_choice")
        .cloned()
    };
    assert_eq!(with(json!("auto")), Some(json!({"type": "auto"})));
    assert_eq!(with(json!("none")), Some(json!({"type": "none"})));
    assert_eq!(
        with(json!({"type": "function", "function": {"name": "read"}})),
        Some(json!({"type": "tool", "name": "read"}))
    );
    assert_eq!(with(json!("sometimes")), None);
    // max_tokens wins over max_completion_tokens; a non-integer falls back to the default
    let both =
        obj(json!({"model": "m", "messages": [], "max_tokens": 7, "max_completion_tokens": 9}));
    assert_eq!(chat_to_anthropic(&both)["max_tokens"], 7);
    let bad = obj(json!({"model": "m", "messages": [], "max_tokens": "lots"}));
    assert_eq!(chat_to_anthropic(&bad)["max_tokens"], DEFAULT_MAX_TOKENS);
    // an assistant message with nothing in it, and trailing tool results
    let odd = obj(json!({"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "x", "arguments": "[1,2]"}}]},
        {"role": "tool", "tool_call_id": "t", "content": "done"}
    ]}));
    let msgs = chat_to_anthropic(&odd)["messages"].clone();
    assert_eq!(msgs[1], json!({"role": "assistant", "content": ""}));
    assert_eq!(
        msgs[2]["content"],
        json!([{"type": "tool_use", "id": "t", "name": "x", "input": {"arguments": "[1,2]"}}])
    );
    assert_eq!(msgs[3]["content"][0]["type"], "tool_result");
    assert_eq!(msgs.as_array().unwrap().len(), 4);
}
