//! Isolation and exposure: tenants keyed by every credential header (keyed hash, secret kept across restarts),
//! the anonymous tenant, session ids as a fixed point, the admin API without a token, passthrough paths that
//! would leave `/v1`, and absurd model names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_history, test_config, Harness};
use ctxgate::config::StoreBackend;
use ctxgate::mock::{MockReply, MockUpstream};
use serde_json::{json, Value};
use sha2::Digest;
use std::io::{Read, Write};

const OTHER_CREDENTIALS: [&str; 3] = ["x-api-key", "api-key", "x-goog-api-key"];

/// A chat turn with exactly these headers: the session id we answered with (if any) and the body.
async fn chat(h: &Harness, headers: &[(&str, &str)], messages: &Value) -> (Option<String>, Value) {
    let mut req = h
        .client
        .post(h.url("/v1/chat/completions"))
        .json(&json!({"model": "gpt-4o", "messages": messages}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let id = resp
        .headers()
        .get("x-ctxgate-session")
        .map(|v| v.to_str().unwrap().to_string());
    let v: Value = resp.json().await.unwrap();
    (id, v)
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The stored history of a session, as text.
async fn history(h: &Harness, id: &str) -> String {
    let view = h.state.sessions.view(id).await.unwrap().unwrap();
    serde_json::to_string(&view.messages).unwrap()
}

#[tokio::test]
async fn every_credential_header_is_its_own_tenant() {
    let h = Harness::start().await;
    for name in OTHER_CREDENTIALS {
        let sid = format!("shared-{name}");
        let (a, _) = chat(
            &h,
            &[(name, "key-a"), ("x-session-id", &sid)],
            &user("from a"),
        )
        .await;
        let (b, _) = chat(
            &h,
            &[(name, "key-b"), ("x-session-id", &sid)],
            &user("from b"),
        )
        .await;
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_ne!(a, b, "{name}: same session id, other key, other session");
        let second = json!([{"role":"user","content":"from a"},{"role":"assistant","content":"mock reply"},
            {"role":"user","content":"a again"}]);
        let (a2, _) = chat(&h, &[(name, "key-a"), ("x-session-id", &sid)], &second).await;
        assert_eq!(a2.unwrap(), a, "{name}: same key, same session");
        assert!(!history(&h, &b).await.contains("from a"), "{name}");
        assert!(!history(&h, &a).await.contains("from b"), "{name}");
        // the same opening without a session header: fingerprints differ by key too
        let opening = user(&format!("same opening {name}"));
        let (fa, _) = chat(&h, &[(name, "key-a")], &opening).await;
        let (fb, _) = chat(&h, &[(name, "key-b")], &opening).await;
        assert_ne!(
            fa.unwrap(),
            fb.unwrap(),
            "{name}: same fingerprint, other key"
        );
    }
}

#[tokio::test]
async fn recall_and_search_do_not_cross_tenants_keyed_by_x_api_key() {
    let h = Harness::start_with(|c| c.context.default_context_window = 8_000).await;
    let post = |key: &'static str, body: Value| {
        h.client
            .post(h.url("/v1/chat/completions"))
            .header("x-api-key", key)
            .header("x-session-id", "recall-1")
            .json(&body)
            .send()
    };
    let base = json!({"model":"mock-model","messages":agent_history(14, 300),
        "tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]});
    let mut a_body = base.clone();
    a_body["messages"][3]["content"] = json!(format!("SECRET-A {}", "word ".repeat(400)));
    post("key-a", a_body).await.unwrap().text().await.unwrap();
    let mut b_body = base.clone();
    for m in b_body["messages"].as_array_mut().unwrap() {
        if let Some(id) = m["tool_call_id"].as_str().map(str::to_string) {
            m["tool_call_id"] = json!(format!("b_{id}"));
        }
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for c in calls {
                c["id"] = json!(format!("b_{}", c["id"].as_str().unwrap()));
            }
        }
    }
    let call = |id: &str, name: &str, args: Value| json!({"id":id,"type":"function","function":{"name":name,"arguments":args.to_string()}});
    h.mock.push(MockReply::message(
        json!({"role":"assistant","content":null,"tool_calls":[
            call("r1", "recall_tool_call", json!({"call_id":"call_0"})),
            call("r2", "search_history", json!({"query":"SECRET-A"}))]}),
        "tool_calls",
    ));
    h.mock.push(MockReply::completion("ok"));
    post("key-b", b_body).await.unwrap().text().await.unwrap();
    let reqs = h.mock.requests();
    let last = reqs.last().unwrap().json();
    let answers: Vec<&Value> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["tool_call_id"] == "r1" || m["tool_call_id"] == "r2")
        .collect();
    assert_eq!(answers.len(), 2, "both calls answered: {last}");
    assert!(
        answers[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Not found"),
        "{}",
        answers[0]
    );
    let found: Value = serde_json::from_str(answers[1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        found["total_matches"], 0,
        "nothing of key-a reaches key-b: {found}"
    );
}

#[tokio::test]
async fn the_stored_tenant_is_a_keyed_hash_and_the_secret_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctx.db");
    let mock = MockUpstream::start().await.unwrap();
    let mut cfg = test_config(&mock.base_url());
    cfg.store.backend = StoreBackend::Sqlite;
    cfg.store.path = db.clone();
    let key = "sk-plain-key-1234";
    let mut h = Harness::start_config(mock.clone(), cfg.clone()).await;
    let (first, _) = chat(&h, &[("x-api-key", key)], &user("remember me")).await;
    let first = first.unwrap();
    h.stop().await;
    drop(h);

    // the secret: beside the database, owner-only
    let secret = dir.path().join("ctxgate.secret");
    let text = std::fs::read_to_string(&secret).expect("the secret file was created");
    assert_eq!(text.trim().len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }
    // the stored tenant is no plain hash of the key
    let conn = rusqlite::Connection::open(&db).unwrap();
    let tenant: String = conn
        .query_row("SELECT tenant FROM sessions WHERE id = ?1", [&first], |r| {
            r.get(0)
        })
        .unwrap();
    drop(conn);
    assert_eq!(tenant.len(), 64);
    for plain in [
        key.to_string(),
        format!("x-api-key{key}"),
        format!("Bearer {key}"),
        String::new(),
    ] {
        assert_ne!(
            tenant,
            hex::encode(sha2::Sha256::digest(plain.as_bytes())),
            "{plain:?}"
        );
    }

    // after a restart: same secret, same tenant, the conversation goes on
    let h = Harness::start_config(mock, cfg).await;
    let next = json!([{"role":"user","content":"remember me"},{"role":"assistant","content":"mock reply"},
        {"role":"user","content":"and now?"}]);
    let (again, _) = chat(&h, &[("x-api-key", key)], &next).await;
    assert_eq!(again.unwrap(), first);
    let view = h.state.sessions.view(&first).await.unwrap().unwrap();
    assert_eq!(view.messages.len(), 4, "both turns, one history");
    assert_eq!(view.messages[2]["content"], "and now?");
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        text,
        "read, not replaced"
    );
}

#[tokio::test]
async fn anonymous_callers_keep_fingerprints_unless_turned_off() {
    let h = Harness::start().await;
    let (id, _) = chat(&h, &[], &user("anon opening")).await;
    let id = id.unwrap();
    assert!(id.starts_with("anonymous-fp"), "{id}");
    assert!(history(&h, &id).await.contains("anon opening"));
    let (named, _) = chat(&h, &[("x-session-id", "s1")], &user("hi")).await;
    assert_eq!(named.unwrap(), "anonymous-s1");

    let h = Harness::start_with(|c| c.session.anonymous_fingerprint = false).await;
    let (id, v) = chat(&h, &[], &user("anon opening")).await;
    assert_eq!(id, None, "no session, no session header");
    assert_eq!(
        v["choices"][0]["message"]["content"], "mock reply",
        "still proxied"
    );
    assert_eq!(h.mock.requests().len(), 1);
    h.state.drain().await;
    assert_eq!(
        h.state.sessions.list(10, 0).await.unwrap().1,
        0,
        "nothing stored"
    );
    // a session header, or a credential, still gets history
    let (named, _) = chat(&h, &[("x-session-id", "s1")], &user("hi")).await;
    assert_eq!(named.unwrap(), "anonymous-s1");
    let (keyed, _) = chat(&h, &[("authorization", "Bearer k")], &user("anon opening")).await;
    assert!(keyed.unwrap().contains("-fp"));
    h.state.drain().await;
    assert_eq!(h.state.sessions.list(10, 0).await.unwrap().1, 2);
}

#[tokio::test]
async fn our_session_id_sent_back_is_the_same_session() {
    let h = Harness::start().await;
    let a = [("authorization", "Bearer sk-a")];
    let (id, _) = chat(&h, &[a[0], ("x-session-id", "conv-1")], &user("first")).await;
    let id = id.unwrap();
    let next = json!([{"role":"user","content":"first"},{"role":"assistant","content":"mock reply"},
        {"role":"user","content":"second"}]);
    let (again, _) = chat(&h, &[a[0], ("x-session-id", &id)], &next).await;
    assert_eq!(
        again.unwrap(),
        id,
        "x-ctxgate-session sent back as x-session-id"
    );
    let view = h.state.sessions.view(&id).await.unwrap().unwrap();
    assert_eq!(view.messages.len(), 4, "both turns, one history");
    assert_eq!(view.messages[2]["content"], "second");
    // a fingerprint id sent back is kept too
    let (fp, _) = chat(&h, &a, &user("fp opening")).await;
    let fp = fp.unwrap();
    let (fp2, _) = chat(&h, &[a[0], ("x-session-id", &fp)], &user("fp opening")).await;
    assert_eq!(fp2.unwrap(), fp);
    // another tenant naming that id gets a session of its own
    let (other, _) = chat(
        &h,
        &[("authorization", "Bearer sk-b"), ("x-session-id", &id)],
        &user("intruder"),
    )
    .await;
    let other = other.unwrap();
    assert_ne!(other, id);
    assert!(!history(&h, &other).await.contains("first"));
    assert!(!history(&h, &id).await.contains("intruder"));
}

/// Status of `GET /admin/sessions` under a config, with an optional bearer token.
async fn admin_status(
    listen: &str,
    allow: Option<bool>,
    token: Option<&str>,
    bearer: Option<&str>,
) -> u16 {
    let (listen, token) = (listen.to_string(), token.map(str::to_string));
    let h = Harness::start_with(move |c| {
        c.server.listen = listen;
        c.admin.allow_loopback_without_token = allow;
        c.admin.token = token;
    })
    .await;
    let mut req = h.client.get(h.url("/admin/sessions"));
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    if status == 403 {
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "forbidden");
    }
    status
}

#[tokio::test]
async fn admin_without_a_token_is_off_unless_loopback_peers_are_allowed() {
    // the test client is always a loopback peer
    let cases = [
        // (listen, allow_loopback_without_token, token, bearer sent, status)
        ("127.0.0.1:8787", None, None, None, 200),
        ("[::1]:8787", None, None, None, 200),
        ("0.0.0.0:8787", None, None, None, 403),
        ("10.1.2.3:8787", None, None, None, 403),
        ("127.0.0.1:8787", Some(false), None, None, 403),
        ("0.0.0.0:8787", Some(true), None, None, 200),
        ("0.0.0.0:8787", None, Some("tok"), None, 401),
        ("0.0.0.0:8787", None, Some("tok"), Some("nope"), 401),
        ("0.0.0.0:8787", None, Some("tok"), Some("tok"), 200),
        ("127.0.0.1:8787", Some(true), Some("tok"), None, 401),
    ];
    for (listen, allow, token, bearer, want) in cases {
        let got = admin_status(listen, allow, token, bearer).await;
        assert_eq!(
            got, want,
            "listen {listen}, allow {allow:?}, token {token:?}, bearer {bearer:?}"
        );
    }
}

/// A `MakeWriter` into a shared buffer, to read what was logged.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

/// What building the router (at start-up) logs for `listen` and `token`.
fn startup_log(listen: &str, token: Option<&str>) -> String {
    let mut cfg = test_config("http://127.0.0.1:9/v1");
    cfg.server.listen = listen.into();
    cfg.admin.token = token.map(str::to_string);
    let state = ctxgate::app::AppState::new(cfg).unwrap();
    let buf = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(buf.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || drop(ctxgate::server::router(state)));
    let text = String::from_utf8(buf.0.lock().clone()).unwrap();
    text
}

#[tokio::test]
async fn start_up_warns_when_the_admin_api_is_disabled() {
    let log = startup_log("0.0.0.0:8787", None);
    assert!(
        log.contains("WARN") && log.contains("admin API disabled"),
        "{log}"
    );
    let log = startup_log("127.0.0.1:8787", None);
    assert!(
        !log.contains("WARN") && log.contains("loopback peers only"),
        "{log}"
    );
    let log = startup_log("0.0.0.0:8787", Some("tok"));
    assert!(
        !log.contains("WARN") && log.contains("token required"),
        "{log}"
    );
}

/// Sends `GET <path>` byte for byte (no client-side normalisation) and returns the status and body.
fn raw_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk-x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn passthrough_paths_that_would_leave_v1_never_reach_the_upstream() {
    let h = Harness::start().await;
    let addr = h.addr;
    let paths = [
        "/v1/../x",
        "/v1/../../admin",
        "/v1/./models",
        "/v1/models/..",
        "/v1/%2e%2e/x",
        "/v1/%2E%2E/x",
        "/v1/.%2e/x",
        "/v1/%2e./x",
        "/v1/%2e/models",
        "/v1/files/%2e%2e/%2e%2e/x",
        "/v1/..%2fx",
        "/v1/%2e%2e%2fx",
        "/v1/%2e%2e%5cx",
        "/v1/%252e%252e/x",
        "/v1/chat/../completions",
        "/v1/../x?a=1",
    ];
    for path in paths {
        let (status, body) = tokio::task::spawn_blocking(move || raw_get(addr, path))
            .await
            .unwrap();
        assert_eq!(status, 400, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(
            v["error"]["type"], "invalid_request_error",
            "{path}: {body}"
        );
    }
    assert!(
        h.mock.requests().is_empty(),
        "reached the upstream: {:?}",
        h.mock
            .requests()
            .iter()
            .map(|r| r.uri.clone())
            .collect::<Vec<_>>()
    );
    // the same client does reach the upstream with an ordinary path
    let (status, _) = tokio::task::spawn_blocking(move || raw_get(addr, "/v1/models"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(h.mock.requests().len(), 1);
    assert_eq!(h.mock.requests()[0].uri, "/v1/models");
}

#[tokio::test]
async fn absurd_models_are_refused_before_anything_is_sent() {
    let h = Harness::start().await;
    let long = "gpt-4o".to_string() + &"x".repeat(1 << 20);
    for model in [
        json!(long),
        json!(42),
        json!(["gpt-4o"]),
        json!({"id": "gpt-4o"}),
        Value::Null,
    ] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        let resp = h.post_chat(body.to_string()).await;
        assert_eq!(resp.status(), 400);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert!(v.to_string().len() < 1000, "the name is not echoed back");
    }
    assert!(h.mock.requests().is_empty());
    h.state.drain().await;
    assert_eq!(h.state.sessions.list(10, 0).await.unwrap().1, 0);
    // a real name still goes through
    let body =
        json!({"model": "gpt-4o-2024-08-06", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(h.post_chat(body.to_string()).await.status(), 200);
}

#[tokio::test]
async fn every_admin_route_follows_the_loopback_rule_and_the_inspector_page_holds_no_data() {
    // Listening on every interface without a token: the admin API is off, even for a loopback peer.
    let h = Harness::start_with(|c| c.server.listen = "0.0.0.0:8787".into()).await;
    let routes = [
        (reqwest::Method::GET, "/admin/sessions?q=x"),
        (reqwest::Method::GET, "/admin/sessions/x/turns"),
        (reqwest::Method::GET, "/admin/sessions/x/export"),
        (reqwest::Method::POST, "/admin/sessions/import"),
        (reqwest::Method::PATCH, "/admin/sessions/x"),
        (reqwest::Method::POST, "/admin/config/reload"),
    ];
    for (method, path) in &routes {
        let r = h
            .client
            .request(method.clone(), h.url(path))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{method} {path}");
    }
    // The page is served (it is only HTML and script); what it shows comes from the refused API.
    assert_eq!(
        h.client.get(h.url("/ui/")).send().await.unwrap().status(),
        200
    );
}

/// One HTTP/1.1 request written byte for byte (the `Host` and every header as given, `connection: close`):
/// the status and the body.
async fn raw(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{head}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// A session the attacker wants to overwrite, and its export rewritten to say something else.
async fn victim(h: &Harness) -> (String, Vec<u8>) {
    let (id, _) = chat(h, &[("x-session-id", "victim")], &user("the real history")).await;
    let id = id.unwrap();
    h.state.drain().await;
    let export = h
        .client
        .get(h.url(&format!("/admin/sessions/{id}/export")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let forged = String::from_utf8(export.to_vec())
        .unwrap()
        .replace("the real history", "FORGED");
    assert!(forged.contains("FORGED"));
    (id, readdressed(&forged))
}

/// An edited export with every node id recomputed from its content (an import refuses a kept id), and the
/// session's and turns' heads following them: a well-formed import that rewrites the history.
fn readdressed(export: &str) -> Vec<u8> {
    let mut lines: Vec<Value> = export
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut new_id = std::collections::HashMap::<String, String>::new();
    for l in lines.iter_mut().filter(|l| l.get("node").is_some()) {
        let n = &mut l["node"];
        let parent = n["parent"].as_str().map(|p| new_id[p].clone());
        let id = ctxgate::session::tree::node_id(parent.as_deref(), &n["message"]).to_string();
        new_id.insert(n["id"].as_str().unwrap().to_string(), id.clone());
        n["id"] = Value::from(id);
        n["parent"] = parent.map_or(Value::Null, Value::from);
    }
    for head in lines.iter_mut().filter_map(|l| {
        let path = if l.get("session").is_some() {
            "/session/head"
        } else {
            "/turn/head"
        };
        l.pointer_mut(path)
    }) {
        if let Some(new) = head.as_str().and_then(|h| new_id.get(h)) {
            *head = Value::from(new.clone());
        }
    }
    lines
        .iter()
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .into_bytes()
}

fn code(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap_or(Value::Null)["error"]["code"].clone()
}

#[tokio::test]
async fn admin_requests_a_web_page_could_forge_are_refused() {
    let h = Harness::start().await;
    let buf = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(buf.clone())
        .with_ansi(false)
        .finish();
    // The test runtime has one thread: the server's tasks log here too.
    let _log = tracing::subscriber::set_default(subscriber);
    let (addr, port) = (h.addr, h.addr.port());
    let (id, forged) = victim(&h).await;
    let import = "POST /admin/sessions/import?replace=true HTTP/1.1";

    // DNS rebinding: a page whose own name now points at 127.0.0.1 sends that name as the Host.
    for host in [
        "evil.example".to_string(),
        format!("evil.example:{port}"),
        format!("localhost.evil.example:{port}"),
    ] {
        let (status, body) = raw(
            addr,
            &format!("GET /admin/sessions HTTP/1.1\r\nhost: {host}"),
            b"",
        )
        .await;
        assert_eq!(status, 403, "{host}: {body}");
        assert_eq!(code(&body), "foreign_request", "{body}");
        assert!(
            body.contains("allowed_hosts") && !body.contains(&id),
            "{body}"
        );
    }
    // Loopback names, any port, are the gateway's own.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "localhost".into(),
    ] {
        let (status, body) = raw(
            addr,
            &format!("GET /admin/sessions HTTP/1.1\r\nhost: {host}"),
            b"",
        )
        .await;
        assert_eq!(status, 200, "{host}: {body}");
    }

    // A page on another origin posting a text/plain import (what fetch(…, {mode: "no-cors"}) sends).
    let own = format!("host: 127.0.0.1:{port}");
    for (headers, want, why) in [
        (
            "origin: http://evil.example\r\ncontent-type: text/plain",
            403,
            "foreign_request",
        ),
        (
            &format!(
                "origin: http://127.0.0.1:{}\r\ncontent-type: text/plain",
                port + 1
            ) as &str,
            403,
            "foreign_request",
        ),
        (
            "origin: null\r\ncontent-type: application/x-ndjson",
            403,
            "foreign_request",
        ),
        (
            "sec-fetch-site: cross-site\r\ncontent-type: application/x-ndjson",
            403,
            "foreign_request",
        ),
        (
            "sec-fetch-site: same-site\r\ncontent-type: application/x-ndjson",
            403,
            "foreign_request",
        ),
        // no Origin (curl) but a type a page can send anywhere: 415
        ("content-type: text/plain", 415, "unsupported_media_type"),
        (
            "content-type: application/x-www-form-urlencoded",
            415,
            "unsupported_media_type",
        ),
        (
            "content-type: multipart/form-data; boundary=x",
            415,
            "unsupported_media_type",
        ),
        ("x-nothing: 1", 415, "unsupported_media_type"),
    ] {
        let (status, body) = raw(addr, &format!("{import}\r\n{own}\r\n{headers}"), &forged).await;
        assert_eq!(
            (status, code(&body)),
            (want, json!(why)),
            "{headers}: {body}"
        );
        assert!(
            history(&h, &id).await.contains("the real history"),
            "{headers}: overwritten"
        );
    }
    // Body-less requests that change something: the Origin and Sec-Fetch-Site checks cover them.
    for (head, headers) in [
        (
            format!("DELETE /admin/sessions/{id} HTTP/1.1"),
            "origin: http://evil.example",
        ),
        (
            format!("POST /admin/sessions/{id}/compress HTTP/1.1"),
            "origin: http://evil.example",
        ),
        (
            "POST /admin/config/reload HTTP/1.1".to_string(),
            "sec-fetch-site: cross-site",
        ),
    ] {
        let (status, body) = raw(addr, &format!("{head}\r\n{own}\r\n{headers}"), b"").await;
        assert_eq!(status, 403, "{head}: {body}");
    }
    assert!(
        h.state.sessions.view(&id).await.unwrap().is_some(),
        "not deleted"
    );

    // The inspector's own requests, and curl's: served.
    let inspector = format!("{own}\r\norigin: http://127.0.0.1:{port}\r\nsec-fetch-site: same-origin\r\ncontent-type: application/x-ndjson");
    let (status, body) = raw(addr, &format!("{import}\r\n{inspector}"), &forged).await;
    assert_eq!(status, 200, "{body}");
    assert!(history(&h, &id).await.contains("FORGED"));
    let (status, _) = raw(
        addr,
        &format!("GET /admin/sessions HTTP/1.1\r\n{own}\r\nsec-fetch-site: none"),
        b"",
    )
    .await;
    assert_eq!(status, 200);

    let log = String::from_utf8(buf.0.lock().clone()).unwrap();
    let warned = log
        .lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("refused a request that a web page may have sent")
        })
        .count();
    assert!(warned >= 3, "{log}");
    assert!(
        log.contains("evil.example") && log.contains("path=/admin/sessions"),
        "{log}"
    );
}

#[tokio::test]
async fn allowed_hosts_let_an_operators_name_in() {
    let h = Harness::start_with(|c| {
        c.admin.allowed_hosts = vec!["ctxgate.internal".into(), "gw.example:8443".into()]
    })
    .await;
    let (addr, port) = (h.addr, h.addr.port());
    let get = |headers: String| async move {
        raw(
            addr,
            &format!("GET /admin/sessions HTTP/1.1\r\n{headers}"),
            b"",
        )
        .await
        .0
    };
    assert_eq!(get("host: ctxgate.internal".into()).await, 200);
    assert_eq!(get("host: CTXGATE.internal:8787".into()).await, 200);
    assert_eq!(get("host: gw.example:8443".into()).await, 200);
    assert_eq!(get("host: gw.example:8444".into()).await, 403);
    assert_eq!(get("host: other.internal".into()).await, 403);
    // a page served under the allowed name, through a proxy that rewrites Host
    assert_eq!(
        get(format!(
            "host: 127.0.0.1:{port}\r\norigin: https://ctxgate.internal"
        ))
        .await,
        200
    );
    assert_eq!(
        get(format!(
            "host: 127.0.0.1:{port}\r\norigin: https://evil.example"
        ))
        .await,
        403
    );
}

#[tokio::test]
async fn with_a_token_any_host_is_served_but_never_another_origin() {
    let h = Harness::start_with(|c| c.admin.token = Some("admin-secret-1".into())).await;
    let (addr, port) = (h.addr, h.addr.port());
    let get = |headers: &str| {
        let headers = headers.to_string();
        async move {
            raw(
                addr,
                &format!("GET /admin/sessions HTTP/1.1\r\n{headers}"),
                b"",
            )
            .await
            .0
        }
    };
    let token = "authorization: Bearer admin-secret-1";
    assert_eq!(get(&format!("host: gw.example\r\n{token}")).await, 200);
    assert_eq!(
        get(&format!("host: 127.0.0.1:{port}\r\n{token}")).await,
        200
    );
    assert_eq!(
        get("host: gw.example\r\nauthorization: Bearer nope").await,
        401
    );
    assert_eq!(
        get(&format!(
            "host: gw.example\r\n{token}\r\norigin: http://evil.example"
        ))
        .await,
        403
    );
    assert_eq!(
        get(&format!(
            "host: gw.example\r\n{token}\r\nsec-fetch-site: cross-site"
        ))
        .await,
        403
    );
    assert_eq!(
        get(&format!(
            "host: gw.example\r\n{token}\r\norigin: http://gw.example"
        ))
        .await,
        200
    );
    let (status, body) = raw(
        addr,
        &format!("POST /admin/sessions/import HTTP/1.1\r\nhost: gw.example\r\n{token}\r\ncontent-type: text/plain"),
        b"{}",
    )
    .await;
    assert_eq!(
        (status, code(&body)),
        (415, json!("unsupported_media_type")),
        "{body}"
    );
}

#[tokio::test]
async fn huge_offsets_and_limits_are_400_not_the_first_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctx.db");
    let h = Harness::start_with(move |c| {
        c.store.backend = StoreBackend::Sqlite;
        c.store.path = path;
    })
    .await;
    let (id, _) = chat(&h, &[("x-session-id", "paged")], &user("hello")).await;
    let id = id.unwrap();
    h.state.drain().await;
    let get = |path: String| {
        let client = h.client.clone();
        let url = h.url(&path);
        async move {
            let r = client.get(url).send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    for (query, param) in [
        ("offset=9223372036854775808", "offset"),
        ("offset=18446744073709551615", "offset"),
        ("offset=18446744073709551616", "offset"),
        ("offset=-1", "offset"),
        ("limit=100000", "limit"),
        ("limit=4294967296", "limit"),
        ("limit=0", "limit"),
    ] {
        for path in [
            "/admin/sessions".to_string(),
            format!("/admin/sessions/{id}/turns"),
        ] {
            let (status, v) = get(format!("{path}?{query}")).await;
            assert_eq!(status, 400, "{path}?{query}: {v}");
            assert_eq!(v["error"]["param"], param, "{v}");
            assert!(
                v["error"]["message"].as_str().unwrap().starts_with(param),
                "{v}"
            );
        }
    }
    let (status, v) = get("/admin/sessions?messages=maybe&offset=x".into()).await;
    assert_eq!(
        (status, &v["error"]["type"]),
        (400, &json!("invalid_request_error")),
        "{v}"
    );
    // the largest offset the stores can seek to: an empty page, not the first one
    let (status, v) = get("/admin/sessions?offset=9223372036854775807".into()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["sessions"], json!([]), "{v}");
    assert_eq!(v["total"], 1);
    let (status, v) = get(format!(
        "/admin/sessions/{id}/turns?offset=9223372036854775807&limit=500"
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["turns"], json!([]), "{v}");
    let (_, v) = get("/admin/sessions?limit=1000".into()).await;
    assert_eq!(v["sessions"][0]["id"], id);
}

/// `x-ctxgate-*` is ctxgate's own word to the client: an upstream (or a gateway behind ctxgate) that sends one —
/// here a forged `x-ctxgate-rewrite` and `x-ctxgate-session` — does not get it to the client, on a conversation
/// request or a passthrough one; the session header the client sees is ctxgate's.
#[tokio::test]
async fn an_upstreams_own_x_ctxgate_headers_never_reach_the_client() {
    let h = Harness::start().await;
    let forged = || MockReply::Json {
        status: 200,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-ctxgate-rewrite".into(), "summarized; tokens=9->1".into()),
            ("x-ctxgate-session".into(), "forged".into()),
            ("x-ctxgate-anything".into(), "1".into()),
            ("x-upstream-own".into(), "kept".into()),
        ],
        body: bytes::Bytes::from(
            json!({"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,
                "message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]})
            .to_string(),
        ),
        delay: std::time::Duration::ZERO,
    };
    h.mock.push(forged());
    let resp = h
        .post_chat(json!({"model":"m","messages":[{"role":"user","content":"hello"}]}).to_string())
        .await;
    assert_eq!(resp.status(), 200);
    let hd = resp.headers();
    assert!(hd.get("x-ctxgate-rewrite").is_none(), "{hd:?}");
    assert!(hd.get("x-ctxgate-anything").is_none(), "{hd:?}");
    assert_eq!(hd.get_all("x-ctxgate-session").iter().count(), 1, "{hd:?}");
    assert_ne!(hd["x-ctxgate-session"], "forged");
    assert_eq!(hd["x-upstream-own"], "kept");
    h.mock.push(forged());
    let resp = h.client.get(h.url("/v1/models")).send().await.unwrap();
    let hd = resp.headers();
    assert!(hd.get("x-ctxgate-rewrite").is_none(), "{hd:?}");
    assert!(hd.get("x-ctxgate-session").is_none(), "{hd:?}");
    assert_eq!(hd["x-upstream-own"], "kept");
}
