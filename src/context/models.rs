//! The model table: each model's context window, from the user's `[models]` config over the built-in table
//! (`config/models.toml`, embedded), matched by exact name or glob.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

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
    fn new(entries: &BTreeMap<String, ModelEntry>) -> Layer {
        let mut layer = Layer::default();
        for (name, entry) in entries {
            let name = name.trim().to_lowercase();
            if name.contains(['*', '?']) {
                layer.globs.push((name, entry.context_window));
            } else {
                layer.exact.insert(name, entry.context_window);
            }
        }
        let literal = |p: &str| p.chars().filter(|c| !matches!(c, '*' | '?')).count();
        layer.globs.sort_by(|a, b| {
            literal(&b.0)
                .cmp(&literal(&a.0))
                .then_with(|| a.0.cmp(&b.0))
        });
        layer.globs.dedup_by(|a, b| a.0 == b.0);
        layer
    }

    fn exact(&self, names: &[&str]) -> Option<u64> {
        names.iter().find_map(|n| self.exact.get(*n).copied())
    }

    fn glob(&self, names: &[&str]) -> Option<u64> {
        names.iter().find_map(|n| {
            self.globs
                .iter()
                .find(|(p, _)| glob_match(p, n))
                .map(|(_, w)| *w)
        })
    }
}

/// Context windows by model name: user entries over the built-in table, with a default for unknown models.
#[derive(Debug)]
pub struct ModelTable {
    user: Layer,
    shipped: Layer,
    default_window: u64,
}

impl ModelTable {
    /// A table of the user's `[models]` entries over the built-in ones; `Err` only if the embedded table is broken.
    pub fn new(user: &BTreeMap<String, ModelEntry>, default_window: u64) -> Result<Self, String> {
        Ok(ModelTable {
            user: Layer::new(user),
            shipped: Layer::new(&Self::shipped()?),
            default_window,
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
    /// without the prefix.
    pub fn context_window(&self, model: &str) -> u64 {
        if model.len() > MAX_MODEL_LEN {
            return self.default_window;
        }
        let full = model.trim().to_lowercase();
        let bare = full.rsplit('/').next().unwrap_or_default();
        let names: &[&str] = if bare.len() < full.len() {
            &[&full, bare]
        } else {
            &[&full]
        };
        self.user
            .exact(names)
            .or_else(|| self.shipped.exact(names))
            .or_else(|| self.user.glob(names))
            .or_else(|| self.shipped.glob(names))
            .unwrap_or(self.default_window)
    }

    /// Every configured name and pattern (user and built-in, lowercased, sorted, deduplicated): the allowlist for
    /// metric labels.
    pub fn known_models(&self) -> Vec<String> {
        let mut all: Vec<String> = [&self.user, &self.shipped]
            .iter()
            .flat_map(|l| l.exact.keys().chain(l.globs.iter().map(|(p, _)| p)))
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The entry (exact name or pattern, lowercased) that decides `model`'s window, found in the order of
    /// [`ModelTable::context_window`]; `None` when the default applies. Always one of
    /// [`ModelTable::known_models`]: it is the model's metric label.
    pub fn matching_entry(&self, model: &str) -> Option<String> {
        if model.len() > MAX_MODEL_LEN {
            return None;
        }
        let full = model.trim().to_lowercase();
        let bare = full.rsplit('/').next().unwrap_or_default();
        let names: &[&str] = if bare.len() < full.len() {
            &[&full, bare]
        } else {
            &[&full]
        };
        let exact = |l: &Layer| {
            names
                .iter()
                .find_map(|n| l.exact.get_key_value(*n).map(|(k, _)| k.clone()))
        };
        let glob = |l: &Layer| {
            names.iter().find_map(|n| {
                l.globs
                    .iter()
                    .find(|(p, _)| glob_match(p, n))
                    .map(|(p, _)| p.clone())
            })
        };
        exact(&self.user)
            .or_else(|| exact(&self.shipped))
            .or_else(|| glob(&self.user))
            .or_else(|| glob(&self.shipped))
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters and `?` exactly one. Iterative,
/// backtracking only to the last `*`: O(pattern × name) at worst, no recursion. Case-sensitive (callers lowercase).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None; // (pattern index after the last `*`, name index it resumes at)
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                pi += 1;
                star = Some((pi, ni));
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[(&str, u64)]) -> BTreeMap<String, ModelEntry> {
        list.iter()
            .map(|(n, w)| (n.to_string(), ModelEntry { context_window: *w }))
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
            assert!(e.context_window > 0, "{name}");
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
            ("gpt-5-mini", 400000),
            ("o1", 200000),
            ("o1-mini", 128000),
            ("o3-mini", 200000),
            ("o4-mini-2025-04-16", 200000),
            ("claude-3-5-sonnet-20241022", 200000),
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
