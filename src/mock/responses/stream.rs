//! The Responses event stream of one reply: each event numbered, and the events of each kind of output item.

use super::super::anthropic::pieces;
use super::super::MockReply;
use bytes::Bytes;
use serde_json::{json, Value};
use std::time::Duration;

/// A stream being built: each event gets the next `sequence_number`.
#[derive(Default)]
pub(super) struct Events(Vec<(String, Value)>);

impl Events {
    pub(super) fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.0.len());
        self.0.push((kind.to_string(), data));
    }

    pub(super) fn reply(self, delay: Duration) -> MockReply {
        MockReply::Sse {
            chunks: self
                .0
                .into_iter()
                .map(|(name, data)| {
                    (
                        delay,
                        Bytes::from(format!("event: {name}\ndata: {data}\n\n")),
                    )
                })
                .collect(),
            stall_after: false,
        }
    }
}

/// The events of one output item, from `output_item.added` to `output_item.done`.
pub(super) fn item_events(index: usize, item: &Value, ev: &mut Events) {
    let id = item["id"].clone();
    let at = |mut data: Value| {
        data["output_index"] = json!(index);
        data["item_id"] = id.clone();
        data
    };
    let mut added = item.clone();
    match item["type"].as_str() {
        Some("message") => {
            added["content"] = json!([]);
            added["status"] = json!("in_progress");
            ev.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let parts = item["content"].as_array().cloned().unwrap_or_default();
            for (ci, part) in parts.iter().enumerate() {
                let with = |d: Value| {
                    let mut d = at(d);
                    d["content_index"] = json!(ci);
                    d
                };
                let mut empty = part.clone();
                empty["text"] = json!("");
                ev.push("response.content_part.added", with(json!({"part": empty})));
                if part["type"] == "output_text" {
                    let text = part["text"].as_str().unwrap_or_default();
                    for piece in pieces(text, 3) {
                        ev.push(
                            "response.output_text.delta",
                            with(json!({"delta": piece, "logprobs": []})),
                        );
                    }
                    ev.push(
                        "response.output_text.done",
                        with(json!({"text": text, "logprobs": []})),
                    );
                }
                ev.push("response.content_part.done", with(json!({"part": part})));
            }
        }
        Some("function_call") => {
            added["arguments"] = json!("");
            added["status"] = json!("in_progress");
            ev.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let args = item["arguments"].as_str().unwrap_or_default();
            for piece in pieces(args, 3) {
                ev.push(
                    "response.function_call_arguments.delta",
                    at(json!({"delta": piece})),
                );
            }
            ev.push(
                "response.function_call_arguments.done",
                at(json!({"arguments": args})),
            );
        }
        Some("custom_tool_call") => {
            added["input"] = json!("");
            added["status"] = json!("in_progress");
            ev.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let input = item["input"].as_str().unwrap_or_default();
            for piece in pieces(input, 3) {
                ev.push(
                    "response.custom_tool_call_input.delta",
                    at(json!({"delta": piece})),
                );
            }
            ev.push(
                "response.custom_tool_call_input.done",
                at(json!({"input": input})),
            );
        }
        Some("reasoning") => {
            added["summary"] = json!([]);
            if let Some(o) = added.as_object_mut() {
                o.remove("encrypted_content"); // the full copy comes with output_item.done
            }
            ev.push(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let parts = item["summary"].as_array().cloned().unwrap_or_default();
            for (si, part) in parts.iter().enumerate() {
                let with = |d: Value| {
                    let mut d = at(d);
                    d["summary_index"] = json!(si);
                    d
                };
                let text = part["text"].as_str().unwrap_or_default();
                ev.push(
                    "response.reasoning_summary_part.added",
                    with(json!({"part": {"type": "summary_text", "text": ""}})),
                );
                for piece in pieces(text, 2) {
                    ev.push(
                        "response.reasoning_summary_text.delta",
                        with(json!({"delta": piece})),
                    );
                }
                ev.push(
                    "response.reasoning_summary_text.done",
                    with(json!({"text": text})),
                );
                ev.push(
                    "response.reasoning_summary_part.done",
                    with(json!({"part": part})),
                );
            }
        }
        _ => ev.push(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ),
    }
    ev.push(
        "response.output_item.done",
        json!({"output_index": index, "item": item}),
    );
}
