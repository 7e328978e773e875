//! Property tests: random valid Responses inputs (messages with phase, parallel function and custom tool calls with
//! reasoning items carrying encrypted content, long outputs, compaction and unknown items, developer messages)
//! through the real planner with a window small enough to make it rewrite.

use super::super::convert::{from_neutral, to_neutral, Neutral};
use super::super::validate::{check_rewrite, check_roles, check_sequence};
use crate::context::plan::Rewrite;
use crate::context::tokens::TokenCounter;
use crate::dialect::shared::test_support::{
    new_arguments, rewritten, rewritten_with, unchanged_renders_the_client_bytes, words, Harness,
};
use crate::dialect::Dialect;
use crate::message::Source;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Value};
use std::borrow::Cow;

#[derive(Debug, Clone)]
struct Round {
    calls: usize,
    reasoning: bool,
    text: bool,
    custom: bool,
    long: bool,
    opaque_in_loop: bool,
}

#[derive(Debug, Clone)]
struct Turn {
    developer: bool,
    opaque: u8,
    parts: bool,
    rounds: Vec<Round>,
    final_reasoning: bool,
}

#[derive(Debug, Clone)]
struct Conv {
    instructions: bool,
    compaction: bool,
    turns: Vec<Turn>,
    end_in_loop: bool,
    words: usize,
}

fn round() -> impl Strategy<Value = Round> {
    (
        1..=3usize,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(calls, reasoning, text, custom, long, o)| Round {
            calls,
            reasoning,
            text,
            custom,
            long,
            opaque_in_loop: o % 8 == 0,
        })
}

fn turn() -> impl Strategy<Value = Turn> {
    (
        any::<bool>(),
        0..4u8,
        any::<bool>(),
        prop::collection::vec(round(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(developer, opaque, parts, rounds, final_reasoning)| Turn {
            developer,
            opaque,
            parts,
            rounds,
            final_reasoning,
        })
}

fn conv() -> impl Strategy<Value = Conv> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(turn(), 1..7),
        any::<bool>(),
        20..400usize,
    )
        .prop_map(
            |(instructions, compaction, turns, end_in_loop, words)| Conv {
                instructions,
                compaction,
                turns,
                end_in_loop,
                words,
            },
        )
}

fn reasoning(tag: &str) -> Value {
    json!({"type":"reasoning","id":format!("rs_{tag}"),"summary":[{"type":"summary_text","text":format!("plan {tag}")}],
        "encrypted_content":format!("gAAAAB{tag}enc==")})
}

/// The client's body for a spec: an input valid for the Responses API.
fn build(c: &Conv) -> Value {
    let mut items: Vec<Value> = Vec::new();
    if c.compaction {
        items.push(
            json!({"type":"compaction","id":"cmp_1","encrypted_content":"gAAAAcompactedhistory=="}),
        );
    }
    let last_turn = c.turns.len() - 1;
    for (t, turn) in c.turns.iter().enumerate() {
        if turn.developer && t > 0 {
            items.push(json!({"type":"message","role":"developer","content":[{"type":"input_text","text":format!("Reminder {t}.")}]}));
        }
        match turn.opaque {
            1 => items.push(json!({"type":"item_reference","id":format!("msg_ref{t}")})),
            2 => {
                items.push(json!({"type":"future_thing","payload":{"note":format!("opaque {t}")}}))
            }
            _ => {}
        }
        let q = format!("question {t} {}", words("q", c.words / 8));
        items.push(if turn.parts {
            json!({"type":"message","role":"user","content":[{"type":"input_text","text":q},{"type":"input_image","image_url":"data:image/png;base64,iVBOR"}]})
        } else {
            json!({"role":"user","content":q})
        });
        for (r, round) in turn.rounds.iter().enumerate() {
            let tag = format!("{t}_{r}");
            if round.reasoning {
                items.push(reasoning(&tag));
            }
            if round.text {
                items.push(
                    json!({"type":"message","role":"assistant","phase":"commentary",
                    "content":[{"type":"output_text","text":format!("Let me look ({tag}).")}]}),
                );
            }
            let ids: Vec<String> = (0..round.calls)
                .map(|k| format!("call_{tag}_{k}"))
                .collect();
            for (k, id) in ids.iter().enumerate() {
                if round.custom && k == 0 {
                    items.push(json!({"type":"custom_tool_call","call_id":id,"name":"apply_patch","input":format!("*** Begin Patch {id}")}));
                } else {
                    items.push(json!({"type":"function_call","call_id":id,"name":"read_file","arguments":format!("{{\"path\":\"src/{id}.rs\"}}")}));
                }
            }
            let n = if round.long { c.words * 4 } else { c.words / 4 };
            for (k, id) in ids.iter().enumerate() {
                let t = if round.custom && k == 0 {
                    "custom_tool_call_output"
                } else {
                    "function_call_output"
                };
                items.push(
                    json!({"type":t,"call_id":id,"output":format!("{id}: {}", words("w", n))}),
                );
                if round.opaque_in_loop && k == 0 {
                    items.push(json!({"type":"future_thing","payload":format!("in loop {tag}")}));
                }
            }
        }
        let in_flight = t == last_turn && c.end_in_loop && !turn.rounds.is_empty();
        if !in_flight {
            if turn.final_reasoning {
                items.push(reasoning(&format!("{t}_f")));
            }
            items.push(json!({"type":"message","role":"assistant","phase":"final_answer",
                "content":[{"type":"output_text","text":format!("answer {t} {}", words("a", c.words / 4)),"annotations":[]}]}));
            if t == last_turn {
                items.push(json!({"role":"user","content":"thanks, and next?"}));
            }
        }
    }
    let mut body = json!({"model":"gpt-5-codex"});
    if c.instructions {
        body["instructions"] = json!("You are Codex.");
    }
    body["input"] = Value::Array(items);
    body["tools"] = json!([{"type":"function","name":"read_file","parameters":{"type":"object"}},
        {"type":"custom","name":"apply_patch"}]);
    body["reasoning"] = json!({"effort":"medium","summary":"auto"});
    body["store"] = json!(false);
    body["include"] = json!(["reasoning.encrypted_content"]);
    body["prompt_cache_key"] = json!("session-1");
    body["stream"] = json!(true);
    body
}

/// The Responses API as the property tests drive it.
pub(super) struct Responses;

impl Harness for Responses {
    const DIALECT: Dialect = Dialect::Responses;
    const SYSTEM: &'static str = "instructions";
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
        json!({"role":"system","content":format!("{}the first {upto} messages.", crate::summary::prompt::SUMMARY_PREFIX)})
    }

    fn summarized(rewrite: &Rewrite<'_>) -> bool {
        rewrite.record.stages.contains(&"summarized")
    }

    /// The recall note, at the end of the message the planner names (strict role order).
    fn add_note(rewrite: &Rewrite<'_>, out: &mut Vec<Cow<'_, Value>>, _: &mut Vec<Source>) {
        let note = "[ctxgate] Results of earlier tool calls were left out; recall them.";
        if let Some(m) = rewrite.note_in.and_then(|k| out.get_mut(k)) {
            *m = Cow::Owned(crate::context::roles::with_text_last(m, note));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn rewrites_of_valid_inputs_are_valid(c in conv(), frac in 0.15f64..1.4, strat in 0..3u8) {
        let client = build(&c);
        let native = client["input"].as_array().unwrap();
        prop_assert_eq!(check_sequence(native), Ok(()), "the generator makes valid inputs");
        let neutral = to_neutral(client.get("instructions"), native);
        prop_assert_eq!(crate::context::units::check_sequence(&neutral.messages), Ok(()));

        // An unchanged plan renders the client's bytes.
        prop_assert!(unchanged_renders_the_client_bytes::<Responses>(native, &neutral));

        let counter = TokenCounter::new();
        if let Some((sent, _)) = rewritten::<Responses>(&client, frac, strat, &counter) {
            let items = sent["input"].as_array().unwrap();
            prop_assert_eq!(check_sequence(items), Ok(()), "{}", serde_json::to_string_pretty(items).unwrap());
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
            prop_assert_eq!(check_roles(native, items), Ok(()), "strict role order");
            // The compaction item is never dropped, and stays before everything that followed it.
            if c.compaction {
                prop_assert_eq!(&items[0], &native[0]);
            }
            let again: Value = serde_json::from_str(&client.to_string()).unwrap();
            let (sent2, _) = rewritten::<Responses>(&again, frac, strat, &TokenCounter::new()).unwrap();
            prop_assert_eq!(sent.to_string(), sent2.to_string());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any arguments the engine puts in place of past calls' (tool-input clearing) give a valid request that
    /// differs from the same rewrite without them only in those calls' `arguments` (function calls) or `input`
    /// (custom tool calls), which are the new strings.
    #[test]
    fn replaced_arguments_give_valid_requests(
        c in conv(),
        frac in 0.15f64..1.4,
        strat in 0..3u8,
        args in prop::collection::vec(prop::option::of(new_arguments()), 0..12),
    ) {
        let client = build(&c);
        let counter = TokenCounter::new();
        if let Some((plain, _, _)) = rewritten_with::<Responses>(&client, frac, strat, &counter, &[]) {
            let (sent, _, replaced) = rewritten_with::<Responses>(&client, frac, strat, &counter, &args).unwrap();
            let items = sent["input"].as_array().unwrap();
            prop_assert_eq!(check_sequence(items), Ok(()), "{}", serde_json::to_string_pretty(items).unwrap());
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
            let mut expected = plain;
            for it in expected["input"].as_array_mut().unwrap() {
                let key = match it["type"].as_str() {
                    Some("function_call") => "arguments",
                    Some("custom_tool_call") => "input",
                    _ => continue,
                };
                if let Some((_, a)) = replaced.iter().find(|(id, _)| it["call_id"] == id.as_str()) {
                    it[key] = json!(a);
                }
            }
            prop_assert_eq!(sent.to_string(), expected.to_string());
        }
    }
}

/// The generator does reach rewrites of every kind (so the test above checks something): summaries, cleared
/// outputs, left-out reasoning, rebuilt assistant messages.
#[test]
fn the_generator_reaches_rewrites_of_every_kind() {
    let counter = TokenCounter::new();
    let (mut rewrites, mut summaries, mut cleared, mut dropped_reasoning) = (0, 0, 0, 0);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..40 {
        let c = conv().new_tree(&mut runner).unwrap().current();
        let client = build(&c);
        let native = client["input"].as_array().unwrap();
        for (strat, frac) in [(0, 0.4), (0, 0.8), (1, 0.4), (2, 0.4)] {
            let Some((sent, s)) = rewritten::<Responses>(&client, frac, strat, &counter) else {
                continue;
            };
            rewrites += 1;
            summaries += usize::from(s);
            let items = sent["input"].as_array().unwrap();
            cleared += items
                .iter()
                .filter(|m| m["type"] == "function_call_output" && !native.contains(m))
                .count();
            let rs = |v: &[Value]| v.iter().filter(|m| m["type"] == "reasoning").count();
            dropped_reasoning += usize::from(rs(items) < rs(native));
        }
    }
    assert!(rewrites >= 40, "{rewrites} rewrites");
    assert!(summaries >= 5, "{summaries} summarized");
    assert!(cleared >= 5, "{cleared} cleared outputs");
    assert!(
        dropped_reasoning >= 1,
        "{dropped_reasoning} rewrites leaving reasoning out"
    );
}
