//! Tests of the chat → Responses conversion: a recorded trace's opening, and the shapes traces lack.
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

/// The Responses pairing rule: every `function_call_output` answers a `function_call` earlier in the input, and
/// every call is answered.
fn check_pairs(input: &[Value]) {
    let mut open: Vec<&str> = Vec::new();
    for item in input {
        match item["type"].as_str().unwrap() {
            "function_call" => open.push(item["call_id"].as_str().unwrap()),
            "function_call_output" => {
                let id = item["call_id"].as_str().unwrap();
                let at = open.iter().position(|c| *c == id);
                assert!(at.is_some(), "output {id} answers no call");
                open.retain(|c| *c != id);
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "unanswered calls: {open:?}");
}

#[test]
fn a_trace_opening_becomes_items() {
    let out = chat_to_responses(&trace_excerpt());
    let keys: Vec<&str> = out.keys().map(String::as_str).collect();
    assert_eq!(keys, ["model", "instructions", "input", "tools", "store"]);
    assert_eq!(out["model"], "gpt-4o");
    assert_eq!(out["store"], false);
    assert_eq!(
        out["instructions"],
        "# Airline Agent Policy\n\nThe current time is 2024-05-15 15:00:00 EST."
    );
    let input = out["input"].as_array().unwrap();
    let types: Vec<(&str, &str)> = input
        .iter()
        .map(|i| {
            (
                i["type"].as_str().unwrap(),
                i["role"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        types,
        [
            ("message", "user"),
            ("message", "assistant"),
            ("message", "user"),
            ("function_call", "-"),
            ("function_call_output", "-"),
            ("function_call", "-"),
            ("function_call_output", "-"),
            ("message", "assistant"),
        ]
    );
    assert_eq!(
        input[0]["content"],
        json!([{"type": "input_text",
            "text": "Hi! I'd like to book the same flights as my current reservation for my friend Ivan."}])
    );
    assert_eq!(input[1]["content"][0]["type"], "output_text");
    assert_eq!(
        input[3],
        json!({"type": "function_call", "call_id": "call_HGn16KZh9oNCruxsMJ4gYXan",
               "name": "get_user_details", "arguments": "{\"user_id\":\"ivan_muller_7015\"}"})
    );
    assert_eq!(
        input[4],
        json!({"type": "function_call_output", "call_id": "call_HGn16KZh9oNCruxsMJ4gYXan",
               "output": "{\"name\": {\"first_name\": \"Ivan\", \"last_name\": \"Muller\"}}"})
    );
    check_pairs(input);
    assert_eq!(
        out["tools"][1],
        json!({"type": "function", "name": "search_direct_flight",
            "description": "(tau-bench airline tool; parameter schema inferred from observed calls, types approximate)",
            "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                "destination": {"type": "string"}, "date": {"type": "string"}}}})
    );
    // deterministic, to the byte
    let again = chat_to_responses(&trace_excerpt());
    assert_eq!(
        serde_json::to_vec(&out).unwrap(),
        serde_json::to_vec(&again).unwrap()
    );
}

#[test]
fn system_messages_open_or_stay_in_place() {
    let body = obj(json!({"model": "o3", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Now answer in German."},
        {"role": "assistant", "content": [{"type": "text", "text": "Hallo"}]}
    ]}));
    let out = chat_to_responses(&body);
    assert_eq!(out["instructions"], "You are terse.\n\nAnswer in French.");
    assert_eq!(
        out["input"],
        json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "Now answer in German."}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hallo"}]}
        ])
    );
    let none = chat_to_responses(&obj(
        json!({"model": "o3", "messages": [{"role": "user", "content": "hi"}]}),
    ));
    assert!(!none.contains_key("instructions"));
}

#[test]
fn text_with_parallel_calls_images_and_odd_arguments() {
    let body = obj(json!({"model": "gpt-4.1", "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}}
        ]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}},
            {"id": "c", "type": "function", "function": {"name": "h"}}
        ]},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "one"},
                                                          {"type": "text", "text": "two"}]},
        {"role": "tool", "tool_call_id": "b", "content": null},
        {"role": "tool", "tool_call_id": "c", "content": "3"},
        {"role": "assistant", "content": null}
    ]}));
    let out = chat_to_responses(&body);
    let input = out["input"].as_array().unwrap();
    assert_eq!(
        input[0]["content"],
        json!([{"type": "input_text", "text": "what is this?"},
               {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low"}])
    );
    assert_eq!(
        input[1],
        json!({"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Let me look."}]})
    );
    assert_eq!(input[2]["arguments"], "{\"x\":1}");
    assert_eq!(input[3]["arguments"], "{\"y\":2}");
    assert_eq!(input[4]["arguments"], "{}");
    assert_eq!(input[5]["output"], "one\ntwo");
    assert_eq!(input[6]["output"], "");
    assert_eq!(input[7]["output"], "3");
    assert_eq!(
        input[8],
        json!({"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": ""}]})
    );
    check_pairs(input);
}

#[test]
fn request_fields_map_or_are_left_out() {
    let body = obj(json!({
        "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"type": "function", "function": {"name": "f", "strict": true}},
            {"type": "custom", "custom": {"name": "raw"}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": false, "max_tokens": 100, "max_completion_tokens": 200,
        "temperature": 0.2, "top_p": 0.9, "reasoning_effort": "high", "stream": true,
        "stop": ["x"], "n": 1, "user": "alice", "store": true
    }));
    let out = chat_to_responses(&body);
    assert_eq!(
        out["tools"],
        json!([{"type": "function", "name": "f",
                "parameters": {"type": "object", "properties": {}}, "strict": true}])
    );
    assert_eq!(out["tool_choice"], json!({"type": "function", "name": "f"}));
    assert_eq!(out["parallel_tool_calls"], false);
    assert_eq!(out["max_output_tokens"], 200);
    assert_eq!(out["temperature"], 0.2);
    assert_eq!(out["top_p"], 0.9);
    assert_eq!(out["reasoning"], json!({"effort": "high"}));
    assert_eq!(out["stream"], true);
    assert_eq!(out["store"], false);
    for gone in ["stop", "n", "user", "messages", "max_tokens"] {
        assert!(!out.contains_key(gone), "{gone}");
    }
    for (chat, responses) in [
        (json!("auto"), Some(json!("auto"))),
        (json!("required"), Some(json!("required"))),
        (json!("none"), Some(json!("none"))),
        (json!("bogus"), None),
        (json!({"type": "function"}), None),
    ] {
        let mut b = body.clone();
        b.insert("tool_choice".into(), chat);
        assert_eq!(chat_to_responses(&b).get("tool_choice").cloned(), responses);
    }
    // no function tools at all: no `tools`
    let mut b = body.clone();
    b.insert(
        "tools".into(),
        json!([{"type": "custom", "custom": {"name": "raw"}}]),
    );
    assert!(!chat_to_responses(&b).contains_key("tools"));
}

#[test]
fn function_tool_shape() {
    assert_eq!(
        function_tool("ctxgate_recall", "Recall.", json!({"type": "object"})),
        json!({"type": "function", "name": "ctxgate_recall", "description": "Recall.",
               "parameters": {"type": "object"}})
    );
}
