//! Live reload: SIGHUP (the real binary) and `POST /admin/config/reload` apply a new threshold to the next request;
//! a file with problems changes nothing and every problem is reported; keys that need a restart are named and not
//! applied; a request in flight during a reload completes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, test_config, Harness};
use ctxgate::mock::{chunk, MockReply, MockUpstream};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn write_config(path: &Path, upstream: &str, threshold: f64, extra: &str) {
    std::fs::write(
        path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nlog_format = \"json\"\n[upstream]\nbase_url = \"{upstream}\"\n\
             [store]\nbackend = \"memory\"\n[context]\ndefault_context_window = 20000\nthreshold = {threshold}\n\
             target = {target}\n{extra}",
            target = threshold / 2.0
        ),
    )
    .unwrap();
}

/// Posts a long agent history; returns whether the upstream got it rewritten.
async fn rewritten(url: &str, mock: &MockUpstream, session: &str) -> bool {
    let messages = agent_history(14, 300);
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer sk-reload")
        .header("x-session-id", session)
        .json(&json!({"model": "mock-model", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    mock.requests().last().unwrap().json()["messages"] != json!(messages)
}

struct Gateway {
    child: Child,
    addr: String,
    lines: mpsc::Receiver<String>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the gateway did not start");
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if v["fields"]["message"] == "ctxgate listening" {
            break v["fields"]["listen"].as_str().unwrap().to_string();
        }
    };
    Gateway {
        child,
        addr,
        lines: rx,
    }
}

impl Gateway {
    /// Sends SIGHUP and waits for the log line saying how the reload ended; returns its fields.
    fn hup(&self) -> Value {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(10))
                .expect("no reload log line");
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let msg = v["fields"]["message"].as_str().unwrap_or("");
            if msg == "config: reloaded" || msg.starts_with("config: reload refused") {
                return v["fields"].clone();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_threshold_and_a_bad_file_changes_nothing() {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config: PathBuf = dir.path().join("ctxgate.toml");
    write_config(&config, &mock.base_url(), 0.95, "");
    let gw = start(&config);
    let url = format!("http://{}", gw.addr);
    assert!(
        !rewritten(&url, &mock, "a").await,
        "under 0.95 of the window: sent as it was"
    );

    write_config(&config, &mock.base_url(), 0.3, "");
    let said = gw.hup();
    assert_eq!(said["message"], "config: reloaded");
    assert!(
        said["changed"].to_string().contains("context.threshold"),
        "{said}"
    );
    assert!(rewritten(&url, &mock, "b").await, "over 0.3: rewritten");

    // A file with problems: logged, nothing applied.
    write_config(&config, &mock.base_url(), 7.0, "");
    let said = gw.hup();
    assert!(
        said["message"]
            .as_str()
            .unwrap()
            .starts_with("config: reload refused"),
        "{said}"
    );
    assert!(rewritten(&url, &mock, "c").await, "still 0.3");
}

/// A harness whose config came from a file (so that reloads read it).
async fn harness_with_file(threshold: f64) -> (Harness, PathBuf, tempfile::TempDir) {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctxgate.toml");
    write_config(&path, &mock.base_url(), threshold, "");
    let cfg = ctxgate::config::Config::load(Some(&path)).unwrap();
    let h = Harness::start_config(mock, cfg.clone()).await;
    h.state.reload.set(Some(path.clone()), cfg);
    (h, path, dir)
}

async fn reload(h: &Harness) -> (u16, Value) {
    let r = h
        .client
        .post(h.url("/admin/config/reload"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn the_admin_endpoint_reloads_and_lists_every_problem() {
    let (h, path, _dir) = harness_with_file(0.95).await;
    let url = h.url("");
    let url = url.trim_end_matches('/');
    assert!(!rewritten(url, &h.mock, "a").await);

    // Several problems at once: every one is listed, nothing changes.
    write_config(&path, &h.mock.base_url(), 7.0, "hard_limit = 2.0\n");
    let (status, v) = reload(&h).await;
    assert_eq!(status, 400, "{v}");
    let problems: Vec<&str> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(problems.len() >= 2, "{problems:?}");
    assert!(
        problems.iter().any(|p| p.contains("context.threshold")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("context.target")),
        "{problems:?}"
    );
    assert!(
        !rewritten(url, &h.mock, "b").await,
        "the running config was kept"
    );

    // A good file: applied, with what changed; a changed listen address is named, not applied.
    std::fs::write(
        &path,
        std::fs::read_to_string(&path)
            .unwrap()
            .replace("threshold = 7", "threshold = 0.3")
            .replace("target = 3.5\n", "target = 0.15\n")
            .replace("hard_limit = 2.0\n", "")
            .replace("127.0.0.1:0", "127.0.0.1:1"),
    )
    .unwrap();
    let (status, v) = reload(&h).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["changed"], json!(["context.target", "context.threshold"]));
    assert_eq!(v["restart_required"], json!(["server.listen"]));
    assert!(rewritten(url, &h.mock, "c").await, "0.3 in force");
    assert_eq!(h.state.config.server.listen, "127.0.0.1:0", "not applied");
    let metrics = h
        .client
        .get(h.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ctxgate_config_reloads_total{outcome=\"applied\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("ctxgate_config_reloads_total{outcome=\"rejected\"} 1"));
}

#[tokio::test]
async fn a_request_in_flight_finishes_across_a_reload() {
    let (h, path, _dir) = harness_with_file(0.95).await;
    let pieces: Vec<Value> = (0..10)
        .map(|i| chunk(json!({"content": format!("part{i} ")}), None))
        .chain([chunk(json!({}), Some("stop"))])
        .collect();
    h.mock
        .push(MockReply::sse_chunks(&pieces, Duration::from_millis(60)));
    let client = h.client.clone();
    let url = h.url("/v1/chat/completions");
    let streaming = tokio::spawn(async move {
        let r = client
            .post(url)
            .header("authorization", "Bearer sk-reload")
            .json(&json!({"model": "mock-model", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    write_config(&path, &h.mock.base_url(), 0.3, "");
    for _ in 0..3 {
        assert_eq!(reload(&h).await.0, 200);
    }
    let (status, body) = streaming.await.unwrap();
    assert_eq!(status, 200);
    for i in 0..10 {
        assert!(body.contains(&format!("part{i} ")), "{body}");
    }
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
}

#[tokio::test]
async fn reloading_needs_the_admin_token() {
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.admin.token = Some("admin-secret".into());
    let h = Harness::start_config(mock, cfg).await;
    let url = h.url("/admin/config/reload");
    assert_eq!(h.client.post(&url).send().await.unwrap().status(), 401);
    assert_eq!(
        h.client
            .post(&url)
            .bearer_auth("no")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
}
