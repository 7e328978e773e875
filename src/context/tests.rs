//! Planner tests: each strategy on hand-made conversations, stability across turns, and property tests of the
//! invariants every rewritten request keeps.

use super::tokens::{Encoding, TokenCounter};
use super::units::check_sequence;
use super::*;
use crate::config::{ContextConfig, PruneConfig, Strategy as Rewriting};
use crate::context::runloop::run_loops;
use crate::message::{is_system, role};
use proptest::prelude::*;
use stages::Summaries;

const SUMMARY: &str = "Summary of the earlier conversation: ";

fn summary_msg(upto: usize) -> Value {
    json!({"role":"system","content":format!("{SUMMARY}the user wants a fix; call_1 read the config (covers {upto})")})
}

fn with_summaries<'a>(
    mut i: PlanInput<'a>,
    strategy: Rewriting,
    ready: &'a [(usize, Value)],
) -> PlanInput<'a> {
    i.strategy = strategy;
    i.summaries = Some(Summaries {
        keep_recent: 4,
        max_tokens: 300,
        ready,
    });
    i
}

fn wanted(p: &Plan) -> Option<usize> {
    match p {
        Plan::Forward { wanted_summary, .. } => *wanted_summary,
        Plan::Rewrite(r) => r.wanted_summary,
        Plan::Reject { .. } => None,
    }
}
use serde_json::{json, Value};

fn sys(t: &str) -> Value {
    json!({"role":"system","content":t})
}
fn user(t: &str) -> Value {
    json!({"role":"user","content":t})
}
fn reply(t: &str) -> Value {
    json!({"role":"assistant","content":t})
}
fn calls(ids: &[String]) -> Value {
    let cs: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id":id,"type":"function","function":{"name":"read_file","arguments":format!("{{\"path\":\"{id}.rs\"}}")}}))
        .collect();
    json!({"role":"assistant","content":null,"tool_calls":cs})
}
/// Calls writing files: arguments of about `words` words each.
fn writes(ids: &[String], words: usize) -> Value {
    let cs: Vec<Value> = ids
        .iter()
        .map(|id| {
            let args = json!({"path": format!("{id}.rs"), "text": "fn main() {} ".repeat(words / 3)});
            json!({"id":id,"type":"function","function":{"name":"write_file","arguments":args.to_string()}})
        })
        .collect();
    json!({"role":"assistant","content":null,"tool_calls":cs})
}

fn result(id: &str, words: usize) -> Value {
    let body: Vec<String> = (0..words).map(|w| format!("w{w}")).collect();
    json!({"role":"tool","tool_call_id":id,"content":format!("{id}: {}", body.join(" "))})
}

/// A coding-agent run: one task, `n` tool calls with results of `words` words each.
fn agent_run(n: usize, words: usize) -> Vec<Value> {
    let mut m = vec![sys("You are a coding agent."), user("Fix the bug.")];
    for i in 0..n {
        let id = format!("call_{i}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, words));
    }
    m
}

/// A chat with `loops` finished run loops, each with one small tool call.
fn chat_loops(loops: usize, words: usize) -> Vec<Value> {
    let mut m = vec![sys("You help travellers.")];
    for l in 0..loops {
        let id = format!("c{l}");
        m.push(user(&format!("question {l} {}", "please ".repeat(words))));
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, 5));
        m.push(reply(&format!("answer {l} {}", "indeed ".repeat(words))));
    }
    m.push(user("last question"));
    m
}

fn input<'a>(messages: &'a [Value], window: u64) -> PlanInput<'a> {
    PlanInput {
        messages,
        hashes: None,
        tools: None,
        first_seen: None,
        now: 1_000_000,
        encoding: Encoding::O200k,
        ratio: 1.0,
        strategy: Rewriting::Prune,
        window,
        recall_tool: Some("recall_tool_call"),
        reserve: 0,
        summaries: None,
        precompute_at: 0.6,
        strict_roles: true,
    }
}

/// A chat request of `messages` (with `body`, the client's body holding them) as `decide` takes it: O200k, no
/// calibration, no first-seen times, strict role order.
fn decide_request<'a>(
    body: &'a serde_json::Map<String, Value>,
    messages: &'a [Value],
    window: u64,
    strategy: Rewriting,
    summarizer: bool,
) -> decide::Request<'a> {
    decide::Request {
        body,
        messages,
        hashes: None,
        key: "messages",
        raw_len: Value::Object(body.clone()).to_string().len(),
        encoding: Encoding::O200k,
        window,
        ratio: 1.0,
        strategy,
        first_seen: None,
        now: 1_000_000,
        summarizer,
        strict_roles: true,
    }
}

fn run(messages: &[Value], window: u64) -> Plan<'_> {
    run_with(
        &input(messages, window),
        &ContextConfig::default(),
        &PruneConfig::default(),
    )
}

fn run_with<'a>(i: &PlanInput<'a>, ctx: &ContextConfig, prune: &PruneConfig) -> Plan<'a> {
    plan(i, ctx, prune, &TokenCounter::new())
}

/// A rewrite with its messages owned (easier to compare).
struct Owned {
    messages: Vec<Value>,
    record: CompressionRecord,
    pruned: Vec<PrunedCall>,
    wanted_summary: Option<usize>,
}

fn rewrite(p: Plan) -> Owned {
    match p {
        Plan::Rewrite(r) => Owned {
            messages: r.owned_messages(),
            record: r.record,
            pruned: r.pruned,
            wanted_summary: r.wanted_summary,
        },
        other => panic!("expected a rewrite, got {other:?}"),
    }
}

fn count(m: &[Value]) -> u64 {
    TokenCounter::new().request_tokens(Encoding::O200k, m, None)
}

#[test]
fn small_requests_and_strategy_off_are_forwarded() {
    let m = agent_run(3, 10);
    assert!(matches!(run(&m, 128_000), Plan::Forward { .. }));
    let big = agent_run(40, 400);
    let mut i = input(&big, 8_000);
    i.strategy = Rewriting::Off;
    assert_eq!(
        run_with(&i, &ContextConfig::default(), &PruneConfig::default()),
        Plan::Forward {
            tokens: None,
            wanted_summary: None
        }
    );
}

#[test]
fn clearing_replaces_old_results_and_keeps_the_newest() {
    let m = agent_run(20, 300);
    let window = count(&m) * 10 / 9; // ~0.9 of the window: above the threshold
    let r = rewrite(run(&m, window));
    assert_eq!(r.record.stages, ["cleared"]);
    assert_eq!(r.messages.len(), m.len(), "clearing keeps every message");
    check_sequence(&r.messages).unwrap();
    let last3: Vec<&Value> = m
        .iter()
        .rev()
        .filter(|x| role(x) == "tool")
        .take(3)
        .collect();
    for t in last3 {
        assert!(r.messages.contains(t), "the newest results stay whole");
    }
    let first = r.messages[3]["content"].as_str().unwrap();
    assert!(first.starts_with(shape::PLACEHOLDER_PREFIX) && first.contains("call_0"));
    assert!(first.contains("read_file") && first.contains("recall_tool_call"));
    assert_eq!(r.pruned[0].call_id, "call_0");
    assert_eq!(r.pruned[0].digest, "{\"path\":\"call_0.rs\"}");
    assert!(
        r.record.tokens_after <= window * 8 / 10,
        "under the threshold: {:?}",
        r.record
    );
    assert_eq!(r.record.tokens_after, count(&r.messages));
}

#[test]
fn small_results_are_never_cleared() {
    let m = agent_run(30, 20); // ~60 tokens each, under min_result_tokens
    let window = count(&m) * 10 / 9;
    match run(&m, window) {
        Plan::Rewrite(r) => assert!(!r.record.stages.contains(&"cleared"), "{:?}", r.record),
        Plan::Forward { .. } | Plan::Reject { .. } => {}
    }
}

#[test]
fn past_run_loops_keep_user_and_reply_cut_to_length() {
    let m = chat_loops(12, 400);
    let window = count(&m) * 10 / 9;
    let prune = PruneConfig {
        max_message_length: 100,
        ..Default::default()
    };
    let r = rewrite(run_with(
        &input(&m, window),
        &ContextConfig::default(),
        &prune,
    ));
    assert!(r.record.stages.contains(&"pruned"), "{:?}", r.record);
    check_sequence(&r.messages).unwrap();
    assert_eq!(
        r.messages[1], m[1],
        "the task (first user message) is pinned whole"
    );
    assert_eq!(r.messages[2]["role"], "assistant");
    assert!(r.messages[2].get("tool_calls").is_none());
    let q1 = r.messages[3]["content"].as_str().unwrap();
    assert!(q1.starts_with("question 1") && q1.ends_with(shape::TRUNCATED_MARKER));
    assert_eq!(
        q1.chars().count(),
        100 + shape::TRUNCATED_MARKER.chars().count()
    );
    assert!(
        r.pruned.iter().any(|p| p.call_id == "c0"),
        "the pruned loop's call is recallable"
    );
    // the newest two loops (the current one included) are whole
    assert_eq!(r.messages[r.messages.len() - 5..], m[m.len() - 5..]);
}

#[test]
fn loops_beyond_max_run_loops_are_dropped() {
    let m = chat_loops(12, 400);
    let window = count(&m) * 10 / 9;
    let prune = PruneConfig {
        max_run_loops: 4,
        keep_run_loops: 2,
        ..Default::default()
    };
    let r = rewrite(run_with(
        &input(&m, window),
        &ContextConfig::default(),
        &prune,
    ));
    // dropped when the cuts last moved (a few turns ago): all but the newest four loops of that turn
    assert!(r.record.dropped_loops >= 7, "{:?}", r.record);
    let users: Vec<&str> = r
        .messages
        .iter()
        .filter(|x| role(x) == "user")
        .filter_map(|x| x["content"].as_str())
        .collect();
    assert_eq!(users[0], m[1]["content"], "the task stays, pinned");
    assert!(users[1].starts_with("question 7"), "{}", &users[1][..20]);
    check_sequence(&r.messages).unwrap();
}

#[test]
fn hard_limit_drops_whole_units_and_keeps_system_and_newest_turn() {
    let mut m = agent_run(30, 300);
    m.insert(3, sys("mid-way instructions"));
    let prune = PruneConfig {
        min_result_tokens: 1_000_000, // nothing clearable
        keep_steps: 1_000,            // nothing foldable
        ..Default::default()
    };
    let window = count(&m) / 2;
    let r = rewrite(run_with(
        &input(&m, window),
        &ContextConfig::default(),
        &prune,
    ));
    assert_eq!(r.record.stages, ["truncated"]);
    check_sequence(&r.messages).unwrap();
    assert_eq!(r.messages[0], m[0]);
    assert_eq!(r.messages[1], m[1], "the newest user message is kept");
    assert!(r.messages.contains(&m[3]), "system messages are kept");
    assert_eq!(r.messages.last(), m.last());
    assert_ne!(
        role(&r.messages[2]),
        "tool",
        "never begins on a tool message"
    );
    assert!(r.record.tokens_after as f64 <= window as f64 * 0.95);
}

#[test]
fn a_request_that_cannot_fit_is_rejected() {
    let m = vec![sys("s"), user(&"word ".repeat(5_000))];
    match run(&m, 2_000) {
        Plan::Reject {
            tokens,
            limit,
            window,
            refused,
        } => {
            assert!(!refused, "it cannot fit at all");
            assert!(tokens > limit);
            assert_eq!((limit, window), (1_900, 2_000));
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn later_turns_reuse_the_cuts_so_the_prefix_stays_identical() {
    let full = agent_run(80, 200);
    let window = 16_000;
    let mut previous: Option<(Vec<Value>, [usize; 9])> = None;
    let mut moves = 0;
    let mut rewritten = 0;
    // the client's requests: every prefix ending with a tool result
    for n in (4..=full.len()).step_by(2) {
        let Some(r) = Some(run(&full[..n], window))
            .filter(|p| matches!(p, Plan::Rewrite(_)))
            .map(rewrite)
        else {
            continue;
        };
        rewritten += 1;
        check_sequence(&r.messages).unwrap();
        assert!(r.record.tokens_after <= (window as f64 * 0.8) as u64);
        if let Some((prev, cuts)) = &previous {
            if *cuts == r.record.cuts {
                assert_eq!(
                    &r.messages[..prev.len()],
                    &prev[..],
                    "identical prefix between moves"
                );
            } else {
                moves += 1;
                assert!(
                    r.record.tokens_after <= window / 2,
                    "a move prunes down to the target"
                );
            }
        }
        previous = Some((r.messages.clone(), r.record.cuts));
    }
    assert!(rewritten > 20, "rewritten {rewritten}");
    assert!(
        moves * 4 < rewritten,
        "cuts moved {moves} times in {rewritten} rewritten turns"
    );
}

#[test]
fn the_calibration_ratio_scales_the_budget() {
    let m = agent_run(20, 300);
    let window = count(&m) * 10 / 7; // ~0.7: under the threshold at ratio 1
    assert!(matches!(run(&m, window), Plan::Forward { .. }));
    let mut i = input(&m, window);
    i.ratio = 1.3;
    assert!(matches!(
        run_with(&i, &ContextConfig::default(), &PruneConfig::default()),
        Plan::Rewrite(_)
    ));
}

#[test]
fn hybrid_prunes_until_the_summary_is_ready_then_uses_it() {
    let m = chat_loops(12, 400);
    let window = count(&m) * 10 / 9;
    let ctx = ContextConfig::default();
    let first = run_with(
        &with_summaries(input(&m, window), Rewriting::Hybrid, &[]),
        &ctx,
        &PruneConfig::default(),
    );
    let upto = wanted(&first).expect("a summary is wanted");
    assert!(
        upto > 0 && upto <= m.len() - 4,
        "keeps the newest messages: {upto}"
    );
    let Plan::Rewrite(pruned) = first else {
        panic!("pruned meanwhile")
    };
    assert!(!pruned.record.stages.contains(&"summarized"));
    check_sequence(&pruned.owned_messages()).unwrap();
    let ready = vec![(upto, summary_msg(upto))];
    let r = rewrite(run_with(
        &with_summaries(input(&m, window), Rewriting::Hybrid, &ready),
        &ctx,
        &PruneConfig::default(),
    ));
    assert!(r.record.stages.contains(&"summarized"), "{:?}", r.record);
    assert_eq!(r.record.summary_upto, upto);
    assert_eq!(r.wanted_summary, None, "nothing more to write");
    check_sequence(&r.messages).unwrap();
    assert_eq!(r.messages[0], m[0], "the client's system prompt first");
    assert_eq!(r.messages[1], m[1], "then the task, pinned");
    assert_eq!(
        r.messages[2],
        json!({"role": "assistant", "content": ready[0].1["content"]}),
        "then the summary, where its messages were, as an assistant message (strict role order)"
    );
    assert_eq!(
        r.messages[3..],
        m[upto..],
        "then the recent messages, untouched"
    );
    assert!(
        r.pruned.iter().any(|p| p.call_id == "c0"),
        "summarized calls stay recallable"
    );
    assert!(r.record.tokens_after <= window / 2);
}

#[test]
fn summarize_keeps_the_task_of_a_single_long_run() {
    let m = agent_run(40, 200);
    let window = count(&m) * 10 / 9;
    let ctx = ContextConfig::default();
    let first = run_with(
        &with_summaries(input(&m, window), Rewriting::Summarize, &[]),
        &ctx,
        &PruneConfig::default(),
    );
    let upto = wanted(&first).unwrap();
    let ready = vec![(upto, summary_msg(upto))];
    let r = rewrite(run_with(
        &with_summaries(input(&m, window), Rewriting::Summarize, &ready),
        &ctx,
        &PruneConfig::default(),
    ));
    assert_eq!(r.record.stages, ["summarized"], "summarize does not clear");
    assert_eq!(
        &r.messages[..2],
        &[m[0].clone(), m[1].clone()],
        "system, task"
    );
    assert_eq!(
        r.messages[2],
        json!({"role": "assistant", "content": ready[0].1["content"]}),
        "then the summary, as an assistant message"
    );
    assert_eq!(
        r.messages[3],
        json!({"role": "user", "content": roles::GAP_TEXT}),
        "a gap's message before the run's next call (which has no text to join)"
    );
    assert_eq!(r.messages[4], m[upto]);
    check_sequence(&r.messages).unwrap();
}

#[test]
fn a_summary_is_precomputed_before_the_threshold() {
    let m = agent_run(20, 300);
    let window = count(&m) * 10 / 7; // ~0.7: over precompute_at, under the threshold
    let p = run_with(
        &with_summaries(input(&m, window), Rewriting::Hybrid, &[]),
        &ContextConfig::default(),
        &PruneConfig::default(),
    );
    assert!(
        matches!(
            p,
            Plan::Forward {
                wanted_summary: Some(_),
                ..
            }
        ),
        "{p:?}"
    );
    // once one is ready that would bring the next rewrite under the target, no other is wanted
    let upto = wanted(&p).unwrap();
    let ready = vec![(upto, summary_msg(upto))];
    let p = run_with(
        &with_summaries(input(&m, window), Rewriting::Hybrid, &ready),
        &ContextConfig::default(),
        &PruneConfig::default(),
    );
    assert_eq!(wanted(&p), None);
}

// ---- property tests ----

/// Random valid histories: loops of user messages (string, null, empty or parts content), parallel tool calls with
/// results from empty to huge, mid-way system messages, consecutive user messages, unfinished loops.
fn history() -> impl Strategy<Value = Vec<Value>> {
    let content = prop_oneof![
        (0usize..400).prop_map(|n| json!("lorem ipsum ".repeat(n))),
        Just(Value::Null),
        Just(json!("")),
        (0usize..50).prop_map(|n| json!([{"type":"text","text":"part ".repeat(n)},{"type":"image_url","image_url":{"url":"data:x"}}])),
    ];
    let round = prop::collection::vec(prop_oneof![Just(0usize), 1usize..30, 200usize..1500], 1..4);
    let lp = (
        content,
        prop::collection::vec(round, 0..5),
        any::<bool>(),
        any::<bool>(),
        (any::<bool>(), prop_oneof![Just(0usize), 300usize..1200]),
    );
    (any::<bool>(), prop::collection::vec(lp, 1..10)).prop_map(|(start_with_reply, loops)| {
        let mut m = vec![sys("system prompt")];
        if start_with_reply {
            m.push(reply("Hello! How can I help?"));
        }
        let mut id = 0;
        for (content, rounds, finished, mid_system, (double_user, arg_words)) in loops {
            if double_user {
                m.push(user("also this"));
            }
            m.push(json!({"role":"user","content":content}));
            if mid_system {
                m.push(sys("mid-way note"));
            }
            for round in rounds {
                let ids: Vec<String> = round
                    .iter()
                    .map(|_| {
                        id += 1;
                        format!("call_{id}")
                    })
                    .collect();
                // Some loops write files: their calls carry large arguments.
                m.push(if arg_words > 0 {
                    writes(&ids, arg_words)
                } else {
                    calls(&ids)
                });
                for (i, words) in ids.iter().zip(round) {
                    m.push(result(i, words));
                }
            }
            if finished {
                m.push(reply(&"done ".repeat(id % 300)));
            }
        }
        m
    })
}

/// Whether `o` is the assistant message `t` with some tool-call arguments cleared (valid JSON naming the call),
/// and nothing else changed.
fn cleared_inputs_of(o: &Value, t: &Value) -> bool {
    let (oc, tc) = (crate::message::tool_calls(o), crate::message::tool_calls(t));
    let same_rest = o.get("content") == t.get("content") && oc.len() == tc.len() && !oc.is_empty();
    same_rest
        && oc.iter().zip(tc).all(|(a, b)| {
            let args = a["function"]["arguments"].as_str().unwrap_or("");
            a == b
                || (a["id"] == b["id"]
                    && shape::is_cleared_input(args)
                    && serde_json::from_str::<Value>(args).is_ok_and(|v| {
                        v["call_id"] == b["id"] && v["tool"] == b["function"]["name"]
                    }))
        })
}

fn check_invariants(m: &[Value], window: u64, ctx: &ContextConfig) -> Result<(), TestCaseError> {
    check_with(input(m, window), ctx)
}

fn check_with(i: PlanInput, ctx: &ContextConfig) -> Result<(), TestCaseError> {
    let (m, window) = (i.messages, i.window);
    let prune = PruneConfig::default();
    let before = m.to_vec();
    let counter = TokenCounter::new();
    let p = plan(&i, ctx, &prune, &counter);
    prop_assert_eq!(m, &before[..], "the client's messages are untouched");
    prop_assert_eq!(
        &p,
        &plan(&i, ctx, &prune, &TokenCounter::new()),
        "deterministic"
    );
    let r = match p {
        Plan::Rewrite(r) => r,
        Plan::Forward { .. } | Plan::Reject { .. } => return Ok(()),
    };
    prop_assert_eq!(
        r.estimate,
        counter.request_tokens(Encoding::O200k, &r.messages, i.tools),
        "the estimate is the count of what is sent"
    );
    let owned = r.owned_messages();
    let out = &owned;
    prop_assert!(
        check_sequence(out).is_ok(),
        "invalid: {:?}",
        check_sequence(out)
    );
    if i.strict_roles {
        prop_assert_eq!(roles::check_roles(m, out), Ok(()), "strict role order");
    }
    let ours = |v: &Value| {
        v["content"]
            .as_str()
            .is_some_and(|c| c.starts_with(SUMMARY))
    };
    let systems = |x: &[Value]| {
        x.iter()
            .filter(|v| is_system(v) && !ours(v))
            .cloned()
            .collect::<Vec<_>>()
    };
    prop_assert_eq!(systems(out), systems(m), "system messages kept");
    prop_assert_eq!(out.last(), m.last(), "newest message kept");
    // (ctxgate's own messages aside: a gap's message in strict role order)
    let newest_user = |x: &[Value]| {
        x.iter()
            .rev()
            .find(|v| role(v) == "user" && crate::message::message_text(v) != roles::GAP_TEXT)
            .cloned()
    };
    prop_assert_eq!(newest_user(out), newest_user(m), "newest user message kept");
    if let Some(task) = m.iter().find(|v| crate::message::opens_turn(v)) {
        let whole = out.contains(task);
        let pinned = out.iter().any(|o| {
            o["content"]
                .as_str()
                .is_some_and(|c| c.contains(shape::PINNED_MARKER))
        });
        prop_assert!(whole || pinned, "the task (first user message) is sent");
    }
    let deep = ["truncated", "summarized", "folded"];
    if !r.record.stages.iter().any(|s| deep.contains(s)) {
        // the current run loop keeps every message; only its older tool results may be cleared
        let current = run_loops(m, None).loops.last().map_or(0, |l| l.start);
        let tail = &m[current..];
        prop_assert!(out.len() >= tail.len());
        for (o, t) in out[out.len() - tail.len()..].iter().zip(tail) {
            prop_assert!(
                o == t
                    || (role(t) == "tool"
                        && shape::is_placeholder(o)
                        && o["tool_call_id"] == t["tool_call_id"])
                    || cleared_inputs_of(o, t),
                "the current run loop is sent whole (stages {:?}): sent {}, the client's {}",
                r.record.stages,
                o,
                t
            );
        }
    }
    prop_assert_eq!(
        r.record.tokens_after,
        counter.request_tokens(Encoding::O200k, out, i.tools)
    );
    prop_assert!(r.record.tokens_after as f64 <= ctx.hard_limit.max(ctx.threshold) * window as f64);
    // idempotent: rewriting the output changes nothing (summaries are keyed by the prefix they cover, so a
    // summarized output is checked for validity and determinism only; an output left above the threshold because
    // a further re-cut would not remove `clear_at_least` is not a fixed point either: its own replay re-cuts)
    let ratio = (window as f64 / r.record.tokens_after.max(1) as f64).min(100.0);
    if r.record.stages.contains(&"summarized") || ratio < 1.0 / ctx.threshold {
        return Ok(());
    }
    let mut again = input(out, window);
    again.tools = i.tools;
    match plan(&again, ctx, &prune, &counter) {
        Plan::Forward { .. } => {}
        Plan::Rewrite(again) => prop_assert_eq!(&again.owned_messages(), out, "idempotent"),
        Plan::Reject { .. } => prop_assert!(false, "the output of a rewrite was rejected"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn rewrites_keep_every_invariant(m in history(), window in prop_oneof![Just(1_500u64), Just(4_000), Just(16_000)]) {
        check_invariants(&m, window, &ContextConfig::default())?;
    }

    /// Summaries: the rewrite that uses a ready summary keeps every invariant and is deterministic given it.
    #[test]
    fn summarized_rewrites_keep_every_invariant(
        m in history(),
        window in prop_oneof![Just(1_500u64), Just(4_000)],
        hybrid in any::<bool>(),
    ) {
        let strategy = if hybrid { Rewriting::Hybrid } else { Rewriting::Summarize };
        let ctx = ContextConfig::default();
        let first = run_with(&with_summaries(input(&m, window), strategy, &[]), &ctx, &PruneConfig::default());
        check_with(with_summaries(input(&m, window), strategy, &[]), &ctx)?;
        if let Some(upto) = wanted(&first) {
            let ready = vec![(upto, summary_msg(upto))];
            check_with(with_summaries(input(&m, window), strategy, &ready), &ctx)?;
        }
    }

    /// With the hard limit at the target, a first rewrite (the turn before went through whole) must reach the
    /// target unless it is refused.
    #[test]
    fn the_target_is_reached_whenever_achievable(m in history(), window in prop_oneof![Just(2_000u64), Just(6_000)]) {
        let ctx = ContextConfig { threshold: 0.8, target: 0.5, hard_limit: 0.5, ..ContextConfig::default() };
        check_invariants(&m, window, &ctx)?;
        let first = matches!(run_with(&input(&m[..m.len() - 1], window), &ctx, &PruneConfig::default()), Plan::Forward { .. });
        if let (true, Plan::Rewrite(r)) = (first, run_with(&input(&m, window), &ctx, &PruneConfig::default())) {
            prop_assert!(r.record.tokens_after <= window / 2, "{:?}", r.record);
        }
    }
}

mod fold;
mod round2;
mod round3;
mod round4;
mod tools;
