//! A session as JSON Lines, and back: a header line (the session's row and counts), then one line per message
//! node, record and turn. `export → delete → import → export` gives the same bytes but `exported_at`.

use super::migrate::all_turns;
use super::tree::node_id;
use super::Sessions;
use crate::store::{
    committed, Compression, NodeKind, NodeRow, Record, SessionMeta, StoreError, StoredSession,
    WriteOp,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The format's version, in the header's `ctxgate_export`.
pub const FORMAT: u64 = 1;

/// Session `id` as JSON Lines (`None`: no such session). Waits for the writes queued so far first, so that the
/// export holds every turn answered before it.
pub async fn export_session(sessions: &Sessions, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let store = sessions.store();
    committed(store.write(Vec::new())).await?;
    let Some(s) = store.load(id).await? else {
        return Ok(None);
    };
    let turns = all_turns(&**store, id).await?;
    Ok(Some(render(&s, &turns, super::manager::now_secs())))
}

/// The export of a loaded session and its turns (stored JSON text).
pub fn render(s: &StoredSession, turns: &[String], exported_at: i64) -> Vec<u8> {
    let m = &s.meta;
    let records = s.compressions.len() + s.internal.len();
    let header = json!({
        "ctxgate_export": FORMAT,
        "exported_at": exported_at,
        "session": {
            "id": m.id, "tenant": m.tenant, "dialect": m.dialect, "created_at": m.created_at,
            "last_active": m.last_active, "message_count": m.message_count,
            "token_estimate": m.token_estimate, "head": m.head, "version": m.version, "strategy": m.strategy, "idle_notified": m.idle_notified,
        },
        "counts": {"nodes": s.nodes.len(), "records": records, "turns": turns.len()},
    });
    let mut out = Vec::with_capacity(4096);
    let mut line = |v: &Value| {
        out.extend_from_slice(v.to_string().as_bytes());
        out.push(b'\n');
    };
    line(&header);
    let mut nodes: Vec<&NodeRow> = s.nodes.iter().collect();
    nodes.sort_by(|a, b| (a.position, a.created_at, &a.id).cmp(&(b.position, b.created_at, &b.id)));
    for n in nodes {
        line(&json!({"node": {
            "id": &*n.id, "parent": n.parent.as_deref(), "position": n.position, "kind": n.kind.as_str(),
            "partial": n.partial, "created_at": n.created_at, "message": &*n.message,
        }}));
    }
    for c in &s.compressions {
        let value = serde_json::to_value(c).unwrap_or(Value::Null);
        line(&json!({"record": {"kind": "compression", "value": value}}));
    }
    for v in &s.internal {
        line(&json!({"record": {"kind": "internal", "value": v}}));
    }
    for t in turns {
        let value: Value = serde_json::from_str(t).unwrap_or(Value::Null);
        line(&json!({"turn": value}));
    }
    out
}

/// Why an import was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file is not a valid export (line numbers from 1).
    #[error("line {line}: {message}")]
    Invalid {
        /// The offending line.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The session exists and `replace` was not asked for.
    #[error("session {0:?} exists; import with replace to overwrite it")]
    Exists(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an import wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Imported {
    /// The session.
    pub id: String,
    /// Nodes written.
    pub nodes: usize,
    /// Records written.
    pub records: usize,
    /// Turns written.
    pub turns: usize,
}

/// A parsed export, ready to write.
#[derive(Debug)]
pub struct Parsed {
    meta: SessionMeta,
    nodes: Vec<NodeRow>,
    records: Vec<Record>,
    turns: Vec<String>,
}

impl Parsed {
    /// The session's row.
    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }

    /// The session as a store returns it, and its turns (stored JSON text): what [`render`] exports.
    pub fn to_stored(&self) -> (StoredSession, Vec<String>) {
        let (mut compressions, mut internal) = (Vec::new(), Vec::new());
        for r in &self.records {
            match r {
                Record::Compression(c) => compressions.push((**c).clone()),
                Record::Internal(v) => internal.push(v.clone()),
            }
        }
        let s = StoredSession {
            meta: self.meta.clone(),
            nodes: self.nodes.clone(),
            compressions,
            internal,
        };
        (s, self.turns.clone())
    }
}

fn invalid(line: usize, message: impl Into<String>) -> ImportError {
    ImportError::Invalid {
        line,
        message: message.into(),
    }
}

/// The latest Unix seconds a timestamp may hold: the end of year 9999 (what a date can show).
pub const MAX_TIMESTAMP: i64 = 253_402_300_799;

/// The longest session id accepted (the gateway's own are at most 113 bytes: a 16-digit tenant prefix, `-`, and a
/// client's id of up to 96 bytes).
pub const MAX_ID_BYTES: usize = 128;

/// Why `id` is not a session id the gateway could have made, if it is not: 1 to [`MAX_ID_BYTES`] bytes of ASCII
/// letters, digits, `-`, `_`, `.` and `:` (a client's own id is kept only in that form, and hashed otherwise). So
/// it never holds the `{` `}` of a Redis Cluster hash tag, nor anything a URL path or a log line would need to
/// escape.
pub fn session_id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        Some("session.id is empty".into())
    } else if id.len() > MAX_ID_BYTES {
        Some(format!(
            "session.id is {} bytes long; at most {MAX_ID_BYTES}",
            id.len()
        ))
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        Some(format!(
            "session.id {id:?} is not an id a client can have: only ASCII letters, digits, `-`, `_`, `.` and `:`"
        ))
    } else {
        None
    }
}

/// A timestamp field: Unix seconds, a whole number from 0 to [`MAX_TIMESTAMP`].
fn timestamp(v: Option<&Value>, name: &str) -> Result<i64, String> {
    v.and_then(Value::as_i64)
        .filter(|t| (0..=MAX_TIMESTAMP).contains(t))
        .ok_or_else(|| {
            format!("{name} must be a timestamp (whole Unix seconds, 0 to {MAX_TIMESTAMP})")
        })
}

/// Line numbers (from 1) of what was parsed, for the checks on the whole file.
#[derive(Default)]
struct Lines {
    nodes: Vec<usize>,
    turns: Vec<usize>,
}

/// Parses and checks an export, as a whole, before anything is written: the header first, every line of a known
/// kind with the fields it needs (timestamps as whole Unix seconds), as many nodes, records and turns as the
/// header counts; then the history: node ids unique (a repeated id is refused, even with the same content), every
/// parent in the file, no parent cycle, every node's id the one its parent and message make ([`node_id`], as the
/// gateway computes it: an id kept for changed content would stand for a message the client never sent), the
/// header's head a node of the file, and every turn's head a node of the file (or empty) with its ranges inside
/// the path to it. The session id must be one a client could have (see
/// [`session_id_problem`]).
pub fn parse(text: &[u8]) -> Result<Parsed, ImportError> {
    let text = std::str::from_utf8(text).map_err(|e| invalid(0, format!("not UTF-8: {e}")))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (first_index, first) = lines.next().ok_or_else(|| invalid(1, "empty file"))?;
    let header_line = first_index + 1;
    let header: Value =
        serde_json::from_str(first).map_err(|e| invalid(header_line, format!("not JSON: {e}")))?;
    if header.get("ctxgate_export").and_then(Value::as_u64) != Some(FORMAT) {
        return Err(invalid(
            header_line,
            format!("not a ctxgate export (format {FORMAT}): the header must come first"),
        ));
    }
    let meta = header_meta(&header["session"]).map_err(|m| invalid(header_line, m))?;
    let mut p = Parsed {
        meta,
        nodes: Vec::new(),
        records: Vec::new(),
        turns: Vec::new(),
    };
    let mut at = Lines::default();
    for (i, l) in lines {
        let n = i + 1;
        let v: Value = serde_json::from_str(l).map_err(|e| invalid(n, format!("not JSON: {e}")))?;
        let Some((kind, body)) = v
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next())
        else {
            return Err(invalid(
                n,
                "expected one of {\"node\": …}, {\"record\": …}, {\"turn\": …}",
            ));
        };
        match kind.as_str() {
            "node" => {
                p.nodes.push(node(body).map_err(|m| invalid(n, m))?);
                at.nodes.push(n);
            }
            "record" => p.records.push(record(body).map_err(|m| invalid(n, m))?),
            "turn" if body.is_object() => {
                timestamp(body.get("at"), "turn.at").map_err(|m| invalid(n, m))?;
                p.turns.push(body.to_string());
                at.turns.push(n);
            }
            "turn" => return Err(invalid(n, "a turn must be an object")),
            other => return Err(invalid(n, format!("unknown line kind {other:?}"))),
        }
    }
    let counts = &header["counts"];
    for (name, got) in [
        ("nodes", p.nodes.len()),
        ("records", p.records.len()),
        ("turns", p.turns.len()),
    ] {
        let want = counts.get(name).and_then(Value::as_u64);
        if want != Some(got as u64) {
            return Err(invalid(
                text.lines().count(),
                format!("the header counts {want:?} {name}, the file has {got}: is it cut short?"),
            ));
        }
    }
    check_history(&p, &at, header_line)?;
    Ok(p)
}

/// The checks on the file as a whole (see [`parse`]).
fn check_history(p: &Parsed, at: &Lines, header_line: usize) -> Result<(), ImportError> {
    // Each node's index, by id; a repeated id is refused.
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(p.nodes.len());
    for (k, n) in p.nodes.iter().enumerate() {
        if let Some(first) = index.insert(&n.id, k) {
            return Err(invalid(
                at.nodes[k],
                format!(
                    "node id {:?} is already on line {}: every node is exported once",
                    n.id, at.nodes[first]
                ),
            ));
        }
    }
    for (k, n) in p.nodes.iter().enumerate() {
        if let Some(parent) = n.parent.as_deref().filter(|q| !index.contains_key(q)) {
            return Err(invalid(
                at.nodes[k],
                format!("node {:?}: its parent {parent:?} is not in the file", n.id),
            ));
        }
    }
    let lengths = path_lengths(&p.nodes, &index).map_err(|k| {
        invalid(
            at.nodes[k],
            format!(
                "node {:?} is its own ancestor: its parents loop",
                p.nodes[k].id
            ),
        )
    })?;
    for (k, n) in p.nodes.iter().enumerate() {
        let content = node_id(n.parent.as_deref(), &n.message);
        if *content != *n.id {
            return Err(invalid(
                at.nodes[k],
                format!(
                    "node {:?} is not the id of its content: its parent and message make {content:?}; node ids \
                     are content addresses, so an edited message needs a new id (and so do the nodes and turns \
                     that name it)",
                    n.id
                ),
            ));
        }
    }
    let length_of = |id: &str| index.get(id).map(|&k| lengths[k]);
    if let Some(head) = &p.meta.head {
        if length_of(head).is_none() {
            return Err(invalid(
                header_line,
                format!("session.head {head:?} is not a node of the file"),
            ));
        }
    }
    for (k, turn) in p.turns.iter().enumerate() {
        let v: Value = serde_json::from_str(turn).unwrap_or(Value::Null);
        check_turn(&v, &length_of).map_err(|m| invalid(at.turns[k], m))?;
    }
    Ok(())
}

/// The length of the path to each node (by index), or the index of a node on a parent cycle. Every parent is in
/// `index`.
fn path_lengths(nodes: &[NodeRow], index: &HashMap<&str, usize>) -> Result<Vec<usize>, usize> {
    const UNKNOWN: usize = 0;
    const FOLLOWING: usize = usize::MAX;
    let mut len = vec![UNKNOWN; nodes.len()];
    for start in 0..nodes.len() {
        let mut chain = Vec::new();
        let mut cur = Some(start);
        // Up until a node whose length is known (or a root's parent).
        let mut base = 0;
        while let Some(k) = cur {
            match len[k] {
                FOLLOWING => {
                    // Back on the chain being followed: the smallest index on the cycle.
                    let from = chain.iter().position(|&c| c == k).unwrap_or(0);
                    return Err(chain[from..].iter().copied().min().unwrap_or(k));
                }
                UNKNOWN => {
                    len[k] = FOLLOWING;
                    chain.push(k);
                    cur = nodes[k]
                        .parent
                        .as_deref()
                        .and_then(|q| index.get(q).copied());
                }
                known => {
                    base = known;
                    cur = None;
                }
            }
        }
        for (depth, &k) in chain.iter().rev().enumerate() {
            len[k] = base + depth + 1;
        }
    }
    Ok(len)
}

/// One turn against the history: `head` a node of the file (or empty: a request without messages), the
/// positions its segments name inside the path to it, ranges forwards and, together, at most the path's length.
fn check_turn(v: &Value, length_of: &dyn Fn(&str) -> Option<usize>) -> Result<(), String> {
    let head = v
        .get("head")
        .and_then(Value::as_str)
        .ok_or("turn.head must be a string")?;
    let len = if head.is_empty() {
        0
    } else {
        length_of(head).ok_or_else(|| format!("turn.head {head:?} is not a node of the file"))?
    } as u64;
    let segments = match v.get("sent") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("turn.sent must be an array".into()),
    };
    let position = |k: usize, name: &str, p: &Value| {
        match p.as_u64() {
        Some(p) if p < len => Ok(()),
        _ => Err(format!(
            "turn.sent[{k}].{name} {p} is not a position of the history ({len} messages to turn.head)"
        )),
    }
    };
    let mut referenced = 0u64;
    for (k, s) in segments.iter().enumerate() {
        if s.get("literal").is_some() {
            if let Some(p) = s.get("at") {
                position(k, "at", p)?;
            }
            match s.get("replaces") {
                None | Some(Value::Null) => {}
                Some(Value::Array(r)) => {
                    for p in r {
                        position(k, "replaces", p)?;
                    }
                }
                Some(_) => return Err(format!("turn.sent[{k}].replaces must be an array")),
            }
            continue;
        }
        let (Some(from), Some(to)) = (
            s.get("from").and_then(Value::as_u64),
            s.get("to").and_then(Value::as_u64),
        ) else {
            return Err(format!(
                "turn.sent[{k}] is neither a range (from, to) nor a literal"
            ));
        };
        if from > to {
            return Err(format!("turn.sent[{k}]: range {from}..{to} runs backwards"));
        }
        if to > len {
            return Err(format!(
                "turn.sent[{k}]: range {from}..{to} reaches beyond the history ({len} messages to turn.head)"
            ));
        }
        referenced += to - from;
        if referenced > len {
            return Err(format!(
                "turn.sent[{k}]: range {from}..{to} sends messages of the history ({len}) a second time"
            ));
        }
    }
    Ok(())
}

fn header_meta(s: &Value) -> Result<SessionMeta, String> {
    let text = |k: &str| {
        s.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("session.{k} must be a string"))
    };
    let count = |k: &str| {
        s.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("session.{k} must be a whole number, 0 or more"))
    };
    let id = text("id")?;
    if let Some(problem) = session_id_problem(&id) {
        return Err(problem);
    }
    let dialect = text("dialect")?;
    if !super::manager::DIALECT_NAMES.contains(&dialect.as_str()) {
        return Err(format!(
            "session.dialect {dialect:?} is none of {}",
            super::manager::DIALECT_NAMES.join(", ")
        ));
    }
    Ok(SessionMeta {
        id,
        tenant: text("tenant")?,
        dialect,
        created_at: timestamp(s.get("created_at"), "session.created_at")?,
        last_active: timestamp(s.get("last_active"), "session.last_active")?,
        message_count: count("message_count")?,
        token_estimate: count("token_estimate")?,
        head: match s.get("head") {
            None | Some(Value::Null) => None,
            Some(Value::String(h)) => Some(h.clone()),
            Some(_) => return Err("session.head must be a node id or null".into()),
        },
        version: count("version")?,
        strategy: match s.get("strategy") {
            None | Some(Value::Null) => None,
            Some(Value::String(v)) if crate::config::Strategy::parse(v).is_some() => {
                Some(v.clone())
            }
            Some(_) => return Err("session.strategy must be null or a strategy".into()),
        },
        idle_notified: match s.get("idle_notified") {
            None | Some(Value::Null) => None,
            t => Some(timestamp(t, "session.idle_notified")?),
        },
    })
}

fn node(v: &Value) -> Result<NodeRow, String> {
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or("node.id must be a string")?;
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("node.kind must be a string")?;
    if !matches!(kind, "client" | "reply") {
        return Err(format!("node.kind {kind:?} is neither client nor reply"));
    }
    let position = v
        .get("position")
        .and_then(Value::as_u64)
        .ok_or("node.position must be a number")?;
    Ok(NodeRow {
        id: Arc::from(id),
        parent: match v.get("parent") {
            None | Some(Value::Null) => None,
            Some(Value::String(p)) => Some(Arc::from(p.as_str())),
            Some(_) => return Err("node.parent must be a string or null".into()),
        },
        position: u32::try_from(position).map_err(|_| "node.position is too large")?,
        kind: NodeKind::parse(kind),
        partial: v.get("partial").and_then(Value::as_bool).unwrap_or(false),
        created_at: timestamp(v.get("created_at"), "node.created_at")?,
        message: Arc::new(v.get("message").cloned().ok_or("node.message is missing")?),
    })
}

fn record(v: &Value) -> Result<Record, String> {
    let value = v.get("value").ok_or("record.value is missing")?;
    let r = match v.get("kind").and_then(Value::as_str) {
        Some("compression") => serde_json::from_value::<Compression>(value.clone())
            .map(Record::from)
            .map_err(|e| format!("record.value is not a compression record: {e}"))?,
        Some("internal") if value.is_object() => Record::Internal(value.clone()),
        Some("internal") => return Err("an internal record must be an object".into()),
        _ => return Err("record.kind must be compression or internal".into()),
    };
    let at = match &r {
        Record::Compression(c) => serde_json::to_value(c)
            .ok()
            .and_then(|c| c.get("at").cloned()),
        Record::Internal(v) => v.get("at").cloned(),
    };
    if let Some(at) = at {
        timestamp(Some(&at), "record.value.at")?;
    }
    Ok(r)
}

/// Writes a parsed export as one batch. An existing session is refused unless `replace`, which deletes it first.
pub async fn import(
    sessions: &Sessions,
    p: Parsed,
    replace: bool,
) -> Result<Imported, ImportError> {
    let id = p.meta.id.clone();
    if sessions.entry(&id).await?.is_some() {
        if !replace {
            return Err(ImportError::Exists(id));
        }
        sessions.delete(&id).await?;
    }
    let done = Imported {
        id: id.clone(),
        nodes: p.nodes.len(),
        records: p.records.len(),
        turns: p.turns.len(),
    };
    let at = p.meta.last_active;
    let mut ops = Vec::with_capacity(1 + done.nodes + done.records + done.turns);
    ops.push(WriteOp::Session {
        meta: p.meta,
        create: true,
    });
    ops.extend(p.nodes.into_iter().map(|node| WriteOp::Node {
        session: id.clone(),
        node,
    }));
    ops.extend(p.records.into_iter().map(|record| WriteOp::Record {
        session: id.clone(),
        created_at: record_time(&record).unwrap_or(at),
        record,
    }));
    ops.extend(p.turns.into_iter().map(|turn| WriteOp::Turn {
        session: id.clone(),
        turn,
    }));
    committed(sessions.store().write(ops)).await?;
    Ok(done)
}

/// The time a record carries (`at`), if any.
fn record_time(r: &Record) -> Option<i64> {
    let v = match r {
        Record::Compression(c) => serde_json::to_value(c).ok()?,
        Record::Internal(v) => v.clone(),
    };
    v.get("at").and_then(Value::as_i64)
}
