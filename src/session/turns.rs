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
    /// The first turn of the page.
    pub offset: u64,
    /// Turns asked for.
    pub limit: u32,
    /// The turns, oldest first.
    pub turns: Vec<Value>,
}

impl Sessions {
    /// Turns `offset..offset + limit` of session `id` (`None`: no such session); with `messages`, each with what
    /// was sent and where each element came from.
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
                        stored,
                        offset + k as u64,
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

/// One stored turn as shown: its fields and its number, and (given the tree) `messages_sent` and `sent_from`.
fn resolve(stored: Value, number: u64, tree: Option<(&Tree, &mut Paths)>) -> Value {
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
    let node = |i: usize| path.get(i).map(|(id, _)| Value::from(&**id));
    let (mut messages, mut from) = (Vec::new(), Vec::new());
    for segment in sent
        .as_ref()
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let num = |k: &str| segment.get(k).and_then(Value::as_u64).map(|n| n as usize);
        if let Some(literal) = segment.get("literal") {
            messages.push(literal.clone());
            if let Some(at) = num("at") {
                from.push(json!({"node": node(at)}));
            } else {
                let replaces: Vec<Value> = segment
                    .get("replaces")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|i| node(i.as_u64()? as usize))
                    .collect();
                from.push(json!({"kind": segment.get("kind"), "replaces": replaces}));
            }
        } else if let (Some(a), Some(b)) = (num("from"), num("to")) {
            for i in a..b {
                match path.get(i) {
                    Some((id, m)) => {
                        messages.push((**m).clone());
                        from.push(json!({"node": &**id}));
                    }
                    // The stored history lacks it (not expected: nodes are never removed).
                    None => {
                        messages.push(Value::Null);
                        from.push(json!({"missing": i}));
                    }
                }
            }
        }
    }
    out.insert("messages_sent".into(), Value::Array(messages));
    out.insert("sent_from".into(), Value::Array(from));
    Value::Object(out)
}
