//! `[models."<pattern>"] fallback`: the model a request that cannot fit its own model's window goes to under
//! `context.on_overflow = "fallback"` — which entry names a model's fallback, and the rules its chains keep.

use super::models::ModelEntry;
use std::collections::BTreeMap;

/// The built-in model table (the same file `context::models` embeds), for the windows the chains are checked with.
const SHIPPED: &str = include_str!("../../config/models.toml");

#[derive(serde::Deserialize)]
struct ShippedFile {
    models: BTreeMap<String, ModelEntry>,
}

/// Glob patterns in lookup order: the most literal characters first (the narrowest pattern wins), then by name.
/// Shared by every table keyed by model patterns (windows, prices, routes, fallbacks).
pub fn sort_globs<T>(globs: &mut [(String, T)]) {
    let literal = |p: &str| p.chars().filter(|c| !matches!(c, '*' | '?')).count();
    globs.sort_by(|a, b| {
        literal(&b.0)
            .cmp(&literal(&a.0))
            .then_with(|| a.0.cmp(&b.0))
    });
}

/// The names a lower-cased model name is looked up by, in order: as given, then without its provider prefix
/// (`openai/gpt-4o` → `gpt-4o`) when it has one.
pub fn lookup_names(full: &str) -> Vec<&str> {
    let bare = full.rsplit('/').next().unwrap_or_default();
    if bare.len() < full.len() {
        vec![full, bare]
    } else {
        vec![full]
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

/// The value `pick` finds for `model` among `entries`, looked up as the model table looks up windows: exact names
/// before patterns, the most literal pattern first; case-insensitive, a provider prefix (`openai/…`) also tried
/// without it.
fn look_up<'a, T>(
    entries: &'a BTreeMap<String, ModelEntry>,
    model: &str,
    pick: impl Fn(&'a ModelEntry) -> Option<T>,
) -> Option<T> {
    let full = model.to_lowercase();
    let names = lookup_names(&full);
    let exact = names.iter().find_map(|n| {
        entries
            .iter()
            .find(|(p, _)| !p.contains(['*', '?']) && p.to_lowercase() == *n)
            .and_then(|(_, e)| pick(e))
    });
    if exact.is_some() {
        return exact;
    }
    let mut globs: Vec<(String, &'a ModelEntry)> = entries
        .iter()
        .filter(|(p, _)| p.contains(['*', '?']))
        .map(|(p, e)| (p.to_lowercase(), e))
        .collect();
    sort_globs(&mut globs);
    names.iter().find_map(|n| {
        globs
            .iter()
            .filter(|(p, _)| glob_match(p, n))
            .find_map(|(_, e)| pick(e))
    })
}

/// The model `model`'s requests fall back to (`[models."<pattern>"] fallback` of the first entry matching it that
/// sets one), if any.
pub fn fallback_of<'a>(models: &'a BTreeMap<String, ModelEntry>, model: &str) -> Option<&'a str> {
    if models.values().all(|m| m.fallback.is_none()) {
        return None;
    }
    look_up(models, model, |e| e.fallback.as_deref())
}

/// The window of `model` in the user's entries over the built-in ones (`None`: not in the table).
fn window_of(
    user: &BTreeMap<String, ModelEntry>,
    shipped: &BTreeMap<String, ModelEntry>,
    model: &str,
) -> Option<u64> {
    let window = |e: &ModelEntry| e.context_window;
    let exact_only = |entries: &BTreeMap<String, ModelEntry>| {
        let exact: BTreeMap<String, ModelEntry> = entries
            .iter()
            .filter(|(p, _)| !p.contains(['*', '?']))
            .map(|(p, e)| (p.clone(), e.clone()))
            .collect();
        look_up(&exact, model, window)
    };
    exact_only(user)
        .or_else(|| exact_only(shipped))
        .or_else(|| look_up(user, model, window))
        .or_else(|| look_up(shipped, model, window))
}

/// The problems of the fallback chains, as `models."<pattern>".fallback: …` lines: a fallback must be a model of
/// the table with a window larger than its model's, and no chain may come back to a model it passed.
pub fn problems(models: &BTreeMap<String, ModelEntry>, e: &mut Vec<String>) {
    if models.values().all(|m| m.fallback.is_none()) {
        return;
    }
    let shipped = toml::from_str::<ShippedFile>(SHIPPED)
        .map(|f| f.models)
        .unwrap_or_default();
    for (pattern, m) in models {
        let Some(fallback) = m.fallback.as_deref() else {
            continue;
        };
        let key = format!("models.\"{pattern}\".fallback");
        if fallback.trim().is_empty() {
            e.push(format!("{key}: must name a model"));
            continue;
        }
        let Some(to) = window_of(models, &shipped, fallback) else {
            e.push(format!(
                "{key}: model {fallback:?} is not in the model table with a context window: give it a \
                 [models.\"{fallback}\"] context_window"
            ));
            continue;
        };
        // The window of the entry's own models: its own, else the table's for the pattern's name.
        let from = m
            .context_window
            .or_else(|| window_of(models, &shipped, pattern));
        if let Some(from) = from.filter(|w| to <= *w) {
            e.push(format!(
                "{key}: {fallback:?}'s window ({to} tokens) must be larger than {pattern:?}'s ({from} tokens)"
            ));
        }
        // Follow the chain: it must end.
        let mut seen = vec![pattern.to_lowercase()];
        let mut next = Some(fallback);
        while let Some(name) = next {
            if seen.iter().any(|s| *s == name.to_lowercase()) {
                let chain: Vec<&str> = seen.iter().map(String::as_str).collect();
                e.push(format!(
                    "{key}: the fallback chain {} → {name} comes back to a model it passed (a cycle)",
                    chain.join(" → ")
                ));
                break;
            }
            seen.push(name.to_lowercase());
            next = fallback_of(models, name);
        }
    }
}

/// Whether any `[models]` entry sets a fallback.
pub fn any(models: &BTreeMap<String, ModelEntry>) -> bool {
    models.values().any(|m| m.fallback.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(list: &[(&str, Option<u64>, Option<&str>)]) -> BTreeMap<String, ModelEntry> {
        list.iter()
            .map(|(p, w, f)| {
                (
                    p.to_string(),
                    ModelEntry {
                        context_window: *w,
                        fallback: f.map(str::to_string),
                        ..ModelEntry::default()
                    },
                )
            })
            .collect()
    }

    fn problems_of(models: &BTreeMap<String, ModelEntry>) -> Vec<String> {
        let mut e = Vec::new();
        problems(models, &mut e);
        e
    }

    #[test]
    fn the_most_specific_entry_names_the_fallback() {
        let m = table(&[
            ("small*", Some(1000), Some("big")),
            ("small-exact", Some(1000), Some("huge")),
            ("big", Some(4000), None),
            ("huge", Some(9000), None),
        ]);
        assert_eq!(fallback_of(&m, "small-1"), Some("big"));
        assert_eq!(fallback_of(&m, "Small-Exact"), Some("huge"));
        assert_eq!(fallback_of(&m, "openai/small-2"), Some("big"));
        assert_eq!(fallback_of(&m, "big"), None);
        assert!(problems_of(&m).is_empty(), "{:?}", problems_of(&m));
    }

    #[test]
    fn chains_are_checked() {
        let cycle = table(&[("a", Some(1000), Some("b")), ("b", Some(2000), Some("a"))]);
        let e = problems_of(&cycle);
        assert!(e.iter().any(|l| l.contains("cycle")), "{e:?}");
        let smaller = table(&[("a", Some(4000), Some("b")), ("b", Some(2000), None)]);
        let e = problems_of(&smaller);
        assert!(e.iter().any(|l| l.contains("must be larger")), "{e:?}");
        let unknown = table(&[("a", Some(4000), Some("no-such-model-anywhere"))]);
        let e = problems_of(&unknown);
        assert!(
            e.iter().any(|l| l.contains("not in the model table")),
            "{e:?}"
        );
        // A built-in model's window counts.
        let shipped = table(&[("tiny", Some(1000), Some("gpt-4o"))]);
        assert!(
            problems_of(&shipped).is_empty(),
            "{:?}",
            problems_of(&shipped)
        );
    }
}
