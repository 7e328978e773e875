//! `[hooks]`: the idle webhook's settings, with the duration syntax they use (`"90s"`, `"30m"`, `"2h"`).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[hooks]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HooksConfig {
    /// URL (http or https) that receives a session's export (JSON Lines, as `GET /admin/sessions/{id}/export`)
    /// when it goes idle, once per idle period. Unset (the default): no webhook.
    pub session_idle_url: Option<String>,
    /// How long without a request or reply makes a session idle: a number and a unit, `ms`, `s`, `m`, `h` or `d`
    /// (`"90s"`, `"30m"`).
    pub session_idle_after: String,
    /// Key of the HMAC-SHA256 signature of each delivery's body, sent as
    /// `x-ctxgate-signature: sha256=<hex>`. Required with `session_idle_url`.
    pub secret: Option<String>,
    /// Seconds a delivery may take before it counts as failed (and is retried).
    pub timeout_secs: u64,
    /// Longest wait between two attempts of a failing delivery (they start at one second and double).
    pub max_backoff: String,
}

impl Default for HooksConfig {
    fn default() -> Self {
        Self {
            session_idle_url: None,
            session_idle_after: "30m".into(),
            secret: None,
            timeout_secs: 10,
            max_backoff: "5m".into(),
        }
    }
}

/// A duration such as `"90s"`, `"30m"`, `"2h"`, `"1d"` or `"500ms"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like \"90s\", \"30m\" or \"2h\""))?;
    let ms = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?}: the unit must be ms, s, m, h or d")),
    };
    Ok(Duration::from_millis(n.saturating_mul(ms)))
}

impl HooksConfig {
    /// The problems of these settings, as `hooks.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        match parse_duration(&self.session_idle_after) {
            Ok(d) if d.is_zero() => e.push("hooks.session_idle_after: must be more than 0".into()),
            Ok(_) => {}
            Err(m) => e.push(format!("hooks.session_idle_after: {m}")),
        }
        match parse_duration(&self.max_backoff) {
            Ok(d) if d < Duration::from_secs(1) => {
                e.push("hooks.max_backoff: must be at least 1s".into())
            }
            Ok(_) => {}
            Err(m) => e.push(format!("hooks.max_backoff: {m}")),
        }
        if self.timeout_secs == 0 {
            e.push("hooks.timeout_secs: must be greater than 0".into());
        }
        let Some(url) = &self.session_idle_url else {
            return;
        };
        if !(url.starts_with("http://") || url.starts_with("https://"))
            || reqwest::Url::parse(url).is_err()
        {
            e.push(format!(
                "hooks.session_idle_url: {url:?} is not an http(s) URL"
            ));
        }
        if self.secret.as_deref().is_none_or(str::is_empty) {
            e.push("hooks.secret: required with hooks.session_idle_url (deliveries are signed with it)".into());
        }
    }

    /// How long without activity makes a session idle (valid settings: see [`HooksConfig::problems`]).
    pub fn idle_after(&self) -> Duration {
        parse_duration(&self.session_idle_after).unwrap_or(Duration::from_secs(1800))
    }

    /// The longest wait between attempts.
    pub fn max_backoff(&self) -> Duration {
        parse_duration(&self.max_backoff).unwrap_or(Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations_and_their_problems() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5 weeks").is_err());
        let mut e = Vec::new();
        HooksConfig {
            session_idle_url: Some("ftp://x".into()),
            session_idle_after: "soon".into(),
            ..HooksConfig::default()
        }
        .problems(&mut e);
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].starts_with("hooks.session_idle_after"));
        assert!(e[1].starts_with("hooks.session_idle_url"));
        assert!(e[2].starts_with("hooks.secret"));
    }
}
