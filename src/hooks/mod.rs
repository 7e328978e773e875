//! Webhooks: when a session goes idle (`[hooks] session_idle_after` without a request or reply), its export is
//! POSTed to `session_idle_url`, signed (`x-ctxgate-signature: sha256=<HMAC-SHA256 of the body>`), once per idle
//! period. What is due is derived from the sessions' rows (`last_active`, `idle_notified`), so a delivery pending
//! at a crash or restart is found again by the next sweep; a period is marked done once the receiver answered 2xx
//! (or refused it with a 4xx other than 429). On a shared store a per-session lock keeps two instances from
//! delivering the same period. The sessions due in one sweep are posted concurrently, up to
//! `[hooks] concurrent_deliveries` at a time, so a receiver that hangs costs one timeout per that many.

use crate::config::HooksConfig;
use crate::error::GatewayError;
use crate::metrics::{HookOutcome, Metrics};
use crate::session::manager::now_secs;
use crate::session::Sessions;
use crate::store::{Lock, SessionMeta};
use crate::upstream::Upstream;
use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue};
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
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

/// Starts the sweeper when `[hooks] session_idle_url` is set (the server does, once it is bound): it reads the
/// `sessions`, counts in `metrics`, and posts through `client`, the upstream's pooled HTTP client. It ends when
/// the sessions are dropped with the gateway.
pub fn spawn(cfg: &HooksConfig, sessions: &Arc<Sessions>, metrics: Arc<Metrics>, client: Upstream) {
    let (Some(url), Some(secret)) = (cfg.session_idle_url.clone(), cfg.secret.clone()) else {
        return;
    };
    let sweeper = Sweeper {
        sessions: Arc::downgrade(sessions),
        metrics,
        url,
        secret,
        client,
        timeout: Duration::from_secs(cfg.timeout_secs),
        idle_after: cfg.idle_after(),
        max_backoff: cfg.max_backoff(),
        concurrency: cfg.concurrent_deliveries.max(1),
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
    sessions: Weak<Sessions>,
    metrics: Arc<Metrics>,
    url: String,
    secret: String,
    client: Upstream,
    /// How long one delivery may wait for the receiver's answer.
    timeout: Duration,
    idle_after: Duration,
    max_backoff: Duration,
    /// Most deliveries in flight at once (`hooks.concurrent_deliveries`).
    concurrency: usize,
    /// Failing deliveries: (attempts so far, not before).
    backoff: HashMap<String, (u32, Instant)>,
}

/// What became of a due session in a sweep.
enum Ended {
    /// Delivered or refused: the period is done (its backoff forgotten).
    Done,
    /// Failed: retried after a backoff.
    Retry(String),
    /// Not attempted (another instance has it, or the session is gone).
    Skipped,
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
            let Some(sessions) = self.sessions.upgrade() else {
                return;
            };
            if let Err(e) = self.sweep(&sessions).await {
                tracing::warn!(error = %e, "hooks: the sweep failed; trying again at the next one");
            }
        }
    }

    async fn sweep(&mut self, sessions: &Sessions) -> Result<(), crate::store::StoreError> {
        let cutoff = now_secs() - i64::try_from(self.idle_after.as_secs()).unwrap_or(i64::MAX);
        let mut due: Vec<SessionMeta> = Vec::new();
        let mut at = 0;
        loop {
            let (rows, _) = sessions.list(PAGE, at).await?;
            if rows.is_empty() {
                break;
            }
            at += rows.len() as u64;
            due.extend(
                rows.into_iter()
                    .filter(|m| m.last_active <= cutoff && m.idle_notified != Some(m.last_active)),
            );
        }
        self.metrics.hooks_pending(due.len());
        self.backoff.retain(|id, _| due.iter().any(|m| &m.id == id));
        let now = Instant::now();
        due.retain(|m| self.backoff.get(&m.id).is_none_or(|(_, next)| *next <= now));
        // Concurrently, up to `concurrent_deliveries`: a receiver that hangs costs one timeout per that many
        // sessions, not one per session. Each session appears once per sweep, so each period is still attempted
        // once at a time (and on a shared store under its lock).
        let this = &*self;
        let ended: Vec<(String, Ended)> = futures_util::stream::iter(due)
            .map(|m| async move {
                let ended = this.deliver(sessions, &m).await;
                (m.id, ended)
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        for (id, ended) in ended {
            let why = match ended {
                Ended::Skipped => continue,
                Ended::Done => {
                    self.backoff.remove(&id);
                    continue;
                }
                Ended::Retry(why) => why,
            };
            self.metrics.hook(HookOutcome::Retried);
            let (n, _) = self
                .backoff
                .get(&id)
                .copied()
                .unwrap_or((0, Instant::now()));
            let wait = Duration::from_secs(1u64 << n.min(20)).min(self.max_backoff);
            self.backoff
                .insert(id.clone(), (n + 1, Instant::now() + wait));
            tracing::warn!(session = %id, reason = %why, retry_in_secs = wait.as_secs(), "hooks: idle session delivery failed; retrying");
        }
        Ok(())
    }

    /// One attempt for session `m`'s idle period, under the session's lock on a shared store.
    async fn deliver(&self, sessions: &Sessions, m: &SessionMeta) -> Ended {
        let store = sessions.store().clone();
        let token = match store.lock(&m.id, "idle-hook", 60_000).await {
            Ok(Lock::HeldElsewhere) => return Ended::Skipped,
            Ok(Lock::Acquired(t)) => Some(t),
            Ok(Lock::Local) => None,
            Err(e) => {
                tracing::warn!(error = %e, session = %m.id, "hooks: cannot take the delivery lock");
                return Ended::Skipped;
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
                    return Ended::Skipped;
                }
                Ok(Some(_)) => {}
                _ => {
                    let _ = store.unlock(&m.id, "idle-hook", token.unwrap_or(0)).await;
                    return Ended::Skipped;
                }
            }
        }
        let outcome = self.attempt(sessions, m).await;
        let ended = match outcome {
            Some(Attempt::Delivered) => {
                self.metrics.hook(HookOutcome::Delivered);
                self.mark(sessions, m).await;
                tracing::info!(session = %m.id, "hooks: idle session delivered");
                Ended::Done
            }
            Some(Attempt::Refused(status)) => {
                self.metrics.hook(HookOutcome::Failed);
                self.mark(sessions, m).await;
                tracing::warn!(session = %m.id, status, "hooks: the receiver refused the idle session; not retried for this idle period");
                Ended::Done
            }
            Some(Attempt::Retry(why)) => Ended::Retry(why),
            None => Ended::Skipped,
        };
        if let Some(t) = token {
            let _ = store.unlock(&m.id, "idle-hook", t).await;
        }
        ended
    }

    /// Posts the session's export; `None` when there is nothing to post (the session is gone).
    async fn attempt(&self, sessions: &Sessions, m: &SessionMeta) -> Option<Attempt> {
        let body = match crate::session::export::export_session(sessions, &m.id).await {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(e) => return Some(Attempt::Retry(format!("export: {e}"))),
        };
        let Some(headers) = headers(&self.secret, &body, m) else {
            return Some(Attempt::Retry(
                "the session id is not a header value".into(),
            ));
        };
        let sent = self
            .client
            .send_within(
                http::Method::POST,
                &self.url,
                headers,
                axum::body::Body::from(body),
                self.timeout,
            )
            .await;
        Some(match sent {
            Ok(r) if r.status().is_success() => Attempt::Delivered,
            Ok(r) if r.status().as_u16() == 429 || r.status().is_server_error() => {
                Attempt::Retry(format!("status {}", r.status().as_u16()))
            }
            Ok(r) => Attempt::Refused(r.status().as_u16()),
            Err(GatewayError::UpstreamTimeout(_)) => Attempt::Retry("timed out".into()),
            Err(_) => Attempt::Retry("connection failed".into()),
        })
    }

    async fn mark(&self, sessions: &Sessions, m: &SessionMeta) {
        if let Err(e) = sessions.mark_idle_notified(&m.id, m.last_active).await {
            // Not marked: the next sweep delivers it again (the receiver sees the same x-ctxgate-delivery).
            tracing::warn!(error = %e, session = %m.id, "hooks: could not record the delivery");
        }
    }
}

/// A delivery's headers: the body's type and signature, the session, the delivery's name; `None` when the
/// session id cannot be a header value.
fn headers(secret: &str, body: &[u8], m: &SessionMeta) -> Option<HeaderMap> {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(
        SIGNATURE_HEADER,
        HeaderValue::from_str(&signature(secret, body)).ok()?,
    );
    h.insert("x-ctxgate-session", HeaderValue::from_str(&m.id).ok()?);
    h.insert(
        DELIVERY_HEADER,
        HeaderValue::from_str(&format!("{}:{}", m.id, m.last_active)).ok()?,
    );
    Some(h)
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
