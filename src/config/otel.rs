//! `[otel]`: where traces go (OTLP/HTTP protobuf), under which service name, how many are kept, and the standard
//! `OTEL_*` environment variables layered over them (what `otel` builds its exporter from).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[otel]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OtelConfig {
    /// OTLP/HTTP (protobuf) endpoint of a collector, e.g. `http://127.0.0.1:4318`; spans are posted to
    /// `<endpoint>/v1/traces`. `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as it is) and
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` appended) override it. Unset (the default), and neither
    /// variable set: tracing is off and costs nothing.
    pub endpoint: Option<String>,
    /// `service.name` of the spans (`OTEL_SERVICE_NAME` overrides it).
    pub service_name: String,
    /// Fraction of new traces recorded, in [0, 1] (`OTEL_TRACES_SAMPLER_ARG` overrides it); a request that
    /// continues a client's trace follows the client's sampling decision.
    pub sample_ratio: f64,
    /// Headers sent with every export (e.g. a collector's API key); their values are masked when the config is
    /// printed or logged.
    pub headers: BTreeMap<String, String>,
    /// Add message content to the spans (the request's messages and the reply as `gen_ai.input.messages` and
    /// `gen_ai.output.messages`). Off by default: spans then carry no message content.
    pub capture_content: bool,
}

impl Default for OtelConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            service_name: "ctxgate".into(),
            sample_ratio: 1.0,
            headers: BTreeMap::new(),
            capture_content: false,
        }
    }
}

/// The environment variables every OpenTelemetry SDK reads, and that override `[otel]`.
pub mod env {
    /// Base URL of the collector; `/v1/traces` is appended.
    pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    /// The full URL traces are posted to, used as it is.
    pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
    /// `service.name`.
    pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
    /// The sampling ratio.
    pub const SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
    /// `true` turns the SDK off whatever else is set.
    pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
}

/// The path the OTLP specification appends to a base endpoint for traces.
pub const TRACES_PATH: &str = "/v1/traces";

/// What the exporter is built from: `[otel]` with the environment applied.
#[derive(Debug, Clone, PartialEq)]
pub struct OtelSettings {
    /// The URL spans are posted to.
    pub traces_url: String,
    /// `service.name`.
    pub service_name: String,
    /// Fraction of new traces recorded.
    pub sample_ratio: f64,
    /// Headers sent with every export.
    pub headers: BTreeMap<String, String>,
    /// Message content goes into spans.
    pub capture_content: bool,
}

impl OtelConfig {
    /// The problems of these settings, as `otel.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if let Some(u) = &self.endpoint {
            if !is_http_url(u) {
                e.push(format!("otel.endpoint: {u:?} is not an http(s) URL"));
            }
        }
        if self.service_name.trim().is_empty() {
            e.push("otel.service_name: must not be empty".into());
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            e.push(format!(
                "otel.sample_ratio: {} must be a fraction in [0, 1]",
                self.sample_ratio
            ));
        }
        for (name, value) in &self.headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                e.push(format!("otel.headers: {name:?} is not a valid header name"));
            } else if http::HeaderValue::from_str(value).is_err() {
                e.push(format!(
                    "otel.headers.{name}: the value is not a printable header value"
                ));
            }
        }
    }

    /// A copy with every header value replaced by `***`.
    pub fn masked(&self) -> OtelConfig {
        let mut c = self.clone();
        for v in c.headers.values_mut() {
            *v = "***".into();
        }
        c
    }

    /// The settings with the standard variables (read through `var`) applied, as every OpenTelemetry SDK applies
    /// them: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as it is) over `OTEL_EXPORTER_OTLP_ENDPOINT` (with
    /// `/v1/traces` appended) over `endpoint` (likewise); `OTEL_SERVICE_NAME` over `service_name`;
    /// `OTEL_TRACES_SAMPLER_ARG` over `sample_ratio`. `None`: tracing is off (no endpoint anywhere, or
    /// `OTEL_SDK_DISABLED=true`). Unusable values of the variables are skipped, each with a warning in `warnings`.
    pub fn resolve(
        &self,
        var: impl Fn(&str) -> Option<String>,
        warnings: &mut Vec<String>,
    ) -> Option<OtelSettings> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if set(env::SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let mut url = None;
        if let Some(u) = set(env::TRACES_ENDPOINT) {
            match is_http_url(&u) {
                true => url = Some(u),
                false => warnings.push(format!(
                    "{}: {u:?} is not an http(s) URL; ignored",
                    env::TRACES_ENDPOINT
                )),
            }
        }
        if url.is_none() {
            if let Some(u) = set(env::ENDPOINT) {
                match is_http_url(&u) {
                    true => url = Some(traces_url(&u)),
                    false => warnings.push(format!(
                        "{}: {u:?} is not an http(s) URL; ignored",
                        env::ENDPOINT
                    )),
                }
            }
        }
        let traces_url = url.or_else(|| self.endpoint.as_deref().map(traces_url))?;
        let service_name = set(env::SERVICE_NAME).unwrap_or_else(|| self.service_name.clone());
        let sample_ratio = match set(env::SAMPLER_ARG) {
            None => self.sample_ratio,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => r,
                _ => {
                    warnings.push(format!(
                        "{}: {v:?} is not a ratio in [0, 1]; otel.sample_ratio ({}) is used",
                        env::SAMPLER_ARG,
                        self.sample_ratio
                    ));
                    self.sample_ratio
                }
            },
        };
        Some(OtelSettings {
            traces_url,
            service_name,
            sample_ratio,
            headers: self.headers.clone(),
            capture_content: self.capture_content,
        })
    }
}

/// `base` with the OTLP traces path appended (one `/` between them).
pub fn traces_url(base: &str) -> String {
    format!("{}{TRACES_PATH}", base.trim_end_matches('/'))
}

/// An absolute `http` or `https` URL with a host.
fn is_http_url(u: &str) -> bool {
    u.parse::<http::Uri>().is_ok_and(|uri| {
        matches!(uri.scheme_str(), Some("http" | "https"))
            && uri.host().is_some_and(|h| !h.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(c: &OtelConfig, vars: &[(&str, &str)]) -> (Option<OtelSettings>, Vec<String>) {
        let mut w = Vec::new();
        let s = c.resolve(
            |n| {
                vars.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            },
            &mut w,
        );
        (s, w)
    }

    #[test]
    fn off_unless_an_endpoint_is_configured() {
        let (s, w) = resolve(&OtelConfig::default(), &[("OTEL_SERVICE_NAME", "x")]);
        assert!(s.is_none() && w.is_empty());
        let c = OtelConfig {
            endpoint: Some("http://collector:4318".into()),
            ..OtelConfig::default()
        };
        let (s, _) = resolve(&c, &[("OTEL_SDK_DISABLED", "TRUE")]);
        assert!(s.is_none());
        let s = resolve(&c, &[]).0.unwrap();
        assert_eq!(s.traces_url, "http://collector:4318/v1/traces");
        assert_eq!((s.service_name.as_str(), s.sample_ratio), ("ctxgate", 1.0));
        assert!(!s.capture_content);
    }

    #[test]
    fn the_standard_variables_apply_as_in_every_sdk() {
        let c = OtelConfig {
            endpoint: Some("http://file:4318/".into()),
            sample_ratio: 0.5,
            ..OtelConfig::default()
        };
        // The generic endpoint gets the traces path; the signal's own is used as it is.
        let s = resolve(
            &c,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://env:4318/base/")],
        )
        .0
        .unwrap();
        assert_eq!(s.traces_url, "https://env:4318/base/v1/traces");
        let s = resolve(
            &OtelConfig::default(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://own:9999/custom",
                ),
                ("OTEL_SERVICE_NAME", "gw-eu"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ],
        )
        .0
        .unwrap();
        assert_eq!(s.traces_url, "http://own:9999/custom");
        assert_eq!((s.service_name.as_str(), s.sample_ratio), ("gw-eu", 0.25));
        // The file's endpoint, with its trailing slash, gets exactly one.
        assert_eq!(
            resolve(&c, &[]).0.unwrap().traces_url,
            "http://file:4318/v1/traces"
        );
    }

    #[test]
    fn unusable_variables_are_skipped_with_a_warning() {
        let c = OtelConfig {
            endpoint: Some("http://file:4318".into()),
            sample_ratio: 0.5,
            ..OtelConfig::default()
        };
        let (s, w) = resolve(
            &c,
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
        );
        let s = s.unwrap();
        assert_eq!(s.traces_url, "http://file:4318/v1/traces");
        assert_eq!(s.sample_ratio, 0.5);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), "{w:?}");
    }

    #[test]
    fn problems_name_their_key_and_header_values_are_masked() {
        let mut c = OtelConfig {
            endpoint: Some("grpc://x:4317".into()),
            service_name: " ".into(),
            sample_ratio: 1.5,
            ..OtelConfig::default()
        };
        c.headers.insert("bad name".into(), "v".into());
        c.headers.insert("x-api-key".into(), "line\nbreak".into());
        let mut e = Vec::new();
        c.problems(&mut e);
        let all = e.join("\n");
        for key in [
            "otel.endpoint",
            "otel.service_name",
            "otel.sample_ratio",
            "otel.headers: \"bad name\"",
            "otel.headers.x-api-key",
        ] {
            assert!(all.contains(key), "{key}: {all}");
        }
        let mut ok = OtelConfig::default();
        ok.headers.insert("x-api-key".into(), "secret-123".into());
        let mut e = Vec::new();
        ok.problems(&mut e);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(ok.masked().headers["x-api-key"], "***");
    }
}
