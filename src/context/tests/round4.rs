//! Planner tests of the fourth round: clearing takes the least recently used results first, the order is taken
//! at re-cuts only, and a re-cut prices the results the newest turns used that it would hide.

use super::*;

/// A read of `path`: the call names it, the result holds it and `words` words.
fn read(id: &str, path: &str, words: usize) -> [Value; 2] {
    let call = json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
        "function":{"name":"read_file","arguments":format!("{{\"path\":\"{path}\"}}")}}]});
    let body: Vec<String> = (0..words).map(|w| format!("w{w}")).collect();
    let result = json!({"role":"tool","tool_call_id":id,
        "content":format!("[File: /repo/{path}]\n{}", body.join(" "))});
    [call, result]
}

/// A single-task run reading `src/f{k}.rs` for each `k` of `reads` (a file read again is a use of its first
/// read), 300 words a result.
fn reading(reads: &[usize]) -> Vec<Value> {
    let mut m = vec![
        sys("You are a coding agent."),
        user("Fix the failing test."),
    ];
    for (n, k) in reads.iter().enumerate() {
        m.extend(read(&format!("call_{n}"), &format!("src/f{k}.rs"), 300));
    }
    m
}

/// Whether the result of `call` is sent whole in `out`.
fn sent_whole(m: &[Value], out: &[Value], call: &str) -> bool {
    let of = |ms: &[Value]| {
        ms.iter()
            .find(|x| x["tool_call_id"] == call)
            .map(|x| x["content"].clone())
    };
    of(out).is_some() && of(out) == of(m)
}

fn plan_with(m: &[Value], window: u64, by_use: bool) -> Plan<'_> {
    let prune = PruneConfig {
        clear_by_use: by_use,
        ..PruneConfig::default()
    };
    run_with(&input(m, window), &ContextConfig::default(), &prune)
}

#[test]
fn the_result_the_agent_works_with_is_cleared_last() {
    // files 0..6 read once, then file 1 read again (call_7: a use of call_1's result), then two more files
    let m = reading(&[0, 1, 2, 3, 4, 5, 6, 1, 8, 9]);
    // a window where the first re-cut comes with the last result (after the use: the order is taken at a re-cut)
    // and clearing alone gets under the target, clearing some of the seven results within reach (call_0..call_6;
    // the newest three are kept) but not all
    let window = (3_000..20_000)
        .step_by(100)
        .find(|&w| {
            let first = matches!(plan_with(&m[..m.len() - 2], w, false), Plan::Forward { .. });
            first
                && match plan_with(&m, w, false) {
                    Plan::Rewrite(r) => {
                        r.record.stages == ["cleared"] && (1..7).contains(&r.record.cleared_results)
                    }
                    _ => false,
                }
        })
        .expect("a window where clearing alone does");
    let by_age = rewrite(plan_with(&m, window, false));
    let by_use = rewrite(plan_with(&m, window, true));
    assert_eq!(
        by_age.record.cleared_results, by_use.record.cleared_results,
        "the same number cleared"
    );
    // by age, the oldest go first: call_1 (the second oldest) is cleared while a newer one stays
    assert!(
        !sent_whole(&m, &by_age.messages, "call_1"),
        "by age: call_1 cleared"
    );
    // by use, call_1 (used by the newest step) stays whole and a newer, unused one is cleared instead
    assert!(
        sent_whole(&m, &by_use.messages, "call_1"),
        "by use: call_1 kept"
    );
    let newer_cleared = (2..7).any(|n| !sent_whole(&m, &by_use.messages, &format!("call_{n}")));
    assert!(newer_cleared, "by use: an unused newer result is cleared");
}

fn session() -> impl Strategy<Value = Vec<usize>> {
    // each step reads a new file or again one read before
    prop::collection::vec((prop::bool::weighted(0.4), 0usize..1_000), 10..45).prop_map(|steps| {
        let mut reads: Vec<usize> = Vec::new();
        for (again, pick) in steps {
            let k = if again && !reads.is_empty() {
                reads[pick % reads.len()]
            } else {
                reads.len() + 1_000
            };
            reads.push(k);
        }
        reads
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The order by use is taken at re-cuts only: while the cuts stay, a later request keeps the earlier one's
    /// rewritten messages as its prefix, however the newer turns use the older results.
    #[test]
    fn the_order_by_use_moves_nothing_between_re_cuts(
        reads in session(),
        window in prop_oneof![Just(6_000u64), Just(12_000)],
    ) {
        let m = reading(&reads);
        let (ctx, prune) = (ContextConfig::default(), PruneConfig::default());
        let counter = TokenCounter::new();
        let mut previous: Option<(Vec<Value>, [usize; 9])> = None;
        for n in (4..=m.len()).step_by(2) {
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
            // deterministic
            let again = plan(&input(&m[..n], window), &ctx, &prune, &counter);
            if let Plan::Rewrite(a) = again {
                prop_assert_eq!(a.owned_messages(), out.clone());
            }
            previous = Some((out, r.record.cuts));
        }
    }
}

/// A turn-by-turn run of `m` (every other message) planned on one counter, as `(messages sent, record)` per turn.
fn turns(
    m: &[Value],
    window: u64,
    prune: &PruneConfig,
    counter: &TokenCounter,
    raw: bool,
    recall: Option<&str>,
) -> Vec<Option<(Vec<Value>, CompressionRecord)>> {
    (4..=m.len())
        .step_by(2)
        .map(|n| {
            let body = serde_json::to_vec(&json!({ "messages": &m[..n] })).unwrap();
            let hashes = crate::session::tree::raw_message_hashes(&body);
            let mut i = input(&m[..n], window);
            i.recall_tool = recall;
            if raw {
                i.hashes = Some(&hashes);
            }
            match plan(&i, &ContextConfig::default(), prune, counter) {
                Plan::Rewrite(r) => Some((r.owned_messages(), r.record.clone())),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn what_the_planner_remembers_gives_the_plan_it_would_make_afresh() {
    let m = reading(&[0, 1, 2, 3, 4, 5, 6, 1, 8, 9, 10, 11, 3, 12, 13, 14]);
    let prune = PruneConfig::default();
    let afresh = |raw: bool, prune: &PruneConfig, recall: Option<&str>| {
        turns(&m, 6_000, prune, &TokenCounter::new(), raw, recall)
    };
    let expected = afresh(false, &prune, Some("recall_tool_call"));
    assert!(
        expected.iter().flatten().count() >= 3,
        "the run is rewritten"
    );
    // keyed by the client's bytes (the parse's hashes) instead of the messages' JSON: the same plans, cold and
    // with every placeholder, count and scan remembered from the turns before
    let counter = TokenCounter::new();
    assert_eq!(
        turns(&m, 6_000, &prune, &counter, true, Some("recall_tool_call")),
        expected
    );
    assert_eq!(
        turns(&m, 6_000, &prune, &counter, true, Some("recall_tool_call")),
        expected
    );
    // hashes that are not one per message are not used
    let mut i = input(&m, 6_000);
    let short = [1u64, 2, 3];
    i.hashes = Some(&short);
    let with_short = rewrite(plan(&i, &ContextConfig::default(), &prune, &counter));
    assert_eq!(
        Some(&with_short.messages),
        expected.last().unwrap().as_ref().map(|r| &r.0)
    );
    // what is remembered of a placeholder is keyed by what makes it: another digest size or no recall tool on the
    // same counter gives what a fresh counter gives
    let small = PruneConfig {
        digest_tokens: 0,
        ..PruneConfig::default()
    };
    assert_eq!(
        turns(&m, 6_000, &small, &counter, true, Some("recall_tool_call")),
        afresh(false, &small, Some("recall_tool_call"))
    );
    assert_eq!(
        turns(&m, 6_000, &prune, &counter, true, None),
        afresh(false, &prune, None)
    );
    assert_ne!(afresh(false, &small, Some("recall_tool_call")), expected);
}
