//! Which Responses requests ctxgate passes through unmanaged: those whose history lives on the upstream
//! (`previous_response_id`, `conversation`), which ctxgate cannot see, and Codex's remote compaction
//! (`compaction_trigger`), which expects exactly one `compaction` item back and must not be rewritten.

use crate::metrics::UnmanagedReason;
use serde_json::{Map, Value};

/// Why the Responses request `body` is passed through unmanaged; `None` when ctxgate may manage it (its `input`
/// carries the whole history). Checked in this order: `previous_response_id`, `conversation` (each when present
/// and not `null` or empty), then a `compaction_trigger` item anywhere in `input`.
pub fn unmanaged_reason(body: &Map<String, Value>) -> Option<UnmanagedReason> {
    let set = |key: &str| match body.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    };
    if set("previous_response_id") {
        return Some(UnmanagedReason::PreviousResponseId);
    }
    if set("conversation") {
        return Some(UnmanagedReason::Conversation);
    }
    let trigger = body
        .get("input")
        .and_then(Value::as_array)
        .is_some_and(|items| {
            items
                .iter()
                .any(|i| i.get("type").and_then(Value::as_str) == Some("compaction_trigger"))
        });
    trigger.then_some(UnmanagedReason::CompactionTrigger)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reason(v: Value) -> Option<UnmanagedReason> {
        unmanaged_reason(v.as_object().unwrap())
    }

    #[test]
    fn server_side_state_and_remote_compaction_are_unmanaged() {
        let history = json!([{"type": "message", "role": "user", "content": "hi"}]);
        assert_eq!(
            reason(json!({"model": "gpt-5", "input": history, "store": false})),
            None
        );
        assert_eq!(reason(json!({"model": "gpt-5", "input": "hi"})), None);
        assert_eq!(
            reason(json!({"input": history, "previous_response_id": "resp_1"})),
            Some(UnmanagedReason::PreviousResponseId)
        );
        assert_eq!(
            reason(
                json!({"input": history, "previous_response_id": null, "conversation": "conv_1"})
            ),
            Some(UnmanagedReason::Conversation)
        );
        assert_eq!(
            reason(json!({"input": history, "conversation": {"id": "conv_1"}})),
            Some(UnmanagedReason::Conversation)
        );
        assert_eq!(
            reason(json!({"input": history, "previous_response_id": "", "conversation": null})),
            None
        );
        let compact = json!([{"type": "message", "role": "user", "content": "hi"},
                             {"type": "compaction_trigger"}]);
        assert_eq!(
            reason(json!({"input": compact})),
            Some(UnmanagedReason::CompactionTrigger)
        );
        // server-side state is named first
        assert_eq!(
            reason(json!({"input": compact, "previous_response_id": "resp_1"})),
            Some(UnmanagedReason::PreviousResponseId)
        );
    }
}
