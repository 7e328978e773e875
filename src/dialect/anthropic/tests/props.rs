//! Property tests: random valid Anthropic conversations (parallel tool use, text after results, signed thinking,
//! redacted thinking, images, server tools, mid-conversation system messages, cache markers, long results) through
//! the real planner with a window small enough to make it rewrite.

use super::super::convert::{from_neutral, to_neutral, Neutral};
use super::super::validate::{check_rewrite, check_sequence};
use crate::context::plan::Rewrite;
use crate::context::tokens::TokenCounter;
use crate::dialect::shared::test_support::{
    new_arguments, rewritten, rewritten_with, unchanged_renders_the_client_bytes, words, Harness,
};
use crate::dialect::Dialect;
use crate::message::{is_system, Source};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Value};
use std::borrow::Cow;

#[derive(Debug, Clone)]
struct Round {
    calls: usize,
    thinking: u8,
    text: bool,
    rest_text: bool,
    long: bool,
    blocks: bool,
    server: bool,
}

#[derive(Debug, Clone)]
struct Turn {
    mid_system: u8,
    opener: u8,
    rounds: Vec<Round>,
    final_thinking: u8,
    long: bool,
}

#[derive(Debug, Clone)]
struct Conv {
    system: u8,
    turns: Vec<Turn>,
    end_in_loop: bool,
    markers: Vec<usize>,
    words: usize,
}

fn round() -> impl Strategy<Value = Round> {
    (
        1..=3usize,
        0..3u8,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(calls, thinking, text, rest_text, long, blocks, server)| Round {
                calls,
                thinking,
                text,
                rest_text,
                long,
                blocks,
                server,
            },
        )
}

fn turn() -> impl Strategy<Value = Turn> {
    let rounds = prop::collection::vec(round(), 0..4);
    (0..3u8, 0..4u8, rounds, 0..3u8, any::<bool>()).prop_map(
        |(mid_system, opener, rounds, final_thinking, long)| Turn {
            mid_system,
            opener,
            rounds,
            final_thinking,
            long,
        },
    )
}

fn conv() -> impl Strategy<Value = Conv> {
    (
        0..3u8,
        prop::collection::vec(turn(), 1..7),
        any::<bool>(),
        prop::collection::vec(any::<usize>(), 0..=3),
        20..400usize,
    )
        .prop_map(|(system, turns, end_in_loop, markers, words)| Conv {
            system,
            turns,
            end_in_loop,
            markers,
            words,
        })
}

fn thinking(kind: u8, tag: &str) -> Option<Value> {
    match kind {
        1 => Some(
            json!({"type":"thinking","thinking":format!("thinking about {tag}"),"signature":format!("EqQBCkYI{tag}sig==")}),
        ),
        2 => Some(json!({"type":"redacted_thinking","data":format!("RWNyeXB0ZWQ{tag}")})),
        _ => None,
    }
}

const IMAGE: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk";

/// The client's body for a conversation spec: every message valid for the Messages API.
fn build(c: &Conv) -> Value {
    let mut msgs: Vec<Value> = Vec::new();
    let last_turn = c.turns.len() - 1;
    for (t, turn) in c.turns.iter().enumerate() {
        let reminder = format!("Reminder {t}: stay on task.");
        match turn.mid_system {
            1 if t > 0 => msgs.push(json!({"role":"system","content":reminder})),
            2 if t > 0 => {
                msgs.push(json!({"role":"system","content":[{"type":"text","text":reminder}]}))
            }
            _ => {}
        }
        // Long texts (over `prune.max_message_length`) are cut when their run loop is pruned.
        let size = |n: usize| if turn.long { 500 } else { n };
        let q = format!("question {t} {}", words("q", size(c.words / 8)));
        msgs.push(match turn.opener {
            0 => json!({"role":"user","content":q}),
            1 => json!({"role":"user","content":[{"type":"text","text":q}]}),
            2 => json!({"role":"user","content":[{"type":"text","text":q},
                {"type":"image","source":{"type":"base64","media_type":"image/png","data":IMAGE}}]}),
            _ => json!({"role":"user","content":[
                {"type":"document","source":{"type":"base64","media_type":"application/pdf","data":IMAGE.repeat(40)}},
                {"type":"text","text":q}]}),
        });
        for (r, round) in turn.rounds.iter().enumerate() {
            let tag = format!("{t}_{r}");
            let mut blocks: Vec<Value> = thinking(round.thinking, &tag).into_iter().collect();
            if round.text {
                blocks.push(json!({"type":"text","text":format!("Let me look ({tag}).")}));
            }
            if round.server {
                blocks.push(json!({"type":"server_tool_use","id":format!("srvtoolu_{tag}"),"name":"web_search","input":{"query":format!("docs {tag}")}}));
                blocks.push(json!({"type":"web_search_tool_result","tool_use_id":format!("srvtoolu_{tag}"),
                    "content":[{"type":"web_search_result","title":format!("Result {tag}"),"url":"https://example.com","encrypted_content":"RW5jcnlwdGVk"}]}));
            }
            let ids: Vec<String> = (0..round.calls)
                .map(|k| format!("toolu_{tag}_{k}"))
                .collect();
            for id in &ids {
                blocks.push(json!({"type":"tool_use","id":id,"name":"read_file","input":{"path":format!("src/{id}.rs")}}));
            }
            msgs.push(json!({"role":"assistant","content":blocks}));
            let n = if round.long { c.words * 4 } else { c.words / 4 };
            let mut results: Vec<Value> = ids
                .iter()
                .map(|id| {
                    let body = format!("{id}: {}", words("w", n));
                    let content = if round.blocks {
                        json!([{"type":"text","text":body},{"type":"image","source":{"type":"base64","media_type":"image/png","data":IMAGE}}])
                    } else {
                        json!(body)
                    };
                    json!({"type":"tool_result","tool_use_id":id,"content":content})
                })
                .collect();
            if round.rest_text {
                results.push(json!({"type":"text","text":format!("Also check {tag}.")}));
            }
            msgs.push(json!({"role":"user","content":results}));
        }
        let in_flight = t == last_turn && c.end_in_loop && !turn.rounds.is_empty();
        if !in_flight {
            let mut blocks: Vec<Value> = thinking(turn.final_thinking, &format!("{t}_f"))
                .into_iter()
                .collect();
            blocks.push(
                json!({"type":"text","text":format!("answer {t} {}", words("a", size(c.words / 4)))}),
            );
            msgs.push(json!({"role":"assistant","content":blocks}));
            if t == last_turn {
                msgs.push(json!({"role":"user","content":"thanks, and next?"}));
            }
        }
    }
    // Cache markers on up to three blocks (not thinking: the API refuses markers there).
    let mut slots = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        for (b, block) in m["content"].as_array().into_iter().flatten().enumerate() {
            if !matches!(
                block["type"].as_str(),
                Some("thinking" | "redacted_thinking")
            ) {
                slots.push((i, b));
            }
        }
    }
    let mut picked: Vec<(usize, usize)> = c
        .markers
        .iter()
        .filter(|_| !slots.is_empty())
        .map(|k| slots[k % slots.len()])
        .collect();
    picked.sort_unstable();
    picked.dedup();
    for (i, b) in picked {
        msgs[i]["content"][b]["cache_control"] = json!({"type":"ephemeral"});
    }
    let system = match c.system {
        0 => Value::Null,
        1 => json!("You are a coding agent."),
        _ => {
            json!([{"type":"text","text":"You are Claude Code."},{"type":"text","text":"Work carefully.","cache_control":{"type":"ephemeral"}}])
        }
    };
    let mut body = json!({"model":"claude-sonnet-4-5","max_tokens":4096});
    if !system.is_null() {
        body["system"] = system;
    }
    body["tools"] = json!([{"name":"read_file","input_schema":{"type":"object"}}]);
    body["messages"] = Value::Array(msgs);
    body["context_management"] = json!({"edits":[{"type":"clear_thinking_20251015","keep":"all"}]});
    body
}

/// The Messages API as the property tests drive it.
pub(super) struct Anthropic;

impl Harness for Anthropic {
    const DIALECT: Dialect = Dialect::Anthropic;
    const SYSTEM: &'static str = "system";
    type Neutral = Neutral;

    fn to_neutral(system: Option<&Value>, native: &[Value]) -> Neutral {
        to_neutral(system, native)
    }

    fn messages(neutral: &Neutral) -> &[Value] {
        &neutral.messages
    }

    fn from_neutral<'a>(
        native: &'a [Value],
        neutral: &Neutral,
        out: &[Cow<'_, Value>],
        sources: &[Source],
    ) -> Vec<Cow<'a, Value>> {
        from_neutral(native, neutral, out, sources)
    }

    fn summary(upto: usize) -> Value {
        json!({"role":"system","content":format!("Summary of the first {upto} messages.")})
    }

    fn summarized(rewrite: &Rewrite<'_>) -> bool {
        rewrite.sources.contains(&Source::Added)
    }

    /// The recall note, where the gateway puts it for Anthropic: a message after the leading system messages.
    fn add_note(_: &Rewrite<'_>, out: &mut Vec<Cow<'_, Value>>, sources: &mut Vec<Source>) {
        let at = out.iter().position(|m| !is_system(m)).unwrap_or(out.len());
        let note = json!({"role":"system","content":"Results of earlier tool calls were left out; recall them."});
        out.insert(at, Cow::Owned(note));
        sources.insert(at, Source::Added);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn rewrites_of_valid_conversations_are_valid(c in conv(), frac in 0.15f64..1.4, strat in 0..3u8) {
        let client = build(&c);
        let native = client["messages"].as_array().unwrap();
        prop_assert_eq!(check_sequence(native), Ok(()), "the generator makes valid conversations");
        let neutral = to_neutral(client.get("system"), native);
        prop_assert_eq!(crate::context::units::check_sequence(&neutral.messages), Ok(()));

        // An unchanged plan renders the client's bytes.
        prop_assert!(unchanged_renders_the_client_bytes::<Anthropic>(native, &neutral));

        let counter = TokenCounter::new();
        if let Some((sent, _)) = rewritten::<Anthropic>(&client, frac, strat, &counter) {
            let msgs = sent["messages"].as_array().unwrap();
            prop_assert_eq!(check_sequence(msgs), Ok(()), "{}", serde_json::to_string_pretty(msgs).unwrap());
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
            // Deterministic: a fresh parse of the same bytes and a fresh counter give the same bytes.
            let again: Value = serde_json::from_str(&client.to_string()).unwrap();
            let (sent2, _) = rewritten::<Anthropic>(&again, frac, strat, &TokenCounter::new()).unwrap();
            prop_assert_eq!(sent.to_string(), sent2.to_string());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any arguments the engine puts in place of past calls' (tool-input clearing) give a valid request that
    /// differs from the same rewrite without them only in those calls' `input`: the new arguments when they are a
    /// JSON object, the client's input otherwise.
    #[test]
    fn replaced_arguments_give_valid_requests(
        c in conv(),
        frac in 0.15f64..1.4,
        strat in 0..3u8,
        args in prop::collection::vec(prop::option::of(new_arguments()), 0..12),
    ) {
        let client = build(&c);
        let counter = TokenCounter::new();
        if let Some((plain, _, _)) = rewritten_with::<Anthropic>(&client, frac, strat, &counter, &[]) {
            let (sent, _, replaced) = rewritten_with::<Anthropic>(&client, frac, strat, &counter, &args).unwrap();
            let msgs = sent["messages"].as_array().unwrap();
            prop_assert_eq!(check_sequence(msgs), Ok(()), "{}", serde_json::to_string_pretty(msgs).unwrap());
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
            let mut expected = plain;
            for m in expected["messages"].as_array_mut().unwrap() {
                for b in m["content"].as_array_mut().into_iter().flatten() {
                    let id = b["id"].as_str().unwrap_or("").to_owned();
                    let new = replaced.iter().find(|(r, _)| *r == id && b["type"] == "tool_use");
                    if let Some(Ok(v @ Value::Object(_))) = new.map(|(_, a)| serde_json::from_str::<Value>(a)) {
                        b["input"] = v;
                    }
                }
            }
            prop_assert_eq!(sent.to_string(), expected.to_string());
        }
    }
}

/// The property test's generator does reach rewrites of every kind (so the test above checks something): summaries,
/// cleared results, and rebuilt assistant messages carrying thinking.
#[test]
fn the_generator_reaches_rewrites_of_every_kind() {
    let counter = TokenCounter::new();
    let (mut rewrites, mut summaries, mut cleared, mut thinking) = (0, 0, 0, 0);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..40 {
        let c = conv().new_tree(&mut runner).unwrap().current();
        let client = build(&c);
        let native = client["messages"].as_array().unwrap();
        for (strat, frac) in [(0, 0.4), (0, 0.8), (1, 0.4), (2, 0.4)] {
            let Some((sent, s)) = rewritten::<Anthropic>(&client, frac, strat, &counter) else {
                continue;
            };
            rewrites += 1;
            summaries += usize::from(s);
            for m in sent["messages"].as_array().unwrap() {
                if native.contains(m) {
                    continue;
                }
                let blocks = m["content"].as_array().into_iter().flatten();
                let types: Vec<&str> = blocks.filter_map(|b| b["type"].as_str()).collect();
                cleared += usize::from(types.contains(&"tool_result"));
                thinking += usize::from(m["role"] == "assistant" && types.contains(&"thinking"));
            }
        }
    }
    assert!(rewrites >= 40, "{rewrites} rewrites");
    assert!(summaries >= 5, "{summaries} summarized");
    assert!(cleared >= 5, "{cleared} messages with cleared results");
    assert!(
        thinking >= 1,
        "{thinking} rebuilt assistant messages with thinking"
    );
}
