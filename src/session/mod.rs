//! Conversations: who a request belongs to, its history as a message tree, and the cache over the store.

pub mod breaker;
mod entry;
pub mod export;
mod heap;
#[cfg(test)]
pub(crate) use heap::counting;
pub mod identity;
pub mod manager;
pub mod migrate;
mod registry;
pub mod tenant;
pub mod tree;
pub mod turns;

pub use entry::{SentPrint, SentRewrite};
pub use identity::{identify, IdSource, Naming, SessionIdentity};
pub use manager::{RequestMark, SessionView, Sessions};
pub use tenant::TenantKey;
