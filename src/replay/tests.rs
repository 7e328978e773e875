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
    // a summary call per distinct summary asked for
    let mut distinct: Vec<usize> = r.steps.iter().filter_map(|s| s.wanted_summary).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(r.totals.summary_calls, distinct.len());
    assert!(r.totals.summary_calls > 0 && r.totals.summary_calls <= r.totals.summaries_wanted);
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
        (json!({"messages":[1]}), "item 0 of `messages`"),
    ] {
        let e = replay_trace(&v, &ReplayOptions::default(), &cfg).unwrap_err();
        assert!(e.contains(needle), "{e}");
    }
}

fn map(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// The cache figures of `bodies` sent one after the other in `dialect`.
fn sequence(dialect: Dialect, bodies: &[Value]) -> Vec<cache::Cached> {
    let w = Weights::new();
    let mut seq = Sequence::default();
    bodies
        .iter()
        .map(|b| seq.push(w.shape(Encoding::O200k, dialect, b.as_object().unwrap())))
        .collect()
}

#[test]
fn pure_appends_hit_the_cache_and_a_changed_system_message_misses_it() {
    let sys = json!({"role":"system","content":"You are a coding agent."});
    let note = json!({"role":"system","content":"You are a coding agent.\n\nRecallable: call_1 (read_file)."});
    let u1 = json!({"role":"user","content":"Fix the parser."});
    let a1 = json!({"role":"assistant","content":"Looking at it now, reading the file first."});
    let u2 = json!({"role":"user","content":"It is in src/parse.rs."});
    let a2 = json!({"role":"assistant","content":"Found it."});
    let u3 = json!({"role":"user","content":"Good."});
    let bodies = [
        json!({"model":"m","messages":[sys, u1]}),
        json!({"model":"m","messages":[sys, u1, a1, u2]}),
        // the first system message changes (a note appended): only the `tools` item (null) is still shared
        json!({"model":"m","messages":[note, u1, a1, u2, a2, u3]}),
        // and appending after that is a hit again
        json!({"model":"m","messages":[note, u1, a1, u2, a2, u3, a1, u2]}),
    ];
    let c = sequence(Dialect::Chat, &bodies);
    assert_eq!((c[0].cached, c[0].extends), (0, None));
    assert_eq!((c[1].cached, c[1].extends), (c[0].tokens, Some(true)));
    let null = cache::Weights::new()
        .shape(Encoding::O200k, Dialect::Chat, &map(json!({})))
        .tokens();
    assert_eq!((c[2].cached, c[2].extends), (null, Some(false)));
    assert!(cache::billed(c[2].tokens, c[2].cached) > 0.99 * c[2].tokens as f64);
    assert_eq!((c[3].cached, c[3].extends), (c[2].tokens, Some(true)));
    // the client's own history (every request an append) is billed 10% for what it repeats
    let client = sequence(Dialect::Chat, &bodies[..2]);
    let billed: f64 = client
        .iter()
        .map(|c| cache::billed(c.tokens, c.cached))
        .sum();
    let expected = c[0].tokens as f64 + c[1].tokens as f64 - 0.9 * c[0].tokens as f64;
    assert!((billed - expected).abs() < 1e-9);
}

#[test]
fn the_anthropic_system_and_tools_are_prefix_items() {
    let tools = json!([{"name":"read_file","input_schema":{"type":"object"}}]);
    let more = json!([{"name":"read_file","input_schema":{"type":"object"}},
        {"name":"recall_tool_call","input_schema":{"type":"object"}}]);
    let u = json!({"role":"user","content":"Fix the parser."});
    let a = json!({"role":"assistant","content":"Done."});
    let bodies = [
        json!({"model":"m","system":"S","tools":tools,"messages":[u]}),
        json!({"model":"m","system":"S","tools":tools,"messages":[u, a, u]}),
        // a changed system: the tools item alone is shared
        json!({"model":"m","system":"S + note","tools":tools,"messages":[u, a, u, a, u]}),
        // changed tools: nothing is shared
        json!({"model":"m","system":"S + note","tools":more,"messages":[u, a, u, a, u, a, u]}),
    ];
    let c = sequence(Dialect::Anthropic, &bodies);
    assert_eq!(c[1].extends, Some(true));
    assert_eq!(c[1].cached, c[0].tokens);
    let w = Weights::new();
    let tools_only = w.shape(Encoding::O200k, Dialect::Anthropic, &map(bodies[0].clone()));
    assert_eq!(c[2].cached, tools_only.weights[0]);
    assert_eq!((c[3].cached, c[3].extends), (0, Some(false)));
}

#[test]
fn forwarding_everything_costs_what_the_client_pays() {
    let opts = ReplayOptions {
        window: Some(4000),
        strategy: Some(Strategy::Off),
        ..Default::default()
    };
    let r = replay_trace(&trace(20, 40), &opts, &Config::default()).unwrap();
    for (prev, s) in r.steps.iter().zip(&r.steps[1..]) {
        assert_eq!(s.prefix_stable, Some(true));
        assert_eq!(
            s.wire_cached, prev.wire_tokens,
            "an append caches the whole previous request"
        );
        assert_eq!(
            (s.wire_tokens, s.wire_cached),
            (s.client_wire_tokens, s.client_wire_cached)
        );
    }
    assert_eq!(r.steps[0].prefix_stable, None);
    let t = &r.totals;
    assert_eq!((t.prefix_stable, t.cache_cost), (Some(1.0), Some(1.0)));
    assert_eq!((t.task_whole_share, t.valid_share), (None, Some(1.0)));
    assert!(
        t.over_window > 0,
        "sent whole, the late requests exceed a 4000-token window"
    );
    assert_eq!(
        t.over_window,
        r.steps.iter().filter(|s| s.upstream_tokens > 4000).count()
    );
}

#[test]
fn a_rewrite_that_adds_the_recall_tools_breaks_the_prefix() {
    let opts = ReplayOptions {
        window: Some(4000),
        strategy: Some(Strategy::Prune),
        ..Default::default()
    };
    let r = replay_trace(&trace(30, 40), &opts, &Config::default()).unwrap();
    let first = r
        .steps
        .iter()
        .position(|s| s.outcome == Outcome::Rewrite)
        .unwrap();
    assert!(first > 0);
    let (prev, s) = (&r.steps[first - 1], &r.steps[first]);
    // the tools item changes (the recall tools are added): nothing is read from the cache
    assert_eq!((s.prefix_stable, s.wire_cached), (Some(false), 0));
    assert_eq!(s.client_wire_cached, prev.client_wire_tokens);
    let t = &r.totals;
    let billed: f64 = r
        .steps
        .iter()
        .map(|s| cache::billed(s.wire_tokens, s.wire_cached))
        .sum();
    let client: f64 = r
        .steps
        .iter()
        .map(|s| cache::billed(s.client_wire_tokens, s.client_wire_cached))
        .sum();
    assert_eq!((t.billed, t.client_billed), (billed, client));
    assert_eq!(t.cache_cost, Some(billed / client));
    assert!(t.prefix_stable_pairs < t.prefix_pairs);
    assert_eq!(t.prefix_pairs, r.steps.len() - 1);
    // the task (the only user message) is kept
    assert_eq!(t.task_whole, t.rewritten);
}

/// `(request, shape of a sent body)` for `client` and `sent` bodies in `dialect`.
fn task(dialect: Dialect, client: &Value, sent: &Value) -> bool {
    let raw = bytes::Bytes::from(serde_json::to_vec(client).unwrap());
    let request = dialect.parse(raw, &Default::default()).unwrap();
    let shape = Weights::new().shape(Encoding::O200k, dialect, sent.as_object().unwrap());
    task_whole(&request, &shape)
}

#[test]
fn the_task_is_whole_only_when_the_first_user_message_is_sent_byte_for_byte() {
    let sys = json!({"role":"system","content":"You are a coding agent."});
    let task1 = json!({"role":"user","content":"Task: fix the parser. Details follow at length."});
    let cut = json!({"role":"user","content":"Task: fix the parser. [...]"});
    let a = json!({"role":"assistant","content":"Done."});
    let u2 = json!({"role":"user","content":"Next task."});
    let summary = json!({"role":"system","content":"Summary of the earlier conversation."});
    let client = json!({"model":"m","messages":[sys, task1, a, u2]});
    let chat = |m: Value| json!({"model":"m","messages":m});
    assert!(task(Dialect::Chat, &client, &client));
    // moved (a summary before it) but byte-equal: whole
    assert!(task(
        Dialect::Chat,
        &client,
        &chat(json!([sys, summary, task1, a, u2]))
    ));
    assert!(!task(Dialect::Chat, &client, &chat(json!([sys, u2]))));
    assert!(!task(
        Dialect::Chat,
        &client,
        &chat(json!([sys, cut, a, u2]))
    ));
    // the system prompt carrying the same text does not count: the message itself must be there
    let in_system =
        json!({"role":"system","content":"Task: fix the parser. Details follow at length."});
    assert!(!task(Dialect::Chat, &client, &chat(json!([in_system, u2]))));
    // no user message: nothing to lose
    let bare = json!({"model":"m","messages":[sys]});
    assert!(task(Dialect::Chat, &bare, &bare));
    // Anthropic: the client's own message (its wire form), not its neutral form
    let client = json!({"model":"m","max_tokens":100,"system":"S","messages":[
        {"role":"user","content":[{"type":"text","text":"Task: fix it."}]},
        {"role":"assistant","content":"Done."},{"role":"user","content":"Next."}]});
    assert!(task(Dialect::Anthropic, &client, &client));
    let neutral_form = json!({"model":"m","system":"S","messages":[
        {"role":"user","content":"Task: fix it."},{"role":"assistant","content":"Done."},
        {"role":"user","content":"Next."}]});
    assert!(!task(Dialect::Anthropic, &client, &neutral_form));
    // the first user message of Responses input items
    let client = json!({"model":"m","input":[
        {"type":"message","role":"developer","content":"D"},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"Task."}]},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"More."}]}]});
    assert!(task(Dialect::Responses, &client, &client));
    let dropped = json!({"model":"m","input":[
        {"type":"message","role":"developer","content":"D"},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"More."}]}]});
    assert!(!task(Dialect::Responses, &client, &dropped));
}
