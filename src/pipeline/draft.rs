//! A turn's record before its answer (`turn_record`): what was sent and how, started as soon as the request is
//! planned so that its segments are worked out while the upstream answers.

use super::cache_miss::{CacheReport, Probe};
use super::measure::Reported;
use super::{turn_record, Exchange, Outgoing};
use crate::app::{Money, Rates};
use crate::config::Strategy;
use crate::dialect::Request as Parsed;
use crate::relay::RelayOutcome;
use crate::session::manager::now_secs;
use crate::session::{RequestMark, SentRewrite};
use serde_json::Value;
use std::sync::Arc;

impl Exchange {
    /// The turn's record as far as it is known once `outgoing` is planned (recorded sessions only).
    pub(super) fn draft(&mut self, outgoing: &Outgoing) -> Option<TurnDraft> {
        let mark = self.mark.as_ref()?;
        let mut draft = TurnDraft::new(&self.request, mark, self.strategy, outgoing);
        // What the cache analysis compares with the next turn (the model that answers).
        let model = outgoing.fallback.as_deref().unwrap_or(&self.request.model);
        let rewrite = outgoing.rewrite.as_ref().map(|r| SentRewrite {
            cuts: r.record.cuts,
            stages: r.record.stages.clone(),
            injected: r.injected,
        });
        draft.probe = Some(Probe::new(
            mark,
            &self.request,
            self.started,
            std::mem::take(&mut self.item_hashes),
            rewrite,
            model,
        ));
        Some(draft)
    }
}

/// A turn's record before its answer: what was sent (its segments computed in the background while the upstream
/// answers, and only for a rewritten request) and the recall calls answered meanwhile.
pub(super) struct TurnDraft {
    info: turn_record::TurnInfo,
    segments: Segments,
    /// Each recall round's calls (one entry per round).
    pub calls: Arc<parking_lot::Mutex<Vec<Value>>>,
    /// What the turn's cache analysis needs.
    probe: Option<Probe>,
}

/// What was sent: known at once (sent as it was), or being worked out in the background (rewritten).
enum Segments {
    Ready(Vec<turn_record::Segment>),
    Pending(tokio::task::JoinHandle<Vec<turn_record::Segment>>),
}

/// A conversation field as an array of elements: none when absent, the value itself when not an array.
pub(super) fn conversation_array(v: Option<&Value>) -> std::borrow::Cow<'_, [Value]> {
    match v {
        Some(Value::Array(a)) => a.as_slice().into(),
        None | Some(Value::Null) => Vec::new().into(),
        Some(other) => vec![other.clone()].into(),
    }
}

impl TurnDraft {
    fn new(
        request: &Arc<Parsed>,
        mark: &RequestMark,
        strategy: Strategy,
        outgoing: &Outgoing,
    ) -> TurnDraft {
        let rw = outgoing.rewrite.as_ref();
        let client = outgoing.client_tokens;
        let native = request.native();
        // Replies the client sent back in other bytes than the stored node's (the same message to the tree).
        let resent: Vec<(usize, Value)> = mark.entry.with_tree(|t| {
            mark.path
                .iter()
                .zip(native)
                .enumerate()
                .filter_map(|(i, (id, m))| {
                    let n = t.get(id)?;
                    (n.kind == crate::store::NodeKind::Reply && *n.message != *m)
                        .then(|| (i, m.clone()))
                })
                .collect()
        });
        let segments = match rw {
            None => Segments::Ready(turn_record::with_resent(
                turn_record::unchanged(native.len()),
                &resent,
            )),
            Some(_) => {
                // The client's elements are the parsed request's; only what was sent is parsed (again).
                let (client, sent, key) = (
                    Arc::clone(request),
                    outgoing.body.clone(),
                    request.dialect.conversation_key(),
                );
                Segments::Pending(tokio::spawn(async move {
                    let sent = serde_json::from_slice::<Value>(&sent).ok();
                    let sent = conversation_array(sent.as_ref().and_then(|v| v.get(key)));
                    let segments =
                        turn_record::segments(&sent, &conversation_array(client.body.get(key)));
                    turn_record::with_resent(segments, &resent)
                }))
            }
        };
        TurnDraft {
            info: turn_record::TurnInfo {
                at: now_secs(),
                model: request.model.clone(),
                fallback: outgoing.fallback.clone(),
                dialect: request.dialect.as_str(),
                stream: request.stream,
                status: 0,
                strategy: strategy.as_str(),
                rewritten: rw.is_some(),
                stages: rw.map_or_else(Vec::new, |r| {
                    r.record.stages.iter().map(|s| s.to_string()).collect()
                }),
                cuts: rw.map_or_else(Vec::new, |r| r.record.cuts.to_vec()),
                head: mark.path.last().cloned().unwrap_or_default(),
                tokens: turn_record::TurnTokens {
                    client,
                    sent: rw.map_or(client, |r| Some(r.record.tokens_after)),
                    window: outgoing.window,
                    upstream_prompt: None,
                    output: None,
                },
                summary_upto: rw.map_or(0, |r| r.record.summary_upto),
                recall_rounds: 0,
                recall_calls: Vec::new(),
                sent: Vec::new(),
                dollars: None,
                cache: None,
            },
            segments,
            calls: Arc::new(parking_lot::Mutex::new(Vec::new())),
            probe: None,
        }
    }

    /// The stored record, once the turn ended with `status` and `outcome` (priced at `rates`), with its cache
    /// analysis.
    pub(super) async fn finish(
        self,
        status: u16,
        outcome: &RelayOutcome,
        money: Option<Money>,
        priced: (&Reported, Option<&Rates>, std::time::Duration),
    ) -> (String, Option<CacheReport>) {
        let mut info = self.info;
        info.status = status;
        info.dollars = money;
        info.tokens.upstream_prompt = outcome.reply.prompt_tokens();
        info.tokens.output = outcome.reply.completion_tokens();
        if !info.rewritten && info.tokens.client.is_none() {
            // Not counted (clearly under the threshold): what the upstream counted is what the client sent.
            info.tokens.client = info.tokens.upstream_prompt;
            info.tokens.sent = info.tokens.upstream_prompt;
        }
        let rounds = std::mem::take(&mut *self.calls.lock());
        info.recall_rounds = rounds.len();
        info.recall_calls = rounds
            .into_iter()
            .flat_map(|r| match r {
                Value::Array(calls) => calls,
                _ => Vec::new(),
            })
            .collect();
        info.sent = match self.segments {
            Segments::Ready(s) => s,
            Segments::Pending(task) => task.await.unwrap_or_default(),
        };
        let success = (200..300).contains(&status);
        info.cache = self.probe.and_then(|p| {
            p.finish(
                success,
                &info.sent,
                &outcome.reply,
                info.tokens.sent,
                priced,
            )
        });
        (turn_record::to_json(&info), info.cache.clone())
    }
}
