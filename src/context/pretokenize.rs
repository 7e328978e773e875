//! Fast exact token counting: the encodings' pre-tokenizer run on the `regex` crate's DFA instead of
//! tiktoken's backtracking `fancy-regex`, and each piece's token count cached per thread.
//!
//! tiktoken splits text with a pattern whose only non-regular part is `\s+(?!\S)` (a whitespace run, but not the
//! last space before a word, which starts the next piece). Without it the pattern is regular; the lookahead is
//! then applied by hand: a run of 2+ whitespace characters with no line break, followed by a non-space, gives
//! its last character to the next piece. Every piece is then counted with tiktoken's merge over its ranks
//! ([`super::bpe`]; a piece pre-tokenizes to itself, so the count is exactly tiktoken's), and remembered: most
//! pieces of a conversation (words, indentation, punctuation) recur, so few are merged. Where every byte the
//! pattern looks at is ASCII (most of what agents send), the match is found by hand ([`ascii_match`]), without
//! the regex. Measured on this project's 2-core VM before that: a 10 KB tool result in about a quarter of the
//! time `encode_ordinary` takes on the whole text; the ASCII path (with one regex cache per
//! text) takes ~60 % of the instructions off a new tool result's count.

use super::bpe::Ranks;
use parking_lot::Mutex;
use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input, Match};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::sync::OnceLock;

/// The o200k_base pattern without `\s+(?!\S)` (see the module doc).
const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"|\s*[\r\n]+",
    r"|\s+",
);

/// The cl100k_base pattern without `\s+(?!\S)`.
const CL100K: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+",
);

/// Pieces longer than this (base64, minified code) are counted in parts of at most this many bytes: tiktoken's
/// merge is quadratic in a piece's length.
pub const MAX_PIECE: usize = 256;

/// Pieces remembered per thread and encoding before the memory is cleared.
const CACHE_PIECES: usize = 100_000;

/// Which of the two encodings (index into the per-thread caches).
#[derive(Debug, Clone, Copy)]
pub enum Which {
    /// o200k_base.
    O200k = 0,
    /// cl100k_base.
    Cl100k = 1,
}

fn regex(which: Which) -> Option<&'static Regex> {
    static RE: [OnceLock<Option<Regex>>; 2] = [OnceLock::new(), OnceLock::new()];
    RE[which as usize]
        .get_or_init(|| {
            let pattern = match which {
                Which::O200k => O200K,
                Which::Cl100k => CL100K,
            };
            Regex::new(pattern)
                .inspect_err(
                    |e| tracing::error!(error = %e, "tokens: pre-tokenizer pattern rejected"),
                )
                .ok()
        })
        .as_ref()
}

thread_local! {
    static PIECES: RefCell<[FxHashMap<Box<str>, u32>; 2]> = RefCell::new(Default::default());
}

/// Forgets this thread's remembered pieces (for benchmarks measuring a first sight).
pub fn forget_pieces() {
    PIECES.with(|c| c.borrow_mut().iter_mut().for_each(FxHashMap::clear));
}

/// Tokens of `text` in `bpe` (the encoding `which`), exactly as tiktoken's `encode_ordinary(text).len()` for
/// pieces up to [`MAX_PIECE`] bytes.
pub fn count(which: Which, bpe: &Ranks, text: &str) -> u64 {
    let Some(re) = regex(which) else {
        // Never (the patterns are tested); without a pre-tokenizer, bounded parts merged as they are.
        return chunks(text).map(|c| bpe.count(c.as_bytes()) as u64).sum();
    };
    let mut search = Searches::take(which, re);
    let n = PIECES.with(|cache| {
        let mut cache = cache.borrow_mut();
        let cache = &mut cache[which as usize];
        if cache.len() > CACHE_PIECES {
            cache.clear();
        }
        pieces(which, text, |input| re.search_with(&mut search, input))
            .map(|p| piece(which, cache, bpe, p))
            .sum()
    });
    Searches::give(which, search);
    n
}

/// The regexes' search caches not in use. A search through the regex's own pool takes a lock on every thread
/// but the first that searched (the counting threads of a long history are new each time): one cache is taken
/// per text instead, for all of its pieces, and given back warm (the lazy DFA's states stay built).
struct Searches;

impl Searches {
    fn stack(which: Which) -> &'static Mutex<Vec<Cache>> {
        static FREE: [Mutex<Vec<Cache>>; 2] = [Mutex::new(Vec::new()), Mutex::new(Vec::new())];
        &FREE[which as usize]
    }

    fn take(which: Which, re: &Regex) -> Cache {
        let free = Self::stack(which).lock().pop();
        free.unwrap_or_else(|| re.create_cache())
    }

    fn give(which: Which, cache: Cache) {
        Self::stack(which).lock().push(cache);
    }
}

/// The pieces of `text`, in order, as tiktoken's pre-tokenizer cuts them (see the module doc); `find` is the
/// pattern's search.
fn pieces(
    which: Which,
    text: &str,
    mut find: impl FnMut(&Input<'_>) -> Option<Match>,
) -> impl Iterator<Item = &str> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        if pos >= text.len() {
            return None;
        }
        if let Some(end) = ascii_match(which, text.as_bytes(), pos) {
            let end = lookahead_end(text, pos, end);
            let piece = &text[pos..end];
            pos = end;
            return Some(piece);
        }
        // Anchored at `pos` first: the piece nearly always starts there, and an anchored search needs no reverse
        // scan to find where the match starts (the same match: leftmost-first from the leftmost start).
        let input = Input::new(text).range(pos..);
        let found = find(&input.clone().anchored(Anchored::Yes)).or_else(|| find(&input));
        let (start, end) = match found {
            // Every character starts some alternative, so a gap does not happen; it is a piece anyway.
            Some(m) if m.start() > pos => (pos, m.start()),
            Some(m) => (m.start(), lookahead_end(text, m.start(), m.end())),
            None => (pos, text.len()),
        };
        pos = end;
        Some(&text[start..end])
    })
}

/// Where the pattern's match anchored at `pos` ends (before the lookahead), found by hand when every byte the
/// pattern looks at is ASCII (most of what agents send: code, logs, English); `None` leaves it to the regex.
///
/// For ASCII the patterns reduce to: (cl100k only) a contraction; one optional prefix character (not a letter,
/// digit, `\r` or `\n`) and letters — for o200k an uppercase run then a lowercase run, or an uppercase run alone,
/// then an optional contraction; 1-3 digits; an optional space, punctuation (not whitespace, letter or digit) and
/// trailing line breaks (o200k: and `/`); whitespace up to its last line break; whitespace. The alternatives are
/// tried in that order, as the regex's leftmost-first match tries them. A byte past 0x7f anywhere the match
/// looks (a Unicode letter, digit or space may continue a run) gives up: the regex decides.
fn ascii_match(which: Which, b: &[u8], pos: usize) -> Option<usize> {
    // `Some(None)`: the end of the text; `None`: not ASCII.
    let peek = |i: usize| match b.get(i) {
        None => Some(None),
        Some(&c) if c.is_ascii() => Some(Some(c)),
        Some(_) => None,
    };
    let o200k = matches!(which, Which::O200k);
    let c0 = peek(pos)??;
    if !o200k && c0 == b'\'' {
        if let Some(end) = contraction(b, pos)? {
            return Some(end);
        }
    }
    // An optional prefix, then letters.
    let prefix = !c0.is_ascii_alphanumeric() && c0 != b'\r' && c0 != b'\n';
    if prefix || c0.is_ascii_alphabetic() {
        let start = pos + usize::from(prefix);
        if o200k {
            let upper = ascii_run(b, start, |c| c.is_ascii_uppercase())?;
            let lower = ascii_run(b, upper, |c| c.is_ascii_lowercase())?;
            if lower > start {
                return Some(contraction(b, lower)?.unwrap_or(lower));
            }
        } else {
            let end = ascii_run(b, start, |c| c.is_ascii_alphabetic())?;
            if end > start {
                return Some(end);
            }
        }
        // A prefix without letters after it: the letter alternatives fail.
    }
    if c0.is_ascii_digit() {
        let mut i = pos;
        while i < pos + 3 && peek(i)?.is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
        }
        return Some(i);
    }
    let p = pos + usize::from(c0 == b' ');
    let end = ascii_run(b, p, |c| !ascii_space(c) && !c.is_ascii_alphanumeric())?;
    if end > p {
        return if o200k {
            ascii_run(b, end, |c| c == b'\r' || c == b'\n' || c == b'/')
        } else {
            ascii_run(b, end, |c| c == b'\r' || c == b'\n')
        };
    }
    // Whitespace: up to its last line break, else all of it.
    let end = ascii_run(b, pos, ascii_space)?;
    Some(
        b[pos..end]
            .iter()
            .rposition(|&c| c == b'\r' || c == b'\n')
            .map_or(end, |k| pos + k + 1),
    )
}

/// The ASCII characters `\s` and `char::is_whitespace` take for whitespace: space, `\t \n \x0b \x0c \r`.
fn ascii_space(c: u8) -> bool {
    c == b' ' || (b'\t'..=b'\r').contains(&c)
}

/// The end of the run of `class` bytes from `i`; `None` when it stops at a byte that is not ASCII.
fn ascii_run(b: &[u8], mut i: usize, class: impl Fn(u8) -> bool) -> Option<usize> {
    while let Some(&c) = b.get(i) {
        if !c.is_ascii() {
            return None;
        }
        if !class(c) {
            break;
        }
        i += 1;
    }
    Some(i)
}

/// The end of a contraction (`'s 't 're 've 'm 'll 'd`, any case) starting at `i`: `Some(None)` when there is
/// none, `None` when a byte it looks at is not ASCII (`(?i)` also folds `ſ` to `s`).
fn contraction(b: &[u8], i: usize) -> Option<Option<usize>> {
    if b.get(i) != Some(&b'\'') {
        return Some(None);
    }
    let lower = |k: usize| match b.get(k) {
        None => Some(None),
        Some(&c) if c.is_ascii() => Some(Some(c.to_ascii_lowercase())),
        Some(_) => None,
    };
    Some(match lower(i + 1)? {
        Some(b's' | b't' | b'm' | b'd') => Some(i + 2),
        Some(c @ (b'r' | b'v' | b'l')) => {
            let second = if c == b'l' { b'l' } else { b'e' };
            (lower(i + 2)? == Some(second)).then_some(i + 3)
        }
        _ => None,
    })
}

/// Where the piece `start..end` really ends: `\s+(?!\S)` leaves the last whitespace character of a run of two
/// or more, without a line break, to the non-space that follows it.
fn lookahead_end(text: &str, start: usize, end: usize) -> usize {
    let piece = &text[start..end];
    let bytes = piece.as_bytes();
    let not_space = |b: Option<&u8>| b.is_some_and(|&b| b.is_ascii() && !ascii_space(b));
    if not_space(bytes.first()) || not_space(bytes.last()) {
        // Not a whitespace run.
        return end;
    }
    let mut chars = piece.chars();
    let Some(last) = chars.next_back() else {
        return end;
    };
    let followed_by_non_space = text[end..]
        .chars()
        .next()
        .is_some_and(|c| !c.is_whitespace());
    if followed_by_non_space
        && last != '\n'
        && last != '\r'
        && chars.as_str().chars().next().is_some()
        && piece.chars().all(char::is_whitespace)
    {
        end - last.len_utf8()
    } else {
        end
    }
}

fn piece(which: Which, cache: &mut FxHashMap<Box<str>, u32>, bpe: &Ranks, p: &str) -> u64 {
    if p.len() > MAX_PIECE {
        return long_piece(which, bpe, p);
    }
    if let Some(n) = cache.get(p) {
        return u64::from(*n);
    }
    let n = bpe.count(p.as_bytes());
    cache.insert(p.into(), u32::try_from(n).unwrap_or(u32::MAX));
    n as u64
}

/// A long piece, counted in parts of at most [`MAX_PIECE`] bytes cut at character boundaries, each part as
/// tiktoken counts it on its own (pre-tokenized again: a cut can end a piece early).
fn long_piece(which: Which, bpe: &Ranks, p: &str) -> u64 {
    chunks(p).map(|head| split_count(which, bpe, head)).sum()
}

/// `text` in parts of at most [`MAX_PIECE`] bytes, cut at character boundaries.
fn chunks(mut text: &str) -> impl Iterator<Item = &str> {
    std::iter::from_fn(move || {
        if text.is_empty() {
            return None;
        }
        let mut cut = text.len().min(MAX_PIECE);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, rest) = text.split_at(cut);
        text = rest;
        Some(head)
    })
}

/// A part of at most [`MAX_PIECE`] bytes pre-tokenized and merged piece by piece, without the cache.
fn split_count(which: Which, bpe: &Ranks, text: &str) -> u64 {
    match regex(which) {
        Some(re) => pieces(which, text, |input| re.search(input))
            .map(|p| bpe.count(p.as_bytes()) as u64)
            .sum(),
        None => bpe.count(text.as_bytes()) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn both() -> [(Which, &'static Ranks, &'static tiktoken_rs::CoreBPE); 2] {
        static RANKS: std::sync::OnceLock<[Ranks; 2]> = std::sync::OnceLock::new();
        let [o, c] = RANKS.get_or_init(|| {
            [
                Ranks::from_tiktoken(tiktoken_rs::o200k_base_singleton()),
                Ranks::from_tiktoken(tiktoken_rs::cl100k_base_singleton()),
            ]
        });
        [
            (Which::O200k, o, tiktoken_rs::o200k_base_singleton()),
            (Which::Cl100k, c, tiktoken_rs::cl100k_base_singleton()),
        ]
    }

    #[test]
    fn equals_tiktoken_on_tricky_text() {
        let cases = [
            "",
            " ",
            "  ",
            "a  b",
            "a   b\n\n  c",
            "x \t\ty",
            "  \n  x",
            "end   ",
            "He's GOING to say 'LL we'd\r\n\r\n",
            "fn main() {\n    let x = 1_000_000; // 12345\n}\n",
            "https://example.com/a/b?c=d&e=f#g",
            "naïve café Ωmega ÆØÅ straße İstanbul",
            "日本語のテキスト、中文文本。한국어",
            "emoji 👍🏽 and ZWJ 👨‍👩‍👧 flags 🇫🇷",
            "\u{a0}\u{a0}x\u{3000}\u{3000}y\u{2028}z",
            "combining e\u{301}\u{301} marks",
            "tabs\t\t\tand\u{b}vertical\u{c}feeds",
            "1234567890 12.5e-3 0x7f3a",
            "    indented\n        more\n\t\tx",
        ];
        for (which, ranks, bpe) in both() {
            for text in cases {
                assert_eq!(
                    count(which, ranks, text),
                    bpe.encode_ordinary(text).len() as u64,
                    "{which:?} {text:?}"
                );
            }
        }
    }

    fn tricky_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => prop::sample::select(vec![' ', ' ', '\n', '\t', '\r', 'a', 'B', 'z', 'Q', '1', '9', '\'', 's',
                't', 'l', 'd', '.', ',', '/', '-', '_', '(', ')', '{', '}', '"', '#']),
            1 => prop::sample::select(vec!['\u{a0}', '\u{3000}', '\u{2028}', '\u{b}', '\u{c}', '\u{85}',
                'é', 'Ω', 'ß', 'İ', '日', '本', '한', '👍', '\u{301}', '\u{200d}', 'Ǆ', 'ǅ', 'ʰ', '٣', 'Ⅻ']),
            1 => any::<char>(),
        ]
    }

    /// The hand-made ASCII match is the regex's anchored match wherever it answers.
    fn ascii_agrees(text: &str) -> Result<(), TestCaseError> {
        for which in [Which::O200k, Which::Cl100k] {
            let re = regex(which).unwrap();
            for pos in (0..text.len()).filter(|&p| text.is_char_boundary(p)) {
                if let Some(end) = ascii_match(which, text.as_bytes(), pos) {
                    let input = Input::new(text).range(pos..).anchored(Anchored::Yes);
                    let m = re.find(input).map(|m| m.end());
                    prop_assert_eq!(Some(end), m, "{:?} at {} of {:?}", which, pos, text);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn ascii_matches_on_tricky_text() {
        let cases = [
            "He's GOING to say 'LL we'd\r\n\r\n 'Re 'sup 'x ''s",
            "  \n  x  y\t\tz \x0b\x0c w \r\n\n  ",
            "fn main() {\n    let x = 1_000_000; // 12345\n}\n",
            "https://example.com/a/b?c=d&e=f#g ./x //\n/ \x01\x7f(ABC)dEF gHIj",
            "caf\u{e9} na\u{ef}ve 'ſ a\u{a0}b 12\u{663} ABC\u{301}d",
        ];
        for text in cases {
            ascii_agrees(text).unwrap();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn ascii_matches_are_the_regex_matches(chars in prop::collection::vec(tricky_char(), 0..60)) {
            let text: String = chars.into_iter().collect();
            ascii_agrees(&text)?;
        }

        #[test]
        fn equals_tiktoken_on_random_text(chars in prop::collection::vec(tricky_char(), 0..120)) {
            let text: String = chars.into_iter().collect();
            for (which, ranks, bpe) in both() {
                prop_assert_eq!(count(which, ranks, &text), bpe.encode_ordinary(&text).len() as u64, "{:?}", which);
            }
        }
    }

    #[test]
    fn long_pieces_count_as_tiktoken_counts_their_parts() {
        // Each text is one piece of the pre-tokenizer.
        let texts = [
            "A".repeat(100_000),
            "ab".repeat(5_000),
            "/".repeat(1_000),
            "é".repeat(700),
        ];
        for (which, ranks, bpe) in both() {
            for text in &texts {
                let n = count(which, ranks, text);
                let parts: u64 = chunks(text)
                    .map(|c| bpe.encode_ordinary(c).len() as u64)
                    .sum();
                assert_eq!(n, parts, "{which:?} {}", &text[..8]);
                assert!(n > 2 && n < text.len() as u64);
            }
        }
    }
}
