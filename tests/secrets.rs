//! No API key anywhere: the real binary runs a full scenario (plain and streamed turns, a rewrite answered with
//! recall, an upstream error echoing the key, passthrough, a refused request, admin calls, `/metrics`) with a
//! recognisable key in `Authorization` and `x-api-key`, logging at debug (text) and at info (JSON); then the
//! logs, every file of the store (database, `-wal`, `-shm`) and `/metrics` are searched for the key, and for its
//! plain SHA-256: zero hits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::agent_history;
use ctxgate::mock::{MockReply, MockUpstream};
use serde_json::{json, Value};
use sha2::Digest;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In every key below; never anywhere ctxgate writes.
const CANARY: &str = "LEAKCANARY";
const AUTH_KEY: &str = "sk-proj-LEAKCANARY-7f3a9c2e51";
const X_API_KEY: &str = "xk-ant-LEAKCANARY-55e1d0b9";

/// The binary, serving with its stderr captured.
struct Gateway {
    child: Child,
    stderr: Arc<parking_lot::Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    base: String,
}

impl Gateway {
    fn start(config: &std::path::Path, log: &str, format: &str) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
            .args(["serve", "--config"])
            .arg(config)
            .args(["--log-format", format])
            .env("CTXGATE_LOG", log)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().extend_from_slice(&buf[..n]);
            }
        });
        let started = Instant::now();
        let port = loop {
            let text = String::from_utf8_lossy(&stderr.lock()).into_owned();
            if let Some(port) = listening_port(&text) {
                break port;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("ctxgate exited ({status}): {text}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "not listening: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Gateway {
            child,
            stderr,
            reader: Some(reader),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// SIGTERM, wait for the exit, and return everything it logged.
    fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success());
        let started = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        let text = String::from_utf8_lossy(&self.stderr.lock()).into_owned();
        text
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The port of the `ctxgate listening` line (text or JSON logs).
fn listening_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("ctxgate listening"))?;
    let after = &line[line.find("listen")? + "listen".len()..];
    let addr = &after[after.find("127.0.0.1:")? + "127.0.0.1:".len()..];
    let digits: String = addr.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id":id,"type":"function","function":{"name":name,"arguments":args.to_string()}})
}

/// Runs the whole scenario against a fresh store and returns (logs, store files' bytes, `/metrics`).
async fn scenario(log: &str, format: &str) -> (String, Vec<(String, Vec<u8>)>, String) {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ctxgate.toml");
    let data = dir.path().join("data");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[upstream]\nbase_url = \"{}\"\n\n[store]\npath = \"{}\"\n\n\
             [context]\ndefault_context_window = 8000\n",
            mock.base_url(),
            data.join("ctxgate.db").display()
        ),
    )
    .unwrap();
    let (log, format) = (log.to_string(), format.to_string());
    let gw = tokio::task::spawn_blocking(move || Gateway::start(&config, &log, &format))
        .await
        .unwrap();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = |p: &str| format!("{}{p}", gw.base);
    let post = |sid: &str, body: Value| {
        client
            .post(url("/v1/chat/completions"))
            .header("authorization", format!("Bearer {AUTH_KEY}"))
            .header("x-api-key", X_API_KEY)
            .header("x-session-id", sid)
            .json(&body)
            .send()
    };

    // plain turns, then a streamed one
    let mut history = vec![
        json!({"role":"system","content":"be brief"}),
        json!({"role":"user","content":"first question CANARYTEXT-1"}),
    ];
    let r = post("plain", json!({"model":"gpt-4o","messages":history}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    history.push(v["choices"][0]["message"].clone());
    history.push(json!({"role":"user","content":"second question"}));
    let r = post(
        "plain",
        json!({"model":"gpt-4o","messages":history,"stream":true,"stream_options":{"include_usage":true}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let sse = r.text().await.unwrap();
    assert!(sse.contains("[DONE]"), "{sse}");

    // a rewrite, with a recall round answered by ctxgate
    mock.push(MockReply::message(
        json!({"role":"assistant","content":null,"tool_calls":[
            call("r1", "recall_tool_call", json!({"call_id":"call_0"})),
            call("r2", "search_history", json!({"query":"MARKER-1"}))]}),
        "tool_calls",
    ));
    mock.push(MockReply::completion("recalled"));
    let body = json!({"model":"mock-model","messages":agent_history(14, 300),
        "tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]});
    let r = post("agent", body).await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "recalled");
    assert_eq!(mock.requests().len(), 4, "the recall round went upstream");

    // the upstream refuses, echoing the key (as some providers do)
    mock.push(MockReply::json(
        401,
        json!({"error":{"message":format!("Incorrect API key provided: {AUTH_KEY}"),
            "type":"invalid_request_error","param":null,"code":"invalid_api_key"}}),
    ));
    let r = post(
        "refused",
        json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    // a request ctxgate refuses itself, and a passthrough call
    let r = client
        .post(url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {AUTH_KEY}"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .get(url("/v1/models"))
        .header("authorization", format!("Bearer {AUTH_KEY}"))
        .header("x-api-key", X_API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // admin calls (loopback, no token), sent with the key as well
    let admin = |method: reqwest::Method, path: &str| {
        client
            .request(method, url(path))
            .header("authorization", format!("Bearer {AUTH_KEY}"))
            .send()
    };
    let list: Value = admin(reqwest::Method::GET, "/admin/sessions")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<String> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.len() >= 2, "{list}");
    for id in &ids {
        let r = admin(reqwest::Method::GET, &format!("/admin/sessions/{id}"))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        assert!(!text.contains(CANARY), "admin view: {text}");
    }
    let plain = ids.iter().find(|i| i.ends_with("-plain")).unwrap();
    let r = admin(
        reqwest::Method::POST,
        &format!("/admin/sessions/{plain}/compress"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400, "summaries are off");
    if let Some(refused) = ids.iter().find(|i| i.ends_with("-refused")) {
        let r = admin(
            reqwest::Method::DELETE,
            &format!("/admin/sessions/{refused}"),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
    }
    let metrics = client
        .get(url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("ctxgate_requests_total"), "{metrics}");

    let logs = tokio::task::spawn_blocking(move || gw.stop())
        .await
        .unwrap();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        files.push((path.display().to_string(), std::fs::read(&path).unwrap()));
    }
    (logs, files, metrics)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

async fn no_key_anywhere(log: &str, format: &str) {
    let (logs, files, metrics) = scenario(log, format).await;
    // the search is not vacuous: the logs tell of the turns, the store holds the conversations
    assert!(logs.contains("chat") && logs.contains("-agent"), "{logs}");
    if log == "debug" {
        assert!(logs.contains("DEBUG"), "debug events were logged: {logs}");
    }
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.iter().any(|n| n.ends_with("ctxgate.db")), "{names:?}");
    assert!(
        names.iter().any(|n| n.ends_with("ctxgate.secret")),
        "{names:?}"
    );
    let store: Vec<u8> = files.iter().flat_map(|(_, b)| b.clone()).collect();
    assert!(contains(&store, "CANARYTEXT-1") && contains(&store, "MARKER-0"));

    let mut needles = vec![
        CANARY.to_string(),
        // the plain SHA-256 of a key or a header value would let anyone test guesses
        hex::encode(sha2::Sha256::digest(AUTH_KEY)),
        hex::encode(sha2::Sha256::digest(format!("Bearer {AUTH_KEY}"))),
        hex::encode(sha2::Sha256::digest(X_API_KEY)),
    ];
    needles.extend(
        needles
            .clone()
            .iter()
            .map(|n| n[..16.min(n.len())].to_string()),
    );
    for needle in &needles {
        assert!(
            !contains(logs.as_bytes(), needle),
            "{needle} in the logs:\n{logs}"
        );
        assert!(
            !contains(metrics.as_bytes(), needle),
            "{needle} in /metrics"
        );
        for (name, bytes) in &files {
            assert!(!contains(bytes, needle), "{needle} in {name}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_key_in_store_logs_or_metrics_debug_text() {
    no_key_anywhere("debug", "text").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_key_in_store_logs_or_metrics_info_json() {
    no_key_anywhere("info", "json").await;
}
