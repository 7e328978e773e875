//! Recall of folded steps: whatever the planner folded or cleared, `recall_tool_call` returns the call's
//! arguments and result byte for byte, from the client's request as the gateway reads it and from the stored
//! history alone.

use super::{answer_call, HistorySource, InjectedNames};
use crate::config::{ContextConfig, PruneConfig, RecallConfig, Strategy};
use crate::context::tokens::{Encoding, TokenCounter};
use crate::context::{plan, Plan, PlanInput};
use crate::session::tree::Tree;
use proptest::prelude::*;
use serde_json::{json, Value};

/// A long run whose calls have arbitrary arguments and results (any text, at least `min` characters each).
fn run(steps: &[(String, String)]) -> Vec<Value> {
    let mut m = vec![
        json!({"role":"system","content":"You are a coding agent."}),
        json!({"role":"user","content":"Fix the bug."}),
    ];
    for (i, (args, result)) in steps.iter().enumerate() {
        let id = format!("call_{i}");
        m.push(json!({"role":"assistant","content":null,"tool_calls":[
            {"id":id,"type":"function","function":{"name":"bash","arguments":args}}]}));
        m.push(json!({"role":"tool","tool_call_id":id,"content":result}));
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn every_folded_or_cleared_call_is_recalled_byte_exact(
        steps in prop::collection::vec((".{0,300}", ".{20,1200}"), 30..60),
    ) {
        let m = run(&steps);
        let input = PlanInput {
            messages: &m,
            hashes: None,
            tools: None,
            first_seen: None,
            now: 0,
            encoding: Encoding::O200k,
            ratio: 1.0,
            strategy: Strategy::Prune,
            window: 6_000,
            recall_tool: Some("recall_tool_call"),
            reserve: 0,
            summaries: None,
            precompute_at: 0.75,
            strict_roles: true,
        };
        // cached input at the full price: the deepest re-cut, folding as far as it may
        let ctx = ContextConfig { cache_read_price: 1.0, ..ContextConfig::default() };
        let Plan::Rewrite(r) = plan(&input, &ctx, &PruneConfig::default(), &TokenCounter::new()) else {
            return Ok(());
        };
        prop_assume!(r.pruned.iter().any(|p| p.folded), "nothing folded");
        let mut tree = Tree::new();
        tree.append_request(&m, &[], 0);
        let from_request = HistorySource::new(&m, None);
        let from_store = HistorySource::new(&m[m.len() - 1..], Some(&tree));
        let cfg = RecallConfig { max_result_chars: usize::MAX, ..RecallConfig::default() };
        let names = InjectedNames::from_config(&cfg);
        for p in &r.pruned {
            let i: usize = p.call_id["call_".len()..].parse().unwrap_or(usize::MAX);
            let (args, result) = &steps[i];
            let want = format!("Arguments of call {} (bash):\n{args}\n\nResult:\n{result}", p.call_id);
            let call = json!({"id":"r","type":"function","function":{"name":"recall_tool_call",
                "arguments":json!({"call_id": p.call_id}).to_string()}});
            for src in [&from_request, &from_store] {
                prop_assert_eq!(&answer_call(&call, &names, src, &cfg), &want, "{}", p.call_id);
            }
        }
    }
}
