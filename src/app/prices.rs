//! Model prices: what a turn cost and what its rewrite saved, in US dollars, from `[models."<pattern>"] price`
//! (the user's entries over the built-in table's list prices), looked up in the model table's order among the
//! entries that set a price. Built with each config snapshot; a lookup is memoised per model name for the
//! snapshot's life, so a turn pays a hash lookup and a few multiplications. Each model's prompt-cache lifetime
//! (`[models] cache_ttl`) is looked up the same way, in the same memo.

use crate::config::{ModelEntry, Price, DEFAULT_CACHE_TTL};
use crate::context::long_context::strip_1m;
use crate::context::models::{glob_match, lookup_names, sort_globs, ModelTable, MAX_MODEL_LEN};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A model's price in US dollars per token (not per million), every key resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub input: f64,
    pub cached_input: f64,
    pub cache_write: f64,
    pub output: f64,
}

impl Rates {
    /// `price` (per million tokens) per token: a key left out counts 0 (`input`, `output`) or the input price
    /// (`cached_input`, `cache_write`).
    pub fn of(price: &Price) -> Rates {
        let input = price.input.unwrap_or(0.0);
        Rates {
            input: input / 1e6,
            cached_input: price.cached_input.unwrap_or(input) / 1e6,
            cache_write: price.cache_write.unwrap_or(input) / 1e6,
            output: price.output.unwrap_or(0.0) / 1e6,
        }
    }
}

/// What the provider reported a turn used (every recall round's), as the pipeline read it from `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Billed {
    /// Prompt tokens in all: uncached, cache reads and cache writes.
    pub prompt: u64,
    /// Of `prompt`, read from the provider's prompt cache.
    pub cached: u64,
    /// Of `prompt`, written to the provider's prompt cache (Anthropic's `cache_creation_input_tokens`).
    pub cache_write: u64,
    /// Output tokens.
    pub output: u64,
}

/// A turn in dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Money {
    /// What was sent and answered cost: uncached input × input + cached × cached_input + cache writes ×
    /// cache_write + output × output.
    pub spent: f64,
    /// What the client's own request would have cost more: the prompt tokens the rewrite removed × the turn's
    /// input price per token (its input spend over its prompt tokens, so the provider's cached share applies).
    pub saved: f64,
}

impl Money {
    /// The money of a turn billed as `b`, whose rewrite removed `removed` prompt tokens, at `r`.
    pub fn of(r: &Rates, b: &Billed, removed: u64) -> Money {
        let cached = b.cached.min(b.prompt);
        let write = b.cache_write.min(b.prompt - cached);
        let uncached = b.prompt - cached - write;
        let input = uncached as f64 * r.input
            + cached as f64 * r.cached_input
            + write as f64 * r.cache_write;
        // Nothing reported: a removed token is priced as an uncached one.
        let per_token = if b.prompt == 0 {
            r.input
        } else {
            input / b.prompt as f64
        };
        Money {
            spent: input + b.output as f64 * r.output,
            saved: removed as f64 * per_token,
        }
    }
}

/// The entries of one source (user or built-in) that set one key (a price, a cache lifetime), lowercased.
#[derive(Debug)]
struct Layer<T> {
    exact: HashMap<String, T>,
    /// Most literal characters first, then by pattern.
    globs: Vec<(String, T)>,
}

impl<T: Copy> Layer<T> {
    fn new(
        entries: &BTreeMap<String, ModelEntry>,
        key: impl Fn(&ModelEntry) -> Option<T>,
    ) -> Layer<T> {
        let mut layer = Layer {
            exact: HashMap::new(),
            globs: Vec::new(),
        };
        for (name, entry) in entries {
            let Some(value) = key(entry) else { continue };
            let name = strip_1m(name).0.to_lowercase();
            if name.contains(['*', '?']) {
                layer.globs.push((name, value));
            } else {
                layer.exact.entry(name).or_insert(value);
            }
        }
        sort_globs(&mut layer.globs);
        layer.globs.dedup_by(|a, b| a.0 == b.0);
        layer
    }

    fn exact(&self, names: &[&str]) -> Option<T> {
        names.iter().find_map(|n| self.exact.get(*n).copied())
    }

    fn glob(&self, names: &[&str]) -> Option<T> {
        names.iter().find_map(|n| {
            self.globs
                .iter()
                .find(|(p, _)| glob_match(p, n))
                .map(|(_, r)| *r)
        })
    }
}

/// A user layer over a built-in one, looked up in the model table's order.
#[derive(Debug)]
struct Layers<T> {
    user: Layer<T>,
    shipped: Layer<T>,
}

impl<T: Copy> Layers<T> {
    fn get(&self, names: &[&str]) -> Option<T> {
        self.user
            .exact(names)
            .or_else(|| self.shipped.exact(names))
            .or_else(|| self.user.glob(names))
            .or_else(|| self.shipped.glob(names))
    }
}

/// What a model's lookup found.
#[derive(Debug, Clone, Copy)]
struct Found {
    rates: Option<Rates>,
    cache_ttl: Duration,
}

/// The prices (and prompt-cache lifetimes) of one config snapshot.
#[derive(Debug)]
pub struct Prices {
    rates: Layers<Rates>,
    ttls: Layers<Duration>,
    /// What a lookup found, by model name (emptied when it holds [`MEMO_MAX`] names).
    memo: Mutex<HashMap<Box<str>, Found>>,
}

/// Most model names a snapshot's memo remembers.
const MEMO_MAX: usize = 1024;

impl Prices {
    /// The user's `[models]` prices over the built-in table's; `Err` only if the embedded table is broken.
    pub fn new(user: &BTreeMap<String, ModelEntry>) -> Result<Prices, String> {
        let shipped = ModelTable::shipped()?;
        let price = |e: &ModelEntry| e.price.as_ref().map(Rates::of);
        let ttl = |e: &ModelEntry| e.cache_ttl.map(|t| t.duration());
        Ok(Prices {
            rates: Layers {
                user: Layer::new(user, price),
                shipped: Layer::new(&shipped, price),
            },
            ttls: Layers {
                user: Layer::new(user, ttl),
                shipped: Layer::new(&shipped, ttl),
            },
            memo: Mutex::new(HashMap::new()),
        })
    }

    /// The price of `model`, in the model table's order (exact user entry, exact built-in entry, user globs,
    /// built-in globs, most literal first) among the entries that set one; case-insensitive, a provider prefix
    /// also tried without it, a `[1m]` suffix ignored. `None`: not priced.
    pub fn rates(&self, model: &str) -> Option<Rates> {
        self.found(model).rates
    }

    /// How long the provider keeps `model`'s prompt cache (`[models] cache_ttl`, looked up as [`Prices::rates`]
    /// is; else 5 minutes).
    pub fn cache_ttl(&self, model: &str) -> Duration {
        self.found(model).cache_ttl
    }

    /// [`Prices::rates`] and [`Prices::cache_ttl`] in one lookup.
    pub fn rates_and_ttl(&self, model: &str) -> (Option<Rates>, Duration) {
        let f = self.found(model);
        (f.rates, f.cache_ttl)
    }

    fn found(&self, model: &str) -> Found {
        if model.len() > MAX_MODEL_LEN {
            return Found {
                rates: None,
                cache_ttl: DEFAULT_CACHE_TTL.duration(),
            };
        }
        if let Some(found) = self.memo.lock().get(model) {
            return *found;
        }
        let found = self.look_up(model);
        let mut memo = self.memo.lock();
        if memo.len() >= MEMO_MAX {
            memo.clear();
        }
        memo.insert(model.into(), found);
        found
    }

    /// [`Prices::found`] without the memo.
    fn look_up(&self, model: &str) -> Found {
        let full = strip_1m(model).0.to_lowercase();
        let names: &[&str] = &lookup_names(&full);
        Found {
            rates: self.rates.get(names),
            cache_ttl: self
                .ttls
                .get(names)
                .unwrap_or_else(|| DEFAULT_CACHE_TTL.duration()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn price(input: f64, cached: f64, write: f64, output: f64) -> Price {
        Price {
            input: Some(input),
            cached_input: Some(cached),
            cache_write: Some(write),
            output: Some(output),
        }
    }

    /// The example of docs/how-it-works.md ("Money"), computed by hand.
    #[test]
    fn a_turn_in_dollars_as_computed_by_hand() {
        let r = Rates::of(&price(2.5, 0.25, 3.125, 10.0));
        let b = Billed {
            prompt: 9_000,
            cached: 6_000,
            cache_write: 2_000,
            output: 500,
        };
        let m = Money::of(&r, &b, 3_000);
        // 1000 × 2.5 + 6000 × 0.25 + 2000 × 3.125 + 500 × 10 = 15 250 per million
        assert!((m.spent - 0.015_25).abs() < 1e-12, "{m:?}");
        // input 10 250 per million over 9000 tokens, × 3000 removed = 3416.67 per million
        assert!((m.saved - 0.010_25 / 3.0).abs() < 1e-12, "{m:?}");
    }

    #[test]
    fn keys_left_out_and_nothing_reported() {
        let r = Rates::of(&Price {
            input: Some(2.0),
            ..Price::default()
        });
        assert_eq!(r.cached_input, r.input);
        assert_eq!(r.cache_write, r.input);
        assert_eq!(r.output, 0.0);
        let m = Money::of(&r, &Billed::default(), 1_000_000);
        assert_eq!(
            m,
            Money {
                spent: 0.0,
                saved: 2.0
            }
        );
        // cached and written tokens beyond the prompt are not counted twice
        let b = Billed {
            prompt: 10,
            cached: 8,
            cache_write: 8,
            output: 0,
        };
        assert!((Money::of(&r, &b, 0).spent - 20.0 / 1e6).abs() < 1e-15);
    }

    #[test]
    fn user_prices_over_the_shipped_ones_in_the_tables_order() {
        let mut user = BTreeMap::new();
        user.insert(
            "gpt-4o".to_string(),
            ModelEntry {
                price: Some(price(1.0, 0.5, 1.0, 4.0)),
                ..ModelEntry::default()
            },
        );
        user.insert(
            "my-*".to_string(),
            ModelEntry {
                price: Some(price(3.0, 3.0, 3.0, 3.0)),
                cache_ttl: Some(crate::config::DurationSpec::from_secs(3600)),
                ..ModelEntry::default()
            },
        );
        let p = Prices::new(&user).unwrap();
        assert_eq!(p.rates("openai/GPT-4o").unwrap().input, 1.0 / 1e6);
        assert_eq!(p.rates("my-model").unwrap().output, 3.0 / 1e6);
        // shipped: the narrower price entry over its family's window entry
        assert_eq!(p.rates("gpt-4o-mini").unwrap().input, 0.15 / 1e6);
        assert_eq!(
            p.rates("claude-sonnet-4-5-20250929").unwrap().cache_write,
            3.75 / 1e6
        );
        assert_eq!(
            p.rates("claude-opus-4-1-20250805").unwrap().input,
            15.0 / 1e6
        );
        assert_eq!(
            p.rates("claude-opus-4-5-20251101").unwrap().input,
            5.0 / 1e6
        );
        assert!(p.rates("unknown-model").is_none());
        assert_eq!(p.cache_ttl("unknown-model"), Duration::from_secs(300));
        assert_eq!(p.cache_ttl("My-Model"), Duration::from_secs(3600));
        assert!(p.rates(&"x".repeat(MAX_MODEL_LEN + 1)).is_none());
    }
}
