//! One cached session: its tree, records and write state (admitted, deleted, dirty), and what the cache weighs.

use super::heap;
use super::tree::{approx_size, Tree};
use crate::store::{Compression, Cursor, NodeRow, Record, SessionMeta, WriteOp};
use parking_lot::Mutex;
use serde_json::Value;
use std::sync::atomic::{AtomicU32, Ordering};

/// One cached session.
pub struct SessionEntry {
    /// Public id.
    pub id: String,
    /// The owner's tenant: HMAC-SHA256 (hex), under the per-install secret, of every credential header its
    /// requests carry (name and value), or `anonymous` when they carry none (see `session::tenant`).
    pub tenant: String,
    /// The wire format of its requests (`chat`, `anthropic`).
    pub dialect: &'static str,
    /// Unix seconds of the first request.
    pub created_at: i64,
    pub(super) state: Mutex<EntryState>,
    pub(super) weight: AtomicU32,
}

pub(super) struct EntryState {
    pub(super) tree: Tree,
    pub(super) last_active: i64,
    pub(super) compressions: Vec<Compression>,
    pub(super) internal: Vec<Value>,
    /// Approximate bytes of `compressions` and `internal`.
    pub(super) records_weight: usize,
    /// Version of the newest row built (see [`SessionMeta::version`]).
    pub(super) version: u64,
    /// The session may be written: it was loaded from the store, or the upstream accepted its first request.
    pub(super) admitted: bool,
    /// Deleted (admin API or retention purge): nothing more is written for it.
    pub(super) deleted: bool,
    /// A write was refused: the next write rewrites the whole session (row, every node, `unsaved`).
    pub(super) dirty: bool,
    /// Records whose write was refused.
    pub(super) unsaved: Vec<WriteOp>,
    /// How much of the stored session this entry holds (a shared store appends from other instances too).
    pub(super) cursor: Cursor,
    /// The session was seen in the store (loaded, or found there since): when it is gone from a shared store, it
    /// was deleted or expired there.
    pub(super) in_store: bool,
    /// The strategy an operator pinned for the session (see [`SessionMeta::strategy`]).
    pub(super) strategy: Option<String>,
    /// See [`SessionMeta::idle_notified`].
    pub(super) idle_notified: Option<i64>,
    /// What the session's latest answered turn sent upstream, as hashes (kept in memory only).
    pub(super) last_sent: Option<SentPrint>,
}

/// What a turn sent upstream, as hashes and positions (no message text), kept with its session in memory so that
/// the next turn can tell where its request first differs from it and why (`pipeline::cache_miss`).
#[derive(Debug, Clone, Default)]
pub struct SentPrint {
    /// When its request arrived.
    pub at: Option<std::time::Instant>,
    /// Hash of the model it went to.
    pub model: u64,
    /// Hash of the client's tools (0: none).
    pub tools: u64,
    /// Hash of the client's top-level system prompt or instructions (0: none).
    pub system: u64,
    /// Hash of each element of the conversation array the client sent.
    pub client: Vec<u64>,
    /// Hash of each element sent upstream, when a rewrite changed them (empty: the client's, as sent).
    pub sent: Vec<u64>,
    /// Aligned with `sent`: the position in the client's request of the element sent, `u32::MAX` for one ctxgate
    /// wrote.
    pub from: Vec<u32>,
    /// The rewrite's cut points and stages, and whether the recall tools were offered (`None`: not rewritten).
    pub rewrite: Option<SentRewrite>,
    /// The node of the client's last message (its path gives each client element's message).
    pub leaf: Option<super::tree::NodeId>,
}

/// What a rewrite did to a turn's prefix, as [`SentPrint`] keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct SentRewrite {
    pub cuts: [usize; 9],
    pub stages: Vec<&'static str>,
    pub injected: bool,
}

impl SentPrint {
    /// Heap bytes it holds.
    fn heap_bytes(&self) -> usize {
        use heap::vec;
        vec(self.client.capacity(), 8)
            + vec(self.sent.capacity(), 8)
            + vec(self.from.capacity(), 4)
            + self
                .rewrite
                .as_ref()
                .map_or(0, |r| vec(r.stages.capacity(), 16))
    }
}

impl EntryState {
    pub(super) fn new(tree: Tree, last_active: i64, admitted: bool) -> Self {
        Self {
            tree,
            last_active,
            compressions: Vec::new(),
            internal: Vec::new(),
            records_weight: 0,
            version: 0,
            admitted,
            deleted: false,
            dirty: false,
            unsaved: Vec::new(),
            cursor: Cursor::default(),
            in_store: false,
            strategy: None,
            idle_notified: None,
            last_sent: None,
        }
    }

    /// Whether the entry holds this record already (records coming back from a shared store include its own).
    pub(super) fn has_record(&self, record: &Record) -> bool {
        match record {
            Record::Compression(c) => self.compressions.iter().any(|x| x == &**c),
            Record::Internal(v) => self.internal.contains(v),
        }
    }

    /// Writes may be queued for the session.
    pub(super) fn writable(&self) -> bool {
        self.admitted && !self.deleted
    }

    pub(super) fn push_record(&mut self, record: Record) {
        self.records_weight += record_weight(&record);
        match record {
            Record::Compression(c) => self.compressions.push(*c),
            Record::Internal(v) => self.internal.push(v),
        }
    }
}

/// Approximate bytes a record holds in memory (about twice its text, as for a parsed value).
fn record_weight(record: &Record) -> usize {
    let text = match record {
        Record::Compression(c) => c.approx_bytes(),
        Record::Internal(v) => approx_size(v),
    };
    text * 2 + 64
}

/// Bytes the session cache (moka) holds per entry beyond the key and value it is given: its node, its place in
/// the access-order and write-order queues and its frequency sketch's share (measured by
/// `entry::tests::the_cache_holds_what_its_constant_says`: 255-330 bytes, lower when the hash table's old bucket
/// arrays, freed through an epoch, have been released by the time it measures).
pub(super) const CACHE_ENTRY_BYTES: usize = 288;

impl SessionEntry {
    /// Heap bytes of an entry beyond its tree and records: the entry itself (shared), its strings and vectors, the
    /// cache's key and per-entry bookkeeping, and its slot in the registry of live entries. (The registry's sweep
    /// keeps up to as many dead ids as live ones, each holding a released entry's allocation: a bound of its own,
    /// docs/operations.md.)
    fn overhead(&self, st: &EntryState) -> usize {
        use heap::{alloc, arc, vec};
        use std::mem::size_of;
        let key = alloc(self.id.len());
        let own = arc::<SessionEntry>()
            + alloc(self.id.capacity())
            + alloc(self.tenant.capacity())
            + vec(st.compressions.capacity(), size_of::<Compression>())
            + vec(st.internal.capacity(), size_of::<Value>())
            + vec(st.unsaved.capacity(), size_of::<WriteOp>())
            + st.strategy.as_ref().map_or(0, |s| alloc(s.capacity()))
            + st.last_sent.as_ref().map_or(0, SentPrint::heap_bytes);
        let cache = key + CACHE_ENTRY_BYTES;
        let registry = size_of::<(String, std::sync::Weak<SessionEntry>)>() * 8 / 7 + key;
        own + cache + registry
    }
}

impl SessionEntry {
    pub(super) fn new(
        id: String,
        tenant: String,
        dialect: &'static str,
        created_at: i64,
        st: EntryState,
    ) -> Self {
        let e = Self {
            id,
            tenant,
            dialect,
            created_at,
            state: Mutex::new(st),
            weight: AtomicU32::new(0),
        };
        e.reweigh(&e.state.lock());
        e
    }

    pub(super) fn meta(&self, st: &EntryState) -> SessionMeta {
        let (history_len, history_bytes) = st.tree.history_stats();
        SessionMeta {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            dialect: self.dialect.to_string(),
            created_at: self.created_at,
            last_active: st.last_active,
            message_count: history_len as u64,
            token_estimate: (history_bytes / 4) as u64,
            head: st.tree.head().map(|h| h.to_string()),
            version: st.version,
            strategy: st.strategy.clone(),
            idle_notified: st.idle_notified,
        }
    }

    /// The row to write now: a new version, so it replaces every row built before it.
    pub(super) fn next_meta(&self, st: &mut EntryState) -> SessionMeta {
        st.version += 1;
        self.meta(st)
    }

    /// Every write that puts the session in the store whole: the row (created when missing), every node, and
    /// the records — all of them on admission, else those whose write was refused.
    pub(super) fn whole(&self, st: &mut EntryState, all_records: bool, now: i64) -> Vec<WriteOp> {
        let mut ops = vec![WriteOp::Session {
            meta: self.next_meta(st),
            create: true,
        }];
        ops.extend(st.tree.nodes().map(|n| WriteOp::Node {
            session: self.id.clone(),
            node: NodeRow::from(n),
        }));
        let unsaved = std::mem::take(&mut st.unsaved);
        if all_records {
            let record = |record: Record| WriteOp::Record {
                session: self.id.clone(),
                created_at: now,
                record,
            };
            ops.extend(
                st.compressions
                    .iter()
                    .map(|c| record(Record::from(c.clone()))),
            );
            ops.extend(
                st.internal
                    .iter()
                    .map(|v| record(Record::Internal(v.clone()))),
            );
        } else {
            ops.extend(unsaved);
        }
        st.dirty = false;
        ops
    }

    pub(super) fn reweigh(&self, st: &EntryState) {
        let w = st.tree.weight() + st.records_weight + self.overhead(st);
        self.weight
            .store(u32::try_from(w).unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    /// Bytes the cache counts for this session: what it really holds in memory — its tree (nodes, parsed messages,
    /// tables, prefix index), its records, the entry itself and the cache's and the registry's bookkeeping.
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// The newest compression record, if any.
    pub fn last_compression(&self) -> Option<Compression> {
        self.state.lock().compressions.last().cloned()
    }

    /// Every compression record (rewrites and summaries), oldest first.
    pub fn compressions(&self) -> Vec<Compression> {
        self.state.lock().compressions.clone()
    }

    /// The strategy an operator pinned for the session, if any.
    pub fn pinned_strategy(&self) -> Option<crate::config::Strategy> {
        self.state
            .lock()
            .strategy
            .as_deref()
            .and_then(crate::config::Strategy::parse)
    }

    /// Keeps `print` as what the session's latest turn sent, and returns the one it replaces with what `compare`
    /// made of the two (the previous one first).
    pub fn swap_sent<T>(
        &self,
        print: SentPrint,
        compare: impl FnOnce(&SentPrint, &SentPrint) -> T,
    ) -> (Option<SentPrint>, Option<T>) {
        let mut st = self.state.lock();
        let bytes = print.heap_bytes();
        let old = st.last_sent.replace(print);
        if old.as_ref().map(SentPrint::heap_bytes) != Some(bytes) {
            self.reweigh(&st);
        }
        let found = match (&old, &st.last_sent) {
            (Some(prev), Some(cur)) => Some(compare(prev, cur)),
            _ => None,
        };
        (old, found)
    }

    /// Runs `f` on the session's tree.
    pub fn with_tree<T>(&self, f: impl FnOnce(&Tree) -> T) -> T {
        f(&self.state.lock().tree)
    }
}

#[cfg(test)]
mod tests {
    use super::super::heap::counting::measure;
    use super::super::manager::session_cache;
    use super::super::registry::Registry;
    use super::super::tree::raw_message_hashes;
    use super::*;
    use crate::alone::alone;
    use serde_json::json;
    use std::sync::Arc;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// A small chat: a system prompt, a question, the reply.
    fn small_chat(i: usize) -> (Vec<Value>, Value) {
        let m = vec![
            json!({"role": "system", "content": "You are a helpful assistant."}),
            json!({"role": "user", "content": format!("Session {i}: what is {i} times {}?", i + 7)}),
        ];
        (
            m,
            json!({"role": "assistant", "content": "Hello! How can I help you today?"}),
        )
    }

    /// An agent's conversation of about `bytes` of JSON: rounds of a tool call and its result (a file's text).
    fn agent(bytes: usize) -> (Vec<Value>, Value) {
        let mut m = vec![
            json!({"role": "system", "content": "You are a coding agent. Use the tools to inspect and fix the repository."}),
            json!({"role": "user", "content": "Fix the failing test in src/parser.rs and explain the cause."}),
        ];
        let mut k = 0;
        while serde_json::to_string(&m).map_or(0, |s| s.len()) < bytes {
            let id = format!("call_{k}");
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/mod{k}.rs\"}}")}}]}));
            m.push(json!({"role": "tool", "tool_call_id": id,
                "content": format!("// mod{k}\n") + &"fn item() -> u32 { 42 }\n".repeat(20 + 37 * (k % 5))}));
            k += 1;
        }
        m.push(json!({"role": "user", "content": "Go on."}));
        (
            m,
            json!({"role": "assistant", "content": "Done: the parser skipped the last token."}),
        )
    }

    /// What the cache and the registry hold for one session, built as the manager builds it: the request's
    /// messages (parsed, as the request handler has them) appended to a new tree, the reply, the entry, the
    /// registry's slot and the cache's entry. Returns the bytes that allocated and the entry's weight.
    fn build(
        rt: &tokio::runtime::Runtime,
        cache: &moka::future::Cache<String, Arc<SessionEntry>>,
        registry: &Registry,
        id: &str,
        (messages, reply): (Vec<Value>, Value),
    ) -> (isize, u32) {
        let body = serde_json::to_vec(&json!({ "messages": messages })).unwrap();
        let raw = raw_message_hashes(&body);
        let (bytes, entry) = measure(|| {
            let mut tree = Tree::new();
            let leaf = tree.append_request(&messages, &raw, 1).leaf;
            tree.append_reply(leaf, reply, false, 2);
            let entry = registry.get_or_create(id, || {
                SessionEntry::new(
                    id.to_string(),
                    "a".repeat(64),
                    "chat",
                    1,
                    EntryState::new(tree, 1, true),
                )
            });
            rt.block_on(cache.insert(entry.id.clone(), entry.clone()));
            entry
        });
        (bytes, entry.weight())
    }

    /// The weigher's figure is what building the entry allocated (allocator rounding included), within 20 %,
    /// for sessions small and large: `store.cache_max_bytes` bounds the history's real footprint.
    #[test]
    fn an_entry_weighs_what_it_holds_in_memory() {
        alone(
            "session::entry::tests::an_entry_weighs_what_it_holds_in_memory",
            entries_weigh_what_they_hold,
        );
    }

    fn entries_weigh_what_they_hold() {
        let rt = runtime();
        let cache = session_cache(1 << 40);
        let registry = Registry::new();
        let mut small = (0, 0u64);
        for i in 0..2000 {
            let (got, w) = build(&rt, &cache, &registry, &format!("chat-{i}"), small_chat(i));
            small = (small.0 + got, small.1 + u64::from(w));
        }
        rt.block_on(cache.run_pending_tasks());
        let ratio = small.1 as f64 / small.0 as f64;
        assert!(
            (0.8..=1.2).contains(&ratio),
            "2000 small chats weigh {} bytes, allocated {}",
            small.1,
            small.0
        );
        for (i, size) in [4_000, 30_000, 100_000, 400_000].into_iter().enumerate() {
            let (got, w) = build(&rt, &cache, &registry, &format!("agent-{i}"), agent(size));
            let ratio = f64::from(w) / got as f64;
            assert!(
                (0.8..=1.2).contains(&ratio),
                "a {size}-byte conversation weighs {w} bytes, allocated {got}"
            );
        }
    }

    /// The cache's own bookkeeping per entry is what [`CACHE_ENTRY_BYTES`] says, within 20 %.
    #[test]
    fn the_cache_holds_what_its_constant_says() {
        alone(
            "session::entry::tests::the_cache_holds_what_its_constant_says",
            the_cache_bookkeeping_is_measured,
        );
    }

    fn the_cache_bookkeeping_is_measured() {
        let rt = runtime();
        let cache = session_cache(1 << 40);
        let n = 5000;
        let entries: Vec<(String, Arc<SessionEntry>)> = (0..n)
            .map(|i| {
                let e = SessionEntry::new(
                    format!("s-{i}"),
                    String::new(),
                    "chat",
                    0,
                    EntryState::new(Tree::new(), 0, true),
                );
                (format!("s-{i}"), Arc::new(e))
            })
            .collect();
        let (got, ()) = measure(|| {
            rt.block_on(async {
                for (k, v) in &entries {
                    cache.insert(k.clone(), v.clone()).await;
                }
                cache.run_pending_tasks().await;
            })
        });
        // The entries were built before: what was allocated is the keys (cloned) and the cache's bookkeeping.
        let keys: usize = entries.iter().map(|(k, _)| heap::alloc(k.len())).sum();
        let per_entry = (got as f64 - keys as f64) / n as f64;
        let ratio = per_entry / CACHE_ENTRY_BYTES as f64;
        assert_eq!(cache.entry_count(), n as u64);
        // The band is wider than the weights' 20 % for the reason `CACHE_ENTRY_BYTES` gives: epoch-freed tables.
        assert!(
            (0.7..=1.3).contains(&ratio),
            "the cache holds {per_entry:.0} bytes per entry"
        );
    }
}
