//! Folding the oldest steps of a run loop: which steps (a tool call with its results, as one unit) may be left out
//! so that tool pairing and role order stay valid whatever set of them is left out, and the compact line each
//! folded call leaves in ctxgate's own text (on the first tool result sent after the folded steps).

use super::runloop::RunLoop;
use super::shape::digest;
use super::units::Unit;
use crate::config::PruneConfig;
use crate::message::{field, role, tool_calls};
use serde_json::{json, Value};

/// How the block of fold lines begins (it marks ctxgate's text on the carrying tool result).
pub const FOLD_PREFIX: &str = "[ctxgate] Earlier steps of this run were folded to save space";

/// Characters of a folded call's arguments kept in its line.
const GIST_CHARS: usize = 60;

/// Which `units` may be folded: a tool unit (an assistant message with tool calls, its results right after it,
/// and a user message continuing them) that sits inside a run loop between its opening user message and its final
/// reply (the calls the loop records), comes
/// after a user, tool or system message and is followed by an assistant message, and calls no excluded tool.
/// Leaving out any set of such units keeps every call with its results and never brings two user or two assistant
/// messages together: what precedes a run of left-out units is a user, tool or system message, and what follows
/// it an assistant message.
pub fn foldable_units(
    msgs: &[Value],
    units: &[Unit],
    loops: &[RunLoop<'_>],
    prune: &PruneConfig,
) -> Vec<bool> {
    let excluded = |m: &Value| {
        tool_calls(m).iter().any(|c| {
            let name = field(c, "function")
                .and_then(|f| field(f, "name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            prune.exclude_tools.iter().any(|t| t == name)
        })
    };
    let after_user = |start: usize| {
        let l = loops.partition_point(|l| l.end <= start);
        loops.get(l).filter(|l| l.start <= start).is_some_and(|l| {
            l.user.is_some_and(|u| u < start) && l.final_reply.is_none_or(|f| start < f)
        })
    };
    units
        .iter()
        .map(|u| {
            let first = &msgs[u.start];
            !tool_calls(first).is_empty()
                && u.start > 0
                && matches!(
                    role(&msgs[u.start - 1]),
                    "user" | "tool" | "system" | "developer"
                )
                && msgs.get(u.start + 1).is_some_and(|m| role(m) == "tool")
                && msgs.get(u.end).is_some_and(|m| role(m) == "assistant")
                && after_user(u.start)
                && !excluded(first)
        })
        .collect()
}

/// The line a folded call leaves: its id, its tool and a one-line gist of its arguments.
pub fn fold_line(id: &str, tool: &str, arguments: &str) -> String {
    format!("- {id} {tool} {}", digest(arguments, GIST_CHARS))
}

/// [`fold_line`], followed by what its result named (`words`: its distinctive strings, see
/// [`super::digest`]), when any. Still one line starting with `- ` (the words hold no whitespace).
pub fn fold_line_naming(id: &str, tool: &str, arguments: &str, words: &[&str]) -> String {
    let mut line = fold_line(id, tool, arguments);
    if !words.is_empty() {
        line.push_str(" → ");
        line.push_str(&words.join(", "));
    }
    line
}

/// The block listing folded calls (`lines`, oldest first), and how to get one back.
pub fn fold_block(lines: &[String], recall_tool: Option<&str>) -> String {
    let how = match recall_tool {
        Some(t) => format!("`{t}` returns any of them whole by call_id"),
        None => "ctxgate keeps them in the conversation's full history".to_string(),
    };
    format!(
        "{FOLD_PREFIX} (call id, tool, arguments); {how}:\n{}",
        lines.join("\n")
    )
}

/// The tool message `m` with `block` appended to its text (string content, a text part added to parts, or the
/// block alone when it had none); every other field kept in place.
pub fn with_block(m: &Value, block: &str) -> Value {
    let mut out = m.clone();
    let content = match field(m, "content") {
        Some(Value::String(s)) if !s.is_empty() => Value::String(format!("{s}\n\n{block}")),
        Some(Value::Array(parts)) if !parts.is_empty() => {
            let mut p = parts.clone();
            p.push(json!({"type": "text", "text": block}));
            Value::Array(p)
        }
        _ => Value::String(block.to_string()),
    };
    if let Some(o) = out.as_object_mut() {
        o.insert("content".into(), content);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::runloop::run_loops;
    use crate::context::units::units;

    fn call(id: &str, name: &str) -> Value {
        json!({"role":"assistant","content":null,"tool_calls":[
            {"id":id,"type":"function","function":{"name":name,"arguments":"{\"cmd\": \"ls   -la\"}"}}]})
    }
    fn res(id: &str) -> Value {
        json!({"role":"tool","tool_call_id":id,"content":"out"})
    }

    #[test]
    fn only_steps_between_the_task_and_an_assistant_message_fold() {
        let m = vec![
            json!({"role":"system","content":"s"}),
            json!({"role":"user","content":"task"}),
            call("a", "bash"),
            res("a"),
            call("b", "bash"),
            res("b"),
            json!({"role":"assistant","content":"thinking"}),
            call("c", "bash"),
            res("c"),
            call("d", "secret"),
            res("d"),
            call("e", "bash"),
            res("e"),
        ];
        let u = units(&m);
        let rl = run_loops(&m, None);
        let prune = PruneConfig {
            exclude_tools: vec!["secret".into()],
            ..Default::default()
        };
        let f = foldable_units(&m, &u, &rl.loops, &prune);
        let starts: Vec<usize> = u
            .iter()
            .zip(&f)
            .filter(|(_, f)| **f)
            .map(|(u, _)| u.start)
            .collect();
        // b: followed by a plain reply (fine); c: after a plain reply (two assistants would meet); d: excluded
        // tool; e: the newest, nothing after it.
        assert_eq!(starts, [2, 4]);
    }

    #[test]
    fn a_line_names_what_its_result_named_on_one_line() {
        let words = ["src/parse.rs", "parse_stmt", "1088"];
        let line = fold_line_naming("call_1", "grep", "{\"q\": \"fn\"}", &words);
        assert_eq!(
            line,
            "- call_1 grep {\"q\": \"fn\"} → src/parse.rs, parse_stmt, 1088"
        );
        assert!(!line.contains('\n'));
        assert_eq!(
            fold_line_naming("call_1", "grep", "{}", &[]),
            fold_line("call_1", "grep", "{}")
        );
    }

    #[test]
    fn lines_and_block_are_compact_and_appended() {
        let line = fold_line("call_1", "bash", "{\n \"cmd\": \"ls\"\n}");
        assert_eq!(line, "- call_1 bash { \"cmd\": \"ls\" }");
        let block = fold_block(std::slice::from_ref(&line), Some("recall_tool_call"));
        assert!(block.starts_with(FOLD_PREFIX) && block.ends_with(&line));
        assert!(block.contains("recall_tool_call"));
        let m = res("x");
        let with = with_block(&m, &block);
        assert_eq!(with["content"], format!("out\n\n{block}"));
        assert_eq!(with["tool_call_id"], "x");
        let parts =
            json!({"role":"tool","tool_call_id":"x","content":[{"type":"text","text":"a"}]});
        assert_eq!(with_block(&parts, "b")["content"][1]["text"], "b");
        let empty = json!({"role":"tool","tool_call_id":"x","content":""});
        assert_eq!(with_block(&empty, "b")["content"], "b");
    }
}
