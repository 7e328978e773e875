//! Adding the recall and search tools, and a note listing what can be recalled, to an outgoing request.

use crate::config::RecallConfig;
use crate::context::decide::Additions;
use crate::context::RewrittenBody;
use crate::dialect::{Dialect, InjectedNames};
use crate::message::Source;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// A pruned tool call the model may recall: the context engine's record of it.
pub use crate::context::PrunedCall as Recallable;

/// What `inject` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// The tools and the note were added.
    Injected,
    /// Nothing was added, and why.
    Skipped(&'static str),
}

/// Adds the recall tools to `body` (an outgoing request, rewritten or offered the tools), and the note when
/// something is recallable or `dropped` (messages the hard limit left out) is not 0. Deterministic: the same list
/// gives the same bytes. The tools are the same whatever is recallable (once a session's requests carry them,
/// they carry the same bytes; the search tool is of use without anything left out), and they are added to a
/// request without tools of its own too: ctxgate answers their calls itself and the client never sees them. The
/// client's own `tools` entries and `tool_choice` stay as they were.
pub fn inject(
    dialect: Dialect,
    body: &mut RewrittenBody<'_>,
    recallable: &[Recallable],
    dropped: usize,
    cfg: &RecallConfig,
) -> Injection {
    if let Err(why) = can_inject(dialect, &body.fields, cfg) {
        return Injection::Skipped(why);
    }
    let tools = body
        .fields
        .entry("tools")
        .or_insert_with(|| Value::Array(Vec::new()));
    if tools.is_null() {
        *tools = Value::Array(Vec::new());
    }
    if let Value::Array(list) = tools {
        list.push(recall_tool(dialect, &cfg.tool_name));
        list.push(search_tool(dialect, &cfg.search_tool_name));
    }
    if !recallable.is_empty() || dropped > 0 {
        add_note(body, &note(recallable, dropped, cfg));
    }
    Injection::Injected
}

/// The recall tools and note as the planner's additions to one request: offered when [`can_inject`] allows
/// them for the client's body.
#[derive(Debug, Clone, Copy)]
pub struct Offer<'a> {
    dialect: Dialect,
    cfg: &'a RecallConfig,
    allowed: bool,
}

impl<'a> Offer<'a> {
    /// The offer for a request whose client body is `body`.
    pub fn new(dialect: Dialect, body: &Map<String, Value>, cfg: &'a RecallConfig) -> Self {
        Self {
            dialect,
            cfg,
            allowed: can_inject(dialect, body, cfg).is_ok(),
        }
    }
}

impl Additions for Offer<'_> {
    fn tool_name(&self) -> Option<&str> {
        self.allowed.then_some(self.cfg.tool_name.as_str())
    }

    fn reserve(&self, tool_results: usize) -> u64 {
        if self.allowed {
            reserve_tokens(self.cfg, tool_results)
        } else {
            0
        }
    }

    fn add(&self, body: &mut RewrittenBody<'_>, pruned: &[Recallable], dropped: usize) -> bool {
        match inject(self.dialect, body, pruned, dropped, self.cfg) {
            Injection::Injected => true,
            Injection::Skipped(why) => {
                tracing::debug!(reason = why, "recall: tools not offered with this request");
                false
            }
        }
    }
}

/// Whether the recall tools may be added to `body` (a request of `dialect`): not when disabled, nor when the
/// dialect says the client's body leaves no room for them (see `Wire::may_add_tools`).
pub fn can_inject(
    dialect: Dialect,
    body: &Map<String, Value>,
    cfg: &RecallConfig,
) -> Result<(), &'static str> {
    if !cfg.enabled {
        return Err("disabled");
    }
    dialect.may_add_tools(body, &InjectedNames::from_config(cfg))
}

fn recall_tool(dialect: Dialect, name: &str) -> Value {
    dialect.tool_def(
        name,
        "Return the full original result of an earlier tool call whose output was removed from this \
            conversation to save space. Call it when you need the details of a call listed as recallable; pass its id.",
        json!({"type": "object",
            "properties": {"call_id": {"type": "string", "description": "The id of the earlier tool call."}},
            "required": ["call_id"], "additionalProperties": false}),
    )
}

fn search_tool(dialect: Dialect, name: &str) -> Value {
    dialect.tool_def(
        name,
        "Search this conversation's full earlier history, including removed tool results, for \
            words or a phrase (case-insensitive). Returns matching snippets with their message position and tool \
            call id.",
        json!({"type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words or a phrase to look for."},
                "limit": {"type": "integer", "description": "Most snippets to return (1-20, default 5)."}},
            "required": ["query"], "additionalProperties": false}),
    )
}

/// Most characters of the note.
const NOTE_MAX_CHARS: usize = 6000;

/// Tokens to keep free in a rewritten request for what `inject` adds: the two tool schemas and the note's header
/// (~270 tokens together) and a ~25-token line per listed call, for at most `calls` calls (the request's tool
/// results: no more can be pruned) and `max_note_calls`, capped with the note's size.
pub fn reserve_tokens(cfg: &RecallConfig, calls: usize) -> u64 {
    if !cfg.enabled {
        return 0;
    }
    let lines = (cfg.max_note_calls.min(calls) as u64).saturating_mul(25);
    270 + lines.min(NOTE_MAX_CHARS as u64 / 4)
}

/// How the recall note begins (it marks the note in a turn's record).
pub const NOTE_PREFIX: &str =
    "[ctxgate] Some earlier tool results were removed from this conversation to save space.";

/// How the note's part about messages the hard limit dropped begins (it marks the note in a turn's record when
/// no tool result was removed).
pub const DROPPED_PREFIX: &str =
    "[ctxgate] Earlier messages were dropped from this conversation to fit the model's context window";

/// The note's part about `dropped` messages the hard limit left out: how many, and how to find what they said.
fn dropped_note(dropped: usize, cfg: &RecallConfig) -> String {
    let messages = if dropped == 1 { "message" } else { "messages" };
    format!(
        "{DROPPED_PREFIX} ({dropped} {messages}); the full history is kept. To look for what they said, call `{}` \
         with words or a phrase from them.",
        cfg.search_tool_name
    )
}

fn note(recallable: &[Recallable], dropped: usize, cfg: &RecallConfig) -> String {
    if recallable.is_empty() {
        return dropped_note(dropped, cfg);
    }
    let mut s = format!(
        "{NOTE_PREFIX} To get one back, call `{}` with its call_id; to look for something in the full history, call `{}`. Recallable calls, \
         newest first:",
        cfg.tool_name, cfg.search_tool_name
    );
    // Folded calls are listed where their steps were (the carrier's fold lines), not again here.
    let listable: Vec<&Recallable> = recallable.iter().filter(|r| !r.folded).collect();
    let mut listed = 0;
    for r in listable.iter().rev().take(cfg.max_note_calls) {
        let line = format!("\n- {} {} {}", r.call_id, r.tool_name, r.digest);
        if s.len() + line.len() > NOTE_MAX_CHARS {
            break;
        }
        s.push_str(&line);
        listed += 1;
    }
    if listed < listable.len() {
        s.push_str(&format!("\n(and {} older)", listable.len() - listed));
    }
    let folded = recallable.len() - listable.len();
    if folded > 0 {
        s.push_str(&format!(
            "\n(and {folded} calls of folded steps, listed where the steps were)"
        ));
    }
    if dropped > 0 {
        s.push('\n');
        s.push_str(&dropped_note(dropped, cfg));
    }
    s
}

/// Adds the note where the rewrite put its cut, so the client's system prompt and every message before the cut
/// stay byte-identical. With strict role order (chat, Responses) it is appended to the text of the message
/// `RewrittenBody::note_in` (the last one ctxgate wrote before the cut: a placeholder, the summary, a gap message;
/// see `context::roles`). Otherwise (Anthropic) it is a neutral `system` message of its own at
/// `RewrittenBody::note_at` (after the leading system messages when unset), which Anthropic sends as a user text
/// block.
fn add_note(body: &mut RewrittenBody<'_>, note: &str) {
    if let Some(m) = body.note_in.and_then(|k| body.messages.get_mut(k)) {
        *m = Cow::Owned(crate::context::roles::with_text_last(m, note));
        return;
    }
    if body.strict_roles {
        // Nothing of ctxgate's to carry it (a request of system messages and its newest one): no note.
        return;
    }
    let messages = &body.messages;
    let leading = messages
        .iter()
        .take_while(|m| crate::message::is_system(m))
        .count();
    let at = body
        .note_at
        .unwrap_or(leading)
        .clamp(leading, messages.len());
    body.messages
        .insert(at, Cow::Owned(json!({"role": "system", "content": note})));
    body.sources.insert(at, Source::Added);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: usize) -> Vec<Recallable> {
        (0..n)
            .map(|i| Recallable {
                call_id: format!("call_{i}"),
                tool_name: "read_file".into(),
                digest: format!("{{\"path\":\"f{i}\"}}"),
                folded: false,
            })
            .collect()
    }

    /// A rewritten body holding `v`'s fields and messages.
    fn body(v: &Value) -> RewrittenBody<'_> {
        let messages = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(Cow::Borrowed)
            .collect();
        let n = v["messages"].as_array().unwrap().len();
        RewrittenBody::new(
            v.as_object().unwrap(),
            messages,
            (0..n).map(Source::Client).collect(),
        )
    }

    fn json_of(b: &RewrittenBody) -> Value {
        Value::Object(b.to_map())
    }

    #[test]
    fn injects_tools_and_note_deterministically() {
        let cfg = RecallConfig::default();
        let client = json!({"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"u"},
            {"role":"assistant","content":"a"},{"role":"user","content":"v"}],
            "tools":[{"type":"function","function":{"name":"read_file","parameters":{}}}],"tool_choice":"auto"});
        let mut a = body(&client);
        a.note_at = Some(3);
        let mut b = a.clone();
        assert_eq!(
            inject(Dialect::Chat, &mut a, &rec(3), 0, &cfg),
            Injection::Injected
        );
        inject(Dialect::Chat, &mut b, &rec(3), 0, &cfg);
        assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap());
        for i in [0, 1, 2, 4] {
            assert!(
                matches!(a.messages[i], Cow::Borrowed(_)),
                "untouched messages stay borrowed"
            );
        }
        assert_eq!(a.sources[3], Source::Added);
        let a = json_of(&a);
        let tools = a["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 3);
        assert_eq!(tools[0]["function"]["name"], "read_file");
        assert_eq!(a["tool_choice"], "auto");
        assert_eq!(
            a["messages"][0], client["messages"][0],
            "the client's system prompt is never touched"
        );
        assert_eq!(a["messages"][3]["role"], "system");
        let note = a["messages"][3]["content"].as_str().unwrap();
        assert!(note.starts_with("[ctxgate]"));
        assert!(
            note.find("call_2").unwrap() < note.find("call_0").unwrap(),
            "newest first"
        );
        assert_eq!(a["messages"][4], client["messages"][3], "the rest follows");
    }

    #[test]
    fn never_injects_when_forbidden_or_clashing() {
        let cfg = RecallConfig::default();
        let m = json!([{"role":"user","content":"u"}]);
        for v in [
            json!({"messages": m, "tool_choice": "none"}),
            json!({"messages": m, "tool_choice": {"type":"function","function":{"name":"x"}}}),
            json!({"messages": m, "tools":[{"type":"function","function":{"name":"recall_tool_call"}}]}),
        ] {
            let mut b = body(&v);
            assert!(matches!(
                inject(Dialect::Chat, &mut b, &rec(1), 0, &cfg),
                Injection::Skipped(_)
            ));
            assert_eq!(json_of(&b), v, "untouched");
        }
        let only = json!({"messages": m});
        let mut b = body(&only);
        assert_eq!(
            inject(Dialect::Chat, &mut b, &[], 0, &cfg),
            Injection::Injected
        );
        let offered = json_of(&b);
        assert_eq!(
            offered["messages"], m,
            "nothing recallable: the tools, no note"
        );
        assert_eq!(offered["tools"].as_array().map(Vec::len), Some(2));
        let off = RecallConfig {
            enabled: false,
            ..Default::default()
        };
        assert_eq!(
            inject(Dialect::Chat, &mut b, &rec(1), 0, &off),
            Injection::Skipped("disabled")
        );
    }

    #[test]
    fn messages_the_hard_limit_dropped_get_a_note_and_the_tools_without_client_tools() {
        let cfg = RecallConfig::default();
        let client =
            json!({"messages":[{"role":"user","content":"task"},{"role":"user","content":"now"}]});
        let mut b = body(&client);
        b.note_at = Some(1);
        assert_eq!(
            inject(Dialect::Chat, &mut b, &[], 3, &cfg),
            Injection::Injected
        );
        let v = json_of(&b);
        let names: Vec<&str> = v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["recall_tool_call", "search_history"]);
        let note = v["messages"][1]["content"].as_str().unwrap();
        assert!(note.starts_with(DROPPED_PREFIX), "{note}");
        assert!(note.contains("(3 messages)") && note.contains("`search_history`"));
        assert!(!note.contains(NOTE_PREFIX), "no tool result was removed");
        // With calls removed too, one note says both.
        let mut b = body(&client);
        inject(Dialect::Chat, &mut b, &rec(1), 1, &cfg);
        let v = json_of(&b);
        let note = v["messages"][0]["content"].as_str().unwrap();
        assert!(note.starts_with(NOTE_PREFIX) && note.contains("call_0"));
        assert!(note.contains(DROPPED_PREFIX) && note.contains("(1 message)"));
    }

    #[test]
    fn note_is_capped_and_inserted_when_no_system_message() {
        let cfg = RecallConfig {
            max_note_calls: 5,
            ..Default::default()
        };
        let client = json!({"messages":[{"role":"user","content":"u"}]});
        let mut b = body(&client);
        inject(Dialect::Chat, &mut b, &rec(40), 0, &cfg);
        let b = json_of(&b);
        let note = b["messages"][0]["content"].as_str().unwrap();
        assert_eq!(b["messages"][0]["role"], "system");
        assert!(note.contains("call_39") && !note.contains("call_34 "));
        assert!(note.contains("(and 35 older)"));
    }
}
