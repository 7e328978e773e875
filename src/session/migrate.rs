//! Moving every session from one store to another (`ctxgate sessions migrate`, e.g. SQLite → Redis when going
//! from one instance to several, and back): rows, nodes and records, with the tenant secret (without it the moved
//! sessions would no longer match their callers), verified by counts. Run it with the gateways stopped: sessions
//! written meanwhile may be missed.

use super::tenant;
use crate::config::StoreConfig;
use crate::store::{self, committed, Record, Store, WriteOp};

/// Sessions listed per page while collecting the source's ids.
const PAGE: u32 = 500;

/// What was moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Sessions copied.
    pub sessions: u64,
    /// Message nodes copied (all branches).
    pub nodes: u64,
    /// Records copied (compressions and internal exchanges).
    pub records: u64,
    /// Turn records copied.
    pub turns: u64,
}

/// Every turn record of session `id` in `src`, oldest first.
pub async fn all_turns(src: &dyn Store, id: &str) -> Result<Vec<String>, crate::store::StoreError> {
    let mut out = Vec::new();
    loop {
        let (page, total) = src.turns(id, out.len() as u64, PAGE).await?;
        let done = page.is_empty();
        out.extend(page);
        if done || out.len() as u64 >= total {
            return Ok(out);
        }
    }
}

/// Copies every session of `from` into `to` (rows created there, newer rows kept), then checks that each one has
/// as many nodes and records there as in the source. Stores are opened here; `to` adopts `from`'s tenant secret.
pub async fn migrate(from: &StoreConfig, to: &StoreConfig) -> Result<Migrated, String> {
    let secret = tenant::store_secret_hex(from).map_err(|e| format!("source: {e}"))?;
    tenant::adopt_secret(to, &secret).map_err(|e| format!("target: {e}"))?;
    // The source is only read (not locked); the target is written (a SQLite one is locked).
    let src = store::open_reader(from).map_err(|e| format!("source: {e}"))?;
    let dst = store::open(to).map_err(|e| format!("target: {e}"))?;
    copy_all(&*src, &*dst).await
}

/// Copies and verifies (see [`migrate`]) between open stores.
pub async fn copy_all(src: &dyn Store, dst: &dyn Store) -> Result<Migrated, String> {
    let mut ids = Vec::new();
    loop {
        let (page, _) = src
            .list(PAGE, ids.len() as u64)
            .await
            .map_err(|e| format!("listing the source: {e}"))?;
        if page.is_empty() {
            break;
        }
        ids.extend(page.into_iter().map(|m| m.id));
    }
    let mut done = Migrated::default();
    let mut expected = Vec::with_capacity(ids.len());
    for id in &ids {
        let Some(s) = src
            .load(id)
            .await
            .map_err(|e| format!("loading {id}: {e}"))?
        else {
            continue; // deleted meanwhile
        };
        let (nodes, records) = (s.nodes.len(), s.compressions.len() + s.internal.len());
        let turns = all_turns(src, id)
            .await
            .map_err(|e| format!("loading the turns of {id}: {e}"))?;
        let turn_count = turns.len();
        let at = s.meta.last_active;
        let mut ops = vec![WriteOp::Session {
            meta: s.meta,
            create: true,
        }];
        ops.extend(s.nodes.into_iter().map(|node| WriteOp::Node {
            session: id.clone(),
            node,
        }));
        let record = |record: Record| WriteOp::Record {
            session: id.clone(),
            created_at: at,
            record,
        };
        ops.extend(s.compressions.into_iter().map(|c| record(Record::from(c))));
        ops.extend(s.internal.into_iter().map(|v| record(Record::Internal(v))));
        ops.extend(turns.into_iter().map(|turn| WriteOp::Turn {
            session: id.clone(),
            turn,
        }));
        committed(dst.write(ops))
            .await
            .map_err(|e| format!("writing {id}: {e}"))?;
        done.sessions += 1;
        done.nodes += nodes as u64;
        done.records += records as u64;
        done.turns += turn_count as u64;
        expected.push((id, nodes, records, turn_count));
    }
    for (id, nodes, records, turns) in expected {
        let got = dst
            .load(id)
            .await
            .map_err(|e| format!("verifying {id}: {e}"))?
            .ok_or_else(|| format!("verifying {id}: missing in the target"))?;
        let got_records = got.compressions.len() + got.internal.len();
        let (_, got_turns) = dst
            .turns(id, 0, 0)
            .await
            .map_err(|e| format!("verifying {id}: {e}"))?;
        if (got_turns as usize) < turns {
            return Err(format!(
                "verifying {id}: {got_turns} turns in the target, {turns} in the source"
            ));
        }
        // At least as many: a target that had the session already keeps its own records too.
        if got.nodes.len() != nodes || got_records < records {
            return Err(format!(
                "verifying {id}: {} nodes and {got_records} records in the target, {nodes} and {records} in \
                 the source",
                got.nodes.len()
            ));
        }
    }
    Ok(done)
}

/// A store named on the command line, over the configured one: `sqlite:PATH`, `redis://…` / `rediss://…`
/// (standalone Redis, the configured prefix), or `config` (the configured store as it is, e.g. a Redis Cluster).
pub fn store_spec(spec: &str, base: &StoreConfig) -> Result<StoreConfig, String> {
    let mut cfg = base.clone();
    if spec == "config" {
        return Ok(cfg);
    }
    if let Some(path) = spec.strip_prefix("sqlite:") {
        if path.is_empty() {
            return Err("sqlite: needs a path (sqlite:/var/lib/ctxgate/ctxgate.db)".into());
        }
        cfg.backend = crate::config::StoreBackend::Sqlite;
        cfg.path = path.into();
        return Ok(cfg);
    }
    if spec.starts_with("redis://") || spec.starts_with("rediss://") {
        redis::Client::open(spec)
            .map_err(|e| format!("{:?}: {e}", crate::config::mask_url_password(spec)))?;
        cfg.backend = crate::config::StoreBackend::Redis;
        cfg.redis_url = spec.to_string();
        cfg.redis_cluster_nodes = Vec::new();
        return Ok(cfg);
    }
    Err(format!(
        "unknown store {:?}: sqlite:PATH, redis://host:port/db, rediss://… or config",
        crate::config::mask_url_password(spec)
    ))
}
