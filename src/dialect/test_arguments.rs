//! Test helpers shared by the dialects' property tests: arguments the context engine may put in place of a past
//! tool call's (tool-input clearing), and putting them into a rewrite's neutral calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde_json::{json, Value};
use std::borrow::Cow;

/// Arguments the engine may put in place of a past call's (tool-input clearing): a placeholder object, any JSON
/// object, or any string at all (not JSON, or JSON but not an object).
pub fn new_arguments() -> impl Strategy<Value = String> {
    prop_oneof![
        ("[a-z_]{1,12}", 0..100_000u64).prop_map(|(tool, tokens)| {
            json!({"cleared":"input removed to save space","call_id":"call_x","tool":tool,"tokens":tokens})
                .to_string()
        }),
        prop::collection::btree_map("\\PC{0,6}", "\\PC{0,12}", 0..3)
            .prop_map(|m| serde_json::to_string(&m).unwrap()),
        any::<String>(),
        Just("[]".to_string()),
        Just("\"cleared\"".to_string()),
    ]
}

/// The neutral tool calls of the rewrite, in order, given `args[k]` as arguments (`None`: left as they are);
/// returns the (call id, new arguments) replaced.
pub fn replace_arguments(out: &mut [Cow<'_, Value>], args: &[Option<String>]) -> Replaced {
    let (mut k, mut replaced) = (0, Vec::new());
    for m in out.iter_mut() {
        let n = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        for c in 0..n {
            if let Some(Some(a)) = args.get(k) {
                let call = &mut m.to_mut()["tool_calls"][c];
                call["function"]["arguments"] = json!(a);
                replaced.push((call["id"].as_str().unwrap_or("").to_owned(), a.clone()));
            }
            k += 1;
        }
    }
    replaced
}

/// The (call id, new arguments) of the calls given new arguments.
pub type Replaced = Vec<(String, String)>;
