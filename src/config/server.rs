//! `[server]`: the listening socket, request limits, shutdown timing and the log format; the listen-address syntax.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// `[server]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address and port to listen on: an IP address and port (`127.0.0.1:8787`, `[::1]:8787`, `0.0.0.0:8787`) or
    /// `localhost:PORT`.
    pub listen: String,
    /// Largest request body accepted, in bytes; larger bodies get 413.
    pub max_body_bytes: u64,
    /// Seconds that in-flight requests and streams may take to finish after SIGTERM/SIGINT.
    pub shutdown_grace_secs: u64,
    /// Log format: `text` (human) or `json`.
    pub log_format: LogFormat,
    /// Seconds, after the grace period, that shutdown waits for background work (turn records, summaries,
    /// compression records) and queued store writes to finish before the process exits.
    pub drain_secs: u64,
    /// Seconds a client may take to send a request's headers; slower connections are closed.
    pub header_read_timeout_secs: u64,
    /// Seconds a client may take to send a whole request body; slower requests get 408.
    pub body_read_timeout_secs: u64,
    /// Most client connections open at once; further connections wait in the listen queue. 0: no limit.
    pub max_connections: usize,
    /// Most requests in flight at once (streams count until they end); beyond it requests get 503 with
    /// `retry-after` at once. A request with a body takes its slot once the body has arrived: a slow or idle
    /// body holds none. 0: no limit.
    pub max_in_flight: usize,
    /// Most conversation elements a conversation request may hold: the items of its `messages` (`input`) array
    /// and the content blocks inside them, counted from the bytes before the body is parsed. A request with more
    /// gets 413 `request_too_large` naming this key, in its API's error shape. Bounds what one request costs to
    /// parse and to store (its new messages are one store write). 0: no limit.
    pub max_messages: u64,
    /// Bytes of memory that conversation requests in flight may hold together: each reserves, before it is parsed,
    /// its body as it arrives and then an estimate of what managing it costs (its bytes, its elements and JSON
    /// values, measured: docs/operations.md, "Memory"), until its answer has been sent. Beyond it a request gets
    /// 503 with `retry-after`; one that could never fit gets 413. 0: no limit.
    pub request_memory_bytes: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8787".into(),
            max_body_bytes: 32 * 1024 * 1024,
            shutdown_grace_secs: 30,
            log_format: LogFormat::Text,
            drain_secs: 10,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 60,
            max_connections: 4096,
            max_in_flight: 1024,
            max_messages: 20_000,
            request_memory_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// Log output format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl ServerConfig {
    /// The problems of these settings, as `server.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if parse_listen(&self.listen).is_none() {
            e.push(format!(
                "server.listen: {:?} is not an address like 127.0.0.1:8787, [::1]:8787 or localhost:8787",
                self.listen
            ));
        }
        if self.max_body_bytes == 0 {
            e.push("server.max_body_bytes: must be greater than 0".into());
        }
        if self.request_memory_bytes > 0 && self.request_memory_bytes < self.max_body_bytes {
            e.push(format!(
                "server.request_memory_bytes: {} is less than server.max_body_bytes ({}): no body of the largest size could be managed; raise it (or 0: no limit)",
                self.request_memory_bytes, self.max_body_bytes
            ));
        }
        for (key, v) in [
            ("drain_secs", self.drain_secs),
            ("header_read_timeout_secs", self.header_read_timeout_secs),
            ("body_read_timeout_secs", self.body_read_timeout_secs),
        ] {
            if v == 0 {
                e.push(format!("server.{key}: must be greater than 0"));
            }
        }
    }
}

/// A listen address: an IP address and port (`127.0.0.1:8787`, `[::1]:8787`, `0.0.0.0:8787`), or `localhost:PORT`
/// (the IPv4 loopback, 127.0.0.1). No other names: a listener's address is never left to a DNS lookup.
pub fn parse_listen(s: &str) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    host.eq_ignore_ascii_case("localhost")
        .then(|| SocketAddr::from(([127, 0, 0, 1], port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_addresses_and_localhost() {
        assert_eq!(
            parse_listen("127.0.0.1:8787"),
            Some(SocketAddr::from(([127, 0, 0, 1], 8787)))
        );
        assert_eq!(
            parse_listen("localhost:8787"),
            Some(SocketAddr::from(([127, 0, 0, 1], 8787)))
        );
        assert_eq!(
            parse_listen("LOCALHOST:0"),
            Some(SocketAddr::from(([127, 0, 0, 1], 0)))
        );
        assert!(parse_listen("[::1]:8787").is_some_and(|a| a.ip().is_loopback()));
        for bad in [
            "localhost",
            "example.com:80",
            "localhost:99999",
            ":8787",
            "127.0.0.1",
        ] {
            assert_eq!(parse_listen(bad), None, "{bad}");
        }
    }
}
