//! Stage 4 as a request lives it: the plan (`plan`) under its span, then what a rewrite leaves behind — its
//! metrics and, when its cut points moved, its record with the session.

use super::{measure, plan_request, Exchange, Outgoing, PlanAt, Rewritten};
use crate::app::AppState;
use crate::error::GatewayError;
use crate::session::manager::now_secs;
use crate::session::RequestMark;
use crate::store::records::RewriteRecord;
use crate::store::{Compression, Record};
use http::HeaderMap;
use std::sync::Arc;

impl Exchange {
    /// Counts the request against its model's window and, over budget, rewrites what goes upstream; without a
    /// rewrite the client's own bytes go upstream, untouched. `headers`: the client's.
    pub(super) async fn plan(&self, headers: &HeaderMap) -> Result<Outgoing, GatewayError> {
        let (state, model) = (&self.state, &self.request.model);
        let span = self.trace.as_ref().map(|t| t.plan());
        let at = PlanAt {
            now: now_secs(),
            trace: span.as_ref().map(|p| p.trace()),
        };
        let planned = plan_request(
            state,
            &self.live,
            self.strategy,
            &self.request,
            self.mark.as_ref(),
            headers,
            at,
        )
        .await;
        let outgoing = match planned {
            Ok(o) => o,
            Err(e) => {
                measure::plan_failed(state, self.dialect, self.strategy, model, &e);
                if let Some(p) = span {
                    p.fail(&e);
                }
                return Err(e);
            }
        };
        if let Some(p) = span {
            p.finish(&outgoing.planned(self.strategy));
        }
        if let Some(fallback) = &outgoing.fallback {
            state.metrics.fallback(model, fallback);
            self.log_fallback(fallback, &outgoing);
        }
        if let Some(rw) = &outgoing.rewrite {
            measure::rewrite(state, self.dialect, self.strategy, model, &rw.record);
            if rw.record.stages.contains(&"truncated") {
                self.log_truncated(rw);
            }
            if let Some(mark) = &self.mark {
                record_compression(state, mark, rw, model);
            }
        }
        Ok(outgoing)
    }
}

impl Exchange {
    /// The operator's line for a request that lost whole messages to the hard limit (`context.on_overflow =
    /// "truncate"`): what and how much, never what they held.
    fn log_truncated(&self, rw: &Rewritten) {
        let r = &rw.record;
        tracing::warn!(
            target: "ctxgate::context",
            dialect = self.dialect.as_str(),
            model = self.request.model.as_str(),
            session = self.session.as_ref().map_or("", |s| s.id.as_str()),
            dropped_messages = r.dropped_messages,
            messages_client = r.messages_before,
            messages_sent = r.messages_after,
            tokens_client = r.tokens_before,
            tokens_sent = r.tokens_after,
            window = r.context_window,
            recall_offered = rw.injected,
            "the hard limit dropped whole messages, or cut the task to its head and tail, from what was sent \
             upstream (stage truncated; the history keeps them): set context.on_overflow = \"refuse\" to answer context_length_exceeded instead, or \
             use a model with a larger window"
        );
    }
}

impl Exchange {
    /// The operator's line for a request sent to its model's fallback: which models and how many tokens, never
    /// what the messages held.
    fn log_fallback(&self, fallback: &str, outgoing: &Outgoing) {
        let rw = outgoing.rewrite.as_ref().map(|r| &r.record);
        tracing::info!(
            target: "ctxgate::context",
            dialect = self.dialect.as_str(),
            model = self.request.model.as_str(),
            fallback,
            session = self.session.as_ref().map_or("", |s| s.id.as_str()),
            window = outgoing.window,
            tokens_client = outgoing.client_tokens,
            tokens_sent = rw.map_or(outgoing.client_tokens, |r| Some(r.tokens_after)),
            rewritten = rw.is_some(),
            "the request does not fit its model's window: sent to its fallback model \
             (context.on_overflow = \"fallback\")"
        );
    }
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
