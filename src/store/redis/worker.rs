//! The Redis writer: one task applying queued commands, each session in its own lane (its batches, loads and
//! deletes in the order they were queued, one at a time), all lanes at once over the multiplexed connection. A
//! batch that failed for a transient reason stays at the head of its lane and is retried with backoff, holding
//! back only its session; a barrier resolves once every batch queued before it is committed.

use super::codec::{self, Keys};
use super::conn::{transient, Conn};
use crate::metrics::{StoreMetrics, StoreOp};
use crate::store::{StoreError, StoredSession, WriteOp};
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::RedisError;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// First wait before retrying a batch that failed for a transient reason; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between retries.
const RETRY_MAX: Duration = Duration::from_secs(2);

pub(super) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A command for the writer.
pub(super) enum Cmd {
    /// A batch (empty: a barrier), with one id per record op.
    Write(Vec<WriteOp>, Vec<String>, Reply<()>),
    /// Load a session (after its queued batches).
    Load(String, Reply<Option<StoredSession>>),
    /// Delete a session (after its queued batches; its batches waiting for a retry are dropped).
    Delete(String, Reply<bool>),
}

enum Job {
    Write {
        ops: Arc<Vec<WriteOp>>,
        record_ids: Arc<Vec<String>>,
        reply: Reply<()>,
        seq: u64,
    },
    Load(Reply<Option<StoredSession>>),
    Delete(Reply<bool>),
}

enum Outcome {
    Write(Result<(), RedisError>),
    /// Boxed: a loaded session is much larger than the other outcomes.
    Load(Box<Result<Option<StoredSession>, RedisError>>),
    Delete(Result<bool, RedisError>),
}

#[derive(Default)]
struct Lane {
    jobs: VecDeque<Job>,
    running: bool,
    /// When the running job started (for the latency metric).
    started: Option<Instant>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

pub(super) struct Worker {
    conn: Conn,
    keys: Keys,
    ttl_ms: u64,
    metrics: StoreMetrics,
    /// Write batches queued and not finished (the store refuses new ones at `store.queue_capacity`).
    queued: Arc<AtomicUsize>,
    lanes: HashMap<String, Lane>,
    running: FuturesUnordered<BoxFuture<'static, (String, Outcome)>>,
    /// Sequence numbers of the write batches not finished yet.
    pending: BTreeSet<u64>,
    /// Barriers: answered once no batch queued before them is pending.
    barriers: Vec<(u64, Reply<()>)>,
    next_seq: u64,
}

impl Worker {
    pub(super) fn new(
        conn: Conn,
        keys: Keys,
        ttl_ms: u64,
        metrics: StoreMetrics,
        queued: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            conn,
            keys,
            ttl_ms,
            metrics,
            queued,
            lanes: HashMap::new(),
            running: FuturesUnordered::new(),
            pending: BTreeSet::new(),
            barriers: Vec::new(),
            next_seq: 0,
        }
    }

    /// Runs until the store is dropped and every lane is empty (batches still failing then are given up, logged).
    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut open = true;
        loop {
            if !open && self.running.is_empty() {
                let waiting = self.lanes.values().any(|l| !l.jobs.is_empty());
                if !waiting {
                    break;
                }
                // Closed with batches still failing: one last attempt each, then they are given up.
                if self
                    .lanes
                    .values()
                    .all(|l| l.retry_at.is_some() && !l.running)
                {
                    self.give_up();
                    break;
                }
            }
            let next_retry = self.lanes.values().filter_map(|l| l.retry_at).min();
            tokio::select! {
                cmd = rx.recv(), if open => match cmd {
                    Some(cmd) => self.accept(cmd),
                    None => open = false,
                },
                Some((lane, outcome)) = self.running.next(), if !self.running.is_empty() => {
                    self.finished(lane, outcome);
                }
                _ = sleep_until(next_retry), if next_retry.is_some() => {
                    let now = Instant::now();
                    let due: Vec<String> = self
                        .lanes
                        .iter()
                        .filter(|(_, l)| l.retry_at.is_some_and(|at| at <= now))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for id in due {
                        if let Some(l) = self.lanes.get_mut(&id) {
                            l.retry_at = None;
                        }
                        self.start(&id);
                    }
                }
            }
        }
    }

    fn give_up(&mut self) {
        let lanes = std::mem::take(&mut self.lanes);
        let batches: usize = lanes.values().map(|l| l.jobs.len()).sum();
        tracing::error!(
            batches,
            "redis: writes still failing when the store closed were lost"
        );
        for job in lanes.into_values().flat_map(|l| l.jobs) {
            match job {
                Job::Write { reply, .. } => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    let _ = reply.send(Err(StoreError::Closed));
                }
                Job::Load(r) => drop(r.send(Err(StoreError::Closed))),
                Job::Delete(r) => drop(r.send(Err(StoreError::Closed))),
            }
        }
        for (_, r) in self.barriers.drain(..) {
            let _ = r.send(Err(StoreError::Closed));
        }
    }

    fn accept(&mut self, cmd: Cmd) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let (lane, job) = match cmd {
            Cmd::Write(ops, _, reply) if ops.is_empty() => {
                self.barriers.push((seq, reply));
                self.answer_barriers();
                return;
            }
            Cmd::Write(ops, record_ids, reply) => {
                self.pending.insert(seq);
                let lane = codec::op_session(&ops[0]).to_string();
                let job = Job::Write {
                    ops: Arc::new(ops),
                    record_ids: Arc::new(record_ids),
                    reply,
                    seq,
                };
                (lane, job)
            }
            Cmd::Load(id, reply) => (id, Job::Load(reply)),
            Cmd::Delete(id, reply) => {
                self.forget_retries(&id);
                (id, Job::Delete(reply))
            }
        };
        self.lanes
            .entry(lane.clone())
            .or_default()
            .jobs
            .push_back(job);
        self.start(&lane);
    }

    /// A session deleted while its batches wait for a retry: they would only be dropped, so answer them now.
    fn forget_retries(&mut self, id: &str) {
        let Some(lane) = self.lanes.get_mut(id) else {
            return;
        };
        if lane.retry_at.is_none() || lane.running {
            return;
        }
        lane.retry_at = None;
        let mut kept = VecDeque::new();
        for job in lane.jobs.drain(..) {
            match job {
                Job::Write { reply, seq, .. } => {
                    self.pending.remove(&seq);
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    let _ = reply.send(Ok(()));
                }
                other => kept.push_back(other),
            }
        }
        lane.jobs = kept;
        self.answer_barriers();
    }

    /// Starts the head job of lane `id` unless one is running or waiting for its retry.
    fn start(&mut self, id: &str) {
        let Some(lane) = self.lanes.get_mut(id) else {
            return;
        };
        if lane.running || lane.retry_at.is_some() {
            return;
        }
        let Some(job) = lane.jobs.front() else {
            self.lanes.remove(id);
            return;
        };
        lane.running = true;
        lane.started = Some(Instant::now());
        let (conn, keys, ttl, key) = (
            self.conn.clone(),
            self.keys.clone(),
            self.ttl_ms,
            id.to_string(),
        );
        let fut: BoxFuture<'static, (String, Outcome)> = match job {
            Job::Write {
                ops, record_ids, ..
            } => {
                let (ops, rids) = (ops.clone(), record_ids.clone());
                Box::pin(async move {
                    let r = super::queries::apply(&conn, &keys, &ops, &rids, ttl).await;
                    (key, Outcome::Write(r))
                })
            }
            Job::Load(_) => Box::pin(async move {
                let r = super::queries::load(&conn, &keys, &key).await;
                (key, Outcome::Load(Box::new(r)))
            }),
            Job::Delete(_) => Box::pin(async move {
                let r = super::queries::delete(&conn, &keys, &key, None).await;
                (key, Outcome::Delete(r))
            }),
        };
        self.running.push(fut);
    }

    fn finished(&mut self, id: String, outcome: Outcome) {
        let Some(lane) = self.lanes.get_mut(&id) else {
            return;
        };
        lane.running = false;
        let started = lane.started.take().unwrap_or_else(Instant::now);
        let op = match &outcome {
            Outcome::Write(_) => StoreOp::Write,
            Outcome::Load(_) => StoreOp::Load,
            Outcome::Delete(_) => StoreOp::Delete,
        };
        if let Outcome::Write(Err(e)) = &outcome {
            if transient(e) {
                // Kept at the head of its lane: the session's later batches wait behind it.
                self.metrics.observe(StoreOp::Write, started, false);
                tracing::warn!(error = %e, "redis: write failed, kept for a retry");
                let wait = if lane.backoff.is_zero() {
                    RETRY_FIRST
                } else {
                    lane.backoff
                };
                lane.retry_at = Some(Instant::now() + wait);
                lane.backoff = (wait * 2).min(RETRY_MAX);
                return;
            }
        }
        lane.backoff = Duration::ZERO;
        let Some(job) = lane.jobs.pop_front() else {
            return;
        };
        let ok = match (job, outcome) {
            (Job::Write { reply, seq, .. }, Outcome::Write(r)) => {
                self.pending.remove(&seq);
                self.queued.fetch_sub(1, Ordering::Relaxed);
                let ok = r.is_ok();
                if let Err(e) = &r {
                    tracing::error!(error = %e, "redis: write cannot be applied; dropped");
                }
                let _ = reply.send(r.map_err(err));
                ok
            }
            (Job::Load(reply), Outcome::Load(r)) => {
                let ok = r.is_ok();
                let _ = reply.send((*r).map_err(err));
                ok
            }
            (Job::Delete(reply), Outcome::Delete(r)) => {
                let ok = r.is_ok();
                let _ = reply.send(r.map_err(err));
                ok
            }
            _ => false,
        };
        self.metrics.observe(op, started, ok);
        self.answer_barriers();
        self.start(&id);
    }

    fn answer_barriers(&mut self) {
        let oldest = self.pending.first().copied().unwrap_or(u64::MAX);
        let (ready, waiting): (Vec<_>, Vec<_>) =
            self.barriers.drain(..).partition(|(seq, _)| *seq < oldest);
        self.barriers = waiting;
        for (_, r) in ready {
            let _ = r.send(Ok(()));
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
    }
}

pub(super) fn err(e: RedisError) -> StoreError {
    StoreError::Backend {
        backend: "redis",
        message: e.to_string(),
    }
}
