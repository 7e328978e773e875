//! Test harness: the real gateway on port 0 in front of the in-process mock upstream.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fallback;
pub mod redis;

use ctxgate::app::{AppState, TurnEvent};
use ctxgate::config::{Config, StoreBackend};
use ctxgate::mock::MockUpstream;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub struct Harness {
    pub mock: MockUpstream,
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    pub client: reqwest::Client,
    pub turns: tokio::sync::broadcast::Receiver<TurnEvent>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// A config for tests: in-memory store, the given upstream.
pub fn test_config(base_url: &str) -> Config {
    let mut c = Config::default();
    c.upstream.base_url = base_url.to_string();
    c.anthropic.base_url = base_url.to_string();
    // the Gemini API's base URL has no version
    c.gemini.base_url = base_url.trim_end_matches("/v1").to_string();
    c.server.listen = "127.0.0.1:0".into();
    c.store.backend = StoreBackend::Memory;
    c
}

impl Harness {
    pub async fn start() -> Harness {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(f: impl FnOnce(&mut Config)) -> Harness {
        let mock = MockUpstream::start().await.unwrap();
        let mut cfg = test_config(&mock.base_url());
        f(&mut cfg);
        Self::start_config(mock, cfg).await
    }

    pub async fn start_config(mock: MockUpstream, cfg: Config) -> Harness {
        let state = AppState::new(cfg).unwrap();
        let turns = state.turns.subscribe();
        let server = ctxgate::server::Server::bind(state.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        Harness {
            mock,
            addr,
            state,
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
            turns,
            shutdown: Some(tx),
            server: Some(handle),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn post_chat(&self, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client
            .post(self.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-test-a")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// `POST /v1/chat/completions` with `body` as JSON, the bearer `key` and, when given, `x-session-id`.
    pub async fn chat_as(
        &self,
        key: &str,
        session: Option<&str>,
        body: &Value,
    ) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url("/v1/chat/completions"))
            .header("authorization", format!("Bearer {key}"));
        if let Some(s) = session {
            req = req.header("x-session-id", s);
        }
        req.json(body).send().await.unwrap()
    }

    /// [`Harness::chat_as`] in session `session`, asserting a 200 answer; with the session the gateway named.
    pub async fn chat_ok(
        &self,
        key: &str,
        session: &str,
        body: &Value,
    ) -> (String, reqwest::Response) {
        let resp = self.chat_as(key, Some(session), body).await;
        assert_eq!(resp.status(), 200);
        (session_header(&resp), resp)
    }

    /// `POST path` with `body` serialised as JSON and the given headers (`content-type: application/json` added).
    pub async fn post_json(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> reqwest::Response {
        let mut req = self.client.post(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
            .send()
            .await
            .unwrap()
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of one series of `/metrics` (`name{labels}` exactly as exported; 0 when absent).
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// `GET path` on the gateway, as JSON (the admin API).
    pub async fn get_json(&self, path: &str) -> Value {
        self.client
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The next finished turn (waits up to 5 s).
    pub async fn next_turn(&mut self) -> TurnEvent {
        tokio::time::timeout(Duration::from_secs(5), self.turns.recv())
            .await
            .expect("no turn finished within 5 s")
            .unwrap()
    }

    /// Stops the server gracefully and waits for it.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.server.take() {
            let _ = h.await;
        }
    }
}

/// The session the gateway named in an answer (`x-ctxgate-session`).
pub fn session_header(resp: &reqwest::Response) -> String {
    resp.headers()["x-ctxgate-session"]
        .to_str()
        .unwrap()
        .to_string()
}

/// A gateway whose models (`models`, a model pattern) and default have a context window of `window` tokens.
pub async fn small_window(models: &str, window: u64) -> Harness {
    Harness::start_with(|c| {
        c.context.default_context_window = window;
        c.models.insert(
            models.into(),
            ctxgate::config::ModelEntry {
                context_window: Some(window),
                ..Default::default()
            },
        );
    })
    .await
}

/// A support conversation: a system prompt, then `loops` runs of a long question, a `lookup` call, its result
/// (`RESULT-<l>`) and a long answer; then a short user question.
pub fn support_chat(loops: usize) -> Vec<Value> {
    let mut m = vec![json!({"role":"system","content":"You help travellers."})];
    for l in 0..loops {
        let id = format!("call_{l}");
        m.push(json!({"role":"user","content":format!("question {l}: {}", "please help ".repeat(120))}));
        m.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function","function":{"name":"lookup","arguments":format!("{{\"q\":{l}}}")}}]}));
        m.push(json!({"role":"tool","tool_call_id":id,"content":format!("RESULT-{l} {}", "data ".repeat(60))}));
        m.push(
            json!({"role":"assistant","content":format!("answer {l}: {}", "indeed ".repeat(120))}),
        );
    }
    m.push(json!({"role":"user","content":"and now?"}));
    m
}

/// A coding-agent run: a task, then `n` file reads of ~`words` words each, every result carrying `MARKER-<i>`.
pub fn agent_history(n: usize, words: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role":"system","content":"You are a coding agent."}),
        json!({"role":"user","content":"Fix the failing test."}),
    ];
    for i in 0..n {
        let id = format!("call_{i}");
        m.push(
            json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function",
            "function":{"name":"read_file","arguments":format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}),
        );
        let filler: Vec<String> = (0..words).map(|w| format!("line{w}")).collect();
        m.push(json!({"role":"tool","tool_call_id":id,"content":format!("MARKER-{i} {}", filler.join(" "))}));
    }
    m
}

/// Reads until the peer closes or `within` passes; returns what was read and whether the peer closed.
pub async fn read_until_closed(
    tcp: &mut tokio::net::TcpStream,
    within: Duration,
) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// A log writer for tests: everything the gateway logs (`tracing_subscriber::fmt().with_writer(..)`), kept.
#[derive(Clone, Default)]
pub struct Logged(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    /// Captures what is logged on this thread, as JSON lines, while the guard lives (a test runtime has one
    /// thread: the server's tasks log there too).
    pub fn json() -> (Logged, tracing::subscriber::DefaultGuard) {
        let logged = Logged::default();
        let guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .json()
                .with_writer(logged.clone())
                .finish(),
        );
        (logged, guard)
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logged {
    type Writer = Logged;
    fn make_writer(&'a self) -> Logged {
        self.clone()
    }
}
