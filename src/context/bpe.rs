//! A byte-pair encoding as a compact rank table, and the token count of one pre-tokenized piece (tiktoken's merge).
//!
//! tiktoken's `CoreBPE` keeps the encoder and the decoder as maps of separately allocated byte strings, a sorted
//! copy of every token, and 128 clones of its pre-tokenizer regex: ~37 MB for o200k_base. Counting needs only
//! the ranks: here every token's bytes live in one buffer and the map points into it (~8 MB for o200k_base,
//! ~4 MB for cl100k_base). The table is read out of tiktoken's own encoding once, which is then dropped, so
//! the ranks are tiktoken's; the merge below is tiktoken's `_byte_pair_merge`, so the counts are too.

use rustc_hash::FxHashMap;
use tiktoken_rs::CoreBPE;

/// Ranks above the highest token seen that are tried before the table is complete (the encodings' ranks have a
/// few gaps, around their special tokens).
const GAP: u32 = 4096;

/// Token bytes → rank, for the ordinary (non-special) tokens of one encoding.
pub struct Ranks {
    map: FxHashMap<&'static [u8], u32>,
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranks")
            .field("tokens", &self.map.len())
            .finish()
    }
}

impl Ranks {
    /// The ordinary tokens of `bpe` (its special tokens left out, as `encode_ordinary` leaves them out).
    ///
    /// The bytes are kept for the life of the process: the tables are built once per encoding.
    pub fn from_tiktoken(bpe: &CoreBPE) -> Ranks {
        let special: Vec<Vec<u8>> = bpe
            .special_tokens()
            .into_iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        // Every token's bytes one after the other, and (rank, start, length) of each.
        let mut arena = Vec::new();
        let mut spans: Vec<(u32, usize, usize)> = Vec::new();
        let (mut rank, mut last) = (0u32, 0u32);
        while rank <= last.saturating_add(GAP) {
            // `decode` fails for a rank that is not a token ("Invalid token for decoding: N", its `DecodeKeyError`
            // is not exported), and for a token that is not UTF-8 on its own; only the first is a gap (the bytes
            // of the second are read with the raw decoder). The vocabulary sizes are checked by a test.
            let known = match bpe.decode(vec![rank]) {
                Ok(_) => true,
                Err(e) => !e.to_string().starts_with("Invalid token"),
            };
            if known {
                let bytes = bpe
                    ._decode_native_and_split(vec![rank])
                    .next()
                    .unwrap_or_default();
                if !special.contains(&bytes) {
                    spans.push((rank, arena.len(), bytes.len()));
                    arena.extend_from_slice(&bytes);
                }
                last = rank;
            }
            rank += 1;
        }
        let arena: &'static [u8] = Box::leak(arena.into_boxed_slice());
        let mut map = FxHashMap::with_capacity_and_hasher(spans.len(), Default::default());
        for (r, start, len) in spans {
            map.insert(&arena[start..start + len], r);
        }
        Ranks { map }
    }

    /// Number of ordinary tokens.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the table is empty (never, for a real encoding).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Tokens of one piece the pre-tokenizer produced: exactly `encode_ordinary(piece).len()`.
    pub fn count(&self, piece: &[u8]) -> usize {
        if piece.len() <= 1 || self.map.contains_key(piece) {
            return piece.len().min(1);
        }
        self.merge(piece)
    }

    /// tiktoken's `_byte_pair_merge`: repeatedly merges the adjacent pair of parts with the lowest rank; returns
    /// the number of parts left.
    fn merge(&self, piece: &[u8]) -> usize {
        let rank_of = |bytes: &[u8]| self.map.get(bytes).copied().unwrap_or(u32::MAX);
        // (start, rank of the pair starting here)
        let mut parts: Vec<(usize, u32)> = Vec::with_capacity(piece.len() + 1);
        let mut min = (u32::MAX, usize::MAX);
        for i in 0..piece.len() - 1 {
            let r = rank_of(&piece[i..i + 2]);
            if r < min.0 {
                min = (r, i);
            }
            parts.push((i, r));
        }
        parts.push((piece.len() - 1, u32::MAX));
        parts.push((piece.len(), u32::MAX));
        // The rank of parts[i] merged with parts[i + 1] once parts[i + 1] is gone (hence + 3).
        let pair = |parts: &[(usize, u32)], i: usize| {
            if i + 3 < parts.len() {
                rank_of(&piece[parts[i].0..parts[i + 3].0])
            } else {
                u32::MAX
            }
        };
        while min.0 != u32::MAX {
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = pair(&parts, i - 1);
            }
            parts[i].1 = pair(&parts, i);
            parts.remove(i + 1);
            min = (u32::MAX, usize::MAX);
            for (i, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
                if r < min.0 {
                    min = (r, i);
                }
            }
        }
        parts.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_hold_every_ordinary_token() {
        let o200k = Ranks::from_tiktoken(tiktoken_rs::o200k_base_singleton());
        let cl100k = Ranks::from_tiktoken(tiktoken_rs::cl100k_base_singleton());
        // The published vocabularies: 199,998 and 100,256 ordinary tokens.
        assert_eq!(o200k.len(), 199_998);
        assert_eq!(cl100k.len(), 100_256);
        assert!(!o200k.map.contains_key(b"<|endoftext|>".as_slice()));
    }

    #[test]
    fn pieces_count_as_tiktoken_counts_them() {
        for bpe in [
            tiktoken_rs::o200k_base_singleton(),
            tiktoken_rs::cl100k_base_singleton(),
        ] {
            let ranks = Ranks::from_tiktoken(bpe);
            for piece in [
                "",
                "a",
                " hello",
                "antidisestablishmentarianism",
                "123",
                "  ",
                "\n\n",
                "...",
                " 日本語",
                "👍🏽",
                "ǅ",
                "\u{301}\u{301}\u{301}",
            ] {
                assert_eq!(
                    ranks.count(piece.as_bytes()),
                    bpe.encode_ordinary(piece).len(),
                    "{piece:?}"
                );
            }
        }
    }
}
