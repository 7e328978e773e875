//! Export and import of a session: JSON Lines through the admin API and the CLI, the round trip exact (nodes,
//! compression and recall records, turns), an existing session refused unless replaced, a damaged file refused with
//! its line, and an imported session continued by its caller.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{test_config, Harness};
use ctxgate::config::StoreBackend;
use ctxgate::mock::{MockReply, MockUpstream};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn history(turns: usize) -> Vec<Value> {
    let mut m = vec![json!({"role": "user", "content": "Fix the failing build."})];
    for i in 0..turns {
        let id = format!("call_{i}");
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "shell", "arguments": format!("{{\"cmd\":\"make step{i}\"}}")}}]}));
        let out: String = (0..200).map(|w| format!("line{i}-{w} ")).collect();
        m.push(json!({"role": "tool", "tool_call_id": id, "content": out}));
    }
    m
}

async fn chat(h: &Harness, messages: &[Value]) -> (String, Value) {
    let body = json!({"model": "mock-model", "messages": messages});
    let (sid, r) = h.chat_ok("sk-export", "export-1", &body).await;
    (sid, r.json().await.unwrap())
}

/// A rewritten session with a recall round: nodes, a compression record, an internal record and turns.
async fn busy_session(h: &Harness) -> (String, Vec<Value>) {
    h.mock.push(MockReply::message(
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "r1", "type": "function",
            "function": {"name": "recall_tool_call", "arguments": "{\"call_id\":\"call_0\"}"}}]}),
        "tool_calls",
    ));
    h.mock
        .push(MockReply::completion("Step 0 printed line0-0."));
    let mut m = history(8);
    let (sid, answer) = chat(h, &m).await;
    m.push(answer["choices"][0]["message"].clone());
    m.push(json!({"role": "user", "content": "Go on."}));
    chat(h, &m).await;
    h.state.drain().await;
    (sid, m)
}

async fn export(h: &Harness, sid: &str) -> Vec<u8> {
    let r = h
        .client
        .get(h.url(&format!("/admin/sessions/{sid}/export")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    r.bytes().await.unwrap().to_vec()
}

async fn import(h: &Harness, body: Vec<u8>, query: &str) -> reqwest::Response {
    h.client
        .post(h.url(&format!("/admin/sessions/import{query}")))
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// The export without its `exported_at` (the one thing two exports of one session may differ in).
fn timeless(export: &[u8]) -> String {
    let text = String::from_utf8(export.to_vec()).unwrap();
    let (first, rest) = text.split_once('\n').unwrap();
    let mut header: Value = serde_json::from_str(first).unwrap();
    header.as_object_mut().unwrap().remove("exported_at");
    format!("{header}\n{rest}")
}

async fn round_trip(h: &Harness) {
    let (sid, mut m) = busy_session(h).await;
    let first = export(h, &sid).await;
    let text = String::from_utf8(first.clone()).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let header = &lines[0];
    assert_eq!(header["ctxgate_export"], 1);
    assert_eq!(header["session"]["id"], sid);
    let count = |k: &str| lines.iter().filter(|l| l.get(k).is_some()).count() as u64;
    assert_eq!(header["counts"]["nodes"], count("node"));
    assert_eq!(header["counts"]["records"], count("record"));
    assert_eq!(header["counts"]["turns"], count("turn"));
    assert_eq!(count("turn"), 2);
    assert!(count("node") >= m.len() as u64);
    assert!(lines.iter().any(|l| l["record"]["kind"] == "compression"));
    assert!(lines.iter().any(|l| l["record"]["kind"] == "internal"));

    // An existing session is refused, then replaced on request.
    let r = import(h, first.clone(), "").await;
    assert_eq!(r.status(), 409);
    let r = import(h, first.clone(), "?replace=true").await;
    assert_eq!(r.status(), 200);
    let r = h
        .client
        .delete(h.url(&format!("/admin/sessions/{sid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = import(h, first.clone(), "").await;
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["id"], sid);
    assert_eq!(done["turns"], 2);
    assert_eq!(
        timeless(&export(h, &sid).await),
        timeless(&first),
        "round trip exact"
    );

    // The caller goes on in the imported session.
    m.push(json!({"role": "assistant", "content": "mock reply"}));
    m.push(json!({"role": "user", "content": "And now?"}));
    let (again, _) = chat(h, &m).await;
    assert_eq!(again, sid, "the same session");
    h.state.drain().await;
    let turns: Value = h
        .get_json(&format!("/admin/sessions/{sid}/turns?messages=false"))
        .await;
    assert_eq!(turns["total"], 3);
}

#[tokio::test]
async fn a_session_round_trips_through_the_admin_api_in_memory() {
    let h = Harness::start_with(|c| c.context.default_context_window = 6_000).await;
    round_trip(&h).await;
}

#[tokio::test]
async fn a_session_round_trips_through_the_admin_api_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctx.db");
    let h = Harness::start_with(move |c| {
        c.context.default_context_window = 6_000;
        c.store.backend = StoreBackend::Sqlite;
        c.store.path = db;
    })
    .await;
    round_trip(&h).await;
}

#[tokio::test]
async fn a_damaged_export_is_refused_with_its_line() {
    let h = Harness::start_with(|c| c.context.default_context_window = 6_000).await;
    let (sid, _) = busy_session(&h).await;
    let good = String::from_utf8(export(&h, &sid).await).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    let problem = |body: String| {
        let h = &h;
        async move {
            let r = import(h, body.into_bytes(), "?replace=true").await;
            assert_eq!(r.status(), 400);
            let v: Value = r.json().await.unwrap();
            v["error"]["message"].as_str().unwrap().to_string()
        }
    };
    // A broken line.
    let mut broken = lines.clone();
    broken[2] = "{\"node\": {\"id\": ";
    assert!(problem(broken.join("\n"))
        .await
        .starts_with("line 3: not JSON"));
    // A node without its message.
    let mut v: Value = serde_json::from_str(lines[1]).unwrap();
    v["node"].as_object_mut().unwrap().remove("message");
    let mut missing = lines.clone();
    let fixed = v.to_string();
    missing[1] = &fixed;
    assert_eq!(
        problem(missing.join("\n")).await,
        "line 2: node.message is missing"
    );
    // Cut short.
    let short = lines[..lines.len() - 1].join("\n");
    assert!(problem(short).await.contains("is it cut short?"));
    // Not an export at all.
    assert!(problem("{\"hello\": 1}".into())
        .await
        .starts_with("line 1: not a ctxgate export"));
    // Nothing of it was written: the session is as it was.
    assert_eq!(timeless(&export(&h, &sid).await), timeless(good.as_bytes()));
}

fn cli(config: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["sessions"])
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_cli_exports_and_imports_between_stores() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b").join("b.db"));
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.context.default_context_window = 6_000;
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = a.clone();
    let mut h = Harness::start_config(mock, cfg).await;
    let (sid, _) = busy_session(&h).await;
    let via_api = export(&h, &sid).await;
    h.stop().await;
    drop(h);

    let conf = |db: &Path, name: &str| {
        let p = dir.path().join(name);
        std::fs::write(
            &p,
            format!("[store]\npath = {:?}\n", db.display().to_string()),
        )
        .unwrap();
        p
    };
    let (ca, cb) = (conf(&a, "a.toml"), conf(&b, "b.toml"));
    let file = dir.path().join("s.jsonl");
    cli(&ca, &["export", &sid, "--out", file.to_str().unwrap()]);
    let from_cli = std::fs::read(&file).unwrap();
    assert_eq!(timeless(&from_cli), timeless(&via_api));
    assert_eq!(
        timeless(cli(&ca, &["export", &sid]).as_bytes()),
        timeless(&via_api),
        "stdout"
    );

    let said = cli(&cb, &["import", file.to_str().unwrap()]);
    assert!(said.starts_with(&format!("imported {sid}: ")), "{said}");
    assert!(said.trim_end().ends_with("2 turn(s)"), "{said}");
    assert_eq!(
        timeless(cli(&cb, &["export", &sid]).as_bytes()),
        timeless(&via_api)
    );
    // Again: refused without --replace.
    let out = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["sessions", "import", file.to_str().unwrap(), "--config"])
        .arg(&cb)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
    cli(&cb, &["import", file.to_str().unwrap(), "--replace"]);
}

// --- imports checked as a whole (issue 26, findings 1, 2, 4, 5) -------------------------------------------------

/// The ids of the hand-made export's nodes: content addresses, as the gateway computes them.
fn hand_ids() -> [String; 3] {
    let mut parent: Option<String> = None;
    ["n0", "n1", "n2"].map(|text| {
        let id = ctxgate::session::tree::node_id(
            parent.as_deref(),
            &json!({"role": "user", "content": text}),
        )
        .to_string();
        parent = Some(id.clone());
        id
    })
}

/// A small export written by hand: `anonymous-hand` with nodes n0 ← n1 ← n2 (their contents; ids as
/// [`hand_ids`]), head n2, one turn sending all three.
fn hand_made() -> Vec<Value> {
    let [n0, n1, n2] = hand_ids();
    let node = |id: &str, parent: Option<&str>, position: u32, text: &str| {
        json!({"node": {"id": id, "parent": parent, "position": position, "kind": "client", "partial": false,
            "created_at": 1_700_000_000, "message": {"role": "user", "content": text}}})
    };
    vec![
        json!({"ctxgate_export": 1, "exported_at": 1_700_000_100,
            "session": {"id": "anonymous-hand", "tenant": "anonymous", "dialect": "chat", "created_at": 1_700_000_000,
                "last_active": 1_700_000_050, "message_count": 3, "token_estimate": 3, "head": n2, "version": 1,
                "strategy": null, "idle_notified": null},
            "counts": {"nodes": 3, "records": 1, "turns": 1}}),
        node(&n0, None, 0, "n0"),
        node(&n1, Some(&n0), 1, "n1"),
        node(&n2, Some(&n1), 2, "n2"),
        json!({"record": {"kind": "internal", "value": {"by": "ctxgate", "round": 1, "at": 1_700_000_010}}}),
        json!({"turn": {"at": 1_700_000_020, "head": n2, "status": 200, "sent": [{"from": 0, "to": 3}]}}),
    ]
}

fn body(lines: &[Value]) -> Vec<u8> {
    let mut out = String::new();
    for l in lines {
        out.push_str(&l.to_string());
        out.push('\n');
    }
    out.into_bytes()
}

/// `lines` with `f` applied to the JSON at `path` (a pointer) of line `k` (from 0).
fn edited(k: usize, path: &str, f: impl FnOnce(&mut Value)) -> Vec<Value> {
    let mut lines = hand_made();
    f(lines[k].pointer_mut(path).unwrap());
    lines
}

/// The answer to importing `lines`: the status and the error's message.
async fn refused(h: &Harness, lines: &[Value]) -> (u16, String) {
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        import(h, body(lines), "?replace=true"),
    )
    .await
    .expect("answered in time");
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    (
        status,
        v["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_is_checked_whole_and_a_bad_one_writes_nothing() {
    let h = Harness::start().await;
    let gone = |h: &Harness| {
        let h = h.client.get(h.url("/admin/sessions/anonymous-hand"));
        async move { h.send().await.unwrap().status() == 404 }
    };
    let node = |id: &str, parent: &str| {
        json!({"node": {"id": id, "parent": parent, "position": 3, "kind": "reply", "partial": false,
            "created_at": 1_700_000_000, "message": {"role": "assistant", "content": "other"}}})
    };
    let with_node = |k: usize, line: Value| {
        let mut lines = hand_made();
        lines[k] = line;
        lines
    };
    let [n0, n1, n2] = hand_ids();
    let cases: Vec<(&str, Vec<Value>, String)> = vec![
        (
            "a repeated id with other content",
            with_node(3, node(&n1, &n1)),
            format!("line 4: node id {n1:?} is already on line 3: every node is exported once"),
        ),
        (
            "a repeated id, identical",
            with_node(3, hand_made()[2].clone()),
            format!("line 4: node id {n1:?} is already on line 3: every node is exported once"),
        ),
        (
            "a parent missing from the file",
            edited(2, "/node/parent", |p| *p = json!("elsewhere")),
            format!("line 3: node {n1:?}: its parent \"elsewhere\" is not in the file"),
        ),
        (
            "a node that is its own parent",
            edited(1, "/node/parent", |p| *p = json!(n0)),
            format!("line 2: node {n0:?} is its own ancestor: its parents loop"),
        ),
        (
            "a three-node cycle",
            edited(1, "/node/parent", |p| *p = json!(n2)),
            format!("line 2: node {n0:?} is its own ancestor: its parents loop"),
        ),
        (
            "a message changed under its id",
            edited(2, "/node/message/content", |c| *c = json!("EVIL-IMPORTED")),
            format!(
                "line 3: node {n1:?} is not the id of its content: its parent and message make {:?}; node ids are \
                 content addresses, so an edited message needs a new id (and so do the nodes and turns that name it)",
                ctxgate::session::tree::node_id(Some(&n0), &json!({"role": "user", "content": "EVIL-IMPORTED"}))
            ),
        ),
        (
            "a head not in the file",
            edited(0, "/session/head", |h| *h = json!("n9")),
            "line 1: session.head \"n9\" is not a node of the file".to_string(),
        ),
        (
            "a turn whose head is not in the file",
            edited(5, "/turn/head", |h| *h = json!("n9")),
            "line 6: turn.head \"n9\" is not a node of the file".to_string(),
        ),
        (
            "a turn range of 10^12 messages",
            edited(5, "/turn/sent/0/to", |t| *t = json!(1_000_000_000_000u64)),
            "line 6: turn.sent[0]: range 0..1000000000000 reaches beyond the history (3 messages to turn.head)".to_string(),
        ),
        (
            "a range past the turn's own head",
            edited(5, "/turn/head", |h| *h = json!(n0)),
            "line 6: turn.sent[0]: range 0..3 reaches beyond the history (1 messages to turn.head)".to_string(),
        ),
        (
            "a range backwards",
            edited(5, "/turn/sent/0", |r| *r = json!({"from": 2, "to": 1})),
            "line 6: turn.sent[0]: range 2..1 runs backwards".to_string(),
        ),
        (
            "ranges sending the history twice",
            edited(5, "/turn/sent", |s| *s = json!([{"from": 0, "to": 3}, {"from": 1, "to": 2}])),
            "line 6: turn.sent[1]: range 1..2 sends messages of the history (3) a second time".to_string(),
        ),
        (
            "a literal standing for a message outside the history",
            edited(5, "/turn/sent", |s| {
                *s = json!([{"literal": {"role": "user", "content": "x"}, "kind": "cleared", "replaces": [7]}])
            }),
            "line 6: turn.sent[0].replaces 7 is not a position of the history (3 messages to turn.head)".to_string(),
        ),
        (
            "a turn whose at is not a number",
            edited(5, "/turn/at", |a| *a = json!("yesterday")),
            "line 6: turn.at must be a timestamp (whole Unix seconds, 0 to 253402300799)".to_string(),
        ),
        (
            "a record whose at is not a number",
            edited(4, "/record/value/at", |a| *a = json!("noon")),
            "line 5: record.value.at must be a timestamp (whole Unix seconds, 0 to 253402300799)".to_string(),
        ),
        (
            "a node whose created_at is out of range",
            edited(2, "/node/created_at", |a| *a = json!(1e300)),
            "line 3: node.created_at must be a timestamp (whole Unix seconds, 0 to 253402300799)".to_string(),
        ),
        (
            "a session whose created_at is negative",
            edited(0, "/session/created_at", |a| *a = json!(-1)),
            "line 1: session.created_at must be a timestamp (whole Unix seconds, 0 to 253402300799)".to_string(),
        ),
        (
            "counts that do not match",
            edited(0, "/counts/records", |c| *c = json!(2)),
            "line 6: the header counts Some(2) records, the file has 1: is it cut short?".to_string(),
        ),
    ];
    assert_eq!(refused(&h, &hand_made()).await.0, 200, "the base is valid");
    assert!(h
        .client
        .delete(h.url("/admin/sessions/anonymous-hand"))
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
    for (what, lines, said) in cases {
        assert_eq!(refused(&h, &lines).await, (400, said), "{what}");
        assert!(gone(&h).await, "{what}: nothing written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_a_client_cannot_have_is_refused() {
    let h = Harness::start().await;
    for id in ["}x", "}", "a{b}", "with space", "ä€😀", &"x".repeat(129)] {
        let lines = edited(0, "/session/id", |v| *v = json!(id));
        let (status, said) = refused(&h, &lines).await;
        assert_eq!(status, 400, "{id:?}");
        assert!(said.starts_with("line 1: session.id "), "{id:?}: {said}");
    }
    // The gateway's own forms are kept.
    for id in [
        "0123456789abcdef-h0123456789abcdef01234567",
        "anonymous-fp0123456789abcdef01234567",
        "t-a.b_c:d",
    ] {
        let lines = edited(0, "/session/id", |v| *v = json!(id));
        assert_eq!(refused(&h, &lines).await.0, 200, "{id:?}");
    }
}

/// A store written by hand or by an older version: parents that loop and a turn range of 10^12. The admin API
/// and the chat path answer (in time, and without running out of memory); the view shows what is reachable, the
/// turn names its problem. The gateway runs on a runtime of its own thread: one that loops holds its workers
/// forever, and the test fails instead of waiting for them.
#[test]
fn a_stored_cycle_or_range_beyond_the_history_degrades_instead_of_hanging() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(stored_cycle_and_range());
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("the admin API and the chat path answered (see the panic above, if any)");
}

async fn stored_cycle_and_range() {
    use ctxgate::store::{committed, NodeKind, NodeRow, SessionMeta, WriteOp};
    use std::sync::Arc;
    let h = Harness::start().await;
    let id = "anonymous-cyc";
    let meta = SessionMeta {
        id: id.into(),
        tenant: "anonymous".into(),
        dialect: "chat".into(),
        created_at: 1_700_000_000,
        last_active: 1_700_000_000,
        message_count: 1,
        token_estimate: 1,
        head: Some("n0".into()),
        version: 1,
        strategy: None,
        idle_notified: None,
    };
    let ops = vec![
        WriteOp::Session { meta, create: true },
        WriteOp::Node {
            session: id.into(),
            node: NodeRow {
                id: Arc::from("n0"),
                parent: Some(Arc::from("n0")),
                position: 0,
                kind: NodeKind::Client,
                partial: false,
                created_at: 1_700_000_000,
                message: Arc::new(json!({"role": "user", "content": "looping"})),
            },
        },
        WriteOp::Turn {
            session: id.into(),
            turn: json!({"at": 1_700_000_000, "head": "n0", "sent": [{"from": 0, "to": 1_000_000_000_000u64}]})
                .to_string(),
        },
    ];
    committed(h.state.sessions.store().write(ops))
        .await
        .unwrap();
    let in_time = |path: String| {
        let h = &h;
        async move {
            tokio::time::timeout(std::time::Duration::from_secs(10), h.get_json(&path))
                .await
                .expect("answered in time")
        }
    };
    let view = in_time(format!("/admin/sessions/{id}")).await;
    assert_eq!(
        view["messages"],
        json!([{"role": "user", "content": "looping"}])
    );
    let turns = in_time(format!("/admin/sessions/{id}/turns")).await;
    let turn = &turns["turns"][0];
    assert_eq!(turn["sent_from"], json!([{"node": "n0"}]));
    assert_eq!(
        turn["error"],
        "range 0..1000000000000 reaches beyond the history (1 messages)"
    );
    let export = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        h.client
            .get(h.url(&format!("/admin/sessions/{id}/export")))
            .send(),
    )
    .await
    .expect("answered in time")
    .unwrap();
    assert_eq!(export.status(), 200);
    // The chat path: the session's caller goes on.
    let chat = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        h.client
            .post(h.url("/v1/chat/completions"))
            .header("x-session-id", "cyc")
            .json(&json!({"model": "mock-model", "messages": [{"role": "user", "content": "looping"}]}))
            .send(),
    )
    .await
    .expect("answered in time")
    .unwrap();
    assert_eq!(chat.status(), 200);
    assert_eq!(chat.headers()["x-ctxgate-session"], id);
}

// --- node ids are content addresses (issue 36, finding 5) ---------------------------------------------------------

/// An export whose node `k` (from 0 among the nodes) holds `text` under its old id, imported as `new_id`.
fn forged(export: &[u8], k: usize, text: &str, new_id: &str) -> (Vec<u8>, usize) {
    let text_of = String::from_utf8(export.to_vec()).unwrap();
    let mut lines: Vec<Value> = text_of
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    lines[0]["session"]["id"] = json!(new_id);
    let at = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.get("node").is_some())
        .nth(k)
        .unwrap()
        .0;
    lines[at]["node"]["message"]["content"] = json!(text);
    (body(&lines), at + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_whose_node_id_does_not_match_its_content_is_refused() {
    let h = Harness::start_with(|c| c.context.default_context_window = 6_000).await;
    let (sid, mut m) = busy_session(&h).await;
    let real = export(&h, &sid).await;
    let forged_id = "anonymous-forged";
    let (file, line) = forged(&real, 1, "EVIL-IMPORTED", forged_id);
    let r = import(&h, file.clone(), "").await;
    assert_eq!(r.status(), 400, "a node whose id is not its content's");
    let v: Value = r.json().await.unwrap();
    let said = v["error"]["message"].as_str().unwrap();
    assert!(
        said.starts_with(&format!("line {line}: node "))
            && said.contains("is not the id of its content"),
        "{said}"
    );
    // Nothing written: no forged session, and the real client's next turn resolves to what it sent.
    let gone = h
        .client
        .get(h.url(&format!("/admin/sessions/{forged_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
    m.push(json!({"role": "user", "content": "And now?"}));
    chat(&h, &m).await;
    h.state.drain().await;
    let after = String::from_utf8(export(&h, &sid).await).unwrap();
    assert!(!after.contains("EVIL-IMPORTED"), "{after}");
    // The CLI refuses it alike, naming the line.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("c.toml");
    let db = dir.path().join("c.db");
    std::fs::write(
        &conf,
        format!("[store]\npath = {:?}\n", db.display().to_string()),
    )
    .unwrap();
    let path = dir.path().join("forged.jsonl");
    std::fs::write(&path, &file).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["sessions", "import", path.to_str().unwrap(), "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("line {line}: node ")), "{stderr}");
    // The file as exported imports (under another id too: ids do not depend on the session).
    let (same, _) = forged(&real, 0, "Fix the failing build.", "anonymous-copy");
    assert_eq!(import(&h, same, "").await.status(), 200);
}

// --- the import's own body limit (issue 36, finding 7) ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_larger_than_a_chat_body_imports_back_and_every_admin_413_is_json() {
    // Chat bodies capped far below the session's export: the import route has a limit of its own.
    let h = Harness::start_with(|c| {
        c.context.default_context_window = 6_000;
        c.server.max_body_bytes = 16 * 1024;
    })
    .await;
    let (sid, _) = busy_session_small_requests(&h).await;
    let file = export(&h, &sid).await;
    assert!(file.len() > 16 * 1024, "{} bytes", file.len());
    // A PATCH body over its limit: 413 in the gateway's JSON error shape, not axum's plain text. (On a client of
    // its own: the server answers before reading the body and closes that connection, which a pooled client could
    // otherwise hand to the next request.)
    let r = reqwest::Client::new()
        .patch(h.url(&format!("/admin/sessions/{sid}")))
        .header("content-type", "application/json")
        .body(format!("{{\"strategy\": \"{}\"}}", "x".repeat(80 << 10)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let r = import(&h, file.clone(), "?replace=true").await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(
        timeless(&export(&h, &sid).await),
        timeless(&file),
        "imported whole"
    );
    // Over admin.max_import_bytes: 413 naming the key, in the JSON error shape; nothing written.
    let small = Harness::start_with(|c| c.admin.max_import_bytes = 1024).await;
    let r = import(&small, file, "").await;
    assert_eq!(r.status(), 413);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    assert_eq!(
        v["error"]["message"],
        "request body exceeds the limit of 1024 bytes (admin.max_import_bytes)"
    );
    let r = small
        .client
        .get(small.url(&format!("/admin/sessions/{sid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// A session of many turns, each request under 16 KiB: its export is larger than any one of them.
async fn busy_session_small_requests(h: &Harness) -> (String, Vec<Value>) {
    let mut m = Vec::new();
    let mut sid = String::new();
    for i in 0..12 {
        m.push(
            json!({"role": "user", "content": format!("question {i}: {}", "words ".repeat(100))}),
        );
        // Each request carries the last few messages only, as a client trimming its own history does.
        let from = m.len().saturating_sub(3);
        let (id, answer) = chat(h, &m[from..]).await;
        sid = id;
        m.push(answer["choices"][0]["message"].clone());
    }
    h.state.drain().await;
    (sid, m)
}
