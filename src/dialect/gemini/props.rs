//! Property tests: random valid Gemini CLI-like conversations (parallel calls with and without ids, responses
//! matched by name, signed calls and answers, thoughts, Gemini CLI's `{output}` responses and other JSON) through
//! the real planner with a window small enough to make it rewrite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::convert::{parts_of, to_neutral};
use super::tests::Gemini;
use super::validate::{check_rewrite, check_sequence};
use crate::context::tokens::TokenCounter;
use crate::dialect::shared::test_support::{
    new_arguments, rewritten_with, unchanged_renders_the_client_bytes, words, Harness,
};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

// ---- property tests ----

#[derive(Debug, Clone)]
struct Round {
    calls: usize,
    ids: bool,
    signed: bool,
    thought: bool,
    text: bool,
    long: bool,
    cli_shape: bool,
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
        any::<bool>(),
    )
        .prop_map(
            |(calls, ids, signed, thought, text, long, cli_shape)| Round {
                calls,
                ids,
                signed,
                thought,
                text,
                long,
                cli_shape,
            },
        )
}

fn conv() -> impl Strategy<Value = Conv> {
    (
        any::<bool>(),
        prop::collection::vec((prop::collection::vec(round(), 0..4), any::<bool>()), 1..6),
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

/// The client's body for a conversation spec: valid for the Gemini API, as Gemini CLI sends it.
fn build(c: &Conv) -> Value {
    let mut contents: Vec<Value> = Vec::new();
    let last = c.turns.len() - 1;
    for (t, (rounds, signed_answer)) in c.turns.iter().enumerate() {
        let mut opener = vec![json!({"text":format!("task {t}: {}", words("w", c.words / 4))})];
        if t == 0 {
            opener.insert(
                0,
                json!({"text":"<session_context>cwd /repo</session_context>"}),
            );
        }
        contents.push(json!({"role":"user","parts":opener}));
        for (r, round) in rounds.iter().enumerate() {
            let tag = format!("{t}_{r}");
            let mut parts = Vec::new();
            if round.thought {
                parts.push(json!({"text":format!("thinking {tag}"),"thought":true}));
            }
            if round.text {
                parts.push(json!({"text":format!("calling {tag}")}));
            }
            for k in 0..round.calls {
                let mut fc =
                    json!({"name":format!("tool{}", k % 2),"args":{"path":format!("f{tag}_{k}")}});
                if round.ids {
                    fc["id"] = json!(format!("id{tag}_{k}"));
                }
                let mut part = json!({ "functionCall": fc });
                if round.signed && k == 0 {
                    part["thoughtSignature"] = json!(format!("CiQB{tag}sig=="));
                }
                parts.push(part);
            }
            contents.push(json!({"role":"model","parts":parts}));
            let n = if round.long { c.words * 4 } else { c.words / 8 };
            // Responses in reverse order: matched by id or by name and position.
            let mut responses = Vec::new();
            for k in (0..round.calls).rev() {
                let output = format!("out {tag}_{k} {}", words("r", n));
                let response = if round.cli_shape {
                    json!({"output":output})
                } else {
                    json!({"result":output,"ok":true})
                };
                let mut fr = json!({"name":format!("tool{}", k % 2),"response":response});
                if round.ids {
                    fr["id"] = json!(format!("id{tag}_{k}"));
                }
                responses.push(json!({ "functionResponse": fr }));
            }
            if !round.ids {
                // Without ids, calls of one name are answered in their order.
                responses.sort_by_key(|r| r["functionResponse"]["response"].to_string());
            }
            contents.push(json!({"role":"user","parts":responses}));
        }
        let in_flight = t == last && c.end_in_loop && !rounds.is_empty();
        if !in_flight {
            let mut answer = json!({"text":format!("answer {t} {}", words("a", c.words / 4))});
            if *signed_answer {
                answer["thoughtSignature"] = json!(format!("EqAnswer{t}=="));
            }
            contents.push(json!({"role":"model","parts":[answer]}));
            if t == last {
                contents.push(json!({"role":"user","parts":[{"text":"thanks, and next?"}]}));
            }
        }
    }
    let mut body = Map::new();
    body.insert("contents".into(), Value::Array(contents));
    if c.system {
        body.insert(
            "systemInstruction".into(),
            json!({"role":"user","parts":[{"text":"You are Gemini CLI."}]}),
        );
    }
    body.insert(
        "generationConfig".into(),
        json!({"temperature":0,"thinkingConfig":{"includeThoughts":true}}),
    );
    body.insert(
        "tools".into(),
        json!([{"functionDeclarations":[{"name":"tool0","parametersJsonSchema":{"type":"object"}},{"name":"tool1"}]}]),
    );
    Value::Object(body)
}

/// The body sent upstream for `client` after planning (with `args` given to the rewrite's calls), its contents
/// put back under `contents` in the client's field order. The harness reads the conversation under the dialect's
/// key, which is `contents` once the dialect is wired.
fn sent_for(
    client: &Value,
    frac: f64,
    strat: u8,
    args: &[Option<String>],
) -> Option<(Value, Vec<(String, String)>)> {
    let key = Gemini::DIALECT.conversation_key();
    let mut keyed = client.clone();
    keyed[key] = client["contents"].clone();
    let (sent, _, replaced) =
        rewritten_with::<Gemini>(&keyed, frac, strat, &TokenCounter::new(), args)?;
    let mut out = client.clone();
    out["contents"] = sent[key].clone();
    Some((out, replaced))
}

/// Every signature sent is one of the client's, on a byte-identical part unless it is a call whose args changed.
fn signatures_exact(client: &[Value], sent: &[Value]) -> Result<(), String> {
    let client_parts: Vec<&Value> = client.iter().flat_map(parts_of).collect();
    for p in sent.iter().flat_map(parts_of) {
        let Some(sig) = p.get("thoughtSignature") else {
            continue;
        };
        let Some(orig) = client_parts
            .iter()
            .find(|c| c.get("thoughtSignature") == Some(sig))
        else {
            return Err(format!("signature {sig} is not the client's"));
        };
        let same_call = p.get("functionCall").is_some()
            && p["functionCall"]["name"] == orig["functionCall"]["name"]
            && p["functionCall"].get("id") == orig["functionCall"].get("id");
        if *orig != p && !same_call {
            return Err(format!("signature {sig} moved or its part changed"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn rewrites_of_valid_conversations_are_valid(c in conv(), frac in 0.15f64..1.4, strat in 0..3u8) {
        let client = build(&c);
        let native = client["contents"].as_array().unwrap();
        prop_assert_eq!(check_sequence(native), Ok(()), "the generator makes valid conversations");
        let neutral = to_neutral(client.get("systemInstruction"), native);
        prop_assert_eq!(crate::context::units::check_sequence(&neutral.messages), Ok(()));
        prop_assert!(unchanged_renders_the_client_bytes::<Gemini>(native, &neutral));
        if let Some((sent, _)) = sent_for(&client, frac, strat, &[]) {
            let contents = sent["contents"].as_array().unwrap();
            prop_assert_eq!(check_sequence(contents), Ok(()), "{}", serde_json::to_string_pretty(contents).unwrap());
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
            prop_assert_eq!(signatures_exact(native, contents), Ok(()));
            // Deterministic.
            let again: Value = serde_json::from_str(&client.to_string()).unwrap();
            let (sent2, _) = sent_for(&again, frac, strat, &[]).unwrap();
            prop_assert_eq!(sent.to_string(), sent2.to_string());
        }
    }

    #[test]
    fn cleared_inputs_become_args_and_keep_their_signatures(
        c in conv(),
        frac in 0.15f64..1.4,
        strat in 0..3u8,
        args in prop::collection::vec(prop::option::of(new_arguments()), 0..12),
    ) {
        let client = build(&c);
        let native = client["contents"].as_array().unwrap();
        if let Some((sent, replaced)) = sent_for(&client, frac, strat, &args) {
            let contents = sent["contents"].as_array().unwrap();
            prop_assert_eq!(check_sequence(contents), Ok(()));
            prop_assert_eq!(check_rewrite(&client, &sent), Ok(()));
            prop_assert_eq!(signatures_exact(native, contents), Ok(()));
            // Each replaced call is sent with the arguments parsed back (a non-object wrapped), never an invented id.
            let calls: Vec<&Value> = contents
                .iter()
                .flat_map(parts_of)
                .filter_map(|p| p.get("functionCall"))
                .collect();
            for (id, a) in replaced {
                let want = match serde_json::from_str::<Value>(&a) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => json!({"input": a}),
                };
                if id.starts_with("gemini_call_") {
                    prop_assert!(calls.iter().all(|fc| fc.get("id").is_none_or(|i| !i.as_str().unwrap().starts_with("gemini_"))));
                } else if let Some(fc) = calls.iter().find(|fc| fc.get("id").and_then(Value::as_str) == Some(id.as_str())) {
                    // The newest model content is never rewritten: its calls keep their args.
                    if !native.last().is_some_and(|l| parts_of(l).iter().any(|p| p["functionCall"].get("id").and_then(Value::as_str) == Some(id.as_str()))) {
                        prop_assert_eq!(&fc["args"], &want);
                    }
                }
            }
        }
    }
}
