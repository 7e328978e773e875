//! Stage 7: the end of a turn, when its answer has been relayed (or cut short): the reply recorded, the token
//! estimate calibrated, the metrics and the access-log line written, the turn announced.

use super::access::{self, End, Logged};
use super::draft::TurnDraft;
use super::forward::Sent;
use super::records::{record_reply, record_round};
use super::{measure, Exchange, Outgoing};
use crate::app::{AppState, Rates, TurnEvent};
use crate::context::tokens::{Encoding, TokenCounter};
use crate::dialect::{Dialect, Request as Parsed};
use crate::metrics::RequestTimer;
use crate::otel::UpstreamTrace;
use crate::relay::{self, RelayOutcome};
use crate::session::RequestMark;
use serde_json::Value;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the end of a turn needs to know.
pub(super) struct Turn {
    state: Arc<AppState>,
    mark: Option<RequestMark>,
    session_id: String,
    dialect: Dialect,
    model: String,
    /// The model that answered: `model`, or its fallback (`context.on_overflow = "fallback"`), whose estimate
    /// is calibrated and whose price the turn's money is counted at.
    answered: String,
    stream: bool,
    status: http::StatusCode,
    upstream_wait: Duration,
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
    upstream_trace: Option<UpstreamTrace>,
    /// The model's price (`None`: not priced) and the prompt tokens the rewrite removed, for the turn's money.
    rates: Option<Rates>,
    removed: u64,
    /// How long the provider keeps the answering model's prompt cache (`[models] cache_ttl`).
    cache_ttl: Duration,
}

/// What the access-log line says of a turn beyond the exchange: the rewrite, the tokens and the recall rounds.
pub(super) struct Seen {
    /// The stages of a rewrite, comma-separated (empty: not rewritten).
    pub stages: String,
    /// Estimated tokens of the client's request, when counted.
    pub tokens_client: Option<u64>,
    /// Estimated tokens of what was sent (before the recall tools), when counted.
    pub tokens_sent: Option<u64>,
    /// Recall rounds ctxgate answered.
    pub recall_rounds: Arc<AtomicU32>,
    /// The model that answered instead of the one asked for (`context.on_overflow = "fallback"`).
    pub fallback: Option<String>,
}

impl Seen {
    /// What `outgoing`'s plan did; no recall rounds yet.
    pub(super) fn of(outgoing: &Outgoing) -> Seen {
        let recall_rounds = Arc::default();
        match &outgoing.rewrite {
            Some(rw) => Seen {
                stages: rw.record.stages.join(","),
                tokens_client: Some(rw.record.tokens_before),
                tokens_sent: Some(rw.record.tokens_after),
                recall_rounds,
                fallback: outgoing.fallback.clone(),
            },
            None => Seen {
                stages: String::new(),
                tokens_client: outgoing.client_tokens,
                tokens_sent: outgoing.client_tokens,
                recall_rounds,
                fallback: outgoing.fallback.clone(),
            },
        }
    }
}

impl Turn {
    /// The turn of `ex`, planned as `outgoing` and answered as `sent` (whose span it takes); `timer` records the
    /// request when the turn ends.
    pub(super) fn new(
        ex: &Exchange,
        outgoing: &Outgoing,
        draft: Option<TurnDraft>,
        sent: &mut Sent,
        timer: Option<RequestTimer>,
    ) -> Turn {
        let request = &ex.request;
        let answered = outgoing.fallback.as_deref().unwrap_or(&request.model);
        let (rates, cache_ttl) = ex.live.prices.rates_and_ttl(answered);
        Turn {
            state: ex.state.clone(),
            mark: ex.mark.clone(),
            session_id: ex
                .session
                .as_ref()
                .map(|s| s.id.clone())
                .unwrap_or_default(),
            dialect: ex.dialect,
            model: request.model.clone(),
            answered: outgoing
                .fallback
                .clone()
                .unwrap_or_else(|| request.model.clone()),
            stream: request.stream,
            status: sent.resp.status(),
            upstream_wait: sent.upstream_wait,
            started: ex.started,
            timer,
            planned: measure::PlannedTokens {
                rewritten_from: outgoing.rewrite.as_ref().map(|r| r.record.tokens_before),
                sent_estimate: outgoing.estimate,
            },
            seen: Seen::of(outgoing),
            draft,
            request: Arc::clone(request),
            upstream_trace: sent.trace.take(),
            rates,
            cache_ttl,
            removed: outgoing.rewrite.as_ref().map_or(0, |r| {
                r.record.tokens_before.saturating_sub(r.record.tokens_after)
            }),
        }
    }

    /// What each recall round of the turn is handed to: stored with the session, counted for the access log, its
    /// calls kept for the turn's record.
    pub(super) fn on_round(&self) -> Box<dyn Fn(Value) + Send + Sync> {
        let calls = self.draft.as_ref().map(|d| d.calls.clone());
        let rounds = self.seen.recall_rounds.clone();
        record_round(&self.state, self.mark.clone(), calls, rounds)
    }

    /// The upstream round's span, for the recall rounds to carry on (and end).
    pub(super) fn take_trace(&mut self) -> Option<UpstreamTrace> {
        self.upstream_trace.take()
    }

    /// 7. The turn is complete (or cut short): record the reply (durably, before the client gets the last
    ///    bytes), calibrate the token estimate against the upstream's count, log it and announce it.
    ///    `estimate`: the estimated tokens of what was sent, when one upstream call answered it.
    pub(super) fn finisher(self, estimate: Option<u64>) -> relay::Finisher {
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
                let reported = measure::Reported::of(&outcome);
                let money = self
                    .rates
                    .filter(|_| self.status.is_success())
                    .and_then(|r| measure::money(&r, &reported, self.removed));
                let mut cache = None;
                if let Some(mark) = &self.mark {
                    let turn = match self.draft {
                        Some(d) => {
                            let (turn, report) = d
                                .finish(
                                    self.status.as_u16(),
                                    &outcome,
                                    money,
                                    (&reported, self.rates.as_ref(), self.cache_ttl),
                                )
                                .await;
                            cache = report;
                            Some(turn)
                        }
                        None => None,
                    };
                    record_reply(state, self.dialect, mark, self.status, &outcome, turn).await;
                }
                if let Some(mut t) = self.upstream_trace {
                    let broken = outcome.upstream_error.is_some();
                    t.answered(self.status.as_u16(), &outcome.reply.answer(None), broken);
                }
                let actual = outcome.reply.prompt_tokens();
                // Sent without a count (clearly under the threshold): counted now, off the request's path, for
                // the model's first calibration.
                let estimate = estimate.or_else(|| {
                    (forwarded && wants_count(&state.counter, &self.model, &self.request, actual))
                        .then(|| uncounted_estimate(&state.counter, &self.request))
                });
                if let (Some(est), Some(actual)) = (estimate, actual) {
                    state.counter.observe(&self.answered, est, actual);
                }
                measure::turn(
                    state,
                    self.dialect,
                    &self.model,
                    self.status,
                    self.planned,
                    &outcome,
                    &reported,
                    money,
                );
                if let Some(c) = &cache {
                    measure::cache_miss(state, self.dialect, &self.answered, c);
                }
                let logged = Logged {
                    dialect: self.dialect,
                    started: self.started,
                    model: &self.model,
                    stream: self.stream,
                    session: Some(&self.session_id),
                };
                let end = End::Answered {
                    status: self.status.as_u16(),
                    upstream_wait: self.upstream_wait,
                    outcome: &outcome,
                };
                access::write(&logged, Some(&self.seen), end);
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

/// Whether a request sent without a count is counted after its answer: its model has no calibration yet and
/// the upstream reported a count that can be a calibration sample (a mock or proxy that reports a fixed or
/// implausible usage would otherwise have every long request counted in full after its answer, for nothing).
fn wants_count(counter: &TokenCounter, model: &str, request: &Parsed, actual: Option<u64>) -> bool {
    actual.is_some_and(|a| TokenCounter::could_calibrate(request.messages().len(), a))
        && !counter.knows(model)
}

/// The estimate of `request` as its client sent it: its messages and tools in its model's encoding.
fn uncounted_estimate(counter: &TokenCounter, request: &Parsed) -> u64 {
    let encoding = Encoding::for_model(&request.model);
    let tools = request.body.get("tools").filter(|t| !t.is_null());
    counter.request_tokens(encoding, request.messages(), tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde_json::json;

    fn chat(messages: usize) -> Parsed {
        let msgs: Vec<Value> = (0..messages)
            .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("step {i}")}))
            .collect();
        let body = json!({"model": "gpt-4o-mini", "messages": msgs});
        match Dialect::Chat.parse(Bytes::from(body.to_string()), &Default::default()) {
            Ok(r) => r,
            Err(e) => panic!("{e:?}"),
        }
    }

    /// A usage no estimate of the request could be calibrated against (below half the floor of 3 tokens per
    /// message plus 3) is not worth counting the request for; a plausible one is, until the model is known.
    #[test]
    fn an_uncounted_request_is_counted_only_for_a_usable_sample() {
        let counter = TokenCounter::new();
        let long = chat(20); // floor 63 tokens: the bench upstream's fixed 24 is implausible whatever the text
        assert!(!wants_count(&counter, "m", &long, Some(24)));
        assert!(!wants_count(&counter, "m", &long, None));
        assert!(wants_count(&counter, "m", &long, Some(32)));
        let short = chat(2); // floor 9
        assert!(wants_count(&counter, "m", &short, Some(24)));
        // The bound only skips samples `observe` would ignore: the real estimate is above the floor.
        let est = uncounted_estimate(&counter, &long);
        assert!(est >= 63, "{est}");
        counter.observe("m", est, 31);
        assert!(
            !counter.knows("m"),
            "a sample under the floor's half is ignored"
        );
        counter.observe("m", est, est);
        assert!(counter.knows("m"));
        assert!(!wants_count(&counter, "m", &long, Some(est)));
    }
}
