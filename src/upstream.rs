//! The one HTTP client towards the LLM API: URL mapping, header filtering, timeouts and error mapping.

use crate::config::{AnthropicConfig, UpstreamConfig};
use crate::error::GatewayError;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Headers that belong to one hop and are never forwarded (RFC 9110 §7.6.1), plus `host`.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// The upstream LLM API.
#[derive(Clone, Debug)]
pub struct Upstream {
    client: reqwest::Client,
    urls: Arc<Mutex<HashMap<String, reqwest::Url>>>,
    base: String,
    api_key: Option<HeaderValue>,
    anthropic_base: String,
    anthropic_key: Option<HeaderValue>,
    timeout: Duration,
}

/// Which API a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// The OpenAI-compatible API (`[upstream]`).
    OpenAi,
    /// The Anthropic Messages API (`[anthropic]`).
    Anthropic,
}

impl Api {
    /// The API a request to `/v1/<rest>` with `headers` is for: Anthropic for `messages…` and for any request
    /// carrying an `anthropic-version` header (which only Anthropic clients send).
    pub fn of(rest: &str, headers: &HeaderMap) -> Api {
        let rest = rest.trim_start_matches('/');
        if rest == "messages"
            || rest.starts_with("messages/")
            || headers.contains_key("anthropic-version")
        {
            Api::Anthropic
        } else {
            Api::OpenAi
        }
    }
}

impl Upstream {
    /// Builds the client: rustls, no decompression, no system proxy, no redirects, `TCP_NODELAY`.
    pub fn new(cfg: &UpstreamConfig, anthropic: &AnthropicConfig) -> Result<Self, GatewayError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(cfg.connect_timeout_secs))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| GatewayError::Internal(format!("cannot build HTTP client: {e}")))?;
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
        Ok(Self {
            client,
            urls: Arc::default(),
            base: cfg.base_url.trim_end_matches('/').to_string(),
            api_key,
            anthropic_base: anthropic.base_url.trim_end_matches('/').to_string(),
            anthropic_key,
            timeout: Duration::from_secs(cfg.timeout_secs),
        })
    }

    /// The timeout for response headers and between body chunks.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `<base_url>/<rest>?<query>` for a request to `/v1/<rest>` of the OpenAI-compatible API.
    pub fn url(&self, rest: &str, query: Option<&str>) -> String {
        self.url_for(Api::OpenAi, rest, query)
    }

    /// `<base_url>/<rest>?<query>` for a request to `/v1/<rest>` of `api` (the query forwarded as is).
    pub fn url_for(&self, api: Api, rest: &str, query: Option<&str>) -> String {
        let rest = rest.trim_start_matches('/');
        let base = match api {
            Api::OpenAi => &self.base,
            Api::Anthropic => &self.anthropic_base,
        };
        match query {
            Some(q) if !q.is_empty() => format!("{base}/{rest}?{q}"),
            _ => format!("{base}/{rest}"),
        }
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
        let mut out = strip_hop_by_hop(incoming);
        if chat {
            out.remove(header::CONTENT_LENGTH);
            out.remove(header::ACCEPT_ENCODING);
        }
        match api {
            Api::OpenAi => {
                if let (false, Some(k)) = (out.contains_key(header::AUTHORIZATION), &self.api_key) {
                    out.insert(header::AUTHORIZATION, k.clone());
                }
            }
            Api::Anthropic => {
                let has_credential =
                    out.contains_key(header::AUTHORIZATION) || out.contains_key("x-api-key");
                if let (false, Some(k)) = (has_credential, &self.anthropic_key) {
                    out.insert("x-api-key", k.clone());
                }
            }
        }
        out
    }

    /// Sends a request and waits (at most `timeout_secs`) for the response headers.
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: HeaderMap,
        body: reqwest::Body,
    ) -> Result<reqwest::Response, GatewayError> {
        let req = match self.parsed(url) {
            Some(url) => self.client.request(method, url),
            // Not a URL: reqwest reports it as a request error.
            None => self.client.request(method, url),
        };
        let req = req.headers(headers).body(body);
        match tokio::time::timeout(self.timeout, req.send()).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(map_reqwest_error(&e, self.timeout)),
            Err(_) => Err(GatewayError::UpstreamTimeout(self.timeout.as_secs())),
        }
    }
}

impl Upstream {
    /// `url` parsed, from a memo of the URLs sent to lately (a gateway sends to a handful of paths; parsing one
    /// costs more than the rest of building the request). `None` when it does not parse.
    fn parsed(&self, url: &str) -> Option<reqwest::Url> {
        if let Some(u) = self.urls.lock().get(url) {
            return Some(u.clone());
        }
        let parsed = reqwest::Url::parse(url).ok()?;
        let mut urls = self.urls.lock();
        if urls.len() >= URLS_MAX {
            urls.clear();
        }
        urls.insert(url.to_string(), parsed.clone());
        Some(parsed)
    }
}

/// Most parsed URLs remembered; the memo starts over when it is full.
const URLS_MAX: usize = 1024;

/// Maps a client error to 502 or 504, without the URL (which could carry secrets in a query).
pub fn map_reqwest_error(e: &reqwest::Error, timeout: Duration) -> GatewayError {
    if e.is_timeout() {
        return GatewayError::UpstreamTimeout(timeout.as_secs());
    }
    let kind = if e.is_connect() {
        "connection failed"
    } else if e.is_request() {
        "request failed"
    } else if e.is_body() {
        "body transfer failed"
    } else {
        "protocol error"
    };
    let mut msg = kind.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = format!("{kind}: {s}");
        src = s.source();
    }
    GatewayError::UpstreamUnreachable(msg)
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(h: &HeaderMap) -> HeaderMap {
    let mut named: Vec<HeaderName> = Vec::new();
    for v in h.get_all(header::CONNECTION) {
        if let Ok(s) = v.to_str() {
            named.extend(
                s.split(',')
                    .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok()),
            );
        }
    }
    let mut out = HeaderMap::with_capacity(h.len());
    for (k, v) in h {
        if HOP_BY_HOP.contains(&k.as_str()) || named.contains(k) {
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
    fn parsed_urls_are_remembered_and_bounded() {
        let u = up(None);
        let url = u.url("chat/completions", None);
        let first = u.parsed(&url).unwrap();
        assert_eq!(first.as_str(), "http://u.example/v1/chat/completions");
        assert_eq!(u.parsed(&url).unwrap(), first);
        assert!(u.parsed("not a url").is_none());
        for i in 0..URLS_MAX + 5 {
            let url = u.url(&format!("files/f{i}"), Some("x=1"));
            assert_eq!(u.parsed(&url).unwrap().as_str(), url);
            assert!(u.urls.lock().len() <= URLS_MAX);
        }
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
}
