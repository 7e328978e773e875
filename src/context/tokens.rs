//! Token accounting: the tiktoken encoding per model, bounded-time text counts, cached per-message counts
//! (OpenAI cookbook rules) and a per-model calibration against the usage the upstream reports.

use super::pretokenize;
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::bpe::Ranks;
use moka::sync::Cache;
use parking_lot::RwLock;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// Tokens every message costs beyond its fields (cookbook: `<|start|>{role}\n{content}<|end|>`).
const PER_MESSAGE: u64 = 3;
/// Extra token for a message's `name` field.
const PER_NAME: u64 = 1;
/// Tokens priming the assistant's reply, once per request.
const REPLY_PRIMING: u64 = 3;
/// Flat cost of an image part (the low-detail price).
const PER_IMAGE: u64 = 85;
/// Overhead of one tool call in an assistant message, beyond its name and arguments.
const PER_TOOL_CALL: u64 = 3;
/// Overhead of one tool schema, and of the tools block as a whole.
const PER_TOOL: u64 = 4;
const TOOLS_BLOCK: u64 = 8;

/// Longer texts are estimated from `SAMPLES` windows of `SAMPLE_LEN` bytes spread evenly over the text (within
/// 0.1% of the exact count on uniform text). Measured on the project's shared 2-core VM, release build, every
/// piece of text seen for the first time: exact counting of 128 KiB of prose 4 ms (base64 3.7 ms); a 5 MB string
/// 3-8 ms (base64, a single repeated letter). An unoptimised debug build is several times slower.
const EXACT_LIMIT: usize = 128 * 1024;
const SAMPLES: usize = 8;
const SAMPLE_LEN: usize = 8 * 1024;

/// At least this many uncounted messages are counted on several threads.
const PARALLEL_FROM: usize = 16;

/// Calibration: smoothing factor, clamp on the ratio, and how many models are tracked.
const ALPHA: f64 = 0.2;
/// A sample of this many estimated tokens or more moves the ratio with full weight; a smaller one in proportion.
/// A short request's ratio is mostly rounding and per-message overhead (a 9-token "hello" reported as 12 reads as
/// 1.33): taken whole, it would make the next long request look a third larger than it is and rewrite it harder.
const FULL_WEIGHT_TOKENS: f64 = 1024.0;
const RATIO_MIN: f64 = 0.5;
const RATIO_MAX: f64 = 2.0;
const MAX_MODELS: usize = 256;
const MAX_MODEL_NAME: usize = 256;

/// A tiktoken byte-pair encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// `o200k_base`: gpt-4o, gpt-4.1, gpt-5, the o-series, and the default for unknown models.
    O200k,
    /// `cl100k_base`: gpt-4 (not 4o / 4.1) and gpt-3.5; the estimate for Claude models (see
    /// [`Encoding::for_model`]).
    Cl100k,
}

impl Encoding {
    /// The encoding a model uses, tolerating provider prefixes (`openai/gpt-4o`, `anthropic/claude-…`) and case;
    /// unknown → `O200k`.
    ///
    /// `claude-*` models get an estimate: Anthropic publishes no tokenizer for Claude 3 and later (only
    /// `/v1/messages/count_tokens`, a network call), and of the public encodings `cl100k_base` is the closer. Claude's
    /// tokenizers split text into more tokens than OpenAI's (reported: roughly 1.1–1.3× `cl100k_base` on English
    /// and code, more for the newer generations), and `o200k_base`, with its larger vocabulary, counts fewer still:
    /// `cl100k_base` undercounts least, and an undercount is the costly error (a request the upstream refuses). The
    /// rest of the gap is closed per model by [`TokenCounter::observe`], fed the usage the upstream reports.
    pub fn for_model(model: &str) -> Encoding {
        let lower = model.trim().to_ascii_lowercase();
        let name = lower.rsplit('/').next().unwrap_or_default();
        let starts = |prefixes: &[&str]| prefixes.iter().any(|p| name.starts_with(p));
        let openai_cl100k =
            !starts(&["gpt-4o", "gpt-4."]) && starts(&["gpt-4", "gpt-3.5", "gpt-35", "text-embed"]);
        if openai_cl100k || starts(&["claude"]) {
            Encoding::Cl100k
        } else {
            Encoding::O200k
        }
    }

    /// The encoding's tiktoken name.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::O200k => "o200k_base",
            Encoding::Cl100k => "cl100k_base",
        }
    }

    fn which(self) -> pretokenize::Which {
        match self {
            Encoding::O200k => pretokenize::Which::O200k,
            Encoding::Cl100k => pretokenize::Which::Cl100k,
        }
    }

    /// The encoding's ranks, read out of tiktoken's once per process (its `CoreBPE` is then dropped: see
    /// [`super::bpe`]); `None` only if tiktoken's embedded tables fail to load.
    fn bpe(self) -> Option<&'static Ranks> {
        static O200K: OnceLock<Option<Ranks>> = OnceLock::new();
        static CL100K: OnceLock<Option<Ranks>> = OnceLock::new();
        match self {
            Encoding::O200k => O200K.get_or_init(|| {
                tiktoken_rs::o200k_base()
                    .ok()
                    .map(|bpe| Ranks::from_tiktoken(&bpe))
            }),
            Encoding::Cl100k => CL100K.get_or_init(|| {
                tiktoken_rs::cl100k_base()
                    .ok()
                    .map(|bpe| Ranks::from_tiktoken(&bpe))
            }),
        }
        .as_ref()
    }
}

/// Builds both encodings' tables now (~0.25 s each in a release build) rather than on first use; which of
/// `[o200k_base, cl100k_base]` loaded (one that failed is counted by an estimate from bytes). `serve` calls it on
/// a start-up thread of its own, so that the first conversation large enough to be counted does not wait.
pub fn load_tables() -> [bool; 2] {
    [Encoding::O200k, Encoding::Cl100k].map(|e| e.bpe().is_some())
}

/// Forgets the pieces of text this thread has counted (benchmarks of a first sight use it; counts are unchanged).
pub fn forget_pieces() {
    pretokenize::forget_pieces();
}

/// Number of tokens in `text`: exact up to 128 KiB (tiktoken's own count; a single piece over 256 bytes without
/// a break, such as base64, is counted in parts), sampled and extrapolated beyond, so any input is counted in
/// bounded time and stack.
pub fn count_text(enc: Encoding, text: &str) -> u64 {
    let Some(bpe) = enc.bpe() else {
        return (text.len() as u64).div_ceil(4);
    };
    if text.len() <= EXACT_LIMIT {
        return pretokenize::count(enc.which(), bpe, text);
    }
    let step = (text.len() - SAMPLE_LEN) / (SAMPLES - 1);
    let (mut tokens, mut bytes) = (0u64, 0u64);
    for i in 0..SAMPLES {
        let start = floor_boundary(text, i * step);
        let end = floor_boundary(text, (i * step + SAMPLE_LEN).min(text.len()));
        tokens += pretokenize::count(enc.which(), bpe, &text[start..end]);
        bytes += (end - start) as u64;
    }
    let estimate = (u128::from(tokens) * text.len() as u128).div_ceil(u128::from(bytes.max(1)));
    u64::try_from(estimate).unwrap_or(u64::MAX)
}

/// The largest char boundary at or below `i` (`i` ≥ 4 keeps the result > 0).
fn floor_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The most counts a counter keeps (at ~257 bytes each, 128 MB).
pub const MAX_ENTRIES: u64 = 500_000;
/// The fewest counts a counter sized by a small history cache keeps.
pub const MIN_ENTRIES: u64 = 4_096;

/// The longest requests back [`TokenCounter::messages_tokens_prefixed`] looks for an earlier one this one starts with
/// (a client that drops a few messages, or a recall round, stays within it).
const MAX_COUNT_PROBES: usize = 64;

/// What a cached count is of: the kind seeds the hash so a message and a tool never share an entry.
#[derive(Clone, Copy)]
enum Kind {
    Message = 1,
    Tool = 2,
    Text = 3,
    Named = 4,
    Derived = 5,
    Raw = 6,
}

/// The most bytes the prefix memo keeps (see [`TokenCounter::prefix_hashes`]); 64 bytes per count the counter
/// keeps below that (16 MiB at the default history cache of 256 MiB, 4 MiB at 64 MiB).
const PREFIX_BYTES: u64 = 32 << 20;
/// 16 bytes per count the counter keeps, up to this: the most bytes of code-like strings the named-strings memo keeps (see [`TokenCounter::named_strings`]).
const NAMED_BYTES: u64 = 16 << 20;

/// Counts tokens of messages and tool schemas with a bounded cache, and keeps the per-model calibration.
/// `Send + Sync`: one instance is shared behind an `Arc`.
pub struct TokenCounter {
    cache: Cache<(Encoding, u64), u64>,
    /// (what, message hash) → strings found in the message's text: the code-like strings it names
    /// (`context::usage`), the digest of a cleared result (`shape::digest_words`); weighed by their bytes.
    named: Cache<(u64, u64), Arc<[Box<str>]>>,
    /// A hash of a request's first messages → what a planning step found in them (`context::usage`'s scan), so
    /// the next request of the conversation, which starts with the same messages, extends it instead of redoing
    /// it; weighed by the bytes its owner reports.
    prefixes: Cache<u64, (Arc<dyn std::any::Any + Send + Sync>, u32)>,
    ratios: RwLock<BTreeMap<String, f64>>,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("cached", &self.cache.entry_count())
            .field("models", &self.ratios.read().len())
            .finish()
    }
}

impl Default for TokenCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenCounter {
    /// A counter with an empty cache (at most [`MAX_ENTRIES`] entries) and no calibration.
    pub fn new() -> Self {
        Self::with_capacity(MAX_ENTRIES)
    }

    /// A counter whose cache keeps at most `entries` counts (~257 bytes each), and no calibration.
    pub fn with_capacity(entries: u64) -> Self {
        TokenCounter {
            cache: Cache::new(entries),
            named: Cache::builder()
                .max_capacity((entries * 16).min(NAMED_BYTES))
                .weigher(|_, v: &Arc<[Box<str>]>| {
                    let bytes: usize = v.iter().map(|s| s.len() + 16).sum::<usize>() + 64;
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .build(),
            prefixes: Cache::builder()
                .max_capacity((entries * 64).min(PREFIX_BYTES))
                .weigher(|_, v: &(Arc<dyn std::any::Any + Send + Sync>, u32)| v.1)
                .build(),
            ratios: RwLock::new(BTreeMap::new()),
        }
    }

    /// The most counts the cache keeps.
    pub fn capacity(&self) -> u64 {
        self.cache.policy().max_capacity().unwrap_or(MAX_ENTRIES)
    }

    /// A counter sized by the history cache's budget (`store.cache_max_bytes`): one count per KiB of it, between
    /// [`MIN_ENTRIES`] and [`MAX_ENTRIES`] — about one per message the cached histories hold (a message weighs
    /// about a KiB there), so the counts of what is cached stay cached, and the memo costs about a quarter of the
    /// budget at most (262,144 counts, ~67 MB, at the default 256 MiB; 65,536, ~17 MB, at 64 MiB); the memos of
    /// strings and prefixes a tenth more (80 bytes per count: 20 MiB at 256 MiB, 5 MiB at 64 MiB).
    pub fn sized_by(cache_max_bytes: u64) -> Self {
        Self::with_capacity((cache_max_bytes / 1024).clamp(MIN_ENTRIES, MAX_ENTRIES))
    }

    /// Tokens of one chat message, cookbook style: 3 + every string field (+1 for `name`), text parts of a
    /// content array, 85 per image part, each tool call's name and arguments plus a small overhead.
    pub fn message_tokens(&self, enc: Encoding, m: &Value) -> u64 {
        let key = (enc, message_key(Self::content_hash(m)));
        if let Some(n) = self.cache.get(&key) {
            return n;
        }
        let n = message_uncached(enc, m);
        self.cache.insert(key, n);
        n
    }

    /// Tokens of a request's `tools`: the JSON text of each schema plus a small overhead; 0 when null or empty.
    pub fn tools_tokens(&self, enc: Encoding, tools: &Value) -> u64 {
        let one = |t: &Value| {
            self.cached(enc, Kind::Tool, t, || {
                PER_TOOL + serde_json::to_string(t).map_or(0, |s| count_text(enc, &s))
            })
        };
        match tools {
            Value::Null => 0,
            Value::Array(list) if list.is_empty() => 0,
            Value::Array(list) => TOOLS_BLOCK + list.iter().map(one).sum::<u64>(),
            other => TOOLS_BLOCK + one(other),
        }
    }

    /// Tokens of a piece of text (a tool call's arguments), cached like a message.
    pub fn text_tokens(&self, enc: Encoding, text: &str) -> u64 {
        let mut h = [0u8; 17];
        h[0] = Kind::Text as u8;
        h[1..9].copy_from_slice(&(text.len() as u64).to_le_bytes());
        h[9..].copy_from_slice(&xxh3_64(text.as_bytes()).to_le_bytes());
        let key = (enc, xxh3_64(&h));
        if let Some(n) = self.cache.get(&key) {
            return n;
        }
        let n = count_text(enc, text);
        self.cache.insert(key, n);
        n
    }

    /// Tokens of each message of `msgs`. When many are not cached yet (a long history seen for the first time),
    /// they are counted on every core (scoped threads): that is mostly tokenizing, which splits well.
    pub fn messages_tokens<M: Borrow<Value> + Sync>(&self, enc: Encoding, msgs: &[M]) -> Vec<u64> {
        let hashes: Vec<u64> = msgs
            .iter()
            .map(|m| Self::content_hash(m.borrow()))
            .collect();
        self.messages_tokens_hashed(enc, msgs, &hashes)
    }

    /// [`Self::messages_tokens`] of messages whose [`Self::content_hash`]es the caller has already (the planner
    /// hashes each message once, for its counts and its memos alike).
    pub fn messages_tokens_hashed<M: Borrow<Value> + Sync>(
        &self,
        enc: Encoding,
        msgs: &[M],
        content_hashes: &[u64],
    ) -> Vec<u64> {
        debug_assert_eq!(msgs.len(), content_hashes.len());
        let mut out = Vec::with_capacity(msgs.len());
        let mut misses = Vec::new();
        for (i, h) in content_hashes.iter().enumerate().take(msgs.len()) {
            let key = (enc, message_key(*h));
            match self.cache.get(&key) {
                Some(n) => out.push(n),
                None => {
                    out.push(0);
                    misses.push((i, key));
                }
            }
        }
        let count = |part: &[(usize, (Encoding, u64))]| -> Vec<u64> {
            part.iter()
                .map(|(i, _)| message_uncached(enc, msgs[*i].borrow()))
                .collect()
        };
        let threads = if misses.len() < PARALLEL_FROM {
            1
        } else {
            cores()
        };
        let counts: Vec<u64> = if threads < 2 {
            count(&misses)
        } else {
            std::thread::scope(|s| {
                let parts: Vec<_> = misses
                    .chunks(misses.len().div_ceil(threads))
                    .map(|part| {
                        let h = s.spawn(move || count(part));
                        (part, h)
                    })
                    .collect();
                parts
                    .into_iter()
                    .flat_map(|(part, h)| h.join().unwrap_or_else(|_| count(part)))
                    .collect()
            })
        };
        for ((i, key), n) in misses.into_iter().zip(counts) {
            out[i] = n;
            self.cache.insert(key, n);
        }
        out
    }

    /// Tokens of a message the planner derives from one it has counted (a cleared result's placeholder, a long
    /// message cut short), remembered by `key` — a hash of the original's [`Self::content_hash`] and of everything
    /// else the derived form depends on — so that later requests carrying the same original count it without
    /// building the derived form again. `count` builds and counts it when the memo has forgotten it.
    pub fn derived_tokens(&self, enc: Encoding, key: u64, count: impl FnOnce() -> u64) -> u64 {
        let mut buf = [0u8; 9];
        buf[0] = Kind::Derived as u8;
        buf[1..].copy_from_slice(&key.to_le_bytes());
        let key = (enc, xxh3_64(&buf));
        if let Some(n) = self.cache.get(&key) {
            return n;
        }
        let n = count();
        self.cache.insert(key, n);
        n
    }

    /// The hash [`Self::remembered_strings_of`] keys a message by (one entry of [`Self::prefix_hashes`]' second
    /// list).
    pub fn content_hash(m: &Value) -> u64 {
        hash_value(Kind::Named, m)
    }

    /// Strings `compute` finds in the message whose [`Self::content_hash`] is `hash`, remembered by that hash and
    /// `what` (which finding it is: 0 the code-like strings it names, `1 + digest_tokens` a cleared result's
    /// digest). A request's earlier messages come back every turn, and finding the strings scans their whole text.
    pub fn remembered_strings_of(
        &self,
        hash: u64,
        what: u64,
        compute: impl FnOnce() -> Vec<Box<str>>,
    ) -> Arc<[Box<str>]> {
        let key = (what, hash);
        if let Some(v) = self.named.get(&key) {
            return v;
        }
        let v: Arc<[Box<str>]> = compute().into();
        self.named.insert(key, Arc::clone(&v));
        v
    }

    /// For each `k` in `0..=msgs.len()`, a hash of `msgs[..k]` (chained over the messages' content hashes), with
    /// `what` (which finding it keys) mixed in: keys for [`Self::remembered_prefix`].
    /// The second list: each message's [`Self::content_hash`].
    pub fn prefix_hashes(&self, what: u64, msgs: &[Value]) -> (Vec<u64>, Vec<u64>) {
        Self::chain(what, msgs.iter().map(Self::content_hash), msgs.len())
    }

    /// [`Self::prefix_hashes`] of messages given the xxh3 of each one's bytes as the client sent them (`raw`: the
    /// parse's `dialect::Request::item_hashes`, computed anyway), instead of walking each message's JSON again.
    /// Each becomes that message's content hash, tagged so that it never stands for a walked hash: the same bytes
    /// give the same message, so a memo keyed by either finds what the message's content gives (re-serialised
    /// bytes of the same message only miss the memo).
    pub fn prefix_hashes_raw(&self, what: u64, raw: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let own = raw.iter().map(|r| {
            let mut buf = [0u8; 9];
            buf[0] = Kind::Raw as u8;
            buf[1..].copy_from_slice(&r.to_le_bytes());
            xxh3_64(&buf)
        });
        Self::chain(what, own, raw.len())
    }

    fn chain(what: u64, own: impl Iterator<Item = u64>, len: usize) -> (Vec<u64>, Vec<u64>) {
        let mut out = Vec::with_capacity(len + 1);
        let mut each = Vec::with_capacity(len);
        let mut h = xxh3_64(&what.to_le_bytes());
        out.push(h);
        for own in own {
            each.push(own);
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&h.to_le_bytes());
            buf[8..].copy_from_slice(&own.to_le_bytes());
            h = xxh3_64(&buf);
            out.push(h);
        }
        (out, each)
    }

    /// [`Self::messages_tokens_hashed`] of a request's messages given their [`Self::prefix_hashes`] (`keys`, and
    /// `each` message's content hash): the counts of the longest earlier request this one starts with (the previous
    /// turn's, as a rule) are remembered as one list, so only the messages after it are looked up one by one. The
    /// same counts (test: `context::tests::round4::what_the_planner_remembers_gives_the_plan_it_would_make_afresh`).
    pub fn messages_tokens_prefixed(
        &self,
        enc: Encoding,
        msgs: &[Value],
        (keys, each): (&[u64], &[u64]),
    ) -> Vec<u64> {
        let key = |k: usize| {
            let mut buf = [0u8; 10];
            buf[0] = Kind::Message as u8;
            buf[1] = enc as u8;
            buf[2..].copy_from_slice(&keys[k].to_le_bytes());
            xxh3_64(&buf)
        };
        let oldest = msgs.len().saturating_sub(MAX_COUNT_PROBES);
        let found = (oldest..=msgs.len()).rev().find_map(|k| {
            let v = self.remembered_prefix(key(k))?;
            v.downcast::<Vec<u64>>().ok().filter(|c| c.len() == k)
        });
        if let Some(all) = found.as_ref().filter(|c| c.len() == msgs.len()) {
            return all.to_vec();
        }
        let mut counts = found.map(|c| c.to_vec()).unwrap_or_default();
        let from = counts.len();
        counts.extend(self.messages_tokens_hashed(enc, &msgs[from..], &each[from..]));
        self.remember_prefix(
            key(msgs.len()),
            Arc::new(counts.clone()),
            counts.len() * std::mem::size_of::<u64>(),
        );
        counts
    }

    /// What was remembered for the prefix whose [`Self::prefix_hashes`] entry is `key`, if anything.
    pub fn remembered_prefix(&self, key: u64) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        self.prefixes.get(&key).map(|(v, _)| v)
    }

    /// Remembers `value` (about `bytes` bytes) for the prefix whose [`Self::prefix_hashes`] entry is `key`.
    pub fn remember_prefix(
        &self,
        key: u64,
        value: Arc<dyn std::any::Any + Send + Sync>,
        bytes: usize,
    ) {
        self.prefixes
            .insert(key, (value, u32::try_from(bytes).unwrap_or(u32::MAX)));
    }

    /// Tokens of a whole request: its messages, its tools, and the reply priming.
    pub fn request_tokens<M: Borrow<Value> + Sync>(
        &self,
        enc: Encoding,
        messages: &[M],
        tools: Option<&Value>,
    ) -> u64 {
        let msgs: u64 = self.messages_tokens(enc, messages).iter().sum();
        msgs + tools.map_or(0, |t| self.tools_tokens(enc, t)) + REPLY_PRIMING
    }

    /// [`Self::request_tokens`] of a request the planner plans (or planned), with its messages keyed as the planner
    /// keys them (`keys`: `context::usage::Usage::prefix_hashes`, which take the parse's hashes of a chat
    /// request's bytes), so that the count and the plan share their memos — the counts of this very request, once
    /// remembered, are one lookup.
    pub fn request_tokens_keyed(
        &self,
        enc: Encoding,
        messages: &[Value],
        keys: (&[u64], &[u64]),
        tools: Option<&Value>,
    ) -> u64 {
        let msgs: u64 = self
            .messages_tokens_prefixed(enc, messages, keys)
            .iter()
            .sum();
        msgs + tools.map_or(0, |t| self.tools_tokens(enc, t)) + REPLY_PRIMING
    }

    /// Records the upstream's `usage.prompt_tokens` (`actual`) against our `estimated` count for `model`. A sample
    /// outside [0.5, 2] is not a tokenizer difference but a miscount (a proxy, a mock, a provider that reports
    /// something else): it is ignored rather than allowed to skew every later estimate. A sample weighs in proportion
    /// to its size up to [`FULL_WEIGHT_TOKENS`]; the first one of a model is blended with the prior ratio 1.0.
    pub fn observe(&self, model: &str, estimated: u64, actual: u64) {
        if estimated == 0 || actual == 0 || model.len() > MAX_MODEL_NAME {
            return;
        }
        let sample = actual as f64 / estimated as f64;
        if !(RATIO_MIN..=RATIO_MAX).contains(&sample) {
            tracing::debug!(
                model,
                estimated,
                actual,
                "calibration: implausible usage sample ignored"
            );
            return;
        }
        let weight = (estimated as f64 / FULL_WEIGHT_TOKENS).min(1.0);
        let mut ratios = self.ratios.write();
        if let Some(r) = ratios.get_mut(model) {
            *r += ALPHA * weight * (sample - *r);
        } else if ratios.len() < MAX_MODELS {
            ratios.insert(model.to_owned(), 1.0 + weight * (sample - 1.0));
        }
    }

    /// Whether an upstream count of `actual` tokens could be a calibration sample for a request of `messages`
    /// messages, whatever its exact estimate: every message counts at least `PER_MESSAGE` and the request
    /// `REPLY_PRIMING`, so an `actual` under `RATIO_MIN` times that floor is ignored by [`TokenCounter::observe`]
    /// for any estimate. Lets a caller skip counting a request only for a sample that would be thrown away.
    pub fn could_calibrate(messages: usize, actual: u64) -> bool {
        let floor = (messages as u64)
            .saturating_mul(PER_MESSAGE)
            .saturating_add(REPLY_PRIMING);
        actual != 0 && actual as f64 >= floor as f64 * RATIO_MIN
    }

    /// Whether `model` has a calibration ratio (an answer's usage was observed for it).
    pub fn knows(&self, model: &str) -> bool {
        self.ratios.read().contains_key(model)
    }

    /// The calibration ratio (actual / estimated) for `model`; 1.0 when unknown.
    pub fn ratio(&self, model: &str) -> f64 {
        self.ratios.read().get(model).copied().unwrap_or(1.0)
    }

    /// Every tracked model's ratio, sorted by model name.
    pub fn ratios(&self) -> Vec<(String, f64)> {
        self.ratios
            .read()
            .iter()
            .map(|(m, r)| (m.clone(), *r))
            .collect()
    }

    /// `estimate` scaled by the model's ratio, rounded up.
    pub fn calibrated(&self, model: &str, estimate: u64) -> u64 {
        // The small epsilon keeps float noise (100 × 1.1 = 110.000…01) from rounding up a whole token.
        (estimate as f64 * self.ratio(model) - 1e-6).ceil().max(0.0) as u64
    }

    fn cached(&self, enc: Encoding, kind: Kind, v: &Value, count: impl FnOnce() -> u64) -> u64 {
        let key = (enc, hash_value(kind, v));
        if let Some(n) = self.cache.get(&key) {
            return n;
        }
        let n = count();
        self.cache.insert(key, n);
        n
    }
}

/// The count memo's key of a message, from its [`TokenCounter::content_hash`] (one walk of the message serves
/// both).
fn message_key(content_hash: u64) -> u64 {
    let mut buf = [0u8; 9];
    buf[0] = Kind::Message as u8;
    buf[1..].copy_from_slice(&content_hash.to_le_bytes());
    xxh3_64(&buf)
}

fn message_uncached(enc: Encoding, m: &Value) -> u64 {
    let Value::Object(fields) = m else {
        return PER_MESSAGE + string_leaves(enc, m);
    };
    let mut total = PER_MESSAGE;
    for (key, value) in fields {
        total += match (key.as_str(), value) {
            ("content", Value::Array(parts)) => parts.iter().map(|p| part_tokens(enc, p)).sum(),
            ("tool_calls", Value::Array(calls)) => calls.iter().map(|c| call_tokens(enc, c)).sum(),
            ("function_call", f) => PER_TOOL_CALL + function_tokens(enc, f),
            ("name", v) => PER_NAME + string_leaves(enc, v),
            (_, v) => string_leaves(enc, v),
        };
    }
    total
}

fn part_tokens(enc: Encoding, part: &Value) -> u64 {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => part.get("text").map_or(0, |t| string_leaves(enc, t)),
        Some("image_url" | "input_image" | "image") => PER_IMAGE,
        Some("refusal") => part.get("refusal").map_or(0, |t| string_leaves(enc, t)),
        _ => string_leaves(enc, part),
    }
}

fn call_tokens(enc: Encoding, call: &Value) -> u64 {
    PER_TOOL_CALL
        + call
            .get("function")
            .map_or_else(|| string_leaves(enc, call), |f| function_tokens(enc, f))
}

/// A function call's name and arguments (not its id).
fn function_tokens(enc: Encoding, f: &Value) -> u64 {
    ["name", "arguments"]
        .iter()
        .filter_map(|k| f.get(*k))
        .map(|v| string_leaves(enc, v))
        .sum()
}

/// Tokens of every string inside `v` (walked with an explicit stack: no recursion on deep values).
fn string_leaves(enc: Encoding, v: &Value) -> u64 {
    let (mut stack, mut total) = (vec![v], 0);
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => total += count_text(enc, s),
            Value::Array(a) => stack.extend(a),
            Value::Object(o) => stack.extend(o.values()),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    total
}

/// Cores to count on (at most 8), read once: `available_parallelism` reads cgroup files on every call.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8)
    })
}

/// A 64-bit xxh3 of `v`'s structure and contents, fed by walking it (no serialization). Each item adds a tag and a
/// word (a leaf's length, a container's arity, a number's bits) to a small buffer, so the pre-order stream is
/// unambiguous; short strings are copied in, long ones (most of a conversation's bytes) are hashed in one pass
/// (`xxh3_64`, much faster than the streaming hasher) and only their digest is added.
fn hash_value(kind: Kind, v: &Value) -> u64 {
    enum Item<'a> {
        Key(&'a str),
        Val(&'a Value),
    }
    const INLINE: usize = 64;
    // Sized for a chat message with a few tool calls, so that neither grows on the common path.
    let mut buf: Vec<u8> = Vec::with_capacity(512);
    buf.push(kind as u8);
    let mut stack = Vec::with_capacity(32);
    stack.push(Item::Val(v));
    let text = |buf: &mut Vec<u8>, tag: u8, s: &str| {
        buf.push(tag);
        buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
        if s.len() <= INLINE {
            buf.extend_from_slice(s.as_bytes());
        } else {
            buf.extend_from_slice(&xxh3_64(s.as_bytes()).to_le_bytes());
        }
    };
    while let Some(item) = stack.pop() {
        let (tag, word) = match item {
            Item::Key(k) => {
                text(&mut buf, b'k', k);
                continue;
            }
            Item::Val(Value::String(s)) => {
                text(&mut buf, b's', s);
                continue;
            }
            Item::Val(Value::Null) => (b'z', 0),
            Item::Val(Value::Bool(b)) => (b'b', u64::from(*b)),
            Item::Val(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => (b'u', u),
                (None, Some(i)) => (b'i', i as u64),
                (None, None) => (b'f', n.as_f64().unwrap_or(0.0).to_bits()),
            },
            Item::Val(Value::Array(a)) => {
                stack.extend(a.iter().rev().map(Item::Val));
                (b'a', a.len() as u64)
            }
            Item::Val(Value::Object(o)) => {
                for (k, v) in o.iter().rev() {
                    stack.push(Item::Val(v));
                    stack.push(Item::Key(k));
                }
                (b'o', o.len() as u64)
            }
        };
        buf.push(tag);
        buf.extend_from_slice(&word.to_le_bytes());
    }
    xxh3_64(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_is_sized_by_the_history_cache() {
        const MIB: u64 = 1 << 20;
        for (budget, want) in [
            (256 * MIB, 262_144),
            (64 * MIB, 65_536),
            (MIB, MIN_ENTRIES),
            (1 << 40, MAX_ENTRIES),
        ] {
            assert_eq!(TokenCounter::sized_by(budget).capacity(), want, "{budget}");
        }
        assert_eq!(TokenCounter::new().capacity(), MAX_ENTRIES);
    }
    use serde_json::json;

    #[test]
    fn encoding_per_model() {
        use Encoding::*;
        let o200k =
            "gpt-4o GPT-4o-mini openai/gpt-4o chatgpt-4o-latest gpt-4.1-nano gpt-5 o1-mini o3";
        let cl100k = "gpt-4 gpt-4-turbo-2024-04-09 azure/gpt-4-32k gpt-3.5-turbo Gpt-35-Turbo";
        let claude = "claude-sonnet-4-5-20250929 claude-opus-4-1-20250805 claude-haiku-4-5-20251001 \
                      claude-sonnet-4-5[1m] Claude-3-5-Sonnet-20241022 anthropic/claude-opus-4-6 claude-2.1";
        for (names, enc) in [
            (o200k, O200k),
            ("o4-mini llama3 mistral-large-latest ", O200k),
            (cl100k, Cl100k),
            (claude, Cl100k),
        ] {
            for model in names.split(' ') {
                assert_eq!(Encoding::for_model(model), enc, "{model}");
            }
        }
        assert_eq!(Cl100k.as_str(), "cl100k_base");
    }

    /// Why Claude's estimate uses `cl100k_base`: it never counts fewer tokens than `o200k_base` on the text agents
    /// send (prose, code, JSON), so it undercounts Claude's larger counts least.
    #[test]
    fn cl100k_counts_at_least_o200k_on_agent_text() {
        let samples = [
            "The quick brown fox jumps over the lazy dog; it's 42 degrees outside.",
            "fn main() {\n    let xs: Vec<u64> = (0..10).map(|x| x * 2).collect();\n    println!(\"{xs:?}\");\n}",
            r#"{"type":"tool_result","tool_use_id":"toolu_01","content":"src/lib.rs:12: error[E0308]"}"#,
            "Die Katze sitzt auf der Matte und schläft, während draußen der Regen fällt.",
        ];
        for text in samples {
            let (cl, o) = (
                count_text(Encoding::Cl100k, text),
                count_text(Encoding::O200k, text),
            );
            assert!(cl >= o, "{cl} < {o}: {text}");
        }
        let all = samples.join("\n").repeat(20);
        assert!(count_text(Encoding::Cl100k, &all) > count_text(Encoding::O200k, &all));
    }

    #[test]
    fn known_text_counts() {
        for enc in [Encoding::O200k, Encoding::Cl100k] {
            assert_eq!(count_text(enc, "hello world"), 2);
            assert_eq!(count_text(enc, ""), 0);
        }
    }

    #[test]
    fn chunking_does_not_change_the_count_of_ordinary_text() {
        let para = "The quick brown fox jumps over the lazy dog; it's 42 degrees.\n\tfn main() { x += 1; }  ";
        let text = para.repeat(500); // ~45 KB: many chunks
        for (enc, bpe) in [
            (Encoding::O200k, tiktoken_rs::o200k_base_singleton()),
            (Encoding::Cl100k, tiktoken_rs::cl100k_base_singleton()),
        ] {
            let whole = bpe.encode_ordinary(&text).len() as u64;
            assert_eq!(count_text(enc, &text), whole);
        }
    }

    #[test]
    fn message_total_matches_a_hand_count() {
        let c = TokenCounter::new();
        let enc = Encoding::O200k;
        // 3 per message + "user" (1) + "hello world" (2)
        let m = json!({"role": "user", "content": "hello world"});
        assert_eq!(c.message_tokens(enc, &m), 6);
        // + name: "bob" (1) + 1
        let named = json!({"role": "user", "name": "bob", "content": "hello world"});
        assert_eq!(c.message_tokens(enc, &named), 8);
        // null content: 3 + "assistant" (1)
        assert_eq!(
            c.message_tokens(enc, &json!({"role": "assistant", "content": null})),
            4
        );
        // two messages + reply priming
        assert_eq!(c.request_tokens(enc, &[m.clone(), m], None), 15);
    }

    #[test]
    fn content_parts_and_tool_calls() {
        let c = TokenCounter::new();
        let enc = Encoding::O200k;
        let parts = json!({"role": "user", "content": [
            {"type": "text", "text": "hello world"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ]});
        assert_eq!(c.message_tokens(enc, &parts), 3 + 1 + 2 + PER_IMAGE);
        let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "hello", "arguments": "hello world"}},
        ]});
        let name = count_text(enc, "hello");
        assert_eq!(
            c.message_tokens(enc, &call),
            3 + 1 + PER_TOOL_CALL + name + 2
        );
        let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "hello world"});
        let expected = 3 + count_text(enc, "tool") + count_text(enc, "call_1") + 2;
        assert_eq!(c.message_tokens(enc, &result), expected);
    }

    #[test]
    fn cache_hit_gives_the_same_count_and_keys_differ_by_encoding() {
        let c = TokenCounter::new();
        let m = json!({"role": "user", "content": "Some text, counted twice. ".repeat(50)});
        let first = c.message_tokens(Encoding::O200k, &m);
        assert_eq!(c.message_tokens(Encoding::O200k, &m), first);
        c.cache.run_pending_tasks();
        assert_eq!(c.cache.entry_count(), 1);
        c.message_tokens(Encoding::Cl100k, &m);
        c.cache.run_pending_tasks();
        assert_eq!(c.cache.entry_count(), 2);
        assert_ne!(
            hash_value(Kind::Message, &json!(["a", "b"])),
            hash_value(Kind::Message, &json!(["ab"]))
        );
        assert_ne!(hash_value(Kind::Message, &m), hash_value(Kind::Tool, &m));
    }

    #[test]
    fn tools_are_counted() {
        let c = TokenCounter::new();
        let enc = Encoding::O200k;
        let tool = json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let one = c.tools_tokens(enc, &json!([tool]));
        let json_len = count_text(enc, &tool.to_string());
        assert_eq!(one, TOOLS_BLOCK + PER_TOOL + json_len);
        assert_eq!(
            c.tools_tokens(enc, &json!([tool, tool])),
            one + PER_TOOL + json_len
        );
        assert_eq!(c.tools_tokens(enc, &Value::Null), 0);
        assert_eq!(c.tools_tokens(enc, &json!([])), 0);
        let m = [json!({"role": "user", "content": "hello world"})];
        assert_eq!(c.request_tokens(enc, &m, Some(&json!([tool]))), 6 + one + 3);
    }

    #[test]
    fn huge_text_without_spaces_is_plausible() {
        let len = 5 * 1024 * 1024;
        let text: String = (0..len)
            .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
            .collect();
        let n = count_text(Encoding::O200k, &text);
        assert!(n > (len / 10) as u64 && n < len as u64, "{n}");
        let cjk = "上下文窗口".repeat(400_000); // 6 MB of multi-byte chars
        let n = count_text(Encoding::O200k, &cjk);
        assert!(n > 200_000 && n < 6_000_000, "{n}");
    }

    #[test]
    fn calibration_ema_bounds_and_outliers() {
        let c = TokenCounter::new();
        assert_eq!(c.ratio("m"), 1.0);
        c.observe("m", 2000, 2200);
        assert!((c.ratio("m") - 1.1).abs() < 1e-9);
        c.observe("m", 2000, 2400);
        assert!((c.ratio("m") - 1.12).abs() < 1e-9);
        assert_eq!(c.calibrated("m", 100), 112);
        c.observe("big", 2000, 20000);
        assert_eq!(c.ratio("big"), 1.0, "implausible samples are ignored");
        c.observe("big", 2000, 4000);
        assert_eq!(c.ratio("big"), RATIO_MAX);
        c.observe("small", 2000, 1);
        c.observe("small", 2000, 1000);
        assert_eq!(c.ratio("small"), RATIO_MIN);
        c.observe("zero", 0, 10);
        c.observe("zero", 10, 0);
        assert_eq!(c.ratio("zero"), 1.0);
        let names: Vec<String> = c.ratios().into_iter().map(|(m, _)| m).collect();
        assert_eq!(names, ["big", "m", "small"]);
        for i in 0..MAX_MODELS + 10 {
            c.observe(&format!("model-{i}"), 10, 10);
        }
        assert_eq!(c.ratios().len(), MAX_MODELS);
        assert_eq!(c.calibrated("unknown", 101), 101);
    }

    /// A short request's ratio is mostly rounding: "hello" estimated 9 and reported 12 must not make a 9,000-token
    /// history look like 12,000. It weighs in proportion to its size; a long request's sample weighs fully.
    #[test]
    fn a_short_request_barely_moves_the_calibration() {
        let c = TokenCounter::new();
        c.observe("m", 9, 12);
        assert!(c.knows("m"));
        assert!((c.ratio("m") - 1.0).abs() < 0.003, "{}", c.ratio("m"));
        assert_eq!(c.calibrated("m", 8873), 8899, "26 tokens more, not 2,958");
        c.observe("m", 512, 768); // half weight: a half-sized step of the usual smoothing
        let before = 1.0 + 9.0 / 1024.0 * (12.0 / 9.0 - 1.0);
        let expected = before + ALPHA * 0.5 * (1.5 - before);
        assert!((c.ratio("m") - expected).abs() < 1e-9, "{}", c.ratio("m"));
        let long = TokenCounter::new();
        long.observe("m", 8000, 9600);
        assert!((long.ratio("m") - 1.2).abs() < 1e-9);
    }

    #[test]
    fn long_lists_counted_in_parallel_match_one_by_one() {
        let msgs: Vec<Value> = (0..200)
            .map(|i| serde_json::json!({"role": "user", "content": format!("message {i} {}", "word ".repeat(i))}))
            .collect();
        let one_by_one: Vec<u64> = {
            let c = TokenCounter::new();
            msgs.iter()
                .map(|m| c.message_tokens(Encoding::O200k, m))
                .collect()
        };
        assert_eq!(
            TokenCounter::new().messages_tokens(Encoding::O200k, &msgs),
            one_by_one
        );
    }
}
