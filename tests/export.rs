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
    let r = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-export")
        .header("x-session-id", "export-1")
        .json(&json!({"model": "mock-model", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r.headers()["x-ctxgate-session"]
        .to_str()
        .unwrap()
        .to_string();
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
