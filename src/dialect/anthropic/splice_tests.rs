//! Recall-round tests: the messages of a round, the stripped JSON answer, and one client stream spliced from
//! event sequences shaped as the Messages API streams them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::assemble::{from_body, Assembler};
use super::super::fixtures::*;
use super::*;
use crate::config::RecallConfig;
use crate::sse::SseEvent;
use bytes::Bytes;
use proptest::prelude::*;

fn names() -> InjectedNames {
    InjectedNames::from_config(&RecallConfig::default())
}

const SIG: &str = "EqQBCkYIARgCIkDx+/=sig==";

fn answer_with(blocks: Value) -> Value {
    json!({"role":"assistant","content": blocks})
}

#[test]
fn a_rounds_messages_keep_thinking_exact_and_drop_client_calls() {
    let n = names();
    let thinking = json!({"type":"thinking","thinking":"Need the old output.","signature":SIG});
    let ours =
        json!({"type":"tool_use","id":"toolu_r","name":n.recall,"input":{"call_id":"toolu_7"}});
    let m = answer_with(json!([
        thinking,
        {"type":"text","text":"Checking."},
        {"type":"tool_use","id":"toolu_c","name":"Bash","input":{"command":"ls"}},
        ours,
        {"type":"text","text":"after"},
    ]));
    assert_eq!(injected_calls(&m, &n), vec![ours.clone()]);
    let (assistant, user) = round_messages(&m, &n, &[("toolu_r".into(), "the output".into())]);
    assert_eq!(
        assistant,
        answer_with(json!([thinking, {"type":"text","text":"Checking."}, ours]))
    );
    let text = serde_json::to_string(&assistant).unwrap();
    assert!(text.starts_with(
        r#"{"role":"assistant","content":[{"type":"thinking","thinking":"Need the old output.","signature":"EqQBCkYIARgCIkDx+/=sig=="}"#
    ));
    assert_eq!(
        user,
        json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_r","content":"the output"}]})
    );
    assert_eq!(
        as_chat_call(&ours),
        json!({"id":"toolu_r","type":"function","function":{"name":n.recall,"arguments":"{\"call_id\":\"toolu_7\"}"}})
    );
}

#[test]
fn strip_the_json_answer_and_sum_usage() {
    let n = names();
    let ours = json!({"type":"tool_use","id":"toolu_r","name":n.search,"input":{"query":"x"}});
    let mut body = json!({"id":"msg_2","type":"message","role":"assistant",
        "content":[{"type":"text","text":"Hm."}, ours],"stop_reason":"tool_use",
        "usage":{"input_tokens":5,"output_tokens":1}});
    assert_eq!(strip_injected(&mut body, &n), 1);
    assert_eq!(body["content"], json!([{"type":"text","text":"Hm."}]));
    assert_eq!(body["stop_reason"], "end_turn");
    // a client call left keeps `tool_use`
    let client = json!({"type":"tool_use","id":"toolu_c","name":"Read","input":{}});
    let mut body = json!({"content":[client, ours],"stop_reason":"tool_use"});
    assert_eq!(strip_injected(&mut body, &n), 1);
    assert_eq!(
        (
            body["content"].as_array().unwrap().len(),
            &body["stop_reason"]
        ),
        (1, &json!("tool_use"))
    );
    let mut u = None;
    add_usage(
        &mut u,
        &json!({"input_tokens":10,"cache_read_input_tokens":null,"output_tokens":3,
        "cache_creation":{"ephemeral_5m_input_tokens":4},"service_tier":"standard"}),
    );
    add_usage(
        &mut u,
        &json!({"input_tokens":12,"cache_read_input_tokens":7,"output_tokens":2,
        "cache_creation":{"ephemeral_5m_input_tokens":1},"service_tier":"standard"}),
    );
    // the prompt side is the last round's (it holds the earlier rounds), the output is summed
    let summed = json!({"input_tokens":12,"cache_read_input_tokens":7,"output_tokens":5,
        "cache_creation":{"ephemeral_5m_input_tokens":1},"service_tier":"standard"});
    assert_eq!(u, Some(summed.clone()));
    let last = json!({"id":"msg_2b","content":[ours],"stop_reason":"tool_use","usage":{"input_tokens":12}});
    let out = finalize_body(last, &n, u, Some(json!("msg_1")));
    assert_eq!(
        out,
        json!({"id":"msg_1","content":[],"stop_reason":"end_turn","usage":summed})
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
    [
        message_start("msg_1", 1000),
        ping(),
        thinking_block(0, &["The user asks about ", "an old result."], SIG),
        tool_block(
            1,
            "toolu_r",
            &names().recall,
            &["{\"call_", "id\": \"toolu_7\"}"],
        ),
        message_end("tool_use", 50),
    ]
    .concat()
}

fn round_two() -> Vec<SseEvent> {
    [
        message_start("msg_2", 1200),
        ping(),
        text_block(0, &["The build ", "passed."]),
        message_end("end_turn", 30),
    ]
    .concat()
}

/// The two-round exchange: returns every byte sent to the client and the splicer.
fn two_rounds() -> (Vec<Bytes>, StreamSplicer) {
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &round_one());
    let RoundEnd::Continue { assistant, calls } = s.end_round(true) else {
        panic!("the round called our tool")
    };
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["input"], json!({"call_id":"toolu_7"}));
    assert_eq!(assistant["content"][0]["signature"], SIG);
    assert_eq!(
        kinds(&assistant["content"].as_array().unwrap().clone()),
        ["thinking", "tool_use"]
    );
    out.push(StreamSplicer::ping());
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
        !text.contains("recall_tool_call") && !text.contains("toolu_r"),
        "{text}"
    );
    let evs = client_events(&out);
    let k = kinds(&evs);
    let count = |t: &str| k.iter().filter(|x| *x == t).count();
    assert_eq!(
        (
            count("message_start"),
            count("message_delta"),
            count("message_stop")
        ),
        (1, 1, 1)
    );
    assert_eq!(k.first().unwrap(), "message_start");
    assert_eq!(&k[k.len() - 2..], ["message_delta", "message_stop"]);
    assert_eq!(
        count("ping"),
        3,
        "two relayed, one while the second round was in flight"
    );
    assert_eq!(evs[0]["message"]["id"], "msg_1");
    // block indexes contiguous: the thinking block 0, the second round's text renumbered to 1
    let starts: Vec<(u64, &str)> = evs
        .iter()
        .filter(|v| v["type"] == "content_block_start")
        .map(|v| {
            (
                v["index"].as_u64().unwrap(),
                v["content_block"]["type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(starts, [(0, "thinking"), (1, "text")]);
    // the signature comes before its block's stop
    let sig = evs
        .iter()
        .position(|v| v["delta"]["type"] == "signature_delta")
        .unwrap();
    let stop0 = evs
        .iter()
        .position(|v| v["type"] == "content_block_stop" && v["index"] == 0)
        .unwrap();
    assert!(sig < stop0);
    let delta = evs.iter().find(|v| v["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    // the last round's prompt (it holds the first round whole), the rounds' output summed
    assert_eq!(delta["usage"]["input_tokens"], 1200);
    assert_eq!(delta["usage"]["output_tokens"], 80);
    assert_eq!(delta["usage"]["cache_read_input_tokens"], 100);
    // the event names match their data, and the client's reply is what it saw
    for e in parse(&out.concat()) {
        let v: Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(e.event.as_deref(), v["type"].as_str());
    }
    let r = s.reply();
    assert_eq!(
        r.message,
        json!({"role":"assistant","content":[
            {"type":"thinking","thinking":"The user asks about an old result.","signature":SIG},
            {"type":"text","text":"The build passed."}]})
    );
    assert!(r.complete && s.ended());
    assert_eq!(r.prompt_tokens(), Some(1300));
    assert_eq!(s.usage().unwrap()["input_tokens"], 1200);
}

#[test]
fn a_single_round_passes_through() {
    let upstream = [
        message_start("msg_1", 10),
        text_block(0, &["Hello", " there"]),
        tool_block(1, "toolu_c", "Read", &["{\"path\":\"a\"}"]),
        message_end("tool_use", 7),
    ]
    .concat();
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &upstream);
    assert!(s.round_done());
    let RoundEnd::Finish(tail) = s.end_round(true) else {
        panic!("no call of ours")
    };
    out.extend(tail);
    let wire = encode(&upstream);
    let sent = out.concat();
    let head = wire.len() - encode(&message_end("tool_use", 7)).len();
    assert_eq!(
        &sent[..head],
        &wire[..head],
        "relayed byte for byte up to message_delta"
    );
    let mut a = Assembler::default();
    upstream.iter().for_each(|e| a.on_event(e));
    let mut expected = a.finish();
    expected.chunks = s.reply().chunks;
    // The one round's usage, as the upstream reported it, for the metrics.
    expected.round_usage = vec![expected.usage.clone().unwrap()];
    assert_eq!(s.reply(), expected);
    assert_eq!(s.reply().finish_reason.as_deref(), Some("tool_use"));
}

#[test]
fn our_last_call_without_rounds_left_becomes_end_turn() {
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &round_one());
    let RoundEnd::Finish(tail) = s.end_round(false) else {
        panic!("no rounds left")
    };
    out.extend(tail);
    let evs = client_events(&out);
    assert!(!String::from_utf8(out.concat()).unwrap().contains("toolu_r"));
    let delta = evs.iter().find(|v| v["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(kinds(&evs).last().unwrap(), "message_stop");
}

#[test]
fn a_client_call_before_ours_ends_the_answer_with_our_call_hidden() {
    let n = names();
    let upstream = [
        message_start("m", 10),
        tool_block(0, "toolu_c", "Read", &["{}"]),
        tool_block(1, "toolu_r", &n.search, &["{\"query\":\"q\"}"]),
        text_block(2, &["done"]),
        message_end("tool_use", 7),
    ]
    .concat();
    let mut s = StreamSplicer::new(n);
    let mut out = feed(&mut s, &upstream);
    let RoundEnd::Finish(tail) = s.end_round(true) else {
        panic!("a client call was relayed: the answer cannot continue")
    };
    out.extend(tail);
    let evs = client_events(&out);
    let starts: Vec<u64> = evs
        .iter()
        .filter(|v| v["type"] == "content_block_start")
        .map(|v| v["index"].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [0, 1]);
    assert!(evs.iter().all(|v| v["index"] != 2));
    let delta = evs.iter().find(|v| v["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert!(!String::from_utf8(out.concat())
        .unwrap()
        .contains("search_history"));
}

fn ours_then_client() -> Vec<SseEvent> {
    [
        message_start("m", 10),
        text_block(0, &["Let me look."]),
        tool_block(1, "toolu_r", &names().recall, &["{\"call_id\":\"x\"}"]),
        tool_block(2, "toolu_c", "Bash", &["{\"command\":", "\"ls\"}"]),
        message_end("tool_use", 7),
    ]
    .concat()
}

#[test]
fn a_client_call_after_ours_is_held_then_dropped_or_released() {
    // rounds left: the client call is never shown; the model will ask again
    let mut s = StreamSplicer::new(names());
    let out = feed(&mut s, &ours_then_client());
    assert!(!String::from_utf8(out.concat()).unwrap().contains("Bash"));
    let RoundEnd::Continue { assistant, .. } = s.end_round(true) else {
        panic!("ours came first")
    };
    assert_eq!(
        kinds(&assistant["content"].as_array().unwrap().clone()),
        ["text", "tool_use"]
    );
    // no rounds left: released under the next index, the answer stops for the client's tool
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &ours_then_client());
    let RoundEnd::Finish(tail) = s.end_round(false) else {
        panic!("no rounds left")
    };
    out.extend(tail);
    let r = s.reply();
    assert_eq!(
        r.message["content"],
        json!([{"type":"text","text":"Let me look."},
               {"type":"tool_use","id":"toolu_c","name":"Bash","input":{"command":"ls"}}])
    );
    assert_eq!(r.finish_reason.as_deref(), Some("tool_use"));
    let evs = client_events(&out);
    assert!(evs
        .iter()
        .filter(|v| v.get("index").is_some())
        .all(|v| v["index"].as_u64().unwrap() < 2));
}

#[test]
fn an_upstream_error_is_relayed_and_ends_the_stream() {
    let mut s = StreamSplicer::new(names());
    let mut events = [message_start("m", 10), text_block(0, &["par"])].concat();
    let err = json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
    events.push(ev(err.clone()));
    events.extend(message_end("end_turn", 1));
    let out = feed(&mut s, &events);
    let evs = client_events(&out);
    assert_eq!(evs.last().unwrap(), &err, "nothing after the error");
    assert!(s.ended());
    assert!(matches!(s.end_round(true), RoundEnd::Finish(t) if t.is_empty()));
    assert!(s.abort().is_empty());
    let r = s.reply();
    assert_eq!(r.error, Some(err["error"].clone()));
    assert!(!r.complete);
}

#[test]
fn abort_after_a_failed_follow_up_closes_cleanly() {
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &round_one());
    assert!(matches!(s.end_round(true), RoundEnd::Continue { .. }));
    out.extend(s.abort());
    let evs = client_events(&out);
    assert_eq!(
        kinds(&evs[evs.len() - 2..]),
        ["message_delta", "message_stop"]
    );
    let delta = &evs[evs.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["input_tokens"], 1000);
    assert_eq!(delta["usage"]["output_tokens"], 50);
    assert!(s.reply().complete && s.ended());
    assert!(s.abort().is_empty(), "once only");
}

#[test]
fn a_cut_round_does_not_pretend_to_end() {
    let cut = [
        message_start("m", 10),
        text_block(0, &["par"])[..2].to_vec(),
    ]
    .concat();
    let mut s = StreamSplicer::new(names());
    let sent = feed(&mut s, &cut);
    assert_eq!(client_events(&sent).len(), 3);
    let RoundEnd::Finish(tail) = s.end_round(true) else {
        panic!("nothing of ours")
    };
    assert!(
        tail.is_empty() && !s.ended(),
        "the caller decides: error event or abort"
    );
    // a fresh splicer: abort mid-round closes the open block
    let mut s = StreamSplicer::new(names());
    let mut out = feed(&mut s, &cut);
    out.extend(s.abort());
    let evs = client_events(&out);
    assert_eq!(
        kinds(&evs[evs.len() - 3..]),
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert_eq!(evs[evs.len() - 2]["usage"]["input_tokens"], 10);
}

#[test]
fn a_stream_never_started_is_not_aborted_into_a_message() {
    let mut s = StreamSplicer::new(names());
    assert!(s.abort().is_empty());
    let body = json!({"content":[{"type":"text","text":"x"}],"stop_reason":"end_turn"});
    assert!(from_body(body.to_string().as_bytes()).complete);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The two rounds' wire bytes cut into random chunks give the client the same bytes.
    #[test]
    fn any_chunking_splices_the_same(cuts1 in proptest::collection::vec(0usize..4000, 0..30),
                                     cuts2 in proptest::collection::vec(0usize..4000, 0..30)) {
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
                RoundEnd::Continue { .. } => out.push(StreamSplicer::ping()),
                RoundEnd::Finish(tail) => out.extend(tail),
            }
        }
        prop_assert_eq!(out.concat(), whole.concat());
    }
}
