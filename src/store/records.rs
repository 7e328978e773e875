//! The records kept beside a session's messages: compression records (a rewrite of what was sent upstream, or an
//! LLM summary of older history) as a typed enum tagged by `kind`, and ctxgate's own exchanges with the model.
//!
//! Stored and shown by the admin API as JSON objects with the same field names as before the enum existed:
//! records written before rewrites carried a `kind` load as rewrites, fields a record lacks take their defaults,
//! and fields this version does not know are kept (in `extra`) and written back as they were.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Kinds of records kept beside a session's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A rewrite or summary of what was sent upstream.
    Compression,
    /// A recall round: ctxgate's own exchange with the model, never part of the client's history.
    Internal,
}

impl RecordKind {
    /// Name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Compression => "compression",
            RecordKind::Internal => "internal",
        }
    }
}

/// One record of a session.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A rewrite or summary (boxed: a record is mostly moved around in write batches).
    Compression(Box<Compression>),
    /// A recall round as exchanged with the model (request and answer in the dialect's shape), flagged `by`.
    Internal(Value),
}

impl From<Compression> for Record {
    fn from(c: Compression) -> Self {
        Record::Compression(Box::new(c))
    }
}

impl Record {
    /// Which list the record belongs to.
    pub fn kind(&self) -> RecordKind {
        match self {
            Record::Compression(_) => RecordKind::Compression,
            Record::Internal(_) => RecordKind::Internal,
        }
    }

    /// The record as stored: a JSON object.
    pub fn to_json(&self) -> String {
        match self {
            Record::Compression(c) => serde_json::to_string(c).unwrap_or_else(|_| "null".into()),
            Record::Internal(v) => v.to_string(),
        }
    }

    /// Reads a stored record of kind `kind` (as named by [`RecordKind::as_str`]; anything else is a compression).
    pub fn parse(kind: &str, json: &str) -> Result<Record, serde_json::Error> {
        if kind == RecordKind::Internal.as_str() {
            serde_json::from_str(json).map(Record::Internal)
        } else {
            serde_json::from_str::<Compression>(json).map(Record::from)
        }
    }
}

/// What was done to the history sent upstream: a rewrite (`kind: "rewrite"`) or a summary (`kind: "summary"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Compression {
    /// The planner rewrote a request (recorded when its cut points moved).
    Rewrite(RewriteRecord),
    /// A summary of the history up to a message, cached for later turns.
    Summary(SummaryRecord),
}

/// The `kind`s a compression record may have.
const KINDS: &[&str] = &["rewrite", "summary"];

impl<'de> Deserialize<'de> for Compression {
    /// Like the derived tagged form, except that a record without `kind` (written before the tag existed) is a
    /// rewrite.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut fields = Map::deserialize(d)?;
        let kind = match fields.remove("kind") {
            None | Some(Value::Null) => "rewrite".to_string(),
            Some(Value::String(k)) => k,
            Some(other) => return Err(D::Error::custom(format!("kind {other} is not a string"))),
        };
        let fields = Value::Object(fields);
        match kind.as_str() {
            "rewrite" => RewriteRecord::deserialize(fields).map(Compression::Rewrite),
            "summary" => SummaryRecord::deserialize(fields).map(Compression::Summary),
            other => return Err(D::Error::unknown_variant(other, KINDS)),
        }
        .map_err(D::Error::custom)
    }
}

impl Compression {
    /// Approximate bytes the record takes as JSON text (for cache weighing).
    pub fn approx_bytes(&self) -> usize {
        let strings = |v: &[String]| v.iter().map(|s| s.len() + 3).sum::<usize>();
        let (own, extra) = match self {
            Compression::Rewrite(r) => (
                r.strategy.len()
                    + strings(&r.stages)
                    + strings(&r.pruned_call_ids)
                    + r.model.len()
                    + 8 * r.cuts.len()
                    + 400,
                &r.extra,
            ),
            Compression::Summary(s) => (
                s.strategy.len() + s.summary.len() + s.covers.upto_node.len() + s.model.len() + 300,
                &s.extra,
            ),
        };
        let extra = if extra.is_empty() {
            0
        } else {
            serde_json::to_string(extra).map_or(0, |t| t.len())
        };
        own + extra
    }
}

/// A rewrite of a request: what the planner did and what it saved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RewriteRecord {
    /// The strategy in force (`prune`, `summarize`, `hybrid`).
    pub strategy: String,
    /// The stages that changed something: `cleared`, `pruned`, `summarized`, `truncated`.
    pub stages: Vec<String>,
    /// Messages the client sent.
    pub messages_before: usize,
    /// Messages sent upstream.
    pub messages_after: usize,
    /// Estimated (calibrated) tokens of the client's request.
    pub tokens_before: u64,
    /// Estimated (calibrated) tokens sent upstream, before the recall tools are added.
    pub tokens_after: u64,
    /// The model's context window.
    pub context_window: u64,
    /// Tool results replaced by a placeholder.
    pub cleared_results: usize,
    /// Past run loops cut to their user message and final reply.
    pub pruned_loops: usize,
    /// Run loops dropped for count or age.
    pub dropped_loops: usize,
    /// Messages dropped by the hard limit.
    pub dropped_messages: usize,
    /// Messages covered by the summary sent (0: none).
    pub summary_upto: usize,
    /// Ids of the tool calls whose results are not sent (recallable).
    pub pruned_call_ids: Vec<String>,
    /// Where the rewrite cut (clear, prune, drop loops, drop, summary; older records have four): equal cuts on
    /// two turns mean an identical rewritten prefix.
    pub cuts: Vec<usize>,
    /// Unix seconds.
    pub at: i64,
    /// The request's model.
    pub model: String,
    /// The recall tools were added to the request.
    pub recall_offered: bool,
    /// Fields this version does not know, kept as they were.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An LLM-written summary of a session's history up to a message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SummaryRecord {
    /// Unix seconds when it was written.
    pub at: i64,
    /// Always `summarize`.
    pub strategy: String,
    /// The summary's text.
    pub summary: String,
    /// The messages it covers.
    pub covers: Covers,
    /// Messages covered by the previous summary it was written from (`null`: written from the messages alone).
    pub incremental_from: Option<usize>,
    /// Messages it replaces.
    pub messages_before: usize,
    /// Messages it takes (1).
    pub messages_after: usize,
    /// Estimated tokens of the messages it replaces.
    pub tokens_before: u64,
    /// Estimated tokens of the summary message.
    pub tokens_after: u64,
    /// The model that wrote it.
    pub model: String,
    /// How long the summary request took.
    pub latency_ms: u64,
    /// Written ahead of the threshold.
    pub precomputed: bool,
    /// Fields this version does not know, kept as they were.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The messages a summary covers: `from..upto` of the history, ending at node `upto_node` (the cache key).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Covers {
    /// First message covered (0).
    pub from: usize,
    /// One past the last message covered.
    pub upto: usize,
    /// Node id of the last message covered.
    pub upto_node: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    #[test]
    fn records_are_tagged_by_kind_with_the_fields_as_before() {
        let rewrite = Compression::Rewrite(RewriteRecord {
            strategy: "prune".into(),
            stages: vec!["cleared".into()],
            cuts: vec![3, 0, 0, 0, 0],
            at: 9,
            model: "m".into(),
            ..RewriteRecord::default()
        });
        let shown = serde_json::to_value(&rewrite).unwrap();
        let keys: Vec<&str> = shown
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "kind",
                "strategy",
                "stages",
                "messages_before",
                "messages_after",
                "tokens_before",
                "tokens_after",
                "context_window",
                "cleared_results",
                "pruned_loops",
                "dropped_loops",
                "dropped_messages",
                "summary_upto",
                "pruned_call_ids",
                "cuts",
                "at",
                "model",
                "recall_offered",
            ]
        );
        assert_eq!(shown["kind"], "rewrite");
        let summary = Compression::Summary(SummaryRecord {
            summary: "S".into(),
            ..SummaryRecord::default()
        });
        let shown = serde_json::to_value(&summary).unwrap();
        assert_eq!(shown["kind"], "summary");
        assert_eq!(
            shown["covers"],
            json!({"from": 0, "upto": 0, "upto_node": ""})
        );
        assert_eq!(shown["incremental_from"], Value::Null);
        for c in [rewrite, summary] {
            let back: Compression =
                serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            assert_eq!(back, c);
        }
    }

    #[test]
    fn a_record_without_kind_is_a_rewrite_and_unknown_fields_are_kept() {
        let old =
            json!({"stages": ["pruned"], "cuts": [1, 2, 0, 0], "note": "kept", "summary_upto": 2});
        let c: Compression = serde_json::from_value(old.clone()).unwrap();
        let Compression::Rewrite(r) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(
            (r.stages.as_slice(), r.cuts.as_slice()),
            (&["pruned".to_string()][..], &[1, 2, 0, 0][..])
        );
        assert_eq!(r.extra.get("note"), Some(&json!("kept")));
        let again = serde_json::to_value(&c).unwrap();
        assert_eq!(again["note"], "kept");
        assert_eq!(again["summary_upto"], 2);
        assert!(serde_json::from_value::<Compression>(json!({"kind": "unheard_of"})).is_err());
        assert!(serde_json::from_value::<Compression>(json!({"kind": 3})).is_err());
        assert!(serde_json::from_value::<Compression>(json!({"cuts": "nope"})).is_err());
    }

    #[test]
    fn stored_records_parse_by_kind() {
        let internal = Record::Internal(json!({"by": "ctxgate", "kind": "summary"}));
        assert_eq!(
            Record::parse("internal", &internal.to_json()).unwrap(),
            internal
        );
        let summary = Record::from(Compression::Summary(SummaryRecord::default()));
        assert_eq!(summary.kind(), RecordKind::Compression);
        assert_eq!(
            Record::parse("compression", &summary.to_json()).unwrap(),
            summary
        );
    }
}
