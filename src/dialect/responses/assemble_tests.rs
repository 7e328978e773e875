//! Assembler tests on event sequences shaped as the Responses API streams them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::fixtures::*;
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

/// A Codex-like answer: reasoning, a commentary message, a shell function call, a freeform patch call.
fn recorded() -> (Vec<SseEvent>, Vec<Value>) {
    let mut u = Upstream::new("resp_1");
    let items = vec![
        u.reasoning(0, "rs_1", &["**Reading** the ", "file"]),
        u.message(1, "msg_1", &["I'll ", "look."]),
        u.function_call(2, "call_1", "shell", &["{\"comm", "and\":[\"ls\"", "]}"]),
        u.custom_call(3, "call_2", "apply_patch", &["*** Begin", " Patch"]),
    ];
    (u.end("completed", items.clone(), 2100, 88), items)
}

#[test]
fn reasoning_text_and_calls_assemble_to_the_done_items() {
    let (events, items) = recorded();
    let r = assemble(&events);
    assert_eq!(r.message, reply_message(items.clone()));
    assert_eq!(output_items(&r.message), items.as_slice());
    assert_eq!(r.message["content"][0]["encrypted_content"], ENC);
    assert_eq!(
        r.message["content"][2]["arguments"],
        "{\"command\":[\"ls\"]}"
    );
    assert_eq!(r.finish_reason.as_deref(), Some("completed"));
    assert_eq!(
        (r.id.as_deref(), r.model.as_deref()),
        (Some("resp_1"), Some("gpt-5-codex"))
    );
    assert_eq!(r.usage, Some(usage(2100, 88)));
    // input_tokens already counts the cached tokens
    assert_eq!(r.prompt_tokens(), Some(2100));
    assert_eq!(r.completion_tokens(), Some(88));
    assert!(r.complete && !r.is_empty());
    assert_eq!(r.chunks, events.len());
    let mut a = Assembler::default();
    events.iter().for_each(|e| a.on_event(e));
    assert_eq!(a.next_sequence_number(), events.len() as u64);
}

#[test]
fn a_cut_stream_keeps_what_the_deltas_said() {
    let (events, _) = recorded();
    // up to the second argument delta of the function call
    let cut = events
        .iter()
        .position(|e| e.data.contains("and\\\":[\\\"ls\\\""))
        .unwrap();
    let r = assemble(&events[..=cut]);
    let items = output_items(&r.message);
    assert_eq!(items.len(), 3);
    assert_eq!(
        items[0]["summary"],
        json!([{"type":"summary_text","text":"**Reading** the file"}])
    );
    assert_eq!(items[1]["content"][0]["text"], "I'll look.");
    assert_eq!(items[2]["arguments"], "{\"command\":[\"ls\"");
    assert!(!r.complete && r.usage.is_none());
    assert_eq!(r.finish_reason.as_deref(), Some("in_progress"));
}

#[test]
fn the_encrypted_content_is_the_done_items() {
    let mut u = Upstream::new("r");
    // `.added` with a partial encrypted_content, `.done` with the whole one
    u.push(json!({"type":"response.output_item.added","output_index":0,
                  "item":{"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":"gAAA"}}));
    let whole = json!({"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":ENC});
    u.push(json!({"type":"response.output_item.done","output_index":0,"item":whole}));
    let r = assemble(&u.end("completed", vec![whole.clone()], 5, 5));
    assert_eq!(output_items(&r.message), [whole]);
}

#[test]
fn errors_end_the_reply_incomplete() {
    let mut u = Upstream::new("r");
    u.message(0, "m", &["par"]);
    u.push(json!({"type":"error","code":"server_error","message":"The server had an error","param":null}));
    let r = assemble(&u.events);
    assert!(!r.complete);
    assert_eq!(
        r.error,
        Some(
            json!({"type":"error","code":"server_error","message":"The server had an error","param":null})
        )
    );
    let mut a = Assembler::default();
    let mut done = false;
    for e in &u.events {
        done = Assemble::on_event(&mut a, e);
    }
    assert!(done, "the error ends the reply");
    // a failed response: its error, not complete
    let mut u = Upstream::new("r");
    let mut f = u.response("failed", json!([]), usage(3, 0));
    f["error"] = json!({"code":"server_error","message":"boom"});
    u.push(json!({"type":"response.failed","response": f}));
    let r = assemble(&u.events);
    assert!(!r.complete);
    assert_eq!(r.finish_reason.as_deref(), Some("failed"));
    assert_eq!(
        r.error,
        Some(json!({"code":"server_error","message":"boom"}))
    );
    // an incomplete response ended properly
    let mut u = Upstream::new("r");
    let m = u.message(0, "m", &["long"]);
    let r = assemble(&u.end("incomplete", vec![m], 3, 9));
    assert!(r.complete);
    assert_eq!(r.finish_reason.as_deref(), Some("incomplete"));
}

#[test]
fn whole_bodies() {
    let (_, items) = recorded();
    let body = json!({"id":"resp_9","object":"response","status":"completed","error":null,
                      "model":"gpt-5","output":items,"usage":usage(10,2)});
    let r = from_body(body.to_string().as_bytes());
    assert!(r.complete);
    assert_eq!(r.message, reply_message(items));
    assert_eq!(
        (r.id.as_deref(), r.finish_reason.as_deref()),
        (Some("resp_9"), Some("completed"))
    );
    assert_eq!(r.usage, Some(usage(10, 2)));
    let err = json!({"error":{"message":"bad","type":"invalid_request_error","param":"input","code":null}});
    let r = from_body(err.to_string().as_bytes());
    assert!(!r.complete && r.message.is_null());
    assert_eq!(r.error, Some(err["error"].clone()));
    assert_eq!(from_body(b"not json"), AssembledReply::default());
    // only our own shape is read as output items
    assert!(output_items(&json!({"role":"assistant","content":[{"type":"text"}]})).is_empty());
}

#[test]
fn an_output_over_the_bound_is_not_assembled() {
    let mut u = Upstream::new("r");
    let big = "x".repeat(MAX_ASSEMBLED_BYTES + 1);
    u.function_call(0, "c", "shell", &[&big]);
    let r = assemble(&u.end("completed", vec![], 1, 1));
    assert!(r.message.is_null() && !r.complete);
    assert_eq!(r.finish_reason.as_deref(), Some("completed"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The wire bytes of a recorded stream, cut into random chunks and parsed, assemble to the same reply.
    #[test]
    fn any_chunking_assembles_the_same(cuts in proptest::collection::vec(0usize..6000, 0..40)) {
        let (events, _) = recorded();
        let wire = encode(&events);
        let whole = assemble(&events);
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
