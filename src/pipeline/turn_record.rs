//! The record of one turn: what went upstream, stored compactly — ranges of the request's own messages (by their
//! position on the path to the turn's head node) and, literally, only the elements a rewrite changed or added —
//! with the turn's tokens, strategy, cut points and recall calls. Read back by `session::turns`.

use crate::app::Money;
use crate::context::shape::{CLEARED_INPUT_KEY, PINNED_MARKER, PLACEHOLDER_PREFIX};
use crate::recall::{DROPPED_PREFIX, NOTE_PREFIX};
use crate::summary::prompt::SUMMARY_PREFIX;
use serde::Serialize;
use serde_json::Value;

/// One stretch of what was sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Segment {
    /// The request's messages `from..to` (positions on the path to the head), sent as the client sent them.
    Nodes {
        /// First position.
        from: usize,
        /// One past the last position.
        to: usize,
    },
    /// An element the rewrite changed or added, as sent.
    Literal {
        /// The element exactly as the upstream received it.
        literal: Value,
        /// `cleared`, `summary`, `note`, `pinned` or `rewritten`.
        kind: &'static str,
        /// Positions of the request's messages it stands for.
        replaces: Vec<usize>,
    },
    /// The request's message at position `at`, sent as the client sent it, which differs in its bytes from the
    /// stored node (a reply the client sent back with fields added or dropped: the same message to the tree).
    Resent {
        /// Its position.
        at: usize,
        /// The element as sent.
        literal: Value,
    },
}

/// `segments` with the positions in `resent` (ascending, with the client's elements) cut out of their ranges.
pub fn with_resent(segments: Vec<Segment>, resent: &[(usize, Value)]) -> Vec<Segment> {
    if resent.is_empty() {
        return segments;
    }
    let mut out = Vec::with_capacity(segments.len() + resent.len() * 2);
    for s in segments {
        let Segment::Nodes { from, to } = s else {
            out.push(s);
            continue;
        };
        let mut start = from;
        for (at, literal) in resent.iter().filter(|(at, _)| (from..to).contains(at)) {
            if start < *at {
                out.push(Segment::Nodes {
                    from: start,
                    to: *at,
                });
            }
            out.push(Segment::Resent {
                at: *at,
                literal: literal.clone(),
            });
            start = at + 1;
        }
        if start < to {
            out.push(Segment::Nodes { from: start, to });
        }
    }
    out
}

/// What a request of `n` messages sent unchanged is: one range.
pub fn unchanged(n: usize) -> Vec<Segment> {
    if n == 0 {
        Vec::new()
    } else {
        vec![Segment::Nodes { from: 0, to: n }]
    }
}

/// The kind of an element ctxgate changed or added, from the markers its rewrites leave.
fn kind_of(element: &Value) -> &'static str {
    let text = element.to_string();
    if text.contains(SUMMARY_PREFIX) {
        "summary"
    } else if text.contains(NOTE_PREFIX) || text.contains(DROPPED_PREFIX) {
        "note"
    } else if text.contains(PINNED_MARKER) {
        "pinned"
    } else if text.contains(PLACEHOLDER_PREFIX) || text.contains(CLEARED_INPUT_KEY) {
        "cleared"
    } else {
        "rewritten"
    }
}

/// Whether two elements are the same kind of thing (role, or item type), so that one can stand for the other.
fn same_shape(a: &Value, b: &Value) -> bool {
    let of = |v: &Value, k: &str| v.get(k).cloned();
    of(a, "role") == of(b, "role") && of(a, "type") == of(b, "type")
}

/// The segments of `sent` (the conversation array that went upstream) against `native` (the client's own
/// elements, in order): every element equal to one of the client's is a reference to it, every other element a
/// literal. Elements are matched in order; the client's elements a rewrite left out (pruned, dropped, covered by a
/// summary) are simply not referenced.
pub fn segments(sent: &[Value], native: &[Value]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let mut next = 0; // the first client element not yet matched
    let find = |from: usize, e: &Value| (from..native.len()).find(|&q| native[q] == *e);
    for (k, e) in sent.iter().enumerate() {
        let exact = if native.get(next) == Some(e) {
            Some(next)
        } else if matches!(kind_of(e), "rewritten") {
            find(next, e)
        } else {
            None
        };
        if let Some(q) = exact {
            match out.last_mut() {
                Some(Segment::Nodes { to, .. }) if *to == q => *to = q + 1,
                _ => out.push(Segment::Nodes { from: q, to: q + 1 }),
            }
            next = q + 1;
            continue;
        }
        let kind = kind_of(e);
        let replaces = match kind {
            "note" => Vec::new(),
            // A summary stands for what it skips: up to the next element sent unchanged.
            "summary" => {
                let upto = sent[k + 1..]
                    .iter()
                    .find_map(|later| find(next, later))
                    .unwrap_or(next);
                let r = (next..upto).collect();
                next = upto;
                r
            }
            _ => match native.get(next) {
                Some(n) if same_shape(n, e) => {
                    next += 1;
                    vec![next - 1]
                }
                _ => Vec::new(),
            },
        };
        out.push(Segment::Literal {
            literal: e.clone(),
            kind,
            replaces,
        });
    }
    out
}

/// Everything a turn record holds besides its segments.
#[derive(Debug, Clone, Serialize)]
pub struct TurnInfo {
    /// Unix seconds when the request arrived.
    pub at: i64,
    /// The request's model.
    pub model: String,
    /// The model that answered instead (`context.on_overflow = "fallback"`); absent when `model` did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// `chat`, `anthropic` or `responses`.
    pub dialect: &'static str,
    /// A streamed request.
    pub stream: bool,
    /// The upstream's status.
    pub status: u16,
    /// The strategy in force.
    pub strategy: &'static str,
    /// The messages were rewritten.
    pub rewritten: bool,
    /// The stages that changed something.
    pub stages: Vec<String>,
    /// The rewrite's cut points (empty without a rewrite).
    pub cuts: Vec<usize>,
    /// Node id of the request's last message.
    pub head: String,
    /// Token counts.
    pub tokens: TurnTokens,
    /// Messages covered by the summary sent (0: none).
    pub summary_upto: usize,
    /// Recall rounds ctxgate answered.
    pub recall_rounds: usize,
    /// The recall and search calls it answered: name and arguments.
    pub recall_calls: Vec<Value>,
    /// What was sent (filled when the turn ends).
    pub sent: Vec<Segment>,
    /// What the turn cost and what its rewrite saved, in US dollars (a priced model's answered turns only; see
    /// `app::Money`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dollars: Option<Money>,
    /// Where the request first differed from the session's previous one and why it missed the provider's prompt
    /// cache, with the cached and uncached tokens reported and their price (answered turns; see
    /// `pipeline::cache_miss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<super::cache_miss::CacheReport>,
}

/// A turn's token counts.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TurnTokens {
    /// Estimated (calibrated) tokens of the client's request; for a request clearly under the threshold (not
    /// counted), the prompt tokens the upstream reported.
    pub client: Option<u64>,
    /// Estimated (calibrated) tokens sent upstream (the same for a request sent as it was).
    pub sent: Option<u64>,
    /// The model's context window.
    pub window: u64,
    /// Prompt tokens the upstream reported (the last round's when there were recall rounds).
    pub upstream_prompt: Option<u64>,
    /// Output tokens the upstream reported.
    pub output: Option<u64>,
}

/// The stored JSON of a turn.
pub fn to_json(info: &TurnInfo) -> String {
    serde_json::to_string(info).unwrap_or_else(|_| "null".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn user(t: &str) -> Value {
        json!({"role": "user", "content": t})
    }

    #[test]
    fn an_unchanged_request_is_one_range() {
        let native = vec![user("a"), user("b"), user("c")];
        assert_eq!(segments(&native, &native), unchanged(3));
        assert!(unchanged(0).is_empty());
    }

    #[test]
    fn cleared_results_summaries_and_notes_are_literals_standing_for_their_messages() {
        let call = json!({"role": "assistant", "tool_calls": [{"id": "c1"}]});
        let result = json!({"role": "tool", "tool_call_id": "c1", "content": "big output"});
        let native = vec![
            json!({"role": "system", "content": "sys"}),
            user("task"),
            call.clone(),
            result,
            user("old question"),
            json!({"role": "assistant", "content": "old answer"}),
            user("new question"),
        ];
        let cleared = json!({"role": "tool", "tool_call_id": "c1", "content": format!("{PLACEHOLDER_PREFIX} (12 tokens)")});
        let summary = json!({"role": "user", "content": format!("{SUMMARY_PREFIX}they talked")});
        let note = json!({"role": "system", "content": format!("{NOTE_PREFIX} … call c1")});
        let sent = vec![
            native[0].clone(),
            native[1].clone(),
            call,
            cleared.clone(),
            note.clone(),
            summary.clone(),
            native[6].clone(),
        ];
        let s = segments(&sent, &native);
        assert_eq!(
            s,
            vec![
                Segment::Nodes { from: 0, to: 3 },
                Segment::Literal {
                    literal: cleared,
                    kind: "cleared",
                    replaces: vec![3]
                },
                Segment::Literal {
                    literal: note,
                    kind: "note",
                    replaces: vec![]
                },
                Segment::Literal {
                    literal: summary,
                    kind: "summary",
                    replaces: vec![4, 5]
                },
                Segment::Nodes { from: 6, to: 7 },
            ]
        );
    }

    #[test]
    fn resent_replies_are_cut_out_of_their_ranges() {
        let r = json!({"role": "assistant", "content": "x", "refusal": null});
        let s = with_resent(unchanged(5), &[(1, r.clone()), (4, r.clone())]);
        assert_eq!(
            s,
            vec![
                Segment::Nodes { from: 0, to: 1 },
                Segment::Resent {
                    at: 1,
                    literal: r.clone()
                },
                Segment::Nodes { from: 2, to: 4 },
                Segment::Resent { at: 4, literal: r },
            ]
        );
    }

    #[test]
    fn pruned_messages_are_skipped_and_the_rest_still_referenced() {
        let native: Vec<Value> = (0..6).map(|i| user(&i.to_string())).collect();
        let sent = vec![native[0].clone(), native[4].clone(), native[5].clone()];
        assert_eq!(
            segments(&sent, &native),
            vec![
                Segment::Nodes { from: 0, to: 1 },
                Segment::Nodes { from: 4, to: 6 }
            ]
        );
        let stored: Value = serde_json::from_str(&to_json(&TurnInfo {
            at: 1,
            model: "m".into(),
            fallback: None,
            dialect: "chat",
            stream: false,
            status: 200,
            strategy: "prune",
            rewritten: true,
            stages: vec![],
            cuts: vec![],
            head: "h".into(),
            tokens: TurnTokens::default(),
            summary_upto: 0,
            recall_rounds: 0,
            recall_calls: vec![],
            sent: segments(&sent, &native),
            dollars: None,
            cache: None,
        }))
        .unwrap();
        assert_eq!(
            stored["sent"],
            json!([{"from": 0, "to": 1}, {"from": 4, "to": 6}])
        );
    }
}
