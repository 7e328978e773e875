//! The model table: each model's context window, from the user's `[models]` config over the built-in table
//! (`config/models.toml`, embedded), matched by exact name or glob.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::long_context::{strip_1m, SUFFIX_1M};
use crate::config::ModelEntry;

/// Longest model name that is looked up; longer names match nothing (the default window, no entry). Bounds the
/// cost of matching a name against every pattern.
pub const MAX_MODEL_LEN: usize = 256;

/// The built-in table, in the same shape as the user's `[models."<pattern>"]` config.
const SHIPPED: &str = include_str!("../../config/models.toml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsFile {
    models: BTreeMap<String, ModelEntry>,
}

/// Exact names and glob patterns of one source (user or shipped), lowercased.
#[derive(Debug, Default)]
struct Layer {
    exact: HashMap<String, u64>,
    /// Sorted most specific first: most literal characters, then by pattern for a stable order.
    globs: Vec<(String, u64)>,
}

impl Layer {
    /// The entries of one source: those for 1M windows (named with a `[1m]` suffix, kept here without it) when
    /// `one_million`, the others otherwise.
    fn new(entries: &BTreeMap<String, ModelEntry>, one_million: bool) -> Layer {
        let mut layer = Layer::default();
        for (name, entry) in entries {
            let (name, long) = strip_1m(name);
            // An entry without a window (one that routes the model only) leaves it to the next that matches.
            let Some(window) = entry.context_window.filter(|_| long == one_million) else {
                continue;
            };
            let name = name.to_lowercase();
            if name.contains(['*', '?']) {
                layer.globs.push((name, window));
            } else {
                layer.exact.insert(name, window);
            }
        }
        sort_globs(&mut layer.globs);
        layer.globs.dedup_by(|a, b| a.0 == b.0);
        layer
    }

    fn exact(&self, names: &[&str]) -> Option<(&str, u64)> {
        names
            .iter()
            .find_map(|n| self.exact.get_key_value(*n).map(|(k, w)| (k.as_str(), *w)))
    }

    fn glob(&self, names: &[&str]) -> Option<(&str, u64)> {
        names.iter().find_map(|n| {
            self.globs
                .iter()
                .find(|(p, _)| glob_match(p, n))
                .map(|(p, w)| (p.as_str(), *w))
        })
    }

    fn keys(&self) -> impl Iterator<Item = &String> {
        self.exact.keys().chain(self.globs.iter().map(|(p, _)| p))
    }
}

/// Context windows by model name: user entries over the built-in table, with a default for unknown models. Entries
/// named with a `[1m]` suffix are the models' 1M windows (Anthropic's `context-1m` beta), see
/// [`ModelTable::context_window_with`].
#[derive(Debug)]
pub struct ModelTable {
    user: Layer,
    shipped: Layer,
    user_1m: Layer,
    shipped_1m: Layer,
    default_window: u64,
    /// What [`ModelTable::decide`] found per model name: a lookup tries every glob of the table, and a gateway
    /// sees a handful of names. Bounded: emptied when it holds [`MEMO_MAX`] names.
    memo: parking_lot::Mutex<Memo>,
}

/// What [`ModelTable::decide`] found, by model name and whether the 1M window was asked for.
type Memo = std::collections::HashMap<(Box<str>, bool), Option<(String, u64)>>;

/// Most model names remembered by a table's memo.
const MEMO_MAX: usize = 1024;

impl ModelTable {
    /// A table of the user's `[models]` entries over the built-in ones; `Err` only if the embedded table is broken.
    pub fn new(user: &BTreeMap<String, ModelEntry>, default_window: u64) -> Result<Self, String> {
        let shipped = Self::shipped()?;
        Ok(ModelTable {
            user: Layer::new(user, false),
            shipped: Layer::new(&shipped, false),
            user_1m: Layer::new(user, true),
            shipped_1m: Layer::new(&shipped, true),
            default_window,
            memo: parking_lot::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// The built-in table, parsed from the embedded `config/models.toml`.
    pub fn shipped() -> Result<BTreeMap<String, ModelEntry>, String> {
        toml::from_str::<ModelsFile>(SHIPPED)
            .map(|f| f.models)
            .map_err(|e| format!("built-in model table (config/models.toml): {e}"))
    }

    /// The context window of `model`: exact user entry, exact built-in entry, user globs, built-in globs (most
    /// specific first), else the default. Case-insensitive; a provider prefix (`openai/gpt-4o`) is also tried
    /// without the prefix. A name with a `[1m]` suffix asks for the 1M window, as in
    /// [`ModelTable::context_window_with`].
    pub fn context_window(&self, model: &str) -> u64 {
        self.context_window_with(model, false)
    }

    /// The context window of `model`, with its 1M window when `one_million` (the request's `context-1m` beta, see
    /// [`wants_1m`](super::long_context::wants_1m)) or a `[1m]` suffix on the name asks for it. The 1M window is
    /// that of the `[1m]` entries (`[models."claude-sonnet-4*[1m]"]`, user over built-in, in the order of
    /// [`ModelTable::context_window`]) matching the name without its suffix; a model without one keeps its
    /// ordinary window (the upstream does not widen it either).
    pub fn context_window_with(&self, model: &str, one_million: bool) -> u64 {
        self.decide(model, one_million)
            .map_or(self.default_window, |(_, w)| w)
    }

    /// The entry that decides `model`'s window and the window, in the order of [`ModelTable::context_window_with`]:
    /// the `[1m]` entries first when asked for, then the others. `None`: the default applies.
    fn decide(&self, model: &str, one_million: bool) -> Option<(String, u64)> {
        if model.len() > MAX_MODEL_LEN {
            return None;
        }
        let key = (Box::<str>::from(model), one_million);
        if let Some(found) = self.memo.lock().get(&key) {
            return found.clone();
        }
        let found = self.look_up(model, one_million);
        let mut memo = self.memo.lock();
        if memo.len() >= MEMO_MAX {
            memo.clear();
        }
        memo.insert(key, found.clone());
        found
    }

    /// [`ModelTable::decide`] without the memo.
    fn look_up(&self, model: &str, one_million: bool) -> Option<(String, u64)> {
        let (full, suffixed) = strip_1m(model);
        let full = full.to_lowercase();
        let names: &[&str] = &lookup_names(&full);
        let in_order = |user: &Layer, shipped: &Layer| {
            user.exact(names)
                .or_else(|| shipped.exact(names))
                .or_else(|| user.glob(names))
                .or_else(|| shipped.glob(names))
                .map(|(k, w)| (k.to_string(), w))
        };
        let long = (one_million || suffixed)
            .then(|| in_order(&self.user_1m, &self.shipped_1m))
            .flatten()
            .map(|(k, w)| (format!("{k}{SUFFIX_1M}"), w));
        long.or_else(|| in_order(&self.user, &self.shipped))
    }

    /// Every configured name and pattern (user and built-in, lowercased, sorted, deduplicated; 1M entries with
    /// their `[1m]` suffix): the allowlist for metric labels.
    pub fn known_models(&self) -> Vec<String> {
        let mut all: Vec<String> = [&self.user, &self.shipped]
            .iter()
            .flat_map(|l| l.keys().cloned())
            .chain(
                [&self.user_1m, &self.shipped_1m]
                    .iter()
                    .flat_map(|l| l.keys().map(|k| format!("{k}{SUFFIX_1M}"))),
            )
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The entry (exact name or pattern, lowercased) that decides `model`'s window, found in the order of
    /// [`ModelTable::context_window`]; `None` when the default applies. Always one of
    /// [`ModelTable::known_models`]: it is the model's metric label.
    pub fn matching_entry(&self, model: &str) -> Option<String> {
        self.matching_entry_with(model, false)
    }

    /// [`ModelTable::matching_entry`] for a request that may ask for the 1M window (as in
    /// [`ModelTable::context_window_with`]).
    pub fn matching_entry_with(&self, model: &str, one_million: bool) -> Option<String> {
        self.decide(model, one_million).map(|(k, _)| k)
    }
}

pub use crate::config::fallbacks::{glob_match, lookup_names, sort_globs};

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[(&str, u64)]) -> BTreeMap<String, ModelEntry> {
        list.iter()
            .map(|(n, w)| (n.to_string(), ModelEntry::window(*w)))
            .collect()
    }

    fn table(user: &[(&str, u64)]) -> ModelTable {
        ModelTable::new(&entries(user), 7777).unwrap()
    }

    #[test]
    fn embedded_table_parses_and_every_window_is_positive() {
        let shipped = ModelTable::shipped().unwrap();
        assert!(shipped.len() >= 20);
        for (name, e) in &shipped {
            // an entry sets a positive window, or only a price (its window is its family's)
            assert!(
                e.context_window.map_or(e.price.is_some(), |w| w > 0),
                "{name}"
            );
        }
    }

    #[test]
    fn well_known_models() {
        let t = table(&[]);
        let cases = [
            ("gpt-4o", 128000),
            ("gpt-4o-2024-08-06", 128000),
            ("gpt-4o-mini-2024-07-18", 128000),
            ("gpt-4.1-mini", 1047576),
            ("gpt-4", 8192),
            ("gpt-4-0613", 8192),
            ("gpt-4-turbo-2024-04-09", 128000),
            ("gpt-4-1106-preview", 128000),
            ("gpt-4-32k-0613", 32768),
            ("gpt-3.5-turbo", 16385),
            ("gpt-5-mini", 272000),
            ("gpt-5.1-chat-latest", 128000),
            ("o1", 200000),
            ("o1-mini", 128000),
            ("o3-mini", 200000),
            ("o4-mini-2025-04-16", 200000),
            ("claude-3-5-sonnet-20241022", 200000),
            ("claude-sonnet-4-5-20250929", 200000),
            ("claude-opus-4-1-20250805", 200000),
            ("claude-haiku-4-5-20251001", 200000),
            ("claude-sonnet-4-6", 200000),
            ("claude-2.0", 100000),
            ("claude-sonnet-5", 1000000),
            ("claude-opus-5-5", 1000000),
            ("gemini-2.5-pro", 1048576),
            ("llama-3.1-70b-instruct", 128000),
            ("llama3-70b-8192", 8192),
        ];
        for (model, window) in cases {
            assert_eq!(t.context_window(model), window, "{model}");
        }
    }

    #[test]
    fn exact_beats_glob_and_user_overrides_shipped() {
        let t = table(&[
            ("gpt-4o*", 64000),
            ("gpt-4o-special", 5000),
            ("my-model", 32000),
        ]);
        assert_eq!(t.context_window("gpt-4o-special"), 5000);
        assert_eq!(t.context_window("gpt-4o-2024-08-06"), 64000);
        // a user glob does not beat an exact built-in name
        let t = table(&[("gpt-4*", 1000)]);
        assert_eq!(t.context_window("gpt-4"), 8192);
        assert_eq!(t.context_window("gpt-4-turbo"), 1000);
        assert_eq!(
            table(&[("my-model", 32000)]).context_window("My-Model"),
            32000
        );
    }

    #[test]
    fn most_specific_glob_wins() {
        let t = table(&[("gpt-4o*", 100), ("gpt-4o-mini*", 200)]);
        assert_eq!(t.context_window("gpt-4o-mini-2024-07-18"), 200);
        assert_eq!(t.context_window("gpt-4o-2024-05-13"), 100);
    }

    #[test]
    fn unknown_model_gets_the_default_and_prefixes_are_stripped() {
        let t = table(&[]);
        assert_eq!(t.context_window("some-local-model"), 7777);
        assert_eq!(t.context_window("openai/GPT-4o"), 128000);
        assert_eq!(t.context_window("azure/gpt-4"), 8192);
        assert_eq!(
            t.context_window("openrouter/anthropic/claude-sonnet-4"),
            200000
        );
        // a user entry written with the prefix wins over the stripped name
        let t = table(&[("azure/gpt-4o", 9000)]);
        assert_eq!(t.context_window("Azure/gpt-4o"), 9000);
    }

    #[test]
    fn known_models_lists_user_and_shipped() {
        let known = table(&[("My-Model", 1)]).known_models();
        assert!(known.contains(&"my-model".to_string()));
        assert!(known.contains(&"gpt-4o*".to_string()));
        assert!(known.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn matching_entry_is_the_entry_that_decides_the_window() {
        let t = table(&[("gpt-4o*", 100), ("My-Model", 1)]);
        assert_eq!(
            t.matching_entry("gpt-4o-2024-05-13").as_deref(),
            Some("gpt-4o*")
        );
        assert_eq!(t.matching_entry("openai/GPT-4").as_deref(), Some("gpt-4"));
        assert_eq!(t.matching_entry("my-model").as_deref(), Some("my-model"));
        assert_eq!(t.matching_entry("some-local-model"), None);
        let known = t.known_models();
        for m in [
            "gpt-4o-mini",
            "claude-3-5-sonnet-20241022",
            "o3-mini",
            "gemini-2.5-pro",
        ] {
            let e = t.matching_entry(m).unwrap();
            assert!(known.contains(&e), "{m} -> {e}");
        }
    }

    #[test]
    fn names_longer_than_the_cap_match_nothing() {
        let t = table(&[("gpt-4o*", 100)]);
        let at_cap = format!("gpt-4o{}", "x".repeat(MAX_MODEL_LEN - 6));
        assert_eq!(t.context_window(&at_cap), 100);
        assert_eq!(t.matching_entry(&at_cap).as_deref(), Some("gpt-4o*"));
        for long in [
            format!("gpt-4o{}", "x".repeat(MAX_MODEL_LEN)),
            format!("gpt-4o{}", "x".repeat(30 << 20)),
        ] {
            assert_eq!(t.context_window(&long), 7777);
            assert_eq!(t.matching_entry(&long), None);
        }
    }

    #[test]
    fn glob_semantics() {
        assert!(glob_match("gpt-4o*", "gpt-4o"));
        assert!(glob_match("gpt-4?", "gpt-4o"));
        assert!(!glob_match("gpt-4?", "gpt-4"));
        assert!(glob_match("*-preview", "gpt-4-1106-preview"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("", "x"));
        // pathological input stays fast: no exponential backtracking
        let name = "a".repeat(10_000);
        assert!(!glob_match("*a*a*a*a*a*a*b", &name));
    }
}
