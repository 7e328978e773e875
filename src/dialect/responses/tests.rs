//! Tests of the Responses conversion and validator: table-driven cases for the tricky shapes (parallel calls with
//! reasoning, cleared outputs, dropped units, truncated text, opaque items inside and outside tool loops, string
//! input), and property tests that run the real planner on random valid inputs.

use super::convert::{from_neutral, input_items, neutral_of, to_neutral, Neutral, Origin};
use super::validate::{check_rewrite, check_sequence};
use crate::context::shape::{placeholder, truncated};
use crate::message::Source;
use serde_json::{json, Value};
use std::borrow::Cow;

mod inputs;
mod props;

fn items() -> Vec<Value> {
    vec![
        json!({"type":"compaction","encrypted_content":"gAAAcompacted"}),
        json!({"role":"user","content":"fix the bug"}),
        json!({"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think"}],"encrypted_content":"gAAAr1"}),
        json!({"type":"message","role":"assistant","phase":"commentary","content":[{"type":"output_text","text":"Looking.","annotations":[]}]}),
        json!({"type":"function_call","call_id":"c1","name":"read","arguments":"{\"p\":1}"}),
        json!({"type":"reasoning","id":"rs_2","summary":[],"encrypted_content":"gAAAr2"}),
        json!({"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin Patch"}),
        json!({"type":"function_call_output","call_id":"c1","output":"file one contents"}),
        json!({"type":"future_item","x":"y"}),
        json!({"type":"custom_tool_call_output","call_id":"c2","output":"patched"}),
        json!({"type":"message","role":"assistant","phase":"final_answer","content":[{"type":"output_text","text":"Done."}]}),
        json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"be terse"}]}),
        json!({"type":"message","role":"user","content":[{"type":"input_text","text":"thanks"},{"type":"input_image","image_url":"data:x"}]}),
    ]
}

fn items_of(n: &Neutral) -> Vec<(usize, usize)> {
    n.origins
        .iter()
        .filter_map(|o| match o {
            Origin::Items { start, end } => Some((*start, *end)),
            Origin::Instructions => None,
        })
        .collect()
}

fn render(native: &[Value], n: &Neutral, out: Vec<Value>, sources: Vec<Source>) -> Vec<Value> {
    let out: Vec<Cow<'_, Value>> = out.into_iter().map(Cow::Owned).collect();
    from_neutral(native, n, &out, &sources)
        .into_iter()
        .map(Cow::into_owned)
        .collect()
}

#[test]
fn the_conversion_groups_parallel_calls_and_keeps_opaque_items_standalone() {
    let it = items();
    assert_eq!(check_sequence(&it), Ok(()));
    let n = to_neutral(Some(&json!("be helpful")), &it);
    assert_eq!(n.origins[0], Origin::Instructions);
    assert_eq!(
        n.messages[0],
        json!({"role":"system","content":"be helpful"})
    );
    assert_eq!(
        items_of(&n),
        [
            (0, 1),
            (1, 2),
            (2, 7),
            (7, 8),
            (8, 10),
            (10, 11),
            (11, 12),
            (12, 13)
        ]
    );
    assert_eq!(
        n.messages[1]["role"], "system",
        "compaction: a system message"
    );
    let a = &n.messages[3];
    assert_eq!(a["content"], "Looking.");
    let ids: Vec<&str> = a["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c1", "c2"]);
    assert_eq!(
        a["tool_calls"][1]["function"]["arguments"],
        "*** Begin Patch"
    );
    assert_eq!(
        n.messages[4],
        json!({"role":"tool","tool_call_id":"c1","content":"file one contents"})
    );
    assert_eq!(
        n.messages[7]["role"], "system",
        "developer: a system message"
    );
    assert_eq!(crate::context::units::check_sequence(&n.messages), Ok(()));
    // Unchanged: every item borrowed.
    let out: Vec<Cow<'_, Value>> = n.messages.iter().map(Cow::Borrowed).collect();
    let src: Vec<Source> = (0..out.len()).map(Source::Client).collect();
    let same = from_neutral(&it, &n, &out, &src);
    assert!(same.iter().all(|m| matches!(m, Cow::Borrowed(_))));
    assert_eq!(
        serde_json::to_string(&same).unwrap(),
        serde_json::to_string(&it).unwrap()
    );
}

#[test]
fn a_cleared_output_keeps_its_item_and_fields() {
    let it = items();
    let n = to_neutral(None, &it);
    let mut out = n.messages.clone();
    out[3] = placeholder(&n.messages[3], "read", Some("recall_tool_call"));
    let sent = render(
        &it,
        &n,
        out.clone(),
        (0..out.len()).map(Source::Client).collect(),
    );
    assert_eq!(sent.len(), it.len());
    assert_eq!(sent[7]["call_id"], "c1");
    assert_eq!(sent[7]["type"], "function_call_output");
    assert_eq!(sent[7]["output"], out[3]["content"]);
    assert_ne!(sent[7], it[7]);
    assert_eq!(
        sent[8], it[8],
        "the opaque item in the loop rides with the next output"
    );
    for (k, (a, b)) in sent.iter().zip(&it).enumerate().filter(|(k, _)| *k != 7) {
        assert_eq!(a, b, "item {k}");
    }
}

#[test]
fn a_dropped_unit_takes_its_reasoning_calls_and_outputs() {
    let it = items();
    let n = to_neutral(None, &it);
    let keep = [0usize, 1, 5, 6, 7];
    let out: Vec<Value> = keep.iter().map(|&j| n.messages[j].clone()).collect();
    let src: Vec<Source> = keep.iter().map(|&j| Source::Client(j)).collect();
    let sent = render(&it, &n, out, src);
    assert_eq!(
        sent,
        [&it[0], &it[1], &it[10], &it[11], &it[12]].map(Clone::clone)
    );
    assert_eq!(check_sequence(&sent), Ok(()));
}

#[test]
fn truncated_text_keeps_part_kind_and_phase() {
    let it = items();
    let n = to_neutral(None, &it);
    let mut out = n.messages.clone();
    out[5] = truncated(&n.messages[5], 2);
    out[2]["content"] = json!("Lo");
    out[7] = truncated(&n.messages[7], 3);
    let sent = render(
        &it,
        &n,
        out.clone(),
        (0..out.len()).map(Source::Client).collect(),
    );
    assert_eq!(sent[10]["phase"], "final_answer");
    assert_eq!(
        sent[10]["content"],
        json!([{"type":"output_text","text":out[5]["content"]}])
    );
    assert_eq!(sent[3]["phase"], "commentary");
    assert_eq!(
        sent[3]["content"],
        json!([{"type":"output_text","text":"Lo"}])
    );
    assert_eq!(sent[2], it[2], "reasoning kept with its message");
    assert_eq!(
        sent[12]["content"][1], it[12]["content"][1],
        "the image is kept"
    );
    assert_eq!(sent[12]["content"][0]["type"], "input_text");
    let client = json!({"model":"m","input":it});
    let mut s = client.clone();
    s["input"] = json!(sent);
    let e = check_rewrite(&client, &s).unwrap_err();
    assert!(e.contains("newest"), "{e}");
    out[7] = n.messages[7].clone();
    let sent = render(
        &it,
        &n,
        out.clone(),
        (0..out.len()).map(Source::Client).collect(),
    );
    s["input"] = json!(sent);
    assert_eq!(check_rewrite(&client, &s), Ok(()));
}

#[test]
fn added_messages_become_developer_items() {
    let it = items();
    let n = to_neutral(Some(&json!("i")), &it);
    let out = vec![
        n.messages[0].clone(),
        json!({"role":"system","content":"Summary so far."}),
        n.messages[8].clone(),
    ];
    let sent = render(
        &it,
        &n,
        out,
        vec![Source::Client(0), Source::Added, Source::Client(8)],
    );
    assert_eq!(
        sent,
        [
            json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"Summary so far."}]}),
            it[12].clone()
        ]
    );
}

#[test]
fn unanswered_calls_and_orphan_outputs_stay_items() {
    let it = vec![
        json!({"role":"user","content":"go"}),
        json!({"type":"function_call","call_id":"a","name":"f","arguments":"{}"}),
        json!({"type":"function_call","call_id":"b","name":"f","arguments":"{}"}),
        json!({"type":"function_call_output","call_id":"a","output":"A"}),
        json!({"role":"user","content":"later"}),
        json!({"type":"function_call_output","call_id":"b","output":"B"}),
        json!({"type":"reasoning","summary":[],"encrypted_content":"e"}),
        json!({"type":"web_search_call","id":"ws","status":"completed"}),
    ];
    let n = to_neutral(None, &it);
    assert_eq!(n.messages[1]["tool_calls"].as_array().unwrap().len(), 1);
    assert_eq!(
        items_of(&n),
        [(0, 1), (1, 3), (3, 4), (4, 5), (5, 6), (6, 8)]
    );
    assert_eq!(crate::context::units::check_sequence(&n.messages), Ok(()));
    // Clearing `a` keeps the unanswered-in-place call `b` with its message.
    let mut out = n.messages.clone();
    out[2] = placeholder(&n.messages[2], "f", None);
    let sent = render(
        &it,
        &n,
        out,
        (0..n.messages.len()).map(Source::Client).collect(),
    );
    assert_eq!(sent.len(), it.len());
    assert_eq!(sent[2], it[2]);
}

#[test]
fn a_string_input_is_one_user_message() {
    let input = json!("hello");
    let items = input_items(Some(&input));
    assert_eq!(items.as_ref(), [json!({"role":"user","content":"hello"})]);
    let n = to_neutral(None, &items);
    assert_eq!(n.messages, [json!({"role":"user","content":"hello"})]);
    assert!(input_items(Some(&json!(3))).is_empty());
}

#[test]
fn the_validator_names_what_is_wrong() {
    let call = json!({"type":"function_call","call_id":"a","name":"f","arguments":"{}"});
    let out = json!({"type":"function_call_output","call_id":"a","output":"x"});
    let rs = json!({"type":"reasoning","summary":[],"encrypted_content":"e"});
    let user = json!({"role":"user","content":"u"});
    let trig = json!({"type":"compaction_trigger"});
    let custom_out = json!({"type":"custom_tool_call_output","call_id":"a","output":"x"});
    assert_eq!(
        check_sequence(&[
            user.clone(),
            rs.clone(),
            call.clone(),
            out.clone(),
            trig.clone()
        ]),
        Ok(())
    );
    for bad in [
        vec![out.clone()],
        vec![out.clone(), call.clone()],
        vec![call.clone(), custom_out],
        vec![call.clone(), call.clone()],
        vec![user.clone(), rs.clone()],
        vec![call.clone(), rs.clone(), out.clone()],
        vec![trig, user.clone()],
    ] {
        assert!(check_sequence(&bad).is_err(), "{bad:?}");
    }
    let client = json!({"model":"m","instructions":"i","input":[user, rs.clone(), call.clone(), out.clone()],
        "tools":[{"type":"function","name":"f"}],"store":false,"include":["reasoning.encrypted_content"]});
    assert_eq!(check_rewrite(&client, &client), Ok(()));
    let mut more_tools = client.clone();
    more_tools["tools"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type":"function","name":"recall"}));
    assert_eq!(check_rewrite(&client, &more_tools), Ok(()));
    let mut changed = client.clone();
    changed["instructions"] = json!("j");
    assert!(check_rewrite(&client, &changed).is_err());
    let mut reordered = json!({"model":"m","input":client["input"].clone()});
    reordered["instructions"] = json!("i");
    assert!(check_rewrite(&client, &reordered).is_err());
    let mut bad_rs = client.clone();
    bad_rs["input"][1]["encrypted_content"] = json!("forged");
    assert!(check_rewrite(&client, &bad_rs).is_err());
    let mut no_last = client.clone();
    no_last["input"].as_array_mut().unwrap().pop();
    assert!(check_rewrite(&client, &no_last).is_err());
    let phased = json!({"model":"m","input":[{"role":"assistant","phase":"final_answer","content":"a"},{"role":"user","content":"u"}]});
    let mut lost = phased.clone();
    lost["input"][0].as_object_mut().unwrap().remove("phase");
    assert!(check_rewrite(&phased, &lost).is_err());
}

#[test]
fn stored_items_alone_have_a_neutral_form() {
    let it = items();
    assert_eq!(neutral_of(&it[4])[0]["tool_calls"][0]["id"], "c1");
    assert_eq!(
        neutral_of(&it[9]),
        [json!({"role":"tool","tool_call_id":"c2","content":"patched"})]
    );
    assert_eq!(
        neutral_of(&it[1]),
        [json!({"role":"user","content":"fix the bug"})]
    );
    assert_eq!(neutral_of(&it[0])[0]["role"], "system");
    assert_eq!(Origin::Items { start: 2, end: 7 }.items(), Some(2..7));
    assert_eq!(Origin::Instructions.items(), None);
}

#[test]
fn reasoning_goes_with_the_item_it_precedes() {
    let it = vec![
        json!({"role":"user","content":"q"}),
        json!({"type":"reasoning","summary":[],"encrypted_content":"ra"}),
        json!({"type":"message","role":"assistant","phase":"commentary","content":[{"type":"output_text","text":"A"}]}),
        json!({"type":"reasoning","summary":[],"encrypted_content":"rb"}),
        json!({"type":"message","role":"assistant","phase":"final_answer","content":[{"type":"output_text","text":"B"}]}),
        json!({"type":"reasoning","summary":[],"encrypted_content":"rc"}),
        json!({"type":"function_call","call_id":"c","name":"f","arguments":"{}"}),
        json!({"type":"reasoning","summary":[],"encrypted_content":"rd"}),
        json!({"type":"function_call","call_id":"d","name":"f","arguments":"{}"}),
        json!({"type":"function_call_output","call_id":"c","output":"C"}),
        json!({"type":"function_call_output","call_id":"d","output":"D"}),
    ];
    assert_eq!(check_sequence(&it), Ok(()));
    let n = to_neutral(None, &it);
    assert_eq!(items_of(&n), [(0, 1), (1, 9), (9, 10), (10, 11)]);
    assert_eq!(n.messages[1]["content"], "A\nB");
    // New text: the first message takes it, the second goes with its reasoning; call `d` (and `rd`) left out.
    let mut a = n.messages[1].clone();
    a["content"] = json!("A2");
    a["tool_calls"].as_array_mut().unwrap().truncate(1);
    let out = vec![n.messages[0].clone(), a, n.messages[2].clone()];
    let sent = render(
        &it,
        &n,
        out,
        vec![Source::Client(0), Source::Client(1), Source::Client(2)],
    );
    let mut want = vec![
        it[0].clone(),
        it[1].clone(),
        it[2].clone(),
        it[5].clone(),
        it[6].clone(),
        it[9].clone(),
    ];
    want[2]["content"] = json!([{"type":"output_text","text":"A2"}]);
    assert_eq!(sent, want);
    assert_eq!(check_sequence(&sent), Ok(()));
    // No text left and no call: nothing but reasoning would remain, so nothing is sent.
    let mut a = n.messages[1].clone();
    a["content"] = Value::Null;
    a.as_object_mut().unwrap().remove("tool_calls");
    let sent = render(
        &it,
        &n,
        vec![n.messages[0].clone(), a],
        vec![Source::Client(0), Source::Client(1)],
    );
    assert_eq!(sent, [it[0].clone()]);
}
