//! One request's plan as the gateway sends it and `ctxgate replay` reports it: from the client's body, its
//! model's budget and the summaries already written to what goes upstream (the client's bytes, a rewritten body,
//! or a refusal). Pure: reading the session, starting summaries and recording stay with the caller.

use super::body::RewrittenBody;
use super::plan::{plan, Plan, PlanInput, PrunedCall, Summaries};
use super::tokens::{Encoding, TokenCounter};
use super::CompressionRecord;
use crate::config::{Config, Strategy};
use crate::message::Source;
use serde_json::{Map, Value};

/// What the caller adds to a rewritten request (the recall tools and their note; see `recall::Offer`).
pub trait Additions {
    /// Name of the recall tool when it will be offered with this request (placeholders then say how to use it).
    fn tool_name(&self) -> Option<&str>;
    /// Tokens the additions may take in a request with `tool_results` tool results.
    fn reserve(&self, tool_results: usize) -> u64;
    /// Adds them to `body`, for the calls whose results are left out; whether anything was added.
    fn add(&self, body: &mut RewrittenBody<'_>, pruned: &[PrunedCall]) -> bool;
}

/// One request and the budget it is planned against.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The client's parsed body (every field; its `tools` are counted and kept).
    pub body: &'a Map<String, Value>,
    /// Its messages (neutral).
    pub messages: &'a [Value],
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
    /// Nothing: even the smallest valid rewrite is over the hard limit.
    Reject {
        /// Estimated tokens of the smallest rewrite.
        tokens: u64,
        /// The hard limit in tokens.
        limit: u64,
        /// The model's context window.
        window: u64,
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
/// ready summaries read). Every token covers at least one byte of the body and an image part's JSON is over half
/// its flat price, so a body under half the threshold (in bytes) cannot be over it. More messages than
/// `context.max_messages` are never clearly under, however few their bytes.
pub fn clearly_under(req: &Request<'_>, cfg: &Config) -> bool {
    let threshold = cfg.context.threshold * req.window as f64;
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

/// Plans `req`. `ready`: the summaries written so far as `(messages covered, summary message)`, or `None` when
/// this request may not use summaries.
pub fn plan_request<'a>(
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
    plan(&input, &cfg.context, &cfg.prune, counter)
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
    let task = req.messages.iter().position(crate::message::opens_turn);
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
/// dialect's rendering: the client's unchanged messages from its own parsed body).
pub fn render(
    req: &Request<'_>,
    plan: Plan<'_>,
    additions: &dyn Additions,
    counter: &TokenCounter,
    serialise: &Serialise<'_>,
) -> serde_json::Result<Decision> {
    let rw = match plan {
        Plan::Forward { tokens, .. } => {
            return Ok(Decision::Forward {
                estimate: tokens.map(|t| (t as f64 / req.ratio) as u64),
                client_tokens: tokens,
            })
        }
        Plan::Reject {
            tokens,
            limit,
            window,
        } => {
            return Ok(Decision::Reject {
                tokens,
                limit,
                window,
            })
        }
        Plan::Rewrite(rw) => *rw,
    };
    let encoding = req.encoding;
    let mut body = RewrittenBody::new_at(req.key, req.body, rw.messages, rw.sources);
    body.note_at = Some(rw.note_at);
    body.note_in = rw.note_in;
    body.strict_roles = req.strict_roles;
    // The additions are the recall tools (appended to the client's) and a note (a message of its own, or text
    // appended to the message `note_in`): the planner's estimate is corrected by counting just what ctxgate adds
    // rather than every message again.
    let ours = |b: &RewrittenBody<'_>| -> u64 {
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
    };
    let before = ours(&body);
    let plain = body.clone();
    let mut injected = additions.add(&mut body, &rw.pruned);
    let mut estimate = if injected {
        (rw.estimate + ours(&body)).saturating_sub(before)
    } else {
        rw.estimate
    };
    let hard = rw.hard_limit;
    if injected && estimate > hard && rw.estimate <= hard {
        // In a small window the recall tools and note may not fit beside the rewrite: send it without them.
        tracing::debug!(
            estimate,
            hard,
            "recall: tools not offered, they would pass the hard limit"
        );
        body = plain;
        injected = false;
        estimate = rw.estimate;
    }
    debug_assert_eq!(
        estimate,
        counter.request_tokens(encoding, &body.messages, body.fields.get("tools")),
        "the corrected estimate is a full recount"
    );
    let (bytes, messages_close) = serialise(&body)?;
    Ok(Decision::Rewrite(Box::new(Rendered {
        body: bytes,
        messages_close,
        estimate,
        record: rw.record,
        pruned: rw.pruned,
        injected,
        forecast: rw.forecast,
    })))
}
