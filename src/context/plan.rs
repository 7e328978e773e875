//! The planner: given a request's messages and the budget of its model, decide whether to forward them as they
//! are, rewrite them (and how), or refuse them. Deterministic: the same messages and settings give the same bytes.

use super::roles;
use super::shape::digest;
pub use super::stages::Summaries;
use super::stages::{Cuts, Limits, Mode, Model, Seen};
use super::tokens::{Encoding, TokenCounter};
use crate::config::{ContextConfig, PruneConfig, Strategy};
use crate::message::Source;
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;

/// Everything the planner needs to know about one request.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The request's messages.
    pub messages: &'a [Value],
    /// The xxh3 of each message's bytes as the client sent them, when `messages` are the client's own elements
    /// (chat completions: the parse's `dialect::Request::item_hashes`); the planner then keys what it remembers of
    /// each message by them instead of hashing its JSON again. `None`: hashed here.
    pub hashes: Option<&'a [u64]>,
    /// The request's `tools`, counted in the budget.
    pub tools: Option<&'a Value>,
    /// Unix seconds each message was first seen (aligned with `messages`); `now` when unknown.
    pub first_seen: Option<&'a [i64]>,
    /// Unix seconds now.
    pub now: i64,
    /// The tokenizer of the model.
    pub encoding: Encoding,
    /// Calibration: real tokens per estimated token for this model (1.0 when unknown).
    pub ratio: f64,
    /// The strategy in force (config, or the `x-ctxgate-strategy` header).
    pub strategy: Strategy,
    /// The model's context window in tokens.
    pub window: u64,
    /// Name of the recall tool when it will be offered with this request (placeholders then say how to use it).
    pub recall_tool: Option<&'a str>,
    /// Tokens the caller will add to a rewritten request (the recall tools and note), kept free of the target.
    pub reserve: u64,
    /// Summaries (`None`: summaries are off; `summarize` and `hybrid` then prune).
    pub summaries: Option<Summaries<'a>>,
    /// Fraction of the window from which the next summary is wanted ahead of time.
    pub precompute_at: f64,
    /// Strict role order (chat completions, Responses): no `system` message added after the conversation began,
    /// no two user or assistant messages in a row the client did not send so (see `context::roles`).
    pub strict_roles: bool,
}

/// A tool call whose result is not in the rewritten request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrunedCall {
    /// The call id.
    pub call_id: String,
    /// The tool's name.
    pub tool_name: String,
    /// A one-line digest of its arguments.
    pub digest: String,
    /// Its step was folded: a line on the carrier lists it where it was (the note need not list it again).
    pub folded: bool,
}

/// What a rewrite did, kept with the session and shown by the admin API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompressionRecord {
    /// The strategy in force.
    pub strategy: &'static str,
    /// The stages that changed something: `cleared`, `pruned`, `folded`, `summarized`, `truncated`.
    pub stages: Vec<&'static str>,
    /// Messages the client sent.
    pub messages_before: usize,
    /// Messages sent upstream.
    pub messages_after: usize,
    /// Estimated (calibrated) tokens of the client's request.
    pub tokens_before: u64,
    /// Estimated (calibrated) tokens sent upstream, before the recall tools are added.
    pub tokens_after: u64,
    /// The model's context window.
    pub context_window: u64,
    /// Tool results replaced by a placeholder.
    pub cleared_results: usize,
    /// Past run loops cut to their user message and final reply.
    pub pruned_loops: usize,
    /// Run loops dropped for count or age.
    pub dropped_loops: usize,
    /// Messages dropped by the hard limit.
    pub dropped_messages: usize,
    /// Steps (a tool call with its results) of the run loops kept that were folded into a line each.
    pub folded_steps: usize,
    /// Messages covered by the summary sent (0: none).
    pub summary_upto: usize,
    /// Ids of the tool calls whose results are not sent (recallable).
    pub pruned_call_ids: Vec<String>,
    /// Where the rewrite cut (message indexes: clear, prune, drop loops, drop, summary, fold; then the clear
    /// cut's place in the order of use — last use, index — and the message that order was taken at): equal cuts
    /// on two turns mean an identical rewritten prefix.
    pub cuts: [usize; 9],
}

/// A rewritten request.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewrite<'a> {
    /// The messages to send upstream: the client's own where unchanged (borrowed, not copied), new ones where
    /// rewritten.
    pub messages: Vec<Cow<'a, Value>>,
    /// Where each of `messages` comes from (aligned with it): a dialect renders the client's own messages back
    /// from their originals.
    pub sources: Vec<Source>,
    /// Estimated tokens of `messages` and the request's tools, uncalibrated (what the counter says).
    pub estimate: u64,
    /// What was done.
    pub record: CompressionRecord,
    /// The calls the model may recall, oldest first.
    pub pruned: Vec<PrunedCall>,
    /// A summary of the first N messages that should be written (in the background) for this or later turns.
    pub wanted_summary: Option<usize>,
    /// Where in `messages` a note about the rewrite goes: right after the last message the rewrite changed (at
    /// the end of its unit), so everything before the cut stays byte-identical from one re-cut to the next.
    pub note_at: usize,
    /// With strict roles: the message the note is appended to (the last one ctxgate wrote before the cut).
    pub note_in: Option<usize>,
    /// The hard limit in the estimator's tokens (uncalibrated, like `estimate`): what is sent stays under it.
    pub hard_limit: u64,
    /// The billed input per turn (estimator's tokens at the full price) the cost model expected when the cuts
    /// were made, until the next re-cut (`context::cost`).
    pub forecast: Option<u64>,
}

impl Rewrite<'_> {
    /// The messages as owned values.
    pub fn owned_messages(&self) -> Vec<Value> {
        self.messages.iter().map(|m| m.as_ref().clone()).collect()
    }
}

/// The planner's decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan<'a> {
    /// Send the client's request as it is.
    Forward {
        /// Its estimated (calibrated) tokens; `None` when not counted (clearly below the threshold).
        tokens: Option<u64>,
        /// A summary of the first N messages that should be written ahead of the threshold.
        wanted_summary: Option<usize>,
    },
    /// Send `Rewrite::messages` instead.
    Rewrite(Box<Rewrite<'a>>),
    /// Even the smallest valid rewrite does not fit under the hard limit, or (`refused`) it would fit only by
    /// dropping whole messages or cutting the task to its head and tail (stage `truncated`) and
    /// `context.on_overflow` is `refuse`: refuse without calling upstream.
    Reject {
        /// Estimated tokens of the smallest rewrite; when `refused`, of the client's request.
        tokens: u64,
        /// The hard limit in tokens.
        limit: u64,
        /// The model's context window.
        window: u64,
        /// It would fit by dropping whole messages or cutting the task (stage `truncated`), which
        /// `context.on_overflow = "refuse"` forbids.
        refused: bool,
    },
}

/// Plans one request.
pub fn plan<'a>(
    input: &PlanInput<'a>,
    ctx: &ContextConfig,
    prune: &PruneConfig,
    counter: &TokenCounter,
) -> Plan<'a> {
    if input.strategy == Strategy::Off || input.messages.is_empty() {
        return Plan::Forward {
            tokens: None,
            wanted_summary: None,
        };
    }
    let ratio = model_ratio(input);
    let raw = |frac: f64| (frac * input.window as f64 / ratio) as u64;
    let lim = Limits {
        threshold: raw(ctx.threshold),
        // Not less the additions' reserve: it grows with the request's tool results, and a target that moves from
        // turn to turn would move the cuts of re-cuts already made (the prefix would change without a re-cut).
        target: raw(ctx.target),
        hard: raw(ctx.hard_limit),
        at_least: (ctx.clear_at_least.tokens(input.window) as f64 / ratio) as u64,
        max_messages: ctx.max_messages,
        messages_goal: ctx
            .max_messages
            .map_or(0, |m| (m as f64 * ctx.target / ctx.threshold) as usize),
        cache_price: ctx.cache_read_price,
    };
    let calibrated = |t: u64| (t as f64 * ratio).ceil() as u64;
    let base = 3 + input
        .tools
        .map_or(0, |t| counter.tools_tokens(input.encoding, t));
    let times = match input.first_seen {
        Some(t) if t.len() == input.messages.len() => t.to_vec(),
        _ => vec![input.now; input.messages.len()],
    };
    let seen = Seen {
        times,
        raw_hashes: input.hashes,
    };
    let mut model = Model::new(
        input.messages,
        seen,
        counter,
        input.encoding,
        prune,
        input.recall_tool,
        input
            .tools
            .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty())),
    );
    let summarizing = input.summaries.is_some()
        && matches!(input.strategy, Strategy::Summarize | Strategy::Hybrid);
    model.summaries = input.summaries.filter(|_| summarizing);
    model.clearing = !(summarizing && input.strategy == Strategy::Summarize);
    let (mut cuts, mut cost) = model.simulate(base, lim);
    if summarizing && input.strategy == Strategy::Hybrid && cuts.summary > 0 {
        // A summary earns its place only when it leaves the request smaller than pruning would.
        let summaries = model.summaries.take();
        let (pruned, pruned_cost) = model.simulate(base, lim);
        if pruned_cost <= cost {
            (cuts, cost) = (pruned, pruned_cost);
        } else {
            model.summaries = summaries;
        }
    }
    let mut wanted = None;
    if model.summaries.is_none() {
        // No summaries (off, or pruning does as well): nothing to ask for.
    } else if cuts.summary > 0 && model.ready_summary(cuts.summary).is_none() {
        // The summary this turn needs is not written yet: prune this time, and have it written.
        wanted = Some(cuts.summary);
        model.summaries = None;
        model.clearing = true;
        (cuts, cost) = model.simulate(base, lim);
    } else if cost as f64 >= raw(input.precompute_at) as f64 {
        wanted = precompute(&mut model, &cuts, base, lim);
    }
    if cuts == Cuts::default() {
        return Plan::Forward {
            tokens: Some(calibrated(cost)),
            wanted_summary: wanted,
        };
    }
    if cost > lim.hard {
        return Plan::Reject {
            tokens: calibrated(cost),
            limit: (ctx.hard_limit * input.window as f64) as u64,
            window: input.window,
            refused: false,
        };
    }
    let before = base + model.total();
    let too_many = lim.max_messages.is_some_and(|m| input.messages.len() > m);
    if before.saturating_sub(cost) < input.reserve && before <= lim.hard && !too_many {
        // The recall tools and note would cost more than the rewrite saves: send the client's request as it is.
        return Plan::Forward {
            tokens: Some(calibrated(before)),
            wanted_summary: wanted,
        };
    }
    build(
        input,
        &mut model,
        &cuts,
        calibrated(before),
        (cost, calibrated(cost), lim.hard),
        (ctx.hard_limit * input.window as f64) as u64,
        wanted,
    )
}

/// The calibration ratio the planner uses: quantized, so that the cut points stay still while the calibration
/// drifts a little.
fn model_ratio(input: &PlanInput<'_>) -> f64 {
    ((input.ratio * 20.0).round() / 20.0).clamp(0.5, 2.0)
}

/// The summary to write ahead of time: up to the bound of a summary made now, unless a ready one would already
/// bring the next rewrite down to the target.
fn precompute(model: &mut Model<'_, '_>, cuts: &Cuts, base: u64, lim: Limits) -> Option<usize> {
    let n = model.len();
    let bound = model.summary_bound(n);
    if !model.summarizable(cuts.summary, bound, model.newest_user_before(n)) {
        return None;
    }
    let ready = model.summaries.and_then(|s| {
        s.ready
            .iter()
            .filter(|(u, _)| *u > cuts.summary && *u <= bound)
            .max_by_key(|(u, _)| *u)
            .cloned()
    });
    if let Some((upto, msg)) = ready {
        let mut t = *cuts;
        t.summary = upto;
        t.summary_tokens = model.message_tokens(&msg);
        t.keep_user = model.newest_user_before(n);
        if model.cost(n, &t, base) <= lim.target {
            return None;
        }
    }
    Some(bound)
}

/// The rewrite's cost (uncalibrated and calibrated) and the hard limit (uncalibrated).
fn build<'a>(
    input: &PlanInput<'a>,
    model: &mut Model<'a, '_>,
    cuts: &Cuts,
    before: u64,
    (estimate, after, model_hard): (u64, u64, u64),
    limit: u64,
    wanted_summary: Option<usize>,
) -> Plan<'a> {
    let mut messages = Vec::with_capacity(input.messages.len());
    let mut sources = Vec::with_capacity(input.messages.len());
    let mut changed = false;
    let mut gone = Vec::new();
    let (mut cleared, mut dropped, mut folded) = (0, 0, 0);
    // The hard limit reached the task and cut it to its head and tail (no other stage did).
    let mut task_cut = false;
    let summary = model
        .ready_summary(cuts.summary)
        .filter(|_| cuts.summary > 0);
    // The note goes after the unit of the last message the cuts change (and after the summary).
    let last_changed = (0..input.messages.len())
        .rev()
        .find(|&i| model.mode(i, cuts) != Mode::Keep);
    let boundary = last_changed.map_or(0, |i| model.unit_end(i));
    let mut note_at = 0;
    let mut summary_at = None;
    for (i, original) in input.messages.iter().enumerate() {
        if i == cuts.summary {
            if let Some(s) = summary {
                summary_at = Some(messages.len());
                messages.push(Cow::Borrowed(s));
                sources.push(Source::Added);
                changed = true;
                note_at = note_at.max(messages.len());
            }
        }
        let mode = model.mode(i, cuts);
        task_cut |= mode == Mode::Pinned && model.unit_start(i) < cuts.drop;
        match model.take_rendered(i, mode, cuts) {
            Some(v) => {
                changed |= mode != Mode::Keep && *v != *original;
                cleared += usize::from(mode.cleared());
                messages.push(v);
                sources.push(Source::Client(i));
            }
            None => {
                changed = true;
                dropped += usize::from(mode == Mode::Dropped);
            }
        }
        if mode.recallable() {
            gone.push(i);
        }
        folded +=
            usize::from(mode == Mode::Folded && !crate::message::tool_calls(original).is_empty());
        if i < boundary {
            note_at = note_at.max(messages.len());
        }
    }
    if !changed {
        return Plan::Forward {
            tokens: Some(before),
            wanted_summary,
        };
    }
    let loop_count = |cut: usize| model.loops.iter().filter(|l| l.end <= cut).count();
    let dropped_loops = loop_count(cuts.drop_loops);
    let pruned_loops = loop_count(cuts.prune.max(cuts.drop_loops)) - dropped_loops;
    let pruned: Vec<PrunedCall> = model
        .loops
        .iter()
        .flat_map(|l| &l.tool_calls)
        .filter(|c| {
            // Its result left out, or its arguments cleared.
            c.result.is_some_and(|r| gone.binary_search(&r).is_ok())
                || gone.binary_search(&c.position).is_ok()
        })
        .map(|c| PrunedCall {
            call_id: c.id.to_string(),
            tool_name: c.name.to_string(),
            digest: digest(c.arguments, 80),
            folded: model.mode(c.position, cuts) == Mode::Folded,
        })
        .collect();
    let (mut estimate, mut after, mut note_in) = (estimate, after, None);
    if input.strict_roles {
        let arranged = roles::arrange(
            &mut messages,
            &mut sources,
            input.messages,
            summary_at,
            (
                note_at,
                (!pruned.is_empty() || dropped > 0) && input.recall_tool.is_some(),
            ),
            (model.counter(), input.encoding),
        );
        estimate = estimate.saturating_add_signed(arranged.delta);
        after = (estimate as f64 * model_ratio(input)).ceil() as u64;
        note_at = arranged.note_at;
        note_in = arranged.note_in;
        if estimate > model_hard {
            // The gaps' messages took the rewrite over the hard limit (a tiny window).
            return Plan::Reject {
                tokens: after,
                limit,
                window: input.window,
                refused: false,
            };
        }
    }
    let mut stages = Vec::new();
    if cleared > 0 {
        stages.push("cleared");
    }
    if pruned_loops + dropped_loops > 0 {
        stages.push("pruned");
    }
    if folded > 0 {
        stages.push("folded");
    }
    if summary.is_some() {
        stages.push("summarized");
    }
    if dropped > 0 || task_cut {
        stages.push("truncated");
    }
    let record = CompressionRecord {
        strategy: input.strategy.as_str(),
        stages,
        messages_before: input.messages.len(),
        messages_after: messages.len(),
        tokens_before: before,
        tokens_after: after,
        context_window: input.window,
        cleared_results: cleared,
        pruned_loops,
        dropped_loops,
        dropped_messages: dropped,
        folded_steps: folded,
        summary_upto: if summary.is_some() { cuts.summary } else { 0 },
        pruned_call_ids: pruned.iter().map(|p| p.call_id.clone()).collect(),
        cuts: [
            cuts.clear,
            cuts.prune,
            cuts.drop_loops,
            cuts.drop,
            cuts.summary,
            cuts.fold,
            cuts.clear_key.0,
            cuts.clear_key.1,
            cuts.use_at,
        ],
    };
    Plan::Rewrite(Box::new(Rewrite {
        messages,
        sources,
        estimate,
        record,
        pruned,
        wanted_summary,
        note_at,
        note_in,
        hard_limit: model_hard,
        forecast: Some(cuts.forecast).filter(|f| *f > 0),
    }))
}
