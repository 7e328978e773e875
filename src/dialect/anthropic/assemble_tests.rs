//! Assembler tests on event sequences shaped as the Messages API streams them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::fixtures::*;
use super::*;
use proptest::prelude::*;
use serde_json::json;

fn assemble(events: &[SseEvent]) -> AssembledReply {
    let mut a = Assembler::default();
    for e in events {
        a.on_event(e);
    }
    a.finish()
}

/// A recorded-shape answer: thinking, text, a tool call.
fn recorded() -> Vec<SseEvent> {
    [
        message_start("msg_01", 2100),
        ping(),
        thinking_block(
            0,
            &["The user wants ", "the file."],
            "EqQBCkYIARgCIkB+sig==",
        ),
        text_block(1, &["I'll read", " it."]),
        tool_block(
            2,
            "toolu_01",
            "Read",
            &["{\"file_path\":", " \"/tmp/a.txt\"}"],
        ),
        message_end("tool_use", 88),
    ]
    .concat()
}

#[test]
fn thinking_text_and_tool_use() {
    let r = assemble(&recorded());
    assert_eq!(
        r.message,
        json!({"role":"assistant","content":[
            {"type":"thinking","thinking":"The user wants the file.","signature":"EqQBCkYIARgCIkB+sig=="},
            {"type":"text","text":"I'll read it."},
            {"type":"tool_use","id":"toolu_01","name":"Read","input":{"file_path":"/tmp/a.txt"}},
        ]})
    );
    assert_eq!(r.finish_reason.as_deref(), Some("tool_use"));
    assert_eq!(
        (r.id.as_deref(), r.model.as_deref()),
        (Some("msg_01"), Some("claude-sonnet-4-5"))
    );
    assert_eq!(
        r.usage,
        Some(
            json!({"input_tokens":2100,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,
                    "output_tokens":88,"service_tier":"standard"})
        )
    );
    assert_eq!(
        (r.prompt_tokens(), r.completion_tokens()),
        (Some(2200), Some(88))
    );
    assert!(r.complete && r.error.is_none());
}

#[test]
fn tool_input_split_anywhere() {
    let input = r#"{"query": "deploy \"prod\"", "n": [1, 2.5, {"é": null}]}"#;
    let expected: Value = serde_json::from_str(input).unwrap();
    let cuts: Vec<usize> = (0..=input.len())
        .filter(|&i| input.is_char_boundary(i))
        .collect();
    for &i in &cuts {
        for &j in cuts.iter().filter(|&&j| j >= i) {
            let pieces = [&input[..i], &input[i..j], &input[j..]];
            let events = [
                message_start("m", 1),
                tool_block(0, "t", "search_history", &pieces),
                message_end("tool_use", 3),
            ]
            .concat();
            let r = assemble(&events);
            assert_eq!(r.message["content"][0]["input"], expected, "cuts {i} {j}");
        }
    }
}

#[test]
fn a_tool_use_without_input_deltas_has_an_empty_object() {
    let events = [
        message_start("m", 1),
        tool_block(0, "t", "list", &[]),
        message_end("tool_use", 3),
    ]
    .concat();
    assert_eq!(assemble(&events).message["content"][0]["input"], json!({}));
}

#[test]
fn opaque_and_server_blocks_are_carried_with_their_deltas() {
    let result = json!({"type":"web_search_tool_result","tool_use_id":"srvtoolu_1",
        "content":[{"type":"web_search_result","url":"https://e.x","title":"E","encrypted_content":"Eo8=","page_age":null}]});
    let events = [
        message_start("m", 5),
        vec![
            ev(json!({"type":"content_block_start","index":0,
                      "content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va=="}})),
            ev(json!({"type":"content_block_stop","index":0})),
            ev(json!({"type":"content_block_start","index":1,
                      "content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}})),
            ev(json!({"type":"content_block_delta","index":1,
                      "delta":{"type":"input_json_delta","partial_json":"{\"query\":\"e\"}"}})),
            ev(json!({"type":"content_block_stop","index":1})),
            ev(json!({"type":"content_block_start","index":2,"content_block": result})),
            ev(json!({"type":"content_block_stop","index":2})),
            ev(json!({"type":"content_block_start","index":3,
                      "content_block":{"type":"text","text":"","citations":null}})),
            ev(json!({"type":"content_block_delta","index":3,"delta":{"type":"citations_delta",
                      "citation":{"type":"web_search_result_location","url":"https://e.x","cited_text":"E"}}})),
            ev(json!({"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"Per E."}})),
            ev(json!({"type":"content_block_stop","index":3})),
            ev(json!({"type":"content_block_start","index":4,
                      "content_block":{"type":"compaction","content":""}})),
            ev(json!({"type":"content_block_delta","index":4,
                      "delta":{"type":"compaction_delta","content":"Sum","encrypted_content":"Zm9v"}})),
            ev(json!({"type":"content_block_delta","index":4,
                      "delta":{"type":"compaction_delta","content":"mary"}})),
            ev(json!({"type":"content_block_stop","index":4})),
        ],
        message_end("end_turn", 9),
    ]
    .concat();
    let c = assemble(&events).message["content"].clone();
    assert_eq!(
        c[0],
        json!({"type":"redacted_thinking","data":"EmwKAhgBEgy3va=="})
    );
    assert_eq!(
        c[1],
        json!({"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"e"}})
    );
    assert_eq!(c[2], result);
    assert_eq!(
        c[3],
        json!({"type":"text","text":"Per E.","citations":[
            {"type":"web_search_result_location","url":"https://e.x","cited_text":"E"}]})
    );
    assert_eq!(
        c[4],
        json!({"type":"compaction","content":"Summary","encrypted_content":"Zm9v"})
    );
}

/// The reply is whole once `message_delta` brought the stop reason (and the usage) after every block stopped:
/// `message_stop` carries nothing more (a client such as litellm stops reading there). Before it, or with a block
/// still open, it is not.
#[test]
fn the_closing_message_delta_makes_the_reply_whole() {
    let end = message_end("end_turn", 7);
    let mut events = [message_start("m", 5), text_block(0, &["All", " here"])].concat();
    events.push(end[0].clone());
    let mut a = Assembler::default();
    let whole: Vec<bool> = events
        .iter()
        .map(|e| crate::dialect::Assemble::on_event(&mut a, e))
        .collect();
    assert_eq!(
        whole.iter().filter(|w| **w).count(),
        1,
        "one event makes it whole"
    );
    assert!(whole.last().unwrap(), "the message_delta");
    let r = a.finish();
    assert!(r.complete, "{r:?}");
    assert_eq!(r.usage.unwrap()["output_tokens"], 7);
    assert!(
        !crate::dialect::Assemble::on_event(&mut a, &end[1]),
        "message_stop adds nothing"
    );
    assert!(a.finish().complete);

    // a block still open, or no stop reason yet: not whole until message_stop
    let open = [message_start("m", 5), text_block(0, &["Half"])].concat();
    let open = [&open[..open.len() - 1], &end[..1]].concat();
    assert!(!assemble(&open).complete);
    assert!(assemble(&[open.clone(), end[1..].to_vec()].concat()).complete);
    let no_reason = ev(
        json!({"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":3}}),
    );
    let events = [
        message_start("m", 5),
        text_block(0, &["a"]),
        vec![no_reason],
    ]
    .concat();
    assert!(!assemble(&events).complete);
}

#[test]
fn a_mid_stream_error_and_a_cut_stream_are_not_complete() {
    let mut events = [message_start("m", 5), text_block(0, &["Hal", "f"])].concat();
    let cut = assemble(&events);
    assert!(!cut.complete && cut.error.is_none());
    assert_eq!(cut.message["content"][0]["text"], "Half");
    events.push(ev(
        json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
    ));
    let r = assemble(&events);
    assert_eq!(
        r.error,
        Some(json!({"type":"overloaded_error","message":"Overloaded"}))
    );
    assert!(!r.complete);
    events.extend(message_end("end_turn", 2));
    assert!(
        !assemble(&events).complete,
        "an error then message_stop is still cut short"
    );
}

#[test]
fn whole_json_bodies() {
    let body = json!({"id":"msg_9","type":"message","role":"assistant","model":"claude-opus-4-1",
        "content":[{"type":"thinking","thinking":"x","signature":"c2ln"},{"type":"text","text":"hi"}],
        "stop_reason":"end_turn","stop_sequence":null,
        "usage":{"input_tokens":10,"cache_read_input_tokens":5,"cache_creation_input_tokens":1,"output_tokens":2}});
    let r = from_body(body.to_string().as_bytes());
    assert_eq!(
        r.message,
        json!({"role":"assistant","content": body["content"]})
    );
    assert_eq!(r.finish_reason.as_deref(), Some("end_turn"));
    assert_eq!(
        (r.id.as_deref(), r.prompt_tokens()),
        (Some("msg_9"), Some(16))
    );
    assert!(r.complete);
    let err = json!({"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 3 tokens > 2 maximum"}});
    let r = from_body(err.to_string().as_bytes());
    assert_eq!(r.error, Some(err["error"].clone()));
    assert!(!r.complete && r.message.is_null());
    assert!(!from_body(b"not json").complete);
}

#[test]
fn a_message_over_the_bound_is_not_assembled() {
    let piece = "z".repeat(1024 * 1024);
    let mut a = Assembler::default();
    for e in [message_start("m", 1), text_block(0, &["start"])].concat() {
        a.on_event(&e);
    }
    for _ in 0..20 {
        a.on_event(&ev(
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":piece}}),
        ));
        let held: usize = a.blocks.values().map(|b| value_size(&b.finish())).sum();
        assert!(held <= MAX_ASSEMBLED_BYTES, "{held}");
    }
    for e in message_end("end_turn", 5) {
        a.on_event(&e);
    }
    let r = a.finish();
    assert!(r.message.is_null() && !r.complete);
    assert_eq!(r.finish_reason.as_deref(), Some("end_turn"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The wire bytes of a recorded stream, cut into random chunks and parsed, assemble to the same reply.
    #[test]
    fn any_chunking_assembles_the_same(cuts in proptest::collection::vec(0usize..4000, 0..40)) {
        let wire = encode(&recorded());
        let whole = assemble(&recorded());
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
        cuts.sort_unstable();
        let mut parser = crate::sse::SseParser::new();
        let mut a = Assembler::default();
        let mut from = 0;
        for c in cuts.into_iter().chain([wire.len()]) {
            for e in parser.feed(&wire[from..c]) {
                a.on_event(&e);
            }
            from = c;
        }
        if let Some(e) = parser.finish() {
            a.on_event(&e);
        }
        prop_assert_eq!(a.finish(), whole);
    }
}
