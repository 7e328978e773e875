//! One request's plan as the gateway sends it and `ctxgate replay` reports it: from the client's body, its
//! model's budget and the summaries already written to what goes upstream (the client's bytes, a rewritten body,
//! or a refusal). Pure: reading the session, starting summaries and recording stay with the caller.

use super::body::RewrittenBody;
use super::plan::{plan, Plan, PlanInput, PrunedCall, Rewrite, Summaries};
use super::tokens::{Encoding, TokenCounter};
use super::CompressionRecord;
use crate::config::{Config, OnOverflow, Strategy};
use crate::message::Source;
use serde_json::{Map, Value};

/// What the caller adds to a rewritten request (the recall tools and their note; see `recall::Offer`).
pub trait Additions {
    /// Name of the recall tool when it will be offered with this request (placeholders then say how to use it).
    fn tool_name(&self) -> Option<&str>;
    /// Tokens the additions may take in a request with `tool_results` tool results.
    fn reserve(&self, tool_results: usize) -> u64;
    /// Adds them to `body`, for the calls whose results are left out and the `dropped` messages the hard limit
    /// left out; whether anything was added.
    fn add(&self, body: &mut RewrittenBody<'_>, pruned: &[PrunedCall], dropped: usize) -> bool;
}

/// One request and the budget it is planned against.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The client's parsed body (every field; its `tools` are counted and kept).
    pub body: &'a Map<String, Value>,
    /// Its messages (neutral).
    pub messages: &'a [Value],
    /// The xxh3 of each message's bytes as sent, when `messages` are the client's own elements (see
    /// `PlanInput::hashes`).
    pub hashes: Option<&'a [u64]>,
    /// The body field holding the conversation (`messages`; `input` for the Responses API).
    pub key: &'static str,
    /// Length of the client's body in bytes.
    pub raw_len: usize,
    /// The tokenizer of the model.
    pub encoding: Encoding,
    /// The model's context window in tokens.
    pub window: u64,
    /// Calibration: real tokens per estimated token for this model (1.0 when unknown).
    pub ratio: f64,
    /// The strategy in force.
    pub strategy: Strategy,
    /// Unix seconds each message was first seen (aligned with `messages`), when known.
    pub first_seen: Option<&'a [i64]>,
    /// Unix seconds now.
    pub now: i64,
    /// Summaries are written for this deployment (whether or not this request may use them).
    pub summarizer: bool,
    /// The dialect wants strict role order (see `context::roles`): chat completions and Responses.
    pub strict_roles: bool,
}

/// What goes upstream.
#[derive(Debug)]
pub enum Decision {
    /// The client's own bytes.
    Forward {
        /// Estimated tokens (uncalibrated), when counted.
        estimate: Option<u64>,
        /// Estimated (calibrated) tokens of the client's request, when counted.
        client_tokens: Option<u64>,
    },
    /// A rewritten body.
    Rewrite(Box<Rendered>),
    /// Nothing: even the smallest valid rewrite is over the hard limit, or (`refused`) it would fit only by
    /// dropping whole messages and `context.on_overflow` is `refuse`.
    Reject {
        /// Estimated tokens of the smallest rewrite; when `refused`, of the client's request.
        tokens: u64,
        /// The hard limit in tokens.
        limit: u64,
        /// The model's context window.
        window: u64,
        /// Refused by `context.on_overflow = "refuse"` (see `Plan::Reject`).
        refused: bool,
    },
}

/// A rewritten request, serialised.
#[derive(Debug)]
pub struct Rendered {
    /// The body to send.
    pub body: Vec<u8>,
    /// The offset of the `]` closing its messages (recall rounds append there).
    pub messages_close: usize,
    /// Estimated tokens (uncalibrated) of `body`: messages and tools, additions included.
    pub estimate: u64,
    /// What the rewrite did.
    pub record: CompressionRecord,
    /// The calls whose results were left out.
    pub pruned: Vec<PrunedCall>,
    /// The additions (recall tools and note) were made.
    pub injected: bool,
    /// The billed input per turn the cost model expected from these cuts (see `Rewrite::forecast`).
    pub forecast: Option<u64>,
}

/// The request is clearly under every point at which planning could change it: it need not be counted (nor the
/// ready summaries read), nor offered the recall tools. Every token covers at least one byte of the body and an image part's JSON is over half
/// its flat price, so a body under half the threshold (in bytes) cannot be over it. More messages than
/// `context.max_messages` are never clearly under, however few their bytes.
pub fn clearly_under(req: &Request<'_>, cfg: &Config) -> bool {
    // From `recall.offer_at` of the threshold the recall tools are offered with the client's own messages.
    let threshold =
        (cfg.context.threshold * req.window as f64).min(offer_from(cfg) * req.window as f64);
    // With summaries on, from `precompute_at` the next summary may be wanted ahead of time.
    let precompute = if req.summarizer {
        cfg.summary.precompute_at.min(cfg.context.threshold) * req.window as f64
    } else {
        threshold
    };
    let too_many = cfg
        .context
        .max_messages
        .is_some_and(|m| req.messages.len() > m);
    req.strategy == Strategy::Off
        || (!too_many && (req.raw_len as f64) * 2.0 * req.ratio <= threshold.min(precompute))
}

/// Decides the cuts for `req` (the pure half of `pipeline::plan_request`, shared with `ctxgate replay`; [`render`]
/// makes the body). `ready`: the summaries written so far as `(messages covered, summary message)`, or `None` when
/// this request may not use summaries. Tools that never flicker: when the additions would take a rewrite past the
/// hard limit, it is cut deeper (planned again with the hard limit lowered by what they take) rather than sent
/// without them, so the tools a session's requests carry stay the same from turn to turn.
pub fn plan_cuts<'a>(
    req: &Request<'a>,
    ready: Option<&'a [(usize, Value)]>,
    cfg: &Config,
    additions: &'a dyn Additions,
    counter: &TokenCounter,
) -> Plan<'a> {
    if clearly_under(req, cfg) {
        return Plan::Forward {
            tokens: None,
            wanted_summary: None,
        };
    }
    let tool_results = req
        .messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
        .count();
    let input = PlanInput {
        messages: req.messages,
        hashes: req.hashes,
        tools: req.body.get("tools"),
        first_seen: req.first_seen,
        now: req.now,
        encoding: req.encoding,
        ratio: req.ratio,
        strategy: req.strategy,
        window: req.window,
        recall_tool: additions.tool_name(),
        // What the additions take, but never more than a tenth of a small window.
        reserve: additions.reserve(tool_results).min(req.window / 10),
        summaries: ready.map(|ready| Summaries {
            keep_recent: cfg.summary.keep_recent,
            max_tokens: cfg.summary.max_tokens,
            ready,
        }),
        precompute_at: cfg.summary.precompute_at,
        strict_roles: req.strict_roles,
    };
    // Falling back takes what refusing would refuse (the pipeline then plans it for the fallback model).
    let refuse = matches!(
        cfg.context.on_overflow,
        OnOverflow::Refuse | OnOverflow::Fallback
    );
    let mut planned = plan(&input, &cfg.context, &cfg.prune, counter);
    let mut ctx = cfg.context.clone();
    // A request that would be forwarded with the tools offered, but that they would take past the hard limit: cut
    // for them (planned with the hard limit lowered by what they take) rather than send it without them.
    if let Plan::Forward {
        tokens: Some(t), ..
    } = planned
    {
        if let Some((o, hard)) = offer(req, t, cfg, additions, counter) {
            if o.estimate > hard && hard > 0 {
                // What the tools take; the messages must leave that much room under the hard limit.
                let tools = o.estimate.saturating_sub(t);
                ctx.hard_limit *= (hard as f64 - tools as f64 - 1.0).max(0.0) / hard as f64;
                match plan(&input, &ctx, &cfg.prune, counter) {
                    // Refusing overflow: a request that fits is not cut into for the tools (it goes without them).
                    Plan::Rewrite(deeper) if refuse && drops(&deeper) => {}
                    Plan::Rewrite(mut deeper) => {
                        deeper.hard_limit = hard;
                        planned = Plan::Rewrite(deeper);
                    }
                    Plan::Forward { .. } | Plan::Reject { .. } => {}
                }
            }
        }
    }
    // Each pass lowers the hard limit by what the additions took past it; a few passes settle it (the note grows
    // by a line per call the deeper cut leaves out).
    for _ in 0..4 {
        let Plan::Rewrite(rw) = &planned else {
            break;
        };
        let added = with_additions(req, rw, additions, counter);
        if !added.injected || added.estimate <= rw.hard_limit || rw.hard_limit == 0 {
            break;
        }
        let over = added.estimate - rw.hard_limit;
        let hard = rw.hard_limit as f64;
        ctx.hard_limit *= (hard - over as f64 - 1.0).max(0.0) / hard;
        match plan(&input, &ctx, &cfg.prune, counter) {
            // Refusing overflow: no messages dropped for the additions (`render` sends the rewrite without them).
            Plan::Rewrite(deeper) if refuse && drops(&deeper) && !drops(rw) => break,
            Plan::Rewrite(mut deeper) => {
                // The request's own hard limit stays the one it is checked against.
                deeper.hard_limit = rw.hard_limit;
                planned = Plan::Rewrite(deeper);
            }
            // No deeper cut fits: `render` sends the rewrite without the additions.
            Plan::Forward { .. } | Plan::Reject { .. } => break,
        }
    }
    match planned {
        // Whole messages would be dropped: refused as the provider would (nothing is sent upstream).
        Plan::Rewrite(rw) if refuse && drops(&rw) => Plan::Reject {
            tokens: rw.record.tokens_before,
            limit: (cfg.context.hard_limit * req.window as f64) as u64,
            window: req.window,
            refused: true,
        },
        other => other,
    }
}

/// Whether a rewrite drops whole messages or cuts the task to its head and tail at the hard limit (its stage
/// `truncated`).
fn drops(rw: &Rewrite<'_>) -> bool {
    rw.record.stages.contains(&"truncated")
}

/// Tokens a summary of the first `upto` messages may take so that the rewrite using it reaches `context.target`:
/// the target, less what stays beside the summary (the tools, the system messages, the task, the messages from
/// `upto` on) and the additions' reserve; at least a quarter of `summary.max_tokens`, at most all of it.
pub fn summary_budget(
    req: &Request<'_>,
    upto: usize,
    additions: &dyn Additions,
    cfg: &Config,
    counter: &TokenCounter,
) -> u64 {
    let target = (cfg.context.target * req.window as f64 / req.ratio.max(0.1)) as u64;
    let task = super::task::task_index(req.messages);
    let kept: Vec<&Value> = req
        .messages
        .iter()
        .enumerate()
        .filter(|(i, m)| *i >= upto || Some(*i) == task || crate::message::is_system(m))
        .map(|(_, m)| m)
        .collect();
    let tool_results = req
        .messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
        .count();
    let reserve = additions.reserve(tool_results).min(req.window / 10);
    let beside = counter.request_tokens(req.encoding, &kept, req.body.get("tools")) + reserve;
    let max = cfg.summary.max_tokens;
    target.saturating_sub(beside).clamp(max / 4, max)
}

/// The summary of the first N messages `plan` asks to have written.
pub fn wanted_summary(plan: &Plan<'_>) -> Option<usize> {
    match plan {
        Plan::Forward { wanted_summary, .. } => *wanted_summary,
        Plan::Rewrite(r) => r.wanted_summary,
        Plan::Reject { .. } => None,
    }
}

/// A dialect's serialisation of a rewritten body: its bytes and the offset of the `]` closing its messages.
pub type Serialise<'s> = dyn Fn(&RewrittenBody<'_>) -> serde_json::Result<(Vec<u8>, usize)> + 's;

/// What `plan` (for `req`) sends upstream: a rewrite gets the additions and is serialised by `serialise` (the
/// dialect's rendering: the client's unchanged messages from its own parsed body). A request forwarded at or over
/// `recall.offer_at` of the threshold is sent with the additions' tools too (its messages untouched; stage
/// `offered`), so that the tools are already in the prompt cache when the first rewrite comes.
pub fn render(
    req: &Request<'_>,
    plan: Plan<'_>,
    (cfg, additions): (&Config, &dyn Additions),
    counter: &TokenCounter,
    serialise: &Serialise<'_>,
) -> serde_json::Result<Decision> {
    let rw = match plan {
        Plan::Forward { tokens, .. } => {
            if let Some(offered) = tokens.and_then(|t| offered(req, t, cfg, additions, counter)) {
                let (bytes, messages_close) = serialise(&offered.body)?;
                return Ok(Decision::Rewrite(Box::new(Rendered {
                    body: bytes,
                    messages_close,
                    estimate: offered.estimate,
                    record: offered.record,
                    pruned: Vec::new(),
                    injected: true,
                    forecast: None,
                })));
            }
            return Ok(Decision::Forward {
                estimate: tokens.map(|t| (t as f64 / req.ratio) as u64),
                client_tokens: tokens,
            });
        }
        Plan::Reject {
            tokens,
            limit,
            window,
            refused,
        } => {
            return Ok(Decision::Reject {
                tokens,
                limit,
                window,
                refused,
            })
        }
        Plan::Rewrite(rw) => *rw,
    };
    let mut added = with_additions(req, &rw, additions, counter);
    if added.injected && added.estimate > rw.hard_limit {
        // Even the deepest cut leaves no room for the recall tools and note (a tiny window; `plan_cuts` cuts deeper
        // for them whenever it can): the tools without the note (the placeholders still name the recall tool),
        // else neither.
        let mut tools_only = Rewrite {
            pruned: Vec::new(),
            ..rw.clone()
        };
        // (the record sent is `rw`'s: this one only says that no note is wanted)
        tools_only.record.dropped_messages = 0;
        added = with_additions(req, &tools_only, additions, counter);
        if added.estimate > rw.hard_limit {
            tracing::debug!(
                estimate = added.estimate,
                hard = rw.hard_limit,
                "recall: tools not offered, they would pass the hard limit"
            );
            added = Added {
                body: rewritten_body(req, &rw),
                injected: false,
                estimate: rw.estimate,
            };
        }
    }
    debug_assert_eq!(
        added.estimate,
        counter.request_tokens(
            req.encoding,
            &added.body.messages,
            added.body.fields.get("tools")
        ),
        "the corrected estimate is a full recount"
    );
    let (bytes, messages_close) = serialise(&added.body)?;
    Ok(Decision::Rewrite(Box::new(Rendered {
        body: bytes,
        messages_close,
        estimate: added.estimate,
        record: rw.record,
        pruned: rw.pruned,
        injected: added.injected,
        forecast: rw.forecast,
    })))
}

/// A body with the additions made (or not).
struct Added<'b> {
    body: RewrittenBody<'b>,
    /// The additions were made.
    injected: bool,
    /// Estimated tokens (uncalibrated) of `body`.
    estimate: u64,
}

/// The rewrite's body, before the additions.
fn rewritten_body<'b>(req: &Request<'b>, rw: &Rewrite<'b>) -> RewrittenBody<'b> {
    let mut body =
        RewrittenBody::new_at(req.key, req.body, rw.messages.clone(), rw.sources.clone());
    body.note_at = Some(rw.note_at);
    body.note_in = rw.note_in;
    body.strict_roles = req.strict_roles;
    body
}

/// The rewrite's body with the additions, and its estimate: the planner's, corrected by counting just what ctxgate
/// adds (the recall tools appended to the client's; a note as a message of its own, or as text appended to the
/// message `note_in`) rather than every message again.
fn with_additions<'b>(
    req: &Request<'b>,
    rw: &Rewrite<'b>,
    additions: &dyn Additions,
    counter: &TokenCounter,
) -> Added<'b> {
    let mut body = rewritten_body(req, rw);
    let before = additions_tokens(&body, req.encoding, counter);
    let injected = additions.add(&mut body, &rw.pruned, rw.record.dropped_messages);
    let estimate = if injected {
        (rw.estimate + additions_tokens(&body, req.encoding, counter)).saturating_sub(before)
    } else {
        rw.estimate
    };
    Added {
        body,
        injected,
        estimate,
    }
}

/// Tokens of what ctxgate adds to `body`: the tools (all of them), the messages it added, the note's carrier.
fn additions_tokens(b: &RewrittenBody<'_>, encoding: Encoding, counter: &TokenCounter) -> u64 {
    let tools = b
        .fields
        .get("tools")
        .map_or(0, |t| counter.tools_tokens(encoding, t));
    let added: u64 = b
        .messages
        .iter()
        .zip(&b.sources)
        .filter(|(_, s)| **s == Source::Added)
        .map(|(m, _)| counter.message_tokens(encoding, m))
        .sum();
    let carrier = b
        .note_in
        .and_then(|k| b.messages.get(k).zip(b.sources.get(k)))
        .filter(|(_, s)| **s != Source::Added)
        .map_or(0, |(m, _)| counter.message_tokens(encoding, m));
    tools + added + carrier
}

/// The client's request with the additions' tools, when it is forwarded at `tokens` (calibrated) at or over
/// `recall.offer_at` of the threshold, has tools of its own, the additions allow it, and it stays under the hard
/// limit with them.
struct Offered<'b> {
    body: RewrittenBody<'b>,
    estimate: u64,
    record: CompressionRecord,
}

/// The request forwarded with the additions' tools (stage `offered`), when it fits under the hard limit.
fn offered<'b>(
    req: &Request<'b>,
    tokens: u64,
    cfg: &Config,
    additions: &dyn Additions,
    counter: &TokenCounter,
) -> Option<Offered<'b>> {
    offer(req, tokens, cfg, additions, counter)
        .and_then(|(o, hard)| (o.estimate <= hard).then_some(o))
}

/// The request with the additions' tools appended, and the hard limit it must fit under; `None` when the tools are
/// not offered to it (under `recall.offer_at`, recall off, or no tools of the client's own).
fn offer<'b>(
    req: &Request<'b>,
    tokens: u64,
    cfg: &Config,
    additions: &dyn Additions,
    counter: &TokenCounter,
) -> Option<(Offered<'b>, u64)> {
    // Only beside the client's own tools: a request without any is not turned into a tool-using one before a
    // rewrite needs it.
    let has_tools = req
        .body
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if (tokens as f64) < offer_from(cfg) * req.window as f64
        || additions.tool_name().is_none()
        || !has_tools
    {
        return None;
    }
    let ratio = req.ratio.max(0.1);
    let rw = Rewrite {
        messages: req
            .messages
            .iter()
            .map(std::borrow::Cow::Borrowed)
            .collect(),
        sources: (0..req.messages.len()).map(Source::Client).collect(),
        estimate: {
            // keyed as the plan keys them: the counts it remembered for this request are one lookup
            let (keys, each) =
                crate::context::usage::Usage::prefix_hashes(req.messages, req.hashes, counter);
            counter.request_tokens_keyed(
                req.encoding,
                req.messages,
                (&keys, &each),
                req.body.get("tools"),
            )
        },
        record: CompressionRecord {
            strategy: req.strategy.as_str(),
            stages: vec!["offered"],
            messages_before: req.messages.len(),
            messages_after: req.messages.len(),
            tokens_before: tokens,
            tokens_after: tokens,
            context_window: req.window,
            cleared_results: 0,
            pruned_loops: 0,
            dropped_loops: 0,
            dropped_messages: 0,
            folded_steps: 0,
            summary_upto: 0,
            pruned_call_ids: Vec::new(),
            cuts: [0; 9],
        },
        pruned: Vec::new(),
        wanted_summary: None,
        note_at: 0,
        note_in: None,
        hard_limit: (cfg.context.hard_limit * req.window as f64 / ratio) as u64,
        forecast: None,
    };
    let added = with_additions(req, &rw, additions, counter);
    added.injected.then(|| {
        let hard = rw.hard_limit;
        let offered = Offered {
            body: added.body,
            estimate: added.estimate,
            record: rw.record,
        };
        (offered, hard)
    })
}

/// Fraction of the window from which the recall tools are offered (`recall.offer_at` of the threshold; never
/// when recall is off).
fn offer_from(cfg: &Config) -> f64 {
    if cfg.recall.enabled {
        cfg.recall.offer_at * cfg.context.threshold
    } else {
        f64::INFINITY
    }
}
