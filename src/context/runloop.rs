//! Run loops, a pure view of a message list: one user message → the tool calls it caused → the final reply (the
//! first assistant message without tool calls). The context engine prunes by run loop; recall finds tool results
//! by call id through the index kept here.
//!
//! In a request that offers tools (an agent's), a scaffold that answers a malformed reply (an assistant message
//! without tool calls in the middle of a run) with a short user message ("No tool calls found…") does not start a
//! new loop: such a *nudge* continues the run it interrupts, so the run keeps its task statement.

use crate::message::{field, is_system, message_text, opens_turn, role, tool_calls};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;

/// One tool call made inside a run loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallRef<'a> {
    /// The call id.
    pub id: &'a str,
    /// The function's name.
    pub name: &'a str,
    /// The arguments as the model wrote them (JSON text).
    pub arguments: &'a str,
    /// Index of the assistant message that made the call.
    pub position: usize,
    /// Unix seconds when that message was first seen, when known.
    pub timestamp: Option<i64>,
    /// Index of the tool message carrying its result, when there is one.
    pub result: Option<usize>,
}

/// One run loop: the messages `start..end` of the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunLoop<'a> {
    /// Index of its first message.
    pub start: usize,
    /// One past its last message.
    pub end: usize,
    /// Index of the user message that opened it (`None` for a history that starts with an assistant message).
    pub user: Option<usize>,
    /// The tool calls made in it, in order.
    pub tool_calls: Vec<ToolCallRef<'a>>,
    /// Index of the final reply: the first assistant message without tool calls after the last nudge.
    pub final_reply: Option<usize>,
    /// The replies without tool calls that a nudge answered, and the nudges (kept, like the final reply, when the
    /// loop is pruned).
    pub nudged: Vec<usize>,
}

impl RunLoop<'_> {
    /// True when the loop ended with a final reply.
    pub fn is_complete(&self) -> bool {
        self.final_reply.is_some()
    }
}

/// The run loops of a message list, and its tool results indexed by call id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunLoops<'a> {
    /// The loops, oldest first. Leading system messages belong to none.
    pub loops: Vec<RunLoop<'a>>,
    results: HashMap<&'a str, usize>,
}

impl<'a> RunLoops<'a> {
    /// Index of the tool message answering `call_id` (O(1)).
    pub fn result_of(&self, call_id: &str) -> Option<usize> {
        self.results.get(call_id).copied()
    }

    /// The loop holding message `index`.
    pub fn loop_of(&self, index: usize) -> Option<&RunLoop<'a>> {
        let i = self.loops.partition_point(|l| l.end <= index);
        self.loops.get(i).filter(|l| l.start <= index)
    }
}

/// Longest text, in characters, of a user message that can be a nudge.
pub const NUDGE_MAX_CHARS: usize = 400;

/// Whether `m` (a user message opening a turn) only nudges the run on: the message right before is a reply
/// without tool calls, and `m` is short plain text. (Whether the run made tool calls is not asked: a pruned run
/// loses them, and rewriting a rewrite must find the same loops.)
fn is_nudge(m: &Value, prev: Option<&Value>) -> bool {
    let after_plain_reply =
        prev.is_some_and(|p| role(p) == "assistant" && tool_calls(p).is_empty());
    let plain_text = match field(m, "content") {
        Some(Value::String(_)) => true,
        Some(Value::Array(parts)) => parts
            .iter()
            .all(|p| field(p, "type").and_then(Value::as_str) == Some("text")),
        _ => false,
    };
    after_plain_reply && plain_text && message_text(m).chars().count() <= NUDGE_MAX_CHARS
}

/// Splits `messages` into run loops. `timestamps`, when given, is aligned with `messages` (first-seen times).
pub fn run_loops<'a>(messages: &'a [Value], timestamps: Option<&[i64]>) -> RunLoops<'a> {
    run_loops_with(messages, timestamps, false)
}

/// [`run_loops`] of an agent's request (one that offers tools) when `nudges`: nudges then continue their run.
pub fn run_loops_with<'a>(
    messages: &'a [Value],
    timestamps: Option<&[i64]>,
    nudges: bool,
) -> RunLoops<'a> {
    let mut out = RunLoops::default();
    let mut current: Option<RunLoop<'a>> = None;
    for (i, m) in messages.iter().enumerate() {
        let r = role(m);
        let prev = i.checked_sub(1).map(|p| &messages[p]);
        if let Some(lp) = current
            .as_mut()
            .filter(|_| nudges && opens_turn(m) && is_nudge(m, prev))
        {
            // The reply it answers stops being the final one; the run goes on.
            let answered = i - 1;
            if let Some(f) = lp.final_reply.take().filter(|&f| f != answered) {
                lp.nudged.push(f);
            }
            lp.nudged.extend([answered, i]);
            lp.end = i + 1;
            continue;
        }
        if opens_turn(m) || (current.is_none() && !is_system(m)) {
            if let Some(done) = current.take() {
                out.loops.push(done);
            }
            current = Some(RunLoop {
                start: i,
                end: i + 1,
                user: opens_turn(m).then_some(i),
                tool_calls: Vec::new(),
                final_reply: None,
                nudged: Vec::new(),
            });
        }
        if r == "tool" {
            if let Some(id) = field(m, "tool_call_id").and_then(Value::as_str) {
                out.results.insert(id, i);
            }
        }
        let Some(lp) = current.as_mut() else {
            continue; // leading system messages
        };
        lp.end = i + 1;
        if r != "assistant" || lp.final_reply.is_some() {
            continue;
        }
        let calls = tool_calls(m);
        if calls.is_empty() {
            lp.final_reply = Some(i);
        }
        for c in calls {
            let function = field(c, "function");
            let s = |v: Option<&'a Value>, k: &str| {
                v.and_then(|v| field(v, k))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            };
            lp.tool_calls.push(ToolCallRef {
                id: s(Some(c), "id"),
                name: s(function, "name"),
                arguments: s(function, "arguments"),
                position: i,
                timestamp: timestamps.and_then(|t| t.get(i).copied()),
                result: None,
            });
        }
    }
    out.loops.extend(current);
    for lp in &mut out.loops {
        for c in &mut lp.tool_calls {
            c.result = out.results.get(c.id).copied();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(t: &str) -> Value {
        json!({"role":"user","content":t})
    }
    fn reply(t: &str) -> Value {
        json!({"role":"assistant","content":t})
    }
    fn calls(ids: &[&str]) -> Value {
        let cs: Vec<Value> = ids
            .iter()
            .map(
                |id| json!({"id":id,"type":"function","function":{"name":"read","arguments":"{}"}}),
            )
            .collect();
        json!({"role":"assistant","content":null,"tool_calls":cs})
    }
    fn result(id: &str) -> Value {
        json!({"role":"tool","tool_call_id":id,"content":"r"})
    }

    #[test]
    fn loops_with_parallel_calls_and_result_index() {
        let m = vec![
            json!({"role":"system","content":"s"}),
            user("a"),
            calls(&["c1", "c2"]),
            result("c1"),
            result("c2"),
            reply("done a"),
            user(&format!("b {}", "more detail ".repeat(40))),
            calls(&["c3"]),
            result("c3"),
        ];
        let ts: Vec<i64> = (0..m.len() as i64).map(|i| 100 + i).collect();
        let rl = run_loops(&m, Some(&ts));
        assert_eq!(rl.loops.len(), 2);
        let a = &rl.loops[0];
        assert_eq!(
            (a.start, a.end, a.user, a.final_reply),
            (1, 6, Some(1), Some(5))
        );
        assert_eq!(a.tool_calls.len(), 2);
        assert_eq!(a.tool_calls[1].id, "c2");
        assert_eq!(a.tool_calls[1].result, Some(4));
        assert_eq!(a.tool_calls[1].timestamp, Some(102));
        let b = &rl.loops[1];
        assert!(!b.is_complete(), "a loop that never finished");
        assert_eq!((b.start, b.end), (6, 9));
        assert_eq!(rl.result_of("c3"), Some(8));
        assert_eq!(rl.result_of("nope"), None);
        assert_eq!(rl.loop_of(3).map(|l| l.start), Some(1));
        assert_eq!(rl.loop_of(0), None, "leading system message");
    }

    #[test]
    fn consecutive_users_and_assistant_first() {
        let m = vec![
            reply("hello, I am the bot"),
            user(&"x".repeat(NUDGE_MAX_CHARS + 1)),
            user("y"),
            reply("z"),
        ];
        let rl = run_loops(&m, None);
        let shape: Vec<(usize, usize, Option<usize>, Option<usize>)> = rl
            .loops
            .iter()
            .map(|l| (l.start, l.end, l.user, l.final_reply))
            .collect();
        assert_eq!(
            shape,
            [
                (0, 1, None, Some(0)),
                (1, 2, Some(1), None),
                (2, 4, Some(2), Some(3))
            ]
        );
    }

    #[test]
    fn a_nudge_after_a_malformed_reply_continues_the_run() {
        let next_task = format!(
            "Now the changelog. {}",
            "Describe the fix in detail. ".repeat(20)
        );
        let m = vec![
            json!({"role":"system","content":"s"}),
            user("fix the bug in parser.rs"),
            calls(&["c1"]),
            result("c1"),
            reply("I think I should look at the file"),
            user("No tool calls found in your response. Use a tool."),
            calls(&["c2"]),
            result("c2"),
            reply("done"),
            user(&next_task),
            calls(&["c3"]),
            result("c3"),
        ];
        assert_eq!(
            run_loops(&m, None).loops.len(),
            3,
            "a chat without tools: no nudges"
        );
        let rl = run_loops_with(&m, None, true);
        type Shape = (usize, usize, Option<usize>, Option<usize>, Vec<usize>);
        let shape: Vec<Shape> = rl
            .loops
            .iter()
            .map(|l| (l.start, l.end, l.user, l.final_reply, l.nudged.clone()))
            .collect();
        assert_eq!(
            shape,
            [
                (1, 9, Some(1), Some(8), vec![4, 5]),
                (9, 12, Some(9), None, vec![])
            ],
            "the nudge at 5 continues the first run; a long message opens the next"
        );
        assert_eq!(
            rl.loops[0].tool_calls.len(),
            2,
            "calls after the nudge belong to the run"
        );
        // Two plain replies before a nudge: both are kept with it.
        let m = vec![
            user("task"),
            calls(&["c1"]),
            result("c1"),
            reply("thinking"),
            reply("still thinking"),
            user("Use a tool."),
        ];
        assert_eq!(
            run_loops_with(&m, None, true).loops[0].nudged,
            vec![3, 4, 5]
        );
    }

    #[test]
    fn long_or_tool_free_turns_are_not_nudges() {
        let long = "x".repeat(NUDGE_MAX_CHARS + 1);
        let m = vec![
            user("task"),
            calls(&["c1"]),
            result("c1"),
            reply("answer"),
            user(&long),
        ];
        assert_eq!(
            run_loops(&m, None).loops.len(),
            2,
            "a long message is a new turn"
        );
        let image = json!({"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]});
        let m = vec![
            user("task"),
            calls(&["c1"]),
            result("c1"),
            reply("a"),
            image,
        ];
        assert_eq!(
            run_loops_with(&m, None, true).loops.len(),
            2,
            "not plain text"
        );
    }

    #[test]
    fn only_the_first_plain_reply_ends_a_loop_and_mid_system_stays_inside() {
        let m = vec![
            user("a"),
            reply("first"),
            json!({"role":"system","content":"note"}),
            reply("second"),
        ];
        let rl = run_loops(&m, None);
        assert_eq!(rl.loops.len(), 1);
        assert_eq!(rl.loops[0].final_reply, Some(1));
        assert_eq!(rl.loops[0].end, 4);
        assert!(run_loops(&[], None).loops.is_empty());
    }
}
