//! Value checks several sections share: an http(s) URL, a credential that fits in a header.

/// Whether `u` parses as a URL whose scheme is `http` or `https`.
pub fn is_http_url(u: &str) -> bool {
    matches!(reqwest::Url::parse(u), Ok(u) if u.scheme() == "http" || u.scheme() == "https")
}

/// Whether `key` is non-empty and can be sent as `Authorization: Bearer <key>`.
pub fn is_bearer_credential(key: &str) -> bool {
    !key.trim().is_empty() && http::HeaderValue::from_str(&format!("Bearer {key}")).is_ok()
}
