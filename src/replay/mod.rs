//! Offline replay of a recorded conversation through the context planner: for every assistant turn, the tokens
//! the client sent, the tokens that would go upstream, what the rewrite did, whether the request is valid, and
//! what a provider's prompt cache would make of the sequence sent (`cache`). Pure over a parsed trace; the caller
//! reads the files and writes the text. A trace may be recorded in any dialect ctxgate speaks (`traces`).
//! Offline there is no LLM to write summaries: when they are simulated, every summary the planner asks for is
//! taken as written (a stand-in of the length the summary request asks for, at most `summary.max_tokens` tokens)
//! before the next turn, as if the background job always finished in time. `compare` runs several strategies and settings over the same traces.
//! `working_set` measures what of the facts the agent's next step uses each request sent keeps in view.

pub mod cache;
pub mod compare;
mod text;
pub mod traces;
pub mod working_set;

#[cfg(test)]
mod tests;

pub use text::{write_summary, write_text};

use crate::config::{Config, Strategy};
use crate::context::decide::{self, Decision};
use crate::context::models::ModelTable;
use crate::context::tokens::{Encoding, TokenCounter};
use crate::context::units::{check_sequence, system_messages};
use crate::context::Plan;
use crate::dialect::request::Call;
use crate::dialect::{Dialect, Request};
use crate::message::message_text;
use crate::recall::Offer;
use crate::summary::prompt::summary_message;
use bytes::Bytes;
use cache::{billed_at, Sequence, Weights};
use serde::Serialize;
use serde_json::Value;
use traces::Trace;
use working_set::WorkingSet;

/// "Now" for every step: no message has a first-seen time, so ages play no part.
const NOW: i64 = 1_700_000_000;

/// What to replay with, beyond the config.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Context window in tokens; `None`: the model table's window for the model.
    pub window: Option<u64>,
    /// Strategy; `None`: the config's (`hybrid` by default).
    pub strategy: Option<Strategy>,
    /// Model name; `None`: the first word of the trace's `model` (traces describe the model in prose).
    pub model: Option<String>,
    /// Simulate summaries (for `summarize` and `hybrid`) even when the config names no `summary.model`.
    pub summaries: bool,
    /// The dialect the client speaks; `None`: the trace's own. A chat trace replays in any dialect (each request
    /// converted by `dialect::<d>::from_chat`); an Anthropic or Responses trace only in its own.
    pub dialect: Option<Dialect>,
}

/// The counters a replay uses, shared by every replay given them: tokens of messages and tools (the planner's
/// counter) and weights of prefix items (`cache`). Counts depend on content only, never on what shares them.
#[derive(Debug, Default)]
pub struct Counters {
    /// The planner's token counter.
    pub tokens: TokenCounter,
    /// Weights of prefix items.
    pub weights: Weights,
}

/// What the planner decided for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Sent as the client sent it.
    Forward,
    /// Rewritten.
    Rewrite,
    /// Refused without calling upstream.
    Reject,
}

/// One request of the replay: the client sends the trace's first `index` items, the upstream answers the next.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayStep {
    /// Index of the item answering this request (= items the client sent).
    pub index: usize,
    /// The planner's decision.
    pub outcome: Outcome,
    /// Tokens of the client's request (messages, tools, reply priming).
    pub client_tokens: u64,
    /// Tokens sent upstream: the rewritten request with the recall tools and note the gateway adds, the client's
    /// when forwarded, 0 when rejected.
    pub upstream_tokens: u64,
    /// The client's request is above the rewrite threshold.
    pub above_threshold: bool,
    /// A request was sent with more tokens than the context window.
    pub over_window: bool,
    /// Messages sent upstream.
    pub messages_sent: usize,
    /// The stages that changed something (`cleared`, `pruned`, `truncated`).
    pub stages: Vec<&'static str>,
    /// Tool results replaced by a placeholder.
    pub cleared_results: usize,
    /// Past run loops cut to their user message and final reply.
    pub pruned_loops: usize,
    /// Run loops dropped for count or age.
    pub dropped_loops: usize,
    /// Messages dropped by the hard limit.
    pub dropped_messages: usize,
    /// Tool calls whose results are not sent (recallable).
    pub pruned_calls: usize,
    /// Messages covered by the summary sent (0: none).
    pub summary_upto: usize,
    /// The planner asked for a summary of the first N messages (needed now, or ahead of time).
    pub wanted_summary: Option<usize>,
    /// A summary not written before was asked for: a summary call (the gateway starts one job per summary).
    pub summary_call: bool,
    /// The rewritten request recounted from scratch (recall reserve excluded): equals the planner's estimate
    /// when its cost model is right.
    pub recounted_tokens: Option<u64>,
    /// What is sent is a valid request that keeps the system prompt and the newest message (false when rejected).
    pub valid: bool,
    /// Why the request is invalid, or why it was refused.
    pub problem: Option<String>,
    /// Tokens of the prefix items of what is sent (`cache`; 0 when rejected).
    pub wire_tokens: u64,
    /// Of them, the tokens of the leading items equal to the previous request sent of the trace (a cache hit).
    pub wire_cached: u64,
    /// Tokens of the prefix items of the client's request.
    pub client_wire_tokens: u64,
    /// Of them, the tokens of the leading items equal to the client's previous request.
    pub client_wire_cached: u64,
    /// What is sent only appends to the previous request sent (`None`: the first sent, or rejected).
    pub prefix_stable: Option<bool>,
    /// A rewrite sends the client's first user message (the first opening a turn) byte for byte (`None`: not a
    /// rewrite; `true` when there is no user message).
    pub task_whole: Option<bool>,
    /// Steps (a tool call with its results) folded into a line each.
    pub folded_steps: usize,
    /// Price of a cached input token (`context.cache_read_price`) the step is billed at.
    pub cache_price: f64,
    /// The billed input per turn the cost model expected when the cuts of this rewrite were made (estimator's
    /// tokens; `None`: not a rewrite, or no forecast).
    pub forecast: Option<u64>,
    /// What the cost model predicts this step is billed, in the same tokens as `wire_tokens`: the forecast
    /// scaled by this request's wire tokens per estimated token; what is measured when there is no forecast.
    pub predicted_billed: f64,
    /// The facts of the recorded answer (code-like strings taken from earlier tool outputs) and how many of them
    /// what is sent keeps in view (`working_set`).
    pub working_set: WorkingSet,
}

/// Sums over steps (of one trace or several).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplayTotals {
    /// Requests replayed.
    pub steps: usize,
    /// Requests above the threshold.
    pub above_threshold: usize,
    /// Requests rewritten.
    pub rewritten: usize,
    /// Rewrites that sent a summary (the rest are summary-free).
    pub summarized: usize,
    /// Requests for which the planner asked for a summary.
    pub summaries_wanted: usize,
    /// Summary calls: distinct summaries asked for (each written once, then reused).
    pub summary_calls: usize,
    /// Requests sent invalid (rejected ones are not counted here).
    pub invalid: usize,
    /// Requests refused.
    pub rejected: usize,
    /// Requests sent with more tokens than the window.
    pub over_window: usize,
    /// Tokens the client sent, over all steps.
    pub client_tokens: u64,
    /// Tokens sent upstream, over all steps.
    pub upstream_tokens: u64,
    /// `1 - upstream / client` over the steps that were sent.
    pub savings: f64,
    /// Mean of `upstream / client` over the steps above the threshold that were sent; `None` when there are none.
    pub mean_ratio_above: Option<f64>,
    /// Share of the requests sent that are valid; `None` when none was sent.
    pub valid_share: Option<f64>,
    /// Pairs of consecutive requests sent (of one trace).
    pub prefix_pairs: usize,
    /// Of them, those where the second only appends to the first.
    pub prefix_stable_pairs: usize,
    /// `prefix_stable_pairs / prefix_pairs`; `None` without pairs.
    pub prefix_stable: Option<f64>,
    /// Billed input tokens of the requests sent: each request's prefix tokens less 90% of those it shares with the
    /// previous one sent.
    pub billed: f64,
    /// The same for the client's own requests, over the same steps.
    pub client_billed: f64,
    /// `billed / client_billed`: above 1, ctxgate costs more than sending everything; `None` when nothing was
    /// billed.
    pub cache_cost: Option<f64>,
    /// The billed input the cost model predicted over the same steps (`ReplayStep::predicted_billed`).
    pub predicted: f64,
    /// `predicted / client_billed`: the cache cost the cost model expected; `None` when nothing was billed.
    pub predicted_cost: Option<f64>,
    /// Steps folded, over every rewrite.
    pub folded_steps: usize,
    /// Rewrites that send the client's first user message whole.
    pub task_whole: usize,
    /// `task_whole / rewritten`; `None` without rewrites.
    pub task_whole_share: Option<f64>,
    /// Facts of the answers (`working_set`), over every step (a refused one shows none).
    pub facts: usize,
    /// Of them, those shown: a source output sent whole, or the string itself.
    pub facts_shown: usize,
    /// Of them, those with a source output sent whole.
    pub facts_whole: usize,
    /// Steps whose answer has at least one fact.
    pub fact_steps: usize,
    /// Of them, those with every fact shown.
    pub fact_steps_shown: usize,
    /// `facts_shown / facts` (SHOWN); `None` without facts.
    pub shown_share: Option<f64>,
    /// `facts_whole / facts` (WHOLE); `None` without facts.
    pub whole_share: Option<f64>,
    /// `fact_steps_shown / fact_steps`; `None` without facts.
    pub steps_shown_share: Option<f64>,
}

fn share(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

impl ReplayTotals {
    /// The totals of `steps`.
    pub fn of<'a>(steps: impl IntoIterator<Item = &'a ReplayStep>) -> Self {
        let mut t = ReplayTotals::default();
        let (mut sent_client, mut ratios) = (0u64, Vec::new());
        for s in steps {
            t.steps += 1;
            t.above_threshold += usize::from(s.above_threshold);
            t.rewritten += usize::from(s.outcome == Outcome::Rewrite);
            t.summarized += usize::from(s.summary_upto > 0);
            t.summaries_wanted += usize::from(s.wanted_summary.is_some());
            t.summary_calls += usize::from(s.summary_call);
            t.rejected += usize::from(s.outcome == Outcome::Reject);
            t.invalid += usize::from(s.outcome != Outcome::Reject && !s.valid);
            t.over_window += usize::from(s.over_window);
            t.client_tokens += s.client_tokens;
            t.upstream_tokens += s.upstream_tokens;
            t.prefix_pairs += usize::from(s.prefix_stable.is_some());
            t.prefix_stable_pairs += usize::from(s.prefix_stable == Some(true));
            t.task_whole += usize::from(s.task_whole == Some(true));
            let ws = &s.working_set;
            t.facts += ws.facts;
            t.facts_shown += ws.shown;
            t.facts_whole += ws.whole;
            t.fact_steps += usize::from(ws.facts > 0);
            t.fact_steps_shown += usize::from(ws.facts > 0 && ws.shown == ws.facts);
            if s.outcome != Outcome::Reject {
                sent_client += s.client_tokens;
                t.billed += billed_at(s.wire_tokens, s.wire_cached, s.cache_price);
                t.client_billed +=
                    billed_at(s.client_wire_tokens, s.client_wire_cached, s.cache_price);
                t.predicted += s.predicted_billed;
                t.folded_steps += s.folded_steps;
                if s.above_threshold && s.client_tokens > 0 {
                    ratios.push(s.upstream_tokens as f64 / s.client_tokens as f64);
                }
            }
        }
        if sent_client > 0 {
            t.savings = 1.0 - t.upstream_tokens as f64 / sent_client as f64;
        }
        if !ratios.is_empty() {
            t.mean_ratio_above = Some(ratios.iter().sum::<f64>() / ratios.len() as f64);
        }
        let sent = (t.steps - t.rejected) as f64;
        t.valid_share = share(sent - t.invalid as f64, sent);
        t.prefix_stable = share(t.prefix_stable_pairs as f64, t.prefix_pairs as f64);
        t.cache_cost = share(t.billed, t.client_billed);
        t.predicted_cost = share(t.predicted, t.client_billed);
        t.task_whole_share = share(t.task_whole as f64, t.rewritten as f64);
        t.shown_share = share(t.facts_shown as f64, t.facts as f64);
        t.whole_share = share(t.facts_whole as f64, t.facts as f64);
        t.steps_shown_share = share(t.fact_steps_shown as f64, t.fact_steps as f64);
        t
    }
}

/// The replay of one trace.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The trace's `id`.
    pub id: String,
    /// The dialect the trace is recorded in (`chat`, `anthropic`, `responses`).
    pub format: &'static str,
    /// The model name used for the encoding and the window.
    pub model: String,
    /// The dialect the requests were planned in (`chat`, `anthropic`, `responses`).
    pub dialect: &'static str,
    /// The tokenizer.
    pub encoding: &'static str,
    /// The context window.
    pub window: u64,
    /// The strategy.
    pub strategy: &'static str,
    /// Summaries were simulated.
    pub summaries: bool,
    /// Client tokens above which a request is over the threshold.
    pub threshold_tokens: u64,
    /// Every request, in order.
    pub steps: Vec<ReplayStep>,
    /// Their totals.
    pub totals: ReplayTotals,
}

/// One request of a replay as bytes: what the client sends, and what the gateway would send upstream for it.
#[derive(Debug, Clone)]
pub struct ReplayedRequest {
    /// Index of the item answering it (as in [`ReplayStep::index`]).
    pub index: usize,
    /// The client's body (for a chat trace replayed as chat: `{"model", "messages", "tools"}`, no `tools` when
    /// the trace has none).
    pub client_body: Vec<u8>,
    /// The body sent upstream (the client's when forwarded); `None` when refused.
    pub upstream_body: Option<Vec<u8>>,
}

/// Replays `trace` (chat: `{"id", "model", "tools", "messages": [...]}`; or an Anthropic or Responses
/// conversation, see `traces`) through the planner as the gateway would plan it, with `cfg`'s `[context]`,
/// `[prune]`, `[recall]`, `[summary]` and `[models]`: ratio 1.0, no first-seen times. `Err` when `trace` is not
/// a trace.
pub fn replay_trace(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
) -> Result<ReplayReport, String> {
    replay(trace, opts, cfg, &Counters::default(), None)
}

/// [`replay_trace`] with `counters` shared with other replays (their caches carry over; the report is the same).
pub fn replay_trace_with(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
    counters: &Counters,
) -> Result<ReplayReport, String> {
    replay(trace, opts, cfg, counters, None)
}

/// [`replay_trace`], with the bytes of every request: the client's and what would go upstream.
pub fn replay_requests(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
) -> Result<(ReplayReport, Vec<ReplayedRequest>), String> {
    let mut requests = Vec::new();
    let report = replay(trace, opts, cfg, &Counters::default(), Some(&mut requests))?;
    Ok((report, requests))
}

/// [`replay_requests`] with shared counters (as [`replay_trace_with`]).
pub fn replay_requests_with(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
    counters: &Counters,
) -> Result<(ReplayReport, Vec<ReplayedRequest>), String> {
    let mut requests = Vec::new();
    let report = replay(trace, opts, cfg, counters, Some(&mut requests))?;
    Ok((report, requests))
}

fn replay(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
    counters: &Counters,
    mut requests: Option<&mut Vec<ReplayedRequest>>,
) -> Result<ReplayReport, String> {
    let t = Trace::read(trace)?;
    let mut run = Run::new(&t, opts, cfg, counters)?;
    let mut steps = Vec::new();
    for &k in &t.steps {
        let (step, client_body, upstream_body) = run.request(k)?;
        steps.push(step);
        if let Some(out) = requests.as_deref_mut() {
            out.push(ReplayedRequest {
                index: k,
                client_body: client_body.to_vec(),
                upstream_body: upstream_body.map(|b| b.to_vec()),
            });
        }
    }
    Ok(ReplayReport {
        id: t.id().to_string(),
        format: t.format.as_str(),
        model: run.model,
        dialect: run.dialect.as_str(),
        encoding: run.encoding.as_str(),
        window: run.window,
        strategy: run.strategy.as_str(),
        summaries: run.summarizing,
        threshold_tokens: run.threshold_tokens,
        totals: ReplayTotals::of(&steps),
        steps,
    })
}

/// A replay under way: the settings of every request, the summaries taken as written so far, and the prompt-cache
/// sequences of what the client sent and what went upstream.
struct Run<'a> {
    t: &'a Trace<'a>,
    cfg: &'a Config,
    counters: &'a Counters,
    model: String,
    dialect: Dialect,
    encoding: Encoding,
    window: u64,
    strategy: Strategy,
    /// Summaries may be written (simulated, or a summary model is configured).
    summarizer: bool,
    /// ... and the strategy uses them.
    summarizing: bool,
    threshold_tokens: u64,
    /// The summaries taken as written: messages covered, summary message.
    ready: Vec<(usize, Value)>,
    client_seq: Sequence,
    sent_seq: Sequence,
    /// Replayed in its own format, every request's conversation is a prefix of the trace's: weighed once.
    native_items: Option<cache::Shape>,
    /// The recorded answer of every step (aligned with the trace's steps), neutral.
    answers: Vec<Vec<Value>>,
}

/// What the planner made of one request.
struct Planned {
    /// The step, before what is sent was checked and priced.
    step: ReplayStep,
    /// Tokens of the client's request.
    client: u64,
    /// The summary the planner asked for (whole client messages, as in the gateway).
    wanted: Option<usize>,
    /// The length the summary is asked to keep to (so that its rewrite reaches the target).
    length: Option<u64>,
    /// The rewritten messages, before the gateway's additions.
    rewritten: Option<Vec<Value>>,
    /// The body sent upstream (the client's when forwarded); `None` when refused.
    upstream_body: Option<Bytes>,
}

impl<'a> Run<'a> {
    fn new(
        t: &'a Trace<'a>,
        opts: &ReplayOptions,
        cfg: &'a Config,
        counters: &'a Counters,
    ) -> Result<Run<'a>, String> {
        let model = match (&opts.model, t.model()) {
            (Some(m), _) => m.clone(),
            (None, Some(m)) => m.to_string(),
            (None, None) => "unknown".to_string(),
        };
        let window = match opts.window {
            Some(w) => w,
            None => ModelTable::new(&cfg.models, cfg.context.default_context_window)?
                .context_window(&model),
        };
        let strategy = opts.strategy.unwrap_or(cfg.context.strategy);
        let dialect = opts.dialect.unwrap_or(t.format);
        let encoding = Encoding::for_model(&model);
        let summarizer = opts.summaries || cfg.summary.model.is_some();
        Ok(Run {
            t,
            cfg,
            counters,
            dialect,
            encoding,
            window,
            strategy,
            summarizer,
            summarizing: summarizer && matches!(strategy, Strategy::Summarize | Strategy::Hybrid),
            threshold_tokens: (cfg.context.threshold * window as f64) as u64,
            ready: Vec::new(),
            client_seq: Sequence::default(),
            sent_seq: Sequence::default(),
            native_items: (dialect == t.format)
                .then(|| counters.weights.items(encoding, t.items())),
            answers: t.answers(),
            model,
        })
    }

    /// The request answered by item `k`: planned, checked, priced; the summary it asked for is then taken as
    /// written. With the client's body and the one sent upstream (`None`: refused).
    fn request(&mut self, k: usize) -> Result<(ReplayStep, Bytes, Option<Bytes>), String> {
        let (dialect, encoding, counters) = (self.dialect, self.encoding, self.counters);
        let counter = &counters.tokens;
        let body = Value::Object(self.t.body(&self.model, k, dialect)?);
        let raw = Bytes::from(serde_json::to_vec(&body).map_err(|e| e.to_string())?);
        // as the gateway parses and plans it
        let path = dialect.call_path(&self.model);
        let call = Call {
            path: &path,
            query: None,
        };
        let request = dialect
            .parse(raw.clone(), &call)
            .map_err(|e| format!("request {k}: {e}"))?;
        let p = self.plan(k, &request, &raw)?;
        let mut s = p.step;
        // what is sent, as JSON: the client's own body when forwarded
        let parsed = sent_json(&mut s, p.upstream_body.as_deref());
        let sent_body = match s.outcome {
            Outcome::Forward => Some(&body),
            Outcome::Rewrite => parsed.as_ref(),
            Outcome::Reject => None,
        };
        if let (Some(up), None) = (sent_body, &s.problem) {
            s.problem = api_problem(dialect, &body, up);
            s.valid = s.problem.is_none();
        }
        s.wanted_summary = p.wanted;
        let tools = request.body.get("tools").filter(|t| !t.is_null());
        s.recounted_tokens = p
            .rewritten
            .as_ref()
            .map(|r| counter.request_tokens(encoding, r, tools));
        s.above_threshold = p.client > self.threshold_tokens;
        s.over_window = s.outcome != Outcome::Reject && s.upstream_tokens > self.window;
        self.price(&mut s, &body, sent_body);
        if let (Outcome::Rewrite, Some(shape)) = (s.outcome, self.sent_seq.last()) {
            s.task_whole = Some(self.task_kept(&request, shape, p.rewritten.as_deref()));
        }
        if let Some(upto) = s.wanted_summary {
            s.summary_call = self.write_summary(upto, p.length);
        }
        let sent = (p.rewritten.as_deref(), p.upstream_body.as_deref());
        s.working_set = self.working_set(k, &request, s.outcome, sent, &raw);
        Ok((s, raw, p.upstream_body))
    }

    /// Plans `request` (the client's `raw` bytes) as the gateway would, with the summaries written so far.
    fn plan(&self, k: usize, request: &Request, raw: &Bytes) -> Result<Planned, String> {
        let (cfg, counter, dialect) = (self.cfg, &self.counters.tokens, self.dialect);
        let sent = request.messages();
        let tools = request.body.get("tools").filter(|t| !t.is_null());
        let req = decide::Request {
            body: &request.body,
            messages: sent,
            // as the gateway plans (`pipeline::plan`): the parse's hashes when they are the planned elements'
            hashes: request
                .item_hashes()
                .filter(|_| request.converted().is_none()),
            key: dialect.conversation_key(),
            raw_len: raw.len(),
            encoding: self.encoding,
            window: self.window,
            ratio: 1.0,
            strategy: self.strategy,
            first_seen: None,
            now: NOW,
            summarizer: self.summarizer,
            strict_roles: dialect.strict_roles(),
        };
        let offer = Offer::new(dialect, &request.body, &cfg.recall);
        let client = {
            // keyed as the planner keys the messages, so that both share one memo (as in the gateway)
            let (keys, each) =
                crate::context::usage::Usage::prefix_hashes(sent, req.hashes, counter);
            counter.request_tokens_keyed(self.encoding, sent, (&keys, &each), tools)
        };
        let ready = self.summarizing.then_some(self.ready.as_slice());
        let plan = decide::plan_cuts(&req, ready, cfg, &offer, counter);
        // a summary covers whole client messages, as in the gateway
        let wanted = decide::wanted_summary(&plan)
            .and_then(|n| request.summary_boundary(n))
            .map(|(n, _)| n);
        // the summary is asked to keep to the length that lets its rewrite reach the target
        let length = wanted.map(|n| decide::summary_budget(&req, n, &offer, cfg, counter));
        let mut rewritten = match &plan {
            Plan::Rewrite(rw) => Some(rw.owned_messages()),
            _ => None,
        };
        let serialise = |b: &crate::context::RewrittenBody<'_>| dialect.render(request, b);
        let mut decision = decide::render(&req, plan, (cfg, &offer), counter, &serialise)
            .map_err(|e| e.to_string())?;
        if rewritten.is_none() && matches!(decision, Decision::Rewrite(_)) {
            // offered the recall tools: the client's messages, as they are
            rewritten = Some(sent.to_vec());
        }
        let upstream_body: Option<Bytes> = match &mut decision {
            Decision::Forward { .. } => Some(raw.clone()),
            Decision::Rewrite(rw) => Some(Bytes::from(std::mem::take(&mut rw.body))),
            Decision::Reject { .. } => None,
        };
        Ok(Planned {
            step: step(k, client, decision, sent, rewritten.as_deref()),
            client,
            wanted,
            length,
            rewritten,
            upstream_body,
        })
    }

    /// What the request sent keeps in view of the facts of the answer to item `k` (`working_set`): the client's
    /// neutral messages when forwarded, the rewritten ones when rewritten, nothing when refused.
    fn working_set(
        &self,
        k: usize,
        request: &Request,
        outcome: Outcome,
        (rewritten, upstream): (Option<&[Value]>, Option<&[u8]>),
        raw: &[u8],
    ) -> WorkingSet {
        let answer = match self.t.steps.binary_search(&k) {
            Ok(i) => self.answers.get(i).map(Vec::as_slice).unwrap_or_default(),
            Err(_) => &[],
        };
        let prior = request.messages();
        let facts = working_set::facts(prior, answer);
        let sent = match (outcome, upstream) {
            (Outcome::Reject, _) | (_, None) => None,
            (Outcome::Forward, _) => Some((prior, raw)),
            (Outcome::Rewrite, Some(body)) => Some((rewritten.unwrap_or(prior), body)),
        };
        working_set::visibility(prior, &facts, sent)
    }

    /// The prompt cache: the client's sequence and what is sent (`sent_body`), and what the step is billed.
    fn price(&mut self, s: &mut ReplayStep, body: &Value, sent_body: Option<&Value>) {
        let (weights, encoding, dialect) = (&self.counters.weights, self.encoding, self.dialect);
        let client_shape = match &self.native_items {
            Some(items) => weights.shape_over(encoding, dialect, as_map(body), items),
            None => weights.shape(encoding, dialect, as_map(body)),
        };
        let sent_shape = match (sent_body, s.outcome) {
            (Some(_), Outcome::Forward) => Some(client_shape.clone()),
            (Some(b), _) => Some(weights.shape(encoding, dialect, as_map(b))),
            (None, _) => None,
        };
        let c = self.client_seq.push(client_shape);
        (s.client_wire_tokens, s.client_wire_cached) = (c.tokens, c.cached);
        if let Some(shape) = sent_shape {
            let c = self.sent_seq.push(shape);
            (s.wire_tokens, s.wire_cached, s.prefix_stable) = (c.tokens, c.cached, c.extends);
        }
        s.cache_price = self.cfg.context.cache_read_price;
        s.predicted_billed = match s.forecast {
            Some(f) if s.upstream_tokens > 0 => {
                f as f64 * s.wire_tokens as f64 / s.upstream_tokens as f64
            }
            _ => billed_at(s.wire_tokens, s.wire_cached, s.cache_price),
        };
    }

    /// Whether a rewrite kept the task whole (see [`task_whole`]); a task over `prune.max_pinned_tokens` is kept
    /// as its pinned head and tail, as designed.
    fn task_kept(
        &self,
        request: &Request,
        sent: &cache::Shape,
        rewritten: Option<&[Value]>,
    ) -> bool {
        let pinned = rewritten.is_some_and(|r| {
            r.iter()
                .any(|m| message_text(m).contains(crate::context::shape::PINNED_MARKER))
        });
        let counter = &self.counters.tokens;
        let messages = request.messages();
        let oversized = crate::context::task::task_index(messages)
            .and_then(|i| messages.get(i))
            .is_some_and(|t| {
                counter.message_tokens(self.encoding, t) > self.cfg.prune.max_pinned_tokens
            });
        task_whole(request, sent) || (pinned && oversized)
    }

    /// Takes the summary of the first `upto` messages as written (of the asked `length`, at most
    /// `summary.max_tokens`); whether it is a new one (a summary call).
    fn write_summary(&mut self, upto: usize, length: Option<u64>) -> bool {
        if self.ready.iter().any(|(u, _)| *u == upto) {
            return false;
        }
        let length = length.unwrap_or(self.cfg.summary.max_tokens);
        self.ready.push((upto, stand_in_summary(upto, length)));
        self.ready.sort_by_key(|(u, _)| *u);
        true
    }
}

/// The rewritten body sent (`upstream`) as JSON; a body that is not JSON makes the step invalid.
fn sent_json(s: &mut ReplayStep, upstream: Option<&[u8]>) -> Option<Value> {
    let (Some(up), Outcome::Rewrite) = (upstream, s.outcome) else {
        return None;
    };
    match serde_json::from_slice::<Value>(up) {
        Ok(v) => Some(v),
        Err(e) => {
            s.problem = Some(format!("the body sent is not JSON: {e}"));
            s.valid = false;
            None
        }
    }
}

/// The object of a body built or parsed as one (an empty map for anything else).
fn as_map(v: &Value) -> &serde_json::Map<String, Value> {
    static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> = std::sync::OnceLock::new();
    v.as_object()
        .unwrap_or_else(|| EMPTY.get_or_init(serde_json::Map::new))
}

/// Whether the sent request (`sent`) holds the task of `request` (`context::task`: its first user message opening a
/// turn after a few-shot opening) byte for byte (its wire form: the client's own item); true when there is none.
pub fn task_whole(request: &Request, sent: &cache::Shape) -> bool {
    let Some(i) = crate::context::task::task_index(request.messages()) else {
        return true;
    };
    match request
        .native_index(i)
        .and_then(|k| request.native().get(k))
    {
        Some(item) => sent.conversation_has(request.dialect, cache::hash(item)),
        None => true,
    }
}

/// The summary message taken as written for the first `upto` messages: about `max_tokens` tokens (the most a
/// real one may have).
fn stand_in_summary(upto: usize, max_tokens: u64) -> Value {
    let head = format!("(replay stand-in for a summary of messages 1-{upto})");
    let words = usize::try_from(max_tokens.saturating_sub(30)).unwrap_or(0);
    summary_message(&format!("{head}{}", " note".repeat(words)))
}

/// The step for `decision`; `rewritten`: the rewritten messages before the gateway's additions.
fn step(
    index: usize,
    client: u64,
    decision: Decision,
    original: &[Value],
    rewritten: Option<&[Value]>,
) -> ReplayStep {
    let mut s = ReplayStep {
        index,
        outcome: Outcome::Forward,
        client_tokens: client,
        upstream_tokens: client,
        above_threshold: false,
        over_window: false,
        messages_sent: original.len(),
        stages: Vec::new(),
        cleared_results: 0,
        pruned_loops: 0,
        dropped_loops: 0,
        dropped_messages: 0,
        pruned_calls: 0,
        summary_upto: 0,
        wanted_summary: None,
        summary_call: false,
        recounted_tokens: None,
        valid: true,
        problem: None,
        wire_tokens: 0,
        wire_cached: 0,
        client_wire_tokens: 0,
        client_wire_cached: 0,
        prefix_stable: None,
        task_whole: None,
        folded_steps: 0,
        cache_price: cache::CACHED_PRICE,
        forecast: None,
        predicted_billed: 0.0,
        working_set: WorkingSet::default(),
    };
    match decision {
        Decision::Forward { .. } => {
            s.problem = check_sequence(original).err();
        }
        Decision::Reject {
            tokens,
            limit,
            window,
            refused,
        } => {
            s.outcome = Outcome::Reject;
            s.upstream_tokens = 0;
            s.messages_sent = 0;
            s.problem = Some(if refused {
                format!(
                    "refused (context.on_overflow = refuse; or fallback, which replay does not follow): {tokens} \
                     tokens fit under the hard limit of {limit} (window {window}) only by dropping whole messages"
                )
            } else {
                format!(
                    "rejected: the smallest rewrite is {tokens} tokens, over the hard limit of {limit} (window {window})"
                )
            });
        }
        Decision::Rewrite(rw) => {
            // what the gateway sends: the recall tools and note included
            s.upstream_tokens = rw.estimate;
            let r = rw.record;
            s.outcome = Outcome::Rewrite;
            s.messages_sent = r.messages_after;
            s.stages = r.stages;
            s.cleared_results = r.cleared_results;
            s.pruned_loops = r.pruned_loops;
            s.dropped_loops = r.dropped_loops;
            s.dropped_messages = r.dropped_messages;
            s.pruned_calls = r.pruned_call_ids.len();
            s.folded_steps = r.folded_steps;
            s.forecast = rw.forecast;
            s.summary_upto = r.summary_upto;
            s.problem = check_rewrite(original, rewritten.unwrap_or_default()).err();
        }
    }
    s.valid = s.problem.is_none();
    s
}

/// What the dialect's API would refuse in the body `sent` upstream for the client's `client` body, or what a
/// rewrite may not change (chat's rules are checked on the neutral form, by [`step`]).
fn api_problem(dialect: Dialect, client: &Value, sent: &Value) -> Option<String> {
    dialect.check_sent(client, sent).err()
}

/// A rewrite must be a valid sequence that keeps every system message (in order; a summary may come between)
/// and the newest message as they were.
fn check_rewrite(original: &[Value], sent: &[Value]) -> Result<(), String> {
    check_sequence(sent)?;
    let mut kept = system_messages(sent).into_iter();
    if !system_messages(original)
        .into_iter()
        .all(|m| kept.any(|k| k == m))
    {
        return Err("a system message was not kept as it was".into());
    }
    if original.last() != sent.last() {
        return Err("the newest message was not kept as it was".into());
    }
    Ok(())
}
