//! `[admin]`: the admin API's token, loopback access without one, the host names it is served under, and the
//! largest import it takes.

use serde::{Deserialize, Serialize};

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token required by `/admin/*`. When unset, the admin API is off unless
    /// `allow_loopback_without_token` lets loopback peers in.
    pub token: Option<String>,
    /// Without a token, serve `/admin/*` to loopback peers. Unset: true only when `server.listen` is a loopback
    /// address (a same-host reverse proxy or sidecar would otherwise make the admin API public).
    pub allow_loopback_without_token: Option<bool>,
    /// Host names (`["ctxgate.internal", "gw.example:8443"]`: as in the `Host` header, port optional) under which
    /// `/admin/*` (what the inspector shows) is served without a token, beyond the loopback names `localhost`,
    /// `127.0.0.1` and `[::1]`; a page on one of these names may also call the admin API. For operators who front
    /// the gateway with a name; without a token any other `Host` is refused (a DNS-rebinding guard).
    pub allowed_hosts: Vec<String>,
    /// Largest body `POST /admin/sessions/import` accepts, in bytes (its own limit: an export is often larger than
    /// any one chat request, so `server.max_body_bytes` does not apply to it); larger bodies get 413. An import
    /// holds the file and its parsed form in memory while it is checked, so keep it within what the gateway's
    /// memory allows. Read at start-up.
    pub max_import_bytes: u64,
}

/// `admin.max_import_bytes` unless set: 1 GiB, room for the export of a session of millions of messages.
pub const DEFAULT_MAX_IMPORT_BYTES: u64 = 1024 * 1024 * 1024;

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            token: None,
            allow_loopback_without_token: None,
            allowed_hosts: Vec::new(),
            max_import_bytes: DEFAULT_MAX_IMPORT_BYTES,
        }
    }
}

impl AdminConfig {
    /// The problems of these settings, as `admin.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if let Some(t) = &self.token {
            if t.len() < 8 {
                e.push("admin.token: must be at least 8 characters".into());
            }
        }
        if self.max_import_bytes == 0 {
            e.push("admin.max_import_bytes: must be greater than 0".into());
        }
        for h in &self.allowed_hosts {
            if let Err(why) = check_host_name(h) {
                e.push(format!("admin.allowed_hosts: {h:?} {why}"));
            }
        }
    }
}

/// Whether `h` is a host as a `Host` header carries it: a name or an IP address (IPv6 in brackets), with an
/// optional port; no scheme, path or wildcard.
fn check_host_name(h: &str) -> Result<(), &'static str> {
    let (name, port) = match h.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, "")) if ip.parse::<std::net::Ipv6Addr>().is_ok() => (ip, None),
            Some((ip, tail))
                if ip.parse::<std::net::Ipv6Addr>().is_ok() && tail.starts_with(':') =>
            {
                (ip, tail.get(1..))
            }
            _ => return Err("is not a bracketed IPv6 address like [::1]"),
        },
        None => match h.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (h, None),
        },
    };
    if name.is_empty() {
        return Err("is empty: expected a host name like ctxgate.internal");
    }
    if !h.starts_with('[')
        && !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    {
        return Err("is not a host name: expected letters, digits, '-' and '.' (no scheme, path or wildcard)");
    }
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err("has a port that is not a number from 0 to 65535");
    }
    Ok(())
}
