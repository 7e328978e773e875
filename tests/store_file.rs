//! The SQLite file under the real binary (issue 36, finding 6): a second gateway (or a `sessions` command that
//! writes) on a database another process holds refuses to start; a database file deleted while the gateway runs
//! is noticed, logged and written back from the open connection with every acknowledged turn; one that cannot be
//! written back degrades `/readyz` with the reason and holds the writes until it can.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::session_header;
use ctxgate::mock::MockUpstream;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A `ctxgate serve` process and its JSON log lines.
struct Gateway {
    child: Child,
    addr: String,
    logs: Arc<Mutex<Vec<String>>>,
}

fn config_file(dir: &Path, db: &Path, upstream: &str, store_extra: &str) -> PathBuf {
    let path = dir.join("ctxgate.toml");
    let text = format!(
        r#"[server]
listen = "127.0.0.1:0"
log_format = "json"
shutdown_grace_secs = 5

[upstream]
base_url = "{upstream}"

[store]
backend = "sqlite"
path = "{db}"
{store_extra}
"#,
        db = db.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Spawns `ctxgate <args> --config <config>`, its stderr read line by line into a channel.
fn spawn(args: &[&str], config: &Path) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .args(args)
        .arg("--config")
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
    (child, rx)
}

fn start(config: &Path) -> Gateway {
    let (mut child, rx) = spawn(&["serve"], config);
    let logs = Arc::new(Mutex::new(Vec::new()));
    let addr = loop {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!("the gateway did not start: {:?}", logs.lock().unwrap());
        };
        logs.lock().unwrap().push(line.clone());
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["fields"]["message"] == "ctxgate listening" {
            break v["fields"]["listen"].as_str().unwrap().to_string();
        }
    };
    let sink = logs.clone();
    std::thread::spawn(move || {
        for line in rx {
            sink.lock().unwrap().push(line);
        }
    });
    Gateway { child, addr, logs }
}

impl Gateway {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// Waits (up to `secs`) for a log line containing every one of `words`; returns it.
    fn wait_for_log(&self, words: &[&str], secs: u64) -> String {
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            if let Some(l) = self
                .logs()
                .into_iter()
                .find(|l| words.iter().all(|w| l.contains(w)))
            {
                return l;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "no log line with {words:?} within {secs} s: {:#?}",
            self.logs()
        );
    }

    /// SIGTERM, and waits for the exit; returns whether it was clean.
    fn terminate(mut self) -> bool {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap().success()
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

/// Runs `ctxgate <args>`, which must exit with status 1 within 30 s without serving; returns its stderr.
fn refused(args: &[&str], config: &Path) -> String {
    let (mut child, rx) = spawn(args, config);
    let until = Instant::now() + Duration::from_secs(30);
    let mut err = Vec::new();
    loop {
        while let Ok(line) = rx.try_recv() {
            if line.contains("ctxgate listening") {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{args:?}` started on a database another gateway holds: {err:#?}");
            }
            err.push(line);
        }
        if let Some(status) = child.try_wait().unwrap() {
            // the rest of its stderr
            std::thread::sleep(Duration::from_millis(50));
            err.extend(rx.try_iter());
            let err = err.join("\n");
            assert_eq!(status.code(), Some(1), "`{args:?}`: {err}");
            return err;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("`{args:?}` neither served nor exited: {err:#?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ctxgate sessions <args>`, which must succeed; its stdout.
fn cli(config: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxgate"))
        .arg("sessions")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sessions {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A conversation of `turns` questions so far; each turn resends it with the next question.
struct Talk {
    session: &'static str,
    messages: Vec<Value>,
    sid: String,
}

impl Talk {
    fn new(session: &'static str) -> Talk {
        Talk {
            session,
            messages: Vec::new(),
            sid: String::new(),
        }
    }

    async fn turn(&mut self, gw: &Gateway) {
        let i = self.messages.len() / 2;
        self.messages
            .push(json!({"role":"user","content":format!("question {i}")}));
        let resp = client()
            .post(gw.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-store-file")
            .header("x-session-id", self.session)
            .json(&json!({"model":"mock-model","messages":self.messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        self.sid = session_header(&resp);
        let text = resp.text().await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let answer = v["choices"][0]["message"]["content"].clone();
        self.messages
            .push(json!({"role":"assistant","content":answer}));
    }

    /// The store the config names holds every turn so far, in order.
    fn assert_stored(&self, config: &Path) {
        let v: Value = serde_json::from_str(&cli(config, &["show", &self.sid])).unwrap();
        let stored = v["messages"].as_array().unwrap();
        let contents = |m: &[Value]| -> Vec<String> {
            m.iter()
                .map(|m| m["content"].as_str().unwrap_or("").to_string())
                .collect()
        };
        assert_eq!(contents(stored), contents(&self.messages), "{v:#}");
    }
}

async fn readyz(gw: &Gateway) -> Value {
    client()
        .get(gw.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits (up to `secs`) for `/readyz` to say `status`; returns its answer.
async fn wait_for_ready(gw: &Gateway, status: &str, secs: u64) -> Value {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = readyz(gw).await;
        if v["status"] == status {
            return v;
        }
        if Instant::now() > until {
            panic!("/readyz is not {status} after {secs} s: {v}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Removes the database and its -wal and -shm files, as `rm ctxgate.db*` does.
fn remove_database(db: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{}: {e}", Path::new(&p).display()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_or_a_writing_command_on_a_held_database_refuses_to_start() {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctxgate.db");
    let config = config_file(dir.path(), &db, &mock.base_url(), "");
    let gw = start(&config);
    let mut talk = Talk::new("held-1");
    talk.turn(&gw).await;

    let p = db.display().to_string();
    let err = refused(&["serve"], &config);
    assert!(err.contains(&p), "names the file: {err}");
    assert!(err.contains("another process"), "{err}");
    let err = refused(&["sessions", "delete", &talk.sid], &config);
    assert!(err.contains(&p) && err.contains("another process"), "{err}");
    let export = dir.path().join("s.jsonl");
    cli(
        &config,
        &["export", &talk.sid, "--out", export.to_str().unwrap()],
    );
    let err = refused(
        &["sessions", "import", export.to_str().unwrap(), "--replace"],
        &config,
    );
    assert!(err.contains(&p) && err.contains("another process"), "{err}");

    // Reading commands go on while it runs; the first gateway is unharmed.
    talk.assert_stored(&config);
    talk.turn(&gw).await;
    assert!(gw.terminate());
    talk.assert_stored(&config);
    // Released with the process: a writing command runs now.
    assert!(cli(&config, &["delete", &talk.sid]).starts_with("deleted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_while_running_is_written_back_and_nothing_acknowledged_is_lost() {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctxgate.db");
    let config = config_file(dir.path(), &db, &mock.base_url(), "");
    let gw = start(&config);
    let mut talk = Talk::new("deleted-1");
    for _ in 0..3 {
        talk.turn(&gw).await;
    }
    remove_database(&db);
    for _ in 0..5 {
        talk.turn(&gw).await;
    }
    let p = db.display().to_string();
    let noticed = gw.wait_for_log(&["\"ERROR\"", "deleted", &p], 15);
    assert!(noticed.contains("restoring"), "{noticed}");
    gw.wait_for_log(&["restored", &p], 15);
    assert!(db.exists(), "written back to {p}");
    assert_eq!(readyz(&gw).await["status"], "ready");
    // Written to the restored file from now on, and locked again.
    for _ in 0..2 {
        talk.turn(&gw).await;
    }
    let err = refused(&["serve"], &config);
    assert!(err.contains("another process"), "{err}");
    gw.kill();
    talk.assert_stored(&config);

    let gw = start(&config);
    talk.turn(&gw).await;
    assert!(gw.terminate());
    talk.assert_stored(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_database_that_cannot_be_written_back_degrades_readyz_and_holds_writes_until_it_can(
) {
    let mock = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("data");
    let db = folder.join("ctxgate.db");
    let config = config_file(dir.path(), &db, &mock.base_url(), "timeout_ms = 500");
    let gw = start(&config);
    let mut talk = Talk::new("lost-folder-1");
    for _ in 0..2 {
        talk.turn(&gw).await;
    }
    // The folder is gone and a file stands in its place: nothing can be created at store.path.
    std::fs::remove_dir_all(&folder).unwrap();
    std::fs::write(&folder, b"not a folder").unwrap();
    for _ in 0..2 {
        talk.turn(&gw).await;
    }
    let p = db.display().to_string();
    let degraded = wait_for_ready(&gw, "degraded", 15).await;
    let reason = degraded["reason"].as_str().unwrap();
    assert!(reason.contains(&p), "{degraded}");
    assert!(reason.contains("cannot be written back"), "{degraded}");
    let line = gw.wait_for_log(&["\"ERROR\"", "cannot be written back", &p], 5);
    assert!(line.contains("held"), "{line}");

    // The folder is back: the database is written back, the held writes committed, the circuit closes.
    std::fs::remove_file(&folder).unwrap();
    std::fs::create_dir(&folder).unwrap();
    gw.wait_for_log(&["restored", &p], 15);
    wait_for_ready(&gw, "ready", 30).await;
    talk.turn(&gw).await;
    assert!(gw.terminate());
    talk.assert_stored(&config);
}
