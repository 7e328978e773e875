//! The plan stage: counts a chat request against its model's window and, when it is over budget, rewrites its
//! messages and offers the recall tools; otherwise the client's own bytes go upstream.

use super::ChatRequest;
use crate::app::AppState;
use crate::config::Strategy;
use crate::context::plan::Summaries;
use crate::context::tokens::Encoding;
use crate::context::{self, CompressionRecord, Plan, PlanInput, PrunedCall, RewrittenBody};
use crate::error::GatewayError;
use crate::recall::{self, Injection, Recallable};
use crate::session::runloop::is_system;
use crate::session::RequestMark;
use crate::summary;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use serde_json::Value;
use std::sync::Arc;

/// Request header choosing the strategy for one request.
pub const STRATEGY_HEADER: &str = "x-ctxgate-strategy";

/// What goes upstream.
pub struct Outgoing {
    /// The body to send.
    pub body: Bytes,
    /// For a rewritten body: the offset of the `]` closing its messages (recall rounds append there).
    pub messages_close: usize,
    /// Set when the messages were rewritten.
    pub rewrite: Option<Rewritten>,
    /// Estimated tokens of what is sent (uncalibrated), when counted; for calibration against `usage`.
    pub estimate: Option<u64>,
    /// Estimated (calibrated) tokens of the client's request, when counted.
    pub client_tokens: Option<u64>,
}

/// A rewritten request.
pub struct Rewritten {
    /// What the rewrite did.
    pub record: CompressionRecord,
    /// The calls whose results were left out.
    pub pruned: Vec<PrunedCall>,
    /// The recall tools were added (their calls must be answered by ctxgate).
    pub injected: bool,
}

/// The strategy for this request: the header's, else the config's. A header naming no strategy is a 400.
pub fn strategy(headers: &HeaderMap, default: Strategy) -> Result<Strategy, GatewayError> {
    let Some(v) = headers.get(STRATEGY_HEADER) else {
        return Ok(default);
    };
    v.to_str().ok().and_then(Strategy::parse).ok_or_else(|| {
        GatewayError::bad_request(format!(
            "header {STRATEGY_HEADER} must be one of off, prune, summarize, hybrid"
        ))
    })
}

/// Plans the request. `mark` is where its messages landed in the session (for first-seen times and summaries).
pub async fn plan_request(
    state: &Arc<AppState>,
    strategy: Strategy,
    chat: &ChatRequest,
    mark: Option<&RequestMark>,
    auth: Option<&HeaderValue>,
    now: i64,
) -> Result<Outgoing, GatewayError> {
    let cfg = &state.config;
    let forward = |estimate: Option<u64>, client_tokens: Option<u64>| Outgoing {
        body: chat.raw.clone(),
        messages_close: 0,
        rewrite: None,
        estimate,
        client_tokens,
    };
    let window = state.models.context_window(&chat.model);
    let ratio = state.counter.ratio(&chat.model);
    // Every token covers at least one byte of the body and an image part's JSON is over half its flat price, so
    // a body under half the threshold (in bytes) cannot be over it: no need to count.
    let threshold = cfg.context.threshold * window as f64;
    // With summaries on, from `precompute_at` the next summary may be wanted ahead of time.
    let precompute = match &state.summarizer {
        Some(_) => cfg.summary.precompute_at.min(cfg.context.threshold) * window as f64,
        None => threshold,
    };
    if strategy == Strategy::Off
        || (chat.raw.len() as f64) * 2.0 * ratio <= threshold.min(precompute)
    {
        return Ok(forward(None, None));
    }
    let messages = chat.messages();
    let aligned = mark.filter(|m| m.path.len() == messages.len());
    let summarizer = state
        .summarizer
        .as_ref()
        .filter(|_| matches!(strategy, Strategy::Summarize | Strategy::Hybrid))
        .zip(aligned);
    let mut ready = match summarizer {
        Some((_, m)) => summary::ready(&m.entry.compressions(), &m.path),
        None => Vec::new(),
    };
    let recall_ok = recall::can_inject(&chat.body, &cfg.recall).is_ok();
    let tool_results = messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
        .count();
    let encoding = Encoding::for_model(&chat.model);
    let pairs = |ready: &[(usize, Value, String)]| -> Vec<(usize, Value)> {
        ready.iter().map(|(u, m, _)| (*u, m.clone())).collect()
    };
    let plan_with = same_lifetime(|pairs| {
        let input = PlanInput {
            messages,
            tools: chat.body.get("tools"),
            first_seen: aligned.map(|m| m.first_seen.as_slice()),
            now,
            encoding,
            ratio,
            strategy,
            window,
            recall_tool: recall_ok.then_some(cfg.recall.tool_name.as_str()),
            // What the recall tools and note add, but never more than a tenth of a small window.
            reserve: if recall_ok {
                recall::reserve_tokens(&cfg.recall, tool_results).min(window / 10)
            } else {
                0
            },
            summaries: summarizer.map(|_| Summaries {
                keep_recent: cfg.summary.keep_recent,
                max_tokens: cfg.summary.max_tokens,
                ready: pairs,
            }),
            precompute_at: cfg.summary.precompute_at,
        };
        context::plan(&input, &cfg.context, &cfg.prune, &state.counter)
    });
    let (first_pairs, later_pairs);
    first_pairs = pairs(&ready);
    let mut decision = plan_with(&first_pairs);
    if let (Some((s, m)), Some(upto)) = (summarizer, wanted_summary(&decision)) {
        // A summary is wanted: have it written in the background. A request that is being pruned for want of it
        // may wait `summary.wait_ms` for it.
        // The job copies the history: built only once the summarizer is sure to start it.
        let precomputed = matches!(decision, Plan::Forward { .. });
        let make = || summary_job(m, messages, upto, &ready, auth, encoding, precomputed);
        let done = s.start_with(&m.entry.id, make, state.sessions.clone(), &state.tasks);
        let pruned_meanwhile =
            matches!(&decision, Plan::Rewrite(r) if !r.record.stages.contains(&"summarized"));
        if let (Some(mut done), true, true) = (done, pruned_meanwhile, cfg.summary.wait_ms > 0) {
            let wait = std::time::Duration::from_millis(cfg.summary.wait_ms);
            if tokio::time::timeout(wait, done.wait_for(|d| *d))
                .await
                .is_ok()
            {
                ready = summary::ready(&m.entry.compressions(), &m.path);
                later_pairs = pairs(&ready);
                decision = plan_with(&later_pairs);
            }
        }
    }
    let rw = match decision {
        Plan::Forward { tokens, .. } => {
            let raw = tokens.map(|t| (t as f64 / ratio) as u64);
            return Ok(forward(raw, tokens));
        }
        Plan::Reject {
            tokens,
            limit,
            window,
        } => {
            return Err(GatewayError::ContextLengthExceeded {
                message: format!(
                    "this conversation needs about {tokens} tokens even after ctxgate dropped all it could \
                     (system prompt and newest turn kept); the limit is {limit} tokens ({} of the model's \
                     {window}-token window, context.hard_limit)",
                    cfg.context.hard_limit
                ),
            })
        }
        Plan::Rewrite(rw) => *rw,
    };
    // The client's unchanged messages are serialised from its own parsed body, never copied.
    let mut body = RewrittenBody::new(&chat.body, rw.messages);
    let (counter, sent_before) = (&state.counter, body.messages.len());
    // The note goes into the first system message, or a new message right after it (first when there is none):
    // only that head and the tools change, so the planner's estimate is corrected by recounting them rather than
    // every message again.
    let head_len = body
        .messages
        .iter()
        .position(|m| is_system(m))
        .map_or(0, |i| i + 1);
    let head = |b: &RewrittenBody<'_>, len: usize| -> u64 {
        let msgs: u64 = counter
            .messages_tokens(encoding, &b.messages[..len])
            .iter()
            .sum();
        msgs + b
            .fields
            .get("tools")
            .map_or(0, |t| counter.tools_tokens(encoding, t))
    };
    let head_before = head(&body, head_len);
    let injected = inject(&mut body, &rw.pruned, state);
    let estimate = if injected {
        let added = body.messages.len() - sent_before;
        (rw.estimate + head(&body, head_len + added)).saturating_sub(head_before)
    } else {
        rw.estimate
    };
    debug_assert_eq!(
        estimate,
        counter.request_tokens(encoding, &body.messages, body.fields.get("tools")),
        "the corrected estimate is a full recount"
    );
    let (bytes, messages_close) = body
        .to_vec()
        .map_err(|e| GatewayError::Internal(format!("serialising the rewrite: {e}")))?;
    Ok(Outgoing {
        body: Bytes::from(bytes),
        messages_close,
        estimate: Some(estimate),
        client_tokens: Some(rw.record.tokens_before),
        rewrite: Some(Rewritten {
            record: rw.record,
            pruned: rw.pruned,
            injected,
        }),
    })
}

/// Gives a planning closure one lifetime for its summaries and its plan (they borrow the summaries).
fn same_lifetime<'x, F: Fn(&'x [(usize, Value)]) -> Plan<'x>>(f: F) -> F {
    f
}

fn wanted_summary(p: &Plan) -> Option<usize> {
    match p {
        Plan::Forward { wanted_summary, .. } => *wanted_summary,
        Plan::Rewrite(r) => r.wanted_summary,
        Plan::Reject { .. } => None,
    }
}

/// The job writing the summary of the first `upto` messages, from the newest ready summary before it.
fn summary_job(
    mark: &RequestMark,
    messages: &[Value],
    upto: usize,
    ready: &[(usize, Value, String)],
    auth: Option<&HeaderValue>,
    encoding: Encoding,
    precomputed: bool,
) -> summary::Job {
    summary::Job {
        entry: mark.entry.clone(),
        messages: Arc::new(messages[..upto].to_vec()),
        upto,
        upto_node: mark.path[upto - 1].clone(),
        previous: ready
            .iter()
            .filter(|(u, _, _)| *u < upto)
            .max_by_key(|(u, _, _)| *u)
            .map(|(u, _, t)| (*u, t.clone())),
        auth: auth.cloned(),
        precomputed,
        encoding,
    }
}

fn inject(body: &mut RewrittenBody<'_>, recallable: &[Recallable], state: &AppState) -> bool {
    match recall::inject(body, recallable, &state.config.recall) {
        Injection::Injected => true,
        Injection::Skipped(why) => {
            if !recallable.is_empty() {
                tracing::debug!(reason = why, "recall: tools not offered with this rewrite");
            }
            false
        }
    }
}
