//! The HTTP front: router, thin handlers, `/healthz` (liveness), `/readyz` (the store answers), the `/v1/*` passthrough, the
//! inspector page (`/ui/`), and serving with graceful shutdown.

mod admin;
mod admission;
mod base_url;
mod conn;
mod decode;
mod late_slot;
mod limits;
mod metrics;
mod passthrough;
mod ready;
mod responses_ws;
mod ui;

pub use conn::PROBE_RESERVE;

use crate::app::AppState;
use crate::dialect::Dialect;
use crate::error::GatewayError;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long streams get, once the shutdown grace is over, to send their error event before their connections close.
const CUT_GRACE: Duration = Duration::from_secs(1);

/// How long scrapes in progress on the separate metrics listener get once `run` is over.
const METRICS_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The gateway's routes.
pub fn router(state: Arc<AppState>) -> Router {
    let in_flight = limits::InFlight::new(&state.config.server);
    // Paths that show a wrong base URL, logged with the fix (`base_url`).
    let traps = Arc::new(base_url::Traps::default());
    let doubled = {
        let traps = traps.clone();
        move |state: State<Arc<AppState>>, req: Request| {
            base_url::doubled(traps.clone(), state, req)
        }
    };
    let not_found = move |req: Request| base_url::not_found(traps.clone(), req);
    let v1 = Router::new()
        // Only POST is a chat request; any other method (GET lists stored completions) is the upstream's.
        .route(
            "/v1/chat/completions",
            post(chat).fallback(passthrough::handle),
        )
        .route("/v1/messages", post(messages).fallback(passthrough::handle))
        .route(
            "/v1/messages/count_tokens",
            post(count_tokens).fallback(passthrough::handle),
        )
        // A WebSocket upgrade is refused at once (clients fall back to HTTP); POST is a conversation request.
        .route(
            "/v1/responses",
            get(responses_ws::handle)
                .post(responses)
                .fallback(passthrough::handle),
        )
        // `/v1/v1/…` (a base URL ending in /v1 given to a client that appends /v1/… itself): passed through too,
        // and logged with the fix.
        .route("/v1/v1/{*rest}", any(doubled))
        .route("/v1/{*rest}", any(passthrough::handle))
        // The Gemini API: every version but `/v1` is Gemini's alone; `/v1/models/{model}:{method}` too.
        .route(
            "/v1/models/{model_method}",
            post(gemini).fallback(passthrough::handle),
        )
        .route(
            "/v1beta/models/{model_method}",
            post(gemini).fallback(passthrough::handle),
        )
        .route(
            "/v1alpha/models/{model_method}",
            post(gemini).fallback(passthrough::handle),
        )
        .route("/v1beta/{*rest}", any(passthrough::handle))
        .route("/v1alpha/{*rest}", any(passthrough::handle))
        .route_layer(axum::middleware::from_fn_with_state(
            (state.clone(), in_flight),
            limits::limit,
        ));
    // The server span of every `/v1/*` request, around the in-flight limit (a refused request is traced too);
    // no layer at all when tracing is off.
    let v1 = match &state.otel {
        Some(t) => v1.route_layer(axum::middleware::from_fn_with_state(
            t.clone(),
            crate::otel::trace_request,
        )),
        None => v1,
    };
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready::handle))
        // Claude Code checks that its base URL answers before its first request.
        .route("/", axum::routing::head(|| async { http::StatusCode::OK }))
        .route("/metrics", get(metrics::handle))
        .merge(ui::routes())
        .merge(v1)
        .merge(
            admin::routes(state.clone()).layer(axum::middleware::from_fn_with_state(
                state.clone(),
                metrics::count_admin,
            )),
        )
        .fallback(not_found)
        .with_state(state)
}

/// What a connection beyond `server.max_connections` is served: the probes, and 503 with `retry-after` for
/// anything else.
fn probe_router(state: Arc<AppState>) -> Router {
    let limit = state.config.server.max_connections;
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready::handle))
        .fallback(move || async move { GatewayError::ConnectionsFull { limit }.into_response() })
        .with_state(state)
}

async fn chat(State(state): State<Arc<AppState>>, req: Request) -> Response {
    crate::pipeline::conversation(state, req, Dialect::Chat).await
}

async fn count_tokens(State(state): State<Arc<AppState>>, req: Request) -> Response {
    crate::pipeline::count_tokens(state, req, Dialect::Anthropic).await
}

async fn responses(State(state): State<Arc<AppState>>, req: Request) -> Response {
    crate::pipeline::conversation(state, req, Dialect::Responses).await
}

async fn messages(State(state): State<Arc<AppState>>, req: Request) -> Response {
    crate::pipeline::conversation(state, req, Dialect::Anthropic).await
}

/// A POST to `/{version}/models/{model_method}`: a Gemini conversation request when it is one of the methods
/// ctxgate manages (`Wire::serves`), else the upstream's (OpenAI's `/v1/models/{id}`, Gemini's `embedContent`, …).
async fn gemini(state: State<Arc<AppState>>, req: Request) -> Response {
    use crate::dialect::gemini::endpoint::{Endpoint, Method};
    let count = Endpoint::of(req.uri().path()).is_some_and(|e| e.method == Method::CountTokens);
    match Dialect::serving(req.uri().path()) {
        Some(dialect) if count => crate::pipeline::count_tokens(state.0, req, dialect).await,
        Some(dialect) => crate::pipeline::conversation(state.0, req, dialect).await,
        None => passthrough::handle(state, req).await,
    }
}

/// A gateway bound to its socket, ready to serve.
pub struct Server {
    listener: tokio::net::TcpListener,
    /// The separate `/metrics` listener, when `[metrics] listen` is set.
    metrics_listener: Option<tokio::net::TcpListener>,
    state: Arc<AppState>,
}

impl Server {
    /// Binds the listener (port 0 picks a free port), and the metrics listener when one is configured.
    pub async fn bind(state: Arc<AppState>, addr: SocketAddr) -> std::io::Result<Server> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let metrics_listener = match &state.config.metrics.listen {
            Some(a) => {
                let a: SocketAddr = crate::config::parse_listen(a).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("metrics.listen: {a:?} is not an address"),
                    )
                })?;
                Some(tokio::net::TcpListener::bind(a).await?)
            }
            None => None,
        };
        // The idle webhook's sweeper, handed what it needs; it ends with the gateway's sessions.
        crate::hooks::spawn(
            &state.config.hooks,
            &state.sessions,
            state.metrics.clone(),
            state.upstream.clone(),
        );
        Ok(Server {
            listener,
            metrics_listener,
            state,
        })
    }

    /// The bound address of the separate metrics listener, when there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves. Then: stop accepting (the listener closes), give in-flight requests and
    /// streams up to `server.shutdown_grace_secs` to finish (then close what is left: cut streams are recorded as
    /// partial), and drain background work and queued store writes within `server.drain_secs`. Returns once all
    /// of that is done, so the process can exit without losing acknowledged work.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let server = &self.state.config.server;
        let grace = Duration::from_secs(server.shutdown_grace_secs);
        let drain = Duration::from_secs(server.drain_secs);
        let limits = conn::Limits {
            max_connections: server.max_connections,
            header_read_timeout: Duration::from_secs(server.header_read_timeout_secs),
        };
        // The metrics listener (the same connection limits and header deadline, its own connection pool) serves
        // until the drain is over, so that the shutdown can be watched; it ends with `run` (aborted if `run` is
        // dropped).
        let metrics_stop = CancellationToken::new();
        let metrics_task = self.metrics_listener.map(|l| {
            if let Ok(a) = l.local_addr() {
                tracing::info!(listen = %a, "metrics listening (GET /metrics)");
            }
            let app = metrics::router(self.state.clone());
            let stop = metrics_stop.clone().cancelled_owned();
            let task = tokio::spawn(async move {
                let conns = conn::Connections::accept_until(l, app, None, limits, stop).await;
                conns.finish_within(METRICS_CLOSE_GRACE).await;
            });
            (AbortOnDrop(task.abort_handle()), task)
        });
        let app = router(self.state.clone());
        let probes = probe_router(self.state.clone());
        let conns =
            conn::Connections::accept_until(self.listener, app, Some(probes), limits, shutdown)
                .await;
        tracing::info!(
            open_connections = conns.open(),
            grace_secs = grace.as_secs(),
            "shutting down: no new connections, waiting for in-flight requests"
        );
        if !conns.closed_within(grace).await {
            // Streams still relayed end with their dialect's error event (the client learns why, and retries);
            // then whatever is still open is closed.
            let open = conns.open();
            self.state.cut_streams.cancel();
            let closed = conns.finish_within(CUT_GRACE).await;
            tracing::warn!(
                open,
                closed,
                grace_secs = grace.as_secs(),
                "grace period over (server.shutdown_grace_secs): ended the streams still open with an error \
                 event and closed the remaining connections (their replies are recorded as partial)"
            );
        }
        self.state.drain_within(drain).await;
        // The spans of the drained work are queued now: export them (bounded: a collector that is down or slow
        // does not hold the exit up for long).
        if let Some(t) = &self.state.otel {
            t.shutdown(crate::otel::FLUSH_WITHIN).await;
        }
        metrics_stop.cancel();
        if let Some((_abort, task)) = metrics_task {
            let _ = task.await;
        }
        Ok(())
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
