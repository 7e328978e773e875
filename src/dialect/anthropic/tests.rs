//! Tests of the Anthropic conversion and validator: table-driven cases for the tricky shapes (cleared results,
//! parallel results, text after results, thinking), and property tests that run the real planner on random valid
//! conversations and check that every rewrite is valid, keeps what must be kept, and is deterministic.

use super::convert::{from_neutral, to_neutral, Neutral, Origin, OPAQUE};
use super::rebuild::TURN_NOTE;
use super::validate::{check_rewrite, check_sequence};
use crate::context::shape::{placeholder, truncated, PLACEHOLDER_PREFIX};
use crate::message::{Source, CONTINUES};
use serde_json::{json, Value};
use std::borrow::Cow;

mod inputs;
mod props;

fn think(n: &str) -> Value {
    json!({"type":"thinking","thinking":format!("let me think {n}"),"signature":format!("sig{n}==")})
}
fn tool_use(id: &str) -> Value {
    json!({"type":"tool_use","id":id,"name":"read_file","input":{"path":format!("{id}.rs")}})
}
fn result(id: &str, text: &str) -> Value {
    json!({"type":"tool_result","tool_use_id":id,"content":text})
}
fn user(blocks: Vec<Value>) -> Value {
    json!({"role":"user","content":blocks})
}
fn asst(blocks: Vec<Value>) -> Value {
    json!({"role":"assistant","content":blocks})
}
fn text(t: &str) -> Value {
    json!({"type":"text","text":t})
}

/// The rewrite that changes nothing: every neutral message borrowed, from the client.
fn identity(n: &Neutral) -> (Vec<Cow<'_, Value>>, Vec<Source>) {
    let out = n.messages.iter().map(Cow::Borrowed).collect();
    (out, (0..n.messages.len()).map(Source::Client).collect())
}

/// `n`'s messages with `edit` applied to message `j` (`None` leaves it out).
fn edited(
    n: &Neutral,
    edits: &[(usize, Option<Value>)],
) -> (Vec<Cow<'static, Value>>, Vec<Source>) {
    let mut out = Vec::new();
    let mut src = Vec::new();
    for (j, m) in n.messages.iter().enumerate() {
        match edits.iter().find(|(e, _)| *e == j) {
            Some((_, None)) => continue,
            Some((_, Some(v))) => out.push(Cow::Owned(v.clone())),
            None => out.push(Cow::Owned(m.clone())),
        }
        src.push(Source::Client(j));
    }
    (out, src)
}

fn owned(v: &[Cow<'_, Value>]) -> Vec<Value> {
    v.iter().map(|m| m.as_ref().clone()).collect()
}

#[test]
fn neutral_shapes() {
    let system = json!([{"type":"text","text":"You code."},{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}]);
    let native = vec![
        json!({"role":"user","content":"fix it"}),
        asst(vec![
            think("1"),
            text("reading"),
            tool_use("a"),
            tool_use("b"),
            json!({"type":"server_tool_use","id":"srv_1","name":"web_search","input":{"query":"rust borrow"}}),
            json!({"type":"web_search_tool_result","tool_use_id":"srv_1","content":[{"type":"web_search_result","title":"Borrowing","url":"https://x","encrypted_content":"QUFBQUFB"}]}),
        ]),
        user(vec![
            result("a", "A"),
            json!({"type":"tool_result","tool_use_id":"b","content":[text("B1"), {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}}]}),
            text("and also"),
        ]),
        json!({"role":"system","content":"mid"}),
        user(vec![
            text("look"),
            json!({"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUJD"}}),
            json!({"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"A".repeat(9000)}}),
            json!({"type":"document","source":{"type":"text","media_type":"text/plain","data":"plain doc"}}),
        ]),
    ];
    let n = to_neutral(Some(&system), &native);
    assert_eq!(
        n.origins,
        [
            Origin::System,
            Origin::Whole(0),
            Origin::Whole(1),
            Origin::ToolResult(2, 0),
            Origin::ToolResult(2, 1),
            Origin::Rest(2),
            Origin::Whole(3),
            Origin::Whole(4)
        ]
    );
    let m = &n.messages;
    assert_eq!(
        m[0],
        json!({"role":"system","content":"You code.\nBe brief."})
    );
    assert_eq!(m[1], json!({"role":"user","content":"fix it"}));
    assert_eq!(m[2]["content"], "reading");
    assert_eq!(
        m[2]["tool_calls"][1],
        json!({"id":"b","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b.rs\"}"}})
    );
    let opaque = m[2][OPAQUE].as_str().unwrap();
    assert!(
        opaque.contains("rust borrow") && opaque.contains("Borrowing"),
        "{opaque}"
    );
    assert!(
        !opaque.contains("QUFB") && !opaque.contains("sig1") && !opaque.contains("let me think"),
        "{opaque}"
    );
    assert_eq!(
        m[3],
        json!({"role":"tool","tool_call_id":"a","content":"A"})
    );
    assert_eq!(
        m[4]["content"],
        json!([{"type":"text","text":"B1"},{"type":"image"}])
    );
    assert_eq!(
        m[5],
        json!({"role":"user","content":[{"type":"text","text":"and also"}],CONTINUES:true})
    );
    assert_eq!(m[6], json!({"role":"system","content":"mid"}));
    let parts = m[7]["content"].as_array().unwrap();
    // text, image, 9000 base64 chars = 3 image parts, text document.
    assert_eq!(parts.len(), 6);
    assert_eq!(parts.iter().filter(|p| p["type"] == "image").count(), 4);
    assert_eq!(parts[5], json!({"type":"document","content":"plain doc"}));
    crate::context::units::check_sequence(m).unwrap();
    assert_eq!(to_neutral(Some(&system), &native), n, "deterministic");
}

#[test]
fn unchanged_messages_are_borrowed_and_byte_identical() {
    let native = vec![
        json!({"role":"user","content":"go"}),
        asst(vec![think("1"), tool_use("a")]),
        user(vec![result("a", "A"), text("more")]),
    ];
    let n = to_neutral(Some(&json!("sys")), &native);
    let (out, src) = identity(&n);
    let r = from_neutral(&native, &n, &out, &src);
    assert!(r.iter().all(|m| matches!(m, Cow::Borrowed(_))));
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        serde_json::to_string(&native).unwrap()
    );
    // Equal but owned copies count as unchanged too.
    let (out, src) = edited(&n, &[]);
    assert!(from_neutral(&native, &n, &out, &src)
        .iter()
        .all(|m| matches!(m, Cow::Borrowed(_))));
}

#[test]
fn a_cleared_result_becomes_a_placeholder_inside_its_tool_result() {
    let cc = json!({"type":"ephemeral"});
    let native = vec![
        json!({"role":"user","content":"go"}),
        asst(vec![think("1"), tool_use("a"), tool_use("b")]),
        user(vec![
            json!({"type":"tool_result","tool_use_id":"a","content":"long A","is_error":true,"cache_control":cc,"x_unknown":1}),
            result("b", "B"),
        ]),
        asst(vec![text("done")]),
    ];
    let n = to_neutral(None, &native);
    let cleared = placeholder(&n.messages[2], "read_file", Some("recall_tool_call"));
    let (out, src) = edited(&n, &[(2, Some(cleared))]);
    let r = from_neutral(&native, &n, &out, &src);
    assert_eq!(r.len(), 4);
    assert!(
        matches!(r[1], Cow::Borrowed(_)),
        "the call is kept as it was"
    );
    let blocks = r[2]["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "parallel results stay in one message");
    let a = &blocks[0];
    assert!(a["content"]
        .as_str()
        .unwrap()
        .starts_with(PLACEHOLDER_PREFIX));
    let keys: Vec<&String> = a.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
            "x_unknown"
        ]
    );
    assert_eq!(
        blocks[1], native[2]["content"][1],
        "the other result untouched"
    );
    check_sequence(&owned(&r)).unwrap();
    let body = |m: Vec<Value>| json!({"model":"m","messages":m});
    check_rewrite(&body(native.clone()), &body(owned(&r))).unwrap();
}

#[test]
fn text_after_results_is_rewritten_or_dropped_on_its_own() {
    let cc = json!({"type":"ephemeral","ttl":"5m"});
    let img =
        json!({"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUJD"}});
    let native = vec![
        json!({"role":"user","content":"go"}),
        asst(vec![tool_use("a")]),
        user(vec![
            result("a", "A"),
            text(&"x".repeat(50)),
            img.clone(),
            json!({"type":"text","text":"tail","cache_control":cc}),
        ]),
        asst(vec![text("ok")]),
        json!({"role":"user","content":"next"}),
    ];
    let n = to_neutral(None, &native);
    assert_eq!(n.origins[3], Origin::Rest(2));
    let cut = truncated(&n.messages[3], 10);
    let (out, src) = edited(&n, &[(3, Some(cut))]);
    let r = from_neutral(&native, &n, &out, &src);
    let blocks = r[2]["content"].as_array().unwrap();
    assert_eq!(
        blocks[0], native[2]["content"][0],
        "the result is unchanged"
    );
    assert_eq!(
        blocks[1],
        json!({"type":"text","text":"xxxxxxxxxx…[truncated]","cache_control":cc})
    );
    assert_eq!(blocks[2], img, "the image is carried");
    assert_eq!(blocks.len(), 3);
    // The results gone (with their call), the text stays as a user message of its own.
    let (out, src) = edited(&n, &[(1, None), (2, None)]);
    let r = from_neutral(&native, &n, &out, &src);
    assert_eq!(r.len(), 4);
    assert_eq!(r[1]["content"].as_array().unwrap().len(), 3);
    assert_eq!(r[1]["content"][0], native[2]["content"][1]);
    check_sequence(&owned(&r)).unwrap();
}

#[test]
fn a_rebuilt_assistant_keeps_thinking_and_its_live_calls() {
    let redacted = json!({"type":"redacted_thinking","data":"RUVF"});
    let srv =
        json!({"type":"server_tool_use","id":"srv_1","name":"web_search","input":{"query":"q"}});
    let native = vec![
        json!({"role":"user","content":"go"}),
        asst(vec![
            think("1"),
            redacted.clone(),
            text("first part"),
            srv.clone(),
            text("second"),
            tool_use("a"),
        ]),
        user(vec![result("a", "A")]),
    ];
    let n = to_neutral(None, &native);
    let cut = truncated(&n.messages[1], 5);
    let (out, src) = edited(&n, &[(1, Some(cut))]);
    let r = from_neutral(&native, &n, &out, &src);
    assert_eq!(
        r[1]["content"],
        json!([think("1"), redacted, {"type":"text","text":"first…[truncated]"}, srv, tool_use("a")])
    );
    // Without its call (and result) and text, only thinking would be left: the message goes whole.
    let mut bare = n.messages[1].clone();
    bare["content"] = Value::Null;
    bare.as_object_mut().unwrap().remove("tool_calls");
    let native2 = vec![
        native[0].clone(),
        asst(vec![think("2"), text("t"), tool_use("a")]),
        native[2].clone(),
        json!({"role":"user","content":"next"}),
    ];
    let n2 = to_neutral(None, &native2);
    let (out, src) = edited(&n2, &[(1, Some(bare)), (2, None)]);
    let r = from_neutral(&native2, &n2, &out, &src);
    assert_eq!(owned(&r), [native2[0].clone(), native2[3].clone()]);
}

#[test]
fn added_messages_and_a_leading_assistant() {
    let native = vec![
        json!({"role":"user","content":"old question"}),
        asst(vec![text("old answer")]),
        json!({"role":"system","content":"mid"}),
        asst(vec![text("prefilled")]),
    ];
    let n = to_neutral(Some(&json!("sys")), &native);
    // System kept (not rendered), the first user message left out: an assistant would come first.
    let out: Vec<Cow<'_, Value>> = [0, 2, 3, 4]
        .iter()
        .map(|&j| Cow::Borrowed(&n.messages[j]))
        .collect();
    let src: Vec<Source> = [0, 2, 3, 4].into_iter().map(Source::Client).collect();
    let r = from_neutral(&native, &n, &out, &src);
    assert_eq!(r[0]["content"][0]["text"], TURN_NOTE);
    assert_eq!(owned(&r[1..]), native[1..].to_vec());
    // A summary in place of the first two messages.
    let summary = json!({"role":"system","content":"Summary: they asked, we answered."});
    let out = vec![
        Cow::Borrowed(&n.messages[0]),
        Cow::Borrowed(&summary),
        Cow::Borrowed(&n.messages[3]),
        Cow::Borrowed(&n.messages[4]),
    ];
    let src = vec![
        Source::Client(0),
        Source::Added,
        Source::Client(3),
        Source::Client(4),
    ];
    let r = from_neutral(&native, &n, &out, &src);
    assert_eq!(
        r[0],
        Cow::<Value>::Owned(
            json!({"role":"user","content":[{"type":"text","text":"Summary: they asked, we answered."}]})
        )
    );
    assert_eq!(owned(&r[1..]), native[2..].to_vec());
}

#[test]
fn invalid_sequences_are_named() {
    let go = json!({"role":"user","content":"go"});
    let cases: Vec<(Vec<Value>, &str)> = vec![
        (vec![], "no messages"),
        (vec![asst(vec![text("hi")])], "first message"),
        (vec![json!({"role":"tool","content":"x"})], "invalid role"),
        (vec![json!({"role":"user","content":""})], "content"),
        (vec![user(vec![])], "content"),
        (vec![user(vec![text("")])], "empty text"),
        (
            vec![go.clone(), asst(vec![tool_use("a")])],
            "no tool_result",
        ),
        (
            vec![
                go.clone(),
                asst(vec![tool_use("a")]),
                json!({"role":"system","content":"s"}),
                user(vec![result("a", "A")]),
            ],
            "no tool_result",
        ),
        (
            vec![
                go.clone(),
                asst(vec![tool_use("a"), tool_use("b")]),
                user(vec![result("a", "A")]),
            ],
            "\"b\"",
        ),
        (
            vec![
                go.clone(),
                asst(vec![tool_use("a")]),
                user(vec![text("t"), result("a", "A")]),
            ],
            "come first",
        ),
        (
            vec![
                go.clone(),
                asst(vec![tool_use("a")]),
                user(vec![result("a", "A"), result("a", "A")]),
            ],
            "twice",
        ),
        (
            vec![go.clone(), user(vec![result("a", "A")])],
            "previous message",
        ),
        (
            vec![
                go.clone(),
                asst(vec![tool_use("a")]),
                user(vec![result("a", "A")]),
                asst(vec![tool_use("a")]),
                user(vec![result("a", "A")]),
            ],
            "not unique",
        ),
        (
            vec![go.clone(), asst(vec![result("a", "A")])],
            "tool_result in a assistant",
        ),
    ];
    for (msgs, want) in cases {
        let e = check_sequence(&msgs).unwrap_err();
        assert!(e.contains(want), "{e} (wanted {want})");
    }
    let ok = vec![
        json!({"role":"system","content":"s"}),
        go,
        asst(vec![think("1"), tool_use("a"), tool_use("b")]),
        user(vec![result("b", "B"), result("a", "A"), text("t")]),
        asst(vec![text("done")]),
    ];
    check_sequence(&ok).unwrap();
}

/// A change made to a body in a test.
type Edit = dyn Fn(&mut Value);

#[test]
fn rewrites_that_break_the_rules_are_named() {
    let cc = json!({"type":"ephemeral"});
    let marked = |t: &str| json!({"type":"text","text":t,"cache_control":cc});
    let msgs = vec![
        user(vec![marked("q1")]),
        asst(vec![think("1"), tool_use("a")]),
        user(vec![result("a", "A")]),
        json!({"role":"system","content":"mid"}),
        asst(vec![think("2"), tool_use("b")]),
        user(vec![result("b", "B")]),
    ];
    let client = json!({"model":"m","system":"s","tools":[{"name":"t"}],"context_management":{"edits":[]},"messages":msgs});
    let with = |f: &dyn Fn(&mut Value)| {
        let mut s = client.clone();
        f(&mut s);
        check_rewrite(&client, &s)
    };
    with(&|_| {}).unwrap();
    with(&|s| {
        s["tools"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name":"recall"}))
    })
    .unwrap();
    // The marked text rewritten (marker kept on its replacement): allowed.
    with(&|s| s["messages"][0] = user(vec![marked("q1 cut")])).unwrap();
    let cases: Vec<(&Edit, &str)> = vec![
        (&|s| s["system"] = json!("other"), "`system`"),
        (
            &|s| s["context_management"] = json!({"edits":[{"type":"clear_thinking_20251015"}]}),
            "`context_management`",
        ),
        (&|s| s["temperature"] = json!(1), "added"),
        (
            &|s| s["tools"] = json!([{"name":"recall"},{"name":"t"}]),
            "`tools`",
        ),
        (
            &|s| s["messages"][2]["content"][0]["cache_control"] = json!({"type":"ephemeral"}),
            "marker",
        ),
        (
            &|s| s["messages"][1]["content"][0]["signature"] = json!("forged"),
            "thinking",
        ),
        (
            &|s| {
                s["messages"].as_array_mut().unwrap().remove(3);
            },
            "system message",
        ),
        (
            &|s| s["messages"][5]["content"][0]["content"] = json!("cleared"),
            "newest",
        ),
        (
            &|s| s["messages"][4]["content"] = json!([tool_use("b")]),
            "thinking blocks",
        ),
        // An older turn may lose its thinking only with the whole message.
        (
            &|s| s["messages"][1]["content"] = json!([tool_use("a")]),
            "not kept with it",
        ),
        (
            &|s| {
                let o = s.as_object_mut().unwrap();
                let model = o.shift_remove("model").unwrap();
                o.insert("model".into(), model);
            },
            "reordered",
        ),
    ];
    for (f, want) in cases {
        let e = with(f).unwrap_err();
        assert!(e.contains(want), "{e} (wanted {want})");
    }
    // Five markers where the client had four.
    let four = json!({"model":"m","messages":[user(vec![marked("a"), marked("b"), marked("c"), marked("d"), text("e")])]});
    let mut five = four.clone();
    five["messages"][0]["content"][4]["cache_control"] = cc.clone();
    assert!(check_rewrite(&four, &five).unwrap_err().contains("markers"));
}
