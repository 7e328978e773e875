//! The admin API under `/admin`: sessions listed, shown whole (and turn by turn: what each sent) and deleted. Bearer `[admin] token`; without a
//! token it is off, unless `[admin] allow_loopback_without_token` (by default: when `server.listen` is a loopback
//! address) serves loopback peers, addressed by a loopback name or one of `[admin] allowed_hosts`. Requests a web
//! page could forge are refused whatever the credentials (`guard`).

use crate::app::AppState;
use crate::error::GatewayError;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;

mod failure;
mod guard;
mod lookup;
mod paging;

use failure::{body_rejected, store_error, AdminError};

/// Largest `PATCH /admin/sessions/{id}` body: a strategy pin is a few dozen bytes.
const PATCH_MAX_BYTES: usize = 64 * 1024;

/// The `/admin` routes, authenticated. Logs at start-up who may reach them.
pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    log_exposure(&state.config);
    Router::new()
        .route("/admin/sessions", get(list))
        .route(
            "/admin/sessions/{id}",
            get(show)
                .delete(delete)
                .patch(patch)
                .layer(axum::extract::DefaultBodyLimit::max(PATCH_MAX_BYTES)),
        )
        .route("/admin/sessions/{id}/turns", get(turns))
        .route("/admin/config/reload", axum::routing::post(reload))
        .route("/admin/sessions/{id}/export", get(export))
        .route(
            "/admin/sessions/import",
            axum::routing::post(import).layer(axum::extract::DefaultBodyLimit::max(
                usize::try_from(state.config.admin.max_import_bytes).unwrap_or(usize::MAX),
            )),
        )
        .route(
            "/admin/sessions/{id}/compress",
            axum::routing::post(compress),
        )
        .route_layer(axum::middleware::from_fn_with_state(state, authenticate))
}

/// Checks, in order: that no page of another origin sent the request (always), the token (or, without one, a
/// loopback peer and a loopback or allowed `Host`), and that a state-changing body is JSON.
async fn authenticate(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let admin = &state.config.admin;
    if let Err(r) = guard::check_origin(req.headers(), req.uri(), &admin.allowed_hosts) {
        return refuse(&req, &r);
    }
    let allowed = match &admin.token {
        Some(token) => {
            let given = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
                tracing::warn!(target: "ctxgate::admin", path = %req.uri().path(), "admin: rejected bad or missing token");
                return GatewayError::Unauthorized.into_response();
            }
            true
        }
        None => {
            state.config.admin_loopback_without_token()
                && req
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .is_some_and(|ConnectInfo(a)| a.ip().is_loopback())
        }
    };
    if !allowed {
        return GatewayError::Forbidden.into_response();
    }
    if admin.token.is_none() {
        if let Err(r) = guard::check_host(req.headers(), req.uri(), &admin.allowed_hosts) {
            return refuse(&req, &r);
        }
    }
    let has_body = {
        use http_body::Body as _;
        let body = req.body();
        !body.is_end_stream() && body.size_hint().exact() != Some(0)
    };
    if let Err(r) = guard::check_body_type(req.method(), req.headers(), has_body) {
        return GatewayError::UnsupportedMediaType(r.to_string()).into_response();
    }
    next.run(req).await
}

/// 403 for a request a browser may have forged, with a warning an operator can act on (what was refused and
/// why; never a credential).
fn refuse(req: &Request, r: &guard::Refusal) -> Response {
    tracing::warn!(
        target: "ctxgate::admin",
        method = %req.method(),
        path = %req.uri().path(),
        reason = %r,
        "admin: refused a request that a web page may have sent; if it was yours, call the API on a loopback name \
         (or a name in [admin] allowed_hosts) without a browser, or open /ui/ on the gateway itself"
    );
    GatewayError::ForeignRequest(r.to_string()).into_response()
}

/// Says at start-up how the admin API is reachable, with a warning when it is disabled or open to loopback peers
/// of a listener that is not itself on loopback.
fn log_exposure(config: &crate::config::Config) {
    if config.admin.token.is_some() {
        tracing::info!("admin API on: bearer [admin] token required");
        return;
    }
    let listen_loopback =
        crate::config::parse_listen(&config.server.listen).is_some_and(|a| a.ip().is_loopback());
    match (config.admin_loopback_without_token(), listen_loopback) {
        (true, true) => {
            tracing::info!("admin API on for loopback peers only (no [admin] token set)")
        }
        (true, false) => tracing::warn!(
            listen = %config.server.listen,
            "admin API served without a token to loopback peers of a non-loopback listener: a same-host \
             reverse proxy or sidecar makes it public; set [admin] token"
        ),
        (false, true) => tracing::info!(
            "admin API disabled: no [admin] token set and allow_loopback_without_token = false"
        ),
        (false, false) => tracing::warn!(
            listen = %config.server.listen,
            "admin API disabled: server.listen is not a loopback address and no [admin] token is set; set \
             [admin] token to enable it"
        ),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

/// 404 for session `id`.
fn not_found(id: &str) -> AdminError {
    GatewayError::NotFound(format!("no session {id:?}")).into()
}

#[derive(Deserialize)]
struct Page {
    limit: Option<String>,
    offset: Option<String>,
    /// Only sessions whose id contains it.
    q: Option<String>,
}

async fn list(
    State(state): State<Arc<AppState>>,
    p: Result<Query<Page>, QueryRejection>,
) -> Result<Response, AdminError> {
    let Query(p) = p.map_err(|e| paging::bad_query(&e))?;
    let (limit, offset) = paging::page(p.limit.as_deref(), p.offset.as_deref(), 1000)?;
    let (sessions, total) = match p.q.as_deref().filter(|q| !q.is_empty()) {
        Some(q) => state.sessions.find(q, limit, offset).await,
        None => state.sessions.list(limit, offset).await,
    }
    .map_err(|e| store_error(&state, e))?;
    let mut shown = Vec::with_capacity(sessions.len());
    for meta in sessions {
        let dollars = state
            .sessions
            .dollars(&meta.id)
            .await
            .map_err(|e| store_error(&state, e))?;
        shown.push(with_dollars(json!(meta), dollars));
    }
    Ok(
        Json(json!({"sessions": shown, "total": total, "limit": limit, "offset": offset}))
            .into_response(),
    )
}

/// A session's JSON with what its turns cost and saved (`spent_dollars`, `saved_dollars`).
fn with_dollars(mut session: Value, d: crate::session::turns::Dollars) -> Value {
    if let Some(o) = session.as_object_mut() {
        o.insert("spent_dollars".into(), json!(d.spent));
        o.insert("saved_dollars".into(), json!(d.saved));
    }
    session
}

/// History messages per page of `GET /admin/sessions/{id}` unless `limit` says otherwise.
const VIEW_DEFAULT_LIMIT: u32 = 500;
/// Most history messages a page of `GET /admin/sessions/{id}` holds.
const VIEW_MAX_LIMIT: u32 = 5000;

#[derive(Deserialize)]
struct ViewQuery {
    limit: Option<String>,
    offset: Option<String>,
}

/// The session, with a page of its history (`limit`, `offset`; `total` says how many there are).
async fn show(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    q: Result<Query<ViewQuery>, QueryRejection>,
) -> Result<Response, AdminError> {
    let Query(q) = q.map_err(|e| paging::bad_query(&e))?;
    let (limit, offset) = paging::page_of(
        q.limit.as_deref(),
        q.offset.as_deref(),
        VIEW_DEFAULT_LIMIT,
        VIEW_MAX_LIMIT,
    )?;
    let id = lookup::resolve(&state, id).await?;
    match state
        .sessions
        .view_page(&id, Some((offset, limit)))
        .await
        .map_err(|e| store_error(&state, e))?
    {
        Some(v) => {
            let dollars = state
                .sessions
                .dollars(&id)
                .await
                .map_err(|e| store_error(&state, e))?;
            Ok(Json(with_dollars(json!(v), dollars)).into_response())
        }
        None => Err(not_found(&id)),
    }
}

#[derive(Deserialize)]
struct TurnsQuery {
    limit: Option<String>,
    offset: Option<String>,
    messages: Option<bool>,
}

/// A page of the session's turns: what each sent upstream (`messages=false`: the figures only).
async fn turns(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    q: Result<Query<TurnsQuery>, QueryRejection>,
) -> Result<Response, AdminError> {
    let id = lookup::resolve(&state, id).await?;
    let Query(q) = q.map_err(|e| paging::bad_query(&e))?;
    let (limit, offset) = paging::page(q.limit.as_deref(), q.offset.as_deref(), 500)?;
    match state
        .sessions
        .turns(&id, offset, limit, q.messages.unwrap_or(true))
        .await
        .map_err(|e| store_error(&state, e))?
    {
        Some(page) => Ok(Json(page).into_response()),
        None => Err(not_found(&id)),
    }
}

/// `PATCH /admin/sessions/{id}` with `{"strategy": "off" | "prune" | "summarize" | "hybrid" | null}`: pins a
/// strategy for the session (over the request header and the config), or unpins it.
async fn patch(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<Response, AdminError> {
    let body =
        body.map_err(|r| body_rejected(&r, PATCH_MAX_BYTES as u64, "PATCH /admin/sessions/{id}"))?;
    let id = lookup::resolve(&state, id).await?;
    use crate::config::Strategy;
    let bad = || {
        AdminError::from(GatewayError::bad_request(
            "expected a JSON object {\"strategy\": \"off\" | \"prune\" | \"summarize\" | \"hybrid\" | null}",
        ))
    };
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|_| bad())?;
    let fields = v.as_object().ok_or_else(bad)?;
    if let Some(k) = fields.keys().find(|k| k.as_str() != "strategy") {
        return Err(GatewayError::bad_request(format!(
            "unknown field {k:?}: only \"strategy\" can be changed"
        ))
        .into());
    }
    let strategy = match fields.get("strategy") {
        None => return Err(bad()),
        Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(Strategy::parse(s).ok_or_else(|| {
            GatewayError::bad_request(format!(
                "unknown strategy {s:?}: one of off, prune, summarize, hybrid, or null"
            ))
        })?),
        Some(_) => return Err(bad()),
    };
    match state
        .sessions
        .pin_strategy(&id, strategy)
        .await
        .map_err(|e| store_error(&state, e))?
    {
        Some(meta) => {
            tracing::info!(target: "ctxgate::admin", session = %id, strategy = strategy.map_or("none", |s| s.as_str()), "admin: session strategy pinned");
            Ok(Json(meta).into_response())
        }
        None => Err(not_found(&id)),
    }
}

/// Reloads the config's reloadable sections: 200 with what changed (and what needs a restart), or 400 with every
/// problem of the file (the running config is kept).
async fn reload(State(state): State<Arc<AppState>>) -> Response {
    match state.reload_config().await {
        Ok(r) => Json(r).into_response(),
        Err(problems) => (
            http::StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": format!("the config was not reloaded: {}", problems.join("; ")),
                                  "type": "invalid_request_error", "code": "invalid_config"},
                        "problems": problems})),
        )
            .into_response(),
    }
}

/// The session as JSON Lines (`session::export`).
async fn export(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    let id = lookup::resolve(&state, id).await?;
    match crate::session::export::export_session(&state.sessions, &id)
        .await
        .map_err(|e| store_error(&state, e))?
    {
        Some(body) => {
            Ok(([(http::header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
        }
        None => Err(not_found(&id)),
    }
}

#[derive(Deserialize)]
struct ImportQuery {
    replace: Option<bool>,
}

/// Writes an exported session (the body: JSON Lines); 409 when it exists, unless `?replace=true`.
async fn import(
    State(state): State<Arc<AppState>>,
    q: Result<Query<ImportQuery>, QueryRejection>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<Response, AdminError> {
    let body = body.map_err(|r| {
        body_rejected(
            &r,
            state.config.admin.max_import_bytes,
            "admin.max_import_bytes",
        )
    })?;
    let Query(q) = q.map_err(|e| paging::bad_query(&e))?;
    use crate::session::export::{self, ImportError};
    let parsed = export::parse(&body).map_err(|e| GatewayError::bad_request(e.to_string()))?;
    match export::import(&state.sessions, parsed, q.replace.unwrap_or(false)).await {
        Ok(done) => {
            tracing::info!(target: "ctxgate::admin", session = %done.id, nodes = done.nodes, turns = done.turns, "admin: session imported");
            Ok(Json(done).into_response())
        }
        Err(e @ ImportError::Exists(_)) => Ok((
            http::StatusCode::CONFLICT,
            Json(json!({"error": {"message": e.to_string(), "type": "invalid_request_error", "code": "session_exists"}})),
        )
            .into_response()),
        Err(ImportError::Store(e)) => Err(store_error(&state, e)),
        Err(e) => Err(GatewayError::bad_request(e.to_string()).into()),
    }
}

async fn delete(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    let id = lookup::resolve(&state, id).await?;
    if state
        .sessions
        .delete(&id)
        .await
        .map_err(|e| store_error(&state, e))?
    {
        tracing::info!(target: "ctxgate::admin", session = %id, "admin: session deleted");
        Ok(Json(json!({"id": id, "deleted": true})).into_response())
    } else {
        Err(not_found(&id))
    }
}

/// Writes a summary of the session's history now (all but the newest `summary.keep_recent` messages) and returns
/// its compression record.
async fn compress(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    let id = lookup::resolve(&state, id).await?;
    let live = state.live();
    let Some(summarizer) = &live.summarizer else {
        return Err(GatewayError::bad_request(
            "summaries are off: set [summary] model to enable them",
        )
        .into());
    };
    let Some(entry) = state
        .sessions
        .entry(&id)
        .await
        .map_err(|e| store_error(&state, e))?
    else {
        return Err(not_found(&id));
    };
    let job = crate::summary::manual_job(
        entry.clone(),
        live.config.summary.keep_recent,
        summarizer.model(),
    )
    .map_err(GatewayError::bad_request)?;
    let record = summarizer.run(&job).await.map_err(|e| {
        GatewayError::UpstreamUnreachable(format!("the summary request failed: {e}"))
    })?;
    let record = crate::store::Compression::Summary(record);
    state
        .sessions
        .record_entry(&entry, crate::store::Record::from(record.clone()))
        .await
        .map_err(|e| store_error(&state, e))?;
    tracing::info!(target: "ctxgate::admin", session = %id, upto = job.upto, "admin: session summarized");
    Ok(Json(record).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_eq_works() {
        assert!(super::constant_time_eq(b"abcdefgh", b"abcdefgh"));
        assert!(!super::constant_time_eq(b"abcdefgh", b"abcdefgi"));
        assert!(!super::constant_time_eq(b"abc", b"abcdefgh"));
        assert!(!super::constant_time_eq(b"", b"abcdefgh"));
    }
}
