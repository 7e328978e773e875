//! A request body parsed without parsing again what was seen before: an agent resends its whole conversation with
//! every request, so the elements of its `messages` (`input`, `tools`) arrays are found in the bytes by a scan
//! ([`super::raw_scan`]) and those already parsed are cloned from a bounded memo keyed by a hash of their exact
//! bytes. Whatever the scan cannot read surely is parsed whole by serde_json, as before, with the same result.

use super::raw_scan;
use moka::sync::Cache;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use xxhash_rust::xxh3::xxh3_128;

/// The top-level fields whose arrays are parsed element by element.
const ARRAYS: [&str; 3] = ["messages", "input", "tools"];
/// Elements shorter than this are parsed: an entry holds ~800 bytes besides the element's own (measured below),
/// several times a short element, to save a parse of a few thousand instructions. Below it: system prompts and
/// questions of small chats (10,000 small sessions held 22 MB more with the memo from 64 bytes).
const MIN_BYTES: usize = 256;
/// What an entry holds beyond its bytes: the parsed value's allocations, the `Arc`, the memo's own bookkeeping
/// (measured: 800–860 bytes for elements of 300 to 4,000 bytes), for its weight.
const ENTRY_OVERHEAD: usize = 800;
/// Bytes of elements (as sent) the memo keeps at most, whatever the history cache's budget.
const MAX_BYTES: u64 = 32 << 20;
/// Bytes the memo keeps at most, as [`size_by`] set it before the first parse.
static BUDGET: AtomicU64 = AtomicU64::new(MAX_BYTES);

/// A body as a JSON object, and the hash of each `messages` element's bytes ([`item_hash`]) when the scan found one such array.
pub type Scanned = (Map<String, Value>, Option<Vec<u64>>);

struct Entry {
    bytes: u32,
    value: Value,
}

/// Sizes the memo by the history cache's budget (`store.cache_max_bytes`): an eighth of it, at most 32 MiB (the
/// default 256 MiB gives 32 MiB; 64 MiB gives 8 MiB). Takes effect only while the memo is not built: the first
/// parse or the first call builds it, at the size set then. Returns the size in effect.
pub fn size_by(cache_max_bytes: u64) -> u64 {
    BUDGET.store((cache_max_bytes / 8).min(MAX_BYTES), Ordering::Relaxed);
    memo().policy().max_capacity().unwrap_or(MAX_BYTES)
}

fn memo() -> &'static Cache<u128, Arc<Entry>> {
    static MEMO: OnceLock<Cache<u128, Arc<Entry>>> = OnceLock::new();
    MEMO.get_or_init(|| {
        Cache::builder()
            .max_capacity(BUDGET.load(Ordering::Relaxed))
            .weigher(|_, e: &Arc<Entry>| e.bytes)
            .build()
    })
}

/// The body as a JSON object, exactly as `serde_json::from_slice` gives it; `None` when it is not one the scan
/// can read surely (the caller parses it whole: invalid JSON gets serde_json's own error). With it, when the body
/// has one `messages` array, the hash of each of its elements' bytes (`session::tree::raw_message_hashes`).
pub fn object(raw: &[u8]) -> Option<Scanned> {
    let fields = raw_scan::fields(raw, |k| ARRAYS.iter().any(|a| a.as_bytes() == k))?;
    let mut body = Map::new();
    let (mut hashes, mut seen) = (None, false);
    for field in fields {
        let key = std::str::from_utf8(field.key).ok()?;
        // The first `messages` array's elements are hashed once, for the tree and for the memo alike.
        let first_messages = key == "messages" && !seen;
        if key == "messages" {
            // a repeated key: serde_json keeps the last array, whose elements these hashes are not
            hashes = None;
            seen = true;
        }
        let value = match field.items {
            Some(items) if first_messages => {
                let keys: Vec<u128> = items.iter().map(|r| xxh3_128(r)).collect();
                hashes = Some(keys.iter().map(|k| item_hash(*k)).collect());
                let parsed = items
                    .into_iter()
                    .zip(keys)
                    .map(|(r, k)| element(r, Some(k)));
                Value::Array(parsed.collect::<Option<Vec<_>>>()?)
            }
            Some(items) => Value::Array(
                items
                    .into_iter()
                    .map(|r| element(r, None))
                    .collect::<Option<Vec<_>>>()?,
            ),
            None => serde_json::from_slice(field.raw).ok()?,
        };
        // as serde_json does with a repeated key: the last value, in the first one's place
        body.insert(key.to_owned(), value);
    }
    Some((body, hashes))
}

/// The hash of an element's bytes the tree indexes (`session::tree::raw_message_hashes`): the low half of its
/// xxh3-128, the memo's key, so one pass over the bytes gives both.
fn item_hash(key: u128) -> u64 {
    key as u64
}

/// An element, from the memo when its bytes were seen before; `key`: their xxh3-128 when already computed.
fn element(raw: &[u8], key: Option<u128>) -> Option<Value> {
    if raw.len() < MIN_BYTES {
        return serde_json::from_slice(raw).ok();
    }
    let key = key.unwrap_or_else(|| xxh3_128(raw));
    if let Some(e) = memo().get(&key) {
        return Some(e.value.clone());
    }
    let value: Value = serde_json::from_slice(raw).ok()?;
    let bytes = u32::try_from(raw.len() + ENTRY_OVERHEAD).unwrap_or(u32::MAX);
    memo().insert(
        key,
        Arc::new(Entry {
            bytes,
            value: value.clone(),
        }),
    );
    Some(value)
}

#[cfg(test)]
pub(crate) fn remembered(raw: &[u8]) -> bool {
    memo().contains_key(&xxh3_128(raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::shared::test_support::arb_json_with;
    use proptest::prelude::*;
    use serde_json::json;

    fn whole(raw: &[u8]) -> Option<Map<String, Value>> {
        match serde_json::from_slice::<Value>(raw) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        }
    }

    fn same_as_serde(raw: &[u8]) {
        let fast = object(raw).map(|(body, _)| body);
        if let Some(f) = &fast {
            let w = whole(raw).expect("the scan read a body serde_json rejects");
            assert_eq!(f, &w);
            assert_eq!(
                f.keys().collect::<Vec<_>>(),
                w.keys().collect::<Vec<_>>(),
                "field order"
            );
        }
    }

    /// The memo takes an eighth of the history cache's budget, at most 32 MiB; once built it keeps its size.
    /// In a process of its own: the other tests build the memo at their first parse.
    #[test]
    fn the_memo_is_sized_by_the_history_cache() {
        crate::alone::alone(
            "dialect::parse_memo::tests::the_memo_is_sized_by_the_history_cache",
            || {
                assert_eq!(size_by(64 << 20), 8 << 20);
                assert_eq!(size_by(1 << 40), 8 << 20, "built: the size stays");
            },
        );
        assert_eq!(
            (256u64 << 20) / 8,
            MAX_BYTES,
            "the default budget gives the most"
        );
    }

    /// What the memo really holds per element (the counting allocator, in a process of its own: moka frees
    /// through an epoch on any thread): its bytes plus about [`ENTRY_OVERHEAD`], so its weight bounds it.
    #[test]
    fn an_entry_weighs_what_it_holds() {
        crate::alone::alone(
            "dialect::parse_memo::tests::an_entry_weighs_what_it_holds",
            || {
                for (len, n) in [(300usize, 3000usize), (4000, 500)] {
                    let raws: Vec<Vec<u8>> = (0..n)
                        .map(|i| {
                            let pad = "x".repeat(len.saturating_sub(40));
                            format!(r#"{{"role":"user","content":"{i:06} {pad}"}}"#).into_bytes()
                        })
                        .collect();
                    let (got, ()) = crate::session::counting::measure(|| {
                        for r in &raws {
                            drop(element(r, None));
                        }
                        memo().run_pending_tasks();
                    });
                    let raw: usize = raws.iter().map(Vec::len).sum();
                    let per_entry = got as f64 / n as f64;
                    let weight = (raw / n + ENTRY_OVERHEAD) as f64;
                    eprintln!(
                        "{len}-byte elements: {per_entry:.0} bytes held each, weighed {weight:.0}"
                    );
                    assert!(
                        (0.8..=1.25).contains(&(weight / per_entry)),
                        "{len}-byte elements: {per_entry:.0} bytes held each, weighed {weight:.0}"
                    );
                }
            },
        );
    }

    #[test]
    fn a_message_seen_before_comes_from_the_memo_and_equals_a_parse() {
        let big = "a long tool result \\n with \"escapes\" é ✓ ".repeat(40);
        let tool = json!({"role": "tool", "tool_call_id": "call_memo_1", "content": big});
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}, tool]})
            .to_string();
        let raw = body.as_bytes();
        let tool_raw = serde_json::to_vec(&tool).unwrap();
        assert!(!remembered(&tool_raw));
        let (first, hashes) = object(raw).unwrap();
        assert!(
            remembered(&tool_raw),
            "a long message is kept after its first parse"
        );
        assert_eq!(
            hashes.unwrap(),
            crate::session::tree::raw_message_hashes(raw)
        );
        let (second, _) = object(raw).unwrap();
        assert_eq!(first, second);
        assert_eq!(
            Value::Object(second),
            serde_json::from_slice::<Value>(raw).unwrap()
        );
        // a short one is parsed every time
        assert!(!remembered(br#"{"role":"user","content":"hi"}"#));
        // hashes only for one `messages` array, as the tree's own reading gives them
        for b in [
            r#"{"messages":[1],"messages":[2]}"#,
            r#"{"messages":"x"}"#,
            r#"{"input":[1]}"#,
        ] {
            assert_eq!(object(b.as_bytes()).unwrap().1, None, "{b}");
        }
    }

    #[test]
    fn bodies_it_cannot_read_surely_are_left_to_serde() {
        for b in [
            r#"{"m\u0065ssages":[1]}"#,
            r#"{"messages":[1],"x":tru}"#,
            r#"{"messages":["bad \x escape"]}"#,
            "{\"messages\":[\"raw \u{1} control\"]}",
            r#"{"a":1} 2"#,
            r#"[1]"#,
        ] {
            assert!(object(b.as_bytes()).is_none(), "{b}");
        }
        let deep = format!("{{\"messages\":[{}{}]}}", "[".repeat(200), "]".repeat(200));
        assert!(
            object(deep.as_bytes()).is_none(),
            "as deep as serde_json's limit"
        );
    }

    #[test]
    fn repeated_keys_and_order_as_serde() {
        for b in [
            r#"{"b":1,"a":2,"b":3}"#,
            r#"{"messages":[1],"model":"x","messages":[2,3]}"#,
            r#"{}"#,
            r#" { "tools" : [ ] , "input" : "text" } "#,
        ] {
            same_as_serde(b.as_bytes());
            assert!(object(b.as_bytes()).is_some(), "{b}");
        }
        // the tree's hashes name the array serde_json keeps, or none: not the first of two
        let two = br#"{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}"#;
        assert_eq!(object(two).and_then(|(_, h)| h), None);
        let one = br#"{"model":"x","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#;
        let hashes = object(one).and_then(|(_, h)| h);
        assert_eq!(
            hashes.as_deref(),
            Some(&crate::session::tree::raw_message_hashes(one)[..])
        );
        assert_eq!(hashes.map(|h| h.len()), Some(2));
    }

    /// Any JSON, with long strings (some elements pass the memo's bound) and keys with quotes and escapes.
    fn arb_json() -> impl Strategy<Value = Value> {
        let long = (".{0,8}", 60usize..120).prop_map(|(s, n)| Value::String(s.repeat(n)));
        arb_json_with(long.boxed(), "[a-z\"\\\\]{0,6}")
    }

    proptest! {
        #[test]
        fn equals_serde_on_any_body(
            fields in prop::collection::vec((prop::sample::select(vec!["messages", "input", "tools", "model", "x"]), arb_json()), 0..5),
            items in prop::collection::vec(arb_json(), 0..5),
            pretty in any::<bool>(),
        ) {
            let mut text = String::from("{");
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 { text.push(','); }
                let v = if *k == "x" { v.clone() } else { Value::Array(items.clone()) };
                let v = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
                text.push_str(&format!("{}{:?}: {v}", if pretty { "\n  " } else { "" }, k));
            }
            text.push('}');
            // twice: parsed, then from the memo
            same_as_serde(text.as_bytes());
            same_as_serde(text.as_bytes());
            prop_assert!(object(text.as_bytes()).is_some(), "{}", text);
        }
    }
}
