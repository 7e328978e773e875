//! The cost model of a rewrite and its cut points. A rewrite is described by a few cuts (tool results cleared
//! before `clear`, run loops pruned before `prune`, loops dropped before `drop_loops`, steps folded before `fold`,
//! whole units dropped before `drop`). The cuts are found by replaying the conversation's growth message by
//! message: they move only when the request crosses the threshold, as deep as the cost model (`cost`) finds
//! cheapest down to the target, so consecutive turns share an identical prefix.

use super::cost::{self, Choice};
use super::fold::{fold_block, fold_line_naming, foldable_units, with_block};
use super::runloop::{run_loops_with, RunLoop, ToolCallRef};
use super::shape::{
    clear_inputs, digest_words, is_cleared_input, is_placeholder, pinned, placeholder_text,
    truncated, with_content,
};
use super::tokens::{Encoding, TokenCounter};
use super::units::{units, Unit};
use super::usage::Usage;
use crate::config::PruneConfig;
use crate::message::{field, is_system, role, tool_calls};
use rustc_hash::FxHashMap as HashMap;
use serde_json::Value;
use std::borrow::Cow;

/// Where the rewrite cuts. All zero: nothing rewritten.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cuts {
    /// Eligible tool results before this index may be cleared: those before `clear_key` in the order of use
    /// frozen at `use_at` (see `usage`).
    pub clear: usize,
    /// The results cleared (of those before `clear`) are those whose key — (last use before `use_at`, index) —
    /// is below this: the least recently used first, the oldest first among those used last at once.
    pub clear_key: (usize, usize),
    /// The message the order of use was frozen at (the re-cut that moved the clear cut last): uses after it
    /// move nothing until the next re-cut.
    pub use_at: usize,
    /// Run loops ending at or before this index keep only their user message and final reply (cut).
    pub prune: usize,
    /// Run loops ending at or before this index are dropped entirely.
    pub drop_loops: usize,
    /// Foldable steps (see `fold::foldable_units`) starting before this index are left out, each leaving a line
    /// on the first tool result of the step starting here (the carrier); 0: nothing folded.
    pub fold: usize,
    /// Units starting before this index are dropped (hard limit), except system messages and `keep_user`.
    pub drop: usize,
    /// Messages before this index (but system messages and `keep_user`) are replaced by a summary.
    pub summary: usize,
    /// Tokens of the summary message.
    pub summary_tokens: u64,
    /// The user message the summary or the hard limit kept.
    pub keep_user: Option<usize>,
    /// Billed input per turn (tokens at the full price) the cost model expected, when these cuts were made, until
    /// the next re-cut (0: not forecast).
    pub forecast: u64,
}

/// What happens to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Sent as is.
    Keep,
    /// A tool result replaced by a placeholder, or an assistant message's large tool-call arguments.
    Cleared,
    /// The pinned task (the first user message), over `prune.max_pinned_tokens`: its head and tail.
    Pinned,
    /// A past run loop's user message or final reply, cut to length.
    Truncated,
    /// Not sent: part of a pruned or dropped run loop.
    Omitted,
    /// Not sent: dropped by the hard limit.
    Dropped,
    /// Not sent: a step folded into a line on the carrier.
    Folded,
    /// The first tool result after the folded steps, with their lines appended (to its placeholder when
    /// `cleared`).
    Carrier {
        /// Its result is cleared too.
        cleared: bool,
    },
}

impl Mode {
    /// The message is not sent.
    pub fn omitted(self) -> bool {
        matches!(self, Mode::Omitted | Mode::Dropped | Mode::Folded)
    }

    /// A tool result replaced by its placeholder (or tool-call arguments cleared).
    pub fn cleared(self) -> bool {
        matches!(self, Mode::Cleared | Mode::Carrier { cleared: true })
    }

    /// What the client sent is not all sent: the calls it holds or answers are recallable.
    pub fn recallable(self) -> bool {
        self.omitted() || self.cleared()
    }
}

/// Token limits, in the estimator's units (already divided by the calibration ratio).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Above this a rewrite starts.
    pub threshold: u64,
    /// A rewrite aims for this.
    pub target: u64,
    /// Above this whole units are dropped; a request that cannot get under it is refused.
    pub hard: u64,
    /// Least a re-cut must remove (below the hard limit, a re-cut removing less leaves the cuts alone).
    pub at_least: u64,
    /// More messages than this trigger a rewrite (`context.max_messages`).
    pub max_messages: Option<usize>,
    /// A rewrite triggered by the message count brings it down to this.
    pub messages_goal: usize,
    /// Price of a cached input token, as a fraction of an uncached one (`context.cache_read_price`).
    pub cache_price: f64,
}

/// Summaries the planner may use.
#[derive(Debug, Clone, Copy)]
pub struct Summaries<'a> {
    /// Newest messages never summarized.
    pub keep_recent: usize,
    /// Tokens assumed for a summary not written yet.
    pub max_tokens: u64,
    /// Summaries ready for this request: (messages covered from the start, the summary message).
    pub ready: &'a [(usize, Value)],
}

/// What a request says of its messages besides their JSON.
pub struct Seen<'h> {
    /// Unix seconds each message was first seen, aligned with the messages.
    pub times: Vec<i64>,
    /// The xxh3 of each message's bytes as sent, when the caller has them (`PlanInput::hashes`).
    pub raw_hashes: Option<&'h [u64]>,
}

/// The counter's `remembered_strings_of` finding that is a cleared result's placeholder text (keyed by
/// [`Model::alt_key`]; the other findings are 0, a message's named strings, `1 + digest_tokens`, its digest as a
/// placeholder and a fold line name it).
const PLACEHOLDER_TEXT: u64 = u64::MAX;

/// The messages with everything the cuts need, computed once per request. `'a`: the request's messages; `'c`:
/// the counter and the settings.
pub struct Model<'a, 'c> {
    msgs: &'a [Value],
    counter: &'c TokenCounter,
    enc: Encoding,
    prune: &'c PruneConfig,
    recall_tool: Option<&'a str>,
    /// Summaries, when the strategy uses them; `None` prunes instead.
    pub summaries: Option<Summaries<'a>>,
    /// Tool-result clearing runs (not for `summarize`).
    pub clearing: bool,
    tok: Vec<u64>,
    eligible: Vec<bool>,
    /// Assistant message index → its calls whose arguments clearing replaces (position, tokens), and the
    /// index of its last result (the clear cut passing it clears them).
    inputs: HashMap<usize, (Vec<(usize, u64)>, usize)>,
    /// Result index → the assistant message whose inputs are cleared when the clear cut passes it.
    inputs_at: HashMap<usize, usize>,
    /// The first user message (the task), never cleared, cut or dropped.
    first_user: Option<usize>,
    tools: Vec<usize>,
    users: Vec<usize>,
    /// The run loops, oldest first.
    pub loops: Vec<RunLoop<'a>>,
    loop_of: Vec<Option<usize>>,
    units: Vec<Unit>,
    unit_of: Vec<usize>,
    times: Vec<i64>,
    /// Tool message index → the name of the tool that produced it.
    pub tool_names: HashMap<usize, &'a str>,
    /// When each tool result was last used.
    usage: Usage,
    /// Each message's `TokenCounter::content_hash` (the key of what is remembered of it).
    content_hashes: Vec<u64>,
    alt: HashMap<usize, (Value, u64)>,
    /// Unit index → the unit is a foldable step.
    fold_unit: Vec<bool>,
    /// Starts of the foldable steps, ascending.
    fold_starts: Vec<usize>,
    /// Starts of every step (an assistant message with tool calls), ascending.
    steps: Vec<usize>,
    /// `cum[i]`: tokens of the first `i` messages as the client sent them.
    cum: Vec<u64>,
    /// Indexes of the assistant messages (one a turn), ascending.
    assistants: Vec<usize>,
    /// Index of the first message that is not a system message.
    first_speaking: usize,
    /// Whether each message is a system message (asked for every message of every candidate cut: read once).
    system: Vec<bool>,
    /// The carrier as sent: (index, cleared, fold block) → the message and its tokens; only for the fold block
    /// last made (a block grows with the calls folded, so keeping every one a search passed through held memory
    /// quadratic in a run's calls: 1.2 GB for a request of 5,000 calls).
    carried: HashMap<(usize, bool, String), (Value, u64)>,
    /// The fold block last made, and the cuts it was made for.
    last_block: Option<(Cuts, String)>,
    /// Tokens of a carrier with the fold block's head and no line yet, by (index, cleared).
    carrier_heads: HashMap<(usize, bool), u64>,
    /// Tokens of a folded call's line, with and without the newline that joins it to the next, by the call's
    /// ordinal.
    line_tokens: HashMap<usize, (u64, u64)>,
}

/// A re-cut being made: the cuts it passed through that get under the threshold, and the first message it changes.
struct Path {
    /// The cuts, their cost, and the first message changed on the way to them.
    options: Vec<(Cuts, u64, usize)>,
    first: usize,
}

impl<'a, 'c> Model<'a, 'c> {
    /// Counts and indexes `msgs`. `seen` says when each was first seen and, when the caller has them, the hashes of
    /// their bytes as sent (see `PlanInput::hashes`); `agent`: the request
    /// offers tools (nudges then continue their run loop).
    pub fn new(
        msgs: &'a [Value],
        seen: Seen<'_>,
        counter: &'c TokenCounter,
        enc: Encoding,
        prune: &'c PruneConfig,
        recall_tool: Option<&'a str>,
        agent: bool,
    ) -> Self {
        let Seen { times, raw_hashes } = seen;
        let hashes = Usage::prefix_hashes(msgs, raw_hashes, counter);
        let tok = counter.messages_tokens_prefixed(enc, msgs, (&hashes.0, &hashes.1));
        let rl = run_loops_with(msgs, None, agent);
        let mut loop_of = vec![None; msgs.len()];
        let mut tool_names = HashMap::default();
        for (li, l) in rl.loops.iter().enumerate() {
            loop_of[l.start..l.end]
                .iter_mut()
                .for_each(|x| *x = Some(li));
            for c in &l.tool_calls {
                if let Some(r) = c.result {
                    tool_names.insert(r, c.name);
                }
            }
        }
        let units = units(msgs);
        let fold_unit = foldable_units(msgs, &units, &rl.loops, prune);
        let starts = |keep: &dyn Fn(usize) -> bool| -> Vec<usize> {
            units
                .iter()
                .enumerate()
                .filter(|(ui, _)| keep(*ui))
                .map(|(_, u)| u.start)
                .collect()
        };
        let fold_starts = starts(&|ui| fold_unit[ui]);
        let steps = starts(&|ui| !tool_calls(&msgs[units[ui].start]).is_empty());
        let mut cum = Vec::with_capacity(msgs.len() + 1);
        cum.push(0);
        for t in &tok {
            cum.push(cum.last().copied().unwrap_or(0) + t);
        }
        let mut unit_of = vec![0; msgs.len()];
        for (ui, u) in units.iter().enumerate() {
            unit_of[u.start..u.end].iter_mut().for_each(|x| *x = ui);
        }
        let excluded = |name: &str| prune.exclude_tools.iter().any(|t| t == name);
        let eligible = msgs
            .iter()
            .zip(&tok)
            .enumerate()
            .map(|(i, (m, t))| {
                role(m) == "tool"
                    && *t >= prune.min_result_tokens
                    && !is_placeholder(m)
                    && !tool_names.get(&i).is_some_and(|n| excluded(n))
            })
            .collect();
        let (inputs, inputs_at) = clearable_inputs(msgs, &rl.loops, counter, enc, prune);
        let idx = |r: &str| -> Vec<usize> {
            msgs.iter()
                .enumerate()
                .filter(|(_, m)| role(m) == r)
                .map(|(i, _)| i)
                .collect()
        };
        Self {
            msgs,
            counter,
            enc,
            prune,
            recall_tool,
            summaries: None,
            clearing: true,
            tok,
            eligible,
            inputs,
            inputs_at,
            first_user: super::task::task_index(msgs),
            tools: idx("tool"),
            users: idx("user"),
            loops: rl.loops,
            loop_of,
            units,
            unit_of,
            times,
            tool_names,
            usage: Usage::with_hashes(msgs, counter, &hashes),
            content_hashes: hashes.1,
            alt: HashMap::default(),
            fold_unit,
            fold_starts,
            steps,
            cum,
            assistants: idx("assistant"),
            first_speaking: msgs.iter().position(|m| !is_system(m)).unwrap_or(0),
            system: msgs.iter().map(is_system).collect(),
            carried: HashMap::default(),
            last_block: None,
            carrier_heads: HashMap::default(),
            line_tokens: HashMap::default(),
        }
    }

    /// The token counter.
    pub fn counter(&self) -> &'c TokenCounter {
        self.counter
    }

    /// Tokens of the messages as the client sent them.
    pub fn total(&self) -> u64 {
        self.tok.iter().sum()
    }

    /// What the cuts do to message `i`.
    pub fn mode(&self, i: usize, c: &Cuts) -> Mode {
        if self.system[i] {
            return Mode::Keep;
        }
        let cut = self.cut_mode(i, c);
        if self.first_user == Some(i)
            && matches!(cut, Mode::Omitted | Mode::Dropped | Mode::Truncated)
        {
            // The task stays: whole, or its head and tail when it is larger than the pinning allows.
            return if self.tok[i] > self.prune.max_pinned_tokens {
                Mode::Pinned
            } else {
                Mode::Keep
            };
        }
        cut
    }

    fn cut_mode(&self, i: usize, c: &Cuts) -> Mode {
        let u = self.unit_of[i];
        if self.units[u].start < c.drop && c.keep_user.is_none_or(|k| self.unit_of[k] != u) {
            return Mode::Dropped;
        }
        if i < c.summary && c.keep_user != Some(i) {
            return Mode::Omitted;
        }
        if let Some(l) = self.loop_of[i].map(|l| &self.loops[l]) {
            if l.end <= c.drop_loops {
                return Mode::Omitted;
            }
            if l.end <= c.prune {
                let dialogue = l.user == Some(i)
                    || l.final_reply == Some(i)
                    || l.nudged.binary_search(&i).is_ok();
                return if dialogue {
                    Mode::Truncated
                } else {
                    Mode::Omitted
                };
            }
        }
        if self.fold_unit[u]
            && self.units[u].start < c.fold
            && c.keep_user.is_none_or(|k| self.unit_of[k] != u)
        {
            return Mode::Folded;
        }
        let cleared = self.eligible[i] && self.clear_passed(i, c);
        if c.fold > 0 && i == c.fold + 1 && self.folds_any(c) {
            return Mode::Carrier { cleared };
        }
        if cleared {
            return Mode::Cleared;
        }
        if self
            .inputs
            .get(&i)
            .is_some_and(|(_, last)| self.clear_passed(*last, c))
        {
            return Mode::Cleared;
        }
        Mode::Keep
    }

    /// The order clearing takes tool result `i` in, frozen at message `at`: (last use before `at`, `i`); by age
    /// alone, (`i`, `i`).
    fn clear_order(&self, i: usize, at: usize) -> (usize, usize) {
        if self.prune.clear_by_use {
            self.usage.key(i, at)
        } else {
            (i, i)
        }
    }

    /// Whether the clear cut of `c` passed the result at `i` (cleared when eligible; its call's arguments too).
    fn clear_passed(&self, i: usize, c: &Cuts) -> bool {
        i < c.clear && self.clear_order(i, c.use_at) < c.clear_key
    }

    /// Whether a step before the fold cut is folded under `c`. The steps an earlier cut left out (a pruned or
    /// dropped run loop, the summary, the hard limit) are not: a fold cut past only those carries no line, and its
    /// carrier is sent as it came (were it taken for changed, the note, and with strict roles a notice of
    /// ctxgate's, would land after it, inside a run loop kept whole).
    fn folds_any(&self, c: &Cuts) -> bool {
        let before = self.fold_starts.partition_point(|&s| s < c.fold);
        for &s in self.fold_starts[..before].iter().rev() {
            match self.cut_mode(s, c) {
                Mode::Folded => return true,
                // those cuts leave out a prefix: every older step is left out too
                m if m.omitted() => return false,
                _ => {}
            }
        }
        false
    }

    /// The message as sent under `mode` (its mode under `c`): the client's own when kept (borrowed), else its
    /// rewritten form, taken out of the model (ask once per message).
    pub fn take_rendered(&mut self, i: usize, mode: Mode, c: &Cuts) -> Option<Cow<'a, Value>> {
        match mode {
            Mode::Keep => Some(Cow::Borrowed(&self.msgs[i])),
            Mode::Omitted | Mode::Dropped | Mode::Folded => None,
            Mode::Carrier { cleared } => Some(Cow::Owned(self.carrier(i, cleared, c).0.clone())),
            Mode::Cleared | Mode::Truncated | Mode::Pinned => {
                self.alt(i, mode);
                self.alt.remove(&i).map(|(v, _)| Cow::Owned(v))
            }
        }
    }

    /// The calls folded under `c`, oldest first, each with its ordinal among all the calls of the conversation
    /// (several calls of one message share its position).
    fn folded_calls(&self, c: &Cuts) -> impl Iterator<Item = (usize, &ToolCallRef<'a>)> + '_ {
        let c = *c;
        self.loops
            .iter()
            .flat_map(|l| &l.tool_calls)
            .enumerate()
            .take_while(move |(_, call)| call.position < c.fold)
            .filter(move |(_, call)| self.mode(call.position, &c) == Mode::Folded)
    }

    /// The lines of the calls folded under `c`, oldest first.
    fn fold_lines(&self, c: &Cuts) -> Vec<String> {
        self.folded_calls(c)
            .map(|(_, call)| self.line_of(call))
            .collect()
    }

    /// The line a folded call leaves: its id, tool and arguments' gist, and what its result names
    /// (`prune.digest_tokens`).
    /// The distinctive strings result `i`'s placeholder and fold line name (`prune.digest_tokens` of them): a scan
    /// of the whole result, remembered from one request to the next.
    fn digest_of(&self, i: usize) -> std::sync::Arc<[Box<str>]> {
        let tokens = self.prune.digest_tokens;
        self.counter
            .remembered_strings_of(self.content_hashes[i], 1 + tokens, || {
                digest_words(&self.msgs[i], tokens)
            })
    }

    fn line_of(&self, call: &ToolCallRef<'a>) -> String {
        let words = match call.result.filter(|&r| r < self.msgs.len()) {
            Some(r) => self.digest_of(r),
            None => Vec::new().into(),
        };
        let words: Vec<&str> = words.iter().map(AsRef::as_ref).collect();
        fold_line_naming(call.id, call.name, call.arguments, &words)
    }

    /// The tokens of carrier `i` as sent under `c`, exactly as [`Self::carrier`] would count it, without building
    /// it: the carrier with the block's head, plus each folded call's line. Each line starts with `- `, so the
    /// pre-tokenizer (o200k and cl100k alike) always splits right after the newline that joins two lines: the
    /// whole is the sum of its lines, each counted once per plan. (Counting every candidate's whole carrier made a
    /// search through a run of n calls tokenize O(n²) text: 12 s for one request of 5,000 calls.)
    fn carrier_tokens(&mut self, i: usize, cleared: bool, c: &Cuts) -> u64 {
        let folded: Vec<(usize, ToolCallRef<'a>)> = self
            .folded_calls(c)
            .map(|(n, call)| (n, call.clone()))
            .collect();
        if folded.is_empty() {
            // no block: the carrier is the base message
            return if cleared {
                self.alt_tokens(i, Mode::Cleared)
            } else {
                self.tok[i]
            };
        }
        let mut t = match self.carrier_heads.get(&(i, cleared)) {
            Some(t) => *t,
            None => {
                let base = if cleared {
                    self.alt(i, Mode::Cleared).0.clone()
                } else {
                    self.msgs[i].clone()
                };
                let head = with_block(&base, &fold_block(&[], self.recall_tool));
                let t = self.counter.message_tokens(self.enc, &head);
                self.carrier_heads.insert((i, cleared), t);
                t
            }
        };
        let last = folded.len() - 1;
        for (k, (at, call)) in folded.into_iter().enumerate() {
            let (joined, alone) = match self.line_tokens.get(&at) {
                Some(n) => *n,
                None => {
                    let line = self.line_of(&call);
                    let alone = self.counter.text_tokens(self.enc, &line);
                    let n = (
                        self.counter.text_tokens(self.enc, &format!("{line}\n")),
                        alone,
                    );
                    self.line_tokens.insert(at, n);
                    n
                }
            };
            t += if k < last { joined } else { alone };
        }
        t
    }

    /// The carrier `i` as sent under `c`: the client's result (or its placeholder when `cleared`) with the lines
    /// of the folded calls appended.
    fn carrier(&mut self, i: usize, cleared: bool, c: &Cuts) -> &(Value, u64) {
        let block = match &self.last_block {
            Some((made, block)) if made == c => block.clone(),
            _ => {
                let lines = self.fold_lines(c);
                let block = if lines.is_empty() {
                    String::new()
                } else {
                    fold_block(&lines, self.recall_tool)
                };
                if self.last_block.as_ref().is_some_and(|(_, b)| *b != block) {
                    self.carried.clear();
                }
                self.last_block = Some((*c, block.clone()));
                block
            }
        };
        let key = (i, cleared, block);
        if !self.carried.contains_key(&key) {
            let base = if cleared {
                self.alt(i, Mode::Cleared).0.clone()
            } else {
                self.msgs[i].clone()
            };
            let v = if key.2.is_empty() {
                base
            } else {
                with_block(&base, &key.2)
            };
            let t = self.counter.message_tokens(self.enc, &v);
            self.carried.insert(key.clone(), (v, t));
        }
        // inserted just above when missing
        &self.carried[&key]
    }

    /// The tokens of message `i` under `c` when it is that cut's carrier, and the carrier as rendered (tests).
    #[cfg(test)]
    pub(crate) fn carrier_for_test(&mut self, i: usize, c: &Cuts) -> Option<(u64, Value)> {
        match self.mode(i, c) {
            Mode::Carrier { cleared } => {
                let t = self.tokens(i, c);
                Some((t, self.carrier(i, cleared, c).0.clone()))
            }
            _ => None,
        }
    }

    /// How many carriers the model keeps (tests).
    #[cfg(test)]
    pub(crate) fn carried_len(&self) -> usize {
        self.carried.len()
    }

    /// Message `i` rewritten under `mode`, with its tokens. A cleared result's placeholder text and every
    /// remembered form's count come from the counter's memos when an earlier request had the message rewritten
    /// the same way (see [`Self::alt_key`]): a long history's placeholders are not made again every turn.
    fn alt(&mut self, i: usize, mode: Mode) -> &(Value, u64) {
        if !self.alt.contains_key(&i) {
            let key = self.alt_key(i, mode);
            let (counter, enc, prune, recall) =
                (self.counter, self.enc, self.prune, self.recall_tool);
            let m = &self.msgs[i];
            let v = match mode {
                Mode::Cleared => match self.inputs.get(&i) {
                    Some((calls, _)) => clear_inputs(m, calls, recall),
                    None => {
                        let name = self.tool_names.get(&i).copied().unwrap_or("unknown tool");
                        let make = || placeholder_text(m, name, recall, &self.digest_of(i));
                        let text = match key {
                            Some(k) => counter.remembered_strings_of(k, PLACEHOLDER_TEXT, || {
                                vec![make().into_boxed_str()]
                            })[0]
                                .to_string(),
                            None => make(),
                        };
                        with_content(m, text)
                    }
                },
                Mode::Pinned => {
                    let chars = crate::message::message_text(m).chars().count() as u64;
                    let keep = chars * prune.max_pinned_tokens / self.tok[i].max(1);
                    pinned(m, keep as usize)
                }
                _ => truncated(m, prune.max_message_length),
            };
            let t = match key {
                Some(k) => counter.derived_tokens(enc, k, || counter.message_tokens(enc, &v)),
                None => counter.message_tokens(enc, &v),
            };
            self.alt.insert(i, (v, t));
        }
        // inserted just above when missing
        &self.alt[&i]
    }

    /// Tokens of message `i` rewritten under `mode` (as [`Self::alt`] makes it), from the counter's memo of derived
    /// forms when an earlier request had the same message rewritten so: a plan then builds only the forms it
    /// sends (a long history's placeholders are counted once, not rebuilt and hashed every turn).
    fn alt_tokens(&mut self, i: usize, mode: Mode) -> u64 {
        if let Some((_, t)) = self.alt.get(&i) {
            return *t;
        }
        let Some(key) = self.alt_key(i, mode) else {
            return self.alt(i, mode).1;
        };
        let (counter, enc) = (self.counter, self.enc);
        counter.derived_tokens(enc, key, || self.alt(i, mode).1)
    }

    /// What the form [`Self::alt`] makes of message `i` under `mode` depends on, hashed: the message's content
    /// hash, the mode, and the settings and names the form is made of. `None` for the forms not remembered (a
    /// call message's cleared arguments, which depend on which of its calls are clearable).
    fn alt_key(&self, i: usize, mode: Mode) -> Option<u64> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.content_hashes[i].to_le_bytes());
        match mode {
            Mode::Cleared if !self.inputs.contains_key(&i) => {
                let name = self.tool_names.get(&i).copied().unwrap_or("unknown tool");
                h.update(b"cleared\0");
                h.update(&(name.len() as u64).to_le_bytes());
                h.update(name.as_bytes());
                match self.recall_tool {
                    Some(t) => {
                        h.update(&(t.len() as u64).to_le_bytes());
                        h.update(t.as_bytes());
                    }
                    None => h.update(&u64::MAX.to_le_bytes()),
                }
                h.update(&self.prune.digest_tokens.to_le_bytes());
            }
            Mode::Truncated => {
                h.update(b"truncated\0");
                h.update(&(self.prune.max_message_length as u64).to_le_bytes());
            }
            Mode::Pinned => {
                h.update(b"pinned\0");
                h.update(&self.prune.max_pinned_tokens.to_le_bytes());
                h.update(&self.tok[i].to_le_bytes());
            }
            _ => return None,
        }
        Some(h.digest())
    }

    fn tokens(&mut self, i: usize, c: &Cuts) -> u64 {
        match self.mode(i, c) {
            Mode::Keep => self.tok[i],
            Mode::Omitted | Mode::Dropped | Mode::Folded => 0,
            Mode::Carrier { cleared } => self.carrier_tokens(i, cleared, c),
            m => self.alt_tokens(i, m),
        }
    }

    fn range_tokens(&mut self, from: usize, to: usize, c: &Cuts) -> u64 {
        (from..to).map(|i| self.tokens(i, c)).sum()
    }

    /// [`Self::range_tokens`] of the first `j` messages, and the carrier's when it is not in the range: leaving
    /// out messages there may take folded steps off its lines.
    fn span_tokens(&mut self, from: usize, to: usize, j: usize, c: &Cuts) -> u64 {
        let carrier = c.fold + 1;
        let outside = c.fold > 0 && carrier < j && !(from..to).contains(&carrier);
        let lines = if outside { self.tokens(carrier, c) } else { 0 };
        self.range_tokens(from, to, c) + lines
    }

    /// The cost of the first `j` messages under `c`, the summary message included.
    pub fn cost(&mut self, j: usize, c: &Cuts, base: u64) -> u64 {
        let summary = if c.summary > 0 { c.summary_tokens } else { 0 };
        base + summary + self.range_tokens(0, j, c)
    }

    /// The summary ready for the first `upto` messages.
    pub fn ready_summary(&self, upto: usize) -> Option<&'a Value> {
        let s = self.summaries?;
        s.ready.iter().find(|(u, _)| *u == upto).map(|(_, m)| m)
    }

    /// Where a summary made at step `j` would end: `keep_recent` messages before `j`, moved back to the start
    /// of a unit so that no tool call is split from its results. 0 when nothing can be summarized.
    pub fn summary_bound(&self, j: usize) -> usize {
        let Some(s) = self.summaries else {
            return 0;
        };
        let at = j.saturating_sub(s.keep_recent);
        if at == 0 || at >= self.msgs.len() {
            return 0;
        }
        self.units[self.unit_of[at]].start
    }

    /// The first message of the unit holding message `i`.
    pub fn unit_start(&self, i: usize) -> usize {
        self.units[self.unit_of[i]].start
    }

    /// One past the last message of the unit holding message `i`.
    pub fn unit_end(&self, i: usize) -> usize {
        self.units[self.unit_of[i]].end
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// Tokens of any message (cached).
    pub fn message_tokens(&self, m: &Value) -> u64 {
        self.counter.message_tokens(self.enc, m)
    }

    /// Whether a summary of `from..to` would replace anything (system messages and `keep_user` stay anyway).
    pub fn summarizable(&self, from: usize, to: usize, keep_user: Option<usize>) -> bool {
        (from..to.min(self.msgs.len())).any(|i| !self.system[i] && Some(i) != keep_user)
    }

    /// The newest user message before `j`.
    pub fn newest_user_before(&self, j: usize) -> Option<usize> {
        self.users[..self.users.partition_point(|&u| u < j)]
            .last()
            .copied()
    }

    /// Summarizes up to the newest ready summary when that gets under the threshold, else up to the bound.
    fn summarize(&mut self, j: usize, c: &mut Cuts, cost: u64, base: u64, lim: Limits) -> u64 {
        let Some(s) = self.summaries else {
            return cost;
        };
        let bound = self.summary_bound(j);
        let keep_user = self.newest_user_before(j);
        if !self.summarizable(c.summary, bound, keep_user) {
            return cost;
        }
        let unit_start = |u: usize| self.units[self.unit_of[u]].start == u;
        let ready = s
            .ready
            .iter()
            .filter(|(u, _)| *u > c.summary && *u <= bound && unit_start(*u))
            .max_by_key(|(u, _)| *u);
        if let Some((upto, msg)) = ready {
            let mut t = *c;
            t.summary = *upto;
            t.summary_tokens = self.counter.message_tokens(self.enc, msg);
            t.keep_user = keep_user;
            let with_ready = self.cost(j, &t, base);
            // A ready summary that gets the request under the threshold beats waiting for a fresher one (which
            // the planner then asks for ahead of time).
            if with_ready <= lim.threshold || *upto == bound {
                *c = t;
                return with_ready;
            }
        }
        c.summary = bound;
        c.summary_tokens = match self.ready_summary(bound) {
            Some(m) => self.counter.message_tokens(self.enc, m),
            None => s.max_tokens + 20,
        };
        c.keep_user = keep_user;
        self.cost(j, c, base)
    }

    /// Replays the conversation's growth and returns the final cuts and the cost (tokens, `base` included) of
    /// the whole list under them. A re-cut that removes less than `at_least` is not made while the request fits
    /// under the hard limit (unless the message count asks for it).
    pub fn simulate(&mut self, base: u64, lim: Limits) -> (Cuts, u64) {
        let mut cuts = Cuts::default();
        let mut cost = base;
        for j in 1..=self.msgs.len() {
            cost += self.tokens(j - 1, &cuts);
            let too_many = lim
                .max_messages
                .is_some_and(|m| j > m && self.sent(j, &cuts) > m);
            if cost > lim.threshold || too_many {
                let mut next = cuts;
                let after = self.recompute(j, &mut next, cost, base, lim);
                if too_many || cost > lim.hard || cost.saturating_sub(after) >= lim.at_least {
                    (cuts, cost) = (next, after);
                }
            }
        }
        (cuts, cost)
    }

    /// Messages of the first `j` sent under `c` (the summary included): O(j), so only counted with
    /// `max_messages` set.
    fn sent(&self, j: usize, c: &Cuts) -> usize {
        let kept = (0..j).filter(|&i| !self.mode(i, c).omitted()).count();
        kept + usize::from(c.summary > 0)
    }

    /// Whether the first `j` messages under `c` are over what a rewrite aims for: the target in tokens, or the
    /// message goal when a count limit is set.
    fn over(&self, j: usize, c: &Cuts, cost: u64, lim: Limits) -> bool {
        cost > lim.target || (lim.max_messages.is_some() && self.sent(j, c) > lim.messages_goal)
    }

    /// Moves the cuts for the first `j` messages, stage by stage, at most until they cost the target; of the
    /// re-cuts passed on the way that get under the threshold, the cost model's cheapest is kept (see `cost`).
    fn recompute(&mut self, j: usize, c: &mut Cuts, mut cost: u64, base: u64, lim: Limits) -> u64 {
        let (from, from_cost) = (*c, cost);
        let mut path = Path {
            options: Vec::new(),
            first: j,
        };
        // 1. Tool-result clearing, oldest first, never the newest `keep_tool_results`.
        let k = self.prune.keep_tool_results;
        let seen = self.tools.partition_point(|&t| t < j);
        let bound = if k == 0 {
            j
        } else if seen > k {
            self.tools[seen - k]
        } else {
            0
        };
        // Never inside the newest message's unit: its results are what the model is answering.
        let newest_unit = self.units[self.unit_of[j - 1]].start;
        let bound = bound.min(newest_unit);
        if self.clearing {
            cost = self.clear(j, c, cost, bound, lim, &mut path);
        }
        // 2. With summaries: replace everything but the newest messages by a summary. Without: run-loop pruning,
        //    which drops loops past the count and age limits, then cuts past loops, oldest first; then folding
        //    the oldest steps of the loops kept.
        if self.summaries.is_some() && self.over(j, c, cost, lim) {
            let before = c.summary;
            cost = self.summarize(j, c, cost, base, lim);
            if c.summary != before {
                path.passed(c, cost, self.first_speaking, lim);
            }
        }
        let started = self.loops.partition_point(|l| l.start < j);
        let keep = self.prune.keep_run_loops.max(1);
        if self.summaries.is_none() && self.over(j, c, cost, lim) && started > keep {
            let prunable = started - keep;
            let cut_before = c.prune.max(c.drop_loops);
            if started > self.prune.max_run_loops {
                let last_dropped = &self.loops[started - self.prune.max_run_loops - 1];
                c.drop_loops = c
                    .drop_loops
                    .max(last_dropped.end.min(self.loops[prunable].start));
            }
            if let Some(age) = self.prune.max_age {
                let now = self.times[j - 1];
                let old = self.loops[..prunable]
                    .iter()
                    .filter(|l| self.times[l.end - 1].saturating_add(age.secs() as i64) < now)
                    .map(|l| l.end)
                    .max();
                c.drop_loops = c.drop_loops.max(old.unwrap_or(0));
            }
            cost = self.cost(j, c, base);
            if c.drop_loops > cut_before {
                let first = self.loops[self.loops.partition_point(|l| l.end <= cut_before)].start;
                path.passed(c, cost, first, lim);
            }
            for li in 0..prunable {
                if !self.over(j, c, cost, lim) {
                    break;
                }
                let (start, end) = (self.loops[li].start, self.loops[li].end);
                if end <= c.prune.max(c.drop_loops) {
                    continue;
                }
                let before = self.span_tokens(start, end, j, c);
                c.prune = end;
                cost = cost - before + self.span_tokens(start, end, j, c);
                path.passed(c, cost, start, lim);
            }
        }
        if self.summaries.is_none() && self.clearing && self.over(j, c, cost, lim) {
            cost = self.fold(j, c, cost, lim, newest_unit, &mut path);
        }
        // The depth: the cheapest re-cut per turn that gets under the threshold and removes enough (a re-cut
        // asked for by the message count goes all the way).
        let too_many = lim
            .max_messages
            .is_some_and(|m| j > m && self.sent(j, c) > m);
        if too_many {
            c.forecast = 0;
        } else {
            path.options.push((*c, cost, path.first));
            (*c, cost) = self.cheapest(j, &from, from_cost, base, lim, &path);
        }
        // 3. Hard limit: drop the oldest whole units, keeping system messages, the task (pinned when long), the
        //    newest user message and the newest message's unit. (Clearing the newest results first instead was measured: it keeps fewer of the
        //    facts the next step uses whole, and re-cuts sooner.)
        if cost > lim.hard || too_many {
            c.keep_user = self.newest_user_before(j);
            cost = self.cost(j, c, base);
            let last = self.unit_of[j - 1];
            let first = self.units.partition_point(|u| u.start < c.drop);
            for ui in first..last {
                if !self.over(j, c, cost, lim) {
                    break;
                }
                let Unit { start, end } = self.units[ui];
                let holds = |k: Option<usize>| k.is_some_and(|k| k >= start && k < end);
                // The task's unit is cut like the others: the task itself stays (`mode`), whole, or its head and
                // tail when it is over `prune.max_pinned_tokens` — so a long task (SWE-agent's demonstration)
                // is pinned here rather than making the request unsendable.
                let protected = self.system[start] || holds(c.keep_user);
                if protected {
                    continue;
                }
                let before = self.span_tokens(start, end, j, c);
                c.drop = end;
                cost = cost - before + self.span_tokens(start, end, j, c);
            }
            if c.forecast > 0 {
                // dropping the oldest units changes everything after the system prompt
                let growth = cost::growth(&self.cum, &self.assistants, j);
                let (rate, _) = cost::per_turn(cost, 0, lim.threshold, growth, lim.cache_price);
                c.forecast = rate.round() as u64;
            }
        }
        cost
    }

    /// Moves the clear cut for the first `j` messages to `bound` (results from there on are never cleared), with
    /// the order of use frozen at `j`, then clears the least recently used results one at a time while the
    /// request costs more than the target. Freezing the order anew may bring back a result cleared before that
    /// was used since (the agent works with it again).
    fn clear(
        &mut self,
        j: usize,
        c: &mut Cuts,
        mut cost: u64,
        bound: usize,
        lim: Limits,
        path: &mut Path,
    ) -> u64 {
        let old = *c;
        c.clear = c.clear.max(bound);
        if self.prune.clear_by_use {
            c.use_at = j;
        }
        if *c != old {
            // what the new bound and order change: results newly inside the bound, results used since the
            // order was last frozen, and the calls whose arguments go with them
            let mut touched: Vec<usize> = self.tools
                [self.tools.partition_point(|&t| t < old.clear)..]
                .iter()
                .copied()
                .take_while(|&t| t < c.clear)
                .collect();
            if self.prune.clear_by_use {
                let used = self.usage.used_in(old.use_at, j);
                touched.extend(used.into_iter().filter(|&r| r < c.clear));
            }
            let owners: Vec<usize> = touched
                .iter()
                .filter_map(|r| self.inputs_at.get(r).copied())
                .collect();
            touched.extend(owners);
            touched.sort_unstable();
            touched.dedup();
            let mut first = None;
            for i in touched {
                let (before, after) = (self.tokens(i, &old), self.tokens(i, c));
                if self.mode(i, &old) != self.mode(i, c) {
                    first.get_or_insert(i);
                }
                cost = cost - before + after;
            }
            if let Some(f) = first {
                path.passed(c, cost, f, lim);
            }
        }
        // the results not cleared yet whose clearing changes something, least recently used first
        let at = c.use_at;
        let mut order: Vec<((usize, usize), usize)> = self.tools
            [..self.tools.partition_point(|&t| t < c.clear)]
            .iter()
            .map(|&i| (self.clear_order(i, at), i))
            .filter(|&(key, i)| {
                key >= c.clear_key && (self.eligible[i] || self.inputs_at.contains_key(&i))
            })
            .collect();
        order.sort_unstable();
        for (key, i) in order {
            if cost <= lim.target {
                break;
            }
            let owner = self.inputs_at.get(&i).copied();
            let before = self.tokens(i, c) + owner.map_or(0, |a| self.tokens(a, c));
            c.clear_key = (key.0, key.1 + 1);
            let after = self.tokens(i, c) + owner.map_or(0, |a| self.tokens(a, c));
            cost = cost - before + after;
            if after != before {
                path.passed(c, cost, owner.map_or(i, |a| a.min(i)), lim);
            }
        }
        cost
    }

    /// Folds the oldest foldable steps of the first `j` messages, one at a time, while they cost more than the
    /// target; never the newest `prune.keep_steps` steps nor the newest message's unit (which starts at
    /// `newest_unit`).
    fn fold(
        &mut self,
        j: usize,
        c: &mut Cuts,
        mut cost: u64,
        lim: Limits,
        newest_unit: usize,
        path: &mut Path,
    ) -> u64 {
        let seen = self.steps.partition_point(|&s| s < j);
        let keep = self.prune.keep_steps.max(1);
        if seen <= keep {
            return cost;
        }
        let bound = self.steps[seen - keep].min(newest_unit);
        // The fold cut is always the start of a foldable step (the carrier's), with at least one before it.
        let mut next = self.fold_starts.partition_point(|&s| s <= c.fold).max(1);
        while self.over(j, c, cost, lim) {
            let Some(&to) = self.fold_starts.get(next).filter(|&&s| s <= bound) else {
                break;
            };
            let from = if c.fold == 0 {
                self.fold_starts[0]
            } else {
                c.fold
            };
            // What changes: the steps newly folded, the old carrier and the new one (`to + 1`).
            let end = (to + 2).min(j);
            let before = self.range_tokens(from, end, c);
            c.fold = to;
            cost = cost - before + self.range_tokens(from, end, c);
            path.passed(c, cost, from, lim);
            next += 1;
        }
        cost
    }

    /// The cheapest of the re-cuts `path` passed (from the cuts `from`, costing `from_cost`) that gets under the
    /// threshold and removes `clear_at_least` (unless the request is over the hard limit), with its cost; the
    /// deepest (the last option) when none does. Its forecast is set.
    fn cheapest(
        &mut self,
        j: usize,
        from: &Cuts,
        from_cost: u64,
        base: u64,
        lim: Limits,
        path: &Path,
    ) -> (Cuts, u64) {
        let enough = |size: u64| {
            size <= lim.threshold
                && (from_cost > lim.hard || from_cost.saturating_sub(size) >= lim.at_least)
        };
        let mut options: Vec<&(Cuts, u64, usize)> =
            path.options.iter().filter(|o| enough(o.1)).collect();
        if options.is_empty() {
            options.extend(path.options.last());
        }
        // What the previous request keeps: nothing when this is the first rewrite and ctxgate's tools come with
        // it; else its messages before the first one the re-cut changes, and never past the last message it
        // had changed (where the recall note, which lists what was removed, rides).
        let first_rewrite = *from == Cuts::default();
        let tools_added = first_rewrite && self.recall_tool.is_some();
        let last_changed = if first_rewrite {
            j
        } else {
            (0..j.saturating_sub(1))
                .rev()
                .find(|&i| self.mode(i, from) != Mode::Keep)
                .unwrap_or(j)
        };
        // The previous request's tokens before message `i`, for every `i` an option needs (counted once).
        let upto = if tools_added {
            0
        } else {
            options
                .iter()
                .map(|o| o.2.min(last_changed))
                .max()
                .unwrap_or(0)
        };
        let mut prefix = Vec::with_capacity(upto + 1);
        prefix.push(base);
        for i in 0..upto {
            let summary = if from.summary > 0 && from.summary == i {
                from.summary_tokens
            } else {
                0
            };
            let t = self.tokens(i, from);
            prefix.push(prefix[i] + summary + t);
        }
        // The results the newest turns used: each one a re-cut hides is expected to cost a recall round — the
        // result itself at the full price, and the request again, cached.
        let recent_from = self.assistants[..self.assistants.partition_point(|&a| a < j)]
            .iter()
            .rev()
            .nth(cost::RECENT_TURNS - 1)
            .copied()
            .unwrap_or(0);
        let recent = self.usage.used_in(recent_from, j);
        let choices: Vec<Choice<Cuts>> = options
            .iter()
            .map(|&&(cuts, size, first)| {
                let recall = recent
                    .iter()
                    .filter(|&&r| self.mode(r, &cuts).recallable())
                    .map(|&r| self.tok[r] as f64 + lim.cache_price * size as f64)
                    .sum();
                Choice {
                    cuts,
                    size,
                    kept: if tools_added {
                        0
                    } else {
                        prefix[first.min(last_changed)]
                    },
                    recall,
                }
            })
            .collect();
        let growth = cost::growth(&self.cum, &self.assistants, j);
        let Some((best, rate)) = cost::cheapest(&choices, lim.threshold, growth, lim.cache_price)
        else {
            // not reached: the deepest option is always there
            return (*from, from_cost);
        };
        let mut cuts = choices[best].cuts;
        cuts.forecast = rate.round() as u64;
        (cuts, choices[best].size)
    }
}

impl Path {
    /// The cuts `c` (costing `cost`) were passed on the way, changing message `first` (or a later one) first.
    fn passed(&mut self, c: &Cuts, cost: u64, first: usize, lim: Limits) {
        self.first = self.first.min(first);
        if cost <= lim.threshold {
            self.options.push((*c, cost, self.first));
        }
        // (the deepest is added by `recompute` whatever its cost)
    }
}

/// The assistant messages whose tool-call arguments clearing may replace: calls of a selected tool (not excluded)
/// with arguments of at least `prune.min_input_tokens` tokens that are not a placeholder already. Returns them
/// with the index of each message's last result, and the reverse index (last result → message).
#[allow(clippy::type_complexity)]
fn clearable_inputs(
    msgs: &[Value],
    loops: &[RunLoop<'_>],
    counter: &TokenCounter,
    enc: Encoding,
    prune: &PruneConfig,
) -> (
    HashMap<usize, (Vec<(usize, u64)>, usize)>,
    HashMap<usize, usize>,
) {
    let (mut inputs, mut at) = (HashMap::default(), HashMap::default());
    if prune.clear_tool_inputs.is_none() {
        return (inputs, at);
    }
    let mut last_result: HashMap<usize, usize> = HashMap::default();
    for c in loops.iter().flat_map(|l| &l.tool_calls) {
        if let Some(r) = c.result {
            let e = last_result.entry(c.position).or_insert(r);
            *e = (*e).max(r);
        }
    }
    for (&i, &last) in &last_result {
        let calls: Vec<(usize, u64)> = tool_calls(&msgs[i])
            .iter()
            .enumerate()
            .filter_map(|(at, call)| {
                let f = field(call, "function")?;
                let name = field(f, "name").and_then(Value::as_str).unwrap_or("");
                let args = field(f, "arguments").and_then(Value::as_str)?;
                let selected = prune.clear_tool_inputs.includes(name)
                    && !prune.exclude_tools.iter().any(|t| t == name);
                // A token covers at least one byte: shorter text needs no count.
                if !selected
                    || (args.len() as u64) < prune.min_input_tokens
                    || is_cleared_input(args)
                {
                    return None;
                }
                let tokens = counter.text_tokens(enc, args);
                (tokens >= prune.min_input_tokens).then_some((at, tokens))
            })
            .collect();
        if !calls.is_empty() {
            inputs.insert(i, (calls, last));
            at.insert(last, i);
        }
    }
    (inputs, at)
}
