//! Tool-input clearing rendered for Responses: a past call whose neutral arguments the engine replaced goes out
//! with them as its `function_call` `arguments` (a `custom_tool_call`'s `input`), every other field and item
//! (reasoning with encrypted content, messages, outputs) byte-exact and in place.

use super::super::convert::to_neutral;
use super::super::validate::{check_rewrite, check_sequence};
use super::props::Responses;
use crate::dialect::shared::test_support::sent_with;
use serde_json::{json, Value};

const CLEARED: &str = r#"{"cleared":"input removed to save space","call_id":"call_w","tool":"write_file","tokens":7012}"#;

fn client() -> Value {
    let big = "fn main() {}\n".repeat(400);
    let args = json!({"path":"src/main.rs","content":big}).to_string();
    json!({"model":"gpt-5-codex","instructions":"You are Codex.","store":false,
        "tools":[{"type":"function","name":"write_file","parameters":{"type":"object"}},{"type":"custom","name":"apply_patch"}],
        "input":[
        {"role":"user","content":"write main.rs, then patch lib.rs"},
        {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAABenc=="},
        {"type":"message","role":"assistant","phase":"commentary","content":[{"type":"output_text","text":"Writing."}]},
        {"type":"function_call","id":"fc_1","call_id":"call_w","name":"write_file","arguments":args,"status":"completed"},
        {"type":"custom_tool_call","id":"ctc_1","call_id":"call_p","name":"apply_patch","input":"*** Begin Patch\n".repeat(300)},
        {"type":"function_call_output","call_id":"call_w","output":"written"},
        {"type":"custom_tool_call_output","call_id":"call_p","output":"patched"},
        {"type":"message","role":"assistant","phase":"final_answer","content":[{"type":"output_text","text":"Done."}]},
        {"role":"user","content":"thanks, and next?"}]})
}

#[test]
fn cleared_arguments_replace_the_function_call_arguments_and_nothing_else() {
    let client = client();
    let (sent, borrowed) = sent_with::<Responses>(&client, &[(0, CLEARED)]);
    let (ci, si) = (&client["input"], &sent["input"]);
    assert_eq!(si.as_array().unwrap().len(), 9);
    for (i, b) in borrowed.iter().enumerate() {
        assert_eq!(*b, i != 3, "item {i}");
        if i != 3 {
            assert_eq!(si[i].to_string(), ci[i].to_string(), "item {i}");
        }
    }
    let call = si[3].as_object().unwrap();
    assert_eq!(
        call.keys().collect::<Vec<_>>(),
        ["type", "id", "call_id", "name", "arguments", "status"]
    );
    assert_eq!(call["arguments"], CLEARED);
    for k in ["type", "id", "call_id", "name", "status"] {
        assert_eq!(call[k], ci[3][k], "{k}");
    }
    assert_eq!(check_sequence(si.as_array().unwrap()), Ok(()));
    assert_eq!(check_rewrite(&client, &sent), Ok(()));
}

#[test]
fn a_custom_tool_call_gets_the_new_text_as_its_input() {
    let client = client();
    let cleared = r#"{"cleared":"input removed to save space","call_id":"call_p","tool":"apply_patch","tokens":1500}"#;
    let (sent, borrowed) = sent_with::<Responses>(&client, &[(1, cleared)]);
    let si = &sent["input"];
    assert_eq!(borrowed.iter().filter(|b| !**b).count(), 1);
    assert_eq!(si[3].to_string(), client["input"][3].to_string());
    let call = si[4].as_object().unwrap();
    assert_eq!(
        call.keys().collect::<Vec<_>>(),
        ["type", "id", "call_id", "name", "input"]
    );
    assert_eq!(call["input"], cleared);
    assert!(call.get("arguments").is_none());
    assert_eq!(check_sequence(si.as_array().unwrap()), Ok(()));
    assert_eq!(check_rewrite(&client, &sent), Ok(()));
}

#[test]
fn unchanged_arguments_render_the_client_bytes() {
    let client = client();
    let native = client["input"].as_array().unwrap();
    let neutral = to_neutral(client.get("instructions"), native);
    let j = neutral
        .messages
        .iter()
        .position(|m| m.get("tool_calls").is_some())
        .unwrap();
    let same = neutral.messages[j]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap()
        .to_owned();
    let (sent, borrowed) = sent_with::<Responses>(&client, &[(0, &same)]);
    assert!(borrowed.iter().all(|b| *b));
    assert_eq!(sent.to_string(), client.to_string());
}

#[test]
fn the_validator_refuses_arguments_that_are_not_a_string_and_broken_pairs() {
    let client = client();
    let (sent, _) = sent_with::<Responses>(&client, &[(0, CLEARED)]);
    let items = sent["input"].as_array().unwrap();

    let mut parsed = items.clone();
    parsed[3]["arguments"] = serde_json::from_str(CLEARED).unwrap();
    let err = check_sequence(&parsed).unwrap_err();
    assert!(err.contains("not a string"), "{err}");

    let mut custom = items.clone();
    custom[4].as_object_mut().unwrap().remove("input");
    assert!(check_sequence(&custom).is_err());

    let mut orphan = items.clone();
    orphan.remove(3);
    let err = check_sequence(&orphan).unwrap_err();
    assert!(err.contains("call_w"), "{err}");
}
