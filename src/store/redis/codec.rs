//! How rows, nodes and records are laid out in Redis: the session's keys under its hash tag, the write script's
//! arguments, and the parsing of what the read scripts return.

use crate::store::{NodeKind, NodeRow, Record, SessionMeta, WriteOp};
use redis::Value as RValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// Key names under the configured prefix.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    /// The keys of session `id`, in the order the scripts take them: `meta`, `nodes`, `log`, `records`, `rids`,
    /// `turns`. The session sits in a hash tag, so they all live in one Cluster slot.
    pub(super) fn session(&self, id: &str) -> [String; 6] {
        let base = self.base(id);
        ["meta", "nodes", "log", "records", "rids", "turns"].map(|k| format!("{base}:{k}"))
    }

    /// Lock `name` of session `id` and the session's fencing counter (in the session's slot).
    pub(super) fn lock(&self, id: &str, name: &str) -> [String; 2] {
        let base = self.base(id);
        [format!("{base}:lock:{name}"), format!("{base}:fence")]
    }

    /// What every key of session `id` starts with: the prefix and the id as the hash tag, `<prefix>{<id>}`. Redis
    /// Cluster hashes the text between the first `{` and the next `}`, and the whole key when that text is empty:
    /// an id that is empty or starts with `}` would spread its keys over several slots (a CrossSlot error on
    /// every script). Such an id gets `<prefix>{~<32 hex digits of its SHA-256>}~<id>` instead: a tag of its own,
    /// and the id still in the key, so that no two ids share a key (a plain id's tag is followed by `:`).
    fn base(&self, id: &str) -> String {
        let p = &self.prefix;
        if id.is_empty() || id.starts_with('}') {
            let digest = hex::encode(Sha256::digest(id.as_bytes()));
            format!("{p}{{~{}}}~{id}", &digest[..32])
        } else {
            format!("{p}{{{id}}}")
        }
    }

    /// The activity index: a sorted set of session ids by `last_active` (the only key outside a session's slot).
    pub(super) fn index(&self) -> String {
        format!("{}sessions", self.prefix)
    }

    /// The tenant secret shared by every instance.
    pub(super) fn secret(&self) -> String {
        format!("{}secret", self.prefix)
    }
}

/// One node as stored: its JSON object, with the message as it is.
pub(super) fn node_json(node: &NodeRow) -> String {
    format!(
        r#"{{"parent":{},"position":{},"kind":"{}","partial":{},"created_at":{},"message":{}}}"#,
        node.parent
            .as_deref()
            .map_or("null".to_string(), |p| Value::from(p).to_string()),
        node.position,
        node.kind.as_str(),
        node.partial,
        node.created_at,
        node.message
    )
}

#[derive(serde::Deserialize)]
struct StoredNode {
    parent: Option<String>,
    position: u32,
    kind: String,
    partial: bool,
    created_at: i64,
    message: Value,
}

/// A stored node back (`None` when unreadable).
pub(super) fn parse_node(id: &str, json: &[u8]) -> Option<NodeRow> {
    let n: StoredNode = serde_json::from_slice(json).ok()?;
    Some(NodeRow {
        id: Arc::from(id),
        parent: n.parent.map(Arc::from),
        position: n.position,
        kind: NodeKind::parse(&n.kind),
        partial: n.partial,
        created_at: n.created_at,
        message: Arc::new(n.message),
    })
}

/// A record as stored in the `records` list: its kind, a newline, its JSON.
pub(super) fn record_entry(record: &Record) -> String {
    format!("{}\n{}", record.kind().as_str(), record.to_json())
}

/// A stored record back (`None` when unreadable; never logged with its content).
pub(super) fn parse_record(entry: &[u8]) -> Option<Record> {
    let text = std::str::from_utf8(entry).ok()?;
    let (kind, json) = text.split_once('\n')?;
    Record::parse(kind, json).ok()
}

/// The session of an op.
pub(super) fn op_session(op: &WriteOp) -> &str {
    op.session()
}

/// Whether an op needs an id fixed when its batch is queued (records and turns: a retry stores nothing twice).
pub(super) fn needs_id(op: &WriteOp) -> bool {
    matches!(op, WriteOp::Record { .. } | WriteOp::Turn { .. })
}

/// The write script's arguments for `ops` (all of one session): the TTL, then per op `S create id tenant dialect
/// created_at last_active message_count token_estimate head version strategy idle_notified`, `N id json`, `R record-id entry` or
/// `T turn-id json`. `record_ids` holds one id per record or turn op, fixed when the batch was queued so that a retry stores nothing twice.
pub(super) fn write_args(ops: &[&WriteOp], record_ids: &[String], ttl_ms: u64) -> Vec<String> {
    let mut args = vec![ttl_ms.to_string()];
    let mut rids = record_ids.iter();
    for op in ops {
        match op {
            WriteOp::Session { meta: m, create } => args.extend([
                "S".to_string(),
                if *create { "1" } else { "0" }.to_string(),
                m.id.clone(),
                m.tenant.clone(),
                m.dialect.clone(),
                m.created_at.to_string(),
                m.last_active.to_string(),
                m.message_count.to_string(),
                m.token_estimate.to_string(),
                m.head.clone().unwrap_or_default(),
                m.version.to_string(),
                m.strategy.clone().unwrap_or_default(),
                m.idle_notified.map(|t| t.to_string()).unwrap_or_default(),
            ]),
            WriteOp::Node { node, .. } => {
                args.extend(["N".to_string(), node.id.to_string(), node_json(node)])
            }
            WriteOp::Record { record, .. } => args.extend([
                "R".to_string(),
                rids.next().cloned().unwrap_or_default(),
                record_entry(record),
            ]),
            WriteOp::Turn { turn, .. } => args.extend([
                "T".to_string(),
                format!("t:{}", rids.next().cloned().unwrap_or_default()),
                turn.clone(),
            ]),
        }
    }
    args
}

/// Bytes of a Redis value (bulk or simple string).
pub(super) fn bytes(v: &RValue) -> Option<&[u8]> {
    match v {
        RValue::BulkString(b) => Some(b),
        RValue::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// The items of an array value (empty for anything else).
pub(super) fn items(v: &RValue) -> &[RValue] {
    match v {
        RValue::Array(a) | RValue::Set(a) => a,
        _ => &[],
    }
}

/// An integer value.
pub(super) fn int(v: &RValue) -> Option<i64> {
    match v {
        RValue::Int(i) => Some(*i),
        other => bytes(other).and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()),
    }
}

/// Field/value pairs of an HGETALL (a flat array, or a map under RESP3).
pub(super) fn pairs(v: &RValue) -> Vec<(String, &RValue)> {
    match v {
        RValue::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((String::from_utf8_lossy(bytes(k)?).into_owned(), v)))
            .collect(),
        other => items(other)
            .chunks(2)
            .filter_map(|c| match c {
                [k, v] => Some((String::from_utf8_lossy(bytes(k)?).into_owned(), v)),
                _ => None,
            })
            .collect(),
    }
}

/// A session row from its hash (`None` when it lacks its id).
pub(super) fn parse_meta(v: &RValue) -> Option<SessionMeta> {
    let f: HashMap<String, &RValue> = pairs(v).into_iter().collect();
    let text = |k: &str| {
        f.get(k)
            .and_then(|v| bytes(v))
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let num = |k: &str| f.get(k).and_then(|v| int(v)).unwrap_or(0);
    Some(SessionMeta {
        id: text("id")?,
        tenant: text("tenant").unwrap_or_default(),
        dialect: text("dialect").unwrap_or_else(|| "chat".into()),
        created_at: num("created_at"),
        last_active: num("last_active"),
        message_count: u64::try_from(num("message_count")).unwrap_or(0),
        token_estimate: u64::try_from(num("token_estimate")).unwrap_or(0),
        head: text("head").filter(|h| !h.is_empty()),
        version: u64::try_from(num("version")).unwrap_or(0),
        strategy: text("strategy").filter(|s| !s.is_empty()),
        idle_notified: f.get("idle_notified").and_then(|v| int(v)),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sessions_keys_share_its_hash_tag() {
        let k = Keys::new("ctxgate:");
        let keys = k.session("t1-abc");
        assert_eq!(keys[0], "ctxgate:{t1-abc}:meta");
        // The hash tag is the text between the first `{` and the next `}`: the session id, for every key.
        for key in &keys {
            let open = key.find('{').unwrap();
            let close = key[open..].find('}').unwrap() + open;
            assert_eq!(&key[open + 1..close], "t1-abc", "{key}");
        }
    }

    /// The hash tag Redis Cluster hashes for `key` (its slot): the text between the first `{` and the next `}`
    /// when that is not empty, else the whole key.
    fn cluster_tag(key: &str) -> &str {
        let Some(open) = key.find('{') else {
            return key;
        };
        match key[open + 1..].find('}') {
            Some(0) | None => key,
            Some(len) => &key[open + 1..open + 1 + len],
        }
    }

    #[test]
    fn every_id_gets_a_non_empty_hash_tag_shared_by_all_its_keys_and_no_two_ids_share_a_key() {
        let k = Keys::new("ctxgate:");
        let ids = [
            "t1-abc",
            "}",
            "}x",
            "}}",
            "",
            "{",
            "{}",
            "a}b",
            "x{}y",
            "}{",
            "~",
            "ä€😀",
            "anonymous-h0123",
        ];
        let mut seen = std::collections::HashSet::new();
        for id in ids {
            let mut keys = k.session(id).to_vec();
            keys.extend(k.lock(id, "summary"));
            let tag = cluster_tag(&keys[0]);
            assert!(
                !tag.is_empty() && tag != keys[0],
                "{id:?}: {} hashes as a whole",
                keys[0]
            );
            for key in &keys {
                assert_eq!(cluster_tag(key), tag, "{id:?}: {key} is in another slot");
                assert!(seen.insert(key.clone()), "{key} used by two ids");
            }
        }
        // Ids the gateway makes keep the layout they always had.
        assert_eq!(k.session("t1-abc")[0], "ctxgate:{t1-abc}:meta");
        assert_eq!(k.session("a}b")[0], "ctxgate:{a}b}:meta");
    }

    #[test]
    fn nodes_and_records_round_trip() {
        let n = NodeRow {
            id: Arc::from("n1"),
            parent: Some(Arc::from("p\"0")),
            position: 3,
            kind: NodeKind::Reply,
            partial: true,
            created_at: 42,
            message: Arc::new(json!({"role":"assistant","content":"x\ny"})),
        };
        assert_eq!(parse_node("n1", node_json(&n).as_bytes()).unwrap(), n);
        let r = Record::Internal(json!({"by":"ctxgate","a":[1]}));
        assert_eq!(parse_record(record_entry(&r).as_bytes()).unwrap(), r);
        assert!(parse_record(b"no newline").is_none());
    }
}
