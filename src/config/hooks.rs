//! `[hooks]`: the idle webhook's settings (where a session's export goes when it goes idle, how it is signed,
//! how long idle is, how deliveries are retried).

use super::checks::is_http_url;
use super::duration::DurationSpec;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[hooks]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HooksConfig {
    /// URL (http or https) that receives a session's export (JSON Lines, as `GET /admin/sessions/{id}/export`)
    /// when it goes idle, once per idle period. Unset (the default): no webhook.
    pub session_idle_url: Option<String>,
    /// How long without a request or reply makes a session idle: a duration, a whole number and a unit (`"90s"`,
    /// `"30m"`, `"2h"`).
    pub session_idle_after: DurationSpec,
    /// Key of the HMAC-SHA256 signature of each delivery's body, sent as
    /// `x-ctxgate-signature: sha256=<hex>`. Required with `session_idle_url`.
    pub secret: Option<String>,
    /// Seconds a delivery may take before it counts as failed (and is retried).
    pub timeout_secs: u64,
    /// Most deliveries in flight at once: the sessions due in one sweep are posted concurrently up to this many,
    /// so a receiver that hangs costs about one `timeout_secs` per this many due sessions, not one each.
    pub concurrent_deliveries: usize,
    /// Longest wait between two attempts of a failing delivery (they start at one second and double): a
    /// duration, at least `"1s"`.
    pub max_backoff: DurationSpec,
}

impl Default for HooksConfig {
    fn default() -> Self {
        Self {
            session_idle_url: None,
            session_idle_after: DurationSpec::from_secs(30 * 60),
            secret: None,
            timeout_secs: 10,
            concurrent_deliveries: 8,
            max_backoff: DurationSpec::from_secs(5 * 60),
        }
    }
}

impl HooksConfig {
    /// The problems of these settings, as `hooks.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if self.session_idle_after.duration().is_zero() {
            e.push("hooks.session_idle_after: must be more than 0".into());
        }
        if self.max_backoff.duration() < Duration::from_secs(1) {
            e.push("hooks.max_backoff: must be at least 1s".into());
        }
        if self.timeout_secs == 0 {
            e.push("hooks.timeout_secs: must be greater than 0".into());
        }
        if self.concurrent_deliveries == 0 {
            e.push("hooks.concurrent_deliveries: must be greater than 0".into());
        }
        let Some(url) = &self.session_idle_url else {
            return;
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) || !is_http_url(url) {
            e.push(format!(
                "hooks.session_idle_url: {url:?} is not an http(s) URL"
            ));
        }
        if self.secret.as_deref().is_none_or(str::is_empty) {
            e.push("hooks.secret: required with hooks.session_idle_url (deliveries are signed with it)".into());
        }
    }

    /// How long without activity makes a session idle.
    pub fn idle_after(&self) -> Duration {
        self.session_idle_after.duration()
    }

    /// The longest wait between attempts.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff.duration()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_keys() {
        let mut e = Vec::new();
        HooksConfig {
            session_idle_url: Some("ftp://x".into()),
            session_idle_after: DurationSpec::from_secs(0),
            max_backoff: DurationSpec::from_millis(500),
            ..HooksConfig::default()
        }
        .problems(&mut e);
        assert_eq!(
            e,
            [
                "hooks.session_idle_after: must be more than 0",
                "hooks.max_backoff: must be at least 1s",
                "hooks.session_idle_url: \"ftp://x\" is not an http(s) URL",
                "hooks.secret: required with hooks.session_idle_url (deliveries are signed with it)",
            ]
        );
        let mut e = Vec::new();
        HooksConfig::default().problems(&mut e);
        assert!(e.is_empty(), "{e:?}");
    }
}
