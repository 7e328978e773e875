//! Recall-round tests: the items of a round, the stripped JSON answer, and one client stream spliced from event
//! sequences shaped as the Responses API streams them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::assemble::fixtures::*;
use super::super::assemble::{output_items, reply_message, Assembler};
use super::*;
use crate::config::RecallConfig;
use crate::error::GatewayError;
use crate::sse::SseEvent;
use bytes::Bytes;
use proptest::prelude::*;

fn names() -> InjectedNames {
    InjectedNames::from_config(&RecallConfig::default())
}

fn fc(call_id: &str, name: &str, args: &str) -> Value {
    json!({"id": format!("fc_{call_id}"), "type":"function_call", "status":"completed", "arguments": args,
           "call_id": call_id, "name": name})
}

fn rs(id: &str) -> Value {
    json!({"id": id, "type":"reasoning", "encrypted_content": ENC, "summary":[]})
}

fn msg(text: &str) -> Value {
    json!({"type":"message","role":"assistant","content":[{"type":"output_text","text":text,"annotations":[]}]})
}

#[test]
fn a_rounds_items_keep_reasoning_exact_and_drop_client_calls() {
    let n = names();
    let ours = fc("call_r", &n.recall, "{\"call_id\":\"call_7\"}");
    let output = vec![
        rs("rs_1"),
        msg("Checking."),
        rs("rs_2"),
        fc("call_c", "shell", "{}"), // the client's, alone in its unit: dropped with its reasoning
        rs("rs_3"),
        ours.clone(),
        msg("after"),
    ];
    assert_eq!(
        injected_calls(&output, &n),
        vec![
            json!({"id":"call_r","type":"function","function":{"name":n.recall,"arguments":"{\"call_id\":\"call_7\"}"}})
        ]
    );
    let items = round_items(&output, &n, &[("call_r".into(), "the output".into())]);
    assert_eq!(
        items,
        vec![
            rs("rs_1"),
            msg("Checking."),
            rs("rs_3"),
            ours.clone(),
            json!({"type":"function_call_output","call_id":"call_r","output":"the output"})
        ]
    );
    let text = serde_json::to_string(&items[2]).unwrap();
    assert_eq!(
        text,
        format!(r#"{{"id":"rs_3","type":"reasoning","encrypted_content":"{ENC}","summary":[]}}"#)
    );
    // parallel calls from one reasoning item: it stays with ours
    let output = vec![rs("rs_1"), fc("call_c", "shell", "{}"), ours.clone()];
    let items = round_items(&output, &n, &[("call_r".into(), "x".into())]);
    assert_eq!(items[..2], [rs("rs_1"), ours.clone()]);
    // no call of ours: nothing
    assert!(round_items(&[msg("hi")], &n, &[]).is_empty());
}

#[test]
fn strip_the_json_answer_and_sum_usage() {
    let n = names();
    let ours = fc("call_r", &n.search, "{\"query\":\"x\"}");
    let mut body = json!({"id":"resp_2","object":"response","status":"completed",
        "output":[rs("rs_1"), ours, rs("rs_2"), msg("Hm.")],"usage":usage(5, 1),
        "tools":[tool("shell"), tool(&n.recall), tool(&n.search)]});
    assert_eq!(strip_injected(&mut body, &n), 1);
    assert_eq!(body["tools"], json!([tool("shell")]));
    assert_eq!(body["output"], json!([rs("rs_2"), msg("Hm.")]));
    assert_eq!(body["status"], "completed");
    // a client call from the same reasoning keeps it
    let mut body = json!({"output":[rs("rs_1"), ours, fc("call_c", "shell", "{}")]});
    assert_eq!(strip_injected(&mut body, &n), 1);
    assert_eq!(
        body["output"],
        json!([rs("rs_1"), fc("call_c", "shell", "{}")])
    );
    // reasoning at the end (an incomplete answer) is the client's
    let mut body = json!({"output":[msg("a"), rs("rs_9")]});
    assert_eq!(strip_injected(&mut body, &n), 0);
    assert_eq!(body["output"].as_array().unwrap().len(), 2);

    let mut u = None;
    add_usage(&mut u, &usage(1000, 40));
    add_usage(&mut u, &usage(1200, 30));
    // the prompt side is the last round's (it holds the earlier rounds), the output is summed
    let summed = json!({"input_tokens":1200,"input_tokens_details":{"cached_tokens":600},
        "output_tokens":70,"output_tokens_details":{"reasoning_tokens":17},"total_tokens":1270});
    assert_eq!(u, Some(summed.clone()));
    let last = json!({"id":"resp_2b","object":"response","output":[rs("rs_1"), ours],"usage":usage(1200, 30)});
    let out = finalize_body(last, &n, u, Some(json!("resp_1")));
    assert_eq!(
        out,
        json!({"id":"resp_1","object":"response","output":[],"usage":summed})
    );
}

/// Feeds events; returns what the client got.
fn feed(s: &mut StreamSplicer, events: &[SseEvent]) -> Vec<Bytes> {
    events.iter().flat_map(|e| s.on_event(e)).collect()
}

fn client_events(out: &[Bytes]) -> Vec<Value> {
    values(&parse(&out.concat()))
}

fn kinds(vs: &[Value]) -> Vec<String> {
    vs.iter()
        .map(|v| v["type"].as_str().unwrap().to_string())
        .collect()
}

fn round_one() -> Vec<SseEvent> {
    let mut u = Upstream::new("resp_1");
    let items = vec![
        u.message(0, "msg_0", &["Let me ", "check."]),
        u.reasoning(1, "rs_1", &["The user asks about ", "an old result."]),
        u.function_call(
            2,
            "call_r",
            &names().recall,
            &["{\"call_", "id\": \"call_7\"}"],
        ),
    ];
    u.end("completed", items, 1000, 50)
}

fn round_two() -> Vec<SseEvent> {
    let mut u = Upstream::new("resp_2");
    let items = vec![
        u.reasoning(0, "rs_2", &["Now answer."]),
        u.message(1, "msg_1", &["The build ", "passed."]),
    ];
    u.end("completed", items, 1200, 30)
}

/// The two-round exchange: returns every byte sent to the client and the splicer.
fn two_rounds() -> (Vec<Bytes>, StreamSplicer) {
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &round_one());
    let RoundEnd::Continue { assistant, calls } = s.end_round(true) else {
        panic!("the round called our tool")
    };
    assert_eq!(
        calls,
        [json!({"id":"call_r","type":"function",
                "function":{"name":names().recall,"arguments":"{\"call_id\": \"call_7\"}"}})]
    );
    let items = output_items(&assistant);
    assert_eq!(kinds(items), ["message", "reasoning", "function_call"]);
    assert_eq!(items[1]["encrypted_content"], ENC);
    out.push(StreamSplicer::keepalive());
    out.extend(feed(&mut s, &round_two()));
    let RoundEnd::Finish(tail) = s.end_round(true) else {
        panic!("the second round answered")
    };
    out.extend(tail);
    (out, s)
}

#[test]
fn two_rounds_make_one_stream_without_our_tool() {
    let (out, s) = two_rounds();
    let text = String::from_utf8(out.concat()).unwrap();
    assert!(
        !text.contains("recall_tool_call") && !text.contains("call_r") && !text.contains("rs_1"),
        "no trace of our call or its reasoning: {text}"
    );
    assert!(text.contains("\n\n: keep-alive\n\n"));
    let evs = client_events(&out);
    let k = kinds(&evs);
    let count = |t: &str| k.iter().filter(|x| *x == t).count();
    assert_eq!(
        (
            count("response.created"),
            count("response.in_progress"),
            count("response.completed")
        ),
        (1, 1, 1)
    );
    assert_eq!(k.first().unwrap(), "response.created");
    assert_eq!(k.last().unwrap(), "response.completed");
    // sequence numbers strictly increasing from 0, with no gap
    let seqs: Vec<u64> = evs
        .iter()
        .map(|v| v["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..evs.len() as u64).collect::<Vec<_>>());
    // output indexes contiguous: the first round's message 0, the second round's reasoning 1 and message 2
    let added: Vec<(u64, &str)> = evs
        .iter()
        .filter(|v| v["type"] == "response.output_item.added")
        .map(|v| {
            (
                v["output_index"].as_u64().unwrap(),
                v["item"]["id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(added, [(0, "msg_0"), (1, "rs_2"), (2, "msg_1")]);
    for v in evs.iter().filter(|v| v.get("item_id").is_some()) {
        let id = v["item_id"].as_str().unwrap();
        let at = added.iter().find(|(_, i)| *i == id).unwrap().0;
        assert_eq!(v["output_index"], at, "{v}");
    }
    // the terminal event: the output exactly as streamed, the first round's id, the usage summed
    let done: Vec<Value> = evs
        .iter()
        .filter(|v| v["type"] == "response.output_item.done")
        .map(|v| v["item"].clone())
        .collect();
    let completed = evs.last().unwrap();
    assert_eq!(completed["response"]["output"], Value::Array(done.clone()));
    assert_eq!(completed["response"]["id"], "resp_1");
    assert_eq!(completed["response"]["status"], "completed");
    assert_eq!(completed["response"]["usage"]["input_tokens"], 1200);
    assert_eq!(completed["response"]["usage"]["output_tokens"], 80);
    assert_eq!(completed["response"]["usage"]["total_tokens"], 1280);
    assert_eq!(evs[0]["response"]["id"], "resp_1");
    // the responses list the client's tools only
    for v in evs.iter().filter(|v| v.get("response").is_some()) {
        assert_eq!(v["response"]["tools"], json!([tool("shell")]), "{v}");
    }
    // the event names match their data, and the client's reply is what it saw
    for e in parse(&out.concat()) {
        let v: Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(e.event.as_deref(), v["type"].as_str());
    }
    let r = s.reply();
    assert_eq!(r.message, reply_message(done));
    assert!(r.complete && s.ended());
    assert_eq!(r.id.as_deref(), Some("resp_1"));
    assert_eq!(r.prompt_tokens(), Some(1200));
    assert_eq!(s.usage().unwrap()["output_tokens"], 80);
}

#[test]
fn a_single_round_passes_through_byte_for_byte() {
    let mut u = Upstream::with_tools("resp_1", json!([tool("shell")]));
    let items = vec![
        u.reasoning(0, "rs_1", &["Think", "ing"]),
        u.message(1, "msg_1", &["Hello", " there"]),
        u.custom_call(2, "call_p", "apply_patch", &["*** Begin", " Patch"]),
        u.function_call(3, "call_c", "shell", &["{\"command\":", "[\"ls\"]}"]),
    ];
    let upstream = u.end("completed", items, 10, 7);
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &upstream);
    assert!(s.round_done());
    let RoundEnd::Finish(tail) = s.end_round(true) else {
        panic!("no call of ours")
    };
    out.extend(tail);
    let wire = encode(&upstream);
    assert_eq!(out.concat(), wire, "relayed byte for byte");
    let mut a = Assembler::default();
    upstream.iter().for_each(|e| a.on_event(e));
    let mut expected = a.finish();
    // The one round's usage, as the upstream reported it, for the metrics.
    expected.round_usage = vec![expected.usage.clone().unwrap()];
    assert_eq!(s.reply(), expected);
}

#[test]
fn our_last_call_without_rounds_left_is_hidden() {
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &round_one());
    let RoundEnd::Finish(tail) = s.end_round(false) else {
        panic!("no rounds left")
    };
    out.extend(tail);
    let text = String::from_utf8(out.concat()).unwrap();
    assert!(!text.contains("call_r") && !text.contains("rs_1"));
    let evs = client_events(&out);
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["output"].as_array().unwrap().len(), 1);
    assert_eq!(last["response"]["output"][0]["id"], "msg_0");
}

#[test]
fn a_client_call_before_ours_ends_the_answer_with_our_call_hidden() {
    let n = names();
    let mut u = Upstream::new("r");
    let items = vec![
        u.reasoning(0, "rs_1", &["both"]),
        u.function_call(1, "call_c", "shell", &["{}"]),
        u.function_call(2, "call_r", &n.search, &["{\"query\":\"q\"}"]),
    ];
    let upstream = u.end("completed", items, 10, 7);
    let mut s = StreamSplicer::new(n);
    let mut out = feed(&mut s, &upstream);
    let RoundEnd::Finish(tail) = s.end_round(true) else {
        panic!("a client call was relayed: the answer cannot continue")
    };
    out.extend(tail);
    let evs = client_events(&out);
    let last = evs.last().unwrap();
    let ids: Vec<&str> = last["response"]["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["rs_1", "fc_call_c"]);
    assert!(evs.iter().all(|v| v["output_index"] != 2));
    assert!(!String::from_utf8(out.concat())
        .unwrap()
        .contains("search_history"));
}

fn ours_then_client() -> Vec<SseEvent> {
    let mut u = Upstream::new("r");
    let items = vec![
        u.message(0, "msg_0", &["Let me look."]),
        u.reasoning(1, "rs_1", &["need both"]),
        u.function_call(2, "call_r", &names().recall, &["{\"call_id\":\"x\"}"]),
        u.custom_call(3, "call_c", "apply_patch", &["*** Begin", " Patch"]),
    ];
    u.end("completed", items, 10, 7)
}

#[test]
fn a_client_call_after_ours_is_held_then_dropped_or_released() {
    // rounds left: the client call is never shown; the model will ask again
    let mut s = StreamSplicer::new(names());
    let out = feed(&mut s, &ours_then_client());
    let text = String::from_utf8(out.concat()).unwrap();
    assert!(!text.contains("apply_patch") && !text.contains("rs_1"));
    let RoundEnd::Continue { assistant, .. } = s.end_round(true) else {
        panic!("ours came first")
    };
    let items = round_items(output_items(&assistant), &names(), &[]);
    assert_eq!(kinds(&items), ["message", "reasoning", "function_call"]);
    // no rounds left: released under the next indexes, with the reasoning that led to it
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &ours_then_client());
    let RoundEnd::Finish(tail) = s.end_round(false) else {
        panic!("no rounds left")
    };
    out.extend(tail);
    let r = s.reply();
    let shown = output_items(&r.message);
    assert_eq!(kinds(shown), ["message", "reasoning", "custom_tool_call"]);
    assert_eq!(shown[2]["input"], "*** Begin Patch");
    let evs = client_events(&out);
    assert!(evs
        .iter()
        .filter_map(|v| v["output_index"].as_u64())
        .all(|i| i < 3));
    let seqs: Vec<u64> = evs
        .iter()
        .map(|v| v["sequence_number"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(
        evs.last().unwrap()["response"]["output"],
        Value::Array(shown.to_vec())
    );
}

#[test]
fn an_upstream_error_is_relayed_and_ends_the_stream() {
    let mut u = Upstream::new("r");
    u.message(0, "m", &["par"]);
    u.push(json!({"type":"error","code":"server_error","message":"The server had an error","param":null}));
    let mut events = u.events.clone();
    events.extend(u.end("completed", vec![], 1, 1));
    let mut s = StreamSplicer::new(names());
    let out = feed(&mut s, &events);
    let evs = client_events(&out);
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "error", "nothing after the error");
    assert_eq!(last["code"], "server_error");
    assert!(s.ended());
    assert!(matches!(s.end_round(true), RoundEnd::Finish(t) if t.is_empty()));
    assert!(s.abort().is_empty());
    assert!(s.error_event(&GatewayError::UpstreamTimeout(3)).is_none());
    let r = s.reply();
    assert!(r.error.is_some() && !r.complete);
}

#[test]
fn a_broken_stream_ends_with_our_error_numbered_next() {
    let mut u = Upstream::new("r");
    u.message(0, "m", &["par"]);
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &u.events[..5]);
    out.extend(s.error_event(&GatewayError::UpstreamTimeout(3)));
    let evs = client_events(&out);
    assert_eq!(evs.len(), 6);
    assert_eq!(
        evs[5],
        json!({"type":"error","code":"upstream_timeout",
               "message":"upstream timed out after 3 s (upstream.timeout_secs)","param":null,"sequence_number":5})
    );
    assert!(s.ended() && !s.reply().complete);
}

#[test]
fn abort_after_a_failed_follow_up_closes_cleanly() {
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &round_one());
    assert!(matches!(s.end_round(true), RoundEnd::Continue { .. }));
    out.extend(s.abort());
    let evs = client_events(&out);
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["usage"], usage(1000, 50));
    assert_eq!(last["response"]["output"].as_array().unwrap().len(), 1);
    assert!(s.reply().complete && s.ended());
    assert!(s.abort().is_empty(), "once only");
}

#[test]
fn a_cut_round_does_not_pretend_to_end() {
    let mut u = Upstream::new("r");
    u.message(0, "m", &["par", "tial"]);
    let cut = u.events[..5].to_vec(); // created, in_progress, added, part added, one delta
    let mut s = StreamSplicer::new(names());
    let sent = feed(&mut s, &cut);
    assert_eq!(client_events(&sent).len(), 5);
    let RoundEnd::Finish(tail) = s.end_round(true) else {
        panic!("nothing of ours")
    };
    assert!(
        tail.is_empty() && !s.ended(),
        "the caller decides: error event or abort"
    );
    // a fresh splicer: abort mid-round closes the open item
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &cut);
    out.extend(s.abort());
    let evs = client_events(&out);
    assert_eq!(
        kinds(&evs[evs.len() - 2..]),
        ["response.output_item.done", "response.completed"]
    );
    assert_eq!(evs[evs.len() - 2]["item"]["content"][0]["text"], "par");
    assert_eq!(evs.last().unwrap()["sequence_number"], 6);
}

#[test]
fn a_stream_never_started_is_not_aborted_into_a_response() {
    let mut s = StreamSplicer::new(names());
    assert!(s.abort().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The two rounds' wire bytes cut into random chunks give the client the same bytes.
    #[test]
    fn any_chunking_splices_the_same(cuts1 in proptest::collection::vec(0usize..8000, 0..30),
                                     cuts2 in proptest::collection::vec(0usize..8000, 0..30)) {
        let (whole, _) = two_rounds();
        let mut s = StreamSplicer::new(names());
        let mut out = Vec::new();
        for (round, cuts) in [(round_one(), cuts1), (round_two(), cuts2)] {
            let wire = encode(&round);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            cuts.sort_unstable();
            let mut parser = crate::sse::SseParser::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([wire.len()]) {
                for e in parser.feed(&wire[from..c]) {
                    out.extend(s.on_event(&e));
                }
                from = c;
            }
            out.extend(parser.finish().iter().flat_map(|e| s.on_event(e)));
            match s.end_round(true) {
                RoundEnd::Continue { .. } => out.push(StreamSplicer::keepalive()),
                RoundEnd::Finish(tail) => out.extend(tail),
            }
        }
        prop_assert_eq!(out.concat(), whole.concat());
    }
}

/// Every arrangement of up to four items (reasoning, message, our call, a client call) in a last round: the
/// stream shows exactly what the JSON answer keeps, numbered without gaps, and its terminal output is what it
/// streamed.
#[test]
fn the_stream_shows_what_the_json_answer_keeps() {
    let n = names();
    let mut arrangements: Vec<Vec<u8>> = vec![vec![]];
    for _ in 0..4 {
        let longer: Vec<Vec<u8>> = arrangements
            .iter()
            .filter(|a| a.len() == arrangements.last().unwrap().len())
            .flat_map(|a| {
                (0..4u8).map(move |k| {
                    let mut b = a.clone();
                    b.push(k);
                    b
                })
            })
            .collect();
        arrangements.extend(longer);
    }
    assert_eq!(arrangements.len(), 1 + 4 + 16 + 64 + 256);
    for a in arrangements.iter().filter(|a| !a.is_empty()) {
        let mut u = Upstream::new("resp_x");
        let items: Vec<Value> = a
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let (i, id) = (i as u64, format!("{k}_{i}"));
                match k {
                    0 => u.reasoning(i, &format!("rs_{id}"), &["th", "ink"]),
                    1 => u.message(i, &format!("msg_{id}"), &["te", "xt"]),
                    2 => u.function_call(i, &format!("r{id}"), &n.recall, &["{}"]),
                    _ => u.function_call(i, &format!("c{id}"), "shell", &["{\"a\":", "1}"]),
                }
            })
            .collect();
        let upstream = u.end("completed", items.clone(), 10, 5);
        let mut s = StreamSplicer::new(names());
        let mut out = feed(&mut s, &upstream);
        let RoundEnd::Finish(tail) = s.end_round(false) else {
            panic!("no rounds left")
        };
        out.extend(tail);
        let evs = client_events(&out);
        let visible = visible_items(&items, &n);
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "response.completed", "{a:?}");
        assert_eq!(
            last["response"]["output"],
            Value::Array(visible.clone()),
            "{a:?}"
        );
        let done: Vec<Value> = evs
            .iter()
            .filter(|v| v["type"] == "response.output_item.done")
            .map(|v| v["item"].clone())
            .collect();
        assert_eq!(done, visible, "{a:?}");
        let seqs: Vec<u64> = evs
            .iter()
            .map(|v| v["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (0..evs.len() as u64).collect::<Vec<_>>(), "{a:?}");
        let added: Vec<u64> = evs
            .iter()
            .filter(|v| v["type"] == "response.output_item.added")
            .map(|v| v["output_index"].as_u64().unwrap())
            .collect();
        assert_eq!(
            added,
            (0..visible.len() as u64).collect::<Vec<_>>(),
            "{a:?}"
        );
        let text = String::from_utf8(out.concat()).unwrap();
        assert!(!text.contains(&n.recall), "{a:?}");
        let mut body = json!({"output": items});
        strip_injected(&mut body, &n);
        assert_eq!(body["output"], Value::Array(visible), "{a:?}");
    }
}
