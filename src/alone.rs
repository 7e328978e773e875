//! Runs a test in a process of its own (the test binary again, that one test only): for measurements that other
//! tests running beside it would disturb.

/// Runs `f` in a process of its own: this test binary again, running only the test `name`. Moka's hash
/// tables free their old bucket arrays through a global epoch, on whichever thread collects them, so with other
/// tests running beside it a thread's own count moves with what they do (98 bytes a token-memo entry in one CI
/// run, against 257 alone).
pub(crate) fn alone(name: &str, f: fn()) {
    const VAR: &str = "CTXGATE_TEST_ALONE";
    if std::env::var(VAR).as_deref() == Ok(name) {
        return f();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(VAR, name)
        .output()
        .expect("the test binary runs again");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{log}");
    assert!(out.status.success(), "{name} failed in its own process");
    assert!(
        log.contains("1 passed"),
        "{name} did not run in its own process"
    );
}
