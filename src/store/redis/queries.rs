//! The Redis backend's operations on the server: applying a write batch, loading a whole session, what was appended
//! since a cursor, a page of the activity index, deleting one session and purging idle ones.

use super::codec::{self, Keys};
use super::conn::Conn;
use super::scripts;
use crate::store::{Cursor, Fresh, NodeRow, Record, SessionMeta, StoredSession, Tail, WriteOp};
use redis::{RedisError, Value as RValue};
use std::time::Instant;

/// Session ids read from the activity index per round trip when purging.
const PURGE_CHUNK: isize = 200;

/// A whole session (one script: a consistent snapshot).
pub(super) async fn load(
    conn: &Conn,
    keys: &Keys,
    id: &str,
) -> Result<Option<StoredSession>, RedisError> {
    let mut inv = scripts::LOAD.prepare_invoke();
    for k in keys.session(id) {
        inv.key(k);
    }
    let v: RValue = conn.script(&inv).await?;
    let parts = codec::items(&v);
    let [meta, nodes, records] = parts else {
        return Ok(None);
    };
    let Some(meta) = codec::parse_meta(meta) else {
        return Ok(None);
    };
    let nodes: Vec<NodeRow> = codec::pairs(nodes)
        .into_iter()
        .filter_map(|(nid, json)| {
            let n = codec::parse_node(&nid, codec::bytes(json)?);
            if n.is_none() {
                tracing::warn!(session = %id, "redis: unreadable node skipped");
            }
            n
        })
        .collect();
    let (mut compressions, mut internal) = (Vec::new(), Vec::new());
    for r in codec::items(records) {
        match codec::bytes(r).and_then(codec::parse_record) {
            Some(Record::Compression(c)) => compressions.push(*c),
            Some(Record::Internal(v)) => internal.push(v),
            None => tracing::warn!(session = %id, "redis: unreadable record skipped"),
        }
    }
    Ok(Some(StoredSession {
        meta,
        nodes,
        compressions,
        internal,
    }))
}

/// What was appended to session `id` since `since`: one script for the row, the new node ids and records; then
/// the bodies of the nodes the caller lacks (`have`), when there are any.
pub(super) async fn tail(
    conn: &Conn,
    keys: &Keys,
    id: &str,
    since: Cursor,
    have: Box<dyn Fn(&str) -> bool + Send + Sync>,
) -> Result<Fresh, RedisError> {
    let session = keys.session(id);
    let mut inv = scripts::TAIL.prepare_invoke();
    for k in &session {
        inv.key(k);
    }
    inv.arg(since.nodes).arg(since.records);
    let v: RValue = conn.script(&inv).await?;
    let [meta, ids, records, log_len, records_len] = codec::items(&v) else {
        return Ok(Fresh::Gone);
    };
    let Some(meta) = codec::parse_meta(meta) else {
        return Ok(Fresh::Gone);
    };
    let missing: Vec<String> = codec::items(ids)
        .iter()
        .filter_map(|i| codec::bytes(i).map(|b| String::from_utf8_lossy(b).into_owned()))
        .filter(|i| !have(i))
        .collect();
    let mut nodes = Vec::with_capacity(missing.len());
    if !missing.is_empty() {
        let bodies: Vec<Option<Vec<u8>>> = conn
            .query(redis::cmd("HMGET").arg(&session[1]).arg(&missing))
            .await?;
        for (nid, body) in missing.iter().zip(bodies) {
            match body.and_then(|b| codec::parse_node(nid, &b)) {
                Some(n) => nodes.push(n),
                None => tracing::warn!(session = %id, "redis: unreadable node skipped"),
            }
        }
    }
    let records = codec::items(records)
        .iter()
        .filter_map(|r| codec::bytes(r).and_then(codec::parse_record))
        .collect();
    let cursor = Cursor {
        nodes: codec::int(log_len)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(since.nodes),
        records: codec::int(records_len)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(since.records),
    };
    Ok(Fresh::Tail(Box::new(Tail {
        meta,
        nodes,
        records,
        cursor,
    })))
}

/// A page of a session's turn records, and how many there are.
pub(super) async fn turns(
    conn: &Conn,
    keys: &Keys,
    id: &str,
    offset: u64,
    limit: u32,
) -> Result<(Vec<String>, u64), RedisError> {
    let key = &keys.session(id)[5];
    let start = isize::try_from(offset).unwrap_or(isize::MAX);
    let stop = start.saturating_add(limit as isize - 1);
    let total: u64 = conn.query(redis::cmd("LLEN").arg(key)).await?;
    if limit == 0 || offset >= total {
        return Ok((Vec::new(), total));
    }
    let page: Vec<String> = conn
        .query(redis::cmd("LRANGE").arg(key).arg(start).arg(stop))
        .await?;
    Ok((page, total))
}

/// Deletes a session's keys (with `idle_before`: only when idle since before then) and its index entry.
pub(super) async fn delete(
    conn: &Conn,
    keys: &Keys,
    id: &str,
    idle_before: Option<i64>,
) -> Result<bool, RedisError> {
    let mut inv = scripts::DELETE.prepare_invoke();
    for k in keys.session(id) {
        inv.key(k);
    }
    if let Some(b) = idle_before {
        inv.arg(b);
    }
    let deleted: i64 = conn.script(&inv).await?;
    let active: Option<i64> = match idle_before {
        Some(_) if deleted == 0 => {
            conn.query(
                redis::cmd("HGET")
                    .arg(&keys.session(id)[0])
                    .arg("last_active"),
            )
            .await?
        }
        _ => None,
    };
    match active {
        // Active again since: its index entry catches up with the row.
        Some(la) => {
            conn.query::<i64>(
                redis::cmd("ZADD")
                    .arg(keys.index())
                    .arg("GT")
                    .arg(la)
                    .arg(id),
            )
            .await?
        }
        None => {
            conn.query::<i64>(redis::cmd("ZREM").arg(keys.index()).arg(id))
                .await?
        }
    };
    Ok(deleted == 1)
}

/// A page of the activity index, newest first, with each row; ids whose row is gone are dropped from the index.
pub(super) async fn list(
    conn: &Conn,
    keys: &Keys,
    limit: u32,
    offset: u64,
) -> Result<(Vec<SessionMeta>, u64), RedisError> {
    let mut out = Vec::new();
    let mut total: u64 = conn.query(redis::cmd("ZCARD").arg(keys.index())).await?;
    if limit == 0 {
        return Ok((out, total));
    }
    let start = isize::try_from(offset).unwrap_or(isize::MAX);
    let stop = start.saturating_add(limit as isize - 1);
    let ids: Vec<String> = conn
        .query(
            redis::cmd("ZRANGE")
                .arg(keys.index())
                .arg(start)
                .arg(stop)
                .arg("REV"),
        )
        .await?;
    let rows = futures_util::future::join_all(ids.iter().map(|id| {
        let key = keys.session(id)[0].clone();
        async move { conn.query::<RValue>(redis::cmd("HGETALL").arg(key)).await }
    }))
    .await;
    for (id, row) in ids.iter().zip(rows) {
        match codec::parse_meta(&row?) {
            Some(m) => out.push(m),
            None => {
                conn.query::<i64>(redis::cmd("ZREM").arg(keys.index()).arg(id))
                    .await?;
                total = total.saturating_sub(1);
            }
        }
    }
    // Equal activity: by id, as SQLite orders them.
    out.sort_by(|a, b| {
        b.last_active
            .cmp(&a.last_active)
            .then_with(|| a.id.cmp(&b.id))
    });
    Ok((out, total))
}

/// Deletes the sessions idle since before `before`: the index's ids with a lower score, each checked against its
/// row (a session active again meanwhile is kept).
pub(super) async fn purge(conn: &Conn, keys: &Keys, before: i64) -> Result<u64, RedisError> {
    let mut purged = 0;
    loop {
        let ids: Vec<String> = conn
            .query(
                redis::cmd("ZRANGE")
                    .arg(keys.index())
                    .arg("-inf")
                    .arg(format!("({before}"))
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(PURGE_CHUNK),
            )
            .await?;
        if ids.is_empty() {
            return Ok(purged);
        }
        // Each id leaves the range: deleted, dropped from the index, or moved up to its newer activity.
        for id in &ids {
            if delete(conn, keys, id, Some(before)).await? {
                purged += 1;
            }
        }
    }
}

/// Applies a batch: the write script once per session it touches (in the order the sessions first appear), then
/// (on Cluster) the activity index. A batch of one session (the manager's) is atomic; the index is best effort (a failure to
/// update it is logged, and repaired by the session's next write).
pub(super) async fn apply(
    conn: &Conn,
    keys: &Keys,
    ops: &[WriteOp],
    record_ids: &[String],
    ttl_ms: u64,
) -> Result<(), RedisError> {
    let started = Instant::now();
    let mut sessions: Vec<&str> = Vec::new();
    for op in ops {
        let s = codec::op_session(op);
        if !sessions.contains(&s) {
            sessions.push(s);
        }
    }
    // Record ids in the order of the record ops, split by session.
    let mut rid = record_ids.iter();
    let mut by_session: Vec<(&str, Vec<&WriteOp>, Vec<String>)> = sessions
        .iter()
        .map(|s| (*s, Vec::new(), Vec::new()))
        .collect();
    for op in ops {
        let s = codec::op_session(op);
        if let Some(entry) = by_session.iter_mut().find(|(k, _, _)| *k == s) {
            entry.1.push(op);
            if codec::needs_id(op) {
                entry.2.push(rid.next().cloned().unwrap_or_default());
            }
        }
    }
    for (session, ops, rids) in by_session {
        let mut inv = scripts::WRITE.prepare_invoke();
        for k in keys.session(session) {
            inv.key(k);
        }
        // Standalone: the index is updated by the script itself (one round trip); on Cluster it is another slot.
        let standalone = conn.standalone();
        if standalone {
            inv.key(keys.index());
        }
        for a in codec::write_args(&ops, &rids, ttl_ms) {
            inv.arg(a);
        }
        let last_active: Option<i64> = conn.script(&inv).await?;
        if let Some(score) = last_active.filter(|_| !standalone) {
            let zadd = redis::cmd("ZADD")
                .arg(keys.index())
                .arg("GT")
                .arg(score)
                .arg(session)
                .clone();
            if let Err(e) = conn.query::<i64>(&zadd).await {
                tracing::warn!(error = %e, "redis: the activity index was not updated");
            }
        }
    }
    tracing::trace!(
        elapsed_us = started.elapsed().as_micros() as u64,
        "redis: batch applied"
    );
    Ok(())
}
