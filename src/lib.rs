//! ctxgate: a transparent OpenAI-compatible gateway that keeps every conversation's full history and rewrites what
//! goes upstream when the context grows too large. See ARCHITECTURE.md for the map.

pub mod alloc;
#[cfg(test)]
mod alone;
pub mod app;
pub mod config;
pub mod context;
pub mod dialect;
pub mod error;
pub mod hooks;
pub mod logging;
pub mod message;
pub mod metrics;
pub mod mock;
pub mod otel;
pub mod pipeline;
pub mod recall;
pub mod relay;
pub mod reload;
pub mod replay;
pub mod server;
pub mod session;
pub mod sse;
pub mod store;
pub mod summary;
pub mod upstream;
