//! What a cleared tool result was about, in a few words: its distinctive strings (paths, dotted, snake_case and
//! CamelCase names of 6+ characters, numbers of 4+ digits), most used first, within a budget — so that a
//! placeholder tells the model what `recall_tool_call` would give back. Pure and deterministic: the same output
//! and budget give the same words.

use std::collections::HashMap;

/// Characters a token of a digest is reckoned at (code-like strings tokenize at about this rate).
const CHARS_PER_TOKEN: usize = 4;
/// Shortest name kept (a path or number has its own rule).
const MIN_NAME: usize = 6;
/// Shortest number kept.
const MIN_DIGITS: usize = 4;
/// Longest string kept: a longer one (a hash, base64) names nothing the model would look for.
const MAX_LEN: usize = 120;

/// The distinctive strings of `text`, most frequent first (first appearance breaks ties), as many as fit in
/// about `tokens` tokens (each string and its separator counted); empty when `tokens` is 0.
pub fn distinctive(text: &str, tokens: u64) -> Vec<&str> {
    let budget = usize::try_from(tokens)
        .unwrap_or(usize::MAX)
        .saturating_mul(CHARS_PER_TOKEN);
    if budget == 0 {
        return Vec::new();
    }
    // string → (count, first position)
    let mut seen: HashMap<&str, (usize, usize)> = HashMap::new();
    for (at, word) in words(text) {
        if is_distinctive(word) {
            seen.entry(word).or_insert((0, at)).0 += 1;
        }
    }
    let mut ranked: Vec<(&str, (usize, usize))> = seen.into_iter().collect();
    ranked.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.1 .1.cmp(&b.1 .1)));
    let mut out = Vec::new();
    let mut used = 0;
    for (word, _) in ranked {
        let cost = word.chars().count() + 2;
        if used + cost > budget {
            continue;
        }
        used += cost;
        out.push(word);
    }
    out
}

/// The words of `text` with their byte positions: runs of letters, digits and `_ . / - :`, with the punctuation a
/// sentence puts around them trimmed. A single `:` separates (`request.py:1096` is a path and a line number); a
/// double one joins (`Escape::new`).
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | ':')))
        .scan(0usize, move |pos, raw| {
            let start = *pos;
            // `split` on a `char` predicate: each separator is one character, of its own width
            let sep = text[start + raw.len()..]
                .chars()
                .next()
                .map_or(0, char::len_utf8);
            *pos += raw.len() + sep;
            Some((start, raw))
        })
        .flat_map(|(start, raw)| {
            let parts: Vec<(usize, &str)> = if raw.contains("::") {
                vec![(start, raw)]
            } else {
                raw.split(':')
                    .scan(start, |at, p| {
                        let here = *at;
                        *at += p.len() + 1;
                        Some((here, p))
                    })
                    .collect()
            };
            parts
        })
        .map(|(start, raw)| {
            let lead = raw.len() - raw.trim_start_matches(['.', '-', ':', '/']).len();
            let word = raw.trim_matches(['.', '-', ':', '/']);
            (start + lead, word)
        })
        .filter(|(_, w)| !w.is_empty() && w.len() <= MAX_LEN)
}

/// A path, a dotted, snake_case, CamelCase or `::`-qualified name of [`MIN_NAME`]+ characters, or a number of
/// [`MIN_DIGITS`]+ digits.
fn is_distinctive(w: &str) -> bool {
    if w.bytes().all(|b| b.is_ascii_digit()) {
        return w.len() >= MIN_DIGITS;
    }
    if !w.chars().any(char::is_alphabetic) || w.contains("://") {
        return false;
    }
    if w.contains('/') {
        // a path: at least one segment with a letter, and a file name or two segments
        return w.split('/').filter(|s| !s.is_empty()).count() >= 2 || w.contains('.');
    }
    if w.chars().count() < MIN_NAME {
        return false;
    }
    let dotted = w.contains('.') && w.split('.').all(|s| !s.is_empty());
    let snake = w.contains('_');
    let camel = w
        .chars()
        .zip(w.chars().skip(1))
        .any(|(a, b)| a.is_lowercase() && b.is_uppercase());
    let qualified = w.contains("::");
    dotted || snake || camel || qualified
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_names_and_numbers_most_used_first() {
        let out = "Traceback:\n  File \"django/http/request.py\", line 1088, in get_host\n    raise \
                   ImproperlyConfigured(msg)\nImproperlyConfigured: bad host. See django/http/request.py:1096 \
                   and settings.ALLOWED_HOSTS; Escape::new; the word because is not a name, nor 42, nor Hello.";
        let d = distinctive(out, 64);
        assert_eq!(d[..2], ["django/http/request.py", "ImproperlyConfigured"]);
        for w in [
            "1088",
            "1096",
            "get_host",
            "settings.ALLOWED_HOSTS",
            "Escape::new",
        ] {
            assert!(d.contains(&w), "{w}: {d:?}");
        }
        for w in ["because", "42", "Hello", "Traceback", "line", "word"] {
            assert!(!d.contains(&w), "{w}: {d:?}");
        }
    }

    #[test]
    fn the_budget_bounds_the_digest_and_zero_means_none() {
        let text = (0..200)
            .map(|i| format!("src/module_{i}/file_{i}.rs"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(distinctive(&text, 0).is_empty());
        for tokens in [1, 8, 16, 48] {
            let d = distinctive(&text, tokens);
            let chars: usize = d.iter().map(|w| w.chars().count() + 2).sum();
            assert!(
                chars <= tokens as usize * CHARS_PER_TOKEN,
                "{tokens}: {d:?}"
            );
        }
        assert!(!distinctive(&text, 16).is_empty());
    }

    #[test]
    fn the_same_output_gives_the_same_digest() {
        let text = "a_b_c_d x.y.zzzz a_b_c_d CamelCase 12345 x.y.zzzz q/w.e";
        let first = distinctive(text, 32);
        for _ in 0..10 {
            assert_eq!(distinctive(text, 32), first);
        }
        assert_eq!(first[..2], ["a_b_c_d", "x.y.zzzz"]);
    }

    proptest::proptest! {
        /// Any text, any budget: the digest is the same each time, within its budget, made of distinctive strings
        /// found in the text, none twice.
        #[test]
        fn the_digest_is_deterministic_bounded_and_taken_from_the_text(
            text in "([a-zA-Z_]{1,12}|[0-9]{1,6}|[./:_-]|[ \n\t,;()\"'=]|é|→){0,80}",
            tokens in 0u64..64,
        ) {
            let d = distinctive(&text, tokens);
            proptest::prop_assert_eq!(&d, &distinctive(&text, tokens));
            let chars: usize = d.iter().map(|w| w.chars().count() + 2).sum();
            proptest::prop_assert!(chars <= tokens as usize * CHARS_PER_TOKEN);
            for (k, w) in d.iter().enumerate() {
                proptest::prop_assert!(text.contains(w) && is_distinctive(w), "{w:?}");
                proptest::prop_assert!(!d[..k].contains(w), "{w:?} twice");
                proptest::prop_assert!(!w.chars().any(char::is_whitespace), "{w:?}");
            }
        }
    }

    #[test]
    fn urls_hashes_and_punctuation_alone_are_left_out() {
        let d = distinctive(
            "see https://example.com/a/b --- ... ::: a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6a3f9e1c2b4d6",
            64,
        );
        assert!(
            d.iter()
                .all(|w| !w.starts_with("https") && w.len() <= MAX_LEN),
            "{d:?}"
        );
    }
}
