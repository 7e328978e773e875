//! The shared state of a running gateway: config, the upstream client, and the channels other parts listen on.

use crate::config::Config;
use crate::error::GatewayError;
use crate::relay::RelayOutcome;
use crate::upstream::Upstream;
use std::sync::Arc;
use tokio::sync::broadcast;

/// A finished chat turn, as seen by the tap (for recording, metrics and tests).
#[derive(Debug, Clone)]
pub struct TurnEvent {
    /// The session the turn belongs to.
    pub session_id: String,
    /// HTTP status the upstream answered with.
    pub status: u16,
    /// How the reply ended.
    pub outcome: RelayOutcome,
}

/// Everything a request handler needs.
pub struct AppState {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The upstream client.
    pub upstream: Upstream,
    /// Every finished chat turn is announced here.
    pub turns: broadcast::Sender<TurnEvent>,
}

impl AppState {
    /// Builds the state from a validated config.
    pub fn new(config: Config) -> Result<Arc<Self>, GatewayError> {
        let upstream = Upstream::new(&config.upstream)?;
        let (turns, _) = broadcast::channel(1024);
        Ok(Arc::new(Self {
            config: Arc::new(config),
            upstream,
            turns,
        }))
    }
}
