//! What a turn stores with its session besides the request's messages: the reply (with the turn's record) and each
//! recall round as an internal exchange. Store failures are logged and cost only the record.

use crate::app::AppState;
use crate::dialect::Dialect;
use crate::relay::RelayOutcome;
use crate::session::manager::now_secs;
use crate::session::RequestMark;
use crate::store::{Record, StoreError};
use serde_json::Value;
use std::sync::Arc;

/// Stores each recall round as an internal exchange of the session (never part of its client history), and
/// hands its calls to the turn's record.
pub(super) fn record_round(
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
pub(super) async fn record_reply(
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
