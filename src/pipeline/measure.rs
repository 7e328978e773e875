//! What the chat pipeline tells the metrics: rewrites, upstream failures, a finished turn's tokens. Translates the
//! pipeline's own types into metric labels; the request timer (`metrics::RequestTimer`) records the rest.

use crate::app::{AppState, Billed, Money, Rates};
use crate::config::Strategy;
use crate::context::CompressionRecord;
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::{
    CacheMissCause, RequestTimer, RewriteOutcome, RewriteStrategy, Route, TokenCounts,
    UpstreamErrorClass,
};
use crate::relay::RelayOutcome;

fn strategy_label(s: Strategy) -> RewriteStrategy {
    match s {
        Strategy::Off => RewriteStrategy::Off,
        Strategy::Prune => RewriteStrategy::Prune,
        Strategy::Summarize => RewriteStrategy::Summarize,
        Strategy::Hybrid => RewriteStrategy::Hybrid,
    }
}

/// A rewrite happened: counted under its deepest stage, with the tokens it removed.
pub(super) fn rewrite(
    state: &AppState,
    dialect: Dialect,
    strategy: Strategy,
    model: &str,
    r: &CompressionRecord,
) {
    if let Some(outcome) = RewriteOutcome::deepest(r.stages.iter().copied()) {
        let saved = r.tokens_before.saturating_sub(r.tokens_after);
        state
            .metrics
            .rewrite(dialect, strategy_label(strategy), outcome, model, saved);
    }
}

/// The plan stage failed; a refusal (`context_length_exceeded`) is a rewrite outcome.
pub(super) fn plan_failed(
    state: &AppState,
    dialect: Dialect,
    strategy: Strategy,
    model: &str,
    e: &GatewayError,
) {
    if matches!(e, GatewayError::ContextLengthExceeded { .. }) {
        let strategy = strategy_label(strategy);
        state
            .metrics
            .rewrite(dialect, strategy, RewriteOutcome::Rejected, model, 0);
    }
}

/// Sending upstream failed before any response.
pub(super) fn send_failed(
    state: &AppState,
    dialect: Dialect,
    timer: &mut Option<RequestTimer>,
    e: &GatewayError,
) {
    if let Some(t) = timer.as_mut() {
        t.upstream_ended();
    }
    let class = match e {
        GatewayError::UpstreamTimeout(_) => UpstreamErrorClass::Timeout,
        _ => UpstreamErrorClass::Unreachable,
    };
    state.metrics.upstream_error(Route::Chat, dialect, class);
}

/// What the pipeline knew about a turn's prompt tokens before it went upstream.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PlannedTokens {
    /// The request was rewritten: the client's tokens (calibrated estimate) differ from what was sent.
    pub rewritten_from: Option<u64>,
    /// Uncalibrated estimate of what was sent, when counted.
    pub sent_estimate: Option<u64>,
}

/// What the upstream reported a turn used, summed over its recall rounds: read from the answers' `usage` once per
/// turn, for the metrics, the money and the cache analysis.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reported {
    pub prompt: Option<u64>,
    pub cached: Option<u64>,
    pub cache_write: Option<u64>,
    pub output: Option<u64>,
}

impl Reported {
    pub(super) fn of(outcome: &RelayOutcome) -> Reported {
        let f = outcome.reply.upstream_figures();
        Reported {
            prompt: f.prompt,
            cached: f.cached,
            cache_write: f.cache_write,
            output: f.output,
        }
    }
}

/// A turn ended: its tokens (successful answers only) and upstream failures; `reported` what the upstream said it
/// used.
#[expect(
    clippy::too_many_arguments,
    reason = "a turn's figures, each from its own stage"
)]
pub(super) fn turn(
    state: &AppState,
    dialect: Dialect,
    model: &str,
    status: http::StatusCode,
    planned: PlannedTokens,
    outcome: &RelayOutcome,
    reported: &Reported,
    money: Option<Money>,
) {
    let m = &state.metrics;
    if let Some(class) = UpstreamErrorClass::of_status(status.as_u16()) {
        m.upstream_error(Route::Chat, dialect, class);
    }
    if outcome.upstream_error.is_some() {
        m.upstream_error(Route::Chat, dialect, UpstreamErrorClass::Interrupted);
    }
    if !status.is_success() {
        return;
    }
    // The upstream's own count (every recall round's) when it reported one; otherwise our calibrated estimate.
    let sent = reported.prompt.or_else(|| {
        planned
            .sent_estimate
            .map(|e| state.counter.calibrated(model, e))
    });
    m.tokens(
        model,
        dialect,
        &TokenCounts {
            client_prompt: planned.rewritten_from.or(sent),
            upstream_prompt: sent,
            upstream_cached: reported.cached,
            completion: outcome.reply.completion_tokens(),
        },
    );
    if let Some(money) = money {
        m.money(model, dialect, money.spent, money.saved);
    }
}

/// A turn's money at `rates`: the usage the upstream reported (every recall round's) and the `removed` prompt
/// tokens of its rewrite; `None` when the upstream reported no usage.
pub(super) fn money(rates: &Rates, reported: &Reported, removed: u64) -> Option<Money> {
    let (prompt, output) = (reported.prompt, reported.output);
    if prompt.is_none() && output.is_none() {
        return None;
    }
    let billed = Billed {
        prompt: prompt.unwrap_or(0),
        cached: reported.cached.unwrap_or(0),
        cache_write: reported.cache_write.unwrap_or(0),
        output: output.unwrap_or(0),
    };
    Some(Money::of(rates, &billed, removed))
}

/// A turn's missed prompt-cache tokens, by cause (`cache_miss`), counted against the model that answered.
pub(super) fn cache_miss(
    state: &AppState,
    dialect: Dialect,
    model: &str,
    report: &super::cache_miss::CacheReport,
) {
    let Some(cause) = report.cause.and_then(CacheMissCause::parse) else {
        return;
    };
    state
        .metrics
        .cache_miss(model, dialect, cause, report.missed_tokens);
}
