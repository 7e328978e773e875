//! Offline replay of a recorded conversation through the context planner: for every assistant turn, the tokens
//! the client sent, the tokens that would go upstream, what the rewrite did, and whether the request is valid.
//! Pure over a parsed trace; the caller reads the files and writes the text. Offline there is no LLM to write
//! summaries: when they are simulated, every summary the planner asks for is taken as written (a stand-in of
//! `summary.max_tokens` tokens) before the next turn, as if the background job always finished in time.

use crate::config::{Config, Strategy};
use crate::context::decide::{self, Decision};
use crate::context::models::ModelTable;
use crate::context::tokens::{Encoding, TokenCounter};
use crate::context::units::{check_sequence, system_messages};
use crate::context::Plan;
use crate::dialect::anthropic::from_chat::chat_to_anthropic;
use crate::dialect::anthropic::validate;
use crate::dialect::responses::validate as responses_validate;
use crate::dialect::Dialect;
use crate::recall::Offer;
use crate::summary::prompt::summary_message;
use serde::Serialize;
use serde_json::{Map, Value};
use std::io::{self, Write};

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
    /// The dialect the client speaks: traces are recorded as chat completions; for `Anthropic` every request is
    /// converted (`dialect::anthropic::from_chat`) and planned as the gateway plans a Messages request.
    pub dialect: Option<Dialect>,
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

/// One request of the replay: the client sends `messages[..index]`, the upstream answers `messages[index]`.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayStep {
    /// Index of the assistant message answering this request (= messages the client sent).
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
    /// The rewritten request recounted from scratch (recall reserve excluded): equals the planner's estimate
    /// when its cost model is right.
    pub recounted_tokens: Option<u64>,
    /// What is sent is a valid request that keeps the system prompt and the newest message (false when rejected).
    pub valid: bool,
    /// Why the request is invalid, or why it was refused.
    pub problem: Option<String>,
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
    /// Requests sent invalid (rejected ones are not counted here).
    pub invalid: usize,
    /// Requests refused.
    pub rejected: usize,
    /// Tokens the client sent, over all steps.
    pub client_tokens: u64,
    /// Tokens sent upstream, over all steps.
    pub upstream_tokens: u64,
    /// `1 - upstream / client` over the steps that were sent.
    pub savings: f64,
    /// Mean of `upstream / client` over the steps above the threshold that were sent; `None` when there are none.
    pub mean_ratio_above: Option<f64>,
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
            t.rejected += usize::from(s.outcome == Outcome::Reject);
            t.invalid += usize::from(s.outcome != Outcome::Reject && !s.valid);
            t.client_tokens += s.client_tokens;
            t.upstream_tokens += s.upstream_tokens;
            if s.outcome != Outcome::Reject {
                sent_client += s.client_tokens;
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
        t
    }
}

/// The replay of one trace.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The trace's `id`.
    pub id: String,
    /// The model name used for the encoding and the window.
    pub model: String,
    /// The dialect the requests were planned in (`chat`, `anthropic`).
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
    /// Index of the assistant message answering it (as in [`ReplayStep::index`]).
    pub index: usize,
    /// The client's body: `{"model", "messages", "tools"}` (no `tools` when the trace has none).
    pub client_body: Vec<u8>,
    /// The body sent upstream (the client's when forwarded); `None` when refused.
    pub upstream_body: Option<Vec<u8>>,
}

/// Replays `trace` (`{"id", "model", "tools", "messages": [...]}`) through the planner as the gateway would plan
/// it, with `cfg`'s `[context]`, `[prune]`, `[recall]`, `[summary]` and `[models]`: ratio 1.0, no first-seen
/// times, one token counter for the whole trace. `Err` when `trace` is not a trace.
pub fn replay_trace(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
) -> Result<ReplayReport, String> {
    replay(trace, opts, cfg, None)
}

/// [`replay_trace`], with the bytes of every request: the client's and what would go upstream.
pub fn replay_requests(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
) -> Result<(ReplayReport, Vec<ReplayedRequest>), String> {
    let mut requests = Vec::new();
    let report = replay(trace, opts, cfg, Some(&mut requests))?;
    Ok((report, requests))
}

fn replay(
    trace: &Value,
    opts: &ReplayOptions,
    cfg: &Config,
    mut requests: Option<&mut Vec<ReplayedRequest>>,
) -> Result<ReplayReport, String> {
    let obj = trace
        .as_object()
        .ok_or("not a trace: expected a JSON object")?;
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("not a trace: no \"messages\" array")?;
    if let Some(i) = messages.iter().position(|m| !m.is_object()) {
        return Err(format!("not a trace: message {i} is not an object"));
    }
    let tools = obj.get("tools").filter(|t| !t.is_null());
    let model = match &opts.model {
        Some(m) => m.clone(),
        None => obj
            .get("model")
            .and_then(Value::as_str)
            .and_then(|m| m.split_whitespace().next())
            .unwrap_or("unknown")
            .to_string(),
    };
    let window = match opts.window {
        Some(w) => w,
        None => {
            ModelTable::new(&cfg.models, cfg.context.default_context_window)?.context_window(&model)
        }
    };
    let strategy = opts.strategy.unwrap_or(cfg.context.strategy);
    let dialect = opts.dialect.unwrap_or(Dialect::Chat);
    let encoding = Encoding::for_model(&model);
    let counter = TokenCounter::new();
    let threshold_tokens = (cfg.context.threshold * window as f64) as u64;
    let summarizer = opts.summaries || cfg.summary.model.is_some();
    let summarizing = summarizer && matches!(strategy, Strategy::Summarize | Strategy::Hybrid);
    let mut ready: Vec<(usize, Value)> = Vec::new();
    let mut steps = Vec::new();
    for (k, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let chat_body = client_body(&model, &messages[..k], tools);
        let body = match dialect {
            Dialect::Chat => chat_body,
            Dialect::Anthropic => chat_to_anthropic(&chat_body),
            Dialect::Responses => {
                crate::dialect::responses::from_chat::chat_to_responses(&chat_body)
            }
        };
        let raw = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        // as the gateway parses and plans it
        let request = dialect
            .parse(bytes::Bytes::from(raw.clone()))
            .map_err(|e| format!("request {k}: {e}"))?;
        let sent = request.messages();
        let tools = request.body.get("tools").filter(|t| !t.is_null());
        let req = decide::Request {
            body: &request.body,
            messages: sent,
            key: dialect.conversation_key(),
            raw_len: raw.len(),
            encoding,
            window,
            ratio: 1.0,
            strategy,
            first_seen: None,
            now: NOW,
            summarizer,
        };
        let offer = Offer::new(dialect, &request.body, &cfg.recall);
        let client = counter.request_tokens(encoding, sent, tools);
        let plan = decide::plan_request(
            &req,
            summarizing.then_some(ready.as_slice()),
            cfg,
            &offer,
            &counter,
        );
        // a summary covers whole client messages, as in the gateway
        let wanted = decide::wanted_summary(&plan)
            .and_then(|n| request.summary_boundary(n))
            .map(|(n, _)| n);
        let rewritten = match &plan {
            Plan::Rewrite(rw) => Some(rw.owned_messages()),
            _ => None,
        };
        let serialise = |b: &crate::context::RewrittenBody<'_>| dialect.render(&request, b);
        let decision =
            decide::render(&req, plan, &offer, &counter, &serialise).map_err(|e| e.to_string())?;
        let upstream_body = match &decision {
            Decision::Forward { .. } => Some(raw.clone()),
            Decision::Rewrite(rw) => Some(rw.body.clone()),
            Decision::Reject { .. } => None,
        };
        let mut s = step(k, client, decision, sent, rewritten.as_deref());
        if let (Some(up), None) = (&upstream_body, &s.problem) {
            s.problem = api_problem(dialect, &body, up);
            s.valid = s.problem.is_none();
        }
        s.wanted_summary = wanted;
        s.recounted_tokens = rewritten
            .as_ref()
            .map(|r| counter.request_tokens(encoding, r, tools));
        s.above_threshold = client > threshold_tokens;
        if let Some(upto) = s.wanted_summary {
            if !ready.iter().any(|(u, _)| *u == upto) {
                ready.push((upto, stand_in_summary(upto, cfg.summary.max_tokens)));
                ready.sort_by_key(|(u, _)| *u);
            }
        }
        steps.push(s);
        if let Some(out) = requests.as_deref_mut() {
            out.push(ReplayedRequest {
                index: k,
                client_body: raw,
                upstream_body,
            });
        }
    }
    Ok(ReplayReport {
        id: obj
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        model,
        dialect: dialect.as_str(),
        encoding: encoding.as_str(),
        window,
        strategy: strategy.as_str(),
        summaries: summarizing,
        threshold_tokens,
        totals: ReplayTotals::of(&steps),
        steps,
    })
}

/// The body a client sends for `messages`: `{"model", "messages", "tools"}`.
fn client_body(model: &str, messages: &[Value], tools: Option<&Value>) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("model".into(), Value::from(model));
    body.insert("messages".into(), Value::Array(messages.to_vec()));
    if let Some(t) = tools {
        body.insert("tools".into(), t.clone());
    }
    body
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
        messages_sent: original.len(),
        stages: Vec::new(),
        cleared_results: 0,
        pruned_loops: 0,
        dropped_loops: 0,
        dropped_messages: 0,
        pruned_calls: 0,
        summary_upto: 0,
        wanted_summary: None,
        recounted_tokens: None,
        valid: true,
        problem: None,
    };
    match decision {
        Decision::Forward { .. } => {
            s.problem = check_sequence(original).err();
        }
        Decision::Reject {
            tokens,
            limit,
            window,
        } => {
            s.outcome = Outcome::Reject;
            s.upstream_tokens = 0;
            s.messages_sent = 0;
            s.problem = Some(format!(
                "rejected: the smallest rewrite is {tokens} tokens, over the hard limit of {limit} (window {window})"
            ));
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
            s.summary_upto = r.summary_upto;
            s.problem = check_rewrite(original, rewritten.unwrap_or_default()).err();
        }
    }
    s.valid = s.problem.is_none();
    s
}

/// What the dialect's API would refuse in the body sent upstream for the client's `client` body, or what a
/// rewrite may not change (chat's rules are checked on the neutral form, by [`step`]).
fn api_problem(dialect: Dialect, client: &Map<String, Value>, sent: &[u8]) -> Option<String> {
    if dialect == Dialect::Chat {
        return None;
    }
    let sent: Value = match serde_json::from_slice(sent) {
        Ok(v) => v,
        Err(e) => return Some(format!("the body sent is not JSON: {e}")),
    };
    let items = sent
        .get(dialect.conversation_key())
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let client = Value::Object(client.clone());
    let checked = match dialect {
        Dialect::Chat => Ok(()),
        Dialect::Anthropic => {
            validate::check_sequence(items).and_then(|()| validate::check_rewrite(&client, &sent))
        }
        Dialect::Responses => responses_validate::check_sequence(items)
            .and_then(|()| responses_validate::check_rewrite(&client, &sent)),
    };
    checked.err()
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

/// Writes one report as text: a line per step, then the totals.
pub fn write_text(out: &mut impl Write, name: &str, r: &ReplayReport) -> io::Result<()> {
    writeln!(
        out,
        "{name}: model {} ({}), window {}, strategy {}{}, threshold {} tokens",
        r.model,
        r.encoding,
        r.window,
        r.strategy,
        if r.summaries {
            " with simulated summaries"
        } else {
            ""
        },
        r.threshold_tokens
    )?;
    for s in &r.steps {
        let what = match s.outcome {
            Outcome::Forward => "forwarded".to_string(),
            Outcome::Reject => String::new(),
            Outcome::Rewrite => describe(s),
        };
        let verdict = match (&s.problem, s.outcome) {
            (None, _) => "valid".to_string(),
            (Some(p), Outcome::Reject) => format!("REJECTED ({p})"),
            (Some(p), _) => format!("INVALID ({p})"),
        };
        let wanted = s
            .wanted_summary
            .map_or_else(String::new, |n| format!("  (summary of 1-{n} wanted)"));
        writeln!(
            out,
            "  step {:>4}  client {:>7}  upstream {:>7}  {:>4.2}{}  {what}  {verdict}{wanted}",
            s.index,
            s.client_tokens,
            s.upstream_tokens,
            s.upstream_tokens as f64 / s.client_tokens.max(1) as f64,
            if s.above_threshold { "*" } else { " " },
        )?;
    }
    let t = &r.totals;
    writeln!(
        out,
        "  total: {} steps, {} above threshold (*), {} rewritten ({} summary-free), {} rejected, {} invalid; \
         tokens {} -> {} (saved {:.1}%); mean upstream/client above threshold: {}",
        t.steps,
        t.above_threshold,
        t.rewritten,
        t.rewritten - t.summarized,
        t.rejected,
        t.invalid,
        t.client_tokens,
        t.upstream_tokens,
        t.savings * 100.0,
        ratio(t.mean_ratio_above)
    )
}

/// What a rewrite did, in a few words.
fn describe(s: &ReplayStep) -> String {
    let parts: Vec<String> = [
        (s.cleared_results, "results cleared"),
        (s.pruned_loops, "loops pruned"),
        (s.dropped_loops, "loops dropped"),
        (s.dropped_messages, "messages dropped"),
        (s.pruned_calls, "calls recallable"),
        (s.summary_upto, "messages summarized"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    format!("rewritten [{}]: {}", s.stages.join("+"), parts.join(", "))
}

fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"))
}

/// Writes a table with one row per named report and an overall row (its ratio is the mean over every step above
/// the threshold, all files pooled).
pub fn write_summary(out: &mut impl Write, reports: &[(String, ReplayReport)]) -> io::Result<()> {
    let width = reports
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(0)
        .max(7);
    writeln!(
        out,
        "{:<width$} {:>5} {:>5} {:>5} {:>6} {:>7} {:>8} {:>9} {:>9} {:>6} {:>9}",
        "FILE",
        "STEPS",
        "ABOVE",
        "REWR",
        "NO-SUM",
        "INVALID",
        "REJECTED",
        "CLIENT",
        "UPSTREAM",
        "SAVED",
        "RATIO>THR"
    )?;
    let overall = ReplayTotals::of(reports.iter().flat_map(|(_, r)| &r.steps));
    let rows = reports.iter().map(|(n, r)| (n.as_str(), &r.totals));
    for (name, t) in rows.chain([("overall", &overall)]) {
        writeln!(
            out,
            "{:<width$} {:>5} {:>5} {:>5} {:>6} {:>7} {:>8} {:>9} {:>9} {:>5.1}% {:>9}",
            name,
            t.steps,
            t.above_threshold,
            t.rewritten,
            t.rewritten - t.summarized,
            t.invalid,
            t.rejected,
            t.client_tokens,
            t.upstream_tokens,
            t.savings * 100.0,
            ratio(t.mean_ratio_above)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// system, user, then `n` tool loops with results of ~`size` words, and a final reply.
    fn trace(n: usize, size: usize) -> Value {
        let mut m = vec![
            json!({"role":"system","content":"You are a coding agent."}),
            json!({"role":"user","content":"Fix the bug in the parser."}),
        ];
        for i in 0..n {
            let id = format!("call_{i}");
            m.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
                "function":{"name":"read_file","arguments":format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}));
            let body = format!("line {i} of some file ").repeat(size);
            m.push(json!({"role":"tool","tool_call_id":id,"content":body}));
        }
        m.push(json!({"role":"assistant","content":"Fixed."}));
        json!({"id":"hand","model":"gpt-4o (agent)","tools":[],"messages":m})
    }

    #[test]
    fn small_trace_is_forwarded_whole() {
        let r = replay_trace(&trace(3, 10), &ReplayOptions::default(), &Config::default()).unwrap();
        assert_eq!(
            (r.model.as_str(), r.window, r.encoding),
            ("gpt-4o", 128_000, "o200k_base")
        );
        assert_eq!(r.steps.len(), 4);
        assert_eq!(
            r.steps.iter().map(|s| s.index).collect::<Vec<_>>(),
            [2, 4, 6, 8]
        );
        assert!(r.steps.iter().all(|s| s.outcome == Outcome::Forward
            && s.valid
            && s.upstream_tokens == s.client_tokens));
        assert_eq!(r.totals.savings, 0.0);
        assert_eq!(r.totals.mean_ratio_above, None);
    }

    #[test]
    fn large_trace_is_rewritten_validly_and_cheaper() {
        let opts = ReplayOptions {
            window: Some(4000),
            ..Default::default()
        };
        let r = replay_trace(&trace(30, 40), &opts, &Config::default()).unwrap();
        let above: Vec<&ReplayStep> = r.steps.iter().filter(|s| s.above_threshold).collect();
        assert!(!above.is_empty());
        for s in &r.steps {
            assert!(s.valid, "step {}: {:?}", s.index, s.problem);
            assert_ne!(s.outcome, Outcome::Reject);
        }
        for s in above {
            assert_eq!(s.outcome, Outcome::Rewrite);
            assert!(s.upstream_tokens < s.client_tokens);
            assert!(s.stages.contains(&"cleared") && s.pruned_calls > 0);
            assert!(
                s.recounted_tokens.is_some_and(|r| r < s.upstream_tokens),
                "the recall tools and note are counted"
            );
        }
        let t = &r.totals;
        assert_eq!((t.invalid, t.rejected), (0, 0));
        assert!(t.rewritten >= t.above_threshold && t.savings > 0.0);
        assert!(t.mean_ratio_above.is_some_and(|m| m < 1.0));
        let mut text = Vec::new();
        write_text(&mut text, "hand", &r).unwrap();
        write_summary(&mut text, &[("hand".into(), r)]).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("results cleared") && text.contains("overall"));
    }

    #[test]
    fn options_override_model_window_and_strategy() {
        let opts = ReplayOptions {
            window: Some(4000),
            strategy: Some(Strategy::Off),
            model: Some("gpt-4".into()),
            summaries: false,
            dialect: None,
        };
        let r = replay_trace(&trace(30, 40), &opts, &Config::default()).unwrap();
        assert_eq!((r.encoding, r.strategy), ("cl100k_base", "off"));
        assert!(r
            .steps
            .iter()
            .all(|s| s.outcome == Outcome::Forward && s.valid));
        assert_eq!(r.totals.mean_ratio_above, Some(1.0));
    }

    #[test]
    fn simulated_summaries_are_sent_on_later_turns() {
        let opts = ReplayOptions {
            window: Some(4000),
            strategy: Some(Strategy::Summarize),
            summaries: true,
            ..Default::default()
        };
        let r = replay_trace(&trace(30, 40), &opts, &Config::default()).unwrap();
        assert!(r.summaries);
        for s in &r.steps {
            assert!(s.valid, "step {}: {:?}", s.index, s.problem);
            assert_ne!(s.outcome, Outcome::Reject);
        }
        let first = r.steps.iter().position(|s| s.wanted_summary.is_some());
        let first = first.unwrap();
        assert_eq!(r.steps[first].summary_upto, 0);
        assert!(r.steps[first + 1..].iter().any(|s| s.summary_upto > 0));
        assert!(r.totals.summarized > 0 && r.totals.summarized <= r.totals.rewritten);
        let t = TokenCounter::new().message_tokens(Encoding::O200k, &stand_in_summary(9, 1000));
        assert!((900..=1000).contains(&t), "{t}");
    }

    #[test]
    fn invalid_history_and_non_traces_are_reported() {
        let bad = json!({"messages":[{"role":"tool","tool_call_id":"x","content":"orphan"},
            {"role":"assistant","content":"hi"}]});
        let r = replay_trace(&bad, &ReplayOptions::default(), &Config::default()).unwrap();
        assert!(!r.steps[0].valid && r.totals.invalid == 1);
        let cfg = Config::default();
        for (v, needle) in [
            (json!([1]), "JSON object"),
            (json!({"id":"x"}), "\"messages\""),
            (json!({"messages":[1]}), "message 0"),
        ] {
            let e = replay_trace(&v, &ReplayOptions::default(), &cfg).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }
}
