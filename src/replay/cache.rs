//! What a provider's prompt cache would make of the requests sent: a request is a list of *prefix items* —
//! chat: `[tools] + messages`; Anthropic: `[tools, system] + messages`; Responses: `[tools, instructions] + input
//! items` (an absent field is `null`) — each weighing the tokens of its compact JSON. A request is billed its
//! tokens less 90% of the tokens of the longest run of leading items it shares with the previous request (items
//! compared in order, the first differing item ends the run). Items are compared by a hash of their compact JSON
//! (what the provider's cache keys on), and weighed once per content (cached by that hash).

use crate::context::tokens::{count_text, Encoding};
use crate::dialect::Dialect;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::xxh3_64;

/// Share of the price a cached input token costs, by default (a replay bills at `context.cache_read_price`).
pub const CACHED_PRICE: f64 = 0.1;

/// Token weights of items, by content hash; shared by every replay that uses it (`Send + Sync`).
#[derive(Debug, Default)]
pub struct Weights {
    map: Mutex<FxHashMap<(Encoding, u64), u64>>,
}

/// One request as its prefix items: their content hashes and weights (aligned).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// Hash of each item's compact JSON.
    pub hashes: Vec<u64>,
    /// Tokens of each item's compact JSON.
    pub weights: Vec<u64>,
}

/// The fields of `body` that open its prefix items in `dialect`: `tools`, and the system field of a dialect that
/// keeps it outside the conversation (`null` when absent).
fn field_items(dialect: Dialect, body: &Map<String, Value>) -> Vec<&Value> {
    const NULL: &Value = &Value::Null;
    let field = |k: &str| body.get(k).unwrap_or(NULL);
    let mut items = vec![field("tools")];
    items.extend(dialect.system_key().map(field));
    items
}

/// The items of the conversation of `body` in `dialect` (none when it has none).
fn conversation(dialect: Dialect, body: &Map<String, Value>) -> &[Value] {
    body.get(dialect.conversation_key())
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The prefix items of `body` in `dialect` (see the module doc).
pub fn prefix_items(dialect: Dialect, body: &Map<String, Value>) -> Vec<&Value> {
    let mut items = field_items(dialect, body);
    items.extend(conversation(dialect, body));
    items
}

/// The xxh3 hash of `v`'s compact JSON.
pub fn hash(v: &Value) -> u64 {
    let mut buf = Vec::new();
    compact(v, &mut buf)
}

/// Writes `v`'s compact JSON into `buf` (cleared first); its hash.
fn compact(v: &Value, buf: &mut Vec<u8>) -> u64 {
    buf.clear();
    // writing a Value into a Vec cannot fail
    let _ = serde_json::to_writer(&mut *buf, v);
    xxh3_64(buf)
}

impl Weights {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shape of `body`, sent in `dialect`, counted in `enc`.
    pub fn shape(&self, enc: Encoding, dialect: Dialect, body: &Map<String, Value>) -> Shape {
        let mut shape = self.items(enc, field_items(dialect, body));
        shape.append(self.items(enc, conversation(dialect, body)));
        shape
    }

    /// The shape of `body` whose conversation is the first items of a conversation of shape `items` (computed
    /// once by [`Weights::items`] for a whole trace): only its fields are weighed.
    pub fn shape_over(
        &self,
        enc: Encoding,
        dialect: Dialect,
        body: &Map<String, Value>,
        items: &Shape,
    ) -> Shape {
        let n = conversation(dialect, body).len().min(items.hashes.len());
        let mut shape = self.items(enc, field_items(dialect, body));
        shape.hashes.extend_from_slice(&items.hashes[..n]);
        shape.weights.extend_from_slice(&items.weights[..n]);
        shape
    }

    /// The hashes and weights of `items`.
    pub fn items<'v>(&self, enc: Encoding, items: impl IntoIterator<Item = &'v Value>) -> Shape {
        let mut buf = Vec::new();
        let mut shape = Shape::default();
        for v in items {
            let h = compact(v, &mut buf);
            let cached = self.map.lock().get(&(enc, h)).copied();
            let w = cached.unwrap_or_else(|| {
                let n = std::str::from_utf8(&buf).map_or(0, |s| count_text(enc, s));
                self.map.lock().insert((enc, h), n);
                n
            });
            shape.hashes.push(h);
            shape.weights.push(w);
        }
        shape
    }
}

impl Shape {
    fn append(&mut self, other: Shape) {
        self.hashes.extend(other.hashes);
        self.weights.extend(other.weights);
    }

    /// Tokens of the whole request (every item).
    pub fn tokens(&self) -> u64 {
        self.weights.iter().sum()
    }

    /// Tokens of the longest run of leading items equal to `prev`'s at the same positions.
    pub fn cached_after(&self, prev: &Shape) -> u64 {
        self.hashes
            .iter()
            .zip(&prev.hashes)
            .zip(&self.weights)
            .take_while(|((a, b), _)| a == b)
            .map(|(_, w)| *w)
            .sum()
    }

    /// Every item of `prev` is the same-position item of this request: it only appends.
    pub fn extends(&self, prev: &Shape) -> bool {
        prev.hashes.len() <= self.hashes.len()
            && self.hashes.iter().zip(&prev.hashes).all(|(a, b)| a == b)
    }

    /// Whether the item with content hash `h` is one of the conversation's (not the tools or system field).
    pub fn conversation_has(&self, dialect: Dialect, h: u64) -> bool {
        let fields = 1 + usize::from(dialect.system_key().is_some());
        self.hashes.iter().skip(fields).any(|x| *x == h)
    }
}

/// One trace's requests in order, each compared with the one before.
#[derive(Debug, Clone, Default)]
pub struct Sequence {
    last: Option<Shape>,
}

/// A request as the cache sees it after the previous one of its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cached {
    /// Tokens of its prefix items.
    pub tokens: u64,
    /// Of them, read from the cache (the leading items equal to the previous request's).
    pub cached: u64,
    /// It only appends to the previous request (`None`: the first of the sequence).
    pub extends: Option<bool>,
}

impl Sequence {
    /// Adds the next request.
    pub fn push(&mut self, shape: Shape) -> Cached {
        let c = Cached {
            tokens: shape.tokens(),
            cached: self.last.as_ref().map_or(0, |p| shape.cached_after(p)),
            extends: self.last.as_ref().map(|p| shape.extends(p)),
        };
        self.last = Some(shape);
        c
    }

    /// The last request added.
    pub fn last(&self) -> Option<&Shape> {
        self.last.as_ref()
    }
}

/// What a request of `tokens` tokens is billed when `cached` of them are read from the cache.
pub fn billed(tokens: u64, cached: u64) -> f64 {
    billed_at(tokens, cached, CACHED_PRICE)
}

/// [`billed`] with a cached token at `price` of an uncached one.
pub fn billed_at(tokens: u64, cached: u64, price: f64) -> f64 {
    tokens as f64 - (1.0 - price) * cached as f64
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn prefix_items_per_dialect() {
        let chat = body(json!({"model":"m","messages":[{"role":"user","content":"u"}]}));
        let items = prefix_items(Dialect::Chat, &chat);
        assert_eq!(items, [&Value::Null, &json!({"role":"user","content":"u"})]);
        let anthropic =
            body(json!({"tools":[1],"system":"s","messages":[{"role":"user","content":"u"}]}));
        let items = prefix_items(Dialect::Anthropic, &anthropic);
        assert_eq!(items[..2], [&json!([1]), &json!("s")]);
        assert_eq!(items.len(), 3);
        let responses = body(json!({"input":[{"role":"user","content":"u"}, {"type":"x"}]}));
        let items = prefix_items(Dialect::Responses, &responses);
        assert_eq!(items[..2], [&Value::Null, &Value::Null]);
        assert_eq!(items.len(), 4);
    }

    #[test]
    fn weights_are_the_tokens_of_the_compact_json_and_are_cached() {
        let w = Weights::new();
        let m = json!({"role":"user","content":"hello world"});
        let s = w.shape(
            Encoding::O200k,
            Dialect::Chat,
            &body(json!({"messages":[m]})),
        );
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(s.weights, [1, count_text(Encoding::O200k, &text)]);
        assert_eq!(s.hashes[1], hash(&m));
        assert_eq!(w.map.lock().len(), 2);
        w.shape(
            Encoding::O200k,
            Dialect::Chat,
            &body(json!({"messages":[m, m]})),
        );
        assert_eq!(w.map.lock().len(), 2, "the same content is weighed once");
    }

    #[test]
    fn the_cached_prefix_ends_at_the_first_differing_item() {
        let s = |h: &[u64], w: &[u64]| Shape {
            hashes: h.to_vec(),
            weights: w.to_vec(),
        };
        let prev = s(&[1, 2, 3], &[10, 20, 30]);
        // pure append: the whole previous request is cached
        let next = s(&[1, 2, 3, 4], &[10, 20, 30, 40]);
        assert_eq!(next.cached_after(&prev), 60);
        assert!(next.extends(&prev));
        // a changed item ends the prefix, even if later ones match again
        let changed = s(&[1, 9, 3, 4], &[10, 25, 30, 40]);
        assert_eq!(changed.cached_after(&prev), 10);
        assert!(!changed.extends(&prev));
        // a shorter request is not an append
        let shorter = s(&[1, 2], &[10, 20]);
        assert_eq!(shorter.cached_after(&prev), 30);
        assert!(!shorter.extends(&prev));
        assert_eq!(billed(100, 60), 100.0 - 54.0);
    }
}
