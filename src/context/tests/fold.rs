//! Planner tests of the third round: deep re-cuts that fold the oldest steps of a run loop, and the cost model that
//! picks a re-cut's depth.

use super::*;
use crate::context::fold::FOLD_PREFIX;
use crate::message::{tool_calls, Source};

/// The tools an agent's requests offer.
fn agent_tools() -> Value {
    json!([{"type":"function","function":{"name":"bash","parameters":{"type":"object"}}}])
}

/// A long single-task run: `n` steps with results of `words(i)` words.
fn long_run(n: usize, words: impl Fn(usize) -> usize) -> Vec<Value> {
    let mut m = vec![
        sys("You are a coding agent."),
        user("Fix the failing test in parser.rs; keep the public API."),
    ];
    for i in 0..n {
        let id = format!("call_{i}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, words(i)));
    }
    m
}

/// The call ids listed in the fold block of `out`, with the index of the message carrying it.
fn folded_ids(out: &[Value]) -> Vec<(usize, String)> {
    let mut ids = Vec::new();
    for (k, m) in out.iter().enumerate() {
        let text = crate::message::message_text(m);
        let Some(at) = text.find(FOLD_PREFIX) else {
            continue;
        };
        for line in text[at..].lines().skip(1) {
            if let Some(id) = line.strip_prefix("- ").and_then(|l| l.split(' ').next()) {
                ids.push((k, id.to_string()));
            }
        }
    }
    ids
}

#[test]
fn a_long_run_is_folded_down_to_the_target() {
    // Small results: clearing alone cannot get the run down to the target.
    let m = long_run(90, |i| 60 + (i * 7) % 40);
    let window = 8_000;
    let prune = PruneConfig::default();
    // Cached input at the full price: the deepest re-cut is the cheapest.
    let ctx = ContextConfig {
        cache_read_price: 1.0,
        ..Default::default()
    };
    let r = rewrite(run_with(&input(&m, window), &ctx, &prune));
    assert!(r.record.stages.contains(&"folded"), "{:?}", r.record);
    assert!(r.record.folded_steps > 10, "{:?}", r.record);
    check_sequence(&r.messages).unwrap();
    assert_eq!(r.messages[..2], m[..2], "system prompt and task kept");
    assert!(
        r.record.tokens_after <= (window as f64 * 0.8) as u64,
        "under the threshold: {:?}",
        r.record
    );
    // Without folding, clearing alone leaves every call and placeholder: far more is sent.
    let unfolded = PruneConfig {
        keep_steps: 1_000,
        ..Default::default()
    };
    let plain = rewrite(run_with(&input(&m, window), &ctx, &unfolded));
    assert_eq!(plain.record.folded_steps, 0);
    assert!(
        plain.record.tokens_after > r.record.tokens_after + 1_000,
        "{:?}",
        plain.record
    );
    // The newest `keep_steps` steps are all sent (their results whole or as placeholders).
    let sent_calls: Vec<&str> = r
        .messages
        .iter()
        .flat_map(tool_calls)
        .filter_map(|c| c["id"].as_str())
        .collect();
    for i in 90 - prune.keep_steps..90 {
        assert!(sent_calls.contains(&format!("call_{i}").as_str()));
    }
    // Every step left out is listed, in order, on the first tool result sent after them: the carrier.
    let listed = folded_ids(&r.messages);
    let ids: Vec<String> = listed.iter().map(|(_, id)| id.clone()).collect();
    let expected: Vec<String> = (0..r.record.folded_steps)
        .map(|i| format!("call_{i}"))
        .collect();
    assert_eq!(ids, expected);
    let carrier = listed[0].0;
    assert_eq!(
        carrier, 3,
        "after the system prompt, the task and the first call kept"
    );
    assert_eq!(role(&r.messages[carrier]), "tool");
    assert_eq!(
        r.messages[carrier]["tool_call_id"],
        format!("call_{}", r.record.folded_steps)
    );
    let text = r.messages[carrier]["content"].as_str().unwrap();
    assert!(text.contains("recall_tool_call"));
    assert!(text.contains("call_0 read_file {\"path\":\"call_0.rs\"}"));
    // Folded calls are recallable, and marked so that the note need not list them twice.
    let folded: Vec<&PrunedCall> = r.pruned.iter().filter(|p| p.folded).collect();
    assert_eq!(folded.len(), r.record.folded_steps);
    assert_eq!(r.record.cuts[5], 2 * r.record.folded_steps + 2);
}

#[test]
fn folding_keeps_the_prefix_until_the_next_re_cut_and_each_re_cut_pays() {
    let full = long_run(90, |i| 120 + (i * 53) % 500);
    let window = 16_000;
    let ctx = ContextConfig {
        cache_read_price: 0.5,
        ..Default::default()
    };
    let prune = PruneConfig::default();
    let mut previous: Option<(Vec<Value>, [usize; 9])> = None;
    let (mut moves, mut rewritten, mut folded) = (0, 0, 0);
    for n in (4..=full.len()).step_by(2) {
        let Plan::Rewrite(r) = run_with(&input(&full[..n], window), &ctx, &prune) else {
            continue;
        };
        rewritten += 1;
        folded = folded.max(r.record.folded_steps);
        let out = r.owned_messages();
        check_sequence(&out).unwrap();
        assert!(r.record.tokens_after <= (window as f64 * 0.8) as u64);
        if let Some((prev, cuts)) = &previous {
            if *cuts == r.record.cuts {
                assert_eq!(
                    &out[..prev.len()],
                    &prev[..],
                    "identical prefix between re-cuts"
                );
            } else {
                moves += 1;
            }
        }
        previous = Some((out, r.record.cuts));
    }
    assert!(folded > 20, "folded {folded}");
    assert!(
        moves * 5 < rewritten,
        "cuts moved {moves} times in {rewritten} rewritten turns"
    );
}

#[test]
fn the_newest_steps_and_the_newest_unit_are_never_folded() {
    let m = long_run(40, |_| 400);
    for keep in [1usize, 4, 12] {
        let prune = PruneConfig {
            keep_steps: keep,
            ..Default::default()
        };
        let r = rewrite(run_with(
            &input(&m, 16_000),
            &ContextConfig::default(),
            &prune,
        ));
        let sent_calls = r.messages.iter().flat_map(tool_calls).count();
        assert!(sent_calls >= keep, "keep {keep}: {sent_calls} calls sent");
        assert_eq!(r.messages.last(), m.last());
        check_sequence(&r.messages).unwrap();
    }
    // Excluded tools are never folded (nor cleared).
    let prune = PruneConfig {
        exclude_tools: vec!["read_file".into()],
        ..Default::default()
    };
    let p = run_with(&input(&m, 16_000), &ContextConfig::default(), &prune);
    if let Plan::Rewrite(r) = p {
        assert_eq!(r.record.folded_steps, 0);
    }
}

#[test]
fn a_shallow_re_cut_that_keeps_the_cache_wins_when_cached_input_is_cheap() {
    // Results too small to clear but one large result near the end: clearing it alone gets under the threshold
    // and keeps the cache up to it; folding goes down to the target but misses the cache from the task on. With
    // cached input free the shallow re-cut costs less per turn, at the full price (no cache) the deep one.
    let m = long_run(30, |i| if i == 20 { 3_000 } else { 200 });
    let window = count(&m) * 100 / 86;
    let prune = PruneConfig {
        keep_tool_results: 5,
        min_result_tokens: 1_000,
        ..Default::default()
    };
    let at = |price: f64| {
        let ctx = ContextConfig {
            cache_read_price: price,
            ..Default::default()
        };
        // Without the recall tools the first rewrite keeps the client's prefix up to its first change.
        let mut i = input(&m, window);
        i.recall_tool = None;
        rewrite(run_with(&i, &ctx, &prune)).record
    };
    let free = at(0.0);
    let full = at(1.0);
    assert_eq!(
        (free.cleared_results, free.folded_steps),
        (1, 0),
        "{free:?}"
    );
    assert!(full.folded_steps > 0, "{full:?}");
    assert!(free.tokens_after > full.tokens_after);
}

/// Whether folding brought two messages of one role together in `r` (for the client's `m`): a run of left-out
/// messages holding a folded step must follow a user, tool or system message and precede an assistant message.
fn folds_keep_role_order(m: &[Value], r: &Rewrite<'_>) -> Result<(), String> {
    let out = r.owned_messages();
    let folded: Vec<String> = folded_ids(&out).into_iter().map(|(_, id)| id).collect();
    let holds_folded = |i: usize| {
        tool_calls(&m[i]).iter().any(|c| {
            c["id"]
                .as_str()
                .is_some_and(|id| folded.iter().any(|f| f == id))
        })
    };
    let sent: Vec<usize> = r
        .sources
        .iter()
        .filter_map(|s| match s {
            Source::Client(i) => Some(*i),
            Source::Added => None,
        })
        .collect();
    for w in sent.windows(2) {
        let (x, y) = (w[0], w[1]);
        if y > x + 1 && (x + 1..y).any(holds_folded) {
            let before = role(&m[x]);
            if !matches!(before, "user" | "tool" | "system" | "developer")
                || role(&m[y]) != "assistant"
            {
                return Err(format!("folded {x}..{y}: {before} then {}", role(&m[y])));
            }
        }
    }
    Ok(())
}

/// Random long single-task runs: results from tiny to large, parallel calls now and then, a nudge now and then.
fn runs() -> impl Strategy<Value = Vec<Value>> {
    let step = (
        prop_oneof![Just(5usize), 40usize..200, 200usize..900],
        1usize..3,
        prop::bool::weighted(0.1),
    );
    prop::collection::vec(step, 8..70).prop_map(|steps| {
        let mut m = vec![sys("You are a coding agent."), user("Fix the bug.")];
        let mut id = 0;
        for (words, parallel, nudge) in steps {
            if nudge {
                m.push(reply("I think the fix is done."));
                m.push(user("No tool calls found. Use a tool."));
            }
            let ids: Vec<String> = (0..parallel)
                .map(|_| {
                    id += 1;
                    format!("call_{id}")
                })
                .collect();
            m.push(calls(&ids));
            for i in &ids {
                m.push(result(i, words));
            }
        }
        m
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Folded rewrites keep every invariant (pairing, system messages, the task, the newest message, the
    /// estimate, determinism), never bring two user or two assistant messages together, and list every folded
    /// call once, oldest first.
    #[test]
    fn folded_rewrites_keep_pairing_roles_and_determinism(
        m in prop_oneof![runs(), history()],
        window in prop_oneof![Just(2_000u64), Just(6_000), Just(16_000)],
        price in prop_oneof![Just(0.1f64), Just(0.5), Just(1.0)],
    ) {
        let tools = agent_tools();
        let ctx = ContextConfig { cache_read_price: price, ..ContextConfig::default() };
        let mut i = input(&m, window);
        i.tools = Some(&tools);
        check_with(i, &ctx)?;
        let counter = TokenCounter::new();
        if let Plan::Rewrite(r) = plan(&i, &ctx, &PruneConfig::default(), &counter) {
            if let Err(e) = folds_keep_role_order(&m, &r) {
                prop_assert!(false, "{}", e);
            }
            let out = r.owned_messages();
            let listed: Vec<String> = folded_ids(&out).into_iter().map(|(_, id)| id).collect();
            let folded: Vec<String> = r.pruned.iter().filter(|p| p.folded).map(|p| p.call_id.clone()).collect();
            prop_assert_eq!(&listed, &folded, "every folded call listed once, in order");
            let sent: Vec<&str> = out.iter().flat_map(tool_calls).filter_map(|c| c["id"].as_str()).collect();
            prop_assert!(folded.iter().all(|f| !sent.contains(&f.as_str())), "a folded call is not sent");
        }
    }

    /// A re-cut's output stays the prefix of every later request until the cuts move again.
    #[test]
    fn a_folded_re_cut_is_stable_until_the_next(m in runs(), window in prop_oneof![Just(4_000u64), Just(8_000)]) {
        let (ctx, prune) = (ContextConfig::default(), PruneConfig::default());
        let counter = TokenCounter::new();
        let mut previous: Option<(Vec<Value>, [usize; 9])> = None;
        for n in 3..=m.len() {
            if role(&m[n - 1]) != "tool" {
                continue;
            }
            let Plan::Rewrite(r) = plan(&input(&m[..n], window), &ctx, &prune, &counter) else {
                previous = None;
                continue;
            };
            let out = r.owned_messages();
            if let Some((prev, cuts)) = &previous {
                if *cuts == r.record.cuts {
                    prop_assert_eq!(&out[..prev.len()], &prev[..], "stable at {}", n);
                }
            }
            previous = Some((out, r.record.cuts));
        }
    }
}

#[test]
fn a_fold_cut_past_pruned_steps_only_leaves_the_current_run_whole() {
    // Pruning cuts the first run loop (its step call_1 is foldable too); the fold cut then moves to call_2 in the
    // current run, past no step that is still sent: nothing is folded, call_2's result carries no line, and the
    // current run (opened by an image with an empty text part) is sent whole, with no notice inside it.
    let ids = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let image = json!({"role":"user","content":[
        {"type":"text","text":""},{"type":"image_url","image_url":{"url":"data:x"}}]});
    let m = vec![
        sys("system prompt"),
        user(""),
        calls(&ids(&["call_1"])),
        result("call_1", 200),
        reply("done "),
        user("also this"),
        image,
        calls(&ids(&["call_2"])),
        result("call_2", 0),
        calls(&ids(&["call_3"])),
        result("call_3", 0),
        calls(&ids(&["call_4", "call_5"])),
        result("call_4", 0),
        result("call_5", 269),
        reply("done done done done done "),
    ];
    let r = rewrite(run(&m, 1_500));
    assert_eq!(r.record.stages, ["pruned"], "{:?}", r.record);
    assert_eq!(r.record.folded_steps, 0);
    check_sequence(&r.messages).unwrap();
    let current = &m[6..];
    assert_eq!(
        r.messages[r.messages.len() - current.len()..],
        *current,
        "the current run loop is sent whole: {:#?}",
        r.messages
    );
    // The notice (with the recall note) stands where the pruned loop was, before the user's two messages.
    let notice = r
        .messages
        .iter()
        .position(|v| crate::message::message_text(v).starts_with(roles::GAP_TEXT));
    let also = r.messages.iter().position(|v| *v == m[5]);
    assert!(notice.is_some() && notice < also, "{:#?}", r.messages);
}

/// A search through the fold depths of a long run keeps only the carriers of the fold block it made last: each
/// block lists every call folded so far, so keeping the carriers of every block it passed through held memory
/// quadratic in the run's calls (a request of 5,000 calls peaked at 1.2 GB on the release build; 123 MB now). The
/// carrier's tokens are summed from its head and its lines, and equal a count of the carrier as sent, whatever
/// the ids, names and arguments of the calls folded.
#[test]
fn a_search_through_fold_depths_keeps_only_the_last_blocks_carriers() {
    let mut msgs = long_run(300, |_| 40);
    // calls whose ids, names and arguments end in spaces, punctuation, newlines or nothing at all
    let odd = [
        ("call_x \n", "bash", "{\"cmd\": \"ls\"}\n\n"),
        ("c)", "", ""),
        ("é\r", "read_file", "  "),
        ("id-\"", "grep", "x\u{a0}"),
    ];
    for (k, (id, name, args)) in odd.iter().enumerate() {
        let at = 2 + 2 * (10 + k);
        msgs[at] = json!({"role":"assistant","content":null,"tool_calls":[
            {"id":id,"type":"function","function":{"name":name,"arguments":args}}]});
        msgs[at + 1]["tool_call_id"] = json!(id);
    }
    // parallel calls: one message, three calls (they share its position), then their results
    let ids = [
        "par_a".to_string(),
        "par_b".to_string(),
        "par_c".to_string(),
    ];
    let at = 2 + 2 * 20;
    msgs.splice(
        at..at + 2,
        [
            json!({"role":"assistant","content":null,"tool_calls":[
                {"id":ids[0],"type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}},
                {"id":ids[1],"type":"function","function":{"name":"read_file",
                    "arguments":"{\"path\": \"src/some/long/path/to/a/module/file_name.rs\", \"lines\": 120}"}},
                {"id":ids[2],"type":"function","function":{"name":"g","arguments":"{}"}}]}),
            result(&ids[0], 30),
            result(&ids[1], 5),
            result(&ids[2], 12),
        ],
    );
    let counter = TokenCounter::new();
    let prune = PruneConfig::default();
    for enc in [Encoding::O200k, Encoding::Cl100k] {
        search_every_fold_depth(&msgs, &counter, enc, &prune);
    }
}

fn search_every_fold_depth(
    msgs: &[Value],
    counter: &TokenCounter,
    enc: Encoding,
    prune: &PruneConfig,
) {
    let mut model = crate::context::stages::Model::new(
        msgs,
        crate::context::stages::Seen {
            times: vec![0; msgs.len()],
            raw_hashes: None,
        },
        counter,
        enc,
        prune,
        Some("recall_tool_call"),
        true,
    );
    // every fold depth from the first step to the last, as a search may pass through them
    let mut carriers = 0;
    for fold in (4..msgs.len()).step_by(2) {
        let c = crate::context::stages::Cuts {
            fold,
            ..Default::default()
        };
        if let Some((t, sent)) = model.carrier_for_test(fold + 1, &c) {
            assert_eq!(
                t,
                counter.message_tokens(enc, &sent),
                "{enc:?}, fold {fold}: the summed count is a count of the carrier as sent"
            );
            carriers += 1;
        }
        assert!(
            model.carried_len() <= 1,
            "fold {fold}: {}",
            model.carried_len()
        );
    }
    assert!(carriers > 100, "the search folded: {carriers}");
}
