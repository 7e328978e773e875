//! Code-like strings — the paths, names and numbers an agent takes from a tool output — and a cleared result's
//! digest of them. One definition serves both the placeholders and fold lines (which name, most used first and
//! within `prune.digest_tokens`, what `recall_tool_call` would give back) and `replay`'s working-set measure (whose
//! *facts* are these strings). Pure and deterministic.
//!
//! A **code-like string** is a path (a run of letters, digits, `_ . / - ~` with a `/`, a segment with a letter,
//! and two segments or a leading `/` or `~`; not a markup closing tag), a dotted name (identifiers joined by `.`,
//! 6+ characters), a snake_case (with `_`) or CamelCase (an upper-case letter after the first character, and a
//! lower-case one) name of 6+ characters, or a number of 4+ digits (a run of digits not inside a word).

use std::collections::HashMap;

/// Characters a token of a digest is reckoned at (code-like strings tokenize at about this rate).
const CHARS_PER_TOKEN: usize = 4;
/// The shortest dotted, snake_case or CamelCase name that is a code-like string.
const MIN_NAME: usize = 6;
/// The fewest digits of a number that is a code-like string.
const MIN_DIGITS: usize = 4;
/// Longest string a digest names: a longer one (a hash, base64) names nothing the model would look for.
const MAX_LEN: usize = 120;

/// The distinctive strings of `text` (its code-like strings), most frequent first (first appearance breaks ties),
/// as many as fit in about `tokens` tokens (each string and its separator counted), none inside one already
/// named; empty when `tokens` is 0.
pub fn distinctive(text: &str, tokens: u64) -> Vec<&str> {
    let budget = usize::try_from(tokens)
        .unwrap_or(usize::MAX)
        .saturating_mul(CHARS_PER_TOKEN);
    if budget == 0 {
        return Vec::new();
    }
    // string → (count, first position)
    let mut seen: HashMap<&str, (usize, usize)> = HashMap::new();
    for (at, word) in code_strings(text) {
        if word.len() <= MAX_LEN {
            let e = seen.entry(word).or_insert((0, at));
            e.0 += 1;
            e.1 = e.1.min(at);
        }
    }
    let mut ranked: Vec<(&str, (usize, usize))> = seen.into_iter().collect();
    // most used, then first seen, then the longer (a path before the name it starts with), then by bytes
    ranked.sort_by(|a, b| {
        (b.1 .0.cmp(&a.1 .0))
            .then(a.1 .1.cmp(&b.1 .1))
            .then(b.0.len().cmp(&a.0.len()))
            .then(a.0.cmp(b.0))
    });
    let mut out = Vec::new();
    let mut used = 0;
    for (word, _) in ranked {
        // already named inside a string kept (`request.py` in `django/http/request.py`)
        if out.iter().any(|w: &&str| w.contains(word)) {
            continue;
        }
        let cost = word.chars().count() + 2;
        if used + cost > budget {
            continue;
        }
        used += cost;
        out.push(word);
    }
    out
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_path_byte(b: u8) -> bool {
    is_word(b) || matches!(b, b'.' | b'/' | b'-' | b'~')
}

/// The maximal runs of `text` whose bytes all satisfy `keep` (ASCII only, so every run is a `str` slice), with
/// their byte positions.
fn runs(text: &str, keep: fn(u8) -> bool) -> impl Iterator<Item = (usize, &str)> {
    // By bytes, not chars: `keep` holds for ASCII bytes only, so a multi-byte character's bytes end a run as the
    // character would, and every run starts and ends on a character boundary (no UTF-8 decoding per byte).
    let bytes = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < bytes.len() && !keep(bytes[i]) {
            i += 1;
        }
        if i == bytes.len() {
            return None;
        }
        let start = i;
        while i < bytes.len() && keep(bytes[i]) {
            i += 1;
        }
        text.get(start..i).map(|run| (start, run))
    })
}

fn is_path(s: &str) -> bool {
    let segments: Vec<&str> = s.split('/').filter(|p| !p.is_empty()).collect();
    s.contains('/')
        && segments
            .iter()
            .any(|p| p.bytes().any(|b| b.is_ascii_alphabetic()))
        && (segments.len() >= 2 || s.starts_with('/') || s.starts_with('~'))
}

fn is_ident(s: &str) -> bool {
    s.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
}

/// A snake_case or CamelCase name of 6+ characters (one identifier, no dots).
fn is_name(s: &str) -> bool {
    if s.len() < MIN_NAME || !is_ident(s) {
        return false;
    }
    let letters = s.bytes().any(|b| b.is_ascii_alphabetic());
    let snake = s.contains('_') && letters;
    let camel = s.bytes().any(|b| b.is_ascii_lowercase())
        && s.bytes().skip(1).any(|b| b.is_ascii_uppercase());
    snake || camel
}

/// The code-like strings of `text` with their byte positions, every occurrence: its paths first, then its dotted
/// names, each with the names and numbers among their parts.
pub fn code_strings(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let paths = runs(text, is_path_byte).filter_map(move |(at, run)| {
        // a markup closing tag (`</div>`) is no path
        if !run.contains('/') || text[..at].ends_with('<') {
            return None;
        }
        let lead = run.len() - run.trim_start_matches('-').len();
        let path = run[lead..].trim_end_matches(['.', '-']);
        is_path(path).then_some((at + lead, path))
    });
    let names = runs(text, |b| is_word(b) || b == b'.').flat_map(|(at, run)| {
        let lead = run.len() - run.trim_start_matches('.').len();
        let dotted = run.trim_matches('.');
        let start = at + lead;
        let whole = (dotted.contains('.')
            && dotted.len() >= MIN_NAME
            && dotted.split('.').all(|s| !s.is_empty())
            && is_ident(dotted))
        .then_some((start, dotted));
        let parts = dotted
            .split('.')
            .scan(start, |pos, s| {
                let here = *pos;
                *pos += s.len() + 1;
                Some((here, s))
            })
            .filter(|(_, s)| {
                let number = s.len() >= MIN_DIGITS && s.bytes().all(|b| b.is_ascii_digit());
                number || is_name(s)
            });
        whole.into_iter().chain(parts)
    });
    paths.chain(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte scan finds the runs the char split found, on ASCII, multi-byte and mixed text.
    #[test]
    fn runs_by_bytes_are_the_runs_of_the_char_split() {
        fn by_chars(text: &str, keep: fn(u8) -> bool) -> Vec<(usize, &str)> {
            text.split(move |c: char| !c.is_ascii() || !keep(c as u8))
                .filter(|r| !r.is_empty())
                .map(move |r| (r.as_ptr() as usize - text.as_ptr() as usize, r))
                .collect()
        }
        let texts = [
            "",
            "plain words and /usr/lib/x.so at 1088",
            "é/path/ünïcode_name — django/http/request.py:1096 ∞ TextEnum.B",
            "日本語のパス/src/main.rs と snake_case_name",
            "///..--~~__ \u{0} tail",
            "x",
            "é",
        ];
        for t in texts {
            for keep in [is_word as fn(u8) -> bool, is_path_byte] {
                assert_eq!(
                    runs(t, keep).collect::<Vec<_>>(),
                    by_chars(t, keep),
                    "{t:?}"
                );
            }
        }
        let mut runner = proptest::test_runner::TestRunner::default();
        runner
            .run(
                &"[a-z0-9_./~ -]{0,12}(\\PC{0,4}[a-zA-Z0-9_./~-]{0,8}){0,6}",
                |t| {
                    for keep in [is_word as fn(u8) -> bool, is_path_byte] {
                        proptest::prop_assert_eq!(
                            runs(&t, keep).collect::<Vec<_>>(),
                            by_chars(&t, keep)
                        );
                    }
                    Ok(())
                },
            )
            .unwrap();
    }

    #[test]
    fn paths_names_and_numbers_most_used_first() {
        let out = "Traceback:\n  File \"django/http/request.py\", line 1088, in get_host\n    raise \
                   ImproperlyConfigured(msg)\nImproperlyConfigured: bad host. See django/http/request.py:1096 \
                   and settings.ALLOWED_HOSTS; the word because is not a name, nor 42, nor Hello.";
        let d = distinctive(out, 64);
        assert_eq!(d[..2], ["django/http/request.py", "ImproperlyConfigured"]);
        for w in ["1088", "1096", "get_host", "settings.ALLOWED_HOSTS"] {
            assert!(d.contains(&w), "{w}: {d:?}");
        }
        // `request.py` and `ALLOWED_HOSTS` are named inside longer strings already
        for w in [
            "because",
            "42",
            "Hello",
            "Traceback",
            "line",
            "word",
            "request.py",
            "ALLOWED_HOSTS",
        ] {
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
                proptest::prop_assert!(code_strings(&text).any(|(at, s)| s == *w && text[at..].starts_with(s)), "{w:?}");
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
