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
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Message index → the indexes of the later messages using it (a result), ascending.
    uses: Vec<Vec<usize>>,
    /// (message, result) for every use, ascending by message.
    by_message: Vec<(usize, usize)>,
}

/// What the uses are found from, for the first `n` messages of a request; extended message by message.
#[derive(Debug, Default, Clone)]
struct Scan {
    /// Messages scanned.
    n: usize,
    /// The first tool result's index.
    first_result: Option<usize>,
    /// Every string a user or assistant message after a result names, each once.
    patterns: Vec<Box<str>>,
    pattern_of: HashMap<Box<str>, usize>,
    /// Pattern → the results holding it (anywhere in their text), ascending, at most `MAX_HOLDERS + 1`.
    holders: Vec<Vec<usize>>,
    /// (message, the patterns it names), ascending by message.
    named: Vec<(usize, Vec<usize>)>,
    /// For each of `named`: the earlier results its tool calls name by call id (recalls).
    recalls: Vec<Vec<usize>>,
    /// Call id → its results.
    ids: HashMap<Box<str>, Vec<usize>>,
    /// The tool results' indexes, ascending.
    results: Vec<usize>,
}

/// An automaton finding `patterns` (overlapping matches); `None` when there are none (or too many to build).
fn automaton(patterns: &[Box<str>]) -> Option<AhoCorasick> {
    if patterns.is_empty() {
        return None;
    }
    AhoCorasick::builder()
        .kind(Some(aho_corasick::AhoCorasickKind::DFA))
        .build(patterns.iter().map(|p| p.as_bytes()))
        .ok()
}

/// Seeds the prefix hashes of [`Scan`]s (other memos of prefixes use other kinds).
const PREFIX_KIND: u64 = 0x0075_7361_6765; // "usage"
/// How many shorter prefixes are looked for: a turn adds a few messages (a tool loop's step, a user's question).
const MAX_PREFIX_PROBES: usize = 64;

impl Scan {
    /// Scans `msgs[self.n..]`: their named strings, their call ids and recalls, the new results for every
    /// string, and the earlier results for the strings first named now.
    fn extend(&mut self, msgs: &[Value], memo: Option<(&TokenCounter, &[u64])>) {
        let from = self.n;
        let old_patterns = self.patterns.len();
        let old_results = self.results.len();
        let named_by = |m: &Value| -> Vec<Box<str>> {
            let text = message_text(m);
            let mut seen: HashMap<&str, ()> = HashMap::default();
            code_strings(&text)
                .filter(|(_, s)| seen.insert(s, ()).is_none())
                .map(|(_, s)| Box::from(s))
                .collect()
        };
        for (i, m) in msgs.iter().enumerate().skip(from) {
            match role(m) {
                "tool" => {
                    self.first_result.get_or_insert(i);
                    self.results.push(i);
                    if let Some(id) = field(m, "tool_call_id").and_then(Value::as_str) {
                        if !id.is_empty() {
                            self.ids.entry(Box::from(id)).or_default().push(i);
                        }
                    }
                }
                "user" | "assistant" if self.first_result.is_some_and(|f| i > f) => {
                    let list: Arc<[Box<str>]> = match memo {
                        Some((c, each)) => c.remembered_strings_of(each[i], 0, || named_by(m)),
                        None => named_by(m).into(),
                    };
                    let mut pats: Vec<usize> = Vec::with_capacity(list.len());
                    for s in list.iter() {
                        let next = self.patterns.len();
                        let p = *self.pattern_of.entry(s.clone()).or_insert(next);
                        if p == next {
                            self.patterns.push(s.clone());
                            self.holders.push(Vec::new());
                        }
                        pats.push(p);
                    }
                    pats.sort_unstable();
                    // a call naming an earlier call's id in its arguments (a recall) uses its result
                    let mut recalls = Vec::new();
                    if !self.ids.is_empty() {
                        for call in tool_calls(m) {
                            let args = field(call, "function")
                                .and_then(|f| field(f, "arguments"))
                                .and_then(Value::as_str);
                            if let Some(Ok(v)) = args.map(serde_json::from_str::<Value>) {
                                string_leaves(&v, &mut |s| {
                                    if let Some(r) = self.ids.get(s) {
                                        recalls.extend(r.iter().filter(|&&r| r < i));
                                    }
                                });
                            }
                        }
                    }
                    self.named.push((i, pats));
                    self.recalls.push(recalls);
                }
                _ => {}
            }
        }
        // the results scanned before, for the strings first named now; then the new results for every string
        // (each pattern's holders stay ascending: old results before new ones)
        if self.patterns.len() > old_patterns {
            if let Some(ac) = automaton(&self.patterns[old_patterns..]) {
                self.scan(msgs, &ac, old_patterns, 0..old_results);
            }
        }
        if self.results.len() > old_results {
            if let Some(ac) = automaton(&self.patterns) {
                self.scan(msgs, &ac, 0, old_results..self.results.len());
            }
        }
        self.n = msgs.len();
    }

    /// Adds to the holders of the patterns `ac` finds (numbered from `offset`) the results
    /// `self.results[which]` holding them.
    fn scan(
        &mut self,
        msgs: &[Value],
        ac: &AhoCorasick,
        offset: usize,
        which: std::ops::Range<usize>,
    ) {
        for k in which {
            let i = self.results[k];
            let m = &msgs[i];
            let text: Cow<'_, str> = match field(m, "content") {
                Some(Value::String(s)) if field(m, "tool_calls").is_none() => Cow::Borrowed(s),
                _ => Cow::Owned(message_text(m)),
            };
            for hit in ac.find_overlapping_iter(text.as_ref()) {
                let h = &mut self.holders[offset + hit.pattern().as_usize()];
                if h.last() != Some(&i) && h.len() <= MAX_HOLDERS {
                    h.push(i);
                }
            }
        }
    }

    /// About how many bytes it holds.
    fn bytes(&self) -> usize {
        let strings: usize = self.patterns.iter().map(|p| 2 * p.len() + 48).sum();
        let lists: usize = self.holders.iter().map(|h| h.len() * 8 + 24).sum::<usize>()
            + self
                .named
                .iter()
                .map(|(_, p)| p.len() * 8 + 32)
                .sum::<usize>()
            + self.recalls.iter().map(|r| r.len() * 8 + 24).sum::<usize>()
            + self
                .ids
                .iter()
                .map(|(k, v)| k.len() + v.len() * 8 + 48)
                .sum::<usize>()
            + self.results.len() * 8;
        strings + lists + 128
    }
}

impl Usage {
    /// Finds the uses of the tool results (role `tool`) among `msgs` (neutral). The strings the user and
    /// assistant messages name are few: they are looked for in the results in one pass (Aho-Corasick), so the
    /// results' text is scanned once, never split into strings of its own.
    pub fn new(msgs: &[Value]) -> Self {
        let mut scan = Scan::default();
        scan.extend(msgs, None);
        Usage::of(&scan, msgs.len())
    }

    /// [`Usage::new`], extending what `counter` remembers of the longest earlier request this one starts with
    /// (the previous turn's, as a rule): only the new results are scanned for every string, and the old ones for
    /// the strings the new messages name. The same uses as [`Usage::new`] (property test).
    pub fn with_memo(msgs: &[Value], counter: &TokenCounter) -> Self {
        Self::with_hashes(msgs, counter, &counter.prefix_hashes(PREFIX_KIND, msgs))
    }

    /// [`Usage::with_memo`] given `counter.prefix_hashes(PREFIX_KIND, msgs)` (see [`Usage::prefix_hashes`]).
    pub fn with_hashes(
        msgs: &[Value],
        counter: &TokenCounter,
        hashes: &(Vec<u64>, Vec<u64>),
    ) -> Self {
        let (keys, each) = hashes;
        let oldest = msgs.len().saturating_sub(MAX_PREFIX_PROBES);
        let found = (oldest..=msgs.len()).rev().find_map(|k| {
            let v = counter.remembered_prefix(keys[k])?;
            v.downcast::<Scan>().ok().filter(|s| s.n == k)
        });
        let scan = match found {
            Some(s) if s.n == msgs.len() => s,
            found => {
                let mut scan = found.map(|s| (*s).clone()).unwrap_or_default();
                scan.extend(msgs, Some((counter, each)));
                let bytes = scan.bytes();
                let scan = Arc::new(scan);
                counter.remember_prefix(keys[msgs.len()], scan.clone(), bytes);
                scan
            }
        };
        Usage::of(&scan, msgs.len())
    }

    /// The keys [`Usage::with_hashes`] takes: the prefix hashes of `msgs` and each message's content hash (which
    /// the caller may use for [`TokenCounter::remembered_strings_of`]).
    /// With `raw`, the xxh3 of each message's bytes as sent, when the caller has them (see
    /// [`TokenCounter::prefix_hashes_raw`]).
    pub fn prefix_hashes(
        msgs: &[Value],
        raw: Option<&[u64]>,
        counter: &TokenCounter,
    ) -> (Vec<u64>, Vec<u64>) {
        match raw {
            Some(raw) if raw.len() == msgs.len() => counter.prefix_hashes_raw(PREFIX_KIND, raw),
            _ => counter.prefix_hashes(PREFIX_KIND, msgs),
        }
    }

    /// The uses `scan` found, in a request of `len` messages.
    fn of(scan: &Scan, len: usize) -> Self {
        let mut usage = Usage {
            uses: vec![Vec::new(); len],
            by_message: Vec::new(),
        };
        for ((i, pats), recalls) in scan.named.iter().zip(&scan.recalls) {
            let i = *i;
            let mut used: Vec<usize> = pats
                .iter()
                .map(|&p| &scan.holders[p])
                .filter(|h| h.len() <= MAX_HOLDERS)
                .flatten()
                .copied()
                .filter(|&r| r < i)
                .chain(recalls.iter().copied())
                .collect();
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

    /// A conversation from `steps`: (tool result words, assistant text words, recall of an earlier call), words
    /// drawn from a small vocabulary of paths, names and numbers so that results and later messages share them;
    /// a user message every few steps.
    fn generated(steps: &[(Vec<usize>, Vec<usize>, Option<usize>)]) -> Vec<Value> {
        const WORDS: [&str; 12] = [
            "/repo/src/main.rs",
            "src/main.rs",
            "django/http/request.py",
            "http/request.py",
            "ImproperlyConfigured",
            "TextEnum.B",
            "get_host_name",
            "1088",
            "1096",
            "plain",
            "words",
            "tests/test_x.py",
        ];
        let text = |ws: &[usize]| {
            ws.iter()
                .map(|&w| WORDS[w % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut msgs = vec![json!({"role":"user","content":"fix it"})];
        for (k, (result, said, recall)) in steps.iter().enumerate() {
            let args = match recall {
                Some(r) if *r < k => format!(r#"{{"call_id":"c{r}"}}"#),
                _ => format!(r#"{{"cmd":"{}"}}"#, text(said)),
            };
            let mut c = call(&format!("c{k}"), &args);
            c["content"] = json!(text(said));
            msgs.push(c);
            msgs.push(tool(&format!("c{k}"), &text(result)));
            if k % 3 == 2 {
                msgs.push(json!({"role":"user","content": text(said)}));
            }
        }
        msgs
    }

    proptest::proptest! {
        /// Extending what an earlier request of the conversation found gives the uses found from scratch, turn
        /// after turn (one to several messages added), whatever the memo holds.
        #[test]
        fn extending_a_remembered_prefix_finds_the_uses_found_from_scratch(
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec(0usize..12, 0..6),
                    proptest::collection::vec(0usize..12, 0..3),
                    proptest::option::of(0usize..20),
                ),
                1..24,
            ),
            cuts in proptest::collection::vec(1usize..5, 1..10),
        ) {
            let msgs = generated(&steps);
            let counter = TokenCounter::new();
            let mut k = 0;
            let mut turns = cuts.iter().cycle();
            while k < msgs.len() {
                k = (k + turns.next().copied().unwrap_or(1)).min(msgs.len());
                let remembered = Usage::with_memo(&msgs[..k], &counter);
                proptest::prop_assert_eq!(&remembered, &Usage::new(&msgs[..k]), "prefix of {}", k);
            }
            // a request that starts like none remembered, and the same one again (found whole)
            let other = TokenCounter::new();
            proptest::prop_assert_eq!(&Usage::with_memo(&msgs, &other), &Usage::new(&msgs));
            proptest::prop_assert_eq!(&Usage::with_memo(&msgs, &other), &Usage::new(&msgs));
        }
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
