//! Stage 3: which conversation a request continues (namespaced by the caller's credentials), and where its
//! messages land in the session's stored history. New messages are queued for writing, not awaited; a store
//! failure only costs the turn its recording.

use super::identity::identify;
use super::Exchange;
use crate::app::AppState;
use crate::dialect::Request as Parsed;
use crate::session::tree::raw_item_hashes;
use crate::session::{RequestMark, SessionIdentity};
use crate::store::StoreError;
use http::HeaderMap;

impl Exchange {
    /// Identifies the session (`None`: no history is kept) and reconciles the request with it. The session is
    /// the one the store resolved (a request in another dialect than its session's has one of its own), and an
    /// operator's pin on it wins over the header's and the config's strategy.
    pub(super) async fn identify(&mut self, headers: &HeaderMap) {
        let mut session = identify(
            headers,
            &self.live.config.session,
            &self.state.tenant_key,
            self.dialect,
            &self.request.body,
        );
        let (mark, hashes) = reconcile(&self.state, session.as_ref(), &self.request).await;
        self.item_hashes = hashes;
        if let (Some(s), Some(m)) = (session.as_mut(), mark.as_ref()) {
            if s.id != m.entry.id {
                s.id.clone_from(&m.entry.id);
            }
        }
        if let Some(pinned) = mark.as_ref().and_then(|m| m.entry.pinned_strategy()) {
            self.strategy = pinned;
        }
        self.session = session;
        self.mark = mark;
    }
}

/// Reconciles the request with the session's stored history and returns where its messages landed, with the
/// hashes of its conversation elements' bytes (kept for the turn's cache analysis, `cache_miss`); `None` (the
/// turn is proxied without history) when there is no session or the store failed.
async fn reconcile(
    state: &AppState,
    session: Option<&SessionIdentity>,
    request: &Parsed,
) -> (Option<RequestMark>, Vec<u64>) {
    let Some(session) = session else {
        return (None, Vec::new());
    };
    let hashes = request.item_hashes().map_or_else(
        || raw_item_hashes(&request.raw, request.dialect.conversation_key()),
        <[u64]>::to_vec,
    );
    let mark = match state
        .sessions
        .record_request(session, request.native(), &hashes)
        .await
    {
        Ok(m) => Some(m),
        // The store's circuit is open: said once when it opened, not for every request.
        Err(StoreError::Unavailable) => None,
        Err(e) => {
            tracing::warn!(error = %e, session = %session.id, "session: could not record the request; proxying without history");
            None
        }
    };
    (mark, hashes)
}
