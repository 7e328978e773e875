//! The rows the store keeps for a session's messages: one [`NodeRow`] per message node, in the store's own types
//! (the session's message tree converts to and from them), so the store depends on nothing above it.

use serde_json::Value;
use std::sync::Arc;

/// Who produced a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// Sent by the client in a request.
    Client,
    /// The upstream's answer, recorded by ctxgate.
    Reply,
}

impl NodeKind {
    /// Name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Client => "client",
            NodeKind::Reply => "reply",
        }
    }

    /// Parses a stored name (anything but `reply` is a client message).
    pub fn parse(s: &str) -> NodeKind {
        if s == "reply" {
            NodeKind::Reply
        } else {
            NodeKind::Client
        }
    }
}

/// One stored message node. Nodes are immutable: a node with an id already stored is never written again.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    /// The node's id (unique within its session).
    pub id: Arc<str>,
    /// The parent node's id (`None` for a first message).
    pub parent: Option<Arc<str>>,
    /// Depth in the tree: 0 for a first message.
    pub position: u32,
    /// Who produced it.
    pub kind: NodeKind,
    /// A reply cut short.
    pub partial: bool,
    /// Unix seconds when first seen.
    pub created_at: i64,
    /// The message, stored as JSON text (shared with the cache, not copied).
    pub message: Arc<Value>,
}
