//! The cost model that picks how deep a re-cut goes. A provider bills the input of every turn, a cached prefix at
//! `context.cache_read_price` of the full price. A re-cut to `size` tokens that leaves the first `kept` tokens of
//! the previous request as they were pays `kept` cached and the rest in full; each later turn then adds the
//! session's growth per turn (paid in full) to a cached prefix, until the request passes the threshold again and
//! the next re-cut comes. Of the re-cuts the stages can make, the planner takes the one whose billed input per
//! turn, averaged over the turns until the next re-cut, is lowest: a deep re-cut misses the cache from early on but
//! leaves room for many cheap turns; a shallow one keeps most of the cache but comes back soon.

/// Turns the growth per turn is measured over (the newest ones).
pub const GROWTH_TURNS: usize = 16;

/// The newest turns whose uses of tool results a re-cut prices: a result they used that the re-cut hides is
/// expected to be recalled.
pub const RECENT_TURNS: usize = 4;

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
    /// What the recall rounds it is expected to cause cost (tokens at the full price): one for each result it
    /// hides that the newest turns used.
    pub recall: f64,
}

/// Of `options` (in the order the stages made them, each deeper than the one before), the index of the one with
/// the lowest billed input per turn, its expected recalls included (on a tie the deeper one), and its billed
/// input per turn without them (what a replay without recalls will see).
pub fn cheapest<C>(
    options: &[Choice<C>],
    threshold: u64,
    growth: u64,
    price: f64,
) -> Option<(usize, f64)> {
    // (index, billed input with the expected recalls, billed input alone)
    let mut best: Option<(usize, f64, f64)> = None;
    for (i, o) in options.iter().enumerate() {
        let (rate, n) = per_turn(o.size, o.kept, threshold, growth, price);
        // the recalls come once, over the turns until the next re-cut
        let priced = rate + o.recall / (n as f64 + 1.0);
        if best.is_none_or(|(_, b, _)| priced <= b) {
            best = Some((i, priced, rate));
        }
    }
    best.map(|(i, _, rate)| (i, rate))
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
            recall: 0.0,
        };
        let options = [o(10_800, 10_000), o(6_400, 1_500), o(3_200, 1_500)];
        let at = |o: &[Choice<u64>]| cheapest(o, 12_800, 800, 0.1).map(|(i, _)| i);
        assert_eq!(at(&options), Some(2));
        assert_eq!(at(&options[..2]), Some(0));
        assert_eq!(at(&[o(5, 0), o(5, 0)]), Some(1));
        assert_eq!(cheapest::<u64>(&[], 1, 1, 0.1), None);
    }

    #[test]
    fn a_re_cut_that_hides_what_the_newest_turns_used_pays_for_its_recall() {
        // the deep cut wins on billed input alone…
        let o = |size, kept, recall| Choice {
            cuts: size,
            size,
            kept,
            recall,
        };
        let (shallow, deep) = (o(9_600, 7_000, 0.0), o(6_000, 1_500, 0.0));
        assert_eq!(
            cheapest(&[shallow, deep], 12_800, 800, 0.1).map(|r| r.0),
            Some(1)
        );
        // …but it hides a 3,000-token result the last turns used: a recall round (the result in full, the
        // request again cached) each, spread over its turns, makes it dearer
        let deep = o(6_000, 1_500, 3_000.0 + 0.1 * 6_000.0);
        let (at, billed) = cheapest(&[shallow, deep], 12_800, 800, 0.1).unwrap();
        assert_eq!(at, 0);
        // the billed input returned leaves the expected recalls out
        assert_eq!(billed, per_turn(9_600, 7_000, 12_800, 800, 0.1).0);
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
