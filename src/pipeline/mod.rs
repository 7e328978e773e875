//! The life of a conversation request of any dialect, stage by stage: read → parse → identify the session → plan
//! (count, rewrite) → forward → relay with a tap (or answer recall rounds) → record. The dialect (`dialect/`)
//! translates at the edges; nothing here knows a wire format.

mod count;
mod measure;
mod plan;
mod request;
mod respond;
mod rounds;
pub mod turn_record;

pub use count::count_tokens;
pub use plan::{plan_request, Outgoing, PlanAt, Rewritten, STRATEGY_HEADER};
pub use request::read_body;
pub use respond::error_response;

use respond::own_error;

use crate::app::{AppState, TurnEvent};
use crate::dialect::{Dialect, Request as Parsed};
use crate::error::GatewayError;
use crate::metrics::{RejectReason, RequestTimer, Route};
use crate::otel::ChatStart;
use crate::recall::{HistorySource, LazyHistory};
use crate::relay::{self, RelayOutcome};
use crate::session::manager::now_secs;
use crate::session::tree::raw_item_hashes;
use crate::session::{identify, RequestMark, SessionIdentity};
use crate::store::records::RewriteRecord;
use crate::store::{Compression, Record, StoreError};
use axum::extract::Request;
use axum::response::Response;
use http::Method;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Response header carrying the session id.
pub const SESSION_HEADER: &str = "x-ctxgate-session";
/// The response header saying what a rewrite did: `<stages>; tokens=<client>-><sent>`.
pub const REWRITE_HEADER: &str = "x-ctxgate-rewrite";
/// The response header counting the recall rounds ctxgate answered (answers whose head follows the rounds: JSON).
pub const RECALL_HEADER: &str = "x-ctxgate-recall";

/// Handles `POST /v1/chat/completions` (chat), `POST /v1/messages` (Anthropic) and `POST /v1/responses`
/// (Responses).
pub async fn conversation(state: Arc<AppState>, req: Request, dialect: Dialect) -> Response {
    let started = Instant::now();
    // Counts the request in flight; the turn takes it over when the upstream answers, otherwise it records the
    // error answered here (or 499 when the client went away first).
    let mut timer = Some(state.metrics.start(Route::Chat, dialect, started));
    let resp = handle(state, req, dialect, started, &mut timer).await;
    if let Some(t) = timer.as_mut() {
        t.set_status(resp.status().as_u16());
    }
    resp
}

async fn handle(
    state: Arc<AppState>,
    req: Request,
    dialect: Dialect,
    started: Instant,
    timer: &mut Option<RequestTimer>,
) -> Response {
    let (parts, body) = req.into_parts();
    // The request's server span, when tracing is on: each stage below adds its own under it.
    let trace = parts.extensions.get::<crate::otel::RequestTrace>().cloned();
    // The reloadable config as it is now: this request keeps it to its end.
    let live = state.live();
    let cfg = &*live.config;

    // 1. Read the whole body, within the limit: it has to be parsed before anything goes upstream.
    let body_timeout = std::time::Duration::from_secs(cfg.server.body_read_timeout_secs);
    let raw = match read_body(body, cfg.server.max_body_bytes, body_timeout).await {
        Ok(b) => b,
        Err(e) => {
            if matches!(e, GatewayError::RequestTimeout { .. }) {
                state
                    .metrics
                    .rejected(Route::Chat, dialect, RejectReason::BodyTimeout);
            }
            return own_error(dialect, e, None, started, false, "");
        }
    };
    // 2. Parse, keeping every field and its order; refuse what is not a request of the dialect (or names no
    //    strategy).
    let request = Arc::new(match dialect.parse(raw) {
        Ok(c) => c,
        Err(e) => return own_error(dialect, e, None, started, false, ""),
    });
    if let Some(t) = timer.as_mut() {
        t.set_stream(request.stream);
    }
    // A request whose history the upstream keeps is forwarded as sent (and counted): see `Request::managed`.
    if let Some(reason) = request.unmanaged_reason() {
        state.metrics.unmanaged(dialect, reason);
    }
    let strategy = match plan::strategy(&parts.headers, cfg.context.strategy) {
        Ok(s) => s,
        Err(e) => return own_error(dialect, e, None, started, request.stream, &request.model),
    };
    // 3. Identify the conversation (namespaced by the caller's credentials); `None`: no history is kept.
    let mut session = identify(
        &parts.headers,
        &cfg.session,
        &state.tenant_key,
        dialect,
        &request.body,
    );
    // 3b. Reconcile with the stored history; new messages are queued for writing, not awaited. A store failure
    //     only costs this turn its recording.
    let mark = reconcile(&state, session.as_ref(), &request).await;
    // The session the store resolved: a request in another dialect than its session's has one of its own.
    if let (Some(s), Some(m)) = (session.as_mut(), mark.as_ref()) {
        if s.id != m.entry.id {
            s.id.clone_from(&m.entry.id);
        }
    }
    // An operator's pin on the session wins over the header and the config.
    let strategy = mark
        .as_ref()
        .and_then(|m| m.entry.pinned_strategy())
        .unwrap_or(strategy);
    let fail = |e| {
        own_error(
            dialect,
            e,
            session.as_ref(),
            started,
            request.stream,
            &request.model,
        )
    };

    // 4. Plan: count the request against its model's window; over budget, rewrite what goes upstream. Without a
    //    rewrite the client's own bytes go upstream, untouched.
    let plan_span = trace.as_ref().map(|t| t.plan());
    let at = PlanAt {
        now: now_secs(),
        trace: plan_span.as_ref().map(|p| p.trace()),
    };
    let outgoing = match plan_request(
        &state,
        &live,
        strategy,
        &request,
        mark.as_ref(),
        &parts.headers,
        at,
    )
    .await
    {
        Ok(o) => o,
        Err(e) => {
            measure::plan_failed(&state, dialect, strategy, &request.model, &e);
            if let Some(p) = plan_span {
                p.fail(&e);
            }
            return fail(e);
        }
    };
    if let Some(p) = plan_span {
        p.finish(&outgoing.planned(strategy));
    }
    if let Some(rw) = &outgoing.rewrite {
        measure::rewrite(&state, dialect, strategy, &request.model, &rw.record);
    }
    if let (Some(rw), Some(mark)) = (&outgoing.rewrite, &mark) {
        record_compression(&state, mark, rw, &request.model);
    }
    let draft = mark
        .as_ref()
        .map(|m| TurnDraft::new(&request, m, strategy, &outgoing));

    // 5. Forward.
    let api = dialect.api();
    let url = state
        .upstream
        .url_for(api, dialect.upstream_path(), parts.uri.query());
    let mut headers = state
        .upstream
        .request_headers_for(api, &parts.headers, true);
    headers.remove(STRATEGY_HEADER);
    // Traced: the upstream round's span, named in the upstream's `traceparent` (the one header ctxgate then adds).
    let mut upstream_trace = trace.as_ref().map(|t| {
        let session_id = session.as_ref().map(|s| s.id.as_str());
        let start = ChatStart::new(dialect.provider(), &request.model, session_id, &url);
        t.upstream(start.planned(&outgoing.planned(strategy)))
    });
    if let Some(t) = upstream_trace.as_mut() {
        let sent = t
            .captures_content()
            .then(|| sent_messages(&outgoing.body, dialect));
        t.round(&mut headers, sent.as_deref());
    }
    let upstream_started = Instant::now();
    if let Some(t) = timer.as_mut() {
        t.upstream_sent();
    }
    let resp = match state
        .upstream
        .send(
            Method::POST,
            &url,
            headers.clone(),
            outgoing.body.clone().into(),
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            measure::send_failed(&state, dialect, timer, &e);
            if let Some(t) = upstream_trace.as_mut() {
                t.failed(&e);
            }
            return fail(e);
        }
    };
    let upstream_wait = upstream_started.elapsed();

    // 6. Relay the answer as it arrives; the tap assembles the reply and finishes the turn. A new session is
    //    only stored (and cached) once the upstream accepted its first request.
    let status = resp.status();
    if let (Some(m), true) = (&mark, status.is_success()) {
        state.sessions.admit(m).await;
    }
    let is_sse = respond::is_event_stream(resp.headers());
    let mut timer = timer.take();
    if let (Some(t), true) = (timer.as_mut(), is_sse) {
        t.streaming();
    }
    let mut turn = Turn {
        state: state.clone(),
        mark: mark.clone(),
        session_id: session.as_ref().map(|s| s.id.clone()).unwrap_or_default(),
        dialect,
        model: request.model.clone(),
        stream: request.stream,
        status,
        upstream_wait,
        started,
        timer,
        planned: measure::PlannedTokens {
            rewritten_from: outgoing.rewrite.as_ref().map(|r| r.record.tokens_before),
            sent_estimate: outgoing.estimate,
        },
        seen: Seen::of(&outgoing),
        draft,
        request: Arc::clone(&request),
        upstream_trace,
    };
    let own = respond::Own {
        session: session.as_ref(),
        rewrite: outgoing
            .rewrite
            .as_ref()
            .and_then(|r| respond::rewrite_header(&r.record)),
    };
    // 6b. The model may call the recall tools we offered: ctxgate answers them and asks again, within the same
    //     response. Anything but a successful first answer is relayed as it is.
    if outgoing
        .rewrite
        .as_ref()
        .is_some_and(|r| r.injected && status.is_success())
    {
        let stored = match &mark {
            Some(m) => m
                .entry
                .with_tree(|t| t.nodes().map(|n| (n.position, n.message.clone())).collect()),
            None => Vec::new(),
        };
        // Built only if the model calls one of the tools.
        let of = Arc::clone(&request);
        let source = LazyHistory::new(move || {
            HistorySource::from_parts(of.messages(), dialect.neutral_history(stored))
        });
        let rounds = rounds::Rounds {
            state: state.clone(),
            live: live.clone(),
            dialect,
            url,
            headers,
            sent: outgoing.body.clone(),
            messages_close: outgoing.messages_close,
            appended: Vec::new(),
            source,
            on_round: record_round(
                &state,
                mark.clone(),
                turn.recall_calls(),
                turn.seen.recall_rounds.clone(),
            ),
            trace: turn.upstream_trace.take(),
            finisher: turn.finisher(None),
        };
        return respond::after_rounds(&state, rounds, resp, is_sse, &request.body, &own).await;
    }
    respond::relayed(
        &state,
        dialect,
        resp,
        is_sse,
        &own,
        turn.finisher(outgoing.estimate),
    )
    .await
}

/// The estimate of `request` as its client sent it: its messages and tools in its model's encoding.
fn uncounted_estimate(counter: &crate::context::tokens::TokenCounter, request: &Parsed) -> u64 {
    let encoding = crate::context::tokens::Encoding::for_model(&request.model);
    let tools = request.body.get("tools").filter(|t| !t.is_null());
    counter.request_tokens(encoding, request.messages(), tools)
}

/// Reconciles the request with the session's stored history and returns where its messages landed; `None` (the
/// turn is proxied without history) when there is no session or the store failed.
async fn reconcile(
    state: &AppState,
    session: Option<&SessionIdentity>,
    request: &Parsed,
) -> Option<RequestMark> {
    let session = session?;
    match state
        .sessions
        .record_request(
            session,
            request.native(),
            &request.item_hashes().map_or_else(
                || raw_item_hashes(&request.raw, request.dialect.conversation_key()),
                <[u64]>::to_vec,
            ),
        )
        .await
    {
        Ok(m) => Some(m),
        // The store's circuit is open: said once when it opened, not for every request.
        Err(StoreError::Unavailable) => None,
        Err(e) => {
            tracing::warn!(error = %e, session = %session.id, "session: could not record the request; proxying without history");
            None
        }
    }
}

/// What the end of a turn needs to know.
struct Turn {
    state: Arc<AppState>,
    mark: Option<RequestMark>,
    session_id: String,
    dialect: Dialect,
    model: String,
    stream: bool,
    status: http::StatusCode,
    upstream_wait: std::time::Duration,
    started: Instant,
    /// Records the request when dropped, at the end of the turn.
    timer: Option<RequestTimer>,
    /// For the token metrics.
    planned: measure::PlannedTokens,
    /// The turn's record of what was sent, completed when the turn ends (recorded sessions only).
    draft: Option<TurnDraft>,
    /// What the access log tells of the rewrite and the recall rounds.
    seen: Seen,
    /// The client's request, counted after the answer when it was sent without being counted and its model has
    /// no calibration yet (so the calibration, and its metric, start with the first answer).
    request: Arc<Parsed>,
    /// The upstream round's span, ended with the answer (traced requests answered in one round).
    upstream_trace: Option<crate::otel::UpstreamTrace>,
}

/// What the access-log line says of a turn beyond the exchange: the rewrite, the tokens and the recall rounds.
struct Seen {
    /// The stages of a rewrite, comma-separated (empty: not rewritten).
    stages: String,
    /// Estimated tokens of the client's request, when counted.
    tokens_client: Option<u64>,
    /// Estimated tokens of what was sent (before the recall tools), when counted.
    tokens_sent: Option<u64>,
    /// Recall rounds ctxgate answered.
    recall_rounds: Arc<std::sync::atomic::AtomicU32>,
}

impl Seen {
    fn of(outgoing: &Outgoing) -> Seen {
        let recall_rounds = Arc::default();
        match &outgoing.rewrite {
            Some(rw) => Seen {
                stages: rw.record.stages.join(","),
                tokens_client: Some(rw.record.tokens_before),
                tokens_sent: Some(rw.record.tokens_after),
                recall_rounds,
            },
            None => Seen {
                stages: String::new(),
                tokens_client: outgoing.client_tokens,
                tokens_sent: outgoing.client_tokens,
                recall_rounds,
            },
        }
    }
}

/// A turn's record before its answer: what was sent (its segments computed in the background while the upstream
/// answers, and only for a rewritten request) and the recall calls answered meanwhile.
struct TurnDraft {
    info: turn_record::TurnInfo,
    segments: Segments,
    calls: Arc<parking_lot::Mutex<Vec<Value>>>,
}

/// What was sent: known at once (sent as it was), or being worked out in the background (rewritten).
enum Segments {
    Ready(Vec<turn_record::Segment>),
    Pending(tokio::task::JoinHandle<Vec<turn_record::Segment>>),
}

/// A conversation field as an array of elements: none when absent, the value itself when not an array.
fn conversation_array(v: Option<&Value>) -> std::borrow::Cow<'_, [Value]> {
    match v {
        Some(Value::Array(a)) => a.as_slice().into(),
        None | Some(Value::Null) => Vec::new().into(),
        Some(other) => vec![other.clone()].into(),
    }
}

impl TurnDraft {
    fn new(
        request: &Arc<Parsed>,
        mark: &RequestMark,
        strategy: crate::config::Strategy,
        outgoing: &Outgoing,
    ) -> TurnDraft {
        let rw = outgoing.rewrite.as_ref();
        let client = outgoing.client_tokens;
        let native = request.native();
        // Replies the client sent back in other bytes than the stored node's (the same message to the tree).
        let resent: Vec<(usize, Value)> = mark.entry.with_tree(|t| {
            mark.path
                .iter()
                .zip(native)
                .enumerate()
                .filter_map(|(i, (id, m))| {
                    let n = t.get(id)?;
                    (n.kind == crate::store::NodeKind::Reply && *n.message != *m)
                        .then(|| (i, m.clone()))
                })
                .collect()
        });
        let segments = match rw {
            None => Segments::Ready(turn_record::with_resent(
                turn_record::unchanged(native.len()),
                &resent,
            )),
            Some(_) => {
                // The client's elements are the parsed request's; only what was sent is parsed (again).
                let (client, sent, key) = (
                    Arc::clone(request),
                    outgoing.body.clone(),
                    request.dialect.conversation_key(),
                );
                Segments::Pending(tokio::spawn(async move {
                    let sent = serde_json::from_slice::<Value>(&sent).ok();
                    let sent = conversation_array(sent.as_ref().and_then(|v| v.get(key)));
                    let segments =
                        turn_record::segments(&sent, &conversation_array(client.body.get(key)));
                    turn_record::with_resent(segments, &resent)
                }))
            }
        };
        TurnDraft {
            info: turn_record::TurnInfo {
                at: now_secs(),
                model: request.model.clone(),
                dialect: request.dialect.as_str(),
                stream: request.stream,
                status: 0,
                strategy: strategy.as_str(),
                rewritten: rw.is_some(),
                stages: rw.map_or_else(Vec::new, |r| {
                    r.record.stages.iter().map(|s| s.to_string()).collect()
                }),
                cuts: rw.map_or_else(Vec::new, |r| r.record.cuts.to_vec()),
                head: mark.path.last().cloned().unwrap_or_default(),
                tokens: turn_record::TurnTokens {
                    client,
                    sent: rw.map_or(client, |r| Some(r.record.tokens_after)),
                    window: outgoing.window,
                    upstream_prompt: None,
                    output: None,
                },
                summary_upto: rw.map_or(0, |r| r.record.summary_upto),
                recall_rounds: 0,
                recall_calls: Vec::new(),
                sent: Vec::new(),
            },
            segments,
            calls: Arc::new(parking_lot::Mutex::new(Vec::new())),
        }
    }

    /// The stored record, once the turn ended with `status` and `outcome`.
    async fn finish(self, status: u16, outcome: &RelayOutcome) -> String {
        let mut info = self.info;
        info.status = status;
        info.tokens.upstream_prompt = outcome.reply.prompt_tokens();
        info.tokens.output = outcome.reply.completion_tokens();
        if !info.rewritten && info.tokens.client.is_none() {
            // Not counted (clearly under the threshold): what the upstream counted is what the client sent.
            info.tokens.client = info.tokens.upstream_prompt;
            info.tokens.sent = info.tokens.upstream_prompt;
        }
        let rounds = std::mem::take(&mut *self.calls.lock());
        info.recall_rounds = rounds.len();
        info.recall_calls = rounds
            .into_iter()
            .flat_map(|r| match r {
                Value::Array(calls) => calls,
                _ => Vec::new(),
            })
            .collect();
        info.sent = match self.segments {
            Segments::Ready(s) => s,
            Segments::Pending(task) => task.await.unwrap_or_default(),
        };
        turn_record::to_json(&info)
    }
}

impl Turn {
    /// Where the recall rounds of this turn put their calls (one entry per round).
    fn recall_calls(&self) -> Option<Arc<parking_lot::Mutex<Vec<Value>>>> {
        self.draft.as_ref().map(|d| d.calls.clone())
    }

    /// 7. The turn is complete (or cut short): record the reply (durably, before the client gets the last
    ///    bytes), calibrate the token estimate against the upstream's count, log it and announce it.
    ///    `estimate`: the estimated tokens of what was sent, when one upstream call answered it.
    fn finisher(self, estimate: Option<u64>) -> relay::Finisher {
        // The client's own bytes went upstream in one call (no rewrite, no recall rounds).
        let forwarded = self.planned.rewritten_from.is_none();
        Box::new(move |outcome: RelayOutcome| {
            Box::pin(async move {
                let state = &self.state;
                let mut timer = self.timer;
                if let Some(t) = timer.as_mut() {
                    t.upstream_ended();
                    t.set_status(self.status.as_u16());
                    if let Some(at) = outcome.first_byte_at {
                        t.first_byte(at);
                    }
                }
                if let Some(mark) = &self.mark {
                    let turn = match self.draft {
                        Some(d) => Some(d.finish(self.status.as_u16(), &outcome).await),
                        None => None,
                    };
                    record_reply(state, self.dialect, mark, self.status, &outcome, turn).await;
                }
                if let Some(mut t) = self.upstream_trace {
                    let broken = outcome.upstream_error.is_some();
                    t.answered(self.status.as_u16(), &outcome.reply, None, broken);
                }
                let actual = outcome.reply.prompt_tokens();
                // Sent without a count (clearly under the threshold): counted now, off the request's path, for
                // the model's first calibration.
                let estimate = estimate.or_else(|| {
                    (actual.is_some() && forwarded && !state.counter.knows(&self.model))
                        .then(|| uncounted_estimate(&state.counter, &self.request))
                });
                if let (Some(est), Some(actual)) = (estimate, actual) {
                    state.counter.observe(&self.model, est, actual);
                }
                measure::turn(
                    state,
                    self.dialect,
                    &self.model,
                    self.status,
                    self.planned,
                    &outcome,
                );
                log_turn(
                    (self.dialect, &self.model, self.stream),
                    self.status.as_u16(),
                    self.upstream_wait,
                    self.started,
                    &self.session_id,
                    &self.seen,
                    &outcome,
                );
                drop(timer); // records the request: the turn is over
                let _ = state.turns.send(TurnEvent {
                    session_id: self.session_id,
                    status: self.status.as_u16(),
                    outcome,
                });
            }) as futures_util::future::BoxFuture<'static, ()>
        })
    }
}

/// The conversation array of the body sent upstream (for `otel.capture_content`).
fn sent_messages(body: &[u8], dialect: Dialect) -> Vec<Value> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|mut v| v.get_mut(dialect.conversation_key()).map(Value::take))
        .map_or_else(Vec::new, |v| conversation_array(Some(&v)).into_owned())
}

/// Keeps the rewrite's record with the session when its cut points moved (later turns that reuse them are the
/// same rewrite). Written in the background: it never delays the request.
fn record_compression(state: &Arc<AppState>, mark: &RequestMark, rw: &Rewritten, model: &str) {
    let same = matches!(
        mark.entry.last_compression(),
        Some(Compression::Rewrite(last)) if last.cuts == rw.record.cuts
    );
    if same {
        return;
    }
    let record = rewrite_record(rw, model, now_secs());
    tracing::info!(
        session = %mark.entry.id,
        stages = ?rw.record.stages,
        tokens_before = rw.record.tokens_before,
        tokens_after = rw.record.tokens_after,
        "context: rewrote the request"
    );
    let (state, mark) = (state.clone(), mark.clone());
    state.tasks.clone().spawn(async move {
        let record = Record::from(Compression::Rewrite(record));
        if let Err(e) = state.sessions.record(&mark, record).await {
            tracing::warn!(error = %e, session = %mark.entry.id, "session: could not store a compression record");
        }
    });
}

/// The stored record of a rewrite: what the planner did, when, for which model, and whether recall was offered.
fn rewrite_record(rw: &Rewritten, model: &str, at: i64) -> RewriteRecord {
    let r = &rw.record;
    RewriteRecord {
        strategy: r.strategy.to_string(),
        stages: r.stages.iter().map(|s| s.to_string()).collect(),
        messages_before: r.messages_before,
        messages_after: r.messages_after,
        tokens_before: r.tokens_before,
        tokens_after: r.tokens_after,
        context_window: r.context_window,
        cleared_results: r.cleared_results,
        pruned_loops: r.pruned_loops,
        dropped_loops: r.dropped_loops,
        dropped_messages: r.dropped_messages,
        summary_upto: r.summary_upto,
        pruned_call_ids: r.pruned_call_ids.clone(),
        cuts: r.cuts.to_vec(),
        at,
        model: model.to_string(),
        recall_offered: rw.injected,
        extra: serde_json::Map::new(),
    }
}

/// Stores each recall round as an internal exchange of the session (never part of its client history), and
/// hands its calls to the turn's record.
fn record_round(
    state: &Arc<AppState>,
    mark: Option<RequestMark>,
    calls: Option<Arc<parking_lot::Mutex<Vec<Value>>>>,
    rounds: Arc<std::sync::atomic::AtomicU32>,
) -> Box<dyn Fn(Value) + Send + Sync> {
    let state = state.clone();
    Box::new(move |exchange: Value| {
        rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(calls) = &calls {
            calls
                .lock()
                .push(exchange.get("calls").cloned().unwrap_or(Value::Null));
        }
        let Some(mark) = mark.clone() else {
            return;
        };
        let st = state.clone();
        state.tasks.spawn(async move {
            let mut record = exchange;
            if let Some(o) = record.as_object_mut() {
                o.insert("at".into(), Value::from(now_secs()));
                o.insert("by".into(), Value::from("ctxgate"));
            }
            if let Err(e) = st.sessions.record(&mark, Record::Internal(record)).await {
                tracing::warn!(error = %e, session = %mark.entry.id, "session: could not store a recall round");
            }
        });
    })
}

/// Stores the assistant's reply when the upstream gave one, with the turn's record in the same write; a reply cut
/// short (or ended by an error event) is stored marked partial, and a reply that says nothing (e.g. a bare
/// `[DONE]`) is not stored: the head stays, and the turn's record is written on its own.
async fn record_reply(
    state: &AppState,
    dialect: Dialect,
    mark: &RequestMark,
    status: http::StatusCode,
    outcome: &RelayOutcome,
    turn: Option<String>,
) {
    let reply = &outcome.reply;
    if !status.is_success() || reply.is_empty() {
        // Written in the background: an error answer is not held back for a record of it.
        if let Some(turn) = turn {
            let (sessions, entry) = (state.sessions.clone(), mark.entry.clone());
            state.tasks.spawn(async move {
                if let Err(e) = sessions.record_turn(&entry, turn).await {
                    tracing::warn!(error = %e, session = %entry.id, "session: could not record the turn");
                }
            });
        }
        return;
    }
    match state
        .sessions
        .record_replies(
            mark,
            dialect.reply_messages(reply.message.clone()),
            !reply.complete,
            turn,
        )
        .await
    {
        // Queued, not waited for: the store's circuit is open (said once when it opened).
        Ok(()) | Err(StoreError::Unavailable) => {}
        Err(e) => {
            tracing::warn!(error = %e, session = %mark.entry.id, "session: could not record the reply")
        }
    }
}

/// The access log line of a turn; `request`: its dialect, model and stream flag.
fn log_turn(
    (dialect, model, stream): (Dialect, &str, bool),
    status: u16,
    upstream_wait: std::time::Duration,
    started: Instant,
    session_id: &str,
    seen: &Seen,
    outcome: &RelayOutcome,
) {
    let recall_rounds = seen
        .recall_rounds
        .load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        target: "ctxgate::access",
        method = "POST",
        path = dialect.client_path(),
        dialect = dialect.as_str(),
        status,
        model,
        stream,
        session = session_id,
        rewritten = !seen.stages.is_empty(),
        stages = seen.stages.as_str(),
        tokens_client = seen.tokens_client,
        tokens_sent = seen.tokens_sent,
        recall_rounds,
        upstream_ms = upstream_wait.as_secs_f64() * 1000.0,
        total_ms = started.elapsed().as_secs_f64() * 1000.0,
        bytes = outcome.bytes,
        complete = outcome.reply.complete,
        client_disconnected = outcome.client_disconnected,
        upstream_error = outcome.upstream_error.as_deref().unwrap_or(""),
        "conversation"
    );
}
