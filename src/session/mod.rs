//! Conversations: who a request belongs to, its history as a message tree, and the cache over the store.

pub mod anthropic_id;
pub mod breaker;
mod entry;
pub mod export;
pub mod identity;
pub mod manager;
pub mod migrate;
mod opening_memo;
mod registry;
pub mod responses_id;
pub mod tenant;
pub mod tree;
pub mod turns;

pub use identity::{identify, SessionIdentity};
pub use manager::{RequestMark, SessionView, Sessions};
pub use tenant::TenantKey;
