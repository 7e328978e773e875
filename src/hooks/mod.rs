//! Webhooks: when a session goes idle (`[hooks] session_idle_after` without a request or reply), its export is
//! POSTed to `session_idle_url`, signed (`x-ctxgate-signature: sha256=<HMAC-SHA256 of the body>`), once per idle
//! period. What is due is derived from the sessions' rows (`last_active`, `idle_notified`), so a delivery pending
//! at a crash or restart is found again by the next sweep; a period is marked done once the receiver answered 2xx
//! (or refused it with a 4xx other than 429). On a shared store a per-session lock keeps two instances from
//! delivering the same period.

use crate::app::AppState;
use crate::metrics::HookOutcome;
use crate::session::manager::now_secs;
use crate::store::{Lock, SessionMeta};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Header carrying the body's signature.
pub const SIGNATURE_HEADER: &str = "x-ctxgate-signature";
/// Header naming the delivery (`<session>:<last_active>`): the same for every attempt of one idle period.
pub const DELIVERY_HEADER: &str = "x-ctxgate-delivery";

/// Sessions read from the store per page while sweeping.
const PAGE: u32 = 500;

/// `sha256=<hex>` of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        // HMAC takes keys of any length; this cannot happen.
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Starts the sweeper when `[hooks] session_idle_url` is set.
pub fn spawn(state: &Arc<AppState>) {
    let cfg = &state.config.hooks;
    let (Some(url), Some(secret)) = (cfg.session_idle_url.clone(), cfg.secret.clone()) else {
        return;
    };
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(cfg.timeout_secs))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "hooks: cannot build the HTTP client; the idle webhook is off");
            return;
        }
    };
    let sweeper = Sweeper {
        state: Arc::downgrade(state),
        url,
        secret,
        client,
        idle_after: cfg.idle_after(),
        max_backoff: cfg.max_backoff(),
        backoff: HashMap::new(),
    };
    tracing::info!(
        idle_after_secs = sweeper.idle_after.as_secs_f64(),
        "hooks: idle sessions are posted to the session_idle_url"
    );
    tokio::spawn(sweeper.run());
}

struct Sweeper {
    /// Weak: the sweeper ends with the gateway.
    state: std::sync::Weak<AppState>,
    url: String,
    secret: String,
    client: reqwest::Client,
    idle_after: Duration,
    max_backoff: Duration,
    /// Failing deliveries: (attempts so far, not before).
    backoff: HashMap<String, (u32, Instant)>,
}

/// How one attempt ended.
enum Attempt {
    Delivered,
    Retry(String),
    Refused(u16),
}

impl Sweeper {
    /// Sweeps every quarter of the idle time (between 0.2 s and 30 s).
    async fn run(mut self) {
        let every =
            (self.idle_after / 4).clamp(Duration::from_millis(200), Duration::from_secs(30));
        loop {
            tokio::time::sleep(every).await;
            let Some(state) = self.state.upgrade() else {
                return;
            };
            if let Err(e) = self.sweep(&state).await {
                tracing::warn!(error = %e, "hooks: the sweep failed; trying again at the next one");
            }
        }
    }

    async fn sweep(&mut self, state: &Arc<AppState>) -> Result<(), crate::store::StoreError> {
        let cutoff = now_secs() - i64::try_from(self.idle_after.as_secs()).unwrap_or(i64::MAX);
        let mut due: Vec<SessionMeta> = Vec::new();
        let mut at = 0;
        loop {
            let (rows, _) = state.sessions.list(PAGE, at).await?;
            if rows.is_empty() {
                break;
            }
            at += rows.len() as u64;
            due.extend(
                rows.into_iter()
                    .filter(|m| m.last_active <= cutoff && m.idle_notified != Some(m.last_active)),
            );
        }
        state.metrics.hooks_pending(due.len());
        self.backoff.retain(|id, _| due.iter().any(|m| &m.id == id));
        let now = Instant::now();
        for m in due {
            if self.backoff.get(&m.id).is_some_and(|(_, next)| *next > now) {
                continue;
            }
            self.deliver(state, &m).await;
        }
        Ok(())
    }

    /// One attempt for session `m`'s idle period, under the session's lock on a shared store.
    async fn deliver(&mut self, state: &Arc<AppState>, m: &SessionMeta) {
        let store = state.sessions.store().clone();
        let token = match store.lock(&m.id, "idle-hook", 60_000).await {
            Ok(Lock::HeldElsewhere) => return,
            Ok(Lock::Acquired(t)) => Some(t),
            Ok(Lock::Local) => None,
            Err(e) => {
                tracing::warn!(error = %e, session = %m.id, "hooks: cannot take the delivery lock");
                return;
            }
        };
        // Another instance may have delivered it while this one was listing.
        if token.is_some() {
            match store.load(&m.id).await {
                Ok(Some(s))
                    if s.meta.idle_notified == Some(m.last_active)
                        || s.meta.last_active != m.last_active =>
                {
                    let _ = store.unlock(&m.id, "idle-hook", token.unwrap_or(0)).await;
                    return;
                }
                Ok(Some(_)) => {}
                _ => {
                    let _ = store.unlock(&m.id, "idle-hook", token.unwrap_or(0)).await;
                    return;
                }
            }
        }
        let outcome = self.attempt(state, m).await;
        match outcome {
            Some(Attempt::Delivered) => {
                state.metrics.hook(HookOutcome::Delivered);
                self.backoff.remove(&m.id);
                self.mark(state, m).await;
                tracing::info!(session = %m.id, "hooks: idle session delivered");
            }
            Some(Attempt::Refused(status)) => {
                state.metrics.hook(HookOutcome::Failed);
                self.backoff.remove(&m.id);
                self.mark(state, m).await;
                tracing::warn!(session = %m.id, status, "hooks: the receiver refused the idle session; not retried for this idle period");
            }
            Some(Attempt::Retry(why)) => {
                state.metrics.hook(HookOutcome::Retried);
                let (n, _) = self
                    .backoff
                    .get(&m.id)
                    .copied()
                    .unwrap_or((0, Instant::now()));
                let wait = Duration::from_secs(1u64 << n.min(20)).min(self.max_backoff);
                self.backoff
                    .insert(m.id.clone(), (n + 1, Instant::now() + wait));
                tracing::warn!(session = %m.id, reason = %why, retry_in_secs = wait.as_secs(), "hooks: idle session delivery failed; retrying");
            }
            None => {}
        }
        if let Some(t) = token {
            let _ = store.unlock(&m.id, "idle-hook", t).await;
        }
    }

    /// Posts the session's export; `None` when there is nothing to post (the session is gone).
    async fn attempt(&self, state: &Arc<AppState>, m: &SessionMeta) -> Option<Attempt> {
        let body = match crate::session::export::export_session(&state.sessions, &m.id).await {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(e) => return Some(Attempt::Retry(format!("export: {e}"))),
        };
        let sent = self
            .client
            .post(&self.url)
            .header(http::header::CONTENT_TYPE, "application/x-ndjson")
            .header(SIGNATURE_HEADER, signature(&self.secret, &body))
            .header("x-ctxgate-session", &m.id)
            .header(DELIVERY_HEADER, format!("{}:{}", m.id, m.last_active))
            .body(body)
            .send()
            .await;
        Some(match sent {
            Ok(r) if r.status().is_success() => Attempt::Delivered,
            Ok(r) if r.status().as_u16() == 429 || r.status().is_server_error() => {
                Attempt::Retry(format!("status {}", r.status().as_u16()))
            }
            Ok(r) => Attempt::Refused(r.status().as_u16()),
            Err(e) => Attempt::Retry(if e.is_timeout() {
                "timed out".into()
            } else {
                "connection failed".into()
            }),
        })
    }

    async fn mark(&self, state: &AppState, m: &SessionMeta) {
        if let Err(e) = state
            .sessions
            .mark_idle_notified(&m.id, m.last_active)
            .await
        {
            // Not marked: the next sweep delivers it again (the receiver sees the same x-ctxgate-delivery).
            tracing::warn!(error = %e, session = %m.id, "hooks: could not record the delivery");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_hex_hmac_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
