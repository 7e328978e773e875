//! `[metrics]`: an optional separate listener for `GET /metrics`.

use super::server::parse_listen;
use serde::{Deserialize, Serialize};

/// `[metrics]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address of a separate listener serving only `GET /metrics`; unset means the main listener only (which
    /// always serves `/metrics`).
    pub listen: Option<String>,
}

impl MetricsConfig {
    /// The problems of these settings, as `metrics.<key>: …` lines.
    pub fn problems(&self, e: &mut Vec<String>) {
        if let Some(l) = &self.listen {
            if parse_listen(l).is_none() {
                e.push(format!(
                    "metrics.listen: {l:?} is not an address like 127.0.0.1:9187 or localhost:9187"
                ));
            }
        }
    }
}
