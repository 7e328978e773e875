//! The chat fingerprint of a conversation's opening, remembered: an agent resends the same system prompt and task
//! with every request, and serialising them canonically and hashing them (SHA-256) costs as much as their size.

use moka::sync::Cache;
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use xxhash_rust::xxh3::Xxh3;

/// Openings remembered (a key and a 64-character fingerprint each: ~1 MB at most).
const CAPACITY: u64 = 10_000;

fn memo() -> &'static Cache<u128, Arc<str>> {
    static MEMO: OnceLock<Cache<u128, Arc<str>>> = OnceLock::new();
    MEMO.get_or_init(|| Cache::new(CAPACITY))
}

/// `compute()` for the opening whose parts are `parts` (in order), remembered under a 128-bit hash of their exact
/// structure and contents: equal parts give the remembered fingerprint, anything else is computed anew.
pub fn remembered(parts: &[&[&Value]], compute: impl FnOnce() -> String) -> String {
    let key = key(parts);
    if let Some(fp) = memo().get(&key) {
        return fp.to_string();
    }
    let fp = compute();
    memo().insert(key, Arc::from(fp.as_str()));
    fp
}

/// A 128-bit xxh3 of `parts`, fed in pre-order with a tag and a length before every item, so that different
/// structures never give the same stream.
fn key(parts: &[&[&Value]]) -> u128 {
    let mut h = Xxh3::new();
    for group in parts {
        h.update(b"g");
        h.update(&(group.len() as u64).to_le_bytes());
        for v in *group {
            feed(&mut h, v);
        }
    }
    h.digest128()
}

fn text(h: &mut Xxh3, tag: u8, s: &str) {
    h.update(&[tag]);
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

fn feed(h: &mut Xxh3, v: &Value) {
    match v {
        Value::Null => h.update(b"z"),
        Value::Bool(b) => h.update(&[b'b', u8::from(*b)]),
        Value::Number(n) => text(h, b'n', &n.to_string()),
        Value::String(s) => text(h, b's', s),
        Value::Array(a) => {
            h.update(b"a");
            h.update(&(a.len() as u64).to_le_bytes());
            a.iter().for_each(|x| feed(h, x));
        }
        Value::Object(o) => {
            h.update(b"o");
            h.update(&(o.len() as u64).to_le_bytes());
            for (k, x) in o {
                text(h, b'k', k);
                feed(h, x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::Cell;

    #[test]
    fn the_same_opening_is_computed_once() {
        let system = json!("You are a careful agent, unique to the_same_opening_is_computed_once.");
        let user = json!([{"type": "text", "text": "Fix the bug."}]);
        let calls = Cell::new(0);
        let compute = || {
            calls.set(calls.get() + 1);
            "fp-1".to_string()
        };
        let parts: [&[&Value]; 2] = [&[&system], &[&user]];
        assert_eq!(remembered(&parts, compute), "fp-1");
        assert_eq!(remembered(&parts, compute), "fp-1");
        assert_eq!(calls.get(), 1, "the second time is remembered");
    }

    #[test]
    fn keys_tell_structures_apart() {
        let (a, b, ab, empty) = (json!("a"), json!("b"), json!("ab"), json!(""));
        let (a_b, just_a, just_b, just_ab, ab_empty, none) =
            ([&a, &b], [&a], [&b], [&ab], [&ab, &empty], []);
        let pairs: Vec<[&[&Value]; 2]> = vec![
            [&a_b, &none],
            [&just_a, &just_b],
            [&just_ab, &none],
            [&ab_empty, &none],
        ];
        let keys: std::collections::HashSet<u128> = pairs.iter().map(|p| key(p)).collect();
        assert_eq!(keys.len(), pairs.len());
        let nested = [
            json!(["ab"]),
            json!([["ab"]]),
            json!({"ab": null}),
            json!({"a": "b"}),
            json!(1),
            json!("1"),
        ];
        let keys: std::collections::HashSet<u128> = nested.iter().map(|v| key(&[&[v]])).collect();
        assert_eq!(keys.len(), nested.len());
    }
}
