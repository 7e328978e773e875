//! `/v1/*` other than chat: method, query, headers and body streamed both ways, untouched.

use crate::app::AppState;
use crate::error::GatewayError;
use crate::metrics::{DialectLabel, Route, UpstreamErrorClass};
use crate::relay;
use crate::upstream::{answer_headers, Api};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Instant;

/// Forwards any `/v1/<rest>` request to `<upstream.base_url>/<rest>` (`<anthropic.base_url>/<rest>` for an
/// Anthropic request, `<gemini.base_url>/v1/<rest>` for a Gemini one: see `Api::of`), and any `/v1beta/<rest>` or
/// `/v1alpha/<rest>` to `<gemini.base_url>/v1beta/<rest>` (`…/v1alpha/…`); a path with a `.` or `..` segment (raw or
/// percent-encoded) is refused with 400, since the URL parser would resolve it onto another upstream path.
pub async fn handle(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let started = Instant::now();
    // Records the request when dropped: with the response body, once it is relayed (or the client went away).
    let mut timer = state
        .metrics
        .start(Route::Passthrough, DialectLabel::NoDialect, started);
    let (parts, body) = req.into_parts();
    if has_dot_segment(parts.uri.path()) {
        let e = GatewayError::bad_request(
            "the path has a `.` or `..` segment (raw or percent-encoded); ctxgate only forwards paths under /v1",
        );
        log(
            &parts.method,
            parts.uri.path(),
            e.status().as_u16(),
            started,
        );
        timer.set_status(e.status().as_u16());
        return e.into_response();
    }
    let (api, rest) = destination(parts.uri.path(), &parts.headers);
    let url = state.upstream.url_for(api, &rest, parts.uri.query());
    let mut headers = state
        .upstream
        .request_headers_for(api, &parts.headers, false);
    // Traced (`[otel]` on): the upstream's parent is this request's server span.
    if let Some(t) = parts.extensions.get::<crate::otel::RequestTrace>() {
        crate::otel::inject(t.context(), &mut headers);
    }
    let path = parts.uri.path();
    timer.upstream_sent();
    let result = state
        .upstream
        .send(parts.method.clone(), &url, headers, body)
        .await;
    let resp = match result {
        Ok(r) => r,
        // The body ended when every in-flight slot was taken (`late_slot`): refused like any request beyond
        // `server.max_in_flight`, not an upstream failure.
        Err(_) if late_refused(&parts) => {
            let e = GatewayError::Overloaded {
                limit: state.config.server.max_in_flight,
                retry_after_secs: super::limits::RETRY_AFTER_SECS,
            };
            log(&parts.method, path, e.status().as_u16(), started);
            timer.set_status(e.status().as_u16());
            return e.into_response();
        }
        Err(e) => {
            log(&parts.method, path, e.status().as_u16(), started);
            let class = match e {
                GatewayError::UpstreamTimeout(_) => UpstreamErrorClass::Timeout,
                _ => UpstreamErrorClass::Unreachable,
            };
            state
                .metrics
                .upstream_error(Route::Passthrough, DialectLabel::NoDialect, class);
            timer.set_status(e.status().as_u16());
            return e.into_response();
        }
    };
    log(&parts.method, path, resp.status().as_u16(), started);
    let status = resp.status().as_u16();
    timer.set_status(status);
    if let Some(class) = UpstreamErrorClass::of_status(status) {
        state
            .metrics
            .upstream_error(Route::Passthrough, DialectLabel::NoDialect, class);
    }
    let sse = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    timer.set_stream(sse);
    let mut builder = Response::builder().status(resp.status());
    if let Some(h) = builder.headers_mut() {
        *h = answer_headers(resp.headers(), |_| true);
    }
    let metrics = state.metrics.clone();
    let stream = relay::passthrough(resp.bytes_stream().boxed(), state.upstream.timeout()).map(
        move |chunk| {
            let _in_flight = &timer;
            if chunk.is_err() {
                metrics.upstream_error(
                    Route::Passthrough,
                    DialectLabel::NoDialect,
                    UpstreamErrorClass::Interrupted,
                );
            }
            chunk
        },
    );
    builder
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| GatewayError::Internal(e.to_string()).into_response())
}

/// The API a request to `path` with `headers` is for, and its path below that API's base URL: under `/v1`, the
/// API `Api::of` says and the path after `/v1` (the Gemini API's base URL has no version: `v1/…`); under another
/// Gemini API version (`/v1beta/…`, `/v1alpha/…`), the Gemini API and the whole path.
fn destination<'p>(path: &'p str, headers: &http::HeaderMap) -> (Api, std::borrow::Cow<'p, str>) {
    if let Some(rest) = path
        .strip_prefix("/v1/")
        .or(path.strip_prefix("/v1").filter(|r| r.is_empty()))
    {
        return match Api::of(rest, headers) {
            Api::Gemini => (Api::Gemini, std::borrow::Cow::Owned(format!("v1/{rest}"))),
            api => (api, std::borrow::Cow::Borrowed(rest)),
        };
    }
    (
        Api::Gemini,
        std::borrow::Cow::Borrowed(path.trim_start_matches('/')),
    )
}

/// Whether the request's body took no in-flight slot when it ended (none was free).
fn late_refused(parts: &http::request::Parts) -> bool {
    parts
        .extensions
        .get::<Arc<super::late_slot::LateSlot>>()
        .is_some_and(|l| l.refused())
}

/// Whether `path` has a segment that is `.` or `..` once percent-decoded (repeatedly, so that double encoding is
/// caught too), with `\` taken as a separator as URL parsers do for http(s). `%2f` decodes to a separator, so
/// `..%2f` is a `..` segment.
fn has_dot_segment(path: &str) -> bool {
    // Without a `.` or a `%` no segment is, or decodes to, `.` or `..` (most paths: no copy, no decoding).
    if !path.bytes().any(|b| b == b'.' || b == b'%') {
        return false;
    }
    let mut bytes = path.as_bytes().to_vec();
    // Each round removes at least one `%`: a bounded number of rounds decodes any realistic nesting.
    for _ in 0..8 {
        if bytes
            .split(|&b| b == b'/' || b == b'\\')
            .any(|seg| seg == b"." || seg == b"..")
        {
            return true;
        }
        let decoded = percent_decode(&bytes);
        if decoded == bytes {
            return false;
        }
        bytes = decoded;
    }
    // Still changing after that many rounds: nothing legitimate looks like this.
    true
}

/// `%XX` sequences decoded; anything else (including a malformed `%`) kept as it is.
fn percent_decode(input: &[u8]) -> Vec<u8> {
    let hex = |b: u8| {
        char::from(b)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        let pair = (
            input.get(i + 1).copied().and_then(hex),
            input.get(i + 2).copied().and_then(hex),
        );
        match (input[i], pair) {
            (b'%', (Some(hi), Some(lo))) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

fn log(method: &http::Method, path: &str, status: u16, started: Instant) {
    tracing::info!(
        target: "ctxgate::access",
        method = %method,
        path,
        status,
        upstream_ms = crate::logging::millis(started.elapsed()),
        "passthrough"
    );
}

#[cfg(test)]
mod tests {
    use super::{destination, has_dot_segment};
    use crate::upstream::Api;

    #[test]
    fn each_path_goes_to_its_api() {
        let none = http::HeaderMap::new();
        let mut goog = http::HeaderMap::new();
        goog.insert("x-goog-api-key", http::HeaderValue::from_static("k"));
        let to = |path: &str, h: &http::HeaderMap| {
            let (api, rest) = destination(path, h);
            (api, rest.into_owned())
        };
        assert_eq!(to("/v1/models", &none), (Api::OpenAi, "models".into()));
        assert_eq!(to("/v1/files/x", &none), (Api::OpenAi, "files/x".into()));
        assert_eq!(to("/v1/models", &goog), (Api::Gemini, "v1/models".into()));
        assert_eq!(
            to("/v1/models/gemini-2.5-pro:embedContent", &none),
            (Api::Gemini, "v1/models/gemini-2.5-pro:embedContent".into())
        );
        assert_eq!(
            to("/v1beta/models", &none),
            (Api::Gemini, "v1beta/models".into())
        );
        assert_eq!(
            to("/v1alpha/cachedContents", &none),
            (Api::Gemini, "v1alpha/cachedContents".into())
        );
        assert_eq!(to("/v1/messages/batches", &none).0, Api::Anthropic);
    }

    #[test]
    fn dot_segments_raw_and_encoded_are_found() {
        for bad in [
            "/v1/../x",
            "/v1/..",
            "/v1/./models",
            "/v1/a/.",
            "/v1/%2e%2e/x",
            "/v1/%2E%2E/x",
            "/v1/.%2e/x",
            "/v1/%2e./x",
            "/v1/%2e/models",
            "/v1/..%2fadmin",
            "/v1/%2e%2e%2fadmin",
            "/v1/..%5cadmin",
            "/v1/..\\admin",
            "/v1/%252e%252e/x",
            "/v1/%25252e%25252e/x",
        ] {
            assert!(has_dot_segment(bad), "{bad}");
        }
        for good in [
            "/v1/models",
            "/v1/files/file-abc/content",
            "/v1/models/gpt-4.1",
            "/v1/files/a..b",
            "/v1/.well-known",
            "/v1/...",
            "/v1/files%2fabc",
            "/v1/%zz",
            "/v1/100%",
        ] {
            assert!(!has_dot_segment(good), "{good}");
        }
    }
}
