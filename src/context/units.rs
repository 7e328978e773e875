//! Whole units of a message list (an assistant tool-call message with its results is one unit), the smallest
//! pieces the hard limit may drop, and the validity check every outgoing request must pass.

use crate::message::{field, is_system, opens_turn, role, tool_calls};
use serde_json::Value;
use std::collections::HashSet;

/// Messages `start..end` that must be kept or dropped together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// First message.
    pub start: usize,
    /// One past the last message.
    pub end: usize,
}

/// Splits `messages` into units: an assistant message with tool calls plus the tool messages right after it (and a
/// user message continuing that turn, `message::CONTINUES`); every other message alone.
pub fn units(messages: &[Value]) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let mut end = i + 1;
        if !tool_calls(&messages[i]).is_empty() {
            while end < messages.len() && role(&messages[end]) == "tool" {
                end += 1;
            }
            // A user message continuing the turn (text sent with the results) goes with them.
            if messages.get(end).is_some_and(continues) {
                end += 1;
            }
        }
        out.push(Unit { start: i, end });
        i = end;
    }
    out
}

fn continues(m: &Value) -> bool {
    role(m) == "user" && !opens_turn(m)
}

/// Checks what OpenAI requires of a message sequence: every message has a role; each assistant message with tool
/// calls is followed directly by exactly one tool message per call (and nothing else in between); every tool
/// message answers a call of the assistant message just before its block.
pub fn check_sequence(messages: &[Value]) -> Result<(), String> {
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        match role(m) {
            "" => return Err(format!("message {i} has no role")),
            "tool" => {
                return Err(format!(
                    "message {i} is a tool result without a preceding tool call"
                ))
            }
            _ => {}
        }
        let calls = tool_calls(m);
        i += 1;
        if calls.is_empty() {
            continue;
        }
        let mut open: HashSet<&str> = calls
            .iter()
            .filter_map(|c| field(c, "id").and_then(Value::as_str))
            .collect();
        if open.len() != calls.len() {
            return Err(format!(
                "message {} has tool calls without unique ids",
                i - 1
            ));
        }
        while i < messages.len() && role(&messages[i]) == "tool" {
            let id = messages[i]
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !open.remove(id) {
                return Err(format!(
                    "message {i} answers unknown or already answered call {id:?}"
                ));
            }
            i += 1;
        }
        if !open.is_empty() {
            let mut missing: Vec<&str> = open.into_iter().collect();
            missing.sort_unstable();
            return Err(format!("tool calls {missing:?} have no result"));
        }
    }
    Ok(())
}

/// Index of the newest user message.
pub fn newest_user(messages: &[Value]) -> Option<usize> {
    messages.iter().rposition(|m| role(m) == "user")
}

/// The system (and developer) messages, in order.
pub fn system_messages(messages: &[Value]) -> Vec<&Value> {
    messages.iter().filter(|m| is_system(m)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(ids: &[&str]) -> Value {
        let cs: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id":id,"type":"function","function":{"name":"f","arguments":"{}"}}))
            .collect();
        json!({"role":"assistant","content":null,"tool_calls":cs})
    }
    fn res(id: &str) -> Value {
        json!({"role":"tool","tool_call_id":id,"content":"x"})
    }

    #[test]
    fn units_group_calls_with_results() {
        let m = vec![
            json!({"role":"system","content":"s"}),
            json!({"role":"user","content":"u"}),
            call(&["a", "b"]),
            res("a"),
            res("b"),
            json!({"role":"assistant","content":"done"}),
        ];
        let u: Vec<(usize, usize)> = units(&m).iter().map(|u| (u.start, u.end)).collect();
        assert_eq!(u, [(0, 1), (1, 2), (2, 5), (5, 6)]);
        let mut cont = m.clone();
        cont.insert(
            5,
            json!({"role":"user","content":"also","ctxgate_continues":true}),
        );
        let u: Vec<(usize, usize)> = units(&cont).iter().map(|u| (u.start, u.end)).collect();
        assert_eq!(
            u,
            [(0, 1), (1, 2), (2, 6), (6, 7)],
            "text sent with results goes with them"
        );
        assert_eq!(check_sequence(&m), Ok(()));
        assert_eq!(newest_user(&m), Some(1));
    }

    #[test]
    fn invalid_sequences_are_named() {
        let user = json!({"role":"user","content":"u"});
        assert!(check_sequence(&[res("a")]).is_err());
        assert!(check_sequence(&[call(&["a", "b"]), res("a")]).is_err());
        assert!(check_sequence(&[call(&["a"]), user.clone(), res("a")]).is_err());
        assert!(check_sequence(&[call(&["a"]), res("a"), res("a")]).is_err());
        assert!(check_sequence(&[call(&["a"]), res("b")]).is_err());
        assert!(check_sequence(&[json!({"content":"no role"})]).is_err());
        assert!(check_sequence(&[user, call(&["a"]), res("a")]).is_ok());
    }
}
