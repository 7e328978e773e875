//! The life of a conversation request of any dialect, stage by stage: read → parse → identify the session → plan
//! (count, rewrite) → forward → relay with a tap (or answer recall rounds) → record. The dialect (`dialect/`)
//! translates at the edges; nothing here knows a wire format.

mod access;
mod cache_miss;
mod count;
mod draft;
mod forward;
mod identify;
pub mod identity;
mod measure;
mod plan;
mod planning;
mod records;
mod request;
mod respond;
mod rounds;
mod turn;
pub mod turn_record;

pub use count::count_tokens;
pub use plan::{plan_request, Outgoing, PlanAt, Rewritten, STRATEGY_HEADER};
pub use request::read_body;
pub use respond::error_response;

use access::Logged;
use respond::own_error;
use turn::Seen;

use crate::app::{AppState, Live, Routed};
use crate::config::Strategy;
use crate::dialect::request::Call;
use crate::dialect::{Dialect, Request as Parsed};
use crate::error::GatewayError;
use crate::metrics::{RequestTimer, Route};
use crate::otel::RequestTrace;
use crate::session::{RequestMark, SessionIdentity};
use axum::extract::Request;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;

/// Response header carrying the session id.
pub const SESSION_HEADER: &str = "x-ctxgate-session";
/// The response header saying what a rewrite did: `<stages>; tokens=<client>-><sent>`.
pub const REWRITE_HEADER: &str = "x-ctxgate-rewrite";
/// The response header naming the model a request went to instead of its own (`context.on_overflow =
/// "fallback"`).
pub const FALLBACK_HEADER: &str = "x-ctxgate-fallback";
/// The response header counting the recall rounds ctxgate answered (answers whose head follows the rounds: JSON).
pub const RECALL_HEADER: &str = "x-ctxgate-recall";

/// Handles `POST /v1/chat/completions` (chat), `POST /v1/messages` (Anthropic) and `POST /v1/responses`
/// (Responses).
pub async fn conversation(state: Arc<AppState>, req: Request, dialect: Dialect) -> Response {
    let started = Instant::now();
    // Counts the request in flight; the turn takes it over when the upstream answers, otherwise it records the
    // error answered here (or 499 when the client went away first).
    let mut timer = Some(state.metrics.start(Route::Chat, dialect, started));
    let resp = handle(state, req, dialect, started, &mut timer).await;
    if let Some(t) = timer.as_mut() {
        t.set_status(resp.status().as_u16());
    }
    resp
}

async fn handle(
    state: Arc<AppState>,
    req: Request,
    dialect: Dialect,
    started: Instant,
    timer: &mut Option<RequestTimer>,
) -> Response {
    let (parts, body) = req.into_parts();
    // The reloadable config as it is now: this request keeps it to its end.
    let live = state.live();
    // 1–2. Read the whole body within its limits (it has to be parsed before anything goes upstream); parse it,
    //    keeping every field and its order; refuse what is not a request of the dialect (or names no strategy).
    let call = Call {
        path: parts.uri.path(),
        query: parts.uri.query(),
    };
    let request = match request::receive(&state, &live.config, body, dialect, &call).await {
        Ok(r) => Arc::new(r),
        Err(e) => return own_error(&Logged::unparsed(dialect, started), None, e),
    };
    if let Some(t) = timer.as_mut() {
        t.set_stream(request.stream);
    }
    let strategy = match plan::strategy(&parts.headers, live.config.context.strategy) {
        Ok(s) => s,
        Err(e) => return own_error(&Logged::of(&request, started, None), None, e),
    };
    // The model's upstream (`[models] upstream`, else the dialect's default); one of another API is refused here,
    // before anything is recorded.
    let route = match live.routes.resolve(&request.model, dialect) {
        Ok(r) => r,
        Err(e) => return own_error(&Logged::of(&request, started, None), None, e),
    };
    let mut ex = Exchange {
        state,
        live,
        dialect,
        started,
        request,
        strategy,
        route,
        session: None,
        mark: None,
        item_hashes: Vec::new(),
        trace: parts.extensions.get::<RequestTrace>().cloned(),
    };
    // The caller's credentials, for its tenant and its summaries: its headers, with a credential sent elsewhere
    // (Gemini's `key` query parameter) as the header it stands for.
    let credentials = dialect.credential_headers(&parts.headers, parts.uri.query());
    let credentials = credentials.as_ref().unwrap_or(&parts.headers);
    // 3. Identify the conversation and reconcile the request with its stored history.
    ex.identify(credentials).await;
    // 4. Plan: count the request against its model's window; over budget, rewrite what goes upstream.
    let outgoing = match ex.plan(credentials).await {
        Ok(o) => o,
        Err(e) => return ex.fail(e, None),
    };
    // Fallen back to a larger model: it goes to that model's upstream.
    if let Some(model) = &outgoing.fallback {
        match ex.live.routes.resolve(model, dialect) {
            Ok(r) => ex.route = r,
            Err(e) => return ex.fail(e, None),
        }
    }
    let draft = ex.draft(&outgoing);
    // 5. Forward.
    let sent = match ex.forward(&parts, &outgoing, timer).await {
        Ok(s) => s,
        Err(e) => return ex.fail(e, Some(&Seen::of(&outgoing))),
    };
    // 6. Relay the answer (or answer the model's recall calls first); 7. the turn ends when the answer does.
    ex.respond(outgoing, draft, sent, timer).await
}

/// A parsed conversation request on its way through the stages.
struct Exchange {
    state: Arc<AppState>,
    /// The config snapshot the request keeps to its end.
    live: Arc<Live>,
    dialect: Dialect,
    /// When the request arrived.
    started: Instant,
    request: Arc<Parsed>,
    /// The header's or the config's, unless an operator pinned one on the session.
    strategy: Strategy,
    /// The upstream the request goes to (every round).
    route: Arc<Routed>,
    /// The conversation (namespaced by the caller's credentials); `None`: no history is kept.
    session: Option<SessionIdentity>,
    /// Where the request's messages landed in the session; `None`: proxied without history.
    mark: Option<RequestMark>,
    /// The hash of each of the request's conversation elements' bytes (recorded sessions only).
    item_hashes: Vec<u64>,
    /// The request's server span, when tracing is on: each stage adds its own under it.
    trace: Option<RequestTrace>,
}

impl Exchange {
    /// What the access log says of the request.
    fn logged(&self) -> Logged<'_> {
        Logged::of(&self.request, self.started, self.session.as_ref())
    }

    /// Our own error answer; `seen`: the plan's, when the request was planned.
    fn fail(&self, e: GatewayError, seen: Option<&Seen>) -> Response {
        own_error(&self.logged(), seen, e)
    }
}
