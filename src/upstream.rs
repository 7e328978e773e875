//! The one HTTP client towards the LLM API (hyper's pooled client over rustls: HTTP/1.1, and HTTP/2 where TLS
//! offers it): URL mapping, header filtering, timeouts and error mapping; a [`Target`] per place requests go
//! (`[upstream]`, `[anthropic]`, each `[upstreams.<name>]`).

use crate::config::{AnthropicConfig, GeminiConfig, NamedUpstream, UpstreamConfig, UpstreamKind};
use crate::error::GatewayError;
use axum::body::Body;
use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;

/// Whether a header belongs to one hop and is never forwarded (RFC 9110 §7.6.1), or is `host`. A `match` on the
/// name (by length first) rather than a scan of a list: every header of every request and answer goes through it.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

/// The client: pooled keep-alive connections, TLS by rustls with the webpki roots.
type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Body>;

/// The upstream LLM APIs of `[upstream]`, `[anthropic]` and `[gemini]` (one pooled client, `[upstream]`'s
/// timeouts).
#[derive(Clone, Debug)]
pub struct Upstream {
    openai: Arc<Target>,
    anthropic: Arc<Target>,
    gemini: Arc<Target>,
}

/// One place requests go, by name: `default` (`[upstream]`), `anthropic` (`[anthropic]`), `gemini` (`[gemini]`) or an
/// `[upstreams.<name>]` — its API, base URL, key, timeout and the pooled client that reaches it.
#[derive(Debug)]
pub struct Target {
    name: Arc<str>,
    api: Api,
    client: HttpClient,
    base: String,
    key: Option<HeaderValue>,
    /// The key goes in place of the client's credential (a named upstream's) rather than only when the client
    /// sent none (`[upstream]`'s, `[anthropic]`'s).
    replaces: bool,
    timeout: Duration,
}

/// Which API a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// The OpenAI-compatible API (`[upstream]`).
    OpenAi,
    /// The Anthropic Messages API (`[anthropic]`).
    Anthropic,
    /// The Gemini API (`[gemini]`).
    Gemini,
}

/// The header a Gemini client sends its key in.
pub const GOOG_API_KEY: &str = "x-goog-api-key";

impl Api {
    /// The API a request to `/v1/<rest>` with `headers` is for: Anthropic for `messages…` and for any request
    /// carrying an `anthropic-version` header (which only Anthropic clients send); Gemini for a model's method
    /// (`models/{model}:{method}`) and any request carrying `x-goog-api-key` (which only Gemini clients send).
    pub fn of(rest: &str, headers: &HeaderMap) -> Api {
        let rest = rest.trim_start_matches('/');
        if rest == "messages"
            || rest.starts_with("messages/")
            || headers.contains_key("anthropic-version")
        {
            Api::Anthropic
        } else if headers.contains_key(GOOG_API_KEY)
            || rest
                .strip_prefix("models/")
                .is_some_and(|m| m.contains(':'))
        {
            Api::Gemini
        } else {
            Api::OpenAi
        }
    }

    /// Its name as an upstream's `kind` (and `gen_ai.provider.name`'s stem): `openai`, `anthropic`, `gemini`.
    pub fn kind(self) -> &'static str {
        match self {
            Api::OpenAi => "openai",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
        }
    }
}

/// `query` without its `key` parameters (a Gemini client's API key).
fn without_key(query: &str) -> std::borrow::Cow<'_, str> {
    if !query.split('&').any(is_key_param) {
        return std::borrow::Cow::Borrowed(query);
    }
    let kept: Vec<&str> = query.split('&').filter(|p| !is_key_param(p)).collect();
    std::borrow::Cow::Owned(kept.join("&"))
}

/// Whether a query parameter is `key` (a Gemini API key).
pub fn is_key_param(param: &str) -> bool {
    param == "key" || param.starts_with("key=")
}

/// `query` with the value of its `key` parameters replaced by `***`, for logs and traces.
pub fn redacted_query(query: &str) -> std::borrow::Cow<'_, str> {
    if !query.split('&').any(is_key_param) {
        return std::borrow::Cow::Borrowed(query);
    }
    let parts: Vec<&str> = query
        .split('&')
        .map(|p| if is_key_param(p) { "key=***" } else { p })
        .collect();
    std::borrow::Cow::Owned(parts.join("&"))
}

/// Builds a client: rustls (webpki roots, HTTP/2 offered by ALPN), no decompression, no proxy, no redirects,
/// `TCP_NODELAY`, idle connections kept 90 s.
fn client(connect_timeout: Duration) -> Result<HttpClient, GatewayError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| GatewayError::Internal(format!("cannot build HTTP client: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(https))
}

impl Upstream {
    /// Builds the client of `[upstream]`, `[anthropic]` and `[gemini]` (see [`client`]).
    pub fn new(
        cfg: &UpstreamConfig,
        anthropic: &AnthropicConfig,
        gemini: &GeminiConfig,
    ) -> Result<Self, GatewayError> {
        let client = client(Duration::from_secs(cfg.connect_timeout_secs))?;
        let api_key = match &cfg.api_key {
            Some(k) => Some(HeaderValue::from_str(&format!("Bearer {k}")).map_err(|_| {
                GatewayError::Internal("upstream.api_key is not a valid header value".into())
            })?),
            None => None,
        };
        let anthropic_key = match &anthropic.api_key {
            Some(k) => Some(HeaderValue::from_str(k).map_err(|_| {
                GatewayError::Internal("anthropic.api_key is not a valid header value".into())
            })?),
            None => None,
        };
        let gemini_key = match &gemini.api_key {
            Some(k) => Some(HeaderValue::from_str(k).map_err(|_| {
                GatewayError::Internal("gemini.api_key is not a valid header value".into())
            })?),
            None => None,
        };
        let timeout = Duration::from_secs(cfg.timeout_secs);
        Ok(Self {
            openai: Arc::new(Target {
                name: "default".into(),
                api: Api::OpenAi,
                client: client.clone(),
                base: cfg.base_url.trim_end_matches('/').to_string(),
                key: api_key,
                replaces: false,
                timeout,
            }),
            anthropic: Arc::new(Target {
                name: "anthropic".into(),
                api: Api::Anthropic,
                client: client.clone(),
                base: anthropic.base_url.trim_end_matches('/').to_string(),
                key: anthropic_key,
                replaces: false,
                timeout,
            }),
            gemini: Arc::new(Target {
                name: "gemini".into(),
                api: Api::Gemini,
                client,
                base: gemini.base_url.trim_end_matches('/').to_string(),
                key: gemini_key,
                replaces: false,
                timeout,
            }),
        })
    }

    /// Where a request of `api` goes by default: `[upstream]` (named `default`), `[anthropic]` or `[gemini]`.
    pub fn target(&self, api: Api) -> &Arc<Target> {
        match api {
            Api::OpenAi => &self.openai,
            Api::Anthropic => &self.anthropic,
            Api::Gemini => &self.gemini,
        }
    }

    /// The timeout for response headers and between body chunks.
    pub fn timeout(&self) -> Duration {
        self.openai.timeout
    }

    /// `<base_url>/<rest>?<query>` for a request to `/v1/<rest>` of the OpenAI-compatible API.
    pub fn url(&self, rest: &str, query: Option<&str>) -> String {
        self.url_for(Api::OpenAi, rest, query)
    }

    /// `<base_url>/<rest>?<query>` for a request to `/v1/<rest>` of `api` (the query forwarded as is).
    pub fn url_for(&self, api: Api, rest: &str, query: Option<&str>) -> String {
        self.target(api).url(rest, query)
    }

    /// The client's headers as they go upstream: hop-by-hop headers removed, the configured API key added when
    /// the client sent no Authorization. For chat requests (`chat = true`) the body is sent from memory, so
    /// `content-length` is recomputed, and `accept-encoding` is dropped so that the answer can be read.
    pub fn request_headers(&self, incoming: &HeaderMap, chat: bool) -> HeaderMap {
        self.request_headers_for(Api::OpenAi, incoming, chat)
    }

    /// [`Self::request_headers`] for a request to `api`: the Anthropic key goes as `x-api-key`, only when the
    /// client sent neither `x-api-key` nor `Authorization`.
    pub fn request_headers_for(&self, api: Api, incoming: &HeaderMap, chat: bool) -> HeaderMap {
        self.target(api).request_headers(incoming, chat)
    }

    /// Sends a request and waits (at most `timeout_secs`) for the response headers.
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: HeaderMap,
        body: Body,
    ) -> Result<UpstreamResponse, GatewayError> {
        self.openai.send(method, url, headers, body).await
    }

    /// Sends a request over the same pooled client and waits at most `timeout` for the response headers (the
    /// idle webhook, with its own `[hooks]` timeout).
    pub async fn send_within(
        &self,
        method: http::Method,
        url: &str,
        headers: HeaderMap,
        body: Body,
        timeout: Duration,
    ) -> Result<UpstreamResponse, GatewayError> {
        self.openai
            .send_within(method, url, headers, body, timeout)
            .await
    }
}

impl Target {
    /// A named upstream, `[upstreams.<name>]`, with its own pooled client (its connect timeout); its timeouts
    /// default to `[upstream]`'s (`default`).
    pub fn named(
        name: &str,
        cfg: &NamedUpstream,
        default: &UpstreamConfig,
    ) -> Result<Target, GatewayError> {
        let api = match cfg.kind {
            UpstreamKind::Openai => Api::OpenAi,
            UpstreamKind::Anthropic => Api::Anthropic,
            UpstreamKind::Gemini => Api::Gemini,
        };
        let key = match &cfg.api_key {
            Some(k) => {
                let value = match api {
                    Api::OpenAi => format!("Bearer {k}"),
                    Api::Anthropic | Api::Gemini => k.clone(),
                };
                let mut v = HeaderValue::from_str(&value).map_err(|_| {
                    GatewayError::Internal(format!(
                        "upstreams.{name}.api_key is not a valid header value"
                    ))
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Ok(Target {
            name: name.into(),
            api,
            client: client(Duration::from_secs(cfg.connect_timeout_secs(default)))?,
            base: cfg.base_url.trim_end_matches('/').to_string(),
            key,
            replaces: true,
            timeout: Duration::from_secs(cfg.timeout_secs(default)),
        })
    }

    /// Its name: `default`, `anthropic`, or the `[upstreams.<name>]`'s (metrics, traces, errors).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API it speaks.
    pub fn api(&self) -> Api {
        self.api
    }

    /// The timeout for response headers and between body chunks.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `<base_url>/<rest>?<query>` for a request to `/v1/<rest>` (the query forwarded as is, but the client's
    /// `key` parameter when a Gemini upstream's own key replaces the client's).
    pub fn url(&self, rest: &str, query: Option<&str>) -> String {
        let rest = rest.trim_start_matches('/');
        let base = &self.base;
        let query = match query {
            Some(q) if self.api == Api::Gemini && self.replaces && self.key.is_some() => {
                Some(without_key(q))
            }
            Some(q) => Some(std::borrow::Cow::Borrowed(q)),
            None => None,
        };
        match query {
            Some(q) if !q.is_empty() => format!("{base}/{rest}?{q}"),
            _ => format!("{base}/{rest}"),
        }
    }

    /// The client's headers as they go here: hop-by-hop headers removed; for chat requests (`chat = true`)
    /// `content-length` (recomputed) and `accept-encoding` (the answer is read) dropped. The key: a named
    /// upstream's replaces the client's credential (`Authorization` and `x-api-key` both dropped; `Bearer` for
    /// OpenAI, `x-api-key` for Anthropic); `[upstream]`'s goes as `Authorization: Bearer` when the client sent no
    /// Authorization, `[anthropic]`'s as `x-api-key` when it sent neither `x-api-key` nor `Authorization`.
    pub fn request_headers(&self, incoming: &HeaderMap, chat: bool) -> HeaderMap {
        // A chat body may be rewritten (its length then differs) and is read by ctxgate (so it must not come back
        // compressed).
        let mut out = end_to_end(incoming, |k| {
            !chat || (k != header::CONTENT_LENGTH && k != header::ACCEPT_ENCODING)
        });
        let Some(key) = &self.key else {
            return out;
        };
        if self.replaces {
            out.remove(header::AUTHORIZATION);
            out.remove("x-api-key");
            out.remove(GOOG_API_KEY);
        }
        match self.api {
            Api::OpenAi => {
                if !out.contains_key(header::AUTHORIZATION) {
                    out.insert(header::AUTHORIZATION, key.clone());
                }
            }
            Api::Anthropic => {
                if !(out.contains_key(header::AUTHORIZATION) || out.contains_key("x-api-key")) {
                    out.insert("x-api-key", key.clone());
                }
            }
            Api::Gemini => {
                if !(out.contains_key(header::AUTHORIZATION) || out.contains_key(GOOG_API_KEY)) {
                    out.insert(GOOG_API_KEY, key.clone());
                }
            }
        }
        out
    }

    /// Sends a request and waits (at most its timeout) for the response headers.
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: HeaderMap,
        body: Body,
    ) -> Result<UpstreamResponse, GatewayError> {
        self.send_within(method, url, headers, body, self.timeout)
            .await
    }

    /// Sends a request over its pooled client and waits at most `timeout` for the response headers.
    pub async fn send_within(
        &self,
        method: http::Method,
        url: &str,
        headers: HeaderMap,
        body: Body,
        timeout: Duration,
    ) -> Result<UpstreamResponse, GatewayError> {
        let uri: http::Uri = url.parse().map_err(|_| {
            GatewayError::UpstreamUnreachable("request failed: not a valid URL".into())
        })?;
        let mut req = http::Request::new(body);
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        match tokio::time::timeout(timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(UpstreamResponse(resp)),
            Ok(Err(e)) => Err(map_client_error(&e, timeout)),
            Err(_) => Err(GatewayError::UpstreamTimeout(timeout.as_secs())),
        }
    }
}

/// An upstream's answer: its head, and a body still to be read.
#[derive(Debug)]
pub struct UpstreamResponse(http::Response<hyper::body::Incoming>);

/// Why an upstream body could not be read to its end.
pub type BodyError = hyper::Error;

impl UpstreamResponse {
    /// The status.
    pub fn status(&self) -> http::StatusCode {
        self.0.status()
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        self.0.headers()
    }

    /// The body's bytes as they arrive (trailers skipped).
    pub fn bytes_stream(self) -> BoxStream<'static, Result<Bytes, BodyError>> {
        futures_util::stream::unfold(self.0.into_body(), |mut body| async move {
            loop {
                match body.frame().await? {
                    Ok(frame) => {
                        if let Ok(data) = frame.into_data() {
                            return Some((Ok(data), body));
                        }
                    }
                    Err(e) => return Some((Err(e), body)),
                }
            }
        })
        .boxed()
    }

    /// The whole body.
    pub async fn bytes(self) -> Result<Bytes, BodyError> {
        Ok(self.0.into_body().collect().await?.to_bytes())
    }
}

/// Maps a client error to 502 or 504, without the URL (which could carry secrets in a query): the kind of failure
/// and its innermost cause ("Connection refused", "connection reset").
pub fn map_client_error(e: &(dyn std::error::Error + 'static), timeout: Duration) -> GatewayError {
    let mut connect = false;
    let mut innermost = e;
    let mut src = Some(e);
    while let Some(s) = src {
        if s.downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(|c| c.is_connect())
        {
            connect = true;
        }
        if s.downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_timeout())
        {
            return GatewayError::UpstreamTimeout(timeout.as_secs());
        }
        innermost = s;
        src = s.source();
    }
    let kind = if connect {
        "connection failed"
    } else if e.downcast_ref::<hyper::Error>().is_some() {
        "body transfer failed"
    } else {
        "request failed"
    };
    GatewayError::UpstreamUnreachable(format!("{kind}: {innermost}"))
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(h: &HeaderMap) -> HeaderMap {
    end_to_end(h, |_| true)
}

/// The headers of an upstream's answer that go to the client: its end-to-end headers that `keep` accepts, without
/// any `x-ctxgate-*` header — those are ctxgate's own word to the client (the session, what a rewrite did), which
/// an upstream (or another gateway behind ctxgate) must not be able to speak.
pub fn answer_headers(h: &HeaderMap, keep: impl Fn(&HeaderName) -> bool) -> HeaderMap {
    end_to_end(h, |k| keep(k) && !is_own_header(k))
}

/// Whether `name` is one of ctxgate's own answer headers (`x-ctxgate-…`).
fn is_own_header(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-ctxgate-")
}

/// The end-to-end headers of `h` that `keep` accepts, in their order (hop-by-hop ones and those the `Connection`
/// header names are left out).
pub fn end_to_end(h: &HeaderMap, keep: impl Fn(&HeaderName) -> bool) -> HeaderMap {
    // The names the `Connection` header lists, as written (compared without case): no `HeaderName` is built for
    // them. `keep-alive`, what it usually says, is left out (hop-by-hop anyway): the usual message allocates
    // nothing here.
    let mut named: Vec<&str> = Vec::new();
    for v in h.get_all(header::CONNECTION) {
        if let Ok(s) = v.to_str() {
            named.extend(
                s.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("keep-alive")),
            );
        }
    }
    let mut out = HeaderMap::with_capacity(h.len());
    for (k, v) in h {
        if is_hop_by_hop(k) || named.iter().any(|t| t.eq_ignore_ascii_case(k.as_str())) || !keep(k)
        {
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(key: Option<&str>) -> Upstream {
        Upstream::new(
            &UpstreamConfig {
                base_url: "http://u.example/v1/".into(),
                api_key: key.map(str::to_string),
                ..Default::default()
            },
            &AnthropicConfig::default(),
            &GeminiConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn urls() {
        let u = up(None);
        assert_eq!(u.url("models", None), "http://u.example/v1/models");
        assert_eq!(
            u.url("/files/f1/content", Some("a=1&b=2")),
            "http://u.example/v1/files/f1/content?a=1&b=2"
        );
    }

    #[test]
    fn headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, x-drop"));
        h.insert("x-drop", HeaderValue::from_static("1"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        h.insert("host", HeaderValue::from_static("gw"));
        h.insert("accept-encoding", HeaderValue::from_static("gzip"));
        h.insert("content-length", HeaderValue::from_static("10"));
        let out = up(Some("sk-conf")).request_headers(&h, true);
        assert!(out.get("x-drop").is_none() && out.get("host").is_none());
        assert!(out.get("connection").is_none() && out.get("accept-encoding").is_none());
        assert_eq!(out["x-keep"], "1");
        assert_eq!(out["authorization"], "Bearer sk-conf");
        let pass = up(Some("sk-conf")).request_headers(&h, false);
        assert_eq!(pass["accept-encoding"], "gzip");
        assert_eq!(pass["content-length"], "10");
        // the client's own Authorization wins
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer sk-client"),
        );
        assert_eq!(
            up(Some("sk-conf")).request_headers(&h, true)["authorization"],
            "Bearer sk-client"
        );
    }

    #[test]
    fn headers_the_connection_header_names_are_dropped_whatever_their_case_and_the_rest_keep_their_order(
    ) {
        let mut h = HeaderMap::new();
        h.append("x-first", HeaderValue::from_static("1"));
        h.append("connection", HeaderValue::from_static("Keep-Alive, X-Hop"));
        h.append(
            "connection",
            HeaderValue::from_static(" close ,,X-Other-Hop"),
        );
        h.append("x-hop", HeaderValue::from_static("a"));
        h.append("close", HeaderValue::from_static("b"));
        h.append("x-other-hop", HeaderValue::from_static("c"));
        h.append("keep-alive", HeaderValue::from_static("timeout=5"));
        h.append("x-last", HeaderValue::from_static("2"));
        h.append("x-last", HeaderValue::from_static("3"));
        let out = strip_hop_by_hop(&h);
        let kept: Vec<(&str, &str)> = out
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(kept, [("x-first", "1"), ("x-last", "2"), ("x-last", "3")]);
        // Without a `Connection` header only the fixed hop-by-hop list goes.
        let mut plain = HeaderMap::new();
        plain.append("te", HeaderValue::from_static("trailers"));
        plain.append("x-hop", HeaderValue::from_static("a"));
        plain.append("upgrade", HeaderValue::from_static("h2c"));
        let out = strip_hop_by_hop(&plain);
        assert_eq!(out.len(), 1);
        assert_eq!(out["x-hop"], "a");
    }
}
