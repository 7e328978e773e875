//! The Lua scripts of the Redis backend. Each runs on the keys of one session (they share the session's hash tag,
//! so one Cluster slot), which makes every batch of a session atomic on standalone Redis and on Cluster alike; only
//! on standalone Redis does the write script also touch the activity index.
//!
//! A session's keys (`KEYS`, in this order): `meta` (hash: the session row), `nodes` (hash: node id → node JSON),
//! `log` (list: node ids in the order they were stored, the session's append cursor), `records` (list: `kind`,
//! a newline, the record's JSON), `rids` (set: ids of the records and turns stored, so that a retried batch never
//! stores one twice), `turns` (list: the turn records' JSON, never loaded with the session).

use redis::Script;
use std::sync::LazyLock;

/// Applies one session's ops of a batch (`ARGV[1]`: TTL in ms, 0 for none; then the ops, see
/// `super::codec::write_args`). Nodes and records are only stored while the row exists; a row is replaced only by
/// a higher `version` (without `create`: only the row of the same tenant and creation time), so its `head` and
/// `message_count` (the length of the history to that head) always come from one writer. With a seventh key (standalone Redis: no slots to respect) the activity index is
/// updated here too. Returns the row's `last_active` (for the activity index), or nil when the session does not
/// exist.
pub(super) static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local ttl = tonumber(ARGV[1])
local i = 2
local function exists() return redis.call('EXISTS', KEYS[1]) == 1 end
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'S' then
    local create = ARGV[i + 1] == '1'
    local version = tonumber(ARGV[i + 10])
    if exists() then
      local cur = redis.call('HMGET', KEYS[1], 'version', 'tenant', 'created_at')
      local same = create or (cur[2] == ARGV[i + 3] and cur[3] == ARGV[i + 5])
      if same and version > tonumber(cur[1] or '0') then
        redis.call('HSET', KEYS[1], 'last_active', ARGV[i + 6], 'message_count', ARGV[i + 7],
          'token_estimate', ARGV[i + 8], 'head', ARGV[i + 9], 'version', ARGV[i + 10], 'strategy', ARGV[i + 11],
          'idle_notified', ARGV[i + 12])
      end
    elseif create then
      redis.call('HSET', KEYS[1], 'id', ARGV[i + 2], 'tenant', ARGV[i + 3], 'dialect', ARGV[i + 4],
        'created_at', ARGV[i + 5], 'last_active', ARGV[i + 6], 'message_count', ARGV[i + 7],
        'token_estimate', ARGV[i + 8], 'head', ARGV[i + 9], 'version', ARGV[i + 10], 'strategy', ARGV[i + 11],
        'idle_notified', ARGV[i + 12])
    end
    i = i + 13
  elseif op == 'N' then
    if exists() and redis.call('HSETNX', KEYS[2], ARGV[i + 1], ARGV[i + 2]) == 1 then
      redis.call('RPUSH', KEYS[3], ARGV[i + 1])
    end
    i = i + 3
  elseif op == 'R' then
    if exists() and redis.call('SADD', KEYS[5], ARGV[i + 1]) == 1 then
      redis.call('RPUSH', KEYS[4], ARGV[i + 2])
    end
    i = i + 3
  elseif op == 'T' then
    if exists() and redis.call('SADD', KEYS[5], ARGV[i + 1]) == 1 then
      redis.call('RPUSH', KEYS[6], ARGV[i + 2])
    end
    i = i + 3
  else
    return redis.error_reply('ctxgate: unknown op ' .. tostring(op))
  end
end
if not exists() then return false end
if ttl > 0 then
  for k = 1, 6 do redis.call('PEXPIRE', KEYS[k], ttl) end
end
local last_active = redis.call('HGET', KEYS[1], 'last_active')
if KEYS[7] then redis.call('ZADD', KEYS[7], 'GT', last_active, redis.call('HGET', KEYS[1], 'id')) end
return last_active
"#,
    )
});

/// A whole session: `{row (HGETALL), nodes (HGETALL), records (LRANGE)}`, or nil when there is no row.
pub(super) static LOAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), redis.call('LRANGE', KEYS[4], 0, -1)}
"#,
    )
});

/// What was appended since a cursor (`ARGV[1]`: log entries seen, `ARGV[2]`: records seen): `{row (HGETALL),
/// node ids from the cursor on (LRANGE log), records from the cursor on (LRANGE records), log length, records
/// length}`, or nil when there is no row. The node bodies are fetched only for the ids the caller lacks.
pub(super) static TAIL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return {redis.call('HGETALL', KEYS[1]), redis.call('LRANGE', KEYS[3], ARGV[1], -1),
  redis.call('LRANGE', KEYS[4], ARGV[2], -1), redis.call('LLEN', KEYS[3]), redis.call('LLEN', KEYS[4])}
"#,
    )
});

/// Deletes a session's keys; with `ARGV[1]` set, only when its row is idle since before that many unix seconds (or
/// gone). Returns 1 when a row was deleted.
pub(super) static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local la = redis.call('HGET', KEYS[1], 'last_active')
if ARGV[1] and la and tonumber(la) >= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', unpack(KEYS))
if la then return 1 end
return 0
"#,
    )
});

/// Takes a lock (`KEYS[1]`) with expiry (`ARGV[1]` ms) unless it is held: `SET NX PX` with a fencing token from the
/// session's counter (`KEYS[2]`, kept `ARGV[2]` ms). Returns the token, or 0 when the lock is held.
pub(super) static LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local token = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[1])
return token
"#,
    )
});

/// Releases a lock (`KEYS[1]`) only when it still holds the caller's token (`ARGV[1]`).
pub(super) static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#,
    )
});
