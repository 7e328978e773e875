//! The pinned task: which message of a request is "the task" that no rewrite clears, cuts or drops — the first
//! user message opening a turn after the client's few-shot opening (example exchanges and acknowledged set-up
//! that some clients, aider among them, send ahead of the real request).
//!
//! Only what one request shows is read (the planner is pure and replay must find the same message), so the
//! opening is told by its shape. A *pair* is a user message opening a turn answered directly by an assistant
//! message with text and no tool calls, with a user message after it. An *acknowledgement* is such a pair whose
//! assistant text is at most [`ACK_MAX_CHARS`] characters and starts `Ok.` or `Ok,` (or is `Ok`): the canned
//! reply a client writes itself under the set-up it sends (aider: "Ok.", "Ok, I will use these files as
//! references.", "Ok, any changes I propose will be to those files."). From the first message after the
//! system messages, the opening is
//!
//! 1. the leading acknowledgements (set-up: a system prompt sent as a user message, read-only files, a repo map),
//! 2. then, when pairs that are not acknowledgements (the examples) are followed by acknowledgements (aider's
//!    "I switched to a new code base…" / "Ok.", then its files), those examples and acknowledgements,
//! 3. or a leading run of pairs named as examples (`name` starting `example`, OpenAI's few-shot convention).
//!
//! The task is the first user message opening a turn after the opening; the first one of all when nothing
//! follows it. A conversation whose model answered "Ok." early on is read as having an opening too: its task
//! is then the user message after that answer (a degradation only under the hard limit: the earlier messages
//! can still be searched with the recall tools).

use crate::message::{field, is_system, message_text, opens_turn, role, tool_calls};
use serde_json::Value;

/// Most characters of an assistant's acknowledgement.
pub const ACK_MAX_CHARS: usize = 100;

/// The index of the task in `msgs` (neutral messages): the first user message opening a turn after the few-shot
/// opening (see the module's doc); `None` without a user message opening a turn.
pub fn task_index(msgs: &[Value]) -> Option<usize> {
    let first = msgs.iter().position(opens_turn)?;
    let pairs = leading_pairs(msgs);
    let mut end = pairs.iter().take_while(|p| p.ack).count();
    let examples = pairs[end..].iter().take_while(|p| !p.ack).count();
    let acks = pairs[end + examples..].iter().take_while(|p| p.ack).count();
    if examples > 0 && acks > 0 {
        end += examples + acks;
    }
    end = end.max(pairs.iter().take_while(|p| p.named).count());
    let Some(last) = end.checked_sub(1).map(|k| pairs[k].user + 2) else {
        return Some(first);
    };
    Some(
        msgs.iter()
            .skip(last)
            .position(opens_turn)
            .map_or(first, |k| last + k),
    )
}

/// A user message and the assistant's answer right after it.
struct Pair {
    /// Index of the user message.
    user: usize,
    /// The answer is an acknowledgement.
    ack: bool,
    /// Either message is named as an example.
    named: bool,
}

/// The pairs from the first message after the leading system messages, while they follow each other.
fn leading_pairs(msgs: &[Value]) -> Vec<Pair> {
    let mut out = Vec::new();
    let mut i = msgs
        .iter()
        .position(|m| !is_system(m))
        .unwrap_or(msgs.len());
    while let [u, a, next, ..] = &msgs[i.min(msgs.len())..] {
        let answered = opens_turn(u)
            && role(a) == "assistant"
            && tool_calls(a).is_empty()
            && role(next) == "user";
        let text = message_text(a);
        if !answered || text.trim().is_empty() {
            break;
        }
        out.push(Pair {
            user: i,
            ack: is_ack(&text),
            named: named_example(u) || named_example(a),
        });
        i += 2;
    }
    out
}

/// An assistant text that only acknowledges what it was given.
fn is_ack(text: &str) -> bool {
    let t = text.trim();
    t.chars().count() <= ACK_MAX_CHARS
        && (t == "Ok" || t.starts_with("Ok.") || t.starts_with("Ok,"))
}

/// A message named as a few-shot example (`example_user`, `example_assistant`).
fn named_example(m: &Value) -> bool {
    field(m, "name")
        .and_then(Value::as_str)
        .is_some_and(|n| n.starts_with("example"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn u(t: &str) -> Value {
        json!({"role": "user", "content": t})
    }
    fn a(t: &str) -> Value {
        json!({"role": "assistant", "content": t})
    }
    fn s(t: &str) -> Value {
        json!({"role": "system", "content": t})
    }

    /// Aider 0.86's opening (`aider/coders/base_coder.py` `format_chat_chunks`, the edit-block coder's
    /// `example_messages`): the system prompt, two worked examples, the switch to the real code base, the repo
    /// map and the files added to the chat, each acknowledged; `done` (the turns so far) sits between the repo
    /// map and the files.
    fn aider(done: &[Value], cur: &str, repo_map: bool) -> Vec<Value> {
        let mut m = vec![
            s("Act as an expert software developer.\nAlways use best practices when coding."),
            u("Change get_factorial() to use math.factorial"),
            a("To make this change we need to modify `mathweb/flask/app.py` to:\n\n1. Import the math package.\n2. Remove the existing factorial() function.\n3. Update get_factorial() to call math.factorial instead.\n\nHere are the *SEARCH/REPLACE* blocks:\n\nmathweb/flask/app.py\n```python\n<<<<<<< SEARCH\nfrom flask import Flask\n=======\nimport math\nfrom flask import Flask\n>>>>>>> REPLACE\n```\n"),
            u("Refactor hello() into its own file."),
            a("To make this change we need to modify `main.py` and make a new file `hello.py`:\n\n1. Make a new hello.py file with hello() in it.\n2. Remove hello() from main.py and replace it with an import.\n\nHere are the *SEARCH/REPLACE* blocks:\n\nhello.py\n```python\n<<<<<<< SEARCH\n=======\ndef hello():\n    \"print a greeting\"\n\n    print(\"hello\")\n>>>>>>> REPLACE\n```\n"),
            u("I switched to a new code base. Please don't consider the above files or try to edit them any longer."),
            a("Ok."),
        ];
        if repo_map {
            m.push(u("Here are summaries of some files present in my git repository.\nsrc/app.py:\n│def main"));
            m.push(a(
                "Ok, I won't try and edit those files without asking first.",
            ));
        }
        m.extend(done.iter().cloned());
        m.push(u("I have *added these files to the chat* so you can go ahead and edit them.\n\n*Trust this message as the true contents of these files!*\n\nsrc/app.py\n```\ndef main(): pass\n```"));
        m.push(a("Ok, any changes I propose will be to those files."));
        m.push(u(cur));
        m
    }

    #[test]
    fn aiders_examples_and_set_up_are_skipped_and_the_task_stays_put_as_turns_follow() {
        for repo_map in [false, true] {
            let first = aider(&[], "Add a --verbose flag to main()", repo_map);
            let t = task_index(&first).unwrap();
            assert_eq!(message_text(&first[t]), "Add a --verbose flag to main()");
            let done = [
                u("Add a --verbose flag to main()"),
                a("Here is the change: …"),
            ];
            let second = aider(&done, "Now document it", repo_map);
            let t2 = task_index(&second).unwrap();
            assert_eq!(message_text(&second[t2]), "Add a --verbose flag to main()");
        }
    }

    #[test]
    fn aider_without_a_system_role_sends_its_prompt_as_an_acknowledged_user_message() {
        let mut m = aider(&[], "Rename foo to bar", false);
        m[0] = u("Act as an expert software developer.");
        m.insert(1, a("Ok."));
        let t = task_index(&m).unwrap();
        assert_eq!(message_text(&m[t]), "Rename foo to bar");
    }

    #[test]
    fn a_plain_conversation_keeps_its_first_user_message() {
        let m = vec![
            s("You help."),
            u("Write a parser for TOML."),
            a("Here is a parser: …"),
            u("Make it faster."),
            a("Okay, here it is: …"),
            u("Thanks, and tests?"),
        ];
        assert_eq!(task_index(&m), Some(1));
        // An answer that only starts "Ok" but is long is no acknowledgement.
        let long = format!("Ok, {}", "here is the plan ".repeat(10));
        let m = vec![u("Refactor the parser."), a(&long), u("Go on.")];
        assert_eq!(task_index(&m), Some(0));
        // Examples need acknowledgements after them: pairs alone are a conversation.
        let m = vec![u("q1"), a("a1"), u("q2"), a("a2"), u("q3")];
        assert_eq!(task_index(&m), Some(0));
    }

    #[test]
    fn an_agent_run_keeps_its_first_user_message() {
        let m = vec![
            s("You are a coding agent."),
            u("Fix the failing test."),
            json!({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{}"}}]}),
            json!({"role":"tool","tool_call_id":"c1","content":"…"}),
            a("Ok, fixed."),
            u("Thanks"),
        ];
        assert_eq!(task_index(&m), Some(1));
    }

    #[test]
    fn named_examples_are_skipped() {
        let m = vec![
            s("Translate to French."),
            json!({"role":"user","name":"example_user","content":"cat"}),
            json!({"role":"assistant","name":"example_assistant","content":"chat"}),
            u("dog"),
        ];
        assert_eq!(task_index(&m), Some(3));
    }

    #[test]
    fn leading_set_up_is_skipped_and_nothing_after_it_falls_back_to_the_first_user_message() {
        let m = vec![u("Here are the files: …"), a("Ok."), u("Fix the bug.")];
        assert_eq!(task_index(&m), Some(2));
        // A request ending in an assistant prefill: the last pair is no pair (nothing follows it).
        let m = vec![u("Here are the files: …"), a("Ok.")];
        assert_eq!(task_index(&m), Some(0));
        assert_eq!(task_index(&[s("only a system prompt")]), None);
        assert_eq!(task_index(&[]), None);
    }

    #[test]
    fn a_continuing_user_message_is_never_the_task() {
        let m = vec![
            u("Here are the files: …"),
            a("Ok."),
            json!({"role":"user","content":"(continued)","ctxgate_continues":true}),
            u("Fix the bug."),
        ];
        // The acknowledged pair is followed by a continuation, then the real request.
        assert_eq!(task_index(&m), Some(3));
    }
}
