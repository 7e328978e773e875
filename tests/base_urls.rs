//! Base URLs: a path that shows the client's base URL is wrong (`POST /messages`, `/chat/completions`,
//! `/api/v1/…`, `/v1/v1/…`) is logged once a minute per path with the likely fix (no query string, no key), and a
//! 404 says the same fix in the shape of the API it looks like; `serve --anthropic-upstream` points `/v1/messages`
//! at an upstream without a config file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::Logged;

use common::Harness;
use ctxgate::mock::MockUpstream;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

impl Logged {
    /// Logs this thread's events (the test runtime has one thread: the server's tasks log here too).
    fn capture() -> (Logged, tracing::subscriber::DefaultGuard) {
        let logged = Logged::default();
        let guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .json()
                .with_writer(logged.clone())
                .with_max_level(tracing::Level::INFO)
                .finish(),
        );
        (logged, guard)
    }

    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// The warnings logged, as JSON.
    fn warnings(&self) -> Vec<Value> {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["level"] == "WARN")
            .collect()
    }

    /// The warnings for `path`.
    fn warnings_for(&self, path: &str) -> Vec<Value> {
        self.warnings()
            .into_iter()
            .filter(|v| v["fields"]["path"] == path)
            .collect()
    }
}

const KEY: &str = "sk-ant-base-url-secret";

fn anthropic_body() -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
           "messages": [{"role": "user", "content": "hello"}]})
}

async fn post(h: &Harness, path: &str, body: &Value) -> (u16, Value) {
    let r = h
        .client
        .post(h.url(path))
        .header("x-api-key", KEY)
        .header("authorization", format!("Bearer {KEY}"))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test]
async fn messages_on_the_bare_host_is_answered_and_logged_with_the_fix() {
    let (logged, _log) = Logged::capture();
    let h = Harness::start().await;
    let base = format!("http://{}", h.addr);
    // The Vercel AI SDK's Anthropic provider given the bare host appends only `/messages`.
    let (status, body) = post(&h, "/messages?key=qs-secret", &anthropic_body()).await;
    assert_eq!(status, 404);
    // In Anthropic's error shape, so the SDK shows the message.
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    let said = body["error"]["message"].as_str().unwrap();
    assert!(
        said.starts_with(&format!(
            "no route for POST /messages: set the client's base URL to {base}/v1 — it appended /messages to the \
             bare host"
        )),
        "{said}"
    );
    assert!(!said.contains("qs-secret"), "{said}");
    // Again and again: logged once.
    for _ in 0..3 {
        assert_eq!(post(&h, "/messages", &anthropic_body()).await.0, 404);
    }
    let warned = logged.warnings_for("/messages");
    assert_eq!(warned.len(), 1, "{}", logged.text());
    let w = &warned[0]["fields"];
    assert_eq!(w["method"], "POST");
    assert_eq!(w["status"], 404);
    assert!(
        w["fix"]
            .as_str()
            .unwrap()
            .starts_with(&format!("set the client's base URL to {base}/v1")),
        "{w}"
    );
    // Neither the query string nor the key is in the log.
    let text = logged.text();
    assert!(!text.contains("qs-secret") && !text.contains(KEY), "{text}");
    // Nothing reached the upstream.
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn other_api_paths_at_a_wrong_place_are_told_too_each_once() {
    let (logged, _log) = Logged::capture();
    let h = Harness::start().await;
    let base = format!("http://{}", h.addr);
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    for (path, fix) in [
        (
            "/chat/completions",
            format!("set the client's base URL to {base}/v1 — it appended /chat/completions"),
        ),
        (
            "/responses",
            format!("set the client's base URL to {base}/v1 — it appended /responses"),
        ),
        (
            "/api/v1/chat/completions",
            format!("set the client's base URL to {base}/v1 (or {base} for a client that appends /v1/… itself"),
        ),
        (
            "/openai/chat/completions",
            format!("set the client's base URL to {base}/v1 instead of {base}/openai"),
        ),
    ] {
        for _ in 0..2 {
            let (status, body) = post(&h, path, &chat).await;
            assert_eq!(status, 404, "{path}");
            // OpenAI's error shape for the OpenAI APIs.
            let said = body["error"]["message"].as_str().unwrap();
            assert!(
                said.starts_with(&format!("no route for POST {path}: {fix}")),
                "{path}: {said}"
            );
        }
        let warned = logged.warnings_for(path);
        assert_eq!(warned.len(), 1, "{path}: {}", logged.text());
        assert!(
            warned[0]["fields"]["fix"]
                .as_str()
                .unwrap()
                .starts_with(&fix),
            "{path}: {}",
            warned[0]
        );
    }
    // A path that is no API call: the plain 404, nothing logged.
    let r = h.client.get(h.url("/favicon.ico")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["message"], "no route for GET /favicon.ico");
    assert!(logged.warnings_for("/favicon.ico").is_empty());
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn v1_twice_is_forwarded_as_it_came_and_logged_with_the_fix() {
    let (logged, _log) = Logged::capture();
    let h = Harness::start().await;
    let base = format!("http://{}", h.addr);
    // litellm given `…/v1` posts `/v1/v1/messages`.
    for _ in 0..3 {
        let r = h
            .client
            .post(h.url("/v1/v1/messages?beta=true"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(&anthropic_body())
            .send()
            .await
            .unwrap();
        // Passed through (the mock answers any `…/messages`): unmanaged, so no session.
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-ctxgate-session").is_none());
        r.text().await.unwrap();
    }
    let sent = h.mock.requests();
    assert_eq!(sent.len(), 3);
    assert_eq!(
        sent[0].uri, "/v1/v1/messages?beta=true",
        "forwarded as it came"
    );
    let warned = logged.warnings_for("/v1/v1/messages");
    assert_eq!(warned.len(), 1, "{}", logged.text());
    let fix = warned[0]["fields"]["fix"].as_str().unwrap();
    assert!(
        fix.starts_with(&format!(
            "set the client's base URL to {base} (without /v1) — it appends /v1/… itself"
        )),
        "{fix}"
    );
    assert!(fix.contains("unmanaged"), "{fix}");
    let text = logged.text();
    assert!(!text.contains("beta=true") && !text.contains(KEY), "{text}");
    // The right path is managed as ever, and not warned about.
    let (status, _) = post(&h, "/v1/messages", &anthropic_body()).await;
    assert_eq!(status, 200);
    assert!(logged.warnings_for("/v1/messages").is_empty());
}

/// `ctxgate serve --upstream A --anthropic-upstream B`, no config file: chat goes to A, `/v1/messages` to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_anthropic_upstream_points_messages_at_it_without_a_config_file() {
    let openai = MockUpstream::start().await.unwrap();
    let anthropic = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--upstream", &openai.base_url()])
        .args(["--anthropic-upstream", &anthropic.base_url()])
        .current_dir(dir.path())
        .env("CTXGATE_STORE__BACKEND", "memory")
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
    let mut seen = Vec::new();
    let listening = loop {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!("the gateway did not start: {seen:?}");
        };
        seen.push(line.clone());
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["fields"]["message"] == "ctxgate listening" {
            break v["fields"].clone();
        }
    };
    assert_eq!(listening["anthropic_upstream"], anthropic.base_url());
    let addr = listening["listen"].as_str().unwrap().to_string();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = client
        .post(format!("http://{addr}/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&anthropic_body())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let managed = r.headers().get("x-ctxgate-session").is_some();
    let body: Value = r.json().await.unwrap();
    let r = client
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer sk-x")
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let chat_status = r.status();
    r.text().await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200, "{body}");
    assert!(managed, "a managed Anthropic request");
    assert_eq!(body["type"], "message", "{body}");
    assert_eq!(chat_status, 200);
    let uris =
        |m: &MockUpstream| -> Vec<String> { m.requests().into_iter().map(|r| r.uri).collect() };
    assert_eq!(uris(&anthropic), ["/v1/messages"]);
    assert_eq!(uris(&openai), ["/v1/chat/completions"]);
}
