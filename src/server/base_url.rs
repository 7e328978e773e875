//! Base-URL traps: a request whose path shows that the client's base URL is wrong — an API path without `/v1`
//! (`POST /messages`: the client appended its endpoint to the bare host), under another prefix (`/api/v1/…`), or
//! with `/v1` twice (`/v1/v1/messages`: a base URL ending in `/v1` given to a client that appends `/v1/…` itself)
//! — is logged (warn, at most once a minute per path) with the likely fix; an unmatched one is answered 404 with
//! the same fix, in the shape of the API it looks like. The path is logged without its query string.

use crate::app::AppState;
use crate::dialect::Dialect;
use crate::error::GatewayError;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often one path is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// Paths remembered at once; when that many were logged within the last `WARN_EVERY`, further new paths are not
/// logged until one of them expires (a client trying many paths cannot flood the log either).
const MAX_PATHS: usize = 64;
/// Characters of a path logged (and remembered) at most.
const MAX_PATH_CHARS: usize = 200;
/// Segments before an API endpoint's name for a path to still look like an API call (`/api/v1/chat/completions`).
const MAX_PREFIX_SEGMENTS: usize = 3;

/// The API endpoints clients append to their base URL (as path segments), and the API each belongs to.
const ENDPOINTS: &[(&[&str], Option<Dialect>)] = &[
    (&["chat", "completions"], Some(Dialect::Chat)),
    (&["messages"], Some(Dialect::Anthropic)),
    (&["responses"], Some(Dialect::Responses)),
    (&["completions"], None),
    (&["embeddings"], None),
    (&["models"], None),
];

/// What a path's shape says about the client's base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trap {
    /// An API path straight under the host (`/messages`): the base URL lacks `/v1`.
    BareHost {
        /// The API the endpoint belongs to, when it is one of the three ctxgate manages.
        dialect: Option<Dialect>,
    },
    /// An API path under another prefix (`/api/v1/chat/completions`, `/openai/responses`).
    Prefixed {
        /// The segments before the endpoint, e.g. `/api/v1`.
        prefix: String,
        /// The API the endpoint belongs to, when it is one of the three ctxgate manages.
        dialect: Option<Dialect>,
    },
    /// `/v1/v1/…`: the base URL ends in `/v1` and the client appends `/v1/…` itself.
    DoubledV1,
    /// A Gemini API call at a wrong place (`/models/gemini-2.5-flash:generateContent`, `/api/v1beta/models/…`):
    /// ctxgate serves the Gemini API at `/v1beta` (and `/v1`, `/v1alpha`) straight under its root.
    Gemini,
}

impl Trap {
    /// The trap `path` (without its query) falls into, if it looks like an API call at a wrong place.
    pub fn of(path: &str) -> Option<Trap> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        match segments.as_slice() {
            ["v1", "v1", ..] => return Some(Trap::DoubledV1),
            // ctxgate's own pages and API: a wrong path there is not a client's base URL.
            ["admin" | "ui", ..] => return None,
            _ => {}
        }
        // `…/models/{model}:{method}` is the Gemini API's shape (Google's SDKs and Gemini CLI)
        if segments
            .windows(2)
            .any(|w| w[0] == "models" && w[1].contains(':'))
        {
            return Some(Trap::Gemini);
        }
        let (at, dialect) = (0..segments.len().min(MAX_PREFIX_SEGMENTS + 1)).find_map(|i| {
            ENDPOINTS.iter().find_map(|(names, dialect)| {
                segments[i..].starts_with(names).then_some((i, *dialect))
            })
        })?;
        Some(match at {
            0 => Trap::BareHost { dialect },
            _ => Trap::Prefixed {
                prefix: format!("/{}", segments[..at].join("/")),
                dialect,
            },
        })
    }

    /// The API whose error shape the answer takes.
    fn dialect(&self) -> Option<Dialect> {
        match self {
            Trap::BareHost { dialect } | Trap::Prefixed { dialect, .. } => *dialect,
            Trap::Gemini => Some(Dialect::Gemini),
            Trap::DoubledV1 => None,
        }
    }

    /// The likely fix, for a request to `path` that reached the gateway at `base` (`http://host:port`).
    pub fn fix(&self, base: &str, path: &str) -> String {
        match self {
            Trap::BareHost { .. } => format!(
                "set the client's base URL to {base}/v1 — it appended {path} to the bare host, and ctxgate serves \
                 the APIs under /v1 (POST {base}/v1/chat/completions, /v1/messages, /v1/responses)"
            ),
            Trap::Prefixed { prefix, .. } if prefix.ends_with("/v1") => format!(
                "set the client's base URL to {base}/v1 (or {base} for a client that appends /v1/… itself, as \
                 Anthropic's SDKs do) — ctxgate serves the APIs under /v1, not under {prefix}"
            ),
            Trap::Prefixed { prefix, .. } => format!(
                "set the client's base URL to {base}/v1 instead of {base}{prefix} — ctxgate serves the APIs \
                 under /v1"
            ),
            Trap::DoubledV1 => format!(
                "set the client's base URL to {base} (without /v1) — it appends /v1/… itself, so the path has /v1 \
                 twice; such a request is forwarded as it came, unmanaged (no session, no rewrite), and a real \
                 provider answers it 404"
            ),
            Trap::Gemini => format!(
                "set the client's Gemini base URL (GOOGLE_GEMINI_BASE_URL, or the SDK's httpOptions.baseUrl) to \
                 {base}, without a path — the client appends /v1beta/models/… itself, and ctxgate serves the \
                 Gemini API at {base}/v1beta; {path} is not there"
            ),
        }
    }
}

/// Which paths were logged lately (one router's: tests running side by side do not share it).
#[derive(Default)]
pub struct Traps {
    logged: Mutex<HashMap<String, Instant>>,
}

impl Traps {
    /// Whether `path` is to be logged now: not logged within `WARN_EVERY`, and room to remember it.
    fn first_lately(&self, path: &str) -> bool {
        let mut logged = self.logged.lock();
        let now = Instant::now();
        if logged
            .get(path)
            .is_some_and(|at| now.duration_since(*at) < WARN_EVERY)
        {
            return false;
        }
        if logged.len() >= MAX_PATHS {
            logged.retain(|_, at| now.duration_since(*at) < WARN_EVERY);
            if logged.len() >= MAX_PATHS {
                return false;
            }
        }
        logged.insert(path.to_string(), now);
        true
    }

    /// Logs `trap` for `req` (once a minute per path) and returns the fix.
    fn report(&self, req: &Request, trap: &Trap, status: Option<u16>) -> String {
        let path = clip(req.uri().path());
        let fix = trap.fix(&base(req), path);
        if self.first_lately(path) {
            let method = req.method().as_str();
            match status {
                Some(status) => tracing::warn!(
                    target: "ctxgate::access",
                    method, path, status, fix = fix.as_str(),
                    "no route: the client's base URL looks wrong (logged once a minute per path)"
                ),
                None => tracing::warn!(
                    target: "ctxgate::access",
                    method, path, fix = fix.as_str(),
                    "/v1 twice: the client's base URL looks wrong; forwarded as it came, unmanaged (logged once a \
                     minute per path)"
                ),
            }
        }
        fix
    }
}

/// At most `MAX_PATH_CHARS` of `path`.
fn clip(path: &str) -> &str {
    match path.char_indices().nth(MAX_PATH_CHARS) {
        Some((i, _)) => &path[..i],
        None => path,
    }
}

/// `scheme://host[:port]` as the client reached the gateway: its `Host` (or HTTP/2 authority), when that is a
/// valid authority; `https` when a proxy in front says so.
fn base(req: &Request) -> String {
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok())
        .or_else(|| req.uri().authority().cloned());
    let https = req
        .headers()
        .get("x-forwarded-proto")
        .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"));
    let scheme = if https { "https" } else { "http" };
    match host {
        Some(h) => format!("{scheme}://{}", h.as_str()),
        None => format!("{scheme}://<ctxgate's host:port>"),
    }
}

/// The router's fallback: 404, saying the likely fix (and logging it) when the path looks like an API call.
pub async fn not_found(traps: Arc<Traps>, req: Request) -> Response {
    let said = format!("no route for {} {}", req.method(), clip(req.uri().path()));
    let Some(trap) = Trap::of(req.uri().path()) else {
        return GatewayError::NotFound(said).into_response();
    };
    let fix = traps.report(&req, &trap, Some(http::StatusCode::NOT_FOUND.as_u16()));
    let e = GatewayError::NotFound(format!("{said}: {fix}"));
    match trap.dialect() {
        Some(d) => crate::pipeline::error_response(d, e),
        None => e.into_response(),
    }
}

/// `/v1/v1/…`: forwarded as it came (passthrough: the upstream decides which paths exist), and logged with the fix.
///
/// Not refused: an upstream whose `base_url` has no `/v1` may serve it, and the rule "`/v1/<rest>` goes to
/// `<base_url>/<rest>`" stays the one rule. Not rerouted to the managed endpoint either: that would make a wrong
/// base URL work through ctxgate alone, by a guess, and fail the day ctxgate is taken out.
pub async fn doubled(traps: Arc<Traps>, state: State<Arc<AppState>>, req: Request) -> Response {
    traps.report(&req, &Trap::DoubledV1, None);
    super::passthrough::handle(state, req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_at_a_wrong_place_are_told_apart() {
        let bare = |d| Some(Trap::BareHost { dialect: d });
        let prefixed = |p: &str, d| {
            Some(Trap::Prefixed {
                prefix: p.into(),
                dialect: d,
            })
        };
        for (path, want) in [
            ("/messages", bare(Some(Dialect::Anthropic))),
            ("/messages/count_tokens", bare(Some(Dialect::Anthropic))),
            ("/chat/completions", bare(Some(Dialect::Chat))),
            ("/chat/completions/", bare(Some(Dialect::Chat))),
            ("/responses", bare(Some(Dialect::Responses))),
            (
                "/responses/resp_1/input_items",
                bare(Some(Dialect::Responses)),
            ),
            ("/completions", bare(None)),
            ("/models", bare(None)),
            ("/embeddings", bare(None)),
            ("/v1/v1/messages", Some(Trap::DoubledV1)),
            ("/v1/v1/chat/completions", Some(Trap::DoubledV1)),
            ("/v1/v1/v1/models", Some(Trap::DoubledV1)),
            (
                "/api/v1/chat/completions",
                prefixed("/api/v1", Some(Dialect::Chat)),
            ),
            (
                "/anthropic/v1/messages",
                prefixed("/anthropic/v1", Some(Dialect::Anthropic)),
            ),
            (
                "/openai/responses",
                prefixed("/openai", Some(Dialect::Responses)),
            ),
            ("/v2/models", prefixed("/v2", None)),
            (
                "/a/b/c/messages",
                prefixed("/a/b/c", Some(Dialect::Anthropic)),
            ),
            // Not API calls: too deep, or no endpoint at all.
            ("/a/b/c/d/messages", None),
            ("/", None),
            ("/favicon.ico", None),
            ("/ui/app.js", None),
            ("/admin/sessions", None),
            ("/admin/models", None),
            ("/ui/models", None),
            ("/v1", None),
            ("/messagesx", None),
            (
                "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
                Some(Trap::Gemini),
            ),
            (
                "/models/gemini-2.5-flash:generateContent",
                Some(Trap::Gemini),
            ),
        ] {
            assert_eq!(Trap::of(path), want, "{path}");
        }
    }

    #[test]
    fn each_fix_names_the_base_url_to_set() {
        let b = "http://127.0.0.1:8787";
        let fix = Trap::of("/messages").unwrap().fix(b, "/messages");
        assert!(
            fix.starts_with(
                "set the client's base URL to http://127.0.0.1:8787/v1 — it appended /messages"
            ),
            "{fix}"
        );
        let fix = Trap::of("/api/v1/chat/completions").unwrap().fix(b, "");
        assert!(
            fix.contains("to http://127.0.0.1:8787/v1 (or http://127.0.0.1:8787 for"),
            "{fix}"
        );
        assert!(fix.contains("not under /api/v1"), "{fix}");
        let fix = Trap::of("/openai/chat/completions").unwrap().fix(b, "");
        assert!(
            fix.contains("instead of http://127.0.0.1:8787/openai"),
            "{fix}"
        );
        let fix = Trap::DoubledV1.fix(b, "");
        assert!(
            fix.starts_with("set the client's base URL to http://127.0.0.1:8787 (without /v1)"),
            "{fix}"
        );
    }

    #[test]
    fn a_path_is_logged_once_a_minute_and_only_so_many_paths_are_remembered() {
        let t = Traps::default();
        assert!(t.first_lately("/messages"));
        assert!(!t.first_lately("/messages"));
        assert!(t.first_lately("/chat/completions"));
        // An entry older than the minute is logged again.
        let old = Instant::now()
            .checked_sub(WARN_EVERY + Duration::from_secs(1))
            .unwrap();
        t.logged.lock().insert("/messages".into(), old);
        assert!(t.first_lately("/messages"));
        // Full of recent paths: a new one is not logged (nor remembered).
        for i in 0..MAX_PATHS {
            t.first_lately(&format!("/p{i}/messages"));
        }
        assert_eq!(t.logged.lock().len(), MAX_PATHS);
        assert!(!t.first_lately("/new/messages"));
        assert_eq!(t.logged.lock().len(), MAX_PATHS);
        // Once they expire, there is room again.
        for at in t.logged.lock().values_mut() {
            *at = old;
        }
        assert!(t.first_lately("/new/messages"));
        assert_eq!(t.logged.lock().len(), 1);
    }

    #[test]
    fn a_long_path_is_clipped() {
        let long = "/x".repeat(500);
        assert_eq!(clip(&long).chars().count(), MAX_PATH_CHARS);
        assert_eq!(clip("/messages"), "/messages");
    }
}
