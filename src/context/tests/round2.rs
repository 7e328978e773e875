//! Planner tests of the second round: the pinned task, nudges, cleared tool inputs, excluded tools, re-cuts that
//! must pay, the message-count trigger, and where the note goes.

use super::*;
use crate::config::ToolSelection;
use crate::context::runloop::run_loops_with;

/// The tools an agent's requests offer.
fn agent_tools() -> Value {
    json!([{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}])
}

/// An agent run whose calls write files: `n` calls with arguments of about `words` words and small results.
fn writing_run(n: usize, words: usize) -> Vec<Value> {
    let mut m = vec![sys("You are a coding agent."), user("Fix the bug.")];
    for i in 0..n {
        let id = format!("call_{i}");
        m.push(writes(std::slice::from_ref(&id), words));
        m.push(result(&id, 120));
    }
    m
}

fn args(m: &Value) -> &str {
    m["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap_or("")
}

#[test]
fn a_huge_task_is_pinned_as_head_and_tail() {
    let task = format!("TASK START {} TASK END", "detail ".repeat(9000));
    let mut m = chat_loops(12, 400);
    m[1] = user(&task);
    let window = count(&m) * 10 / 9;
    let prune = PruneConfig {
        max_pinned_tokens: 1000,
        ..Default::default()
    };
    let r = rewrite(run_with(
        &input(&m, window),
        &ContextConfig::default(),
        &prune,
    ));
    assert!(r.record.stages.contains(&"pruned"), "{:?}", r.record);
    let sent = r.messages[1]["content"].as_str().unwrap();
    assert!(sent.starts_with("TASK START") && sent.ends_with("TASK END"));
    assert!(sent.contains(shape::PINNED_MARKER));
    let tokens = count(&r.messages[1..2]);
    assert!(
        (900..1200).contains(&tokens),
        "about max_pinned_tokens: {tokens}"
    );
    check_sequence(&r.messages).unwrap();
}

#[test]
fn the_task_survives_the_hard_limit() {
    let m = chat_loops(30, 300);
    let window = count(&m) / 3;
    let prune = PruneConfig {
        keep_run_loops: 25,
        max_run_loops: 50,
        ..Default::default()
    };
    let r = rewrite(run_with(
        &input(&m, window),
        &ContextConfig::default(),
        &prune,
    ));
    assert!(r.record.dropped_messages > 0, "{:?}", r.record);
    assert_eq!(r.messages[1], m[1], "the task is kept whole");
    check_sequence(&r.messages).unwrap();
}

#[test]
fn a_nudged_run_is_one_loop_and_keeps_its_dialogue_when_pruned() {
    let mut m = vec![
        sys("agent"),
        user(&format!("Fix it. {}", "context ".repeat(80))),
    ];
    for i in 0..6 {
        let id = format!("a{i}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, 300));
    }
    m.push(reply("I will now think without a tool."));
    m.push(user("No tool calls found in your response."));
    for i in 0..6 {
        let id = format!("b{i}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, 300));
    }
    m.push(reply("Fixed."));
    // Two more runs after it, so the nudged run is a past one and gets pruned.
    for l in 0..2 {
        m.push(user(&format!("next task {l} {}", "words ".repeat(80))));
        let id = format!("n{l}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, 300));
        m.push(reply("ok"));
    }
    let loops = run_loops_with(&m, None, true).loops;
    assert_eq!(loops.len(), 3, "the nudge does not open a loop");
    let tools = agent_tools();
    let window = count(&m) * 10 / 9;
    let ctx = ContextConfig {
        clear_at_least: crate::config::TokenAmount::Tokens(0),
        ..Default::default()
    };
    let prune = PruneConfig {
        keep_tool_results: 100,
        keep_run_loops: 1,
        ..Default::default()
    };
    let mut i = input(&m, window);
    i.tools = Some(&tools);
    let r = rewrite(run_with(&i, &ctx, &prune));
    assert!(r.record.pruned_loops >= 1, "{:?}", r.record);
    check_sequence(&r.messages).unwrap();
    let texts: Vec<&str> = r
        .messages
        .iter()
        .filter_map(|x| x["content"].as_str())
        .collect();
    assert!(texts.iter().any(|t| t.starts_with("Fix it.")), "the task");
    for kept in ["I will now think", "No tool calls found", "Fixed."] {
        assert!(texts.iter().any(|t| t.starts_with(kept)), "{kept} kept");
    }
}

#[test]
fn past_tool_inputs_are_cleared_to_valid_placeholders() {
    let m = writing_run(12, 900);
    let window = count(&m) * 10 / 9;
    let r = rewrite(run(&m, window));
    check_sequence(&r.messages).unwrap();
    let cleared: Vec<&Value> = r
        .messages
        .iter()
        .filter(|x| shape::is_cleared_input(args(x)))
        .collect();
    assert!(!cleared.is_empty(), "{:?}", r.record);
    let first: Value = serde_json::from_str(args(cleared[0])).unwrap();
    assert_eq!(first["call_id"], "call_0");
    assert_eq!(first["tool"], "write_file");
    assert!(first["tokens"].as_u64().unwrap() > 200);
    assert!(r.pruned.iter().any(|p| p.call_id == "call_0"), "recallable");
    // The newest three calls keep their arguments.
    let newest: Vec<&Value> = m
        .iter()
        .filter(|x| role(x) == "assistant")
        .rev()
        .take(3)
        .collect();
    for x in newest {
        assert!(r.messages.contains(x), "the newest calls stay whole");
    }
    assert_eq!(r.record.tokens_after, count(&r.messages));
}

#[test]
fn input_clearing_follows_the_tool_selection_and_exclusions() {
    let m = writing_run(12, 900);
    let window = count(&m) * 10 / 9;
    let cleared_with = |prune: PruneConfig| -> usize {
        match run_with(&input(&m, window), &ContextConfig::default(), &prune) {
            Plan::Rewrite(r) => r
                .owned_messages()
                .iter()
                .filter(|x| shape::is_cleared_input(args(x)))
                .count(),
            _ => 0,
        }
    };
    assert!(cleared_with(PruneConfig::default()) > 0);
    let off = PruneConfig {
        clear_tool_inputs: ToolSelection::All(false),
        ..Default::default()
    };
    assert_eq!(cleared_with(off), 0);
    let other = PruneConfig {
        clear_tool_inputs: ToolSelection::Only(vec!["edit".into()]),
        ..Default::default()
    };
    assert_eq!(cleared_with(other), 0);
    let named = PruneConfig {
        clear_tool_inputs: ToolSelection::Only(vec!["write_file".into()]),
        ..Default::default()
    };
    assert!(cleared_with(named) > 0);
    let excluded = PruneConfig {
        exclude_tools: vec!["write_file".into()],
        ..Default::default()
    };
    assert_eq!(cleared_with(excluded), 0);
}

#[test]
fn clearing_never_reaches_into_the_newest_unit() {
    // The newest message is a batch of parallel results: none of them is cleared, even keeping one result.
    let mut m = agent_run(6, 300);
    let ids: Vec<String> = (0..3).map(|i| format!("p{i}")).collect();
    m.push(calls(&ids));
    for id in &ids {
        m.push(result(id, 600));
    }
    let window = count(&m) * 10 / 9;
    let prune = PruneConfig {
        keep_tool_results: 1,
        ..Default::default()
    };
    let r = rewrite(run_with(
        &input(&m, window),
        &ContextConfig::default(),
        &prune,
    ));
    assert!(r.record.cleared_results > 0, "{:?}", r.record);
    assert_eq!(
        r.messages[r.messages.len() - 4..],
        m[m.len() - 4..],
        "the newest unit is whole"
    );
}

#[test]
fn excluded_tools_keep_their_results() {
    let m = agent_run(20, 300);
    let window = count(&m) * 10 / 9;
    let prune = PruneConfig {
        exclude_tools: vec!["read_file".into()],
        ..Default::default()
    };
    match run_with(&input(&m, window), &ContextConfig::default(), &prune) {
        Plan::Rewrite(r) => assert_eq!(r.record.cleared_results, 0, "{:?}", r.record),
        Plan::Forward { .. } => {}
        Plan::Reject { .. } => panic!("rejected"),
    }
}

/// The cuts of every rewritten turn of `full` as it grows, with `ctx`.
fn cut_moves(full: &[Value], window: u64, ctx: &ContextConfig) -> (usize, usize) {
    // Many results kept whole: each new one lets clearing take just one more, a small re-cut.
    let prune = PruneConfig {
        keep_tool_results: 30,
        ..Default::default()
    };
    let (mut moves, mut rewritten, mut last) = (0, 0, None);
    for n in (4..=full.len()).step_by(2) {
        if let Plan::Rewrite(r) = run_with(&input(&full[..n], window), ctx, &prune) {
            rewritten += 1;
            moves += usize::from(last.is_some_and(|c| c != r.record.cuts));
            last = Some(r.record.cuts);
            assert!(r.record.tokens_after <= (window as f64 * ctx.hard_limit) as u64);
        }
    }
    (moves, rewritten)
}

#[test]
fn a_re_cut_must_remove_at_least_clear_at_least() {
    let full = agent_run(80, 400);
    let eager = ContextConfig {
        clear_at_least: crate::config::TokenAmount::Tokens(0),
        ..Default::default()
    };
    let patient = ContextConfig {
        clear_at_least: crate::config::TokenAmount::Fraction(0.25),
        ..Default::default()
    };
    let (eager_moves, eager_n) = cut_moves(&full, 16_000, &eager);
    let (patient_moves, patient_n) = cut_moves(&full, 16_000, &patient);
    assert!(eager_n > 20 && patient_n > 20);
    // The cost model already prefers re-cuts that last; one that must pay never makes more of them.
    assert!(
        patient_moves <= eager_moves && patient_moves > 0,
        "fewer re-cuts when each must pay: {patient_moves} vs {eager_moves}"
    );
}

#[test]
fn the_message_count_triggers_a_rewrite() {
    // Many tiny messages: far under the token threshold.
    let m = chat_loops(30, 2);
    assert!(matches!(run(&m, 128_000), Plan::Forward { .. }));
    let ctx = ContextConfig {
        max_messages: Some(40),
        ..Default::default()
    };
    let r = rewrite(run_with(&input(&m, 128_000), &ctx, &PruneConfig::default()));
    assert!(r.messages.len() <= 40, "{} messages", r.messages.len());
    assert_eq!(r.messages[1], m[1], "the task stays");
    assert_eq!(r.messages.last(), m.last());
    check_sequence(&r.messages).unwrap();
}

#[test]
fn the_note_goes_right_after_the_last_changed_unit() {
    let m = agent_run(20, 300);
    let window = count(&m) * 10 / 9;
    let Plan::Rewrite(r) = run(&m, window) else {
        panic!("expected a rewrite")
    };
    let out = r.owned_messages();
    let at = r.note_at;
    assert!(at > 0 && at < out.len());
    assert!(
        shape::is_placeholder(&out[at - 1]),
        "the last message before the note is the last cleared result"
    );
    assert!(
        out[at..].iter().all(|x| !shape::is_placeholder(x)),
        "nothing changed after it"
    );
    assert_eq!(
        out[at..],
        m[m.len() - (out.len() - at)..],
        "the client's own tail"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// An agent's requests (tools offered: nudges continue their run) keep every invariant too.
    #[test]
    fn agent_rewrites_keep_every_invariant(
        m in history(),
        window in prop_oneof![Just(1_500u64), Just(4_000), Just(16_000)],
    ) {
        let tools = agent_tools();
        let mut i = input(&m, window);
        i.tools = Some(&tools);
        check_with(i, &ContextConfig::default())?;
    }

    /// A re-cut keeps every message before the first one it changes: the earlier request's output up to that
    /// point (and never past its note) is the later request's prefix.
    #[test]
    fn re_cuts_keep_the_prefix_before_their_first_change(
        m in history(),
        window in prop_oneof![Just(1_500u64), Just(4_000)],
        split in 0.3f64..0.9,
    ) {
        let p = ((m.len() as f64 * split) as usize).max(1);
        let counter = TokenCounter::new();
        let (ctx, prune) = (ContextConfig::default(), PruneConfig::default());
        let (Plan::Rewrite(a), Plan::Rewrite(b)) = (
            plan(&input(&m[..p], window), &ctx, &prune, &counter),
            plan(&input(&m, window), &ctx, &prune, &counter),
        ) else {
            return Ok(());
        };
        // The first output position where they differ.
        let same = a
            .messages
            .iter()
            .zip(&b.messages)
            .take_while(|(x, y)| x == y)
            .count();
        // The first client message the later rewrite treats differently.
        let first_change = (0..p)
            .find(|&i| {
                let in_a = a.sources.iter().position(|s| *s == crate::message::Source::Client(i));
                let in_b = b.sources.iter().position(|s| *s == crate::message::Source::Client(i));
                match (in_a, in_b) {
                    (Some(x), Some(y)) => a.messages[x] != b.messages[y],
                    (None, None) => false,
                    _ => true,
                }
            })
            .unwrap_or(p);
        let mut before_change = a
            .sources
            .iter()
            .take_while(|s| !matches!(s, crate::message::Source::Client(i) if *i >= first_change))
            .count();
        // A gap's message right before the first change belongs to it (the gap moves with the cut).
        while before_change > 0
            && a.sources[before_change - 1] == crate::message::Source::Added
            && crate::message::message_text(&a.messages[before_change - 1]) == crate::context::roles::GAP_TEXT
        {
            before_change -= 1;
        }
        prop_assert!(
            same >= before_change.min(a.note_at),
            "same {same}, first change at output {before_change}, note at {}",
            a.note_at
        );
        prop_assert_eq!(&a.messages[0], &b.messages[0], "the system prompt is never touched");
    }
}

/// SWE-agent's opening: a system prompt, a long demonstration sent as the first user message (the pinned task,
/// by its shape), the real issue as a second user message, then one step.
fn demonstrated(demo_words: usize) -> Vec<Value> {
    vec![
        sys("You are a coding agent."),
        user(&format!(
            "DEMO START {} DEMO END",
            "demonstration ".repeat(demo_words)
        )),
        user("The issue: fix the parser."),
        calls(&["call_1".to_string()]),
        result("call_1", 50),
    ]
}

#[test]
fn a_long_task_alone_over_the_hard_limit_is_pinned_not_refused() {
    let m = demonstrated(3_000);
    let prune = PruneConfig {
        max_pinned_tokens: 1_000,
        ..Default::default()
    };
    // over the hard limit with the demonstration whole, under it with the demonstration's head and tail
    let window = count(&m) * 2 / 3;
    let r = rewrite(run_with(
        &input(&m, window),
        &ContextConfig::default(),
        &prune,
    ));
    assert_eq!(r.record.stages, ["truncated"], "{:?}", r.record);
    assert_eq!(r.record.dropped_messages, 0);
    let sent = r.messages[1]["content"].as_str().unwrap();
    assert!(sent.starts_with("DEMO START") && sent.ends_with("DEMO END"));
    assert!(sent.contains(shape::PINNED_MARKER));
    assert_eq!(&r.messages[2..], &m[2..], "the issue and the step whole");
    check_sequence(&r.messages).unwrap();

    // under context.on_overflow = "refuse" it is refused, as a request losing whole messages is
    let body = json!({"model": "gpt-4o", "messages": &m});
    let mut cfg = crate::config::Config::default();
    cfg.context.strategy = Rewriting::Prune;
    cfg.context.on_overflow = crate::config::OnOverflow::Refuse;
    cfg.prune = prune;
    let offer = crate::recall::Offer::new(
        crate::dialect::Dialect::Chat,
        body.as_object().unwrap(),
        &cfg.recall,
    );
    let req = decide_request(
        body.as_object().unwrap(),
        &m,
        window,
        Rewriting::Prune,
        false,
    );
    let plan = decide::plan_cuts(&req, None, &cfg, &offer, &TokenCounter::new());
    assert!(
        matches!(plan, Plan::Reject { refused: true, .. }),
        "{plan:?}"
    );
}
