//! Value checks several sections share: an http(s) URL, a credential that fits in a header.

/// Whether `u` parses as an absolute URL (as the upstream client will parse it) whose scheme is `http` or `https`
/// and which names a host.
pub fn is_http_url(u: &str) -> bool {
    match u.parse::<http::Uri>() {
        Ok(uri) => {
            matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.host().is_some_and(|h| !h.is_empty())
        }
        Err(_) => false,
    }
}

/// Whether `key` is non-empty and can be sent as `Authorization: Bearer <key>`.
pub fn is_bearer_credential(key: &str) -> bool {
    !key.trim().is_empty() && http::HeaderValue::from_str(&format!("Bearer {key}")).is_ok()
}

#[cfg(test)]
mod tests {
    use super::is_http_url;

    #[test]
    fn only_absolute_http_urls_with_a_host_pass() {
        for good in [
            "http://127.0.0.1:8788/v1",
            "https://api.openai.com/v1",
            "http://localhost",
            "https://[::1]:9/x",
        ] {
            assert!(is_http_url(good), "{good}");
        }
        for bad in [
            "",
            "api.openai.com/v1",
            "localhost:8080",
            "ftp://host/x",
            "http://",
            "not a url",
            "https://exa mple.com",
        ] {
            assert!(!is_http_url(bad), "{bad}");
        }
    }
}
