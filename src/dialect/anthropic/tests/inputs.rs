//! Tool-input clearing rendered for Anthropic: a past call whose neutral arguments the engine replaced goes out
//! with the new arguments as its `tool_use` input, every other field and block (signed thinking, text, markers)
//! byte-exact and in place; arguments that are not a JSON object leave the client's input.

use super::super::convert::to_neutral;
use super::super::validate::{check_rewrite, check_sequence};
use super::props::Anthropic;
use crate::dialect::shared::test_support::sent_with;
use serde_json::{json, Value};

const CLEARED: &str = r#"{"cleared":"input removed to save space","call_id":"toolu_w","tool":"write_file","tokens":7012}"#;

fn client() -> Value {
    let big = "fn main() {}\n".repeat(400);
    json!({"model":"claude-sonnet-4-5","max_tokens":1024,"system":"You are a coding agent.",
        "tools":[{"name":"write_file","input_schema":{"type":"object"}},{"name":"read_file","input_schema":{"type":"object"}}],
        "messages":[
        {"role":"user","content":"write main.rs, then read lib.rs"},
        {"role":"assistant","content":[
            {"type":"thinking","thinking":"I should write the file.","signature":"EqQBCkYIBxgCKkBsig=="},
            {"type":"text","text":"Writing both."},
            {"type":"tool_use","id":"toolu_w","name":"write_file","input":{"path":"src/main.rs","content":big},
             "cache_control":{"type":"ephemeral"}},
            {"type":"tool_use","id":"toolu_r","name":"read_file","input":{"path":"src/lib.rs"}}]},
        {"role":"user","content":[
            {"type":"tool_result","tool_use_id":"toolu_w","content":"written"},
            {"type":"tool_result","tool_use_id":"toolu_r","content":"pub fn lib() {}"}]},
        {"role":"assistant","content":[{"type":"text","text":"Done."}]},
        {"role":"user","content":"thanks, and next?"}]})
}

#[test]
fn cleared_arguments_become_the_tool_use_input_and_nothing_else_changes() {
    let client = client();
    let (sent, borrowed) = sent_with::<Anthropic>(&client, &[(0, CLEARED)]);
    let (cm, sm) = (&client["messages"], &sent["messages"]);
    assert_eq!(sm.as_array().unwrap().len(), 5);
    // Only the assistant message that made the call is rebuilt; the others are the client's own values.
    assert_eq!(borrowed, [true, false, true, true, true]);
    for i in [0, 2, 3, 4] {
        assert_eq!(sm[i].to_string(), cm[i].to_string());
    }
    let (before, after) = (&cm[1]["content"], &sm[1]["content"]);
    // Signed thinking, text and the untouched call: byte-exact, in place.
    for b in [0, 1, 3] {
        assert_eq!(after[b].to_string(), before[b].to_string(), "block {b}");
    }
    let block = after[2].as_object().unwrap();
    assert_eq!(
        block.keys().collect::<Vec<_>>(),
        ["type", "id", "name", "input", "cache_control"]
    );
    assert_eq!(
        block["input"],
        serde_json::from_str::<Value>(CLEARED).unwrap()
    );
    for k in ["type", "id", "name", "cache_control"] {
        assert_eq!(block[k], before[2][k], "{k}");
    }
    assert!(sent.to_string().len() + 4000 < client.to_string().len());
    assert_eq!(check_sequence(sm.as_array().unwrap()), Ok(()));
    assert_eq!(check_rewrite(&client, &sent), Ok(()));
}

#[test]
fn the_second_of_parallel_calls_is_cleared_alone() {
    let client = client();
    let args = r#"{"cleared":"input removed to save space","call_id":"toolu_r","tool":"read_file","tokens":9}"#;
    let (sent, _) = sent_with::<Anthropic>(&client, &[(1, args)]);
    let (before, after) = (
        &client["messages"][1]["content"],
        &sent["messages"][1]["content"],
    );
    assert_eq!(after[2].to_string(), before[2].to_string());
    assert_eq!(after[3]["input"]["call_id"], "toolu_r");
    assert_eq!(after[3]["id"], "toolu_r");
    assert_eq!(check_rewrite(&client, &sent), Ok(()));
}

#[test]
fn unchanged_arguments_render_the_client_bytes() {
    let client = client();
    let native = client["messages"].as_array().unwrap();
    let neutral = to_neutral(client.get("system"), native);
    // The same arguments, re-set: nothing changed, the message is borrowed.
    let args = neutral.messages[2]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap()
        .to_owned();
    let (sent, borrowed) = sent_with::<Anthropic>(&client, &[(0, &args)]);
    assert!(borrowed.iter().all(|b| *b));
    assert_eq!(sent.to_string(), client.to_string());
}

#[test]
fn arguments_that_are_not_an_object_keep_the_client_input() {
    let client = client();
    for args in [
        "not json at all",
        "[1,2]",
        "\"a string\"",
        "42",
        "",
        "{\"open\":",
    ] {
        let (sent, _) = sent_with::<Anthropic>(&client, &[(0, args)]);
        let after = &sent["messages"][1]["content"][2];
        assert_eq!(
            after.to_string(),
            client["messages"][1]["content"][2].to_string(),
            "{args:?}"
        );
        assert_eq!(check_sequence(sent["messages"].as_array().unwrap()), Ok(()));
        assert_eq!(check_rewrite(&client, &sent), Ok(()));
    }
}

#[test]
fn the_validators_refuse_a_bad_input_a_broken_pair_and_a_moved_marker() {
    let client = client();
    let (sent, _) = sent_with::<Anthropic>(&client, &[(0, CLEARED)]);
    let msgs = sent["messages"].as_array().unwrap();

    let mut bad = msgs.clone();
    bad[1]["content"][2]["input"] = json!(CLEARED);
    let err = check_sequence(&bad).unwrap_err();
    assert!(err.contains("input is not an object"), "{err}");

    let mut unanswered = msgs.clone();
    unanswered[2]["content"].as_array_mut().unwrap().remove(0);
    let err = check_sequence(&unanswered).unwrap_err();
    assert!(err.contains("toolu_w"), "{err}");

    let mut renamed = msgs.clone();
    renamed[1]["content"][2]["id"] = json!("toolu_x");
    assert!(check_sequence(&renamed).is_err());

    // The cleared call's marker moved onto the other call.
    let mut moved = sent.clone();
    let blocks = moved["messages"][1]["content"].as_array_mut().unwrap();
    let marker = blocks[2]
        .as_object_mut()
        .unwrap()
        .remove("cache_control")
        .unwrap();
    blocks[3]["cache_control"] = marker;
    let err = check_rewrite(&client, &moved).unwrap_err();
    assert!(err.contains("cache_control"), "{err}");
}
