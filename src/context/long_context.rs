//! Anthropic's 1M-token window: asked for per request with the `context-1m` beta (`anthropic-beta:
//! context-1m-2025-08-07`) or a `[1m]` suffix on the model name (Claude Code's `--model sonnet[1m]`), and found in
//! the model table under the model's name with that suffix (`[models."claude-sonnet-4*[1m]"]`).

use http::HeaderMap;

/// The suffix that asks for a model's 1M window, and that marks its entry in the model table.
pub const SUFFIX_1M: &str = "[1m]";

/// The header listing a request's betas (comma-separated, possibly over several lines).
pub const BETA_HEADER: &str = "anthropic-beta";

/// The prefix of the 1M-context betas (`context-1m-2025-08-07`).
pub const BETA_1M_PREFIX: &str = "context-1m";

/// Whether the request's `anthropic-beta` header asks for the 1M window: any of its comma-separated values starts
/// with `context-1m`. (A `[1m]` model suffix asks too; [`ModelTable::context_window_with`] reads it from the name.)
///
/// [`ModelTable::context_window_with`]: super::models::ModelTable::context_window_with
pub fn wants_1m(headers: &HeaderMap) -> bool {
    headers
        .get_all(BETA_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|beta| {
            beta.trim()
                .get(..BETA_1M_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(BETA_1M_PREFIX))
        })
}

/// `model` without a trailing `[1m]` (any case, surrounding blanks ignored), and whether it had one.
pub fn strip_1m(model: &str) -> (&str, bool) {
    let m = model.trim();
    let cut = m.len().checked_sub(SUFFIX_1M.len());
    match cut.and_then(|at| m.get(at..).map(|s| (at, s))) {
        Some((at, s)) if s.eq_ignore_ascii_case(SUFFIX_1M) => (m[..at].trim_end(), true),
        _ => (m, false),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::ModelEntry;
    use crate::context::models::{ModelTable, MAX_MODEL_LEN};
    use std::collections::BTreeMap;

    fn table(user: &[(&str, u64)]) -> ModelTable {
        let user: BTreeMap<String, ModelEntry> = user
            .iter()
            .map(|(n, w)| (n.to_string(), ModelEntry::window(*w)))
            .collect();
        ModelTable::new(&user, 7777).unwrap()
    }

    fn betas(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(BETA_HEADER, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_beta_header_asks_for_1m() {
        assert!(wants_1m(&betas(&["context-1m-2025-08-07"])));
        assert!(wants_1m(&betas(&[
            "claude-code-20250219, context-1m-2025-08-07,interleaved-thinking-2025-05-14"
        ])));
        assert!(wants_1m(&betas(&[
            "claude-code-20250219",
            " Context-1M-2026-01-01 "
        ])));
        for no in [
            &[][..],
            &["claude-code-20250219, interleaved-thinking-2025-05-14, context-management-2025-06-27"],
            &["x-context-1m-2025-08-07"],
            &["context-1"],
            &[""],
        ] {
            assert!(!wants_1m(&betas(no)), "{no:?}");
        }
        let mut other = HeaderMap::new();
        other.insert("anthropic-version", "context-1m".parse().unwrap());
        assert!(!wants_1m(&other));
    }

    #[test]
    fn the_suffix_is_stripped_in_any_case() {
        assert_eq!(
            strip_1m("claude-sonnet-4-5[1m]"),
            ("claude-sonnet-4-5", true)
        );
        assert_eq!(
            strip_1m(" claude-sonnet-4-5[1M] "),
            ("claude-sonnet-4-5", true)
        );
        assert_eq!(strip_1m("claude-sonnet-4-5"), ("claude-sonnet-4-5", false));
        assert_eq!(strip_1m("[1m]"), ("", true));
        assert_eq!(strip_1m("1m]"), ("1m]", false));
        assert_eq!(strip_1m("é[1m"), ("é[1m", false));
    }

    #[test]
    fn shipped_1m_windows() {
        let t = table(&[]);
        for (model, plain, long) in [
            ("claude-sonnet-4-5-20250929", 200_000, 1_000_000),
            ("claude-sonnet-4-20250514", 200_000, 1_000_000),
            ("claude-sonnet-4-6", 200_000, 1_000_000),
            ("claude-opus-4-6", 200_000, 1_000_000),
            ("anthropic/claude-sonnet-4-5", 200_000, 1_000_000),
            // no 1M variant: the beta does not widen the window
            ("claude-opus-4-1-20250805", 200_000, 200_000),
            ("claude-opus-4-20250514", 200_000, 200_000),
            ("claude-haiku-4-5-20251001", 200_000, 200_000),
            ("claude-3-7-sonnet-20250219", 200_000, 200_000),
            ("gpt-4o", 128_000, 128_000),
            ("some-local-model", 7777, 7777),
        ] {
            assert_eq!(t.context_window_with(model, false), plain, "{model}");
            assert_eq!(t.context_window(model), plain, "{model}");
            assert_eq!(
                t.context_window_with(model, true),
                long,
                "{model} with the beta"
            );
            let suffixed = format!("{model}[1m]");
            assert_eq!(t.context_window_with(&suffixed, false), long, "{suffixed}");
            assert_eq!(t.context_window_with(&suffixed, true), long, "{suffixed}");
        }
    }

    #[test]
    fn user_entries_decide_1m_windows_too() {
        let t = table(&[
            ("my-claude[1m]", 500_000),
            ("my-claude", 100_000),
            ("claude-opus-4-1*[1m]", 900_000),
        ]);
        assert_eq!(t.context_window_with("my-claude", false), 100_000);
        assert_eq!(t.context_window_with("my-claude", true), 500_000);
        assert_eq!(t.context_window_with("My-Claude[1M]", false), 500_000);
        assert_eq!(
            t.context_window_with("claude-opus-4-1-20250805", true),
            900_000
        );
        // a user entry for the plain name is not a 1M entry
        let t = table(&[("claude-sonnet-4-5*", 150_000)]);
        assert_eq!(t.context_window_with("claude-sonnet-4-5", false), 150_000);
        assert_eq!(t.context_window_with("claude-sonnet-4-5", true), 1_000_000);
        // a catch-all glob never makes a model 1M
        let t = table(&[("*", 50_000)]);
        assert_eq!(t.context_window_with("unknown-model", true), 50_000);
    }

    #[test]
    fn names_over_the_cap_match_nothing_even_for_1m() {
        let t = table(&[]);
        let at_cap = format!("claude-sonnet-4{}[1m]", "x".repeat(MAX_MODEL_LEN - 19));
        assert_eq!(at_cap.len(), MAX_MODEL_LEN);
        assert_eq!(t.context_window_with(&at_cap, false), 1_000_000);
        assert_eq!(
            t.matching_entry(&at_cap).as_deref(),
            Some("claude-sonnet-4*[1m]")
        );
        let over = format!("claude-sonnet-4{}", "x".repeat(MAX_MODEL_LEN));
        assert_eq!(t.context_window_with(&over, true), 7777);
        assert_eq!(t.matching_entry_with(&over, true), None);
    }

    #[test]
    fn the_1m_entry_is_the_metric_label_and_a_known_model() {
        let t = table(&[("my-claude[1m]", 500_000)]);
        let known = t.known_models();
        for (model, one_million, label) in [
            ("claude-sonnet-4-5-20250929", true, "claude-sonnet-4*[1m]"),
            ("claude-sonnet-4-5-20250929", false, "claude-sonnet-4*"),
            ("claude-sonnet-4-5[1m]", false, "claude-sonnet-4*[1m]"),
            ("claude-opus-4-1-20250805", true, "claude-opus-4*"),
            ("my-claude", true, "my-claude[1m]"),
            ("claude-haiku-4-5-20251001", false, "claude-haiku-4*"),
            ("claude-opus-5-5", false, "claude-opus-5*"),
        ] {
            let e = t.matching_entry_with(model, one_million).unwrap();
            assert_eq!(e, label, "{model} {one_million}");
            assert!(known.contains(&e), "{e}");
        }
        assert!(!known.contains(&"my-claude".to_string()));
    }
}
