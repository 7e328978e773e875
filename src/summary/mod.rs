//! LLM summaries of older history: written by a separate upstream request, cached with the session as compression
//! records keyed by the node id of the last message they cover, made incrementally from the previous summary,
//! and computed in the background (one at a time per session) so that requests do not wait for them. On a store
//! shared by several instances (Redis) "one at a time" holds across them: a job takes the session's summary lock
//! (`SET NX PX` with a fencing token, expiring `summary.timeout_secs` + 5 s after it was taken); an instance that
//! finds it held waits for the other's summary instead (the request waits at most `summary.wait_ms`, as for a
//! local job, and is pruned meanwhile).

pub mod prompt;

use crate::config::{AnthropicConfig, Config, GeminiConfig, UpstreamConfig};
use crate::context::tokens::{count_text, Encoding};
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::{Metrics, SummaryOutcome};
use crate::session::manager::{now_secs, SessionEntry, Sessions};
use crate::store::records::{Covers, SummaryRecord};
use crate::store::{Compression, Lock, Record};
use crate::upstream::{Api, Upstream};
use http::{HeaderMap, HeaderValue, Method};
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Semaphore};
use tokio_util::task::TaskTracker;

/// One summary to write: the first `upto` messages of `messages`, from the previous summary when given.
#[derive(Clone)]
pub struct Job {
    /// The session it belongs to.
    pub entry: Arc<SessionEntry>,
    /// The request's messages (at least `upto` of them).
    pub messages: Arc<Vec<Value>>,
    /// How many messages the summary covers.
    pub upto: usize,
    /// Node id of the last covered message: the cache key.
    pub upto_node: String,
    /// The newest ready summary covering fewer messages: (messages covered, its text).
    pub previous: Option<(usize, String)>,
    /// The client's credential headers (`authorization`, `x-api-key`), for summary requests that use the
    /// client's credentials (never stored).
    pub credentials: HeaderMap,
    /// Started ahead of the threshold.
    pub precomputed: bool,
    /// Tokenizer of the conversation's model (for the record's counts).
    pub encoding: Encoding,
    /// The length the summary is asked to keep under, in tokens (`None`: `summary.max_tokens`): what lets the
    /// rewrite using it reach `context.target` (see `context::decide::summary_budget`).
    pub length: Option<u64>,
    /// The trace of the request that started the job: the job's own trace links to it (when tracing is on).
    pub trace: Option<crate::otel::JobTrace>,
}

/// Writes summaries; one per session at a time, with backoff after failures.
pub struct Summarizer {
    model: String,
    prompt: String,
    max_tokens: u64,
    client_credentials: bool,
    /// The API of the summary model: Anthropic Messages for a Claude model, chat completions otherwise.
    api: Api,
    upstream: Upstream,
    in_flight: Mutex<HashMap<String, watch::Receiver<bool>>>,
    failures: Mutex<Failures>,
    /// One permit per summary request in flight (`summary.max_concurrent`).
    slots: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

/// Sessions backing off after failed summaries: (failures in a row, no new job before). Entries expire
/// `MAX_BACKOFF` after their wait ended (the count is forgotten then), and at most `MAX_FAILURE_ENTRIES` are kept.
#[derive(Default)]
struct Failures(HashMap<String, (u32, Instant)>);

/// Most sessions remembered as backing off; past it the entries nearest their end are forgotten first.
const MAX_FAILURE_ENTRIES: usize = 4096;

impl Failures {
    fn backing_off(&self, id: &str, now: Instant) -> bool {
        self.0.get(id).is_some_and(|(_, until)| now < *until)
    }

    /// Notes a failure of `id` at `now`; returns how long it backs off.
    fn failed(&mut self, id: &str, now: Instant) -> Duration {
        self.0
            .retain(|_, (_, until)| now < until.checked_add(MAX_BACKOFF).unwrap_or(*until));
        let n = self.0.get(id).map_or(0, |(n, _)| *n).saturating_add(1);
        let wait = FIRST_BACKOFF
            .saturating_mul(1 << (n - 1).min(5))
            .min(MAX_BACKOFF);
        self.0.insert(id.to_string(), (n, now + wait));
        if self.0.len() > MAX_FAILURE_ENTRIES {
            let mut ends: Vec<(Instant, String)> = self
                .0
                .iter()
                .map(|(k, (_, until))| (*until, k.clone()))
                .collect();
            ends.sort_unstable();
            let excess = self.0.len() - MAX_FAILURE_ENTRIES;
            for (_, k) in ends.into_iter().take(excess) {
                self.0.remove(&k);
            }
        }
        wait
    }

    fn succeeded(&mut self, id: &str) {
        self.0.remove(id);
    }
}

/// Why a summary could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    /// The request failed: network, a non-2xx answer, an answer that is not a chat completion.
    #[error("summary request failed: {0}")]
    Failed(String),
    /// No answer within `summary.timeout_secs`.
    #[error("summary request timed out after {0} s")]
    Timeout(u64),
    /// The answer was empty or longer than `summary.max_tokens`.
    #[error("summary unusable: {0}")]
    Unusable(String),
}

impl SummaryError {
    fn outcome(&self) -> SummaryOutcome {
        match self {
            SummaryError::Failed(_) => SummaryOutcome::Failed,
            SummaryError::Timeout(_) => SummaryOutcome::Timeout,
            SummaryError::Unusable(_) => SummaryOutcome::Empty,
        }
    }
}

/// The name of the store lock that makes summaries single-flight per session across instances.
const SUMMARY_LOCK: &str = "summary";
/// The lock outlives the summary request's timeout by this much (storing the record); then it expires by itself.
const LOCK_MARGIN: Duration = Duration::from_secs(5);
/// How often an instance waiting for another's summary checks whether it is done.
const LOCK_POLL: Duration = Duration::from_millis(50);

/// First wait after a failed summary; doubles with each failure, up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(600);

impl Summarizer {
    /// A summarizer when `[summary] model` is set; `None` (summaries off) otherwise.
    pub fn from_config(cfg: &Config, metrics: Arc<Metrics>) -> Result<Option<Self>, GatewayError> {
        let s = &cfg.summary;
        let Some(model) = s.model.clone() else {
            return Ok(None);
        };
        // `summary.base_url` and `api_key` stand in for those of the summary model's API.
        let api = prompt::api_of(&model);
        let upstream = Upstream::new(
            &UpstreamConfig {
                base_url: s
                    .base_url
                    .clone()
                    .unwrap_or_else(|| cfg.upstream.base_url.clone()),
                api_key: s.api_key.clone().or_else(|| cfg.upstream.api_key.clone()),
                timeout_secs: s.timeout_secs,
                connect_timeout_secs: cfg.upstream.connect_timeout_secs,
            },
            &AnthropicConfig {
                base_url: s
                    .base_url
                    .clone()
                    .unwrap_or_else(|| cfg.anthropic.base_url.clone()),
                api_key: s.api_key.clone().or_else(|| cfg.anthropic.api_key.clone()),
            },
            &GeminiConfig {
                base_url: s
                    .base_url
                    .clone()
                    .unwrap_or_else(|| cfg.gemini.base_url.clone()),
                api_key: s.api_key.clone().or_else(|| cfg.gemini.api_key.clone()),
            },
        )?;
        let prompt = prompt::load_prompt(s).map_err(GatewayError::Internal)?;
        Ok(Some(Self {
            model,
            prompt,
            max_tokens: s.max_tokens,
            client_credentials: s.api_key.is_none(),
            api,
            upstream,
            in_flight: Mutex::new(HashMap::new()),
            failures: Mutex::new(Failures::default()),
            slots: Arc::new(Semaphore::new(s.max_concurrent.max(1))),
            metrics,
        }))
    }

    /// The model that writes summaries.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Whether summary requests carry the client's own Authorization.
    pub fn uses_client_credentials(&self) -> bool {
        self.client_credentials
    }

    /// Starts `job` in the background; see [`Summarizer::start_with`].
    pub fn start(
        self: &Arc<Self>,
        job: Job,
        sessions: Arc<Sessions>,
        tasks: &TaskTracker,
    ) -> Option<watch::Receiver<bool>> {
        let id = job.entry.id.clone();
        self.start_with(&id, move || job, sessions, tasks)
    }

    /// Starts the job `make` builds, in the background, unless session `id` already has one running (then waits on
    /// that one), is backing off after a failure, or every `summary.max_concurrent` slot is taken (then nothing
    /// starts: the request is pruned meanwhile and a later one starts the summary). `make` (which copies the
    /// history) runs only once the job is sure to start. The receiver turns `true` when the job has finished
    /// (stored or failed).
    pub fn start_with(
        self: &Arc<Self>,
        id: &str,
        make: impl FnOnce() -> Job,
        sessions: Arc<Sessions>,
        tasks: &TaskTracker,
    ) -> Option<watch::Receiver<bool>> {
        if self.failures.lock().backing_off(id, Instant::now()) {
            return None;
        }
        let (tx, rx, permit) = {
            let mut in_flight = self.in_flight.lock();
            if let Some(rx) = in_flight.get(id) {
                return Some(rx.clone());
            }
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                tracing::debug!(session = %id, "summary: every slot is taken (summary.max_concurrent); not started");
                return None;
            };
            let (tx, rx) = watch::channel(false);
            in_flight.insert(id.to_string(), rx.clone());
            (tx, rx, permit)
        };
        let job = make();
        let id = id.to_string();
        let me = self.clone();
        if job.precomputed {
            self.metrics.precompaction_started();
        }
        tasks.spawn(async move {
            // Single flight across the instances of a shared store: the session's summary lock.
            let store = sessions.store().clone();
            let ttl = me.upstream.timeout() + LOCK_MARGIN;
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            let token = match store.lock(&id, SUMMARY_LOCK, ttl_ms).await {
                Ok(Lock::Local) => None,
                Ok(Lock::Acquired(token)) => Some(token),
                other => {
                    drop(permit);
                    match other {
                        Err(e) => {
                            tracing::warn!(error = %e, session = %id, "summary: the store cannot coordinate the instances; pruning instead");
                        }
                        _ => {
                            // Another instance is writing this session's summary: wait for it to finish (or for
                            // its lock to expire), then take what it stored.
                            tracing::debug!(session = %id, "summary: in progress on another instance; waiting for it");
                            let deadline = Instant::now() + ttl;
                            while Instant::now() < deadline
                                && store.is_locked(&id, SUMMARY_LOCK).await.unwrap_or(false)
                            {
                                tokio::time::sleep(LOCK_POLL).await;
                            }
                            if let Err(e) = sessions.catch_up(&job.entry).await {
                                tracing::warn!(error = %e, session = %id, "summary: could not read the other instance's summary");
                            }
                        }
                    }
                    if job.precomputed {
                        me.metrics.precompaction_finished();
                    }
                    me.in_flight.lock().remove(&id);
                    let _ = tx.send(true);
                    return;
                }
            };
            let span = job
                .trace
                .as_ref()
                .map(|t| t.summary(&id, me.model(), job.upto, job.precomputed));
            let result = me.run(&job).await;
            if let Some(span) = span {
                span.finish(match &result {
                    Ok(_) => "ok",
                    Err(e) => e.outcome().as_str(),
                });
            }
            drop(permit);
            if job.precomputed {
                me.metrics.precompaction_finished();
            }
            match result {
                Ok(record) => {
                    me.failures.lock().succeeded(&id);
                    let record = Record::from(Compression::Summary(record));
                    if let Err(e) = sessions.record_entry(&job.entry, record).await {
                        tracing::warn!(error = %e, session = %id, "summary: could not store the summary");
                    }
                }
                Err(e) => {
                    let wait = me.failures.lock().failed(&id, Instant::now());
                    tracing::warn!(error = %e, session = %id, retry_in_s = wait.as_secs(), "summary: failed; pruning instead");
                }
            }
            if let Some(token) = token {
                if let Err(e) = store.unlock(&id, SUMMARY_LOCK, token).await {
                    tracing::warn!(error = %e, session = %id, "summary: could not release the lock (it expires by itself)");
                }
            }
            me.in_flight.lock().remove(&id);
            let _ = tx.send(true);
        });
        Some(rx)
    }

    /// Writes one summary now and returns its compression record (not stored). Counted in the metrics.
    pub async fn run(&self, job: &Job) -> Result<SummaryRecord, SummaryError> {
        let started = Instant::now();
        let result = self.write(job, started).await;
        let outcome = match &result {
            Ok(_) => SummaryOutcome::Ok,
            Err(e) => e.outcome(),
        };
        self.metrics.summary_call(outcome, started.elapsed());
        result
    }

    async fn write(&self, job: &Job, started: Instant) -> Result<SummaryRecord, SummaryError> {
        let from = job.previous.as_ref().map_or(0, |(u, _)| *u);
        let transcript = prompt::transcript(
            &job.messages,
            from,
            job.upto,
            job.previous.as_ref().map(|(_, t)| t.as_str()),
        );
        let length = job.length.unwrap_or(self.max_tokens).min(self.max_tokens);
        let instructions = prompt::with_length(&self.prompt, length);
        let body = prompt::request_body(
            self.api,
            &self.model,
            &instructions,
            &transcript,
            self.max_tokens,
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.api == Api::Anthropic {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(prompt::ANTHROPIC_VERSION),
            );
        }
        if self.client_credentials {
            for (k, v) in &job.credentials {
                headers.insert(k.clone(), v.clone());
            }
        }
        let headers = self.upstream.request_headers_for(self.api, &headers, true);
        let url = self.upstream.url_for(
            self.api,
            &prompt::upstream_path(self.api, &self.model),
            None,
        );
        let failed = |e: String| SummaryError::Failed(e);
        let bytes = serde_json::to_vec(&body).map_err(|e| failed(e.to_string()))?;
        let timeout = self.upstream.timeout();
        let answer = tokio::time::timeout(timeout, async {
            let resp = self
                .upstream
                .send(Method::POST, &url, headers, bytes.into())
                .await
                .map_err(|e| match e {
                    GatewayError::UpstreamTimeout(s) => SummaryError::Timeout(s),
                    other => failed(other.to_string()),
                })?;
            let status = resp.status();
            let raw = resp
                .bytes()
                .await
                .map_err(|e| failed(format!("reading the answer: {e}")))?;
            if !status.is_success() {
                return Err(failed(format!("answered {status}")));
            }
            serde_json::from_slice::<Value>(&raw)
                .map_err(|e| failed(format!("the answer is not JSON: {e}")))
        })
        .await
        .map_err(|_| SummaryError::Timeout(timeout.as_secs()))??;
        let Some(answer_text) = prompt::answer_text(self.api, &answer) else {
            return Err(failed(
                "the answer is not a completion of the summary model's API".into(),
            ));
        };
        let text = prompt::summary_text(&answer_text, self.max_tokens, |t| {
            count_text(job.encoding, t)
        })
        .map_err(SummaryError::Unusable)?;
        let counter = crate::context::tokens::TokenCounter::new();
        let covered: u64 = job.messages[..job.upto]
            .iter()
            .map(|m| counter.message_tokens(job.encoding, m))
            .sum();
        let message = prompt::summary_message(&text);
        Ok(SummaryRecord {
            at: now_secs(),
            strategy: "summarize".into(),
            summary: text,
            covers: Covers {
                from: 0,
                upto: job.upto,
                upto_node: job.upto_node.clone(),
            },
            incremental_from: job.previous.as_ref().map(|(u, _)| *u),
            messages_before: job.upto,
            messages_after: 1,
            tokens_before: covered,
            tokens_after: counter.message_tokens(job.encoding, &message),
            model: self.model.clone(),
            latency_ms: started.elapsed().as_millis() as u64,
            precomputed: job.precomputed,
            extra: serde_json::Map::new(),
        })
    }
}

/// The job for a summary asked for by an operator: the session's history but its newest `keep_recent` messages
/// (the cut moved back so no tool call is split from its results), from the newest ready summary.
pub fn manual_job(
    entry: Arc<SessionEntry>,
    keep_recent: usize,
    model: &str,
) -> Result<Job, String> {
    let (messages, path): (Vec<Value>, Vec<String>) = entry.with_tree(|t| {
        t.history()
            .iter()
            .map(|n| ((*n.message).clone(), n.id.to_string()))
            .unzip()
    });
    // The cut is found on the neutral form (a unit keeps calls with their results) and must fall between two
    // stored messages: a summary covers whole messages.
    let converted = Dialect::named(entry.dialect).convert(None, &messages);
    let neutral: &[Value] = converted.as_ref().map_or(&messages, |c| c.messages());
    let start_of = |native: usize| {
        converted
            .as_ref()
            .map_or(native, |c| c.neutral_start(native))
    };
    let at = start_of(messages.len().saturating_sub(keep_recent));
    let boundaries: Vec<(usize, usize)> = (1..messages.len()).map(|k| (start_of(k), k)).collect();
    let (upto, native_upto) = crate::context::units::units(neutral)
        .iter()
        .rev()
        .filter(|u| u.start <= at)
        .find_map(|u| boundaries.iter().find(|(n, _)| *n == u.start).copied())
        .unwrap_or((0, 0));
    if upto == 0 {
        return Err(format!(
            "nothing to summarize: the session has {} messages and the newest {keep_recent} are kept \
             (summary.keep_recent)",
            messages.len()
        ));
    }
    let ready = ready(&entry.compressions(), &path);
    Ok(Job {
        previous: ready
            .iter()
            .map(|(u, _, t)| (start_of(*u), t))
            .filter(|(u, _)| *u < upto)
            .max_by_key(|(u, _)| *u)
            .map(|(u, t)| (u, t.clone())),
        upto_node: path[native_upto - 1].clone(),
        messages: Arc::new(neutral[..upto].to_vec()),
        upto,
        entry,
        credentials: HeaderMap::new(),
        precomputed: false,
        encoding: Encoding::for_model(model),
        length: None,
        trace: None,
    })
}

/// The summaries among a session's compression records that fit a request whose messages have the node ids
/// `path`: (messages covered, the summary message, its text), by position. A record without text or without the
/// node it ends at is never used.
pub fn ready(compressions: &[Compression], path: &[String]) -> Vec<(usize, Value, String)> {
    let at: HashMap<&str, usize> = path
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i + 1))
        .collect();
    let mut out: Vec<(usize, Value, String)> = compressions
        .iter()
        .filter_map(|r| match r {
            Compression::Summary(s) if !s.summary.is_empty() => Some(s),
            _ => None,
        })
        .filter_map(|s| {
            let upto = *at.get(s.covers.upto_node.as_str())?;
            let text = &s.summary;
            Some((upto, prompt::summary_message(text), text.clone()))
        })
        .collect();
    out.sort_by_key(|(u, _, _)| *u);
    out.dedup_by_key(|(u, _, _)| *u);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn failure_entries_expire_and_are_bounded() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        assert_eq!(f.failed("a", t0), FIRST_BACKOFF);
        assert_eq!(f.failed("a", t0), FIRST_BACKOFF * 2, "backoff doubles");
        assert!(f.backing_off("a", t0) && !f.backing_off("a", t0 + FIRST_BACKOFF * 2));
        // long after a's wait ended, the next failure of anyone forgets it
        let later = t0 + FIRST_BACKOFF * 2 + MAX_BACKOFF + Duration::from_secs(1);
        f.failed("b", later);
        assert_eq!(f.0.len(), 1);
        assert_eq!(f.failed("a", later), FIRST_BACKOFF, "a starts over");
        // many sessions failing at once: the map never holds more than the bound
        for i in 0..MAX_FAILURE_ENTRIES + 100 {
            f.failed(&format!("s{i}"), later + Duration::from_millis(i as u64));
            assert!(f.0.len() <= MAX_FAILURE_ENTRIES);
        }
        let newest = format!("s{}", MAX_FAILURE_ENTRIES + 99);
        assert!(f.0.contains_key(&newest) && !f.0.contains_key("s0"));
    }

    fn summarizer(max_concurrent: usize) -> Arc<Summarizer> {
        let mut cfg = Config::default();
        cfg.summary.model = Some("summary-model".into());
        cfg.summary.max_concurrent = max_concurrent;
        let metrics = Arc::new(Metrics::new(Box::new(|_: &str| None)).unwrap());
        Arc::new(Summarizer::from_config(&cfg, metrics).unwrap().unwrap())
    }

    #[tokio::test]
    async fn no_history_is_copied_unless_the_job_starts() {
        let s = summarizer(1);
        let sessions = Arc::new(Sessions::new(
            Arc::new(crate::store::MemoryStore::new()),
            1 << 20,
        ));
        let tasks = TaskTracker::new();
        let never = || -> Job { panic!("the history was copied for a job that does not start") };
        // another job of this session is running: its receiver, no copy
        let (_tx, running) = watch::channel(false);
        s.in_flight.lock().insert("s1".into(), running);
        assert!(s
            .start_with("s1", never, sessions.clone(), &tasks)
            .is_some());
        // backing off
        s.failures.lock().failed("s2", Instant::now());
        assert!(s
            .start_with("s2", never, sessions.clone(), &tasks)
            .is_none());
        // every slot taken (summary.max_concurrent = 1): not started, no copy
        let held = s.slots.clone().try_acquire_owned().unwrap();
        assert!(s
            .start_with("s3", never, sessions.clone(), &tasks)
            .is_none());
        assert!(!s.in_flight.lock().contains_key("s3"));
        drop(held);
        assert_eq!(s.slots.available_permits(), 1);
    }

    #[test]
    fn ready_summaries_are_matched_by_node_id() {
        let path: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let recs: Vec<Compression> = serde_json::from_value(json!([
            {"kind":"summary","summary":"S2","covers":{"upto":2,"upto_node":"b"}},
            {"kind":"summary","summary":"other branch","covers":{"upto":2,"upto_node":"zz"}},
            {"stages":["cleared"],"cuts":[1,0,0,0,0]},
            {"kind":"summary","summary":"","covers":{"upto":3,"upto_node":"c"}},
            {"kind":"summary","summary":"S4","covers":{"upto":4,"upto_node":"d"}},
        ]))
        .unwrap();
        let r = ready(&recs, &path);
        let got: Vec<(usize, &str)> = r.iter().map(|(u, _, t)| (*u, t.as_str())).collect();
        assert_eq!(got, [(2, "S2"), (4, "S4")]);
        assert_eq!(r[0].1["role"], "system");
    }
}
