//! Redis servers for tests: `redis-server` from PATH on free loopback ports (standalone, or a 3-node Cluster made
//! with `redis-cli --cluster create`), killed on drop. Without `redis-server` the tests skip with a note, unless
//! `CTXGATE_REQUIRE_EXTERNAL=1` (set by .ci/run) makes that a failure.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `name` on PATH; `None` (with a note) when missing, a failure under `CTXGATE_REQUIRE_EXTERNAL=1`.
pub fn external(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("CTXGATE_REQUIRE_EXTERNAL").as_deref() == Ok("1") {
            panic!("{name} is not on PATH (CTXGATE_REQUIRE_EXTERNAL=1): install the Debian package `redis-server`");
        }
        let _ = writeln!(
            std::io::stderr(),
            "note: {name} is not on PATH; skipping (install the Debian package `redis-server`)"
        );
    }
    found
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends one inline command and returns the first line of the answer (`None` when nothing answers).
pub fn command(port: u16, cmd: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("{cmd}\r\n").as_bytes()).ok()?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).ok()?;
    Some(
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()?
            .to_string(),
    )
}

/// One `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    cluster: bool,
    /// AOF with `appendfsync always`: the data survives [`RedisServer::restart`].
    persistent: bool,
}

impl RedisServer {
    /// A standalone server on a free port; `None` when `redis-server` is missing (see the module docs).
    pub fn start() -> Option<RedisServer> {
        external("redis-server")?;
        Some(Self::spawn(free_port(), false, false))
    }

    /// A standalone server whose data survives a restart (AOF, `appendfsync always`).
    pub fn start_persistent() -> Option<RedisServer> {
        external("redis-server")?;
        Some(Self::spawn(free_port(), false, true))
    }

    fn spawn(port: u16, cluster: bool, persistent: bool) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            cluster,
            persistent,
        };
        s.restart();
        s
    }

    /// `redis://127.0.0.1:<port>/0`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Kills the server (its data is gone unless it is persistent).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while command(self.port, "PING").is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same port (empty unless it had a cluster config) and waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg(if self.persistent { "yes" } else { "no" })
            .arg("--appendfsync")
            .arg("always")
            .arg("--dir")
            .arg(self.dir.path());
        if self.cluster {
            cmd.arg("--cluster-enabled")
                .arg("yes")
                .arg("--cluster-config-file")
                .arg(self.dir.path().join("nodes.conf"));
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while command(self.port, "PING").as_deref() != Some("+PONG") {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A 3-node Redis Cluster (masters only) on loopback ports.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three `redis-server --cluster-enabled yes` and joins them with `redis-cli --cluster create`; `None`
    /// when either command is missing (see the module docs).
    pub fn start() -> Option<RedisCluster> {
        external("redis-server")?;
        external("redis-cli")?;
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::spawn(free_port(), true, false))
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .arg("--cluster-replicas")
            .arg("0")
            .arg("--cluster-yes")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Every node agrees the cluster is up.
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            loop {
                let info = Command::new("redis-cli")
                    .arg("-p")
                    .arg(n.port.to_string())
                    .arg("cluster")
                    .arg("info")
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster did not come up");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(RedisCluster { nodes })
    }

    /// The seed URLs (`store.redis_cluster_nodes`).
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }
}
