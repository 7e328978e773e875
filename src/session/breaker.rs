//! The store's circuit breaker: once a store operation times out or fails, requests stop waiting on the store
//! until a background probe finds it healthy again.
//!
//! Closed (the normal state): every wait on the store is bounded by `store.timeout_ms`; a wait that times out, or
//! an operation that fails (the store answered with an error, or its worker is gone), opens the breaker. Open: the
//! request path does not ask the store at all — a session not in the cache is proxied without history at once, a
//! cached session is used as cached (no freshness read on a shared store), and writes are still queued (bounded by
//! `store.queue_capacity`, kept and retried by the store's worker) but not awaited. Meanwhile one background task
//! probes the store: it waits for the writes queued so far to be committed (a barrier) and for a ping, each within
//! `store.timeout_ms`; the first probe runs [`PROBE_FIRST`] after the breaker opened, each failed one doubles the
//! pause up to [`PROBE_MAX`]. A probe that succeeds closes the breaker. Requests never wait for a probe.

use crate::metrics::{StoreMetrics, StoreOp};
use crate::store::{Store, StoreError};
use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Pause between the breaker opening and its first probe.
pub const PROBE_FIRST: Duration = Duration::from_millis(250);
/// Longest pause between two probes (the pause doubles after each failed probe, from [`PROBE_FIRST`]).
pub const PROBE_MAX: Duration = Duration::from_secs(5);

/// Why and since when the breaker is open.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The failure that opened it (never message content: store errors carry none).
    pub reason: String,
    /// When it opened.
    pub since: Instant,
    /// Probes that failed since.
    pub failed_probes: u32,
}

struct Inner {
    /// The fast path's flag: read on every store wait.
    open: AtomicBool,
    /// Details while open.
    opened: Mutex<Option<Opened>>,
    /// Weak: the probe never keeps a store alive (its worker ends when the store is dropped).
    store: Weak<dyn Store>,
    /// How long a wait on the store lasts at most (`store.timeout_ms`).
    timeout: Duration,
    metrics: StoreMetrics,
}

/// The breaker in front of one store, shared by everything that waits on it (cheap to clone).
#[derive(Clone)]
pub struct Breaker(Arc<Inner>);

impl Breaker {
    /// A closed breaker over `store`, bounding waits by `timeout` and counting failures in `metrics`.
    pub fn new(store: &Arc<dyn Store>, timeout: Duration, metrics: StoreMetrics) -> Self {
        Self(Arc::new(Inner {
            open: AtomicBool::new(false),
            opened: Mutex::new(None),
            store: Arc::downgrade(store),
            timeout,
            metrics,
        }))
    }

    /// Whether requests currently skip the store.
    pub fn is_open(&self) -> bool {
        self.0.open.load(Ordering::Acquire)
    }

    /// Why and since when the breaker is open; `None` while closed.
    pub fn opened(&self) -> Option<Opened> {
        self.0.opened.lock().clone()
    }

    /// A wait on the request path: while the breaker is open, `start` is not even called (a read is not queued
    /// behind a store that does not answer) and [`StoreError::Unavailable`] comes back at once; else as
    /// [`Breaker::wait`].
    pub async fn guarded<T, F>(
        &self,
        op: StoreOp,
        start: impl FnOnce() -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        if self.is_open() {
            return Err(StoreError::Unavailable);
        }
        self.wait(op, start()).await
    }

    /// Waits for `fut` at most the timeout, whatever the breaker's state (the admin API asks the store itself);
    /// past the timeout the operation is counted as failed. A timeout or failure opens the breaker.
    pub async fn wait<T>(
        &self,
        op: StoreOp,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.0.timeout;
        let result = match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => {
                self.0.metrics.error(op);
                let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                tracing::warn!(
                    operation = op.as_str(),
                    timeout_ms = ms,
                    "store: no answer within the timeout; going on without it"
                );
                Err(StoreError::Timeout(ms))
            }
        };
        if let Err(e) = &result {
            if opens(e) {
                self.trip(op, e);
            }
        }
        result
    }

    /// Opens the breaker after `op` failed with `e` (nothing when it is open already) and starts the probe.
    fn trip(&self, op: StoreOp, e: &StoreError) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to probe from: staying closed is the only state that can recover.
            return;
        };
        let reason = format!("{} failed: {e}", op.as_str());
        {
            // The details first, under their lock (one opening at a time): whoever sees the flag finds them.
            let mut opened = self.0.opened.lock();
            if opened.is_some() {
                return;
            }
            *opened = Some(Opened {
                reason: reason.clone(),
                since: Instant::now(),
                failed_probes: 0,
            });
            self.0.open.store(true, Ordering::Release);
        }
        tracing::warn!(
            reason = %reason,
            "store: circuit open; requests stop waiting on the store (cold sessions are proxied without history, \
             writes stay queued) until a background probe finds it healthy"
        );
        rt.spawn(self.clone().probe());
    }

    /// Probes the store until it is healthy, then closes the breaker. Ends when the store is dropped.
    async fn probe(self) {
        let mut pause = PROBE_FIRST;
        // A barrier still waiting for writes queued before it is waited for again, not queued anew.
        let mut barrier: Option<oneshot::Receiver<Result<(), StoreError>>> = None;
        loop {
            tokio::time::sleep(pause).await;
            let Some(store) = self.0.store.upgrade() else {
                return;
            };
            match self.probe_once(&*store, &mut barrier).await {
                Ok(()) => {
                    let opened = {
                        let mut opened = self.0.opened.lock();
                        self.0.open.store(false, Ordering::Release);
                        opened.take()
                    };
                    let open_ms = opened.map_or(0, |o| o.since.elapsed().as_millis());
                    tracing::info!(
                        open_ms = u64::try_from(open_ms).unwrap_or(u64::MAX),
                        "store: healthy again (queued writes committed, ping answered); circuit closed"
                    );
                    return;
                }
                Err(e) => {
                    self.0.metrics.error(StoreOp::Probe);
                    if let Some(o) = self.0.opened.lock().as_mut() {
                        o.failed_probes = o.failed_probes.saturating_add(1);
                        o.reason = format!("probe failed: {e}");
                    }
                    tracing::debug!(error = %e, "store: probe failed; circuit stays open");
                    pause = (pause * 2).min(PROBE_MAX);
                }
            }
        }
    }

    /// One probe: every write queued so far committed, then a ping, each within the timeout.
    async fn probe_once(
        &self,
        store: &dyn Store,
        barrier: &mut Option<oneshot::Receiver<Result<(), StoreError>>>,
    ) -> Result<(), StoreError> {
        let timeout = self.0.timeout;
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut rx = barrier.take().unwrap_or_else(|| store.write(Vec::new()));
        match tokio::time::timeout(timeout, &mut rx).await {
            Err(_) => {
                *barrier = Some(rx);
                return Err(StoreError::Timeout(ms));
            }
            Ok(answer) => answer.unwrap_or(Err(StoreError::Closed))?,
        }
        match tokio::time::timeout(timeout, store.ping()).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(ms)),
        }
    }
}

/// Whether a failure says the store is unwell (opens the breaker): a timeout, an error from the backend, a worker
/// gone. A full queue is refused at once (nothing was waited for; the session is rewritten later), a tenant
/// mismatch is the caller's, and an open breaker is the breaker's own answer.
fn opens(e: &StoreError) -> bool {
    match e {
        StoreError::Timeout(_) | StoreError::Backend { .. } | StoreError::Closed => true,
        StoreError::QueueFull | StoreError::TenantMismatch | StoreError::Unavailable => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::store::MemoryStore;

    fn breaker(store: &Arc<dyn Store>) -> Breaker {
        Breaker::new(store, Duration::from_millis(50), StoreMetrics::default())
    }

    #[tokio::test]
    async fn a_timeout_opens_it_and_later_waits_are_not_started() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let b = breaker(&store);
        let r: Result<(), _> = b
            .guarded(StoreOp::Load, futures_util::future::pending)
            .await;
        assert!(matches!(r, Err(StoreError::Timeout(50))));
        assert!(b.is_open());
        assert!(b.opened().unwrap().reason.contains("load failed"));
        let mut started = false;
        let r: Result<(), _> = b
            .guarded(StoreOp::Load, || {
                started = true;
                async { Ok(()) }
            })
            .await;
        assert!(matches!(r, Err(StoreError::Unavailable)));
        assert!(!started, "an open breaker does not start the operation");
    }

    #[tokio::test]
    async fn the_probe_closes_it_once_the_store_answers() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let b = breaker(&store);
        let r: Result<(), _> = b
            .wait(StoreOp::Write, async {
                Err(StoreError::Backend {
                    backend: "memory",
                    message: "disk I/O error".into(),
                })
            })
            .await;
        assert!(r.is_err());
        assert!(b.is_open());
        tokio::time::timeout(Duration::from_secs(5), async {
            while b.is_open() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the probe closed the breaker");
        assert!(b.opened().is_none());
        let r = b.guarded(StoreOp::Load, || async { Ok(7) }).await;
        assert_eq!(r.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_full_queue_or_another_tenant_does_not_open_it() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let b = breaker(&store);
        for e in [StoreError::QueueFull, StoreError::TenantMismatch] {
            let r: Result<(), _> = b.wait(StoreOp::Write, async { Err(e) }).await;
            assert!(r.is_err());
        }
        assert!(!b.is_open());
    }
}
