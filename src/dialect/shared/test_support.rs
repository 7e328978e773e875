//! Test helpers shared by the dialects' property tests: a dialect's side of them ([`Harness`]), the real planner
//! run on a client's body with a small window ([`rewritten_with`]), arguments the context engine may put in place
//! of a past tool call's (tool-input clearing), and putting them into a rewrite's neutral calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::config::{ContextConfig, PruneConfig, Strategy as Rewriting};
use crate::context::plan::{plan, Plan, PlanInput, Rewrite, Summaries};
use crate::context::tokens::{Encoding, TokenCounter};
use crate::dialect::Dialect;
use crate::message::Source;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::borrow::Cow;

/// A dialect as its property tests drive it: its conversion to and from the neutral form, and where the gateway
/// puts what it adds.
pub trait Harness {
    /// The dialect.
    const DIALECT: Dialect;
    /// The body field of the top-level system prompt (`system`, `instructions`).
    const SYSTEM: &'static str;
    /// The neutral form of a conversation, with where each neutral message comes from.
    type Neutral;
    /// The neutral form of `native`, the body's conversation, and `system`, its top-level system prompt.
    fn to_neutral(system: Option<&Value>, native: &[Value]) -> Self::Neutral;
    /// The neutral messages.
    fn messages(neutral: &Self::Neutral) -> &[Value];
    /// The conversation after a rewrite (`out[k]` rewritten, `sources[k]` where it came from).
    fn from_neutral<'a>(
        native: &'a [Value],
        neutral: &Self::Neutral,
        out: &[Cow<'_, Value>],
        sources: &[Source],
    ) -> Vec<Cow<'a, Value>>;
    /// The ready summary of the first `upto` messages.
    fn summary(upto: usize) -> Value;
    /// Whether the rewrite summarized.
    fn summarized(rewrite: &Rewrite<'_>) -> bool;
    /// Puts the recall note where the gateway puts it.
    fn add_note(rewrite: &Rewrite<'_>, out: &mut Vec<Cow<'_, Value>>, sources: &mut Vec<Source>);
}

/// The words `{tag}0 {tag}1 …`, `n` of them.
pub fn words(tag: &str, n: usize) -> String {
    (0..n)
        .map(|w| format!("{tag}{w}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The rewriting strategy numbered `k`.
pub fn strategy(k: u8) -> Rewriting {
    match k {
        0 => Rewriting::Prune,
        1 => Rewriting::Summarize,
        _ => Rewriting::Hybrid,
    }
}

/// The client's body as sent upstream after planning with a window of `frac` of its estimated size, and whether
/// it was summarized: `None` when the planner forwards or refuses.
pub fn rewritten<H: Harness>(
    client: &Value,
    frac: f64,
    strat: u8,
    counter: &TokenCounter,
) -> Option<(Value, bool)> {
    rewritten_with::<H>(client, frac, strat, counter, &[])
        .map(|(sent, summarized, _)| (sent, summarized))
}

/// Like [`rewritten`], with the neutral calls of the rewrite given new arguments (`args`, in order).
pub fn rewritten_with<H: Harness>(
    client: &Value,
    frac: f64,
    strat: u8,
    counter: &TokenCounter,
    args: &[Option<String>],
) -> Option<(Value, bool, Replaced)> {
    let key = H::DIALECT.conversation_key();
    let native = client[key].as_array()?;
    let neutral = H::to_neutral(client.get(H::SYSTEM), native);
    let messages = H::messages(&neutral);
    let total: u64 = messages
        .iter()
        .map(|m| counter.message_tokens(Encoding::O200k, m))
        .sum();
    let ready: Vec<(usize, Value)> = (1..=messages.len()).map(|u| (u, H::summary(u))).collect();
    let input = PlanInput {
        messages,
        hashes: None,
        tools: client.get("tools"),
        first_seen: None,
        now: 1_000_000,
        encoding: Encoding::O200k,
        ratio: 1.0,
        strategy: strategy(strat),
        window: ((total as f64 * frac) as u64).max(200),
        recall_tool: Some("recall_tool_call"),
        reserve: 0,
        summaries: Some(Summaries {
            keep_recent: 4,
            max_tokens: 50,
            ready: &ready,
        }),
        precompute_at: 0.6,
        strict_roles: H::DIALECT.strict_roles(),
    };
    let Plan::Rewrite(rw) = plan(
        &input,
        &ContextConfig::default(),
        &PruneConfig::default(),
        counter,
    ) else {
        return None;
    };
    let summarized = H::summarized(&rw);
    let (mut out, mut sources) = (rw.messages.clone(), rw.sources.clone());
    let replaced = replace_arguments(&mut out, args);
    H::add_note(&rw, &mut out, &mut sources);
    let rendered = H::from_neutral(native, &neutral, &out, &sources);
    let mut sent = client.clone();
    sent[key] = serde_json::to_value(&rendered).ok()?;
    Some((sent, summarized, replaced))
}

/// Whether the rewrite that changes nothing (every neutral message borrowed, from the client) renders the
/// client's conversation `native` borrowed and byte-identical.
pub fn unchanged_renders_the_client_bytes<H: Harness>(
    native: &[Value],
    neutral: &H::Neutral,
) -> bool {
    let out: Vec<Cow<'_, Value>> = H::messages(neutral).iter().map(Cow::Borrowed).collect();
    let src: Vec<Source> = (0..out.len()).map(Source::Client).collect();
    let same = H::from_neutral(native, neutral, &out, &src);
    same.iter().all(|m| matches!(m, Cow::Borrowed(_)))
        && serde_json::to_string(&same).unwrap() == serde_json::to_string(native).unwrap()
}

/// The client's body sent with the neutral arguments of the calls in `new` (call index, arguments) of its first
/// neutral message with calls replaced, every other message unchanged; and which rendered messages are borrowed.
pub fn sent_with<H: Harness>(client: &Value, new: &[(usize, &str)]) -> (Value, Vec<bool>) {
    let key = H::DIALECT.conversation_key();
    let native = client[key].as_array().unwrap();
    let neutral = H::to_neutral(client.get(H::SYSTEM), native);
    let messages = H::messages(&neutral);
    let j = messages
        .iter()
        .position(|m| m.get("tool_calls").is_some())
        .unwrap();
    let mut m = messages[j].clone();
    for (call, args) in new {
        m["tool_calls"][*call]["function"]["arguments"] = json!(args);
    }
    let out: Vec<Cow<'_, Value>> = messages
        .iter()
        .enumerate()
        .map(|(k, x)| {
            if k == j {
                Cow::Owned(m.clone())
            } else {
                Cow::Borrowed(x)
            }
        })
        .collect();
    let sources: Vec<Source> = (0..out.len()).map(Source::Client).collect();
    let rendered = H::from_neutral(native, &neutral, &out, &sources);
    let borrowed = rendered
        .iter()
        .map(|m| matches!(m, Cow::Borrowed(_)))
        .collect();
    let mut sent = client.clone();
    sent[key] = serde_json::to_value(&rendered).unwrap();
    (sent, borrowed)
}

/// Arguments the engine may put in place of a past call's (tool-input clearing): a placeholder object, any JSON
/// object, or any string at all (not JSON, or JSON but not an object).
pub fn new_arguments() -> impl Strategy<Value = String> {
    prop_oneof![
        ("[a-z_]{1,12}", 0..100_000u64).prop_map(|(tool, tokens)| {
            json!({"cleared":"input removed to save space","call_id":"call_x","tool":tool,"tokens":tokens})
                .to_string()
        }),
        prop::collection::btree_map("\\PC{0,6}", "\\PC{0,12}", 0..3)
            .prop_map(|m| serde_json::to_string(&m).unwrap()),
        any::<String>(),
        Just("[]".to_string()),
        Just("\"cleared\"".to_string()),
    ]
}

/// The neutral tool calls of the rewrite, in order, given `args[k]` as arguments (`None`: left as they are);
/// returns the (call id, new arguments) replaced.
pub fn replace_arguments(out: &mut [Cow<'_, Value>], args: &[Option<String>]) -> Replaced {
    let (mut k, mut replaced) = (0, Vec::new());
    for m in out.iter_mut() {
        let n = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        for c in 0..n {
            if let Some(Some(a)) = args.get(k) {
                let call = &mut m.to_mut()["tool_calls"][c];
                call["function"]["arguments"] = json!(a);
                replaced.push((call["id"].as_str().unwrap_or("").to_owned(), a.clone()));
            }
            k += 1;
        }
    }
    replaced
}

/// The (call id, new arguments) of the calls given new arguments.
pub type Replaced = Vec<(String, String)>;

/// Any JSON value, up to four levels deep: null, booleans, integers, finite floats, short strings and `extra`
/// leaves, in arrays and in objects whose keys match `key` (a regex).
pub fn arb_json_with(
    extra: BoxedStrategy<Value>,
    key: &'static str,
) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        extra,
    ];
    leaf.prop_recursive(4, 40, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}
