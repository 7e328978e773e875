//! When the agent last used each tool result: the newest later user or assistant message naming a code-like string
//! (`digest::code_strings`) found in the result's text (so a path's tail, `http/request.py`, names
//! `/repo/django/http/request.py`) or the result's call id (a recall asks for it by id). Clearing takes the least recently
//! used results first, age breaking ties (see `stages`). Pure and deterministic.

use super::digest::code_strings;
use super::tokens::TokenCounter;
use crate::message::{field, message_text, role, tool_calls};
use aho_corasick::AhoCorasick;
use rustc_hash::FxHashMap as HashMap;
use serde_json::Value;
use std::borrow::Cow;
use std::sync::Arc;

/// A string found in more tool results than this names none of them in particular (a date, the user's id, the
/// workspace's root): its mentions are no use of any.
const MAX_HOLDERS: usize = 16;

/// The uses of every tool result of one request.
#[derive(Debug, Default)]
pub struct Usage {
    /// Message index → the indexes of the later messages using it (a result), ascending.
    uses: Vec<Vec<usize>>,
    /// (message, result) for every use, ascending by message.
    by_message: Vec<(usize, usize)>,
}

impl Usage {
    /// Finds the uses of the tool results (role `tool`) among `msgs` (neutral). The strings the user and
    /// assistant messages name are few: they are looked for in the results in one pass (Aho-Corasick), so the
    /// results' text is scanned once, never split into strings of its own.
    pub fn new(msgs: &[Value]) -> Self {
        Self::build(msgs, None)
    }

    /// [`Usage::new`], the strings each message names remembered by `counter` from one request to the next.
    pub fn with_memo(msgs: &[Value], counter: &TokenCounter) -> Self {
        Self::build(msgs, Some(counter))
    }

    fn build(msgs: &[Value], memo: Option<&TokenCounter>) -> Self {
        let mut usage = Usage {
            uses: vec![Vec::new(); msgs.len()],
            by_message: Vec::new(),
        };
        let is_tool = |i: usize| role(&msgs[i]) == "tool";
        let Some(first_result) = (0..msgs.len()).find(|&i| is_tool(i)) else {
            return usage;
        };
        // the strings each user or assistant message after a result names
        let named_by = |m: &Value| -> Vec<Box<str>> {
            let text = message_text(m);
            let mut seen: HashMap<&str, ()> = HashMap::default();
            code_strings(&text)
                .filter(|(_, s)| seen.insert(s, ()).is_none())
                .map(|(_, s)| Box::from(s))
                .collect()
        };
        let lists: Vec<(usize, Arc<[Box<str>]>)> = msgs
            .iter()
            .enumerate()
            .skip(first_result + 1)
            .filter(|(_, m)| matches!(role(m), "user" | "assistant"))
            .map(|(i, m)| {
                let list = match memo {
                    Some(c) => c.remembered_strings(m, 0, || named_by(m)),
                    None => named_by(m).into(),
                };
                (i, list)
            })
            .collect();
        // each string once overall
        let mut patterns: Vec<&str> = Vec::new();
        let mut pattern_of: HashMap<&str, usize> = HashMap::default();
        let named: Vec<(usize, Vec<usize>)> = lists
            .iter()
            .map(|(i, list)| {
                let mut ids: Vec<usize> = list
                    .iter()
                    .map(|s| {
                        *pattern_of.entry(s).or_insert_with(|| {
                            patterns.push(s);
                            patterns.len() - 1
                        })
                    })
                    .collect();
                ids.sort_unstable();
                (*i, ids)
            })
            .collect();
        // pattern → the results holding it (anywhere in their text: a path also inside a longer one), ascending
        let mut holders: Vec<Vec<usize>> = vec![Vec::new(); patterns.len()];
        if !patterns.is_empty() {
            if let Ok(ac) = AhoCorasick::builder()
                .kind(Some(aho_corasick::AhoCorasickKind::DFA))
                .build(&patterns)
            {
                for (i, m) in msgs.iter().enumerate().skip(first_result) {
                    if !is_tool(i) {
                        continue;
                    }
                    let text: Cow<'_, str> = match field(m, "content") {
                        Some(Value::String(s)) if field(m, "tool_calls").is_none() => {
                            Cow::Borrowed(s)
                        }
                        _ => Cow::Owned(message_text(m)),
                    };
                    for m in ac.find_overlapping_iter(text.as_ref()) {
                        let h = &mut holders[m.pattern().as_usize()];
                        if h.last() != Some(&i) && h.len() <= MAX_HOLDERS {
                            h.push(i);
                        }
                    }
                }
            }
        }
        // call id → its results
        let mut ids: HashMap<&str, Vec<usize>> = HashMap::default();
        for (i, m) in msgs.iter().enumerate().filter(|(i, _)| is_tool(*i)) {
            if let Some(id) = field(m, "tool_call_id").and_then(Value::as_str) {
                if !id.is_empty() {
                    ids.entry(id).or_default().push(i);
                }
            }
        }
        for (i, pats) in named {
            let mut used: Vec<usize> = pats
                .iter()
                .map(|&p| &holders[p])
                .filter(|h| h.len() <= MAX_HOLDERS)
                .flatten()
                .copied()
                .filter(|&r| r < i)
                .collect();
            // a call naming an earlier call's id in its arguments (a recall) uses its result
            if !ids.is_empty() {
                for call in tool_calls(&msgs[i]) {
                    let args = field(call, "function")
                        .and_then(|f| field(f, "arguments"))
                        .and_then(Value::as_str);
                    if let Some(Ok(v)) = args.map(serde_json::from_str::<Value>) {
                        string_leaves(&v, &mut |s| {
                            if let Some(r) = ids.get(s) {
                                used.extend(r.iter().filter(|&&r| r < i));
                            }
                        });
                    }
                }
            }
            used.sort_unstable();
            used.dedup();
            for r in used {
                usage.uses[r].push(i);
                usage.by_message.push((i, r));
            }
        }
        usage
    }

    /// The newest message before `before` that used result `i`; `i` itself when none did (its age).
    pub fn last_use(&self, i: usize, before: usize) -> usize {
        let Some(u) = self
            .uses
            .get(i)
            .filter(|u| u.first().is_some_and(|&m| m < before))
        else {
            return i;
        };
        u[u.partition_point(|&m| m < before) - 1]
    }

    /// The order clearing takes result `i` in, as of message `at` (uses before it): the least recently used
    /// first, the oldest first among those last used at once.
    pub fn key(&self, i: usize, at: usize) -> (usize, usize) {
        (self.last_use(i, at), i)
    }

    /// The results used by a message in `from..to`, each once, ascending.
    pub fn used_in(&self, from: usize, to: usize) -> Vec<usize> {
        let a = self.by_message.partition_point(|&(m, _)| m < from);
        let b = self.by_message.partition_point(|&(m, _)| m < to);
        let mut out: Vec<usize> = self.by_message[a..b].iter().map(|&(_, r)| r).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether any result has a use.
    pub fn is_empty(&self) -> bool {
        self.by_message.is_empty()
    }
}

/// Calls `f` with every string value of `v`.
fn string_leaves(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| string_leaves(x, f)),
        Value::Object(o) => o.values().for_each(|x| string_leaves(x, f)),
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, args: &str) -> Value {
        json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
            "function":{"name":"bash","arguments":args}}]})
    }
    fn tool(id: &str, content: &str) -> Value {
        json!({"role":"tool","tool_call_id":id,"content":content})
    }

    fn conversation() -> Vec<Value> {
        vec![
            json!({"role":"user","content":"fix the bug"}),
            call("c1", r#"{"cmd":"cat /repo/django/http/request.py"}"#),
            tool("c1", "class HttpRequest:\n    def get_host(self): ..."),
            call("c2", r#"{"cmd":"grep -n ImproperlyConfigured"}"#),
            tool(
                "c2",
                "django/conf/settings.py:1088: raise ImproperlyConfigured",
            ),
            call("c3", r#"{"cmd":"ls"}"#),
            tool("c3", "setup.py README.rst tests/test_request.py"),
            // uses c2's line number, and c1 by a recall of its call id
            call(
                "c4",
                r#"{"cmd":"sed -n 1080,1096p django/conf/settings.py"}"#,
            ),
            tool("c4", "1088 raise"),
            call("c5", r#"{"call_id":"c1"}"#),
            tool("c5", "recalled"),
            json!({"role":"assistant","content":"edit HttpRequest in tests/test_request.py"}),
        ]
    }

    #[test]
    fn a_result_is_used_by_later_messages_naming_its_strings_or_its_call_id() {
        let msgs = conversation();
        let u = Usage::new(&msgs);
        // c2's output names django/conf/settings.py: used at 7
        assert_eq!(u.last_use(4, msgs.len()), 7);
        // c1's call id (a recall, `c1` is no code-like string but the id is indexed) — and `HttpRequest` at 11
        assert_eq!(u.last_use(2, msgs.len()), 11);
        assert_eq!(u.last_use(2, 11), 9, "before 11: the recall at 9");
        assert_eq!(u.last_use(2, 9), 2, "before 9 it was not used");
        // c3 named tests/test_request.py: used at 11
        assert_eq!(u.last_use(6, msgs.len()), 11);
        // unused: its own age
        assert_eq!(u.last_use(10, msgs.len()), 10);
        assert_eq!(u.key(10, msgs.len()), (10, 10));
        assert_eq!(u.used_in(7, 8), vec![4]);
        assert_eq!(u.used_in(0, msgs.len()), vec![2, 4, 6]);
        assert_eq!(u.used_in(9, 10), vec![2], "the recall");
    }

    #[test]
    fn a_path_is_used_by_its_tail_and_a_common_string_by_no_one() {
        let mut msgs = vec![json!({"role":"user","content":"go"})];
        for k in 0..(MAX_HOLDERS + 2) {
            msgs.push(call(&format!("x{k}"), "{}"));
            msgs.push(tool(
                &format!("x{k}"),
                &format!("2024-05-15 omar_davis_3817 /repo/src/file_{k}.py"),
            ));
        }
        msgs.push(json!({"role":"assistant","content":"omar_davis_3817 edits src/file_3.py"}));
        let u = Usage::new(&msgs);
        let last = msgs.len() - 1;
        // file_3's result (index 2 + 2*3): used by its tail; the id shared by every result: by none
        assert_eq!(u.last_use(8, msgs.len()), last);
        assert_eq!(u.used_in(last, msgs.len()), vec![8]);
    }

    #[test]
    fn uses_are_deterministic() {
        let msgs = conversation();
        let (a, b) = (Usage::new(&msgs), Usage::new(&msgs));
        assert_eq!(a.by_message, b.by_message);
    }
}
