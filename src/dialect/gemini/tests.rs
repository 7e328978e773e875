//! Property tests: random valid Gemini conversations (parallel function calls with and without ids, thought parts
//! and thought signatures, inline data, text after function responses, long outputs, Gemini CLI's
//! `<session_context>` opening) through the real planner with a window small enough to make it rewrite: every
//! rewrite is valid by Google's rules and keeps what it must (signatures byte-exact), a plan that changes nothing
//! renders the client's bytes; and the stream splice, event for event.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::convert::{from_neutral, to_neutral, Neutral};
use super::splice::StreamSplicer;
use super::validate::{check_rewrite, check_sequence};
use crate::config::RecallConfig;
use crate::context::plan::Rewrite;
use crate::context::tokens::TokenCounter;
use crate::dialect::shared::test_support::{
    new_arguments, rewritten, rewritten_with, unchanged_renders_the_client_bytes, words, Harness,
};
use crate::dialect::shared::{RoundEnd, StreamSplice};
use crate::dialect::{Dialect, InjectedNames};
use crate::message::Source;
use crate::sse::{SseEvent, SseParser};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Value};
use std::borrow::Cow;

#[derive(Debug, Clone)]
struct Round {
    calls: usize,
    ids: bool,
    thought: bool,
    text: bool,
    long: bool,
    inline: bool,
}

#[derive(Debug, Clone)]
struct Conv {
    system: bool,
    turns: Vec<(Vec<Round>, bool)>,
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
        any::<bool>(),
    )
        .prop_map(|(calls, ids, thought, text, long, inline)| Round {
            calls,
            ids,
            thought,
            text,
            long,
            inline,
        })
}

fn conv() -> impl Strategy<Value = Conv> {
    let turn = (prop::collection::vec(round(), 0..4), any::<bool>());
    (
        any::<bool>(),
        prop::collection::vec(turn, 1..7),
        any::<bool>(),
        20..400usize,
    )
        .prop_map(|(system, turns, end_in_loop, words)| Conv {
            system,
            turns,
            end_in_loop,
            words,
        })
}

/// The client's body for a conversation spec: every content valid for the Gemini API.
fn build(c: &Conv) -> Value {
    let mut contents: Vec<Value> = Vec::new();
    let last = c.turns.len() - 1;
    for (t, (rounds, final_thought)) in c.turns.iter().enumerate() {
        let mut opener = vec![json!({"text": format!("task {t}: {}", words("ask", 12))})];
        if t == 0 {
            opener.insert(
                0,
                json!({"text": "<session_context>today; linux; /work</session_context>"}),
            );
        }
        contents.push(json!({"role": "user", "parts": opener}));
        for (r, round) in rounds.iter().enumerate() {
            let tag = format!("t{t}r{r}");
            let mut parts = Vec::new();
            if round.thought {
                parts.push(json!({"text": format!("thinking {tag}"), "thought": true}));
            }
            if round.text {
                parts.push(json!({"text": format!("Looking at {tag}.")}));
            }
            let mut responses = Vec::new();
            for k in 0..round.calls {
                let name = if k % 2 == 0 {
                    "read_file"
                } else {
                    "run_shell_command"
                };
                let mut call = json!({"name": name, "args": {"path": format!("src/{tag}_{k}.rs")}});
                if round.ids {
                    call["id"] = json!(format!("{tag}c{k}"));
                }
                let mut part = json!({"functionCall": call});
                if k == 0 {
                    part["thoughtSignature"] = json!(format!("CiQB{tag}sig=="));
                }
                parts.push(part);
                let n = if round.long { c.words * 6 } else { c.words };
                let mut resp =
                    json!({"name": name, "response": {"output": words(&format!("{tag}o{k}w"), n)}});
                if round.ids {
                    resp["id"] = json!(format!("{tag}c{k}"));
                }
                responses.push(json!({"functionResponse": resp}));
            }
            contents.push(json!({"role": "model", "parts": parts}));
            if round.inline {
                responses
                    .push(json!({"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}));
            }
            contents.push(json!({"role": "user", "parts": responses}));
        }
        if t == last && c.end_in_loop && !rounds.is_empty() {
            break;
        }
        let mut parts = Vec::new();
        if *final_thought {
            parts.push(json!({"text": "wrapping up", "thought": true}));
        }
        parts.push(json!({"text": format!("Done with task {t}. {}", words("fin", 30))}));
        contents.push(json!({"role": "model", "parts": parts}));
    }
    if contents.last().is_some_and(|c| c["role"] == "model") {
        contents.push(json!({"role": "user", "parts": [{"text": "And now?"}]}));
    }
    let mut body = json!({"contents": contents, "generationConfig": {"temperature": 0}});
    if c.system {
        body["systemInstruction"] =
            json!({"role": "user", "parts": [{"text": "You are Gemini CLI."}]});
    }
    body["tools"] = json!([{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {"type": "object"}}]}]);
    body
}

/// The Gemini API as the property tests drive it (`props.rs` too).
pub(super) struct Gemini;

impl Harness for Gemini {
    const DIALECT: Dialect = Dialect::Gemini;
    const SYSTEM: &'static str = "systemInstruction";
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

    /// The recall note where the gateway puts it for a dialect without strict roles: right after the last message
    /// the rewrite changed, at the end of its unit (`Rewrite::note_at`).
    fn add_note(rw: &Rewrite<'_>, out: &mut Vec<Cow<'_, Value>>, sources: &mut Vec<Source>) {
        let at = rw.note_at.min(out.len());
        let note = json!({"role":"system","content":"Results of earlier tool calls were left out; recall them."});
        out.insert(at, Cow::Owned(note));
        sources.insert(at, Source::Added);
    }
}

/// Every thought signature of a body, with the part it is on.
fn signed(body: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for c in body["contents"].as_array().into_iter().flatten() {
        for p in c["parts"].as_array().into_iter().flatten() {
            if let Some(s) = p["thoughtSignature"].as_str() {
                out.push((s.to_string(), p["functionCall"]["name"].clone()));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn rewrites_of_valid_conversations_are_valid(c in conv(), frac in 0.15f64..1.4, strat in 0..3u8) {
        let client = build(&c);
        let native = client["contents"].as_array().unwrap();
        prop_assert_eq!(check_sequence(native), Ok(()), "the generator makes valid conversations");
        let neutral = to_neutral(client.get("systemInstruction"), native);
        prop_assert_eq!(crate::context::units::check_sequence(&neutral.messages), Ok(()));
        // An unchanged plan renders the client's bytes.
        prop_assert!(unchanged_renders_the_client_bytes::<Gemini>(native, &neutral));

        let counter = TokenCounter::new();
        if let Some((sent, _)) = rewritten::<Gemini>(&client, frac, strat, &counter) {
            let contents = sent["contents"].as_array().unwrap();
            prop_assert_eq!(check_sequence(contents), Ok(()), "{}", serde_json::to_string_pretty(contents).unwrap());
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
            // every signature sent is the client's, on the call it came with
            let theirs = signed(&client);
            for s in signed(&sent) {
                prop_assert!(theirs.contains(&s), "{:?}", s);
            }
            let again: Value = serde_json::from_str(&client.to_string()).unwrap();
            let (sent2, _) = rewritten::<Gemini>(&again, frac, strat, &TokenCounter::new()).unwrap();
            prop_assert_eq!(sent.to_string(), sent2.to_string());
        }
    }

    /// Any arguments the engine puts in place of past calls' (tool-input clearing) give a valid request.
    #[test]
    fn replaced_arguments_give_valid_requests(
        c in conv(),
        frac in 0.15f64..1.4,
        strat in 0..3u8,
        args in prop::collection::vec(prop::option::of(new_arguments()), 0..12),
    ) {
        let client = build(&c);
        let counter = TokenCounter::new();
        if let Some((sent, _, _)) = rewritten_with::<Gemini>(&client, frac, strat, &counter, &args) {
            let contents = sent["contents"].as_array().unwrap();
            prop_assert_eq!(check_sequence(contents), Ok(()), "{}", serde_json::to_string_pretty(contents).unwrap());
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
        }
    }
}

/// The generator reaches rewrites of every kind: summaries, cleared responses, rebuilt model contents (cleared
/// call inputs) that keep a signature.
#[test]
fn the_generator_reaches_rewrites_of_every_kind() {
    let counter = TokenCounter::new();
    let (mut rewrites, mut summaries, mut cleared, mut signed_rebuilt) = (0, 0, 0, 0);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..40 {
        let c = conv().new_tree(&mut runner).unwrap().current();
        let client = build(&c);
        let native = client["contents"].as_array().unwrap();
        for (strat, frac) in [(0, 0.4), (0, 0.8), (1, 0.4), (2, 0.4)] {
            // the first calls' inputs cleared, as tool-input clearing does
            let args = vec![Some("{\"cleared\":true}".to_string()); 3];
            let Some((sent, s, _)) =
                rewritten_with::<Gemini>(&client, frac, strat, &counter, &args)
            else {
                continue;
            };
            rewrites += 1;
            summaries += usize::from(s);
            for c in sent["contents"].as_array().unwrap() {
                if native.contains(c) {
                    continue;
                }
                let text = c.to_string();
                cleared += usize::from(text.contains("functionResponse"));
                signed_rebuilt +=
                    usize::from(c["role"] == "model" && text.contains("thoughtSignature"));
            }
        }
    }
    assert!(rewrites >= 40, "{rewrites} rewrites");
    assert!(summaries >= 5, "{summaries} summarized");
    assert!(cleared >= 5, "{cleared} contents with cleared responses");
    assert!(
        signed_rebuilt >= 1,
        "{signed_rebuilt} rebuilt model contents with a signature"
    );
}

fn names() -> InjectedNames {
    InjectedNames::from_config(&RecallConfig::default())
}

/// A stream of `n` text chunks then a finishing chunk (a function call of the client's when `call`).
fn stream(texts: &[String], call: bool) -> Vec<Value> {
    let mut out: Vec<Value> = texts
        .iter()
        .map(|t| json!({"candidates":[{"content":{"role":"model","parts":[{"text":t}]},"index":0}],
            "usageMetadata":{"promptTokenCount":7},"modelVersion":"gemini-2.5-flash","responseId":"r-1"}))
        .collect();
    let mut parts = vec![];
    if call {
        parts.push(json!({"functionCall":{"id":"c","name":"read_file","args":{"path":"a"}},"thoughtSignature":"S"}));
    }
    out.push(json!({"candidates":[{"content":{"role":"model","parts":parts},"finishReason":"STOP","index":0}],
        "usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":3,"totalTokenCount":10},"responseId":"r-1"}));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A stream that calls none of ctxgate's tools reaches the client event for event, each `data:` as it came.
    #[test]
    fn a_stream_without_our_calls_is_relayed_event_for_event(
        texts in prop::collection::vec("[a-zA-Z0-9 .,\u{e9}\u{4e2d}]{0,20}", 0..6),
        call in any::<bool>(),
    ) {
        let chunks = stream(&texts, call);
        let mut s = StreamSplicer::new(names());
        let mut out = Vec::new();
        let events: Vec<SseEvent> = chunks.iter().map(|c| SseEvent { event: None, data: c.to_string() }).collect();
        for ev in &events {
            out.extend(s.on_event(ev));
        }
        let RoundEnd::Finish(tail) = s.end_round(true) else { panic!("no call of ours: the stream ends") };
        out.extend(tail);
        let all: Vec<u8> = out.iter().flat_map(|b| b.to_vec()).collect();
        let got: Vec<String> = SseParser::new().feed(&all).into_iter().map(|e| e.data).collect();
        let want: Vec<String> = events.into_iter().map(|e| e.data).collect();
        prop_assert_eq!(got, want);
    }

    /// A recall round in the middle of a stream: the client's events are the first round's text, then the second
    /// round's, with no trace of ctxgate's call, one finishing chunk, and the usage summed.
    #[test]
    fn a_recall_round_is_spliced_out(
        before in prop::collection::vec("[a-z ]{1,12}", 0..4),
        after in prop::collection::vec("[a-z ]{1,12}", 1..4),
    ) {
        let mut s = StreamSplicer::new(names());
        let mut out = Vec::new();
        let mut first = stream(&before, false);
        first.last_mut().unwrap()["candidates"][0]["content"]["parts"] =
            json!([{"functionCall":{"id":"r","name":"recall_tool_call","args":{"call_id":"c1"}},"thoughtSignature":"T"}]);
        for c in &first {
            out.extend(s.on_event(&SseEvent { event: None, data: c.to_string() }));
        }
        let RoundEnd::Continue { calls, assistant } = s.end_round(true) else { panic!("our call continues") };
        prop_assert_eq!(calls.len(), 1);
        prop_assert_eq!(&assistant["parts"].as_array().unwrap().last().unwrap()["thoughtSignature"], "T");
        for c in &stream(&after, false) {
            out.extend(s.on_event(&SseEvent { event: None, data: c.to_string() }));
        }
        let RoundEnd::Finish(tail) = s.end_round(true) else { panic!("a text answer ends") };
        out.extend(tail);
        let all: Vec<u8> = out.iter().flat_map(|b| b.to_vec()).collect();
        let got: Vec<Value> = SseParser::new().feed(&all).into_iter().map(|e| serde_json::from_str(&e.data).unwrap()).collect();
        let text: String = got.iter()
            .flat_map(|c| c["candidates"][0]["content"]["parts"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["text"].as_str().map(str::to_string))
            .collect();
        prop_assert_eq!(text, format!("{}{}", before.concat(), after.concat()));
        prop_assert!(!all.windows(16).any(|w| w == b"recall_tool_call"));
        let finishing: Vec<&Value> = got.iter().filter(|c| c["candidates"][0].get("finishReason").is_some()).collect();
        prop_assert_eq!(finishing.len(), 1);
        prop_assert_eq!(&got.last().unwrap()["usageMetadata"]["promptTokenCount"], 14);
    }
}
