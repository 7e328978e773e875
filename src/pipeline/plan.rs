//! The plan stage: counts a conversation request against its model's window and, when it is over budget, rewrites its
//! messages and offers the recall tools; otherwise the client's own bytes go upstream.

use crate::app::{AppState, Live};
use crate::config::{fallbacks, Config, OnOverflow, Strategy};
use crate::context::decide::{self, Decision};
use crate::context::long_context::wants_1m;
use crate::context::tokens::Encoding;
use crate::context::{CompressionRecord, Plan, PrunedCall};
use crate::dialect::Request;
use crate::error::GatewayError;
use crate::recall;
use crate::session::RequestMark;
use crate::summary;
use bytes::Bytes;
use http::HeaderMap;
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
    /// The model's context window, as the plan used it.
    pub window: u64,
    /// The model the request goes to instead of its own (`context.on_overflow = "fallback"`), whose name `body`
    /// carries and whose upstream it goes to.
    pub fallback: Option<String>,
}

impl Outgoing {
    /// What planning found, for the request's spans.
    pub fn planned(&self, strategy: Strategy) -> crate::otel::Planned<'_> {
        let rw = self.rewrite.as_ref();
        crate::otel::Planned {
            strategy: strategy.as_str(),
            rewritten: rw.is_some(),
            stages: rw.map_or(&[], |r| r.record.stages.as_slice()),
            tokens_before: self.client_tokens,
            tokens_after: rw.map_or(self.client_tokens, |r| Some(r.record.tokens_after)),
            window: self.window,
            recall_offered: rw.is_some_and(|r| r.injected),
        }
    }
}

/// When a request is planned, and the trace that the summary jobs it starts link to (when traced).
#[derive(Clone, Copy)]
pub struct PlanAt<'a> {
    /// Now, in seconds since the epoch.
    pub now: i64,
    /// The plan span's trace.
    pub trace: Option<&'a crate::otel::RequestTrace>,
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

/// The gateway's one entry for planning a request: what goes upstream. The pure part ([`decide::plan_cuts`], then
/// [`decide::render`]) is shared with `ctxgate replay`; around it this reads the summaries written for
/// the session, has the one the plan wants written, and may wait for it. `mark` is where its messages landed in
/// the session (for first-seen times and summaries); `headers` are the client's (the long-context beta, and the
/// credentials summary requests may use).
pub async fn plan_request(
    state: &Arc<AppState>,
    live: &Live,
    strategy: Strategy,
    request: &Request,
    mark: Option<&RequestMark>,
    headers: &HeaderMap,
    when: PlanAt<'_>,
) -> Result<Outgoing, GatewayError> {
    let now = when.now;
    let credentials = &credentials(headers);
    let cfg = &*live.config;
    let messages = request.messages();
    let aligned = mark.filter(|m| m.path.len() == request.native().len());
    // First-seen times and summaries are kept per client message; the planner counts neutral messages.
    let first_seen: Option<std::borrow::Cow<'_, [i64]>> =
        aligned.map(|m| match request.converted() {
            None => std::borrow::Cow::Borrowed(m.first_seen.as_slice()),
            Some(_) => (0..messages.len())
                .map(|i| {
                    let native = request.native_index(i).unwrap_or(0);
                    m.first_seen.get(native).copied().unwrap_or(now)
                })
                .collect(),
        });
    let req = decide::Request {
        body: &request.body,
        messages,
        // the parse's hashes of the client's elements, when the planner plans on those very elements
        hashes: request
            .item_hashes()
            .filter(|_| request.converted().is_none()),
        key: request.dialect.conversation_key(),
        raw_len: request.raw.len(),
        encoding: Encoding::for_model(&request.model),
        // The `context-1m` beta widens the window of the models that have a 1M one.
        window: live
            .models
            .context_window_with(&request.model, wants_1m(headers)),
        ratio: state.counter.ratio(&request.model),
        strategy,
        first_seen: first_seen.as_deref(),
        now,
        summarizer: live.summarizer.is_some(),
        strict_roles: request.dialect.strict_roles(),
    };
    let forward = |estimate: Option<u64>, client_tokens: Option<u64>| Outgoing {
        body: request.raw.clone(),
        messages_close: 0,
        rewrite: None,
        estimate,
        client_tokens,
        window: req.window,
        fallback: None,
    };
    // A request whose history the upstream keeps (or that asks the upstream to compact it) goes as sent.
    if !request.managed() || decide::clearly_under(&req, cfg) {
        return Ok(forward(None, None));
    }
    let summarizer = live
        .summarizer
        .as_ref()
        .filter(|_| matches!(strategy, Strategy::Summarize | Strategy::Hybrid))
        .zip(aligned);
    let mut ready = match summarizer {
        Some((_, m)) => ready_summaries(request, m),
        None => Vec::new(),
    };
    let offer = recall::Offer::new(request.dialect, &request.body, &cfg.recall);
    let pairs = |ready: &[(usize, Value, String)]| -> Vec<(usize, Value)> {
        ready.iter().map(|(u, m, _)| (*u, m.clone())).collect()
    };
    let plan_with = same_lifetime(|pairs| {
        let ready = summarizer.map(|_| pairs);
        decide::plan_cuts(&req, ready, cfg, &offer, &state.counter)
    });
    let (first_pairs, later_pairs);
    first_pairs = pairs(&ready);
    let mut decision = plan_with(&first_pairs);
    let wanted = decide::wanted_summary(&decision).and_then(|n| request.summary_boundary(n));
    if let (Some((s, m)), Some((upto, native_upto))) = (summarizer, wanted) {
        // A summary is wanted: have it written in the background. A request that is being pruned for want of it
        // may wait `summary.wait_ms` for it.
        // The job copies the history: built only once the summarizer is sure to start it.
        let precomputed = matches!(decision, Plan::Forward { .. });
        let at = (upto, native_upto);
        let length = decide::summary_budget(&req, upto, &offer, cfg, &state.counter);
        let make = || {
            let mut job = summary_job(
                m,
                messages,
                at,
                &ready,
                credentials,
                req.encoding,
                (precomputed, Some(length)),
            );
            // Traced: the job's own trace links to this request's plan span.
            job.trace = when.trace.map(|t| t.job());
            job
        };
        let done = s.start_with(&m.entry.id, make, state.sessions.clone(), &state.tasks);
        let pruned_meanwhile =
            matches!(&decision, Plan::Rewrite(r) if !r.record.stages.contains(&"summarized"));
        if let (Some(mut done), true, true) = (done, pruned_meanwhile, cfg.summary.wait_ms > 0) {
            let wait = std::time::Duration::from_millis(cfg.summary.wait_ms);
            if tokio::time::timeout(wait, done.wait_for(|d| *d))
                .await
                .is_ok()
            {
                ready = ready_summaries(request, m);
                later_pairs = pairs(&ready);
                decision = plan_with(&later_pairs);
            }
        }
    }
    let serialise = |b: &crate::context::RewrittenBody<'_>| request.dialect.render(request, b);
    let rendered = decide::render(&req, decision, (cfg, &offer), &state.counter, &serialise)
        .map_err(|e| GatewayError::Internal(format!("serialising the rewrite: {e}")))?;
    // Over the window (or losing whole messages to the hard limit) under `on_overflow = "fallback"`: planned again
    // for the model's fallback, its fallback's while it still does not fit; truncated where none is set.
    let (rendered, window, fallback) = match rendered {
        Decision::Reject { .. } if cfg.context.on_overflow == OnOverflow::Fallback => {
            let ready = summarizer.map(|_| pairs(&ready));
            let found = fall_back(
                &req,
                request,
                (live, state, headers),
                ready.as_deref(),
                &offer,
                &serialise,
            )
            .map_err(|e| GatewayError::Internal(format!("serialising the rewrite: {e}")))?;
            match found {
                Some((d, window, model)) => (d, window, Some(model)),
                None => (
                    truncated(&req, cfg, ready.as_deref(), &offer, state, &serialise).map_err(
                        |e| GatewayError::Internal(format!("serialising the rewrite: {e}")),
                    )?,
                    req.window,
                    None,
                ),
            }
        }
        other => (other, req.window, None),
    };
    let named = |body: Vec<u8>, close: usize| -> Result<(Vec<u8>, usize), GatewayError> {
        match &fallback {
            None => Ok((body, close)),
            Some(model) => with_model(&body, model, close, request).ok_or_else(|| {
                GatewayError::Internal("the request's model could not be replaced".into())
            }),
        }
    };
    let rw = match rendered {
        Decision::Forward {
            estimate,
            client_tokens,
        } => {
            let mut out = forward(estimate, client_tokens);
            if fallback.is_some() {
                out.body = Bytes::from(named(request.raw.to_vec(), 0)?.0);
                out.window = window;
                out.fallback = fallback;
            }
            return Ok(out);
        }
        Decision::Reject {
            tokens,
            limit,
            window,
            refused,
        } => {
            let message = if refused {
                format!(
                    "this conversation needs about {tokens} tokens; the limit is {limit} tokens ({} of the \
                     model's {window}-token window, context.hard_limit), and it would fit only by dropping whole \
                     earlier messages or cutting the task to its head and tail, which this gateway refuses to do (context.on_overflow = \"refuse\"): \
                     shorten the conversation or remove large content",
                    cfg.context.hard_limit
                )
            } else {
                format!(
                    "this conversation needs about {tokens} tokens even after ctxgate dropped all it could \
                     (system prompt and newest turn kept); the limit is {limit} tokens ({} of the model's \
                     {window}-token window, context.hard_limit)",
                    cfg.context.hard_limit
                )
            };
            return Err(GatewayError::ContextLengthExceeded {
                message,
                tokens,
                limit,
            });
        }
        Decision::Rewrite(rw) => *rw,
    };
    let (body, messages_close) = named(rw.body, rw.messages_close)?;
    Ok(Outgoing {
        body: Bytes::from(body),
        messages_close,
        estimate: Some(rw.estimate),
        client_tokens: Some(rw.record.tokens_before),
        window,
        fallback,
        rewrite: Some(Rewritten {
            record: rw.record,
            pruned: rw.pruned,
            injected: rw.injected,
        }),
    })
}

/// The request planned for its model's fallback, and that one's while it still does not fit (the last of the
/// chain as `truncate` would): the decision, the window it was planned for and the model; `None` when the model
/// has no fallback (logged once per model).
fn fall_back(
    req: &decide::Request<'_>,
    request: &Request,
    (live, state, headers): (&Live, &Arc<AppState>, &HeaderMap),
    ready: Option<&[(usize, Value)]>,
    offer: &recall::Offer,
    serialise: &decide::Serialise<'_>,
) -> serde_json::Result<Option<(Decision, u64, String)>> {
    let cfg = &*live.config;
    let mut model = request.model.as_str();
    let mut seen = vec![model.to_lowercase()];
    let mut last_resort: Option<Config> = None;
    while let Some(next) = fallbacks::fallback_of(&cfg.models, model) {
        if seen.contains(&next.to_lowercase()) {
            break;
        }
        seen.push(next.to_lowercase());
        let fb = decide::Request {
            encoding: Encoding::for_model(next),
            window: live.models.context_window_with(next, wants_1m(headers)),
            ratio: state.counter.ratio(next),
            ..*req
        };
        // The end of the chain: what does not fit there is rewritten to its window, as `truncate` would.
        let end = fallbacks::fallback_of(&cfg.models, next)
            .is_none_or(|after| seen.contains(&after.to_lowercase()));
        let used = if end {
            &*last_resort.insert(truncating(cfg))
        } else {
            cfg
        };
        let planned = decide::plan_cuts(&fb, ready, used, offer, &state.counter);
        let d = decide::render(&fb, planned, (used, offer), &state.counter, serialise)?;
        if end || !matches!(d, Decision::Reject { .. }) {
            return Ok(Some((d, fb.window, next.to_string())));
        }
        model = next;
    }
    if seen.len() == 1 {
        no_fallback_once(&request.model);
    }
    Ok(None)
}

/// The request planned for its own model as `on_overflow = "truncate"` would.
fn truncated(
    req: &decide::Request<'_>,
    cfg: &Config,
    ready: Option<&[(usize, Value)]>,
    offer: &recall::Offer,
    state: &Arc<AppState>,
    serialise: &decide::Serialise<'_>,
) -> serde_json::Result<Decision> {
    let cfg = truncating(cfg);
    let planned = decide::plan_cuts(req, ready, &cfg, offer, &state.counter);
    decide::render(req, planned, (&cfg, offer), &state.counter, serialise)
}

/// `cfg` with `context.on_overflow = "truncate"` (a copy, made only for a request over its window).
fn truncating(cfg: &Config) -> Config {
    let mut c = cfg.clone();
    c.context.on_overflow = OnOverflow::Truncate;
    c
}

/// Says once per model name (up to a bound) that `on_overflow = "fallback"` truncated its request for want of a
/// fallback.
fn no_fallback_once(model: &str) {
    static TOLD: std::sync::OnceLock<parking_lot::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    let mut told = TOLD.get_or_init(Default::default).lock();
    if told.len() >= 256 || !told.insert(model.to_string()) {
        return;
    }
    tracing::warn!(
        target: "ctxgate::context",
        model,
        "context.on_overflow = \"fallback\" but no [models] entry sets a fallback for this model: its requests \
         that do not fit are truncated (said once per model)"
    );
}

/// `body` (a JSON object) with its top-level `model` replaced by `model`, every other byte kept, and `close` (an
/// offset in it) moved with what follows; a body the scan cannot read is written again from the parsed request.
fn with_model(
    body: &[u8],
    model: &str,
    close: usize,
    request: &Request,
) -> Option<(Vec<u8>, usize)> {
    let name = serde_json::to_vec(model).ok()?;
    let fields = crate::dialect::raw_scan::fields(body, |_| false);
    let found = fields.as_ref().and_then(|fs| {
        let mut models = fs.iter().filter(|f| f.key == b"model");
        match (models.next(), models.next()) {
            (Some(f), None) => Some(f.raw),
            _ => None,
        }
    });
    let Some(raw) = found else {
        // Only the client's own bytes (`close` 0) can be written again from the parsed request.
        if close != 0 {
            return None;
        }
        let mut b = request.body.clone();
        b.insert("model".into(), Value::from(model));
        return serde_json::to_vec(&b).ok().map(|v| (v, 0));
    };
    let at = raw.as_ptr() as usize - body.as_ptr() as usize;
    let mut out = Vec::with_capacity(body.len() + name.len());
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(&name);
    out.extend_from_slice(&body[at + raw.len()..]);
    let close = if close > at {
        close + name.len() - raw.len()
    } else {
        close
    };
    Some((out, close))
}

/// The summaries written for the session's path, as `(neutral messages covered, message, text)`: a summary
/// covers whole client messages, which are counted in neutral messages here.
fn ready_summaries(request: &Request, mark: &RequestMark) -> Vec<(usize, Value, String)> {
    let mut ready = summary::ready(&mark.entry.compressions(), &mark.path);
    for r in &mut ready {
        r.0 = request.neutral_start(r.0);
    }
    ready
}

/// The client's credential headers (`authorization`, `x-api-key`, `x-goog-api-key`), for summary requests made on its
/// behalf.
pub fn credentials(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in [
        http::header::AUTHORIZATION.as_str(),
        "x-api-key",
        crate::upstream::GOOG_API_KEY,
    ] {
        if let Some(v) = headers.get(name) {
            if let Ok(n) = http::HeaderName::from_bytes(name.as_bytes()) {
                out.insert(n, v.clone());
            }
        }
    }
    out
}

/// Gives a planning closure one lifetime for its summaries and its plan (they borrow the summaries).
fn same_lifetime<'x, F: Fn(&'x [(usize, Value)]) -> Plan<'x>>(f: F) -> F {
    f
}

/// The job writing the summary of the first `upto` messages (the first `native_upto` client messages), from the
/// newest ready summary before it.
fn summary_job(
    mark: &RequestMark,
    messages: &[Value],
    (upto, native_upto): (usize, usize),
    ready: &[(usize, Value, String)],
    credentials: &HeaderMap,
    encoding: Encoding,
    (precomputed, length): (bool, Option<u64>),
) -> summary::Job {
    summary::Job {
        entry: mark.entry.clone(),
        messages: Arc::new(messages[..upto].to_vec()),
        upto,
        upto_node: mark.path[native_upto - 1].clone(),
        previous: ready
            .iter()
            .filter(|(u, _, _)| *u < upto)
            .max_by_key(|(u, _, _)| *u)
            .map(|(u, _, t)| (*u, t.clone())),
        credentials: credentials.clone(),
        precomputed,
        encoding,
        length,
        trace: None,
    }
}
