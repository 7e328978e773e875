//! The shared state of a running gateway: config (its reloadable part behind a swappable snapshot), the upstream
//! client, and the channels other parts listen on.

use crate::config::Config;
use crate::context::models::ModelTable;
use crate::context::tokens::TokenCounter;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::relay::RelayOutcome;
use crate::session::{Sessions, TenantKey};
use crate::store::Store;
use crate::summary::Summarizer;
use crate::upstream::Upstream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio_util::task::TaskTracker;

mod prices;
mod routes;
pub use prices::{Billed, Money, Prices, Rates};
pub use routes::{Routed, Routes};

/// A finished chat turn, as seen by the tap (for recording, metrics and tests).
#[derive(Debug, Clone)]
pub struct TurnEvent {
    /// The session the turn belongs to.
    pub session_id: String,
    /// HTTP status the upstream answered with.
    pub status: u16,
    /// How the reply ended.
    pub outcome: RelayOutcome,
}

/// What a reload replaces ([`crate::reload`]): the config with its reloadable sections (`[context]`, `[prune]`,
/// `[summary]`, `[recall]`, `[models]`, `[upstreams]`) and what is built from them. A request takes one snapshot
/// when it starts and keeps it to its end.
pub struct Live {
    /// The whole config: the running one with the reloadable sections as last (re)loaded.
    pub config: Arc<Config>,
    /// Context windows: the shipped model table under the config's `[models]` entries.
    pub models: ModelTable,
    /// Writes LLM summaries; `None` when `[summary] model` is unset.
    pub summarizer: Option<Arc<Summarizer>>,
    /// Which upstream each model's conversation requests go to (`[upstreams]`, `[models] upstream`).
    pub routes: Routes,
    /// Each model's price (`[models] price` over the built-in list prices), memoised per model name.
    pub prices: Prices,
}

impl Live {
    /// The snapshot of `config`; its routes over `upstream` (the defaults), keeping `previous`'s unchanged named
    /// upstreams (and their connection pools).
    pub fn build(
        config: Config,
        metrics: &Arc<Metrics>,
        upstream: &Upstream,
        previous: Option<&Live>,
    ) -> Result<Live, GatewayError> {
        let models = ModelTable::new(&config.models, config.context.default_context_window)
            .map_err(|e| GatewayError::Internal(format!("the model table is broken: {e}")))?;
        let summarizer = Summarizer::from_config(&config, metrics.clone())?.map(Arc::new);
        let routes = Routes::build(&config, upstream, metrics, previous.map(|p| &p.routes))?;
        let prices = Prices::new(&config.models)
            .map_err(|e| GatewayError::Internal(format!("the model table is broken: {e}")))?;
        Ok(Live {
            config: Arc::new(config),
            models,
            summarizer,
            routes,
            prices,
        })
    }
}

/// Everything a request handler needs.
pub struct AppState {
    /// The validated configuration as started: what needs a restart to change (listeners, store, upstream,
    /// server limits, admin, logging) is read here; the reloadable sections through [`AppState::live`].
    pub config: Arc<Config>,
    /// The reloadable part, swapped whole by a reload.
    live: arc_swap::ArcSwap<Live>,
    /// Where the config came from and how it was loaded last (for reloads).
    pub reload: crate::reload::Source,
    /// The upstream client.
    pub upstream: Upstream,
    /// Every finished chat turn is announced here.
    pub turns: broadcast::Sender<TurnEvent>,
    /// Session histories: cache over the durable store.
    pub sessions: Arc<Sessions>,
    /// Work that must finish even when its client is gone (recording turns); drained on shutdown.
    pub tasks: TaskTracker,
    /// Token counts (cached per message) and the per-model calibration.
    pub counter: Arc<TokenCounter>,
    /// The Prometheus registry and every metric's handles.
    pub metrics: Arc<Metrics>,
    /// The per-install secret that keys tenant hashes (kept beside the store).
    pub tenant_key: TenantKey,
    /// Cancelled when the shutdown grace runs out: streams still being relayed end with their dialect's error
    /// event before their connections are closed.
    pub cut_streams: tokio_util::sync::CancellationToken,
    /// The tracer, when `[otel]` (or the standard `OTEL_*` variables) configured one.
    pub otel: Option<Arc<crate::otel::Tracing>>,
}

impl AppState {
    /// Builds the state from a validated config.
    pub fn new(config: Config) -> Result<Arc<Self>, GatewayError> {
        let metrics = Arc::new(new_metrics(&config)?);
        let store = crate::store::open_with_metrics(&config.store, &metrics)
            .map_err(|e| GatewayError::Internal(format!("cannot open the store: {e}")))?;
        Self::build(config, store, metrics)
    }

    /// Builds the state over a store opened by the caller (tests inject slow or failing stores this way).
    pub fn with_store(config: Config, store: Arc<dyn Store>) -> Result<Arc<Self>, GatewayError> {
        let metrics = Arc::new(new_metrics(&config)?);
        Self::build(config, store, metrics)
    }

    fn build(
        config: Config,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, GatewayError> {
        let upstream = Upstream::new(&config.upstream, &config.anthropic, &config.gemini)?;
        let tenant_key = TenantKey::for_store(&config.store)
            .map_err(|e| GatewayError::Internal(format!("cannot load the tenant secret: {e}")))?;
        let backend = crate::store::metrics_backend(config.store.backend);
        let sessions = Arc::new(
            Sessions::new(store, config.store.cache_max_bytes)
                .with_metrics(metrics.session_metrics())
                .with_store_metrics(metrics.store_metrics(backend))
                .with_timeout(Duration::from_millis(config.store.timeout_ms))
                .with_neutral_history(crate::dialect::Dialect::history_as_neutral),
        );
        let counter = TokenCounter::sized_by(config.store.cache_max_bytes);
        let parse_memo_bytes = crate::dialect::parse_memo::size_by(config.store.cache_max_bytes);
        tracing::info!(
            token_counts = counter.capacity(),
            parse_memo_bytes,
            "memos sized by store.cache_max_bytes"
        );
        let live = Live::build(config.clone(), &metrics, &upstream, None)?;
        match &live.summarizer {
            Some(s) => tracing::info!(
                model = s.model(),
                "summaries on: older history is summarized by this model"
            ),
            None => tracing::info!(
                "summaries off ([summary] model is unset): the context engine prunes only"
            ),
        }
        let otel = start_tracing(&config);
        let (turns, _) = broadcast::channel(1024);
        let tasks = TaskTracker::new();
        if config.store.retention_days > 0 {
            spawn_retention(sessions.clone(), config.store.retention_days);
        }
        Ok(Arc::new(Self {
            reload: crate::reload::Source::new(config.clone()),
            config: Arc::new(config),
            live: arc_swap::ArcSwap::from_pointee(live),
            upstream,
            turns,
            sessions,
            tasks,
            counter: Arc::new(counter),
            metrics,
            tenant_key,
            cut_streams: tokio_util::sync::CancellationToken::new(),
            otel,
        }))
    }

    /// The reloadable part of the config as it is now: take it once per request and keep it.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Puts a reloaded snapshot in place: requests started before keep theirs.
    pub fn swap_live(&self, live: Live) {
        self.live.store(Arc::new(live));
    }

    /// Reloads the config's reloadable sections from where it came from (SIGHUP, `POST /admin/config/reload`):
    /// [`crate::reload`] reads and checks the file, this builds and swaps the new snapshot. `Err` with every
    /// problem when the file is refused (nothing changes).
    pub async fn reload_config(&self) -> Result<crate::reload::Reloaded, Vec<String>> {
        let _one = self.reload.one_at_a_time().await;
        let result = self
            .reload
            .read(&self.live().config)
            .and_then(|(config, report)| {
                let next = Live::build(config, &self.metrics, &self.upstream, Some(&self.live()))
                    .map_err(|e| vec![e.to_string()])?;
                self.swap_live(next);
                Ok(report)
            });
        crate::reload::record(&result, &self.metrics);
        result
    }

    /// Waits for background work (turn recording) and for every queued store write to be committed, however
    /// long that takes (tests use it to settle; shutdown uses [`AppState::drain_within`]).
    pub async fn drain(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        if let Err(e) = self.sessions.flush().await {
            tracing::error!(error = %e, "store: could not flush queued writes");
        }
    }

    /// Waits, at most `within`, for background work (turn records, summaries, compression and recall records,
    /// disconnect finishers) and then for every queued store write to be committed; logs what was drained and
    /// what was left behind. Work spawned on `tasks` while this waits is waited for too.
    pub async fn drain_within(&self, within: Duration) -> Drained {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + within;
        self.tasks.close();
        let tasks_pending = self.tasks.len();
        let tasks_done = tokio::time::timeout_at(deadline, self.tasks.wait())
            .await
            .is_ok();
        let tasks_left = self.tasks.len();
        // Whatever the tasks queued (and whatever a task cut short had queued) is committed now, in order.
        let store_flushed = match tokio::time::timeout_at(deadline, self.sessions.flush()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "shutdown: could not commit the store's queued writes");
                false
            }
            Err(_) => false,
        };
        let drained = Drained {
            tasks_pending,
            tasks_left: if tasks_done { 0 } else { tasks_left },
            store_flushed,
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if drained.complete() {
            tracing::info!(
                background_tasks = tasks_pending,
                elapsed_ms,
                "shutdown: drained background work and committed every queued store write"
            );
        } else {
            tracing::warn!(
                background_tasks = tasks_pending,
                tasks_left = drained.tasks_left,
                store_flushed,
                drain_secs = within.as_secs(),
                elapsed_ms,
                "shutdown: drain deadline (server.drain_secs) passed; unfinished work is lost"
            );
        }
        drained
    }
}

/// What a shutdown drain achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Background tasks running when the drain began.
    pub tasks_pending: usize,
    /// Background tasks still running at the deadline.
    pub tasks_left: usize,
    /// Every queued store write was committed.
    pub store_flushed: bool,
}

impl Drained {
    /// Nothing was left behind.
    pub fn complete(&self) -> bool {
        self.tasks_left == 0 && self.store_flushed
    }
}

/// The tracer `[otel]` and the `OTEL_*` variables ask for; `None` (tracing off) when neither names an endpoint, or
/// when it cannot start (logged: the gateway runs without traces rather than not at all).
fn start_tracing(config: &Config) -> Option<Arc<crate::otel::Tracing>> {
    let mut warnings = Vec::new();
    let settings = config
        .otel
        .resolve(|name| std::env::var(name).ok(), &mut warnings);
    for w in warnings {
        tracing::warn!("otel: {w}");
    }
    let settings = settings?;
    match crate::otel::Tracing::start(&settings) {
        Ok(t) => {
            tracing::info!(
                endpoint = %t.traces_url(),
                service_name = %settings.service_name,
                sample_ratio = settings.sample_ratio,
                capture_content = settings.capture_content,
                "otel: traces on"
            );
            Some(Arc::new(t))
        }
        Err(e) => {
            tracing::error!(error = %e, "otel: cannot start tracing; running without traces");
            None
        }
    }
}

/// The metrics registry; model labels go through the model table (its entries are the allowlist).
fn new_metrics(config: &Config) -> Result<Metrics, GatewayError> {
    let table = ModelTable::new(&config.models, config.context.default_context_window)
        .map_err(|e| GatewayError::Internal(format!("the shipped model table is broken: {e}")))?;
    Metrics::new(Box::new(move |model: &str| table.matching_entry(model)))
        .map_err(|e| GatewayError::Internal(format!("cannot register the metrics: {e}")))
}

/// Purges idle sessions an hour apart (the first time a minute after start).
/// Not tracked for draining: it loops forever and ends with the runtime.
fn spawn_retention(sessions: Arc<Sessions>, days: u64) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        loop {
            match sessions.purge_idle(days).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    purged = n,
                    retention_days = days,
                    "store: purged idle sessions"
                ),
                Err(e) => tracing::warn!(error = %e, "store: retention purge failed"),
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    });
}
