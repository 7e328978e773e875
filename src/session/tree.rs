//! A session's history as a tree of messages (the way chat UIs keep regenerate/edit): a node is identified by the
//! hash of its parent's id and its canonical content, so identical resends create nothing, regenerated answers
//! become siblings and edits start a branch. Nothing is ever overwritten or removed.

use super::heap;
use crate::message::{write_canonical, write_canonical_object};
pub use crate::store::NodeKind;
use crate::store::NodeRow;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// A node id: 32 hex characters of SHA-256(parent id, canonical message).
pub type NodeId = Arc<str>;

/// One message of the history.
#[derive(Debug, Clone)]
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// The parent's id (`None` for a first message).
    pub parent: Option<NodeId>,
    /// Depth in the tree: 0 for a first message.
    pub position: u32,
    /// The message as received (client) or assembled (reply).
    pub message: Arc<Value>,
    /// Who produced it.
    pub kind: NodeKind,
    /// A reply cut short (the client disconnected or the upstream failed mid-stream).
    pub partial: bool,
    /// Unix seconds when first seen.
    pub created_at: i64,
}

impl Node {
    /// Approximate bytes of the node's message as text, doubled, plus a constant (what the session's
    /// `token_estimate` and `history_bytes` are computed from).
    pub fn weight(&self) -> usize {
        approx_size(&self.message) * 2 + 256
    }

    /// Heap bytes the node holds on its own (for cache weighing): its id, the shared message and everything the
    /// parsed message owns. The tree's tables are counted by [`Tree::weight`].
    pub fn heap_bytes(&self) -> usize {
        heap::arc_str(self.id.len()) + heap::arc::<Value>() + heap::value(&self.message)
    }
}

impl From<&Node> for NodeRow {
    fn from(n: &Node) -> Self {
        NodeRow {
            id: n.id.clone(),
            parent: n.parent.clone(),
            position: n.position,
            kind: n.kind,
            partial: n.partial,
            created_at: n.created_at,
            message: n.message.clone(),
        }
    }
}

impl From<NodeRow> for Node {
    fn from(r: NodeRow) -> Self {
        Node {
            id: r.id,
            parent: r.parent,
            position: r.position,
            message: r.message,
            kind: r.kind,
            partial: r.partial,
            created_at: r.created_at,
        }
    }
}

/// The id a message gets under `parent`: SHA-256 of the parent's id, a zero byte and the canonical JSON of the
/// message's [`normalize`]d form (written from the message itself, without building that form).
pub fn node_id(parent: Option<&str>, message: &Value) -> NodeId {
    let mut h = Sha256::new();
    h.update(parent.unwrap_or("").as_bytes());
    h.update([0]);
    let mut text = Vec::with_capacity(256);
    write_normalized(message, &mut text);
    h.update(&text);
    Arc::from(&hex::encode(h.finalize())[..32])
}

/// Appends the canonical JSON of `normalize(m)` to `out`, borrowing every part of `m` (a message's content is
/// often its largest part: it is not copied). Its keys in sorted order: `content`, `function_call`, `name`,
/// `refusal`, `role`, `tool_call_id`, `tool_calls`; a call's `arguments`, `id`, `name`.
fn write_normalized(m: &Value, out: &mut Vec<u8>) {
    if m.get("role").is_none() {
        if let Value::Object(o) = m {
            write_canonical_object(o.iter().filter(|(k, _)| k.as_str() != "status"), out);
            return;
        }
    }
    let get = |k: &str| m.get(k).filter(|v| !v.is_null());
    let content = get("content").filter(|c| !matches!(c, Value::String(s) if s.is_empty()));
    let refusal = get("refusal").filter(|r| r.is_string());
    let calls = match get("tool_calls") {
        Some(Value::Array(calls)) if !calls.is_empty() => Some(calls),
        _ => None,
    };
    let mut first = true;
    let mut key = |out: &mut Vec<u8>, k: &str| {
        if !first {
            out.push(b',');
        }
        first = false;
        out.push(b'"');
        out.extend_from_slice(k.as_bytes()); // plain ASCII keys: nothing to escape
        out.extend_from_slice(b"\":");
    };
    out.push(b'{');
    let fields = [
        ("content", content),
        ("function_call", get("function_call")),
        ("name", get("name")),
        ("refusal", refusal),
        ("role", get("role")),
        ("tool_call_id", get("tool_call_id")),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            key(out, k);
            write_canonical(v, out);
        }
    }
    if let Some(calls) = calls {
        key(out, "tool_calls");
        out.push(b'[');
        for (i, c) in calls.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let parts = [
                ("arguments", c.pointer("/function/arguments")),
                ("id", c.get("id")),
                ("name", c.pointer("/function/name")),
            ];
            out.push(b'{');
            for (j, (k, v)) in parts.into_iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                out.push(b'"');
                out.extend_from_slice(k.as_bytes());
                out.extend_from_slice(b"\":");
                write_canonical(v.unwrap_or(&Value::Null), out);
            }
            out.push(b'}');
        }
        out.push(b']');
    }
    out.push(b'}');
}

/// The parts of a message that make it the same message: role, content (absent, `null` and `""` alike), name,
/// tool call id, and tool calls reduced to id, name and arguments. Fields such as `refusal: null` that some
/// clients add when resending an answer do not change its identity.
pub fn normalize(m: &Value) -> Value {
    // An item without a role (the Responses API's calls, outputs, reasoning, compaction, …) is the whole item but
    // its `status`, which a client may drop or change when it sends the item back.
    if m.get("role").is_none() {
        if let Value::Object(o) = m {
            let mut o = o.clone();
            o.remove("status");
            return Value::Object(o);
        }
    }
    let mut out = serde_json::Map::new();
    let get = |k: &str| m.get(k).filter(|v| !v.is_null());
    if let Some(r) = get("role") {
        out.insert("role".into(), r.clone());
    }
    match get("content") {
        Some(Value::String(s)) if s.is_empty() => {}
        Some(c) => {
            out.insert("content".into(), c.clone());
        }
        None => {}
    }
    for k in ["name", "tool_call_id", "function_call"] {
        if let Some(v) = get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(Value::String(r)) = get("refusal") {
        out.insert("refusal".into(), Value::String(r.clone()));
    }
    if let Some(Value::Array(calls)) = get("tool_calls") {
        if !calls.is_empty() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "id": c.get("id"),
                        "name": c.pointer("/function/name"),
                        "arguments": c.pointer("/function/arguments"),
                    })
                })
                .collect();
            out.insert("tool_calls".into(), Value::Array(calls));
        }
    }
    Value::Object(out)
}

/// Rough serialized size of a JSON value, without serializing it.
pub fn approx_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(approx_size).sum::<usize>() + 2,
        Value::Object(o) => {
            o.iter()
                .map(|(k, v)| k.len() + 3 + approx_size(v))
                .sum::<usize>()
                + 2
        }
    }
}

/// The path from the first message to a node: how many messages and their approximate bytes.
#[derive(Debug, Clone, Copy, Default)]
struct PathStat {
    len: usize,
    bytes: usize,
}

/// What appending a request's messages did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The node of the request's last message (`None` for an empty request).
    pub leaf: Option<NodeId>,
    /// How many of the request's messages were already stored.
    pub known: usize,
    /// The nodes created, in order.
    pub created: Vec<NodeId>,
}

/// The message tree of one session.
#[derive(Debug, Default, Clone)]
pub struct Tree {
    nodes: HashMap<NodeId, Node>,
    children: HashMap<Option<NodeId>, Vec<NodeId>>,
    /// Per node, the path from the first message to it in figures (kept as nodes are inserted, so the history's
    /// figures need no walk).
    paths: HashMap<NodeId, PathStat>,
    /// A node came in after a child of its own (an out-of-order or cyclic store): `paths` no longer describes
    /// every path, and [`Tree::history_stats`] walks instead.
    paths_stale: bool,
    /// Prefix index: chain hash of the raw bytes of a request's first k messages → the node of message k.
    prefix: HashMap<u64, NodeId>,
    /// The leaf the latest request (or reply) extended.
    head: Option<NodeId>,
    /// Heap bytes of the nodes and of the children lists (the tables are weighed from their capacities).
    weight: usize,
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a tree from stored rows (any order; parents need not come first).
    pub fn from_rows(rows: Vec<NodeRow>, head: Option<NodeId>) -> Self {
        Self::from_nodes(rows.into_iter().map(Node::from).collect(), head)
    }

    /// Rebuilds a tree from nodes (any order; parents need not come first).
    pub fn from_nodes(nodes: Vec<Node>, head: Option<NodeId>) -> Self {
        let mut t = Tree::new();
        let mut nodes = nodes;
        nodes.sort_by_key(|n| n.position);
        for n in nodes {
            t.insert(n);
        }
        t.head = head.filter(|h| t.nodes.contains_key(h));
        t
    }

    /// Adds stored nodes this tree lacks (appended elsewhere, e.g. by another instance); known ones are skipped.
    pub fn merge(&mut self, rows: Vec<NodeRow>) {
        let mut nodes: Vec<Node> = rows.into_iter().map(Node::from).collect();
        nodes.sort_by_key(|n| n.position);
        for n in nodes {
            self.insert(n);
        }
    }

    /// Moves the head to a stored node (ignored when the tree lacks it).
    pub fn set_head(&mut self, id: &str) {
        if let Some((k, _)) = self.nodes.get_key_value(id) {
            self.head = Some(k.clone());
        }
    }

    fn insert(&mut self, n: Node) {
        if self.nodes.contains_key(&n.id) {
            return;
        }
        self.weight += n.heap_bytes();
        if self.children.contains_key(&Some(n.id.clone())) {
            self.paths_stale = true;
        }
        let up = n
            .parent
            .as_ref()
            .and_then(|p| self.paths.get(p))
            .copied()
            .unwrap_or_default();
        let path = PathStat {
            len: up.len + 1,
            bytes: up.bytes + n.weight(),
        };
        self.paths.insert(n.id.clone(), path);
        let siblings = self.children.entry(n.parent.clone()).or_default();
        let before = siblings.capacity();
        siblings.push(n.id.clone());
        let elem = std::mem::size_of::<NodeId>();
        self.weight += heap::vec(siblings.capacity(), elem) - heap::vec(before, elem);
        self.nodes.insert(n.id.clone(), n);
    }

    /// Number of nodes (messages stored, all branches).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Heap bytes held: the nodes, their messages, and the tables indexing them, the prefix index included (which
    /// also grows with resends that create no node, e.g. the same messages serialised differently).
    pub fn weight(&self) -> usize {
        use std::mem::size_of;
        self.weight
            + heap::table(self.nodes.capacity(), size_of::<(NodeId, Node)>())
            + heap::table(
                self.children.capacity(),
                size_of::<(Option<NodeId>, Vec<NodeId>)>(),
            )
            + heap::table(self.paths.capacity(), size_of::<(NodeId, PathStat)>())
            + heap::table(self.prefix.capacity(), size_of::<(u64, NodeId)>())
    }

    /// The current leaf.
    pub fn head(&self) -> Option<&NodeId> {
        self.head.as_ref()
    }

    /// A node by id.
    pub fn get(&self, id: &str) -> Option<&Node> {
        self.nodes.get(id)
    }

    /// Appends a request's messages. `raw_hashes[i]` is a fast hash of message i's bytes as the client sent
    /// them: the longest prefix already seen is found in the prefix index by binary search, so only new messages
    /// are canonicalised and hashed. Returns the nodes created; the head moves to the request's last node.
    pub fn append_request(&mut self, messages: &[Value], raw_hashes: &[u64], now: i64) -> Appended {
        let chain = chain_hashes(raw_hashes);
        let usable = chain.len() == messages.len();
        // Longest k such that the first k messages are indexed (prefixes are indexed as a whole, so binary search).
        let (mut lo, mut hi) = (0usize, if usable { messages.len() } else { 0 });
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.prefix.contains_key(&chain[mid - 1]) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let mut parent: Option<NodeId> = if lo > 0 {
            self.prefix.get(&chain[lo - 1]).cloned()
        } else {
            None
        };
        let mut created = Vec::new();
        let mut known = lo;
        for (i, m) in messages.iter().enumerate().skip(lo) {
            let id = node_id(parent.as_deref(), m);
            if self.nodes.contains_key(&id) {
                if created.is_empty() {
                    known = i + 1;
                }
            } else {
                self.insert(Node {
                    id: id.clone(),
                    parent: parent.clone(),
                    position: i as u32,
                    message: Arc::new(m.clone()),
                    kind: NodeKind::Client,
                    partial: false,
                    created_at: now,
                });
                created.push(id.clone());
            }
            if usable {
                self.prefix.insert(chain[i], id.clone());
            }
            parent = Some(id);
        }
        if let Some(leaf) = &parent {
            self.advance_head(leaf, !created.is_empty());
        }
        Appended {
            leaf: parent,
            known,
            created,
        }
    }

    /// Appends the upstream's reply under `parent`. Returns its id and whether it was new.
    pub fn append_reply(
        &mut self,
        parent: Option<NodeId>,
        message: Value,
        partial: bool,
        now: i64,
    ) -> (NodeId, bool) {
        let id = node_id(parent.as_deref(), &message);
        let new = !self.nodes.contains_key(&id);
        if new {
            let position = parent
                .as_ref()
                .and_then(|p| self.nodes.get(p))
                .map(|p| p.position.saturating_add(1))
                .unwrap_or(0);
            self.insert(Node {
                id: id.clone(),
                parent,
                position,
                message: Arc::new(message),
                kind: NodeKind::Reply,
                partial,
                created_at: now,
            });
        }
        self.advance_head(&id, new);
        (id, new)
    }

    /// Moves the head to `leaf` unless that would move it backwards: a request or reply that created nothing and
    /// ends on the head's own path (an ancestor of the head, or the head itself) leaves the head where it is. So a
    /// shorter request that finishes after a longer one of the same conversation (parallel or retried turns) never
    /// rewinds the history; a new node, or an existing node on another branch, moves the head there.
    fn advance_head(&mut self, leaf: &NodeId, created: bool) {
        if !created && self.is_on_head_path(leaf) {
            return;
        }
        self.head = Some(leaf.clone());
    }

    /// Whether `id` lies on the path to the head (the head included): a walk up from the head of at most the
    /// difference in positions.
    fn is_on_head_path(&self, id: &NodeId) -> bool {
        let (Some(head), Some(node)) = (self.head.as_ref(), self.nodes.get(id)) else {
            return false;
        };
        let mut cur = self.nodes.get(head);
        // Bounded by the node count: a hand-written store may hold a parent cycle.
        for _ in 0..=self.nodes.len() {
            let Some(n) = cur else { break };
            if n.id == *id {
                return true;
            }
            if n.position <= node.position {
                return false;
            }
            cur = n.parent.as_ref().and_then(|p| self.nodes.get(p));
        }
        false
    }

    /// The session's history in figures: its message count and approximate bytes (each node's
    /// [`Node::weight`]). Kept per node as the tree grows; a walk to the head when a node came in after its child.
    pub fn history_stats(&self) -> (usize, usize) {
        if self.paths_stale {
            let history = self.history();
            return (history.len(), history.iter().map(|n| n.weight()).sum());
        }
        self.head
            .as_ref()
            .and_then(|h| self.paths.get(h))
            .map_or((0, 0), |p| (p.len, p.bytes))
    }

    /// The path from the first message to `leaf`. Bounded: a node never met twice, so a parent cycle (a store
    /// written by hand or by an older version; see [`Tree::cyclic_nodes`]) ends the path where it would repeat,
    /// and a missing parent where it is missing.
    pub fn path_to(&self, leaf: Option<&NodeId>) -> Vec<&Node> {
        let mut out = Vec::new();
        let mut cur = leaf.and_then(|l| self.nodes.get(l));
        while let Some(n) = cur {
            if out.len() == self.nodes.len() {
                // More steps than nodes: the parents loop. Walk again, stopping at the first node met twice.
                return self.path_without_cycle(leaf);
            }
            out.push(n);
            cur = self.parent_of(n);
        }
        out.reverse();
        out
    }

    fn parent_of(&self, n: &Node) -> Option<&Node> {
        n.parent.as_ref().and_then(|p| self.nodes.get(p))
    }

    /// [`Tree::path_to`] on parents that loop: up from `leaf` until a node would come twice.
    fn path_without_cycle(&self, leaf: Option<&NodeId>) -> Vec<&Node> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        let mut cur = leaf.and_then(|l| self.nodes.get(l));
        while let Some(n) = cur.filter(|n| seen.insert(&n.id)) {
            out.push(n);
            cur = self.parent_of(n);
        }
        out.reverse();
        out
    }

    /// Nodes whose parents lead back to themselves (0 for any tree this version builds: a node's id hashes its
    /// parent's). One pass, each node's ancestors followed once.
    pub fn cyclic_nodes(&self) -> usize {
        // 1: being followed now; 2: known to reach a root, a missing parent or a cycle.
        let mut state: HashMap<&str, u8> = HashMap::with_capacity(self.nodes.len());
        let mut cyclic = 0;
        for start in self.nodes.values() {
            let mut chain = Vec::new();
            let mut cur = Some(start);
            while let Some(n) = cur {
                match state.get(&*n.id) {
                    Some(2) => break,
                    Some(_) => {
                        // Back on the chain being followed: the nodes from `n` on form a cycle.
                        let from = chain.iter().position(|c: &&Node| c.id == n.id).unwrap_or(0);
                        cyclic += chain.len() - from;
                        break;
                    }
                    None => {
                        state.insert(&n.id, 1);
                        chain.push(n);
                        cur = self.parent_of(n);
                    }
                }
            }
            for n in chain {
                state.insert(&n.id, 2);
            }
        }
        cyclic
    }

    /// The session's history: the path to the head.
    pub fn history(&self) -> Vec<&Node> {
        self.path_to(self.head.as_ref())
    }

    /// Approximate bytes of the history (the path to the head).
    pub fn history_bytes(&self) -> usize {
        self.history_stats().1
    }

    /// Every leaf except the head's: the other branches, oldest first.
    pub fn other_leaves(&self) -> Vec<&Node> {
        let mut leaves: Vec<&Node> = self
            .nodes
            .values()
            .filter(|n| !self.children.contains_key(&Some(n.id.clone())))
            .filter(|n| Some(&n.id) != self.head.as_ref())
            .collect();
        leaves.sort_by(|a, b| {
            (a.created_at, a.position, &a.id).cmp(&(b.created_at, b.position, &b.id))
        });
        leaves
    }

    /// Position at which the path to `leaf` leaves the head's path.
    pub fn divergence(&self, leaf: &Node) -> u32 {
        let head: std::collections::HashSet<&NodeId> =
            self.history().iter().map(|n| &n.id).collect();
        self.path_to(Some(&leaf.id))
            .iter()
            .find(|n| !head.contains(&n.id))
            .map(|n| n.position)
            .unwrap_or(leaf.position)
    }

    /// Every node (unordered).
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }
}

/// Chain hashes: `h[i]` covers the raw hashes of messages `0..=i`.
fn chain_hashes(raw: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(raw.len());
    let mut acc: u64 = 0x9e37_79b9_7f4a_7c15;
    for r in raw {
        acc = xxhash_rust::xxh3::xxh3_64(&[acc.to_le_bytes(), r.to_le_bytes()].concat());
        out.push(acc);
    }
    out
}

/// Fast hashes of each message's raw bytes in a chat body (empty when the body cannot be read that way). The
/// gateway takes them from its parse's scan (`dialect::Request::item_hashes`); this reads them without one.
pub fn raw_message_hashes(body: &[u8]) -> Vec<u64> {
    #[derive(serde::Deserialize)]
    struct Msgs<'a> {
        #[serde(borrow)]
        messages: Vec<&'a serde_json::value::RawValue>,
    }
    match serde_json::from_slice::<Msgs>(body) {
        Ok(m) => hash_all(&m.messages),
        Err(_) => Vec::new(),
    }
}

fn hash_all(items: &[&serde_json::value::RawValue]) -> Vec<u64> {
    items
        .iter()
        .map(|r| xxhash_rust::xxh3::xxh3_128(r.get().as_bytes()) as u64)
        .collect()
}

/// [`raw_message_hashes`] for a conversation kept under `key` (`input` for the Responses API); empty when the
/// field is not an array.
pub fn raw_item_hashes(body: &[u8], key: &str) -> Vec<u64> {
    if key == "messages" {
        // the common case, without collecting the other fields
        return raw_message_hashes(body);
    }
    let Ok(fields) = serde_json::from_slice::<
        std::collections::HashMap<std::borrow::Cow<'_, str>, &serde_json::value::RawValue>,
    >(body) else {
        return Vec::new();
    };
    let Some(list) = fields.get(key) else {
        return Vec::new();
    };
    match serde_json::from_str::<Vec<&serde_json::value::RawValue>>(list.get()) {
        Ok(items) => hash_all(&items),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: Value) -> Vec<Value> {
        v.as_array().unwrap().clone()
    }

    fn raw(m: &[Value]) -> Vec<u64> {
        raw_message_hashes(json!({ "messages": m }).to_string().as_bytes())
    }

    fn append(t: &mut Tree, m: &[Value]) -> Appended {
        t.append_request(m, &raw(m), 0)
    }

    fn contents(t: &Tree) -> Vec<String> {
        t.history()
            .iter()
            .map(|n| n.message["content"].as_str().unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn append_extends_and_identical_resend_creates_nothing() {
        let mut t = Tree::new();
        let m1 = msgs(json!([{"role":"system","content":"s"},{"role":"user","content":"u1"}]));
        let a = append(&mut t, &m1);
        assert_eq!(a.created.len(), 2);
        let (r, new) = t.append_reply(
            a.leaf.clone(),
            json!({"role":"assistant","content":"a1"}),
            false,
            0,
        );
        assert!(new);
        let mut m2 = m1.clone();
        // the client resends the answer with extra null fields: same node
        m2.push(json!({"role":"assistant","content":"a1","refusal":null,"tool_calls":[]}));
        m2.push(json!({"role":"user","content":"u2"}));
        let b = append(&mut t, &m2);
        assert_eq!(b.created.len(), 1, "only the new user message");
        assert_eq!(b.known, 3);
        assert_eq!(t.get(&r).unwrap().kind, NodeKind::Reply);
        for _ in 0..100 {
            let again = append(&mut t, &m2);
            assert!(again.created.is_empty());
            assert_eq!(again.known, 4);
        }
        assert_eq!(t.len(), 4);
        assert_eq!(contents(&t), ["s", "u1", "a1", "u2"]);
    }

    #[test]
    fn a_shorter_request_finishing_late_never_moves_the_head_back() {
        let mut t = Tree::new();
        let mut long =
            msgs(json!([{"role":"system","content":"s"},{"role":"user","content":"u1"}]));
        long.push(json!({"role":"assistant","content":"a1"}));
        long.push(json!({"role":"user","content":"u2"}));
        let a = append(&mut t, &long);
        t.append_reply(a.leaf, json!({"role":"assistant","content":"a2"}), false, 0);
        assert_eq!(contents(&t), ["s", "u1", "a1", "u2", "a2"]);
        // The prefix request (sent earlier, answered last): its path and its reply exist already.
        let short = &long[..2];
        let b = append(&mut t, short);
        assert!(b.created.is_empty());
        assert_eq!(t.history_stats().0, 5, "the head stays at the newest reply");
        let (_, new) = t.append_reply(b.leaf, json!({"role":"assistant","content":"a1"}), false, 0);
        assert!(!new);
        assert_eq!(contents(&t), ["s", "u1", "a1", "u2", "a2"]);
        // A different answer to the prefix is a new branch: the head follows it.
        let b = append(&mut t, short);
        t.append_reply(
            b.leaf,
            json!({"role":"assistant","content":"other"}),
            false,
            0,
        );
        assert_eq!(contents(&t), ["s", "u1", "other"]);
        // Going back to the first branch as it stands (no new node, not on the head's path) moves the head there.
        append(&mut t, &long);
        assert_eq!(contents(&t), ["s", "u1", "a1", "u2"]);
    }

    #[test]
    fn regenerate_is_a_sibling_and_edit_is_a_branch() {
        let mut t = Tree::new();
        let m = msgs(json!([{"role":"user","content":"q"}]));
        let a = append(&mut t, &m);
        t.append_reply(
            a.leaf.clone(),
            json!({"role":"assistant","content":"first"}),
            false,
            1,
        );
        // regenerate: same request again, different answer
        let a2 = append(&mut t, &m);
        assert!(a2.created.is_empty());
        t.append_reply(
            a2.leaf.clone(),
            json!({"role":"assistant","content":"second"}),
            false,
            2,
        );
        assert_eq!(t.len(), 3);
        assert_eq!(contents(&t), ["q", "second"]);
        let others = t.other_leaves();
        assert_eq!(others.len(), 1);
        assert_eq!(others[0].message["content"], "first");
        assert_eq!(t.divergence(others[0]), 1);
        // edit the first message: a new branch from the root
        let e = append(&mut t, &msgs(json!([{"role":"user","content":"q edited"}])));
        assert_eq!(e.created.len(), 1);
        assert_eq!(contents(&t), ["q edited"]);
        assert_eq!(t.len(), 4, "nothing overwritten");
    }

    /// The history's figures as a walk to the head finds them.
    fn walked(t: &Tree) -> (usize, usize) {
        let h = t.history();
        (h.len(), h.iter().map(|n| n.weight()).sum())
    }

    #[test]
    fn history_stats_follow_the_head_without_a_walk() {
        let mut t = Tree::new();
        assert_eq!(t.history_stats(), (0, 0));
        let m = msgs(
            json!([{"role":"user","content":"q"},{"role":"assistant","content":"a long answer"}]),
        );
        let a = append(&mut t, &m);
        assert_eq!(t.history_stats(), walked(&t));
        assert_eq!(t.history_stats().0, 2);
        t.append_reply(
            a.leaf.clone(),
            json!({"role":"assistant","content":"x"}),
            false,
            1,
        );
        assert_eq!(t.history_stats(), walked(&t));
        // an edit: a shorter branch from the root becomes the head
        append(
            &mut t,
            &msgs(json!([{"role":"user","content":"q edited, longer"}])),
        );
        assert_eq!(t.history_stats(), walked(&t));
        assert_eq!(t.history_stats().0, 1);
        // back to the first branch, one longer
        let mut m2 = m.clone();
        m2.push(json!({"role":"user","content":"more"}));
        append(&mut t, &m2);
        assert_eq!(t.history_stats(), walked(&t));
        assert_eq!(t.history_stats().0, 3);
        // rebuilt from its nodes (parents first by position) and merged: the same figures
        let t2 = Tree::from_nodes(t.nodes().cloned().collect(), t.head().cloned());
        assert_eq!(t2.history_stats(), t.history_stats());
        let mut t3 = Tree::new();
        t3.merge(t.nodes().map(NodeRow::from).collect());
        t3.set_head(t.head().map_or("", |h| &**h));
        assert_eq!(t3.history_stats(), t.history_stats());
    }

    #[test]
    fn history_stats_of_a_store_with_children_before_parents_are_walked() {
        // positions that do not follow the parents: c (position 0) comes in before its parent b (position 1)
        let rows = vec![
            row("a", None, 2),
            row("b", Some("a"), 1),
            row("c", Some("b"), 0),
        ];
        let t = Tree::from_rows(rows, Some(Arc::from("c")));
        assert_eq!(t.history_stats(), walked(&t));
        assert_eq!(t.history_stats().0, 3);
        let mut t = Tree::new();
        t.merge(vec![row("c", Some("b"), 0)]);
        t.merge(vec![row("b", Some("a"), 0), row("a", None, 0)]);
        t.set_head("c");
        assert_eq!(t.history_stats(), walked(&t));
        assert_eq!(t.history_stats().0, 3);
    }

    /// Node ids are stored and matched against later requests: their text must never change. SHA-256 of the
    /// parent's id, a zero byte and the normalised message's canonical JSON (computed independently, in Python:
    /// `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`).
    #[test]
    fn node_ids_are_stable() {
        let m = json!({"role": "user", "content": "Fix \"it\"\n\tnow é 🚀 \\ \u{1f}", "name": "bob", "refusal": null,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"a\":1.5}"}}]});
        assert_eq!(&*node_id(None, &m), "c9eab5c2e360cfb266e4c6feb0f860ca");
        assert_eq!(
            &*node_id(Some("0123456789abcdef0123456789abcdef"), &m),
            "37fb6674d78263d59c5090075a8bc2f1"
        );
    }

    /// The id's text written straight from the message is the canonical JSON of its normalised form.
    #[test]
    fn normalized_text_is_written_without_building_the_form() {
        let cases = [
            json!({"role": "user", "content": "hi"}),
            json!({"role": "user", "content": ""}),
            json!({"role": "user", "content": null, "name": null, "refusal": 3}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "x", "b": {"z": 1, "a": 2}}],
                   "refusal": "no", "name": "n", "tool_call_id": "t", "function_call": {"name": "f", "arguments": "{}"}}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"a\":1}"}},
                {"id": null, "function": {"arguments": {"nested": [1, {"y": 2, "x": 1}]}}},
                7,
                {"function": "not an object"}]}),
            json!({"role": "assistant", "tool_calls": []}),
            json!({"role": "assistant", "tool_calls": {"not": "an array"}}),
            json!({"role": null, "content": "role null"}),
            json!({"type": "function_call_output", "call_id": "c", "output": "o", "status": "completed", "Z": [true]}),
            json!({"type": "reasoning", "status": "in_progress"}),
            json!("a bare string"),
            json!([1, 2]),
            json!({}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "line\n\"quoted\" é 🚀 \u{7}", "extra": "ignored"}),
        ];
        for m in cases {
            let mut fast = Vec::new();
            write_normalized(&m, &mut fast);
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                crate::message::canonical_json(&normalize(&m)),
                "{m}"
            );
        }
    }

    #[test]
    fn self_trimmed_history_branches_and_shares_nothing_wrongly() {
        let mut t = Tree::new();
        let long = msgs(
            json!([{"role":"system","content":"s"},{"role":"user","content":"1"},
            {"role":"assistant","content":"2"},{"role":"user","content":"3"}]),
        );
        append(&mut t, &long);
        // the agent dropped message 1 and 2 itself
        let trimmed = msgs(json!([{"role":"system","content":"s"},{"role":"user","content":"3"}]));
        let a = append(&mut t, &trimmed);
        assert_eq!(a.known, 1);
        assert_eq!(a.created.len(), 1);
        assert_eq!(contents(&t), ["s", "3"]);
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn differently_serialised_resend_falls_back_to_content_hashes() {
        let mut t = Tree::new();
        let m = msgs(json!([{"role":"user","content":"q"},{"role":"assistant","content":"a"}]));
        append(&mut t, &m);
        // same messages, different raw bytes (keys reordered)
        let reordered = vec![
            json!({"content":"q","role":"user"}),
            json!({"content":"a","role":"assistant"}),
            json!({"role":"user","content":"n"}),
        ];
        let a = t.append_request(&reordered, &[1, 2, 3], 0);
        assert_eq!(a.known, 2);
        assert_eq!(a.created.len(), 1);
        // mismatched hash count: still correct
        let b = t.append_request(&reordered, &[], 0);
        assert!(b.created.is_empty());
    }

    #[test]
    fn weight_counts_the_prefix_index() {
        let mut t = Tree::new();
        let m = msgs(json!([{"role":"user","content":"q"},{"role":"assistant","content":"a"}]));
        append(&mut t, &m);
        let before = t.weight();
        // The same messages with other raw bytes: no node is created, but the prefix index grows.
        for k in 0..20u64 {
            let created = t.append_request(&m, &[100 + 2 * k, 101 + 2 * k], 0).created;
            assert!(created.is_empty());
        }
        assert_eq!(t.len(), 2);
        let slot = std::mem::size_of::<(u64, NodeId)>();
        assert!(
            t.weight() >= before + 40 * slot,
            "40 more index entries of {slot} bytes: {before} -> {}",
            t.weight()
        );
        // Seen again: nothing more.
        let grown = t.weight();
        t.append_request(&m, &[100, 101], 0);
        assert_eq!(t.weight(), grown);
    }

    #[test]
    fn rebuild_from_nodes() {
        let mut t = Tree::new();
        let m = msgs(
            json!([{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"r"}]),
        );
        append(&mut t, &m);
        let nodes: Vec<Node> = t.nodes().cloned().collect();
        let t2 = Tree::from_nodes(nodes, t.head().cloned());
        assert_eq!(contents(&t2), ["q", "a", "r"]);
        let mut t2 = t2;
        assert!(append(&mut t2, &m).created.is_empty());
    }

    /// `f` run on its own thread, if it returns within two seconds (a walk that loops fails the test instead of
    /// hanging it).
    fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(2)).ok()
    }

    fn row(id: &str, parent: Option<&str>, position: u32) -> NodeRow {
        NodeRow {
            id: Arc::from(id),
            parent: parent.map(Arc::from),
            position,
            kind: NodeKind::Client,
            partial: false,
            created_at: 0,
            message: Arc::new(json!({"role": "user", "content": id})),
        }
    }

    fn ids(path: &[&Node]) -> Vec<String> {
        path.iter().map(|n| n.id.to_string()).collect()
    }

    #[test]
    fn a_node_that_is_its_own_parent_ends_the_path() {
        let walked = within(|| {
            let t = Tree::from_rows(vec![row("n0", Some("n0"), 0)], Some(Arc::from("n0")));
            (ids(&t.history()), t.history_bytes() > 0, t.cyclic_nodes())
        });
        assert_eq!(walked, Some((vec!["n0".to_string()], true, 1)));
    }

    #[test]
    fn a_parent_cycle_ends_the_path_where_it_would_repeat() {
        let walked = within(|| {
            // a ← b ← c ← a, and d hanging off c: d's path is d, then the cycle once.
            let rows = vec![
                row("a", Some("c"), 0),
                row("b", Some("a"), 1),
                row("c", Some("b"), 2),
                row("d", Some("c"), 3),
            ];
            let t = Tree::from_rows(rows, Some(Arc::from("d")));
            let leaves = t.other_leaves().len();
            let d = t.get("d").map(|d| t.divergence(d));
            (ids(&t.history()), t.cyclic_nodes(), leaves, d)
        });
        let (path, cyclic, leaves, d) = walked.expect("the walk ends");
        assert_eq!(path, ["a", "b", "c", "d"]);
        assert_eq!(cyclic, 3, "d leads into the cycle but is not on it");
        assert_eq!((leaves, d), (0, Some(3)));
        // A well-formed tree has none.
        let mut t = Tree::new();
        append(
            &mut t,
            &msgs(json!([{"role":"user","content":"q"},{"role":"user","content":"r"}])),
        );
        assert_eq!(t.cyclic_nodes(), 0);
    }

    #[test]
    fn a_reply_under_the_deepest_position_does_not_overflow() {
        let mut t = Tree::from_rows(vec![row("p", None, u32::MAX)], Some(Arc::from("p")));
        let (id, _) = t.append_reply(
            Some(Arc::from("p")),
            json!({"role":"assistant","content":"a"}),
            false,
            0,
        );
        assert_eq!(t.get(&id).map(|n| n.position), Some(u32::MAX));
    }

    #[test]
    fn items_without_a_role_are_told_apart_by_everything_but_their_status() {
        let call = |id: &str, status: &str| json!({"type":"function_call","call_id":id,"name":"shell","arguments":"{}","status":status});
        let (a, b) = (call("c1", "completed"), call("c2", "completed"));
        assert_ne!(
            node_id(Some("p"), &a),
            node_id(Some("p"), &b),
            "two calls are two nodes"
        );
        let out = json!({"type":"function_call_output","call_id":"c1","output":"x"});
        assert_ne!(node_id(Some("p"), &a), node_id(Some("p"), &out));
        assert_eq!(
            node_id(Some("p"), &a),
            node_id(Some("p"), &call("c1", "in_progress")),
            "a resend with another status is the same item"
        );
        let mut no_status = a.clone();
        no_status.as_object_mut().unwrap().remove("status");
        assert_eq!(node_id(Some("p"), &a), node_id(Some("p"), &no_status));
    }

    #[test]
    fn item_hashes_read_the_dialects_field() {
        let items = r#"[{"type":"message","role":"user","content":"q"},{"type":"function_call","call_id":"c"}]"#;
        let as_messages =
            raw_message_hashes(format!(r#"{{"model":"m","messages":{items}}}"#).as_bytes());
        let as_input = raw_item_hashes(
            format!(r#"{{"model":"m","input":{items}}}"#).as_bytes(),
            "input",
        );
        assert_eq!(as_input.len(), 2);
        assert_eq!(
            as_input, as_messages,
            "the same bytes, the same hashes, whatever the field"
        );
        assert!(raw_item_hashes(br#"{"input":"just text"}"#, "input").is_empty());
        assert!(raw_item_hashes(br#"{"messages":[]}"#, "input").is_empty());
    }
}
