//! A session as JSON Lines, and back: a header line (the session's row and counts), then one line per message
//! node, record and turn. `export → delete → import → export` gives the same bytes but `exported_at`.

use super::migrate::all_turns;
use super::Sessions;
use crate::store::{
    committed, Compression, NodeKind, NodeRow, Record, SessionMeta, StoreError, StoredSession,
    WriteOp,
};
use serde_json::{json, Value};
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

fn invalid(line: usize, message: impl Into<String>) -> ImportError {
    ImportError::Invalid {
        line,
        message: message.into(),
    }
}

/// Parses and checks an export: the header first, every line of a known kind with the fields it needs, and as
/// many nodes, records and turns as the header counts.
pub fn parse(text: &[u8]) -> Result<Parsed, ImportError> {
    let text = std::str::from_utf8(text).map_err(|e| invalid(0, format!("not UTF-8: {e}")))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = lines.next().ok_or_else(|| invalid(1, "empty file"))?;
    let header: Value =
        serde_json::from_str(first).map_err(|e| invalid(1, format!("not JSON: {e}")))?;
    if header.get("ctxgate_export").and_then(Value::as_u64) != Some(FORMAT) {
        return Err(invalid(
            1,
            format!("not a ctxgate export (format {FORMAT}): the header must come first"),
        ));
    }
    let meta = header_meta(&header["session"]).map_err(|m| invalid(1, m))?;
    let mut p = Parsed {
        meta,
        nodes: Vec::new(),
        records: Vec::new(),
        turns: Vec::new(),
    };
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
            "node" => p.nodes.push(node(body).map_err(|m| invalid(n, m))?),
            "record" => p.records.push(record(body).map_err(|m| invalid(n, m))?),
            "turn" if body.is_object() => p.turns.push(body.to_string()),
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
    Ok(p)
}

fn header_meta(s: &Value) -> Result<SessionMeta, String> {
    let text = |k: &str| {
        s.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("session.{k} must be a string"))
    };
    let num = |k: &str| {
        s.get(k)
            .and_then(Value::as_i64)
            .ok_or_else(|| format!("session.{k} must be a number"))
    };
    let id = text("id")?;
    if id.is_empty() {
        return Err("session.id is empty".into());
    }
    Ok(SessionMeta {
        id,
        tenant: text("tenant")?,
        dialect: text("dialect")?,
        created_at: num("created_at")?,
        last_active: num("last_active")?,
        message_count: num("message_count")?.max(0) as u64,
        token_estimate: num("token_estimate")?.max(0) as u64,
        head: s.get("head").and_then(Value::as_str).map(str::to_string),
        version: num("version")?.max(0) as u64,
        strategy: match s.get("strategy") {
            None | Some(Value::Null) => None,
            Some(Value::String(v)) if crate::config::Strategy::parse(v).is_some() => {
                Some(v.clone())
            }
            Some(_) => return Err("session.strategy must be null or a strategy".into()),
        },
        idle_notified: s.get("idle_notified").and_then(Value::as_i64),
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
        created_at: v
            .get("created_at")
            .and_then(Value::as_i64)
            .ok_or("node.created_at must be a number")?,
        message: Arc::new(v.get("message").cloned().ok_or("node.message is missing")?),
    })
}

fn record(v: &Value) -> Result<Record, String> {
    let value = v.get("value").ok_or("record.value is missing")?;
    match v.get("kind").and_then(Value::as_str) {
        Some("compression") => serde_json::from_value::<Compression>(value.clone())
            .map(Record::from)
            .map_err(|e| format!("record.value is not a compression record: {e}")),
        Some("internal") if value.is_object() => Ok(Record::Internal(value.clone())),
        Some("internal") => Err("an internal record must be an object".into()),
        _ => Err("record.kind must be compression or internal".into()),
    }
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
