//! Conversations: who a request belongs to, its history as a message tree, and the run-loop view.

pub mod identity;

pub use identity::{identify, SessionIdentity};
