//! The cost model that picks how deep a re-cut goes. A provider bills the input of every turn, a cached prefix at
//! `context.cache_read_price` of the full price. A re-cut to `size` tokens that leaves the first `kept` tokens of
//! the previous request as they were pays `kept` cached and the rest in full; each later turn then adds the
//! session's growth per turn (paid in full) to a cached prefix, until the request passes the threshold again and
//! the next re-cut comes. Of the re-cuts the stages can make, the planner takes the one whose billed input per
//! turn, averaged over the turns until the next re-cut, is lowest: a deep re-cut misses the cache from early on but
//! leaves room for many cheap turns; a shallow one keeps most of the cache but comes back soon.

/// Turns the growth per turn is measured over (the newest ones).
pub const GROWTH_TURNS: usize = 16;

/// The billed input per turn (in tokens at the full price) of a re-cut to `size` tokens keeping the first `kept`
/// of the previous request, averaged over it and the turns until the request passes `threshold` again, with
/// `growth` new tokens per turn and cached input at `price`. Also returns how many turns come before the next
/// re-cut.
pub fn per_turn(size: u64, kept: u64, threshold: u64, growth: u64, price: f64) -> (f64, u64) {
    let g = growth.max(1) as f64;
    let (s, u) = (size as f64, kept.min(size) as f64);
    let n = threshold.saturating_sub(size) / growth.max(1);
    let nf = n as f64;
    let recut = price * u + (s - u);
    // turn k (1..=n) sends the request before it (cached) and the new growth (in full)
    let after = nf * (price * s + g) + price * g * nf * (nf - 1.0) / 2.0;
    ((recut + after) / (nf + 1.0), n)
}

/// Tokens a session adds per turn: the median, over its newest `GROWTH_TURNS` turns, of the tokens each turn added
/// (an assistant message and what follows it up to the next one), so that one huge file read does not make every
/// later turn look as large. `cum`: the running total of the messages' tokens (`cum[i]`: the first `i` messages);
/// `assistants`: indexes of the assistant messages, ascending; `upto`: messages seen.
pub fn growth(cum: &[u64], assistants: &[usize], upto: usize) -> u64 {
    let seen = assistants.partition_point(|&a| a < upto);
    if seen == 0 {
        return cum[upto].max(1);
    }
    let from = seen.saturating_sub(GROWTH_TURNS);
    let mut turns: Vec<u64> = (from..seen)
        .map(|t| {
            let end = assistants.get(t + 1).copied().unwrap_or(upto).min(upto);
            cum[end] - cum[assistants[t]]
        })
        .collect();
    turns.sort_unstable();
    turns[turns.len() / 2].max(1)
}

/// A re-cut the stages can make: its cuts' cost and where it first changes the previous request.
#[derive(Debug, Clone, Copy)]
pub struct Choice<C> {
    /// The cuts.
    pub cuts: C,
    /// Tokens of the request under them.
    pub size: u64,
    /// Tokens of the previous request's prefix it keeps as it was.
    pub kept: u64,
}

/// Of `options` (in the order the stages made them, each deeper than the one before), the index of the one with
/// the lowest billed input per turn (on a tie the deeper one), and that billed input.
pub fn cheapest<C>(
    options: &[Choice<C>],
    threshold: u64,
    growth: u64,
    price: f64,
) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (i, o) in options.iter().enumerate() {
        let (rate, _) = per_turn(o.size, o.kept, threshold, growth, price);
        if best.is_none_or(|(_, b)| rate <= b) {
            best = Some((i, rate));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deep_cut_wins_when_growth_is_small_and_a_shallow_one_when_it_keeps_the_cache() {
        // 12.8k threshold, 800 tokens a turn, cached at a tenth.
        let deep = per_turn(3_200, 1_500, 12_800, 800, 0.1);
        let target = per_turn(6_400, 1_500, 12_800, 800, 0.1);
        let shallow = per_turn(10_800, 10_000, 12_800, 800, 0.1);
        assert_eq!((deep.1, target.1, shallow.1), (12, 8, 2));
        assert!(
            deep.0 < shallow.0 && shallow.0 < target.0,
            "{deep:?} {target:?} {shallow:?}"
        );
        // At half price for cached input the shallow cut saves less and the target wins.
        let target = per_turn(6_400, 1_500, 12_800, 800, 0.5);
        let shallow = per_turn(10_800, 10_000, 12_800, 800, 0.5);
        assert!(target.0 < shallow.0, "{target:?} {shallow:?}");
        // Every turn costs at least its growth.
        assert!(deep.0 > 800.0);
    }

    #[test]
    fn the_cheapest_option_is_picked_and_ties_go_deeper() {
        let o = |size, kept| Choice {
            cuts: size,
            size,
            kept,
        };
        let options = [o(10_800, 10_000), o(6_400, 1_500), o(3_200, 1_500)];
        let at = |o: &[Choice<u64>]| cheapest(o, 12_800, 800, 0.1).map(|(i, _)| i);
        assert_eq!(at(&options), Some(2));
        assert_eq!(at(&options[..2]), Some(0));
        assert_eq!(at(&[o(5, 0), o(5, 0)]), Some(1));
        assert_eq!(cheapest::<u64>(&[], 1, 1, 0.1), None);
    }

    #[test]
    fn growth_is_the_median_turn_of_the_newest() {
        // 20 messages of 10 tokens, an assistant message every other one, then a big result.
        let mut tok = vec![10u64; 20];
        tok.push(5_000);
        let mut cum = vec![0];
        for t in &tok {
            cum.push(cum.last().unwrap() + t);
        }
        let assistants: Vec<usize> = (0..21).filter(|i| i % 2 == 1).collect();
        assert_eq!(growth(&cum, &assistants, 20), 20);
        // one huge result does not move the median
        assert_eq!(growth(&cum, &assistants, 21), 20);
        assert_eq!(growth(&cum, &[], 3), 30);
        // a turn in progress counts what it has so far
        assert_eq!(growth(&cum, &[0], 3), 30);
    }
}
