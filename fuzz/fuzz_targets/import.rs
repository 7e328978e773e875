//! Fuzzes session imports (`session::export::parse`) on raw files and on exports built from parts that go wrong
//! the way hand-edited or damaged files do (repeated ids, missing or looping parents, heads and turn ranges
//! outside the history, timestamps that are not numbers, odd session ids, wrong counts); and the bounded walks a
//! stored session meets whatever it holds (`Tree::path_to`, `Tree::cyclic_nodes`, `turns::show_turn`).
//!
//! Invariants: no panic, no hang, no allocation sized by a number in the file. An accepted file passes checks
//! written here independently (ids unique, parents present, no cycle, heads in the file, ranges inside the path to
//! their turn's head, timestamps in range, a session id of the gateway's own form), exports back to a fixed point
//! (`render(parse(render(parse(x))))` equals `render(parse(x))`), and shows every turn without an `error`. On any
//! tree, however built: every path ends, holds no node twice and at most every node once; `cyclic_nodes` counts
//! exactly the nodes whose parents lead back to them; a shown turn has one `sent_from` per element sent and at
//! most as many of the history's messages as the path to its head holds.
#![no_main]

use arbitrary::Arbitrary;
use ctxgate::session::export::{self, Parsed, MAX_TIMESTAMP};
use ctxgate::session::tree::{NodeId, Tree};
use ctxgate::session::turns::show_turn;
use ctxgate::store::{NodeKind, NodeRow};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any bytes, as a file.
    Raw(Vec<u8>),
    /// An export built from parts.
    Built(Built),
}

#[derive(Arbitrary, Debug)]
struct Built {
    id: Id,
    head: Option<u8>,
    nodes: Vec<PNode>,
    records: Vec<Stamp>,
    turns: Vec<PTurn>,
    /// Added to the header's node count (0: right).
    miscount: i8,
    /// A line of text put somewhere in the file.
    junk: Option<(u8, String)>,
}

#[derive(Arbitrary, Debug)]
enum Id {
    Plain(u16),
    Any(String),
}

#[derive(Arbitrary, Debug)]
struct PNode {
    /// The id is `n<id>` (a repeated number is a repeated id).
    id: u8,
    parent: Parent,
    position: u8,
    created_at: Stamp,
}

#[derive(Arbitrary, Debug)]
enum Parent {
    Root,
    Node(u8),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Stamp {
    Good(u32),
    Any(i64),
    Float,
    Text,
}

#[derive(Arbitrary, Debug)]
struct PTurn {
    head: Option<u8>,
    at: Stamp,
    sent: Vec<Segment>,
}

#[derive(Arbitrary, Debug)]
enum Segment {
    Near(u8, u8),
    Far(u64, u64),
    Literal { at: Option<u64>, replaces: Vec<u16> },
    Junk,
}

fn stamp(s: Stamp) -> Value {
    match s {
        Stamp::Good(t) => json!(t),
        Stamp::Any(t) => json!(t),
        Stamp::Float => json!(1.5e300),
        Stamp::Text => json!("noon"),
    }
}

fn node_id(k: u8) -> String {
    format!("n{k}")
}

fn segment(s: &Segment) -> Value {
    match s {
        Segment::Near(a, b) => json!({"from": a, "to": b}),
        Segment::Far(a, b) => json!({"from": a, "to": b}),
        Segment::Literal { at, replaces } => {
            let mut v = json!({"literal": {"role": "user", "content": "x"}, "kind": "cleared", "replaces": replaces});
            if let Some(at) = at {
                v["at"] = json!(at);
            }
            v
        }
        Segment::Junk => json!(["from", 1]),
    }
}

fn turn_json(t: &PTurn) -> String {
    let head = t.head.map(node_id).unwrap_or_default();
    let sent: Vec<Value> = t.sent.iter().map(segment).collect();
    json!({"at": stamp(t.at), "head": head, "sent": sent}).to_string()
}

/// The file `b` describes.
fn file(b: &Built) -> Vec<u8> {
    let id = match &b.id {
        Id::Plain(n) => format!("anonymous-s{n}"),
        Id::Any(s) => s.clone(),
    };
    let nodes = (b.nodes.len() as i64 + i64::from(b.miscount)).max(0);
    let mut lines = vec![json!({"ctxgate_export": 1, "exported_at": 0,
        "session": {"id": id, "tenant": "anonymous", "dialect": "chat", "created_at": 1, "last_active": 2,
            "message_count": b.nodes.len(), "token_estimate": 0, "head": b.head.map(node_id), "version": 1,
            "strategy": null, "idle_notified": null},
        "counts": {"nodes": nodes, "records": b.records.len(), "turns": b.turns.len()}})
    .to_string()];
    for n in &b.nodes {
        let parent = match n.parent {
            Parent::Root => Value::Null,
            Parent::Node(p) => json!(node_id(p)),
        };
        lines.push(
            json!({"node": {"id": node_id(n.id), "parent": parent, "position": n.position, "kind": "client",
                "partial": false, "created_at": stamp(n.created_at), "message": {"role": "user", "content": n.id}}})
            .to_string(),
        );
    }
    for at in &b.records {
        lines.push(
            json!({"record": {"kind": "internal", "value": {"by": "ctxgate", "at": stamp(*at)}}})
                .to_string(),
        );
    }
    for t in &b.turns {
        lines.push(format!("{{\"turn\":{}}}", turn_json(t)));
    }
    if let Some((at, text)) = &b.junk {
        let k = usize::from(*at) % (lines.len() + 1);
        lines.insert(k, text.clone());
    }
    let mut out = lines.join("\n").into_bytes();
    out.push(b'\n');
    out
}

/// The tree `b`'s nodes make, whatever they are (what a store written by hand may hold).
fn any_tree(b: &Built) -> Tree {
    let rows = b
        .nodes
        .iter()
        .map(|n| NodeRow {
            id: Arc::from(node_id(n.id)),
            parent: match n.parent {
                Parent::Root => None,
                Parent::Node(p) => Some(Arc::from(node_id(p))),
            },
            position: u32::from(n.position),
            kind: NodeKind::Client,
            partial: false,
            created_at: 0,
            message: Arc::new(json!({"role": "user", "content": n.id})),
        })
        .collect();
    Tree::from_rows(rows, b.head.map(|h| NodeId::from(node_id(h))))
}

/// Walks and shown turns on any tree stay bounded.
fn check_walks(tree: &Tree, turns: &[String]) {
    let n = tree.len();
    let mut on_cycle = 0;
    for node in tree.nodes() {
        let path = tree.path_to(Some(&node.id));
        assert!(!path.is_empty() && path.len() <= n);
        assert_eq!(path.last().map(|p| &p.id), Some(&node.id));
        let distinct: HashSet<&str> = path.iter().map(|p| &*p.id).collect();
        assert_eq!(distinct.len(), path.len(), "a node twice on a path");
        // On a cycle: following parents comes back to it (within n steps).
        let mut cur = node.parent.as_deref().and_then(|p| tree.get(p));
        for _ in 0..n {
            match cur {
                Some(c) if c.id == node.id => {
                    on_cycle += 1;
                    break;
                }
                Some(c) => cur = c.parent.as_deref().and_then(|p| tree.get(p)),
                None => break,
            }
        }
    }
    assert_eq!(tree.cyclic_nodes(), on_cycle);
    for (k, t) in turns.iter().enumerate() {
        let shown = show_turn("fuzz", t, k as u64, tree);
        let sent = shown["messages_sent"].as_array().map_or(0, Vec::len);
        assert_eq!(Some(sent), shown["sent_from"].as_array().map(Vec::len));
        let head = shown["head"].as_str().unwrap_or("");
        let path = tree.path_to(Some(&NodeId::from(head))).len();
        let literals = shown["sent_from"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f.get("kind").is_some() || f.get("node").is_some_and(|v| v.is_null()))
            .count();
        assert!(
            sent <= path + literals + count_resent(t),
            "{sent} > {path} + {literals}"
        );
    }
}

/// Literals of a stored turn that stand for one position (`at`): shown as `{"node": …}`.
fn count_resent(stored: &str) -> usize {
    let v: Value = serde_json::from_str(stored).unwrap_or(Value::Null);
    v["sent"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s.get("literal").is_some() && s.get("at").is_some())
        .count()
}

/// What an accepted file holds, checked independently of `parse`.
fn check_accepted(p: &Parsed) {
    let (s, turns) = p.to_stored();
    assert!(export::session_id_problem(&s.meta.id).is_none());
    let in_range = |t: i64| (0..=MAX_TIMESTAMP).contains(&t);
    assert!(in_range(s.meta.created_at) && in_range(s.meta.last_active));
    let by_id: HashMap<&str, &NodeRow> = s.nodes.iter().map(|n| (&*n.id, n)).collect();
    assert_eq!(by_id.len(), s.nodes.len(), "ids unique");
    let depth = |id: &str| {
        let mut steps = 0;
        let mut cur = by_id.get(id);
        while let Some(n) = cur {
            steps += 1;
            assert!(steps <= s.nodes.len(), "a parent cycle accepted");
            cur = match &n.parent {
                None => None,
                Some(q) => Some(
                    by_id
                        .get(&**q)
                        .expect("a parent missing from the file accepted"),
                ),
            };
        }
        steps
    };
    for n in &s.nodes {
        assert!(in_range(n.created_at));
        depth(&n.id);
    }
    if let Some(h) = &s.meta.head {
        assert!(
            by_id.contains_key(h.as_str()),
            "a head outside the file accepted"
        );
    }
    for t in &turns {
        let v: Value = serde_json::from_str(t).expect("a turn is JSON");
        assert!(v["at"].as_i64().is_some_and(in_range));
        let head = v["head"].as_str().expect("turn.head");
        let len = if head.is_empty() {
            0
        } else {
            assert!(by_id.contains_key(head));
            depth(head) as u64
        };
        let mut total = 0;
        for seg in v["sent"].as_array().into_iter().flatten() {
            if let (Some(a), Some(b)) = (seg["from"].as_u64(), seg["to"].as_u64()) {
                assert!(a <= b && b <= len, "range {a}..{b} of {len} accepted");
                total += b - a;
            }
            if let Some(at) = seg.get("at") {
                assert!(at.as_u64().is_some_and(|at| at < len));
            }
        }
        assert!(total <= len);
    }
    // Exported back: a fixed point.
    let once = export::render(&s, &turns, 0);
    let again = export::parse(&once).expect("an export of an accepted file is accepted");
    let (s2, turns2) = again.to_stored();
    assert_eq!(export::render(&s2, &turns2, 0), once);
    // Shown: no turn with an error.
    let tree = Tree::from_rows(s.nodes.clone(), s.meta.head.clone().map(NodeId::from));
    assert_eq!(tree.cyclic_nodes(), 0);
    if let Some(h) = &s.meta.head {
        assert_eq!(tree.history().len(), depth(h));
    }
    for (k, t) in turns.iter().enumerate() {
        let shown = show_turn("fuzz", t, k as u64, &tree);
        assert!(shown.get("error").is_none(), "{shown}");
    }
}

fuzz_target!(|input: Input| {
    let (bytes, built) = match &input {
        Input::Raw(b) => (b.clone(), None),
        Input::Built(b) => (file(b), Some(b)),
    };
    if let Ok(p) = export::parse(&bytes) {
        check_accepted(&p);
    }
    if let Some(b) = built {
        let turns: Vec<String> = b.turns.iter().map(turn_json).collect();
        check_walks(&any_tree(b), &turns);
    }
});
