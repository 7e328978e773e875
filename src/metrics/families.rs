//! The metric families, one constructor each: its name, help and labels beside the label combinations resolved
//! at start-up (`possible`). `Metrics::new` registers them all in one registry.

use super::labels::{
    CacheResult, DialectLabel, HookOutcome, RecallOutcome, RecallTool, RejectReason, ReloadOutcome,
    RewriteOutcome, RewriteStrategy, Route, StatusClass, SummaryOutcome, UnmanagedReason,
    UpstreamErrorClass,
};
use super::models::TokenFamilies;
use super::names::*;
use super::possible::{self, When};
use super::series::{self, Series};
use super::LATENCY_BUCKETS;
use prometheus::core::Collector;
use prometheus::{
    CounterVec, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry,
};

/// The values of the labels shared by several families, in the order their series are resolved in.
pub(super) struct Lists {
    routes: Vec<&'static str>,
    dialects: Vec<&'static str>,
}

impl Lists {
    pub fn new() -> Lists {
        Lists {
            routes: values(Route::ALL, Route::as_str),
            dialects: values(DialectLabel::ALL, DialectLabel::as_str),
        }
    }
}

fn register<C: Collector + Clone + 'static>(r: &Registry, c: C) -> prometheus::Result<C> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

pub(super) fn counters(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    register(r, IntCounterVec::new(Opts::new(name, help), labels)?)
}

pub(super) fn histograms(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    register(r, HistogramVec::new(opts, labels)?)
}

pub(super) fn histogram(r: &Registry, name: &str, help: &str) -> prometheus::Result<Histogram> {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    register(r, Histogram::with_opts(opts)?)
}

pub(super) fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    register(r, IntGauge::new(name, help)?)
}

pub(super) fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    register(r, IntCounter::new(name, help)?)
}

/// The series of every combination of `lists`, all created now (families without rare or impossible ones).
fn resolve<T>(lists: &[&[&'static str]], with: impl Fn(&[&str]) -> T) -> Vec<T> {
    series::combos(lists).iter().map(|c| with(c)).collect()
}

fn values<L: Copy>(all: &[L], f: fn(L) -> &'static str) -> Vec<&'static str> {
    all.iter().map(|l| f(*l)).collect()
}

/// A counter family with one label whose every value is created at start-up.
fn outcome_counters<L: Copy>(
    r: &Registry,
    (name, help, label): (&str, &str, &str),
    all: &[L],
    f: fn(L) -> &'static str,
) -> prometheus::Result<Vec<IntCounter>> {
    let family = counters(r, name, help, &[label])?;
    Ok(resolve(&[&values(all, f)], |l| family.with_label_values(l)))
}

/// A counter family over `lists`, its series resolved as `when` says.
fn counter_series(
    r: &Registry,
    (name, help, labels): (&str, &str, &[&str]),
    lists: &[&[&'static str]],
    when: fn(&[&str]) -> When,
) -> prometheus::Result<Series<IntCounter>> {
    let family = counters(r, name, help, labels)?;
    Ok(Series::new(lists, when, move |l| {
        family.with_label_values(l)
    }))
}

/// A latency histogram family over `lists`, its series resolved as `when` says.
fn histogram_series(
    r: &Registry,
    (name, help, labels): (&str, &str, &[&str]),
    lists: &[&[&'static str]],
    when: fn(&[&str]) -> When,
) -> prometheus::Result<Series<Histogram>> {
    let family = histograms(r, name, help, labels)?;
    Ok(Series::new(lists, when, move |l| {
        family.with_label_values(l)
    }))
}

// Requests: counts, latencies, refusals.

pub(super) fn requests(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntCounter>> {
    let classes = values(StatusClass::ALL, StatusClass::as_str);
    let stream_flags: &[&'static str] = &["false", "true"];
    counter_series(
        r,
        (
            REQUESTS_TOTAL,
            "Finished requests by route class (chat, passthrough, admin), dialect (chat, anthropic, responses, gemini; none outside a conversation), status class and stream flag.",
            &["route", "dialect", "status", "stream"],
        ),
        &[&l.routes, &l.dialects, &classes, stream_flags],
        possible::request,
    )
}

pub(super) fn in_flight(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntGauge>> {
    let family = register(
        r,
        IntGaugeVec::new(
            Opts::new(
                REQUESTS_IN_FLIGHT,
                "Requests being handled, streams included until their last byte.",
            ),
            &["route", "dialect"],
        )?,
    )?;
    Ok(Series::new(
        &[&l.routes, &l.dialects],
        possible::route_and_dialect,
        move |l| family.with_label_values(l),
    ))
}

pub(super) fn duration(r: &Registry, l: &Lists) -> prometheus::Result<Series<Histogram>> {
    histogram_series(
        r,
        (
            REQUEST_DURATION_SECONDS,
            "Time from a request's arrival to the end of its response.",
            &["route", "dialect"],
        ),
        &[&l.routes, &l.dialects],
        possible::route_and_dialect,
    )
}

pub(super) fn upstream(r: &Registry, l: &Lists) -> prometheus::Result<Series<Histogram>> {
    histogram_series(
        r,
        (
            UPSTREAM_DURATION_SECONDS,
            "Time spent waiting on the upstream, from sending the request to its last byte (all recall rounds).",
            &["route", "dialect"],
        ),
        &[&l.routes, &l.dialects],
        possible::upstream_route,
    )
}

pub(super) fn overhead(r: &Registry, l: &Lists) -> prometheus::Result<Series<Histogram>> {
    histogram_series(
        r,
        (
            OVERHEAD_SECONDS,
            "Time ctxgate itself added to a request that went upstream: total duration minus upstream wait.",
            &["route", "dialect"],
        ),
        &[&l.routes, &l.dialects],
        possible::upstream_route,
    )
}

pub(super) fn first_byte(r: &Registry, l: &Lists) -> prometheus::Result<Series<Histogram>> {
    histogram_series(
        r,
        (
            STREAM_FIRST_BYTE_SECONDS,
            "Time from a streamed conversation request's arrival to the first byte of the upstream's answer, by dialect.",
            &["dialect"],
        ),
        &[&l.dialects],
        possible::conversation_only,
    )
}

pub(super) fn rejected(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntCounter>> {
    let reasons = values(RejectReason::ALL, RejectReason::as_str);
    counter_series(
        r,
        (
            REQUESTS_REJECTED_TOTAL,
            "Requests refused before being handled, by route, dialect and reason (overloaded: beyond server.max_in_flight, 503; body_timeout: body not received within server.body_read_timeout_secs, 408; too_large: more elements than server.max_messages or more memory than server.request_memory_bytes, 413; memory: server.request_memory_bytes held by requests in flight, 503).",
            &["route", "dialect", "reason"],
        ),
        &[&l.routes, &l.dialects, &reasons],
        possible::rejected,
    )
}

pub(super) fn unmanaged(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntCounter>> {
    counter_series(
        r,
        (
            UNMANAGED_REQUESTS_TOTAL,
            "Conversation requests passed through without being managed, by dialect and reason (previous_response_id or conversation: the upstream keeps the history; compaction_trigger: a remote compaction). Counted in ctxgate_requests_total too.",
            &["dialect", "reason"],
        ),
        &[&l.dialects, &values(UnmanagedReason::ALL, UnmanagedReason::as_str)],
        possible::unmanaged,
    )
}

pub(super) fn upstream_errors(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntCounter>> {
    let classes = values(UpstreamErrorClass::ALL, UpstreamErrorClass::as_str);
    counter_series(
        r,
        (
            UPSTREAM_ERRORS_TOTAL,
            "Upstream failures by route, dialect and class (4xx, 5xx, unreachable, timeout, interrupted).",
            &["route", "dialect", "class"],
        ),
        &[&l.routes, &l.dialects, &classes],
        possible::upstream_error,
    )
}

// Tokens and the context engine: rewrites, summaries, recall.

pub(super) fn tokens(r: &Registry) -> prometheus::Result<TokenFamilies> {
    let token = |name, help| counters(r, name, help, &["model", "dialect"]);
    Ok(TokenFamilies {
        client_prompt: token(
            CLIENT_PROMPT_TOKENS_TOTAL,
            "Prompt tokens of the chat requests clients sent (the upstream's count when nothing was rewritten, ctxgate's calibrated estimate otherwise).",
        )?,
        upstream_prompt: token(
            UPSTREAM_PROMPT_TOKENS_TOTAL,
            "Prompt tokens sent upstream (every recall round's), as the upstream reported them (ctxgate's estimate when it reported none); Anthropic's count includes cache reads and writes.",
        )?,
        upstream_cached: token(
            UPSTREAM_CACHED_TOKENS_TOTAL,
            "Of the upstream prompt tokens, those the upstream reported as read from its prompt cache (chat prompt_tokens_details.cached_tokens, Anthropic cache_read_input_tokens, Responses input_tokens_details.cached_tokens).",
        )?,
        completion: token(
            UPSTREAM_COMPLETION_TOKENS_TOTAL,
            "Completion tokens the upstream reported.",
        )?,
        saved: token(
            SAVED_TOKENS_TOTAL,
            "Prompt tokens removed by rewriting (estimated tokens before minus after).",
        )?,
        spend_dollars: dollars(
            r,
            SPEND_DOLLARS_TOTAL,
            "US dollars the upstream's answers cost: the usage each reported at the model's [models] price (uncached input, cache reads, cache writes, output).",
        )?,
        saved_dollars: dollars(
            r,
            SAVED_DOLLARS_TOTAL,
            "US dollars rewriting saved: prompt tokens removed by rewriting at the turn's input price per token (its input spend over its prompt tokens).",
        )?,
        cache_miss: counters(
            r,
            CACHE_MISS_TOKENS_TOTAL,
            "Prompt tokens of turns that missed the provider's prompt cache, by cause (gap, model, tools, recut, client): the uncached prompt tokens the provider reported for the turn, else the estimate of those sent from the first difference with the session's previous turn on.",
            &["model", "dialect", "cause"],
        )?,
    })
}

fn dollars(r: &Registry, name: &str, help: &str) -> prometheus::Result<CounterVec> {
    register(
        r,
        CounterVec::new(Opts::new(name, help), &["model", "dialect"])?,
    )
}

pub(super) fn calibration(r: &Registry) -> prometheus::Result<GaugeVec> {
    register(
        r,
        GaugeVec::new(
            Opts::new(
                TOKEN_ESTIMATE_RATIO,
                "Calibration of ctxgate's token estimate: upstream prompt tokens / estimate (moving average).",
            ),
            &["model"],
        )?,
    )
}

pub(super) fn rewrites(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntCounter>> {
    let strategies = values(RewriteStrategy::ALL, RewriteStrategy::as_str);
    let outcomes = values(RewriteOutcome::ALL, RewriteOutcome::as_str);
    counter_series(
        r,
        (
            REWRITES_TOTAL,
            "Rewritten or refused conversation requests by dialect, strategy and outcome (the deepest stage needed, or rejected).",
            &["dialect", "strategy", "outcome"],
        ),
        &[&l.dialects, &strategies, &outcomes],
        possible::rewrite,
    )
}

pub(super) fn summary_calls(r: &Registry) -> prometheus::Result<Vec<IntCounter>> {
    outcome_counters(
        r,
        (
            SUMMARIZER_CALLS_TOTAL,
            "Summary calls by outcome (ok, failed, timeout, empty).",
            "outcome",
        ),
        SummaryOutcome::ALL,
        SummaryOutcome::as_str,
    )
}

pub(super) fn recall_calls(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntCounter>> {
    counter_series(
        r,
        (
            RECALL_CALLS_TOTAL,
            "Recall and search calls answered by ctxgate, by dialect, tool and outcome.",
            &["dialect", "tool", "outcome"],
        ),
        &[
            &l.dialects,
            &values(RecallTool::ALL, RecallTool::as_str),
            &values(RecallOutcome::ALL, RecallOutcome::as_str),
        ],
        possible::conversation_only,
    )
}

pub(super) fn recall_rounds(r: &Registry, l: &Lists) -> prometheus::Result<Series<IntCounter>> {
    counter_series(
        r,
        (
            RECALL_ROUNDS_TOTAL,
            "Extra upstream round trips made to answer recall and search calls, by dialect.",
            &["dialect"],
        ),
        &[&l.dialects],
        possible::conversation_only,
    )
}

// Sessions, the store, operations.

pub(super) fn session_lookups(r: &Registry) -> prometheus::Result<Vec<IntCounter>> {
    outcome_counters(
        r,
        (
            SESSION_CACHE_LOOKUPS_TOTAL,
            "Session cache lookups by result (hit: in memory; miss: loaded from the store or new).",
            "result",
        ),
        CacheResult::ALL,
        CacheResult::as_str,
    )
}

pub(super) fn reloads(r: &Registry) -> prometheus::Result<Vec<IntCounter>> {
    outcome_counters(
        r,
        (
            CONFIG_RELOADS_TOTAL,
            "Config reloads (SIGHUP or POST /admin/config/reload) by outcome (applied; rejected: the file had problems and the running config was kept).",
            "outcome",
        ),
        ReloadOutcome::ALL,
        ReloadOutcome::as_str,
    )
}

pub(super) fn hooks(r: &Registry) -> prometheus::Result<Vec<IntCounter>> {
    outcome_counters(
        r,
        (
            HOOK_DELIVERIES_TOTAL,
            "Idle-session webhook attempts by outcome (delivered: 2xx; retried: connection, timeout, 5xx or 429, tried again with backoff; failed: refused with another 4xx, not retried).",
            "outcome",
        ),
        HookOutcome::ALL,
        HookOutcome::as_str,
    )
}

/// `ctxgate_build_info`: set once, never recorded again.
pub(super) fn build_info(r: &Registry) -> prometheus::Result<()> {
    let build = register(
        r,
        IntGaugeVec::new(
            Opts::new(
                BUILD_INFO,
                "Always 1; the version label names the running build.",
            ),
            &["version"],
        )?,
    )?;
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    Ok(())
}
