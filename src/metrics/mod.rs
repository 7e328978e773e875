//! Metrics: everything ctxgate exports to Prometheus, as a typed API. Names are constants (`names`), label values
//! come from enums (`labels`) or the model allowlist (`models`), and every series with enum-bounded labels is
//! resolved once at start-up, so recording a request is a handful of atomic operations.
//!
//! Depends on nothing else of ours: callers translate their own types into these labels.

mod families;
mod labels;
mod models;
pub mod names;
mod possible;
mod series;

pub use labels::{
    CacheMissCause, CacheResult, DialectLabel, HookOutcome, RecallOutcome, RecallTool,
    RejectReason, ReloadOutcome, RewriteOutcome, RewriteStrategy, Route, StatusClass, StoreBackend,
    StoreOp, SummaryOutcome, UnmanagedReason, UpstreamErrorClass, UpstreamOutcome,
};
pub use models::{ModelResolver, OTHER};

use models::ModelLabels;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry,
    TextEncoder,
};
use series::Series;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Buckets of every latency histogram, in seconds: from 100 µs (ctxgate's own overhead; 5 ms is an edge, for
/// the overhead alert) to 10 minutes (long LLM calls).
pub const LATENCY_BUCKETS: [f64; 21] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Content type of the text exposition format.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The status recorded for a request whose handler was dropped before it had one (the client went away).
pub const CLIENT_CLOSED: u16 = 499;

/// The registry and a pre-resolved handle for every series.
pub struct Metrics {
    registry: Registry,
    /// route × dialect × status class × stream flag.
    requests: Series<IntCounter>,
    /// route × dialect (so are the three latency histograms).
    in_flight: Series<IntGauge>,
    active_streams: IntGauge,
    /// route × dialect × reason.
    rejected: Series<IntCounter>,
    /// dialect × reason.
    unmanaged: Series<IntCounter>,
    reloads: Vec<IntCounter>,
    hooks: Vec<IntCounter>,
    hooks_pending: IntGauge,
    duration: Series<Histogram>,
    upstream: Series<Histogram>,
    overhead: Series<Histogram>,
    /// dialect.
    first_byte: Series<Histogram>,
    models: ModelLabels,
    calibration: GaugeVec,
    /// dialect × strategy × outcome.
    rewrites: Series<IntCounter>,
    summary_calls: Vec<IntCounter>,
    summary_duration: Histogram,
    precompactions_started: IntCounter,
    precompactions_finished: IntCounter,
    /// dialect × tool × outcome.
    recall_calls: Series<IntCounter>,
    /// dialect.
    recall_rounds: Series<IntCounter>,
    sessions_cached: IntGauge,
    session_cache_bytes: IntGauge,
    session_lookups: Arc<Vec<IntCounter>>,
    store_duration: HistogramVec,
    store_errors: IntCounterVec,
    store_circuit_open: IntGauge,
    /// route × dialect × class.
    upstream_errors: Series<IntCounter>,
    /// upstream × dialect × outcome: the upstream's name is the operator's (bounded by the config).
    upstream_requests: IntCounterVec,
    /// model × fallback: both allowlisted model labels.
    fallbacks: IntCounterVec,
}

/// The position of a series in a list resolved by [`resolve`]: `dims` are (value index, value count) per label,
/// in the lists' order (row-major, the last varies fastest).
fn at(dims: &[(usize, usize)]) -> usize {
    dims.iter().fold(0, |acc, &(i, n)| acc * n + i)
}

/// A dialect's position among the `dialect` label's values.
fn d(dialect: DialectLabel) -> (usize, usize) {
    (dialect.idx(), DialectLabel::ALL.len())
}

/// Where `value` is in `all` (a label enum's `ALL`: the order its series were resolved in).
fn index<L: PartialEq>(all: &[L], value: L) -> usize {
    all.iter().position(|l| *l == value).unwrap_or(0)
}

impl Metrics {
    /// A fresh registry with every metric registered. `models` maps a request's model to its allowlisted label.
    pub fn new(models: ModelResolver) -> prometheus::Result<Metrics> {
        use families::*;
        use names::*;
        let r = Registry::new();
        let l = Lists::new();
        build_info(&r)?;
        Ok(Metrics {
            requests: requests(&r, &l)?,
            in_flight: in_flight(&r, &l)?,
            active_streams: gauge(&r, ACTIVE_STREAMS, "Chat responses being streamed (SSE) to clients.")?,
            rejected: rejected(&r, &l)?,
            unmanaged: unmanaged(&r, &l)?,
            hooks: hooks(&r)?,
            hooks_pending: gauge(
                &r,
                HOOK_PENDING_DELIVERIES,
                "Idle sessions whose webhook is due and not delivered yet, as of the last sweep.",
            )?,
            reloads: reloads(&r)?,
            duration: duration(&r, &l)?,
            upstream: upstream(&r, &l)?,
            overhead: overhead(&r, &l)?,
            first_byte: first_byte(&r, &l)?,
            models: ModelLabels::new(models, tokens(&r)?),
            calibration: calibration(&r)?,
            rewrites: rewrites(&r, &l)?,
            summary_calls: summary_calls(&r)?,
            summary_duration: histogram(
                &r,
                SUMMARIZER_CALL_DURATION_SECONDS,
                "Duration of summary calls, whatever their outcome.",
            )?,
            precompactions_started: counter(
                &r,
                PRECOMPACTIONS_STARTED_TOTAL,
                "Background pre-compactions (summaries computed ahead of the threshold) started.",
            )?,
            precompactions_finished: counter(
                &r,
                PRECOMPACTIONS_FINISHED_TOTAL,
                "Background pre-compactions finished, whatever their outcome.",
            )?,
            recall_calls: recall_calls(&r, &l)?,
            recall_rounds: recall_rounds(&r, &l)?,
            sessions_cached: gauge(&r, SESSIONS_CACHED, "Sessions in the in-memory cache.")?,
            session_cache_bytes: gauge(
                &r,
                SESSION_CACHE_BYTES,
                "Bytes of history in the in-memory session cache (estimated).",
            )?,
            session_lookups: Arc::new(session_lookups(&r)?),
            store_duration: histograms(
                &r,
                STORE_OPERATION_DURATION_SECONDS,
                "Latency of store operations by backend and operation (write: one group commit).",
                &["backend", "operation"],
            )?,
            store_errors: counters(
                &r,
                STORE_ERRORS_TOTAL,
                "Failed store operations by backend and operation.",
                &["backend", "operation"],
            )?,
            store_circuit_open: gauge(
                &r,
                STORE_CIRCUIT_OPEN,
                "1 while the store's circuit breaker is open (requests do not wait on the store until a probe finds it healthy).",
            )?,
            upstream_errors: upstream_errors(&r, &l)?,
            upstream_requests: counters(
                &r,
                UPSTREAM_REQUESTS_TOTAL,
                "Conversation requests sent upstream (first round), by upstream (default: [upstream], anthropic: [anthropic], else the [upstreams.<name>]), dialect and outcome (answered, 4xx, 5xx, unreachable, timeout).",
                &["upstream", "dialect", "outcome"],
            )?,
            fallbacks: counters(
                &r,
                FALLBACKS_TOTAL,
                "Requests sent to their model's fallback (context.on_overflow = fallback), by model and the fallback that answered.",
                &["model", "fallback"],
            )?,
            registry: r,
        })
    }

    /// The registry (for gathering).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "metrics: could not encode the exposition");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// Starts timing a request: counts it in flight until the returned timer is dropped, which records it.
    /// `dialect`: a `crate::dialect::Dialect`, or [`DialectLabel::NoDialect`] outside a conversation.
    pub fn start(
        self: &Arc<Self>,
        route: Route,
        dialect: impl Into<DialectLabel>,
        started: Instant,
    ) -> RequestTimer {
        let dialect = dialect.into();
        if let Some(g) = self
            .in_flight
            .get(at(&[(route.idx(), Route::ALL.len()), d(dialect)]))
        {
            g.inc();
        }
        RequestTimer {
            metrics: self.clone(),
            route,
            dialect,
            started,
            status: CLIENT_CLOSED,
            stream: false,
            streaming: false,
            upstream_sent: None,
            upstream_time: None,
            first_byte: None,
        }
    }

    /// Counts a request refused before it was handled (it is still recorded by its timer, with its status).
    pub fn rejected(&self, route: Route, dialect: impl Into<DialectLabel>, reason: RejectReason) {
        let i = at(&[
            (route.idx(), Route::ALL.len()),
            d(dialect.into()),
            (reason.idx(), RejectReason::ALL.len()),
        ]);
        if let Some(c) = self.rejected.get(i) {
            c.inc();
        }
    }

    /// Counts a webhook attempt.
    pub fn hook(&self, outcome: HookOutcome) {
        self.hooks[index(HookOutcome::ALL, outcome)].inc();
    }

    /// Sets how many webhook deliveries are due.
    pub fn hooks_pending(&self, n: usize) {
        self.hooks_pending.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a config reload.
    pub fn reload(&self, outcome: ReloadOutcome) {
        self.reloads[index(ReloadOutcome::ALL, outcome)].inc();
    }

    /// Counts a conversation request passed through unmanaged (it is still recorded by its timer).
    pub fn unmanaged(&self, dialect: impl Into<DialectLabel>, reason: UnmanagedReason) {
        let i = at(&[
            d(dialect.into()),
            (reason.idx(), UnmanagedReason::ALL.len()),
        ]);
        if let Some(c) = self.unmanaged.get(i) {
            c.inc();
        }
    }

    /// Counts an upstream failure.
    pub fn upstream_error(
        &self,
        route: Route,
        dialect: impl Into<DialectLabel>,
        class: UpstreamErrorClass,
    ) {
        let i = at(&[
            (route.idx(), Route::ALL.len()),
            d(dialect.into()),
            (class.idx(), UpstreamErrorClass::ALL.len()),
        ]);
        if let Some(c) = self.upstream_errors.get(i) {
            c.inc();
        }
    }

    /// The series an upstream named `upstream` counts `dialect`'s requests in, one per outcome, created now
    /// (resolve once per upstream and dialect: recording is then one atomic add).
    pub fn upstream_counts(
        &self,
        upstream: &str,
        dialect: impl Into<DialectLabel>,
    ) -> UpstreamCounts {
        let dialect = dialect.into().as_str();
        UpstreamCounts(
            UpstreamOutcome::ALL
                .iter()
                .map(|o| {
                    self.upstream_requests
                        .with_label_values(&[upstream, dialect, o.as_str()])
                })
                .collect(),
        )
    }

    /// Counts a request sent to `fallback` instead of `model` (both exported under their allowlisted labels).
    pub fn fallback(&self, model: &str, fallback: &str) {
        let (model, fallback) = (self.models.label(model), self.models.label(fallback));
        self.fallbacks
            .with_label_values(&[&*model, &*fallback])
            .inc();
    }

    /// Adds a finished conversation turn's tokens to its model's counters.
    pub fn tokens(&self, model: &str, dialect: impl Into<DialectLabel>, t: &TokenCounts) {
        if t.client_prompt.is_none()
            && t.upstream_prompt.is_none()
            && t.upstream_cached.is_none()
            && t.completion.is_none()
        {
            return;
        }
        let di = dialect.into().idx();
        self.models.with(model, |s| {
            if let Some(n) = t.client_prompt {
                if let Some(c) = s.client_prompt.get(di).and_then(Option::as_ref) {
                    c.inc_by(n);
                }
            }
            if let Some(n) = t.upstream_prompt {
                if let Some(c) = s.upstream_prompt.get(di).and_then(Option::as_ref) {
                    c.inc_by(n);
                }
            }
            if let Some(n) = t.upstream_cached {
                if let Some(c) = s.upstream_cached.get(di).and_then(Option::as_ref) {
                    c.inc_by(n);
                }
            }
            if let Some(n) = t.completion {
                if let Some(c) = s.completion.get(di).and_then(Option::as_ref) {
                    c.inc_by(n);
                }
            }
        });
    }

    /// Adds a finished conversation turn's money (a priced model's) to its model's counters.
    pub fn money(&self, model: &str, dialect: impl Into<DialectLabel>, spent: f64, saved: f64) {
        let di = dialect.into().idx();
        self.models.with(model, |s| {
            if let Some(c) = s.spend_dollars.get(di).and_then(Option::as_ref) {
                c.inc_by(spent.max(0.0));
            }
            if let Some(c) = s.saved_dollars.get(di).and_then(Option::as_ref) {
                c.inc_by(saved.max(0.0));
            }
        });
    }

    /// Adds a turn's missed prompt-cache tokens to its model's counter of `cause`.
    pub fn cache_miss(
        &self,
        model: &str,
        dialect: impl Into<DialectLabel>,
        cause: CacheMissCause,
        tokens: u64,
    ) {
        let at = dialect.into().idx() * CacheMissCause::ALL.len() + cause.idx();
        self.models.with(model, |s| {
            if let Some(c) = s.cache_miss.get(at).and_then(Option::as_ref) {
                c.inc_by(tokens);
            }
        });
    }

    /// Counts a rewrite (or a refusal) and the tokens it removed.
    pub fn rewrite(
        &self,
        dialect: impl Into<DialectLabel>,
        strategy: RewriteStrategy,
        outcome: RewriteOutcome,
        model: &str,
        saved_tokens: u64,
    ) {
        let dialect = dialect.into();
        let i = at(&[
            d(dialect),
            (strategy.idx(), RewriteStrategy::ALL.len()),
            (outcome.idx(), RewriteOutcome::ALL.len()),
        ]);
        if let Some(c) = self.rewrites.get(i) {
            c.inc();
        }
        if saved_tokens > 0 {
            self.models.with(model, |s| {
                if let Some(c) = s.saved.get(dialect.idx()).and_then(Option::as_ref) {
                    c.inc_by(saved_tokens);
                }
            });
        }
    }

    /// Counts a summary call and its duration.
    pub fn summary_call(&self, outcome: SummaryOutcome, elapsed: Duration) {
        self.summary_calls[outcome.idx()].inc();
        self.summary_duration.observe(elapsed.as_secs_f64());
    }

    /// A background pre-compaction started.
    pub fn precompaction_started(&self) {
        self.precompactions_started.inc();
    }

    /// A background pre-compaction finished (successfully or not).
    pub fn precompaction_finished(&self) {
        self.precompactions_finished.inc();
    }

    /// Counts one answered recall or search call.
    pub fn recall_call(
        &self,
        dialect: impl Into<DialectLabel>,
        tool: RecallTool,
        outcome: RecallOutcome,
    ) {
        let i = at(&[
            d(dialect.into()),
            (tool.idx(), RecallTool::ALL.len()),
            (outcome.idx(), RecallOutcome::ALL.len()),
        ]);
        if let Some(c) = self.recall_calls.get(i) {
            c.inc();
        }
    }

    /// Counts one extra upstream round trip for recall.
    pub fn recall_round(&self, dialect: impl Into<DialectLabel>) {
        if let Some(c) = self.recall_rounds.get(dialect.into().idx()) {
            c.inc();
        }
    }

    /// The handles the session cache records its lookups with.
    pub fn session_metrics(&self) -> SessionMetrics {
        SessionMetrics(Some(self.session_lookups.clone()))
    }

    /// The handles a store backend records its operations with.
    pub fn store_metrics(&self, backend: StoreBackend) -> StoreMetrics {
        let b = backend.as_str();
        let series = StoreOp::ALL
            .iter()
            .map(|op| {
                let l = [b, op.as_str()];
                (
                    self.store_duration.with_label_values(&l),
                    self.store_errors.with_label_values(&l),
                )
            })
            .unzip();
        StoreMetrics(Some(Arc::new(series)))
    }

    /// Sets the session cache gauges (at scrape time).
    pub fn set_session_cache(&self, sessions: u64, bytes: u64) {
        self.sessions_cached
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
        self.session_cache_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets the store's circuit breaker gauge (at scrape time).
    pub fn set_store_circuit_open(&self, open: bool) {
        self.store_circuit_open.set(i64::from(open));
    }

    /// Sets the calibration gauges from the token counter's per-model ratios (at scrape time); models sharing a
    /// label are averaged.
    pub fn set_calibration(&self, ratios: &[(String, f64)]) {
        let mut by_label: BTreeMap<Arc<str>, (f64, u32)> = BTreeMap::new();
        for (model, ratio) in ratios {
            let e = by_label.entry(self.models.label(model)).or_default();
            e.0 += ratio;
            e.1 += 1;
        }
        for (label, (sum, n)) in by_label {
            self.calibration
                .with_label_values(&[&*label])
                .set(sum / f64::from(n));
        }
    }

    /// The label a model name is exported under (an allowlisted model-table entry, or `other`).
    pub fn model_label(&self, model: &str) -> Arc<str> {
        self.models.label(model)
    }
}

/// Tokens of one finished chat turn; `None` where unknown.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenCounts {
    /// Prompt tokens of the client's request.
    pub client_prompt: Option<u64>,
    /// Prompt tokens sent upstream.
    pub upstream_prompt: Option<u64>,
    /// Of those, the tokens the upstream read from its prompt cache.
    pub upstream_cached: Option<u64>,
    /// Completion tokens reported by the upstream.
    pub completion: Option<u64>,
}

/// Times one request; dropping it records the request (count, durations) and leaves the in-flight gauge.
pub struct RequestTimer {
    metrics: Arc<Metrics>,
    route: Route,
    dialect: DialectLabel,
    started: Instant,
    status: u16,
    stream: bool,
    streaming: bool,
    upstream_sent: Option<Instant>,
    upstream_time: Option<Duration>,
    first_byte: Option<Instant>,
}

impl RequestTimer {
    /// The response status (499 if never set: the client went away first).
    pub fn set_status(&mut self, status: u16) {
        self.status = status;
    }

    /// Whether the client asked for a stream.
    pub fn set_stream(&mut self, stream: bool) {
        self.stream = stream;
    }

    /// The request is being sent upstream now.
    pub fn upstream_sent(&mut self) {
        self.upstream_sent = Some(Instant::now());
    }

    /// The upstream is done (its last byte, or its failure) now; without this the upstream wait lasts until
    /// the timer is dropped.
    pub fn upstream_ended(&mut self) {
        if let Some(sent) = self.upstream_sent {
            self.upstream_time = Some(sent.elapsed());
        }
    }

    /// When the upstream's first body byte arrived (recorded for streams).
    pub fn first_byte(&mut self, at: Instant) {
        self.first_byte = Some(at);
    }

    /// The response is an SSE stream: count it among the active streams until the timer is dropped.
    pub fn streaming(&mut self) {
        if !self.streaming {
            self.streaming = true;
            self.metrics.active_streams.inc();
        }
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let m = &*self.metrics;
        let r = at(&[(self.route.idx(), Route::ALL.len()), d(self.dialect)]);
        let now = Instant::now();
        let total = now.saturating_duration_since(self.started);
        if let Some(g) = m.in_flight.get(r) {
            g.dec();
        }
        if self.streaming {
            m.active_streams.dec();
        }
        let class = StatusClass::of(self.status).idx();
        let i = at(&[
            (r, Route::ALL.len() * DialectLabel::ALL.len()),
            (class, StatusClass::ALL.len()),
            (usize::from(self.stream), 2),
        ]);
        if let Some(c) = m.requests.get(i) {
            c.inc();
        }
        if let Some(h) = m.duration.get(r) {
            h.observe(total.as_secs_f64());
        }
        let upstream = self
            .upstream_time
            .or_else(|| self.upstream_sent.map(|s| now.saturating_duration_since(s)));
        if let Some(up) = upstream {
            if let Some(h) = m.upstream.get(r) {
                h.observe(up.as_secs_f64());
            }
            if let Some(h) = m.overhead.get(r) {
                h.observe(total.saturating_sub(up).as_secs_f64());
            }
        }
        if let (true, Some(first)) = (self.stream, self.first_byte) {
            if let Some(h) = m.first_byte.get(self.dialect.idx()) {
                h.observe(first.saturating_duration_since(self.started).as_secs_f64());
            }
        }
    }
}

/// One upstream's request counters for one dialect, by outcome ([`Metrics::upstream_counts`]).
#[derive(Clone, Debug)]
pub struct UpstreamCounts(Arc<[IntCounter]>);

impl UpstreamCounts {
    /// Counts one request.
    pub fn count(&self, outcome: UpstreamOutcome) {
        if let Some(c) = self.0.get(outcome.idx()) {
            c.inc();
        }
    }
}

/// Session cache lookup counters; the default records nothing.
#[derive(Clone, Default)]
pub struct SessionMetrics(Option<Arc<Vec<IntCounter>>>);

impl SessionMetrics {
    /// Counts one lookup.
    pub fn lookup(&self, result: CacheResult) {
        if let Some(c) = &self.0 {
            c[result.idx()].inc();
        }
    }
}

/// One backend's store operation series; the default records nothing.
#[derive(Clone, Default)]
pub struct StoreMetrics(Option<Arc<(Vec<Histogram>, Vec<IntCounter>)>>);

impl StoreMetrics {
    /// Records one operation that started at `started`; `ok` false counts an error.
    pub fn observe(&self, op: StoreOp, started: Instant, ok: bool) {
        if let Some(s) = &self.0 {
            s.0[op.idx()].observe(started.elapsed().as_secs_f64());
            if !ok {
                s.1[op.idx()].inc();
            }
        }
    }

    /// Counts one failed operation without a latency (refused at once, or given up on after the timeout).
    pub fn error(&self, op: StoreOp) {
        if let Some(s) = &self.0 {
            s.1[op.idx()].inc();
        }
    }
}

#[cfg(test)]
mod tests;
