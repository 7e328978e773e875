//! Tools that never flicker: once ctxgate's recall tools are in a session's upstream requests, every later request
//! of it carries the same tools bytes (`decide::plan_cuts` cuts deeper rather than leave them out), and from
//! `recall.offer_at` of the threshold they are offered before the first rewrite.

use super::*;
use crate::config::Config;
use crate::context::body::RewrittenBody;
use crate::context::decide::{self, Decision};
use crate::dialect::Dialect;
use crate::recall::Offer;

/// The tools an agent's requests offer.
fn agent_tools() -> Value {
    json!([{"type":"function","function":{"name":"bash","parameters":{"type":"object"}}}])
}

/// What goes upstream for one request of `messages` (chat, the agent's tools): the body's bytes, `None` when
/// refused.
fn upstream(messages: &[Value], window: u64, cfg: &Config) -> Option<Value> {
    let body = json!({"model": "gpt-4o", "messages": messages, "tools": agent_tools()});
    let map = body.as_object().unwrap();
    let offer = Offer::new(Dialect::Chat, map, &cfg.recall);
    let req = decide_request(map, messages, window, cfg.context.strategy, false);
    let counter = TokenCounter::new();
    let plan = decide::plan_cuts(&req, None, cfg, &offer, &counter);
    let serialise = |b: &RewrittenBody<'_>| b.to_vec();
    match decide::render(&req, plan, (cfg, &offer), &counter, &serialise).unwrap() {
        Decision::Forward { .. } => Some(body),
        Decision::Rewrite(r) => {
            let hard = (cfg.context.hard_limit * window as f64) as u64;
            assert!(
                r.estimate <= hard,
                "{} tokens sent, over the hard limit {hard}",
                r.estimate
            );
            Some(serde_json::from_slice(&r.body).unwrap())
        }
        Decision::Reject { .. } => None,
    }
}

/// The tools bytes of a body, and whether ctxgate's recall tool is among them.
fn tools_of(body: &Value, cfg: &Config) -> (Vec<u8>, bool) {
    let tools = &body["tools"];
    let ours = tools.as_array().is_some_and(|a| {
        a.iter()
            .any(|t| t["function"]["name"] == cfg.recall.tool_name.as_str())
    });
    (serde_json::to_vec(tools).unwrap(), ours)
}

/// The session's requests, one per turn (each turn adds a step), checked: once ctxgate's tools appear, every later
/// request carries the identical tools bytes. Returns the turn they first appeared at.
fn check_session(m: &[Value], window: u64, cfg: &Config) -> Result<Option<usize>, String> {
    let mut first: Option<(usize, Vec<u8>)> = None;
    for n in 3..=m.len() {
        // A turn ends where the agent's request goes out: after a tool result (or a user message).
        if role(&m[n - 1]) == "assistant" {
            continue;
        }
        let Some(body) = upstream(&m[..n], window, cfg) else {
            continue;
        };
        let (bytes, ours) = tools_of(&body, cfg);
        match &first {
            None if ours => first = Some((n, bytes)),
            Some((at, seen)) if *seen != bytes => {
                return Err(format!(
                    "the tools first sent with {at} messages changed with {n} messages (window {window}): \
                     {} bytes, then {}",
                    seen.len(),
                    bytes.len()
                ));
            }
            _ => {}
        }
    }
    Ok(first.map(|(n, _)| n))
}

/// A long single-task run with results of `words(i)` words.
fn run(n: usize, words: impl Fn(usize) -> usize) -> Vec<Value> {
    let mut m = vec![
        sys("You are a coding agent."),
        user("Fix the failing test."),
    ];
    for i in 0..n {
        let id = format!("call_{i}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, words(i)));
    }
    m
}

#[test]
fn the_tools_stay_when_a_rewrite_is_near_the_hard_limit() {
    // Cut points that stand while the request fits under the hard limit leave it close to it: the recall tools
    // and note would take it past, and were left out (and back on the next re-cut).
    let m = run(60, |i| 150 + (i * 37) % 400);
    let cfg = Config::default();
    for window in [4_000u64, 6_000, 8_000] {
        let first = check_session(&m, window, &cfg).unwrap();
        assert!(first.is_some(), "the tools were offered (window {window})");
    }
}

#[test]
fn the_tools_are_offered_before_the_first_rewrite_from_offer_at() {
    let m = run(70, |_| 120);
    let window = 16_000;
    let mut cfg = Config::default();
    cfg.recall.offer_at = 0.5;
    let threshold = cfg.context.threshold * window as f64;
    let counter = TokenCounter::new();
    let tools = agent_tools();
    let tokens = |n: usize| counter.request_tokens(Encoding::O200k, &m[..n], Some(&tools)) as f64;
    // The first request at or over half the threshold carries the tools, with the client's messages as sent.
    let n = (3..=m.len())
        .filter(|&n| role(&m[n - 1]) == "tool")
        .find(|&n| tokens(n) >= 0.5 * threshold)
        .unwrap();
    assert!(tokens(n) < threshold, "under the threshold: no rewrite");
    let before = upstream(&m[..n - 2], window, &cfg).unwrap();
    assert!(
        !tools_of(&before, &cfg).1,
        "under offer_at: as the client sent it"
    );
    let body = upstream(&m[..n], window, &cfg).unwrap();
    assert!(tools_of(&body, &cfg).1, "offered");
    assert_eq!(
        body["messages"].as_array().unwrap(),
        &m[..n],
        "messages untouched"
    );
    assert_eq!(body["tools"][0], tools[0], "the client's tools first");
    assert_eq!(check_session(&m, window, &cfg).unwrap(), Some(n));
    // At 1, not before the threshold.
    cfg.recall.offer_at = 1.0;
    let later = check_session(&m, window, &cfg).unwrap().unwrap();
    assert!(tokens(later) >= threshold, "{later}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A session's turns: once ctxgate's tools are in its upstream requests, every later one carries the same
    /// tools bytes, whatever `offer_at`, the window and the results' sizes.
    #[test]
    fn once_offered_the_tools_never_change(
        steps in prop::collection::vec(prop_oneof![Just(5usize), 40usize..200, 200usize..700], 10..60),
        window in prop_oneof![Just(4_000u64), Just(8_000), Just(16_000)],
        offer_at in prop_oneof![Just(0.5f64), Just(0.75), Just(1.0)],
    ) {
        let m = run(steps.len(), |i| steps[i]);
        let mut cfg = Config::default();
        cfg.recall.offer_at = offer_at;
        check_session(&m, window, &cfg).map_err(TestCaseError::fail)?;
    }
}

/// A request forwarded with the tools offered that then crosses the threshold without anything to clear (every
/// result among the newest kept): the tools would take the forward past the hard limit, so it is cut for them.
#[test]
fn the_tools_stay_when_an_offered_request_has_nothing_to_clear() {
    let steps = [432usize, 695, 600, 5, 5, 5, 5, 5, 5, 5];
    let m = run(steps.len(), |i| steps[i]);
    let mut cfg = Config::default();
    cfg.recall.offer_at = 0.5;
    assert_eq!(check_session(&m, 4_000, &cfg), Ok(Some(6)));
}
