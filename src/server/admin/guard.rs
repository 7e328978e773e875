//! What keeps a web page in the operator's browser from driving the admin API: the `Host` a token-less request
//! was addressed to (DNS rebinding), its `Origin` and `Sec-Fetch-Site` (cross-site forms, `no-cors` fetches), and
//! the type of a state-changing body (JSON or JSON Lines only: types a page cannot send to another origin without
//! a CORS preflight, which the gateway never grants).

use http::{header, HeaderMap, Method, Uri};
use std::net::IpAddr;

/// Why a request was refused; the text (`Display`) is what the client and the log are told.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Without a token: addressed to a name that is neither loopback nor in `admin.allowed_hosts`.
    #[error(
        "the request was addressed to host {0:?}, which is not a loopback name (localhost, 127.0.0.1, [::1]) nor \
         in [admin] allowed_hosts; without a token the admin API answers only those (a guard against DNS rebinding)"
    )]
    Host(String),
    /// Sent by a page of another origin (`Origin`), or one that cannot be compared (`null`, no `Host`).
    #[error(
        "the request came from a page at origin {0:?}, not the gateway's own; the admin API is not open to other \
         web pages (open the inspector at /ui/ on the gateway itself, or call the API without a browser)"
    )]
    Origin(String),
    /// `Sec-Fetch-Site` says a page of another origin sent it.
    #[error(
        "the request was sent by a page of another origin (Sec-Fetch-Site: {0}); the admin API is not open to \
         other web pages"
    )]
    FetchSite(String),
    /// More than one `Host` header, or one that is not `name[:port]`.
    #[error("the request's Host header is missing a usable value ({0})")]
    BadHost(String),
    /// A state-changing request whose body is neither JSON nor JSON Lines.
    #[error(
        "{method} with a body of type {content_type:?} is not accepted: send application/json (or \
         application/x-ndjson for an import)"
    )]
    MediaType {
        /// The request's method.
        method: Method,
        /// Its `Content-Type` (empty when none was sent).
        content_type: String,
    },
}

/// Longest header value repeated in a refusal.
const ECHO_MAX: usize = 100;

/// A `Host` (or an origin's authority), parsed: the name lower-cased (an IPv6 address without its brackets) and
/// the port when one is given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    name: String,
    port: Option<u16>,
}

impl Authority {
    fn parse(s: &str) -> Option<Authority> {
        let (name, port) = match s.strip_prefix('[') {
            Some(rest) => {
                let (ip, tail) = rest.split_once(']')?;
                ip.parse::<std::net::Ipv6Addr>().ok()?;
                let port = match tail {
                    "" => None,
                    t => Some(t.strip_prefix(':')?),
                };
                (ip, port)
            }
            None => match s.split_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (s, None),
            },
        };
        let name_ok = !name.is_empty()
            && (s.starts_with('[')
                || name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_'));
        if !name_ok {
            return None;
        }
        let port = match port {
            Some(p) => Some(p.parse::<u16>().ok()?),
            None => None,
        };
        Some(Authority {
            name: name.to_ascii_lowercase(),
            port,
        })
    }

    /// `localhost`, or a loopback address (`127.0.0.0/8`, `::1`).
    fn is_loopback(&self) -> bool {
        self.name == "localhost" || self.name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// Whether an `admin.allowed_hosts` entry names this host: the same name, and the same port when the entry
    /// gives one (`default_port` stands for a missing port here).
    fn allowed_by(&self, entry: &Authority, default_port: Option<u16>) -> bool {
        self.name == entry.name
            && entry
                .port
                .is_none_or(|p| self.port.or(default_port) == Some(p))
    }
}

/// The host the request was addressed to: its `Host` header, else (HTTP/2) the URI's authority; `None` when
/// there is neither (an HTTP/1.0 client: never a browser).
fn request_host(headers: &HeaderMap, uri: &Uri) -> Result<Option<(String, Authority)>, Refusal> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let raw = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(Refusal::BadHost("more than one Host header".into())),
        (Some(v), None) => v
            .to_str()
            .map_err(|_| Refusal::BadHost("not text".into()))?
            .to_string(),
        (None, _) => match uri.authority() {
            Some(a) => a.as_str().to_string(),
            None => return Ok(None),
        },
    };
    match Authority::parse(&raw) {
        Some(a) => Ok(Some((raw, a))),
        None => Err(Refusal::BadHost(format!("{:?}", echo(&raw)))),
    }
}

/// Without a token: the request must be addressed to a loopback name or one of `allowed_hosts` (a page that
/// rebinds its own name to 127.0.0.1 still sends that name). A request with no host at all is not a browser's.
pub fn check_host(headers: &HeaderMap, uri: &Uri, allowed: &[String]) -> Result<(), Refusal> {
    let Some((raw, host)) = request_host(headers, uri)? else {
        return Ok(());
    };
    let allowed_entry = || {
        allowed
            .iter()
            .filter_map(|e| Authority::parse(e))
            .any(|e| host.allowed_by(&e, None))
    };
    if host.is_loopback() || allowed_entry() {
        Ok(())
    } else {
        Err(Refusal::Host(echo(&raw)))
    }
}

/// With or without a token: a request sent by a page of another origin is refused. `Sec-Fetch-Site` must be
/// absent, `same-origin` or `none` (typed by the user); `same-site` is refused too (another port of the same
/// host is another origin). `Origin`, when sent, must be the gateway's own: `http` or `https` (a TLS proxy in
/// front) with the host and port the request was addressed to, or a name of `allowed_hosts`.
pub fn check_origin(headers: &HeaderMap, uri: &Uri, allowed: &[String]) -> Result<(), Refusal> {
    for v in headers.get_all("sec-fetch-site") {
        let site = v.to_str().unwrap_or("").trim().to_ascii_lowercase();
        if site != "same-origin" && site != "none" {
            return Err(Refusal::FetchSite(echo(&site)));
        }
    }
    let origins: Vec<_> = headers.get_all(header::ORIGIN).iter().collect();
    if origins.is_empty() {
        return Ok(());
    }
    let host = request_host(headers, uri)?;
    for v in origins {
        let text = v.to_str().unwrap_or("");
        let own = parse_origin(text).is_some_and(|(default_port, origin)| {
            let same = host.as_ref().is_some_and(|(_, h)| {
                h.name == origin.name
                    && h.port.or(Some(default_port)) == origin.port.or(Some(default_port))
            });
            same || allowed
                .iter()
                .filter_map(|e| Authority::parse(e))
                .any(|e| origin.allowed_by(&e, Some(default_port)))
        });
        if !own {
            return Err(Refusal::Origin(echo(text)));
        }
    }
    Ok(())
}

/// `http://host[:port]` or `https://…` (an origin has no path), with the scheme's default port.
fn parse_origin(s: &str) -> Option<(u16, Authority)> {
    let (default_port, rest) = if let Some(r) = s.strip_prefix("http://") {
        (80, r)
    } else {
        (443, s.strip_prefix("https://")?)
    };
    Some((default_port, Authority::parse(rest)?))
}

/// A request that changes something (POST, PUT, PATCH, DELETE) and carries a body must say it is JSON or JSON
/// Lines. A page can send `text/plain`, form and multipart bodies to any origin without asking; these types it
/// cannot. Bodiless requests (reload, compress, delete) are covered by [`check_origin`].
pub fn check_body_type(
    method: &Method,
    headers: &HeaderMap,
    has_body: bool,
) -> Result<(), Refusal> {
    let changes = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if !changes || !has_body {
        return Ok(());
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?"))
        .unwrap_or("");
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence == "application/x-ndjson" {
        Ok(())
    } else {
        Err(Refusal::MediaType {
            method: method.clone(),
            content_type: echo(content_type),
        })
    }
}

/// At most [`ECHO_MAX`] characters of a header value, to repeat in a refusal or a log line.
fn echo(s: &str) -> String {
    s.chars().take(ECHO_MAX).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn uri() -> Uri {
        Uri::from_static("/admin/sessions")
    }

    #[test]
    fn only_loopback_names_and_allowed_hosts_pass_without_a_token() {
        let allowed = vec!["ctxgate.internal".to_string(), "gw.example:8443".into()];
        for ok in [
            "127.0.0.1:8787",
            "127.0.0.1",
            "127.0.0.2:1",
            "localhost:8787",
            "LOCALHOST",
            "[::1]:8787",
            "[::1]",
            "ctxgate.internal:8787",
            "CTXGATE.internal",
            "gw.example:8443",
        ] {
            assert_eq!(
                check_host(&headers(&[("host", ok)]), &uri(), &allowed),
                Ok(()),
                "{ok}"
            );
        }
        for bad in [
            "evil.example",
            "evil.example:8787",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "10.0.0.1:8787",
            "0.0.0.0:8787",
            "gw.example:8444",
            "gw.example",
            "[::2]:8787",
        ] {
            assert!(
                matches!(
                    check_host(&headers(&[("host", bad)]), &uri(), &allowed),
                    Err(Refusal::Host(_))
                ),
                "{bad}"
            );
        }
        for bad in ["", "a b", "[::1", "x:y", "localhost:99999"] {
            assert!(
                matches!(
                    check_host(&headers(&[("host", bad)]), &uri(), &[]),
                    Err(Refusal::BadHost(_))
                ),
                "{bad:?}"
            );
        }
        let two = headers(&[("host", "127.0.0.1"), ("host", "evil.example")]);
        assert!(matches!(
            check_host(&two, &uri(), &[]),
            Err(Refusal::BadHost(_))
        ));
        // HTTP/2: the authority of the URI; HTTP/1.0 without a Host: not a browser.
        let h2 = Uri::from_static("http://evil.example/admin/sessions");
        assert!(matches!(
            check_host(&HeaderMap::new(), &h2, &[]),
            Err(Refusal::Host(_))
        ));
        assert_eq!(check_host(&HeaderMap::new(), &uri(), &[]), Ok(()));
    }

    #[test]
    fn only_the_gateways_own_origin_passes() {
        let allowed = vec!["ctxgate.internal".to_string()];
        let check = |host: &str, origin: &str| {
            check_origin(
                &headers(&[("host", host), ("origin", origin)]),
                &uri(),
                &allowed,
            )
        };
        for (host, origin) in [
            ("127.0.0.1:8787", "http://127.0.0.1:8787"),
            ("localhost:8787", "http://LOCALHOST:8787"),
            ("[::1]:8787", "http://[::1]:8787"),
            ("localhost", "http://localhost"),
            ("localhost:80", "http://localhost"),
            ("gw.example", "https://gw.example"),
            // a proxy that rewrites Host, for a name the operator allowed
            ("127.0.0.1:8787", "https://ctxgate.internal"),
        ] {
            assert_eq!(check(host, origin), Ok(()), "{host} {origin}");
        }
        for (host, origin) in [
            ("127.0.0.1:8787", "http://evil.example"),
            ("127.0.0.1:8787", "http://127.0.0.1:8788"),
            ("127.0.0.1:8787", "http://localhost:8787"),
            ("127.0.0.1:8787", "null"),
            ("127.0.0.1:8787", "file://"),
            ("127.0.0.1:8787", "http://127.0.0.1:8787/ui/"),
            ("localhost", "https://localhost:8443"),
        ] {
            assert!(
                matches!(check(host, origin), Err(Refusal::Origin(_))),
                "{host} {origin}"
            );
        }
        // an Origin that cannot be compared with anything
        let no_host = headers(&[("origin", "http://127.0.0.1:8787")]);
        assert!(matches!(
            check_origin(&no_host, &uri(), &[]),
            Err(Refusal::Origin(_))
        ));
        assert_eq!(
            check_origin(&headers(&[("host", "x")]), &uri(), &[]),
            Ok(())
        );
    }

    #[test]
    fn a_page_of_another_site_or_origin_is_refused_by_its_fetch_metadata() {
        for ok in ["same-origin", "none", "Same-Origin"] {
            let h = headers(&[("host", "127.0.0.1:1"), ("sec-fetch-site", ok)]);
            assert_eq!(check_origin(&h, &uri(), &[]), Ok(()), "{ok}");
        }
        for bad in ["cross-site", "same-site", "weird"] {
            let h = headers(&[("host", "127.0.0.1:1"), ("sec-fetch-site", bad)]);
            assert!(
                matches!(check_origin(&h, &uri(), &[]), Err(Refusal::FetchSite(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn state_changing_bodies_must_be_json() {
        let ct = |v: &str| headers(&[("content-type", v)]);
        for ok in [
            "application/json",
            "application/x-ndjson",
            "Application/JSON; charset=utf-8",
        ] {
            assert_eq!(
                check_body_type(&Method::POST, &ct(ok), true),
                Ok(()),
                "{ok}"
            );
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
        ] {
            for m in [Method::POST, Method::PATCH, Method::PUT, Method::DELETE] {
                assert!(
                    matches!(
                        check_body_type(&m, &ct(bad), true),
                        Err(Refusal::MediaType { .. })
                    ),
                    "{m} {bad}"
                );
            }
        }
        assert!(check_body_type(&Method::POST, &HeaderMap::new(), true).is_err());
        // no body: nothing to check; reads are never checked
        assert_eq!(
            check_body_type(&Method::POST, &ct("text/plain"), false),
            Ok(())
        );
        assert_eq!(
            check_body_type(&Method::DELETE, &HeaderMap::new(), false),
            Ok(())
        );
        assert_eq!(
            check_body_type(&Method::GET, &ct("text/plain"), true),
            Ok(())
        );
    }
}
