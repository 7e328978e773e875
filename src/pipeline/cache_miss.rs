//! Why a turn missed the provider's prompt cache: what it sent is compared with what the session's previous turn
//! sent (kept with the session as hashes, `session::SentPrint`: no message text), giving where the request first
//! differs (the tools, the system prompt, or a message index and the byte within that message's JSON) and why —
//! the time since the previous turn passed the model's `cache_ttl` (`gap`), another model (`model`), the client's
//! tools changed (`tools`), ctxgate's rewrite of the prefix changed (`recut`, with its stage), or the client
//! changed or dropped an earlier message or its system prompt (`client`). The turn's record carries it with the
//! cached and uncached tokens the provider reported and their price; the missed tokens are counted by cause.
//!
//! Nothing here may fail a request: anything it cannot read leaves the turn without the analysis.

use super::measure::Reported;
use super::turn_record::Segment;
use crate::app::Rates;
use crate::dialect::{AssembledReply, Request as Parsed};
use crate::session::manager::SessionEntry;
use crate::session::{RequestMark, SentPrint, SentRewrite};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the analysis needs of a turn, taken when it is planned.
pub(super) struct Probe {
    entry: Arc<SessionEntry>,
    request: Arc<Parsed>,
    print: SentPrint,
}

/// Where a turn's request first differed from its session's previous one, and why it missed the cache.
#[derive(Debug, Clone, Serialize)]
pub struct CacheReport {
    /// Why the turn missed the cache: `gap`, `model`, `tools`, `recut` or `client`; absent when what was sent
    /// extends the previous turn's request exactly within the model's `cache_ttl` (or there was no previous turn).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    /// For `recut`: the stage whose cut moved (`cleared`, `pruned`, `folded`, `summarized`, `truncated`), or
    /// `recall` when only the recall tools came or went, or `none` when the rewrite stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<&'static str>,
    /// Where the first difference is: `tools`, `system` or `messages` (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<&'static str>,
    /// The index, in the conversation array sent, of the first element that differs (or the first one dropped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// The byte, within that element's compact JSON, where it first differs (when both versions are at hand).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub byte: Option<usize>,
    /// Milliseconds since the previous turn's request arrived (absent: no previous turn known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<u64>,
    /// The model's prompt-cache lifetime in force (`[models] cache_ttl`), in seconds (turns with a cause).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_ttl_secs: Option<u64>,
    /// Prompt tokens the provider reported read from its cache (absent: not reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Prompt tokens the provider reported not read from its cache, cache writes included (absent when it
    /// reported no cached count: then they are the turn's `tokens.upstream_prompt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncached_tokens: Option<u64>,
    /// The tokens counted as missed (`ctxgate_cache_miss_tokens_total`): with a cause, the uncached prompt tokens
    /// the provider reported, else (no cached count) the estimate of the tokens sent from the first difference on;
    /// absent: none.
    #[serde(skip_serializing_if = "is_zero")]
    pub missed_tokens: u64,
    /// `missed_tokens` is an estimate (the provider reported no cached tokens).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    /// Their price (a priced model's turns only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dollars: Option<CacheDollars>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The cache's share of a turn's input, in US dollars.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CacheDollars {
    /// The cached tokens at the `cached_input` price.
    pub cached: f64,
    /// The uncached tokens at the `input` price (cache writes at `cache_write`).
    pub uncached: f64,
    /// What the missed tokens cost more than had they hit: `missed_tokens` × (`input` − `cached_input`).
    pub missed: f64,
}

/// The xxh3 of a value's compact JSON, written straight into the hasher; 0 for none.
fn hash_value(v: Option<&Value>) -> u64 {
    struct W(xxhash_rust::xxh3::Xxh3);
    impl std::io::Write for W {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return 0;
    };
    let mut w = W(xxhash_rust::xxh3::Xxh3::new());
    match serde_json::to_writer(&mut w, v) {
        Ok(()) => w.0.digest().max(1),
        Err(_) => 1,
    }
}

impl Probe {
    /// The probe of a request that arrived at `at`, landed at `mark`, with its elements' hashes `client`, planned
    /// with `rewrite` (cuts, stages, recall offered) for `model`.
    pub(super) fn new(
        mark: &RequestMark,
        request: &Arc<Parsed>,
        at: Instant,
        client: Vec<u64>,
        rewrite: Option<SentRewrite>,
        model: &str,
    ) -> Probe {
        let body = &request.body;
        let system = request.dialect.system_key().and_then(|k| body.get(k));
        Probe {
            entry: Arc::clone(&mark.entry),
            request: Arc::clone(request),
            print: SentPrint {
                at: Some(at),
                model: xxhash_rust::xxh3::xxh3_64(model.as_bytes()),
                tools: hash_value(body.get("tools")),
                system: hash_value(system),
                client,
                sent: Vec::new(),
                from: Vec::new(),
                rewrite,
                leaf: mark.leaf.clone(),
            },
        }
    }

    /// The analysis of the turn, once it was answered with `reply` and `segments` (what was sent) are known;
    /// `sent_tokens`: the estimate of what was sent, `rates` the model's price, `ttl` its cache's lifetime. Keeps
    /// what was sent with the session for the next turn. `None` for a failed turn, or when what was sent cannot be
    /// read.
    pub(super) fn finish(
        mut self,
        success: bool,
        segments: &[Segment],
        reply: &AssembledReply,
        sent_tokens: Option<u64>,
        (reported, rates, ttl): (&Reported, Option<&Rates>, Duration),
    ) -> Option<CacheReport> {
        if !success || self.print.client.len() != self.request.native().len() {
            return None;
        }
        let native = self.request.native();
        if self.print.rewrite.is_some() {
            if segments.is_empty() {
                // What was sent could not be worked out: the previous turn's print stays.
                tracing::debug!(session = %self.entry.id, "cache: what a rewritten turn sent is unknown");
                return None;
            }
            for s in segments {
                match s {
                    Segment::Nodes { from, to } => {
                        for p in *from..*to {
                            self.print.sent.push(*self.print.client.get(p)?);
                            self.print.from.push(u32::try_from(p).ok()?);
                        }
                    }
                    Segment::Literal { literal, .. } => {
                        self.print.sent.push(hash_value(Some(literal)));
                        self.print.from.push(u32::MAX);
                    }
                    Segment::Resent { at, .. } => {
                        self.print.sent.push(*self.print.client.get(*at)?);
                        self.print.from.push(u32::try_from(*at).ok()?);
                    }
                }
            }
        }
        let (n, rewritten) = (self.print.sent_len(), self.print.rewrite.is_some());
        let print = std::mem::take(&mut self.print);
        let (prev, diff) = self.entry.swap_sent(print, |p, c| compare(p, c, ttl));
        let mut report = CacheReport {
            cause: None,
            stage: None,
            part: None,
            index: None,
            byte: None,
            gap_ms: diff.as_ref().map(|d| d.gap_ms),
            cache_ttl_secs: None,
            cached_tokens: None,
            uncached_tokens: None,
            missed_tokens: 0,
            estimated: false,
            dollars: None,
        };
        if let Some(d) = &diff {
            report.cause = d.cause;
            report.stage = d.stage;
            report.part = d.part;
            report.index = d.index;
            if let (Some(prev), Some(i)) = (&prev, d.index) {
                report.byte = self.byte_at(prev, rewritten, segments, native, i);
            }
        }
        // The first upstream round's usage: later recall rounds build on it, not on the previous turn.
        let (prompt, cached, write) = match reply.round_usage.first() {
            None => (reported.prompt, reported.cached, reported.cache_write),
            Some(u) => (
                crate::dialect::reply::usage_prompt_tokens(u),
                crate::dialect::reply::usage_cached_tokens(u),
                crate::dialect::reply::usage_cache_write_tokens(u),
            ),
        };
        report.cached_tokens = cached;
        // Without a cached count the uncached tokens are the turn's prompt tokens, already in its record.
        report.uncached_tokens = cached
            .and(prompt)
            .map(|p| p.saturating_sub(cached.unwrap_or(0)));
        if report.cause.is_none() {
            return Some(report);
        }
        report.cache_ttl_secs = Some(ttl.as_secs());
        match (prompt, cached) {
            (Some(p), Some(c)) => report.missed_tokens = p.saturating_sub(c),
            _ => {
                report.estimated = true;
                report.missed_tokens = match (sent_tokens.or(prompt), report.index) {
                    (Some(t), Some(i)) if report.part == Some("messages") && n > 0 => {
                        t * (n - i.min(n)) as u64 / n as u64
                    }
                    (Some(t), _) => t,
                    (None, _) => 0,
                };
            }
        }
        if let (Some(r), Some(p)) = (rates, prompt) {
            let cached = cached.unwrap_or(0).min(p);
            let write = write.unwrap_or(0).min(p - cached);
            let plain = p - cached - write;
            report.dollars = Some(CacheDollars {
                cached: cached as f64 * r.cached_input,
                uncached: plain as f64 * r.input + write as f64 * r.cache_write,
                missed: report.missed_tokens as f64 * (r.input - r.cached_input).max(0.0),
            });
        }
        Some(report)
    }

    /// The byte where element `i` sent now first differs from the previous turn's element `i`, within their
    /// compact JSON; `None` when either is not at hand (one ctxgate wrote last turn, or none now).
    fn byte_at(
        &self,
        prev: &SentPrint,
        rewritten: bool,
        segments: &[Segment],
        native: &[Value],
        i: usize,
    ) -> Option<usize> {
        let now = current_element(rewritten, segments, native, i)?;
        let was_at = if prev.rewrite.is_some() {
            let p = *prev.from.get(i)?;
            (p != u32::MAX).then_some(p as usize)?
        } else {
            i
        };
        let was = self.entry.with_tree(|t| {
            let path = t.path_to(prev.leaf.as_ref());
            path.get(was_at)
                .and_then(|n| serde_json::to_vec(&*n.message).ok())
        })?;
        let now = serde_json::to_vec(now).ok()?;
        Some(was.iter().zip(&now).take_while(|(a, b)| a == b).count())
    }
}

/// The element `i` sent this turn: the client's own, or one ctxgate wrote.
fn current_element<'a>(
    rewritten: bool,
    segments: &'a [Segment],
    native: &'a [Value],
    i: usize,
) -> Option<&'a Value> {
    if !rewritten {
        return native.get(i);
    }
    let mut k = 0;
    for s in segments {
        match s {
            Segment::Nodes { from, to } => {
                if i < k + (to - from) {
                    return native.get(from + (i - k));
                }
                k += to - from;
            }
            Segment::Literal { literal, .. } | Segment::Resent { literal, .. } => {
                if i == k {
                    return Some(literal);
                }
                k += 1;
            }
        }
    }
    None
}

trait Sent {
    fn sent_hashes(&self) -> &[u64];
    fn sent_len(&self) -> usize {
        self.sent_hashes().len()
    }
}

impl Sent for SentPrint {
    /// The hashes of the elements sent: the client's own unless a rewrite changed them.
    fn sent_hashes(&self) -> &[u64] {
        if self.rewrite.is_some() {
            &self.sent
        } else {
            &self.client
        }
    }
}

/// What comparing two turns' prints found.
#[derive(Debug, PartialEq)]
struct Diff {
    cause: Option<&'static str>,
    stage: Option<&'static str>,
    part: Option<&'static str>,
    index: Option<usize>,
    gap_ms: u64,
}

/// The first index where `b` differs from `a`, or where `b` ends before `a` does; `None` when `b` extends `a`.
fn first_difference(a: &[u64], b: &[u64]) -> Option<usize> {
    let i = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    (i < a.len()).then_some(i)
}

/// Where and why `cur` differs from `prev`, the previous turn's print, for a model whose cache lasts `ttl`.
fn compare(prev: &SentPrint, cur: &SentPrint, ttl: Duration) -> Diff {
    let gap = match (prev.at, cur.at) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    };
    let index = first_difference(prev.sent_hashes(), cur.sent_hashes());
    let injected = |p: &SentPrint| p.rewrite.as_ref().is_some_and(|r| r.injected);
    let recall_changed = injected(prev) != injected(cur);
    let part = if prev.tools != cur.tools || recall_changed {
        Some("tools")
    } else if prev.system != cur.system {
        Some("system")
    } else {
        index.map(|_| "messages")
    };
    let rewrite_changed = prev.rewrite != cur.rewrite;
    let client_changed = first_difference(&prev.client, &cur.client).is_some();
    let (cause, stage) = if gap > ttl {
        (Some("gap"), None)
    } else if prev.model != cur.model {
        (Some("model"), None)
    } else if prev.tools != cur.tools {
        (Some("tools"), None)
    } else if prev.system != cur.system {
        (Some("client"), None)
    } else if recall_changed && index.is_none() {
        (Some("recut"), Some("recall"))
    } else if index.is_some() && (rewrite_changed || !client_changed) {
        (
            Some("recut"),
            Some(stage_of(prev.rewrite.as_ref(), cur.rewrite.as_ref())),
        )
    } else if index.is_some() {
        (Some("client"), None)
    } else if recall_changed {
        (Some("recut"), Some("recall"))
    } else {
        (None, None)
    };
    Diff {
        cause,
        stage,
        part,
        index: if part == Some("messages") {
            index
        } else {
            index.filter(|_| cause.is_some())
        },
        gap_ms: u64::try_from(gap.as_millis()).unwrap_or(u64::MAX),
    }
}

/// The stage of a re-cut: the first stage (in the order they apply) whose cut point moved between the two
/// rewrites, else the first stage of the new rewrite (or of the old one, when it stopped: `none`).
fn stage_of(prev: Option<&SentRewrite>, cur: Option<&SentRewrite>) -> &'static str {
    // The cuts' slots (see `context::CompressionRecord::cuts`) and the stage each belongs to.
    const SLOTS: [&str; 9] = [
        "cleared",
        "pruned",
        "pruned",
        "truncated",
        "summarized",
        "folded",
        "cleared",
        "cleared",
        "cleared",
    ];
    match (prev, cur) {
        (Some(p), Some(c)) => {
            let moved: Vec<&'static str> = SLOTS
                .iter()
                .zip(p.cuts.iter().zip(&c.cuts))
                .filter(|(_, (a, b))| a != b)
                .map(|(s, _)| *s)
                .collect();
            c.stages
                .iter()
                .chain(&p.stages)
                .find(|s| moved.contains(s))
                .or(moved.first())
                .or(c.stages.first())
                .copied()
                .unwrap_or("rewritten")
        }
        (None, Some(c)) => c.stages.first().copied().unwrap_or("rewritten"),
        (Some(_), None) => "none",
        (None, None) => "rewritten",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(at: Instant, client: &[u64]) -> SentPrint {
        SentPrint {
            at: Some(at),
            model: 1,
            client: client.to_vec(),
            ..SentPrint::default()
        }
    }

    fn rewrite(cuts: [usize; 9], stages: &[&'static str], injected: bool) -> Option<SentRewrite> {
        Some(SentRewrite {
            cuts,
            stages: stages.to_vec(),
            injected,
        })
    }

    const TTL: Duration = Duration::from_secs(300);

    #[test]
    fn an_exact_extension_is_no_miss() {
        let t = Instant::now();
        let d = compare(&print(t, &[1, 2]), &print(t, &[1, 2, 3, 4]), TTL);
        assert_eq!(d.cause, None);
        assert_eq!(d.index, None);
        assert_eq!(d.part, None);
    }

    #[test]
    fn causes_in_their_order() {
        let t = Instant::now();
        let later = t + Duration::from_secs(301);
        let prev = print(t, &[1, 2]);
        // a gap wins over everything, even an exact extension
        let d = compare(&prev, &print(later, &[1, 2, 3]), TTL);
        assert_eq!((d.cause, d.index), (Some("gap"), None));
        assert_eq!(d.gap_ms, 301_000);
        // the client's edit
        let d = compare(&prev, &print(t, &[1, 9, 3]), TTL);
        assert_eq!(
            (d.cause, d.part, d.index),
            (Some("client"), Some("messages"), Some(1))
        );
        // a dropped message
        let d = compare(&prev, &print(t, &[1]), TTL);
        assert_eq!((d.cause, d.index), (Some("client"), Some(1)));
        // tools
        let mut tools = print(t, &[1, 2, 3]);
        tools.tools = 7;
        let d = compare(&prev, &tools, TTL);
        assert_eq!((d.cause, d.part), (Some("tools"), Some("tools")));
        // the model
        let mut other = print(t, &[1, 2, 3]);
        other.model = 2;
        assert_eq!(compare(&prev, &other, TTL).cause, Some("model"));
        // a system prompt is the client's
        let mut sys = print(t, &[1, 2, 3]);
        sys.system = 5;
        let d = compare(&prev, &sys, TTL);
        assert_eq!((d.cause, d.part), (Some("client"), Some("system")));
    }

    #[test]
    fn a_recut_names_its_stage() {
        let t = Instant::now();
        let prev = print(t, &[1, 2, 3]);
        let mut cur = print(t, &[1, 2, 3, 4]);
        cur.rewrite = rewrite([0, 0, 0, 0, 0, 0, 0, 0, 0], &["cleared"], false);
        cur.sent = vec![1, 20, 3, 4];
        let d = compare(&prev, &cur, TTL);
        assert_eq!(
            (d.cause, d.stage, d.index),
            (Some("recut"), Some("cleared"), Some(1))
        );
        // the same cuts on the next turn: an extension
        let mut next = cur.clone();
        next.client.push(5);
        next.sent.push(5);
        assert_eq!(compare(&cur, &next, TTL).cause, None);
        // deeper: the prune cut moved
        let mut deeper = next.clone();
        deeper.rewrite = rewrite([2, 3, 0, 0, 0, 0, 0, 0, 0], &["cleared", "pruned"], true);
        deeper.sent = vec![1, 21, 4, 5];
        let d = compare(&next, &deeper, TTL);
        assert_eq!((d.cause, d.part), (Some("recut"), Some("tools")));
        assert_eq!(d.stage, Some("cleared"));
        // the client edited a message under an unchanged rewrite: the client's
        let mut edited = next.clone();
        edited.client[3] = 40;
        edited.sent[3] = 40;
        let d = compare(&next, &edited, TTL);
        assert_eq!((d.cause, d.index), (Some("client"), Some(3)));
    }

    #[test]
    fn hashes_of_values() {
        assert_eq!(hash_value(None), 0);
        assert_eq!(hash_value(Some(&Value::Null)), 0);
        let a = serde_json::json!([{"name": "a"}]);
        assert_eq!(hash_value(Some(&a)), hash_value(Some(&a.clone())));
        assert_ne!(
            hash_value(Some(&a)),
            hash_value(Some(&serde_json::json!([])))
        );
    }
}
