//! A session's turn records as the admin API shows them: each stored record's segments (ranges of the request's
//! messages on the path to its head node, and the elements a rewrite changed or added) resolved into the elements
//! the upstream received (`messages_sent`) and where each came from (`sent_from`).

use super::tree::{NodeId, Tree};
use super::Sessions;
use crate::store::StoreError;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The paths to the heads of the turns on a page (turns of one branch share one).
type Paths = HashMap<String, Vec<(NodeId, Arc<Value>)>>;

/// A page of a session's turns.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TurnsPage {
    /// The session.
    pub session: String,
    /// Turns recorded.
    pub total: u64,
    /// Turns skipped before the page: its first turn is numbered `offset + 1`.
    pub offset: u64,
    /// Turns asked for.
    pub limit: u32,
    /// The turns, oldest first.
    pub turns: Vec<Value>,
}

impl Sessions {
    /// The `limit` turns after the first `offset` of session `id` (`None`: no such session); with `messages`, each
    /// with what was sent and where each element came from. Turns are numbered from 1, as people count them (the
    /// inspector and the README's tour show the same numbers); the store's own rows count from 0.
    pub async fn turns(
        &self,
        id: &str,
        offset: u64,
        limit: u32,
        messages: bool,
    ) -> Result<Option<TurnsPage>, StoreError> {
        let Some(entry) = self.entry(id).await? else {
            return Ok(None);
        };
        let (rows, total) = self.stored_turns(id, offset, limit).await?;
        let turns = entry.with_tree(|tree| {
            let mut paths: Paths = HashMap::new();
            rows.iter()
                .enumerate()
                .map(|(k, row)| {
                    let stored: Value = serde_json::from_str(row).unwrap_or(Value::Null);
                    resolve(
                        id,
                        stored,
                        offset + k as u64 + 1,
                        messages.then_some((tree, &mut paths)),
                    )
                })
                .collect()
        });
        Ok(Some(TurnsPage {
            session: id.to_string(),
            total,
            offset,
            limit,
            turns,
        }))
    }
}

/// What a session's turns cost and saved, in US dollars: the sums of their records' `dollars` (turns of a priced
/// model; see `app::Money`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Dollars {
    pub spent: f64,
    pub saved: f64,
}

/// Turn records read per store call when summing a session's dollars.
const DOLLARS_PAGE: u32 = 500;

impl Sessions {
    /// What session `id`'s turns cost and saved, summed from every stored turn record (an admin read, not for the
    /// request path).
    pub async fn dollars(&self, id: &str) -> Result<Dollars, StoreError> {
        let mut sum = Dollars::default();
        let mut at = 0u64;
        loop {
            let (rows, total) = self.stored_turns(id, at, DOLLARS_PAGE).await?;
            for row in &rows {
                let Ok(turn) = serde_json::from_str::<Value>(row) else {
                    continue;
                };
                let of = |k: &str| turn.pointer(k).and_then(Value::as_f64).unwrap_or(0.0);
                sum.spent += of("/dollars/spent");
                sum.saved += of("/dollars/saved");
            }
            at += rows.len() as u64;
            if rows.is_empty() || at >= total {
                return Ok(sum);
            }
        }
    }
}

/// One stored turn (its JSON text) as the admin API shows it, numbered `number`, resolved against `tree`.
pub fn show_turn(session: &str, stored: &str, number: u64, tree: &Tree) -> Value {
    let stored: Value = serde_json::from_str(stored).unwrap_or(Value::Null);
    resolve(session, stored, number, Some((tree, &mut Paths::new())))
}

/// One stored turn as shown: its fields and its number, and (given the tree) `messages_sent` and `sent_from`.
/// Bounded by the stored history: a range is resolved only as far as the path to the turn's head reaches, and a
/// turn never shows more of the history's messages than the path holds (ranges a store written by hand or by an
/// older version may overstate); what is cut is named in an `error` field, and logged (without content).
fn resolve(session: &str, stored: Value, number: u64, tree: Option<(&Tree, &mut Paths)>) -> Value {
    let Value::Object(mut fields) = stored else {
        return json!({"turn": number, "unreadable": true});
    };
    let sent = fields.remove("sent");
    let mut out = Map::new();
    out.insert("turn".into(), Value::from(number));
    out.extend(fields);
    let Some((tree, paths)) = tree else {
        return Value::Object(out);
    };
    let head = out
        .get("head")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let path = paths.entry(head.clone()).or_insert_with(|| {
        let head: NodeId = Arc::from(head.as_str());
        tree.path_to(Some(&head))
            .into_iter()
            .map(|n| (n.id.clone(), n.message.clone()))
            .collect()
    });
    let resolved = resolve_segments(sent.as_ref(), path);
    if let Some(problem) = &resolved.problem {
        tracing::warn!(
            target: "ctxgate::admin",
            session,
            turn = number,
            history = path.len(),
            problem = %problem,
            "turn record: it points outside its history; shown as far as the history goes"
        );
        out.insert("error".into(), Value::from(problem.clone()));
    }
    out.insert("messages_sent".into(), Value::Array(resolved.messages));
    out.insert("sent_from".into(), Value::Array(resolved.from));
    Value::Object(out)
}

/// A turn's segments against the path to its head.
struct Resolved {
    messages: Vec<Value>,
    from: Vec<Value>,
    /// The first reference that was outside the path, or past what the path can account for.
    problem: Option<String>,
}

fn resolve_segments(sent: Option<&Value>, path: &[(NodeId, Arc<Value>)]) -> Resolved {
    let node = |i: u64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| path.get(i))
            .map(|(id, _)| Value::from(&**id))
    };
    let mut r = Resolved {
        messages: Vec::new(),
        from: Vec::new(),
        problem: None,
    };
    // Messages of the path referenced so far: ranges never overlap, so a turn references each at most once.
    let mut referenced = 0usize;
    for segment in sent.and_then(Value::as_array).into_iter().flatten() {
        let num = |k: &str| segment.get(k).and_then(Value::as_u64);
        if let Some(literal) = segment.get("literal") {
            r.messages.push(literal.clone());
            if let Some(at) = num("at") {
                r.from.push(json!({"node": node(at)}));
            } else {
                let replaces: Vec<Value> = segment
                    .get("replaces")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|i| node(i.as_u64()?))
                    .collect();
                r.from
                    .push(json!({"kind": segment.get("kind"), "replaces": replaces}));
            }
        } else if let (Some(a), Some(b)) = (num("from"), num("to")) {
            let len = path.len() as u64;
            let room = (path.len() - referenced) as u64;
            let end = b.min(len).min(a.saturating_add(room));
            let problem = if a > b {
                Some(format!("range {a}..{b} runs backwards"))
            } else if b > len {
                Some(format!(
                    "range {a}..{b} reaches beyond the history ({len} messages)"
                ))
            } else if b - a > room {
                Some(format!(
                    "range {a}..{b} sends messages of the history ({len}) a second time"
                ))
            } else {
                None
            };
            if r.problem.is_none() {
                r.problem = problem;
            }
            for (id, m) in path
                .iter()
                .take(usize::try_from(end).unwrap_or(usize::MAX))
                .skip(usize::try_from(a).unwrap_or(usize::MAX))
            {
                r.messages.push((**m).clone());
                r.from.push(json!({"node": &**id}));
                referenced += 1;
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NodeKind, NodeRow};

    fn tree(n: usize) -> Tree {
        let rows = (0..n)
            .map(|i| NodeRow {
                id: Arc::from(format!("n{i}")),
                parent: i.checked_sub(1).map(|p| Arc::from(format!("n{p}"))),
                position: i as u32,
                kind: NodeKind::Client,
                partial: false,
                created_at: 0,
                message: Arc::new(json!({"role": "user", "content": i})),
            })
            .collect();
        Tree::from_rows(rows, None)
    }

    fn shown(t: &Tree, turn: Value) -> Value {
        let mut paths = Paths::new();
        resolve("s", turn, 0, Some((t, &mut paths)))
    }

    #[test]
    fn a_range_is_resolved_as_far_as_the_history_goes_however_large() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let turn = json!({"head": "n0", "sent": [{"from": 0, "to": 1_000_000_000_000u64}]});
            let _ = tx.send(shown(&tree(1), turn));
        });
        let v = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("resolved in time");
        assert_eq!(v["messages_sent"], json!([{"role": "user", "content": 0}]));
        assert_eq!(v["sent_from"], json!([{"node": "n0"}]));
        assert_eq!(
            v["error"],
            "range 0..1000000000000 reaches beyond the history (1 messages)"
        );
    }

    #[test]
    fn backwards_and_repeated_ranges_are_named_and_cut() {
        let t = tree(3);
        let v = shown(&t, json!({"head": "n2", "sent": [{"from": 2, "to": 1}]}));
        assert_eq!(v["messages_sent"], json!([]));
        assert_eq!(v["error"], "range 2..1 runs backwards");
        // The whole history a thousand times: sent once, then cut.
        let many: Vec<Value> = (0..1000).map(|_| json!({"from": 0, "to": 3})).collect();
        let v = shown(&t, json!({"head": "n2", "sent": many}));
        assert_eq!(v["messages_sent"].as_array().map(Vec::len), Some(3));
        assert_eq!(
            v["error"],
            "range 0..3 sends messages of the history (3) a second time"
        );
        // A well-formed turn has no error.
        let v = shown(
            &t,
            json!({"head": "n2", "sent": [{"from": 0, "to": 1}, {"literal": {"role": "user", "content": "x"},
                "kind": "cleared", "replaces": [1, 99]}, {"from": 2, "to": 3}]}),
        );
        assert!(v.get("error").is_none(), "{v}");
        assert_eq!(
            v["sent_from"],
            json!([{"node": "n0"}, {"kind": "cleared", "replaces": ["n1"]}, {"node": "n2"}])
        );
    }

    #[test]
    fn a_turn_on_a_parent_cycle_is_shown_up_to_where_it_repeats() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rows = vec![NodeRow {
                id: Arc::from("n0"),
                parent: Some(Arc::from("n0")),
                position: 0,
                kind: NodeKind::Client,
                partial: false,
                created_at: 0,
                message: Arc::new(json!({"role": "user", "content": "q"})),
            }];
            let t = Tree::from_rows(rows, Some(Arc::from("n0")));
            let _ = tx.send(shown(
                &t,
                json!({"head": "n0", "sent": [{"from": 0, "to": 1}]}),
            ));
        });
        let v = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("resolved in time");
        assert_eq!(v["sent_from"], json!([{"node": "n0"}]));
        assert!(v.get("error").is_none());
    }
}
