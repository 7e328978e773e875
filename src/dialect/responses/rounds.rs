//! The Responses API in recall rounds: ctxgate's calls are `function_call` items answered by
//! `function_call_output` items appended to the next request's `input`; the client's stream is spliced by
//! [`splice::StreamSplicer`] and kept alive with SSE comments.

use super::assemble::{output_items, reply_message};
use super::splice;
use crate::dialect::shared::splice::answers;
use crate::dialect::InjectedNames;
use serde_json::Value;

/// The assistant message of a whole JSON answer (a `response` object): its output items.
pub fn answer_message(answer: &Value) -> Option<Value> {
    (answer.get("object").and_then(Value::as_str) == Some("response"))
        .then(|| answer.get("output").and_then(Value::as_array))
        .flatten()
        .map(|o| reply_message(o.clone()))
}

/// ctxgate's `function_call` items of `message`, as neutral calls.
pub fn injected_calls(message: &Value, names: &InjectedNames) -> Vec<Value> {
    splice::injected_calls(output_items(message), names)
}

/// The items a round appends to the next request's `input` (see [`splice::round_items`]); `results` are aligned
/// with `calls` (neutral, their `id` the `call_id`).
pub fn round_messages(
    assistant: &Value,
    names: &InjectedNames,
    calls: &[Value],
    results: &[String],
) -> Vec<Value> {
    splice::round_items(output_items(assistant), names, &answers(calls, results))
}

/// Adds a round's usage.
pub fn add_usage(acc: &mut Option<Value>, usage: &Value) {
    splice::add_usage(acc, usage);
}

/// The client's answer: ctxgate's calls (and the reasoning that led only to them) removed, usage summed, the
/// first round's id.
pub use splice::finalize_body as finalize;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::RecallConfig;
    use crate::dialect::rounds::Splice;
    use crate::dialect::shared::Spliced;
    use serde_json::json;

    #[test]
    fn a_json_answer_gives_its_output_and_our_calls_become_input_items() {
        let n = InjectedNames::from_config(&RecallConfig::default());
        let rs = json!({"id":"rs_1","type":"reasoning","encrypted_content":"gAAA==","summary":[]});
        let ours = json!({"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"query\":\"q\"}",
                          "call_id":"call_1","name":n.search});
        let answer =
            json!({"id":"resp_1","object":"response","status":"completed","output":[rs, ours]});
        let m = answer_message(&answer).unwrap();
        assert_eq!(output_items(&m), [rs.clone(), ours.clone()]);
        assert!(answer_message(&json!({"error":{"message":"x"}})).is_none());
        let calls = injected_calls(&m, &n);
        assert_eq!(calls[0]["id"], "call_1");
        assert_eq!(
            round_messages(&m, &n, &calls, &["found".into()]),
            vec![
                rs,
                ours,
                json!({"type":"function_call_output","call_id":"call_1","output":"found"})
            ]
        );
    }

    #[test]
    fn the_splicer_keeps_the_stream_alive_with_a_comment_and_ends_it_with_its_terminal_event() {
        let s = Spliced(splice::StreamSplicer::new(InjectedNames::from_config(
            &RecallConfig::default(),
        )));
        assert_eq!(s.keepalive().as_deref(), Some(&b": keep-alive\n\n"[..]));
        assert_eq!(s.done(), None);
    }
}
