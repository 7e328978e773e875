//! The real binary's life: SIGTERM drains background work and queued writes before exiting, SIGKILL keeps every
//! acknowledged turn, and a damaged database refuses start-up with a recovery path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{session_header, support_chat};
use ctxgate::mock::{MockReply, MockUpstream, RecordedRequest};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

const SUMMARIZER: &str = "summarizer-model";

/// A `ctxgate serve` process and its JSON log lines.
struct Gateway {
    child: Child,
    addr: String,
    logs: Arc<Mutex<Vec<String>>>,
}

fn config_file(dir: &Path, upstream: &str, extra: &str) -> PathBuf {
    let path = dir.join("ctxgate.toml");
    let db = dir.join("ctxgate.db");
    let text = format!(
        r#"[server]
listen = "127.0.0.1:0"
log_format = "json"
shutdown_grace_secs = 5
drain_secs = 20

[upstream]
base_url = "{upstream}"

[store]
backend = "sqlite"
path = "{db}"

{extra}
"#,
        db = db.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn start(config: &Path) -> Gateway {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["serve", "--config"])
        .arg(config)
        .env("CTXGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    let sink = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the gateway did not start: {:?}",
                    logs.lock().unwrap().clone()
                );
            }
        };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["fields"]["message"] == "ctxgate listening" {
            break v["fields"]["listen"].as_str().unwrap().to_string();
        }
    };
    Gateway { child, addr, logs }
}

impl Gateway {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    fn terminate(mut self) -> (bool, Vec<String>) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let exit = self.child.wait().unwrap();
        // the log reader ends with the process's stderr
        std::thread::sleep(Duration::from_millis(50));
        let logs = self.logs.lock().unwrap().clone();
        (exit.success(), logs)
    }

    /// SIGKILL: no shutdown at all.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ctxgate sessions show <id>` against the store the config names.
fn show(config: &Path, id: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["sessions", "show", id, "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sessions show: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn chat(gw: &Gateway, session: &str, body: &Value) -> (String, String) {
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-lifecycle")
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sid = session_header(&resp);
    (sid, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_background_summaries_and_queued_records_before_exiting() {
    let mock = MockUpstream::start().await.unwrap();
    // The summary call takes a while: it is still running when SIGTERM arrives.
    mock.set_responder(Arc::new(|r: &RecordedRequest| {
        (r.json()["model"] == SUMMARIZER).then(|| {
            MockReply::completion("Goals: travel help (call_0).")
                .delayed(Duration::from_millis(1500))
        })
    }));
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &mock.base_url(),
        &format!(
            "[context]\ndefault_context_window = 4000\n\n[summary]\nmodel = \"{SUMMARIZER}\"\nwait_ms = 0\nkeep_recent = 4\n"
        ),
    );
    let gw = start(&config);
    // Over the threshold: the request is pruned (a compression record) and a summary starts in the background.
    let messages = support_chat(8);
    let (sid, _) = chat(
        &gw,
        "drain-1",
        &json!({"model":"mock-model","messages":messages}),
    )
    .await;
    let (clean, logs) = gw.terminate();
    assert!(clean, "exit status after SIGTERM: {logs:#?}");
    assert!(
        mock.requests()
            .iter()
            .any(|r| r.json()["model"] == SUMMARIZER),
        "the summary was asked for"
    );

    let v = show(&config, &sid);
    assert_eq!(
        v["messages"].as_array().unwrap().len(),
        messages.len() + 1,
        "the turn is stored: {v:#}"
    );
    let compressions = v["compressions"].as_array().unwrap();
    assert!(
        compressions.iter().any(|c| c["kind"] == "summary"),
        "the summary finished during the drain and was stored: {compressions:#?}"
    );
    assert!(
        compressions.iter().any(|c| c["kind"] != "summary"),
        "the prune record is stored: {compressions:#?}"
    );
    assert!(
        logs.iter()
            .any(|l| l.contains("drained background work and committed every queued store write")),
        "the drain is logged: {logs:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_keeps_every_acknowledged_turn() {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &mock.base_url(), "");
    let gw = start(&config);
    let mut messages = vec![json!({"role":"system","content":"Be brief."})];
    let mut sid = String::new();
    const TURNS: usize = 6;
    for i in 0..TURNS {
        messages.push(json!({"role":"user","content":format!("question {i}")}));
        // alternate streamed and plain answers; each is read to its end before the next turn
        let stream = i % 2 == 0;
        let (s, text) = chat(
            &gw,
            "crash-1",
            &json!({"model":"mock-model","messages":messages,"stream":stream}),
        )
        .await;
        assert!(text.contains("mock") || text.contains("reply"), "{text}");
        sid = s;
        messages.push(json!({"role":"assistant","content":"mock reply"}));
    }
    gw.kill();

    // Restarted, the gateway continues the same history; and the store holds every acknowledged turn.
    let v = show(&config, &sid);
    let stored = v["messages"].as_array().unwrap();
    assert_eq!(stored.len(), 1 + 2 * TURNS, "{v:#}");
    for i in 0..TURNS {
        assert_eq!(stored[1 + 2 * i]["content"], format!("question {i}"));
        assert_eq!(stored[2 + 2 * i]["role"], "assistant");
        assert_eq!(stored[2 + 2 * i]["content"], "mock reply");
    }
    assert!(v["partial"].as_array().unwrap().is_empty(), "{v:#}");
    let gw = start(&config);
    messages.push(json!({"role":"user","content":"after the crash"}));
    let (again, _) = chat(
        &gw,
        "crash-1",
        &json!({"model":"mock-model","messages":messages}),
    )
    .await;
    assert_eq!(again, sid, "the same session after the restart");
    let (clean, logs) = gw.terminate();
    assert!(clean, "{logs:#?}");
    assert_eq!(
        show(&config, &sid)["messages"].as_array().unwrap().len(),
        1 + 2 * (TURNS + 1)
    );
}

/// Runs `serve` on a damaged database: it must exit non-zero, naming the file, the problem and the recovery.
fn assert_refused(config: &Path, db: &Path) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["serve", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut waited = Duration::ZERO;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if waited > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the gateway started on a damaged database");
        }
        std::thread::sleep(Duration::from_millis(50));
        waited += Duration::from_millis(50);
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    let p = db.display().to_string();
    assert!(err.contains(&p), "names the file: {err}");
    assert!(err.contains("damaged or not a ctxgate database"), "{err}");
    assert!(err.contains(&format!("mv {p} {p}.corrupt")), "{err}");
    assert!(err.contains(".recover"), "{err}");
}

#[test]
fn a_garbage_database_file_refuses_start_up_with_a_recovery_path() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "http://127.0.0.1:9/v1", "");
    let db = dir.path().join("ctxgate.db");
    std::fs::write(&db, b"this is not a database\n".repeat(400)).unwrap();
    assert_refused(&config, &db);
}

#[test]
fn a_database_with_a_damaged_page_refuses_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "http://127.0.0.1:9/v1", "");
    let db = dir.path().join("ctxgate.db");
    {
        // A sound database with a table spread over many pages, checkpointed into the main file.
        let mut conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "PRAGMA page_size = 4096; CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT);
             CREATE INDEX t_v ON t(v);",
        )
        .unwrap();
        let tx = conn.transaction().unwrap();
        for i in 0..2000 {
            tx.execute(
                "INSERT INTO t (k, v) VALUES (?1, ?2)",
                rusqlite::params![i, format!("value {i} {}", "x".repeat(100))],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    // Scribble over a page in the middle of the file; the header (page 1) stays valid.
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 40 * 4096, "{}", bytes.len());
    for b in &mut bytes[20 * 4096..21 * 4096] {
        *b = 0xA5;
    }
    std::fs::write(&db, bytes).unwrap();
    assert_refused(&config, &db);
}

/// A rewritten request is visible per request: the answer carries `x-ctxgate-rewrite` (stages and tokens) and,
/// after recall rounds, `x-ctxgate-recall`; the access-log line has `rewritten`, `stages`, `tokens_client`,
/// `tokens_sent` and `recall_rounds`; a request that needs no rewrite carries neither header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_is_visible_in_the_answer_and_the_access_log() {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &mock.base_url(),
        "[context]\ndefault_context_window = 4000\n",
    );
    let gw = start(&config);
    let send = |session: &'static str, body: Value| {
        let url = gw.url("/v1/chat/completions");
        async move {
            client()
                .post(url)
                .header("authorization", "Bearer sk-lifecycle")
                .header("x-session-id", session)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    // Small: sent as it is.
    let small = send(
        "visible-0",
        json!({"model":"mock-model","messages":[{"role":"user","content":"hi"}]}),
    )
    .await;
    assert_eq!(small.status(), 200);
    assert!(small.headers().get("x-ctxgate-rewrite").is_none());
    assert!(small.headers().get("x-ctxgate-recall").is_none());
    small.text().await.unwrap();
    // Over the threshold: rewritten; the model recalls a cleared result once.
    mock.push(MockReply::message(
        json!({"role":"assistant","content":null,"tool_calls":[{"id":"r1","type":"function",
            "function":{"name":"recall_tool_call","arguments":"{\"call_id\":\"call_0\"}"}}]}),
        "tool_calls",
    ));
    mock.push(MockReply::completion("done"));
    let big = send(
        "visible-1",
        json!({"model":"mock-model","messages":support_chat(8),
               "tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]}),
    )
    .await;
    assert_eq!(big.status(), 200);
    let rewrite = big.headers()["x-ctxgate-rewrite"]
        .to_str()
        .unwrap()
        .to_string();
    let (stages, tokens) = rewrite.split_once("; tokens=").expect(&rewrite);
    assert!(
        !stages.is_empty()
            && stages
                .split(',')
                .all(|s| ["cleared", "pruned", "summarized", "truncated"].contains(&s)),
        "{rewrite}"
    );
    let (client_tokens, sent_tokens) = tokens.split_once("->").unwrap();
    let (client_tokens, sent_tokens): (u64, u64) =
        (client_tokens.parse().unwrap(), sent_tokens.parse().unwrap());
    assert!(sent_tokens < client_tokens, "{rewrite}");
    assert_eq!(big.headers()["x-ctxgate-recall"], "1");
    big.text().await.unwrap();
    let (clean, logs) = gw.terminate();
    assert!(clean);
    let access: Vec<Value> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "ctxgate::access" && v["fields"]["message"] == "conversation")
        .collect();
    assert_eq!(access.len(), 2, "{logs:#?}");
    let (plain, rewritten) = (&access[0]["fields"], &access[1]["fields"]);
    assert_eq!(plain["rewritten"], false);
    assert_eq!(plain["stages"], "");
    assert_eq!(plain["recall_rounds"], 0);
    assert_eq!(rewritten["rewritten"], true);
    assert_eq!(rewritten["stages"], stages);
    assert_eq!(rewritten["tokens_client"], client_tokens);
    assert_eq!(rewritten["tokens_sent"], sent_tokens);
    assert_eq!(rewritten["recall_rounds"], 1);
    // Where to look, said at start-up.
    let messages: Vec<String> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["fields"]["message"].as_str().map(str::to_string))
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("inspector: http://127.0.0.1:") && m.ends_with("/ui/")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("metrics: http://127.0.0.1:") && m.ends_with("/metrics")),
        "{messages:?}"
    );
}

/// ctxgate's own error answers are logged by the same access-log writer as answered turns: the line of a turn
/// (session, rewritten, stages, tokens, recall rounds) at `warn`, with the error and without the exchange's fields;
/// one for a request refused before it had a model or a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_error_is_logged_with_the_access_line_of_a_turn() {
    // An upstream that refuses connections: the send fails once the session is known and the request planned.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &upstream,
        "[context]\ndefault_context_window = 4000\n",
    );
    let gw = start(&config);
    let send = |session: &'static str, body: Value| {
        let url = gw.url("/v1/chat/completions");
        async move {
            let resp = client()
                .post(url)
                .header("authorization", "Bearer sk-lifecycle")
                .header("x-session-id", session)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 502);
            resp.headers()["x-ctxgate-session"]
                .to_str()
                .unwrap()
                .to_string()
        }
    };
    let small = send(
        "own-error-0",
        json!({"model":"mock-model","messages":[{"role":"user","content":"hi"}]}),
    )
    .await;
    let big = send(
        "own-error-1",
        json!({"model":"mock-model","messages":support_chat(8)}),
    )
    .await;
    let unparsed = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(unparsed.status(), 400);
    let (clean, logs) = gw.terminate();
    assert!(clean);
    let access: Vec<Value> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "ctxgate::access")
        .collect();
    assert_eq!(access.len(), 3, "{logs:#?}");
    for line in &access {
        assert_eq!(line["level"], "WARN", "{line}");
        let f = &line["fields"];
        assert_eq!(
            f["message"], "conversation request failed in ctxgate",
            "{f}"
        );
        assert_eq!(f["path"], "/v1/chat/completions");
        assert_eq!(f["recall_rounds"], 0);
        assert!(f["total_ms"].is_number() && f["error"].is_string(), "{f}");
        for exchange in ["upstream_ms", "bytes", "complete", "client_disconnected"] {
            assert!(f.get(exchange).is_none(), "{f}");
        }
    }
    let (small_line, big_line, unparsed_line) = (
        &access[0]["fields"],
        &access[1]["fields"],
        &access[2]["fields"],
    );
    assert_eq!(small_line["status"], 502);
    assert_eq!(small_line["model"], "mock-model");
    assert_eq!(small_line["session"], small);
    assert_eq!(small_line["rewritten"], false);
    assert_eq!(small_line["stages"], "");
    assert_eq!(big_line["status"], 502);
    assert_eq!(big_line["session"], big);
    assert_eq!(big_line["rewritten"], true);
    assert!(
        !big_line["stages"].as_str().unwrap().is_empty(),
        "{big_line}"
    );
    let (client_tokens, sent_tokens) = (
        big_line["tokens_client"].as_u64().unwrap(),
        big_line["tokens_sent"].as_u64().unwrap(),
    );
    assert!(sent_tokens < client_tokens, "{big_line}");
    assert_eq!(unparsed_line["status"], 400);
    assert_eq!(unparsed_line["model"], "");
    assert_eq!(unparsed_line["session"], "");
    assert_eq!(unparsed_line["rewritten"], false);
}

/// `--help` names the three APIs and where the inspector and the metrics are.
#[test]
fn help_names_the_apis_the_inspector_and_the_metrics() {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
        "/ui/",
        "/metrics",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}: {text}");
    }
}
