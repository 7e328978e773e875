//! The accept loop: client connections under `server.max_connections`, each served by hyper (HTTP/1.1 or h2c)
//! with TCP_NODELAY and a deadline for request headers, and closed gracefully (then forcibly) on shutdown. Beyond
//! the limit, a small reserve of short-lived connections answers the probes (`/healthz`, `/readyz`), so that a
//! flood of idle connections cannot make a healthy gateway look dead.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// The first bytes of an HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connections accepted beyond `max_connections` to answer the probes: each one request, then closed.
pub const PROBE_RESERVE: usize = 128;
/// How long a connection of the reserve may take to send its request headers (a probe sends them at once).
const PROBE_HEAD_DEADLINE: Duration = Duration::from_secs(1);
/// How long a connection of the reserve may stay open in all (`/readyz` waits at most for the store's timeout).
const PROBE_CONN_DEADLINE: Duration = Duration::from_secs(15);
/// At most one warning per this long that `max_connections` was reached.
const FULL_WARN_EVERY: Duration = Duration::from_secs(60);

/// What a connection was accepted under.
enum Slot {
    /// One of `max_connections` (none taken when there is no limit).
    Main(Option<OwnedSemaphorePermit>),
    /// One of the [`PROBE_RESERVE`]: the probe router, one request.
    Reserve(OwnedSemaphorePermit),
}

/// The client connections being served, and the signals that end them.
pub struct Connections {
    tracker: TaskTracker,
    /// Asks every connection to finish its in-flight requests and close.
    finish: CancellationToken,
    /// Closes every connection at once.
    close: CancellationToken,
}

/// How a connection is served.
#[derive(Clone, Copy)]
pub struct Limits {
    /// Most connections open at once (0: no limit); further ones wait in the listen queue.
    pub max_connections: usize,
    /// Deadline for a request's headers (and for the first bytes of a new connection).
    pub header_read_timeout: Duration,
}

impl Connections {
    /// Accepts connections on `listener` until `stop` resolves, then stops accepting (the listener is closed)
    /// and asks open connections to finish their in-flight requests. Returns the connections still open. With
    /// `probes`, connections beyond `max_connections` (up to [`PROBE_RESERVE`] more) are served by that router.
    pub async fn accept_until(
        listener: TcpListener,
        router: Router,
        probes: Option<Router>,
        limits: Limits,
        stop: impl Future<Output = ()>,
    ) -> Connections {
        let conns = Connections {
            tracker: TaskTracker::new(),
            finish: CancellationToken::new(),
            close: CancellationToken::new(),
        };
        let slots =
            (limits.max_connections > 0).then(|| Arc::new(Semaphore::new(limits.max_connections)));
        let reserve = probes
            .is_some()
            .then(|| Arc::new(Semaphore::new(PROBE_RESERVE)));
        let builder = Arc::new(hyper_builder(limits.header_read_timeout, true));
        let probe_builder = Arc::new(hyper_builder(
            limits.header_read_timeout.min(PROBE_HEAD_DEADLINE),
            false,
        ));
        let mut stop = std::pin::pin!(stop);
        let mut warned_full: Option<std::time::Instant> = None;
        loop {
            // A free slot first, else one of the reserve: beyond both, connections wait in the kernel's listen
            // queue (the reserve turns over within seconds).
            let slot = match (&slots, &reserve) {
                (None, _) => Slot::Main(None),
                (Some(s), None) => tokio::select! {
                    p = s.clone().acquire_owned() => match p {
                        Ok(p) => Slot::Main(Some(p)),
                        Err(_) => break,
                    },
                    () = &mut stop => break,
                },
                (Some(s), Some(r)) => tokio::select! {
                    biased;
                    () = &mut stop => break,
                    p = s.clone().acquire_owned() => match p {
                        Ok(p) => Slot::Main(Some(p)),
                        Err(_) => break,
                    },
                    p = r.clone().acquire_owned() => match p {
                        Ok(p) => Slot::Reserve(p),
                        Err(_) => break,
                    },
                },
            };
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little rather than spin.
                        tracing::warn!(error = %e, "could not accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = &mut stop => break,
            };
            // A slot freed while this one waited in the reserve: serve it in full.
            let slot = match (slot, &slots) {
                (Slot::Reserve(r), Some(s)) => match s.clone().try_acquire_owned() {
                    Ok(p) => Slot::Main(Some(p)),
                    Err(_) => Slot::Reserve(r),
                },
                (slot, _) => slot,
            };
            // Every chunk of a stream goes out at once: no Nagle delay waiting for the client's (delayed) ACK.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY on a client connection");
            }
            let (finish, close) = (conns.finish.clone(), conns.close.clone());
            let (permit, probes_only) = match slot {
                Slot::Main(p) => (p, false),
                Slot::Reserve(p) => (Some(p), true),
            };
            match probes.as_ref().filter(|_| probes_only) {
                Some(probes) => {
                    if warned_full.is_none_or(|t| t.elapsed() >= FULL_WARN_EVERY) {
                        warned_full = Some(std::time::Instant::now());
                        tracing::warn!(
                            max_connections = limits.max_connections,
                            "server.max_connections reached: further connections get only /healthz and /readyz \
                             (503 otherwise) until some close; raise it, or find the clients holding idle \
                             connections (at most one such warning a minute)"
                        );
                    }
                    let (builder, router) = (probe_builder.clone(), probes.clone());
                    let head = limits.header_read_timeout.min(PROBE_HEAD_DEADLINE);
                    conns.tracker.spawn(async move {
                        let served = serve(tcp, peer, &builder, router, head, finish, close);
                        let _ = tokio::time::timeout(PROBE_CONN_DEADLINE, served).await;
                        drop(permit);
                    });
                }
                None => {
                    let (builder, router) = (builder.clone(), router.clone());
                    conns.tracker.spawn(async move {
                        serve(
                            tcp,
                            peer,
                            &builder,
                            router,
                            limits.header_read_timeout,
                            finish,
                            close,
                        )
                        .await;
                        drop(permit);
                    });
                }
            }
        }
        drop(listener);
        conns.tracker.close();
        conns.finish.cancel();
        conns
    }

    /// How many connections are still open.
    pub fn open(&self) -> usize {
        self.tracker.len()
    }

    /// Waits until every connection has closed, or `within` is over: true when they all closed.
    pub async fn closed_within(&self, within: Duration) -> bool {
        tokio::time::timeout(within, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Waits until every connection has closed, or `grace` is over; then closes what is left (their responses
    /// are dropped: streams end, and their turns are recorded as partial). Returns how many were closed so.
    pub async fn finish_within(&self, grace: Duration) -> usize {
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
        {
            return 0;
        }
        let left = self.tracker.len();
        self.close.cancel();
        self.tracker.wait().await;
        left
    }
}

/// hyper's server side: HTTP/1.1 (with keep-alive or one request per connection) and h2c, with a deadline for
/// request headers.
fn hyper_builder(header_read_timeout: Duration, keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(keep_alive)
        .header_read_timeout(header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// Serves one connection until it ends, `finish` asks it to close after its in-flight requests, or `close`.
async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    builder: &auto::Builder<TokioExecutor>,
    router: Router,
    header_read_timeout: Duration,
    finish: CancellationToken,
    close: CancellationToken,
) {
    // hyper's header deadline starts once it knows the protocol; a client that sends nothing (or a stalled part
    // of the h2 preface) would hold the connection before that.
    let started = tokio::select! {
        s = tokio::time::timeout(header_read_timeout, request_started(&tcp)) => s.unwrap_or(false),
        () = finish.cancelled() => false,
    };
    if !started {
        return;
    }
    let service =
        hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(req)
        });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
            return;
        }
        () = finish.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    tokio::select! {
        _ = conn.as_mut() => {}
        () = close.cancelled() => {}
    }
}

/// Waits for the first bytes of a request: true once they show which protocol it is, false at end of stream.
async fn request_started(tcp: &TcpStream) -> bool {
    let mut buf = [0u8; H2_PREFACE.len()];
    loop {
        match tcp.peek(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) if n >= H2_PREFACE.len() || buf[..n] != H2_PREFACE[..n] => return true,
            // A prefix of the h2 preface: peek returns at once while those bytes wait, so poll for the rest.
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}
