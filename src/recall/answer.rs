//! Answering the injected tools from the session's full history (all branches) and the current request, never
//! from another session or tenant. A recall returns the call's original arguments and its result, verbatim.

use super::InjectedNames;
use crate::config::RecallConfig;
use crate::message::message_text;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

/// Everything a recall or search may read: the current request's messages (always), then the session's stored
/// nodes, all branches (when the session could be loaded).
#[derive(Debug, Clone, Default)]
pub struct HistorySource {
    request: Vec<Arc<Value>>,
    stored: Vec<(u32, Arc<Value>)>,
}

impl HistorySource {
    /// A snapshot of the request's messages and a session tree's nodes (how tests build one; the pipeline gives
    /// the stored messages in their neutral form: [`HistorySource::from_parts`]).
    #[cfg(test)]
    pub fn new(request: &[Value], session: Option<&crate::session::tree::Tree>) -> Self {
        let stored: Vec<(u32, Arc<Value>)> = session
            .map(|t| t.nodes().map(|n| (n.position, n.message.clone())).collect())
            .unwrap_or_default();
        Self::from_parts(request, stored)
    }

    /// The request's (neutral) messages and stored (neutral) messages with their positions. A stored message
    /// identical to one of the request's is left out (the request's copy is read first): positions of the two
    /// need not line up (a dialect's stored message may stand for several neutral ones).
    pub fn from_parts(request: &[Value], mut stored: Vec<(u32, Arc<Value>)>) -> Self {
        // Each stored message is compared only with the request's messages of the same digest.
        let mut sent: HashMap<u64, Vec<&Value>> = HashMap::with_capacity(request.len());
        for m in request {
            sent.entry(digest(m)).or_default().push(m);
        }
        stored.retain(|(_, m)| {
            sent.get(&digest(m))
                .is_none_or(|same| !same.iter().any(|r| **r == **m))
        });
        stored.sort_by_key(|(p, _)| *p);
        Self {
            request: request.iter().cloned().map(Arc::new).collect(),
            stored,
        }
    }

    /// Every message with its position: the request's first, then the stored ones it does not hold.
    fn all(&self) -> impl Iterator<Item = (u32, &Value)> {
        let req = self
            .request
            .iter()
            .enumerate()
            .map(|(i, m)| (i as u32, &**m));
        let stored = self.stored.iter().map(|(p, m)| (*p, &**m));
        req.chain(stored)
    }

    fn tool_result(&self, call_id: &str) -> Option<&Value> {
        self.all().map(|(_, m)| m).find(|m| {
            m.get("role").and_then(Value::as_str) == Some("tool")
                && m.get("tool_call_id").and_then(Value::as_str) == Some(call_id)
        })
    }

    /// The tool call with that id, as the assistant message that made it holds it (the request's copy first: the
    /// client's own, never a rewritten one).
    fn tool_call(&self, call_id: &str) -> Option<&Value> {
        self.all().find_map(|(_, m)| {
            m.get("tool_calls")?
                .as_array()?
                .iter()
                .find(|c| c.get("id").and_then(Value::as_str) == Some(call_id))
        })
    }
}

/// A digest of a message's content (key order included), without serialising it.
fn digest(m: &Value) -> u64 {
    fn feed(h: &mut Xxh3, v: &Value) {
        match v {
            Value::Null => h.update(b"n"),
            Value::Bool(b) => h.update(if *b { b"t" } else { b"f" }),
            Value::Number(n) => {
                h.update(b"#");
                h.update(n.to_string().as_bytes());
            }
            Value::String(s) => {
                h.update(b"s");
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
            Value::Array(a) => {
                h.update(b"[");
                h.update(&(a.len() as u64).to_le_bytes());
                a.iter().for_each(|x| feed(h, x));
            }
            Value::Object(o) => {
                h.update(b"{");
                h.update(&(o.len() as u64).to_le_bytes());
                for (k, x) in o {
                    h.update(&(k.len() as u64).to_le_bytes());
                    h.update(k.as_bytes());
                    feed(h, x);
                }
            }
        }
    }
    let mut h = Xxh3::new();
    feed(&mut h, m);
    h.digest()
}

/// A [`HistorySource`] built the first time it is read: most answers call no injected tool, and building one
/// copies the request's messages and compares the stored ones with them.
pub struct LazyHistory(LazyState);

enum LazyState {
    Pending(Option<Box<dyn FnOnce() -> HistorySource + Send + Sync>>),
    Ready(HistorySource),
}

impl LazyHistory {
    /// A source that `build` makes when first read.
    pub fn new(build: impl FnOnce() -> HistorySource + Send + Sync + 'static) -> Self {
        Self(LazyState::Pending(Some(Box::new(build))))
    }

    /// The source, built now if it was not yet.
    pub fn get(&mut self) -> &HistorySource {
        if let LazyState::Pending(build) = &mut self.0 {
            let built = build.take().map(|f| f()).unwrap_or_default();
            self.0 = LazyState::Ready(built);
        }
        static NONE: HistorySource = HistorySource {
            request: Vec::new(),
            stored: Vec::new(),
        };
        match &self.0 {
            LazyState::Ready(h) => h,
            // Not reached: replaced just above.
            LazyState::Pending(_) => &NONE,
        }
    }
}

impl std::fmt::Debug for LazyHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            LazyState::Pending(_) => f.write_str("LazyHistory(pending)"),
            LazyState::Ready(h) => write!(f, "LazyHistory({h:?})"),
        }
    }
}

/// The answer to a recall of call `id`: its original arguments and its result, verbatim (each cut at `max`
/// characters with a marker), under plain labels; `None` when neither is in the history.
///
/// ```text
/// Arguments of call <id> (<tool>):
/// <arguments>
///
/// Result:
/// <result>
/// ```
///
/// Without a recorded result the second part reads `Result: none recorded.`; without the call (only its result
/// is known) the answer is `Result of call <id> (<tool>):\n<result>`.
fn recall_text(src: &HistorySource, id: &str, max: usize) -> Option<String> {
    let call = src.tool_call(id);
    let result = src.tool_result(id).map(|m| cut(&message_text(m), max));
    let tool = call
        .and_then(|c| c.pointer("/function/name"))
        .and_then(Value::as_str)
        .unwrap_or("unknown tool");
    let args = call
        .and_then(|c| c.pointer("/function/arguments"))
        .map(|a| match a {
            Value::String(s) => cut(s, max),
            other => cut(&other.to_string(), max),
        });
    match (args, result) {
        (Some(a), Some(r)) => Some(format!(
            "Arguments of call {id} ({tool}):\n{a}\n\nResult:\n{r}"
        )),
        (Some(a), None) => Some(format!(
            "Arguments of call {id} ({tool}):\n{a}\n\nResult: none recorded."
        )),
        (None, Some(r)) => Some(format!("Result of call {id} ({tool}):\n{r}")),
        (None, None) => None,
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let kept: String = s.chars().take(max).collect();
    let rest = s.chars().count() - max;
    format!("{kept}\n…[truncated: {rest} more characters]")
}

/// How ctxgate answered an injected call (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// The recalled call (its arguments, its result or both), or at least one search match, was returned.
    Found,
    /// No call with that id, or no search match.
    NotFound,
    /// Bad arguments or an unknown tool.
    Error,
}

/// The tool result ctxgate gives for one injected call.
pub fn answer_call(
    call: &Value,
    names: &InjectedNames,
    src: &HistorySource,
    cfg: &RecallConfig,
) -> String {
    answer_call_with_outcome(call, names, src, cfg).0
}

/// Like [`answer_call`], also saying how it went.
pub fn answer_call_with_outcome(
    call: &Value,
    names: &InjectedNames,
    src: &HistorySource,
    cfg: &RecallConfig,
) -> (String, Answered) {
    let name = call
        .pointer("/function/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let args: Value = call
        .pointer("/function/arguments")
        .and_then(Value::as_str)
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or(Value::Null);
    if name == names.recall {
        let Some(id) = args.get("call_id").and_then(Value::as_str) else {
            return (
                "Error: `call_id` (a string) is required.".into(),
                Answered::Error,
            );
        };
        match recall_text(src, id, cfg.max_result_chars) {
            Some(text) => (text, Answered::Found),
            None => (
                format!("Not found: no tool call with id {id:?} exists in this conversation."),
                Answered::NotFound,
            ),
        }
    } else if name == names.search {
        let Some(q) = args
            .get("query")
            .and_then(Value::as_str)
            .filter(|q| !q.trim().is_empty())
        else {
            return (
                "Error: `query` (a non-empty string) is required.".into(),
                Answered::Error,
            );
        };
        let limit = args
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(5)
            .clamp(1, 20) as usize;
        let (text, total) = search(src, q, limit, cfg.max_search_chars);
        let outcome = if total > 0 {
            Answered::Found
        } else {
            Answered::NotFound
        };
        (text, outcome)
    } else {
        (format!("Error: unknown tool {name:?}."), Answered::Error)
    }
}

/// Case-insensitive keyword search; the whole phrase scores highest, then term occurrences; newer first on ties.
/// Returns the answer and the number of matches.
fn search(src: &HistorySource, query: &str, limit: usize, max_chars: usize) -> (String, usize) {
    let phrase = query.to_lowercase();
    let terms: Vec<&str> = phrase.split_whitespace().collect();
    let mut hits: Vec<(usize, u32, &Value, String, usize)> = Vec::new();
    for (pos, m) in src.all() {
        let text = message_text(m);
        let lower = text.to_lowercase();
        let phrase_hits = lower.matches(phrase.as_str()).count();
        let term_hits: usize = terms.iter().map(|t| lower.matches(t).count()).sum();
        let score = phrase_hits * 10 + term_hits;
        if score == 0 {
            continue;
        }
        let at = lower
            .find(phrase.as_str())
            .or_else(|| terms.iter().filter_map(|t| lower.find(t)).min())
            .unwrap_or(0);
        hits.push((score, pos, m, text, at));
    }
    hits.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    let total = hits.len();
    let mut matches = Vec::new();
    let mut used = 0;
    for (_, pos, m, text, at) in hits.into_iter().take(limit) {
        let snippet = snippet(&text, at, 240);
        used += snippet.len();
        if used > max_chars && !matches.is_empty() {
            break;
        }
        let call_id = m
            .get("tool_call_id")
            .or_else(|| m.pointer("/tool_calls/0/id"))
            .cloned()
            .unwrap_or(Value::Null);
        matches.push(
            json!({"position": pos, "role": m.get("role"), "call_id": call_id, "snippet": snippet}),
        );
    }
    let text = json!({"query": query, "total_matches": total, "matches": matches}).to_string();
    (text, total)
}

/// About `width` characters of `text` around byte offset `at` (of the lower-cased text; close enough for ASCII,
/// clamped to char boundaries otherwise).
fn snippet(text: &str, at: usize, width: usize) -> String {
    let start_char = text[..floor(text, at)]
        .chars()
        .count()
        .saturating_sub(width / 3);
    let s: String = text.chars().skip(start_char).take(width).collect();
    let prefix = if start_char > 0 { "…" } else { "" };
    let suffix = if start_char + width < text.chars().count() {
        "…"
    } else {
        ""
    };
    format!("{prefix}{s}{suffix}")
}

fn floor(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::tree::Tree;

    #[test]
    fn a_lazy_source_is_built_once_and_only_when_read() {
        let built = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&built);
        let h = history();
        let mut lazy = LazyHistory::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            HistorySource::new(&h, None)
        });
        assert_eq!(
            built.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "not built before it is read"
        );
        let n = lazy.get().request.len();
        assert_eq!(n, history().len());
        assert_eq!(lazy.get().request.len(), n);
        assert_eq!(
            built.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "built once"
        );
    }

    #[test]
    fn stored_copies_of_request_messages_are_left_out_and_digests_see_key_order() {
        let a = json!({"role": "user", "content": "a"});
        let b = json!({"role": "assistant", "content": "b"});
        let reordered = json!({"content": "a", "role": "user"});
        let other = json!({"role": "user", "content": "c"});
        let src = HistorySource::from_parts(
            &[a.clone(), b.clone(), a.clone()],
            vec![
                (3, Arc::new(other.clone())),
                (0, Arc::new(a.clone())),
                (1, Arc::new(b)),
                (2, Arc::new(reordered.clone())),
            ],
        );
        let stored: Vec<(u32, Value)> = src
            .stored
            .iter()
            .map(|(p, m)| (*p, (**m).clone()))
            .collect();
        // the same content in another key order is another digest: kept, as a serialised digest did
        assert_eq!(stored, vec![(2, reordered), (3, other)]);
        assert_ne!(
            digest(&json!({"a": 1, "b": 2})),
            digest(&json!({"b": 2, "a": 1}))
        );
        assert_ne!(digest(&json!(["ab"])), digest(&json!(["a", "b"])));
        assert_ne!(digest(&json!({"x": "1"})), digest(&json!({"x": 1})));
    }

    fn names() -> InjectedNames {
        InjectedNames::from_config(&RecallConfig::default())
    }

    fn call(name: &str, args: Value) -> Value {
        json!({"id":"r1","type":"function","function":{"name":name,"arguments":args.to_string()}})
    }

    fn history() -> Vec<Value> {
        vec![
            json!({"role":"user","content":"read the config"}),
            json!({"role":"assistant","content":null,"tool_calls":[{"id":"call_a","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"c.toml\"}"}}]}),
            json!({"role":"tool","tool_call_id":"call_a","content":"port = 8080\nsecret_marker = ZEBRA-42"}),
            json!({"role":"assistant","content":"The port is 8080."}),
        ]
    }

    #[test]
    fn recall_by_id_and_unknown_id() {
        let src = HistorySource::new(&history(), None);
        let cfg = RecallConfig::default();
        let out = answer_call(
            &call("recall_tool_call", json!({"call_id":"call_a"})),
            &names(),
            &src,
            &cfg,
        );
        assert_eq!(
            out,
            "Arguments of call call_a (read_file):\n{\"path\":\"c.toml\"}\n\n\
             Result:\nport = 8080\nsecret_marker = ZEBRA-42"
        );
        let out = answer_call(
            &call("recall_tool_call", json!({"call_id":"nope"})),
            &names(),
            &src,
            &cfg,
        );
        assert!(out.starts_with("Not found"));
        let out = answer_call(&call("recall_tool_call", json!({})), &names(), &src, &cfg);
        assert!(out.starts_with("Error"));
    }

    #[test]
    fn a_call_without_a_result_answers_with_its_arguments() {
        let h = history();
        let cfg = RecallConfig::default();
        let recall = call("recall_tool_call", json!({"call_id":"call_a"}));
        // The call is known (the request's assistant message), its result is not.
        let src = HistorySource::new(&h[..2], None);
        let (out, how) = answer_call_with_outcome(&recall, &names(), &src, &cfg);
        assert_eq!(
            out,
            "Arguments of call call_a (read_file):\n{\"path\":\"c.toml\"}\n\nResult: none recorded."
        );
        assert_eq!(how, Answered::Found);
        // Only the result is known: it is answered under its own label.
        let src = HistorySource::new(&h[2..], None);
        let out = answer_call(&recall, &names(), &src, &cfg);
        assert_eq!(
            out,
            "Result of call call_a (unknown tool):\nport = 8080\nsecret_marker = ZEBRA-42"
        );
    }

    #[test]
    fn the_original_arguments_come_from_the_stored_history_when_the_request_lost_them() {
        let mut tree = Tree::new();
        let h = history();
        tree.append_request(&h, &[], 0);
        let src = HistorySource::new(&h[3..], Some(&tree));
        let out = answer_call(
            &call("recall_tool_call", json!({"call_id":"call_a"})),
            &names(),
            &src,
            &RecallConfig::default(),
        );
        assert!(
            out.starts_with(
                "Arguments of call call_a (read_file):\n{\"path\":\"c.toml\"}\n\nResult:\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn long_arguments_are_cut_like_results() {
        let args = json!({"content": "y".repeat(5_000)}).to_string();
        let h = [
            json!({"role":"assistant","content":null,"tool_calls":[{"id":"w","type":"function",
                "function":{"name":"write_file","arguments":args}}]}),
            json!({"role":"tool","tool_call_id":"w","content":"ok"}),
        ];
        let cfg = RecallConfig {
            max_result_chars: 1000,
            ..Default::default()
        };
        let out = answer_call(
            &call("recall_tool_call", json!({"call_id":"w"})),
            &names(),
            &HistorySource::new(&h, None),
            &cfg,
        );
        assert!(out.contains(&args[..1000]) && out.contains("truncated: 4014 more characters"));
        assert!(out.ends_with("\n\nResult:\nok"), "{out}");
    }

    proptest::proptest! {
        /// Whatever the arguments and the result, both come back byte for byte under their labels.
        #[test]
        fn recall_returns_arguments_and_result_verbatim(
            id in "[A-Za-z0-9_]{1,24}",
            tool in "[a-z_]{1,16}",
            args in proptest::prelude::any::<String>(),
            result in proptest::prelude::any::<String>(),
            stored in proptest::prelude::any::<bool>(),
        ) {
            let h = [
                json!({"role":"user","content":"go"}),
                json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
                    "function":{"name":tool,"arguments":args}}]}),
                json!({"role":"tool","tool_call_id":id,"content":result}),
                json!({"role":"assistant","content":"done"}),
            ];
            let mut tree = Tree::new();
            tree.append_request(&h, &[], 0);
            // From the request, or from the stored history when the request no longer holds the call.
            let src = if stored {
                HistorySource::new(&h[3..], Some(&tree))
            } else {
                HistorySource::new(&h, None)
            };
            let cfg = RecallConfig { max_result_chars: usize::MAX, ..Default::default() };
            let out = answer_call(&call("recall_tool_call", json!({"call_id":id})), &names(), &src, &cfg);
            proptest::prop_assert_eq!(
                out,
                format!("Arguments of call {id} ({tool}):\n{args}\n\nResult:\n{result}")
            );
        }
    }

    #[test]
    fn search_finds_marker_in_stored_branch_and_caps() {
        let mut tree = Tree::new();
        let h = history();
        tree.append_request(&h, &[], 0);
        // the current request no longer carries the result (e.g. a trimmed history)
        let src = HistorySource::new(&h[..1], Some(&tree));
        let out = answer_call(
            &call("search_history", json!({"query":"zebra-42"})),
            &names(),
            &src,
            &RecallConfig::default(),
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["matches"][0]["call_id"], "call_a");
        assert_eq!(v["matches"][0]["position"], 2);
        assert!(v["matches"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("ZEBRA-42"));
        let long = "x".repeat(50_000);
        let src = HistorySource::new(
            &[json!({"role":"tool","tool_call_id":"big","content":long})],
            None,
        );
        let cfg = RecallConfig {
            max_result_chars: 1000,
            ..Default::default()
        };
        let out = answer_call(
            &call("recall_tool_call", json!({"call_id":"big"})),
            &names(),
            &src,
            &cfg,
        );
        assert!(out.len() < 1200 && out.contains("truncated: 49000"));
    }

    #[test]
    fn a_stored_copy_of_a_request_message_is_found_once_whatever_its_position() {
        let h = history();
        // stored at other positions than the request's (a dialect's stored message stands for several neutral
        // ones), plus one the request no longer carries
        let other = json!({"role":"tool","tool_call_id":"call_z","content":"zebra-42 elsewhere"});
        let stored = vec![(9, Arc::new(h[2].clone())), (11, Arc::new(other))];
        let src = HistorySource::from_parts(&h, stored);
        let out = answer_call(
            &call("search_history", json!({"query":"zebra-42"})),
            &names(),
            &src,
            &RecallConfig::default(),
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        let mut ids: Vec<&str> = v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["call_id"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, ["call_a", "call_z"], "{out}");
        assert_eq!(v["total_matches"], 2);
    }
}
