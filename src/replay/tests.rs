//! Unit tests of the replay: hand-made traces through the planner, and the prompt-cache figures on hand-made
//! request sequences.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use serde_json::json;

/// system, user, then `n` tool loops with results of ~`size` words, and a final reply.
fn trace(n: usize, size: usize) -> Value {
    let mut m = vec![
        json!({"role":"system","content":"You are a coding agent."}),
        json!({"role":"user","content":"Fix the bug in the parser."}),
    ];
    for i in 0..n {
        let id = format!("call_{i}");
        m.push(
            json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
            "function":{"name":"read_file","arguments":format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}),
        );
        let body = format!("line {i} of some file ").repeat(size);
        m.push(json!({"role":"tool","tool_call_id":id,"content":body}));
    }
    m.push(json!({"role":"assistant","content":"Fixed."}));
    json!({"id":"hand","model":"gpt-4o (agent)","tools":[],"messages":m})
}

#[test]
fn small_trace_is_forwarded_whole() {
    let r = replay_trace(&trace(3, 10), &ReplayOptions::default(), &Config::default()).unwrap();
    assert_eq!(
        (r.model.as_str(), r.window, r.encoding),
        ("gpt-4o", 128_000, "o200k_base")
    );
    assert_eq!(r.steps.len(), 4);
    assert_eq!(
        r.steps.iter().map(|s| s.index).collect::<Vec<_>>(),
        [2, 4, 6, 8]
    );
    assert!(r
        .steps
        .iter()
        .all(|s| s.outcome == Outcome::Forward && s.valid && s.upstream_tokens == s.client_tokens));
    assert_eq!(r.totals.savings, 0.0);
    assert_eq!(r.totals.mean_ratio_above, None);
}

#[test]
fn large_trace_is_rewritten_validly_and_cheaper() {
    let opts = ReplayOptions {
        window: Some(4000),
        ..Default::default()
    };
    let r = replay_trace(&trace(30, 40), &opts, &Config::default()).unwrap();
    let above: Vec<&ReplayStep> = r.steps.iter().filter(|s| s.above_threshold).collect();
    assert!(!above.is_empty());
    for s in &r.steps {
        assert!(s.valid, "step {}: {:?}", s.index, s.problem);
        assert_ne!(s.outcome, Outcome::Reject);
    }
    for s in above {
        assert_eq!(s.outcome, Outcome::Rewrite);
        assert!(s.upstream_tokens < s.client_tokens);
        assert!(s.stages.contains(&"cleared") && s.pruned_calls > 0);
        assert!(
            s.recounted_tokens.is_some_and(|r| r < s.upstream_tokens),
            "the recall tools and note are counted"
        );
    }
    let t = &r.totals;
    assert_eq!((t.invalid, t.rejected), (0, 0));
    assert!(t.rewritten >= t.above_threshold && t.savings > 0.0);
    assert!(t.mean_ratio_above.is_some_and(|m| m < 1.0));
    let mut text = Vec::new();
    write_text(&mut text, "hand", &r).unwrap();
    write_summary(&mut text, &[("hand".into(), r)]).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("results cleared") && text.contains("overall"));
}

#[test]
fn options_override_model_window_and_strategy() {
    let opts = ReplayOptions {
        window: Some(4000),
        strategy: Some(Strategy::Off),
        model: Some("gpt-4".into()),
        summaries: false,
        dialect: None,
    };
    let r = replay_trace(&trace(30, 40), &opts, &Config::default()).unwrap();
    assert_eq!((r.encoding, r.strategy), ("cl100k_base", "off"));
    assert!(r
        .steps
        .iter()
        .all(|s| s.outcome == Outcome::Forward && s.valid));
    assert_eq!(r.totals.mean_ratio_above, Some(1.0));
}

#[test]
fn simulated_summaries_are_sent_on_later_turns() {
    let opts = ReplayOptions {
        window: Some(4000),
        strategy: Some(Strategy::Summarize),
        summaries: true,
        ..Default::default()
    };
    let r = replay_trace(&trace(30, 40), &opts, &Config::default()).unwrap();
    assert!(r.summaries);
    for s in &r.steps {
        assert!(s.valid, "step {}: {:?}", s.index, s.problem);
        assert_ne!(s.outcome, Outcome::Reject);
    }
    let first = r.steps.iter().position(|s| s.wanted_summary.is_some());
    let first = first.unwrap();
    assert_eq!(r.steps[first].summary_upto, 0);
    assert!(r.steps[first + 1..].iter().any(|s| s.summary_upto > 0));
    assert!(r.totals.summarized > 0 && r.totals.summarized <= r.totals.rewritten);
    let t = TokenCounter::new().message_tokens(Encoding::O200k, &stand_in_summary(9, 1000));
    assert!((900..=1000).contains(&t), "{t}");
}

#[test]
fn invalid_history_and_non_traces_are_reported() {
    let bad = json!({"messages":[{"role":"tool","tool_call_id":"x","content":"orphan"},
        {"role":"assistant","content":"hi"}]});
    let r = replay_trace(&bad, &ReplayOptions::default(), &Config::default()).unwrap();
    assert!(!r.steps[0].valid && r.totals.invalid == 1);
    let cfg = Config::default();
    for (v, needle) in [
        (json!([1]), "JSON object"),
        (json!({"id":"x"}), "\"messages\""),
        (json!({"messages":[1]}), "message 0"),
    ] {
        let e = replay_trace(&v, &ReplayOptions::default(), &cfg).unwrap_err();
        assert!(e.contains(needle), "{e}");
    }
}
