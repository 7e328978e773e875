//! Loading whole configs: one message naming every problem, the environment over the file, masking, the shipped
//! file equal to the defaults, one duration syntax for every duration key.

use super::*;

#[test]
fn a_localhost_listener_is_loopback_and_a_named_one_refused() {
    let c = load("[server]\nlisten = \"localhost:8787\"\n", &[]).unwrap();
    assert!(c.admin_loopback_without_token(), "localhost is loopback");
    let e = load("[server]\nlisten = \"example.com:8787\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("localhost:8787"), "{e}");
}

fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, text).unwrap();
    Config::load_from(
        Some(&p),
        env.iter().map(|(a, b)| (a.to_string(), b.to_string())),
    )
}

#[test]
fn shipped_default_file_equals_embedded_defaults() {
    let text = include_str!("../../config/ctxgate.toml");
    assert_eq!(Config::from_toml_str(text).unwrap(), Config::default());
}

#[test]
fn allowed_hosts_are_host_names_with_an_optional_port() {
    let c = load(
        "[admin]\nallowed_hosts = [\"ctxgate.internal\", \"gw:8443\", \"[fd00::1]:80\", \"10.0.0.7\"]\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.admin.allowed_hosts.len(), 4);
    for bad in [
        "",
        "http://gw",
        "gw/admin",
        "*.example",
        "gw:99999",
        "[::1]x",
        "[nope]",
        "a b",
    ] {
        let err = load(&format!("[admin]\nallowed_hosts = [{bad:?}]\n"), &[]).unwrap_err();
        assert!(
            err.0.join("\n").contains("admin.allowed_hosts"),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn every_problem_is_reported_with_its_key_path() {
    let err = load(
        "[server]\nlisten = \"nope\"\nlisen = 1\n[upstream]\ntimeout_secs = \"x\"\n[bogus]\na = 1\n",
        &[],
    )
    .unwrap_err();
    let all = err.0.join("\n");
    assert!(all.contains("server.lisen"), "{all}");
    assert!(all.contains("upstream.timeout_secs"), "{all}");
    assert!(all.contains("bogus"), "{all}");
    // semantic problems are reported once the shape is right
    let err = load(
        "[server]\nlisten = \"nope\"\n[context]\nthreshold = 1.5\ntarget = 0.9\n",
        &[],
    )
    .unwrap_err();
    let all = err.0.join("\n");
    assert!(all.contains("server.listen"), "{all}");
    assert!(all.contains("context.threshold"), "{all}");
    assert_eq!(err.0.len(), 2, "{all}"); // listen, threshold: no derived complaint about hard_limit
    assert!(!all.contains("hard_limit"), "{all}");
}

#[test]
fn a_window_too_small_for_clearing_is_warned_about() {
    let c = load("[models.\"tiny\"]\ncontext_window = 3000\n", &[]).unwrap();
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with(
            "models.\"tiny\".context_window = 3000: the rewrite's target (1200 tokens"
        ),
        "{w:?}"
    );
    let c = load(
        "[models.\"tiny\"]\ncontext_window = 3000\n[prune]\nkeep_tool_results = 1\n",
        &[],
    )
    .unwrap();
    assert!(c.warnings().is_empty(), "one kept result fits");
    assert!(Config::default().warnings().is_empty());
}

#[test]
fn one_pass_reports_names_types_values_and_rules_together() {
    let err = load(
        "[server]\nlisten = \"nowhere\"\n[context]\nstrategy = \"summarise\"\nthreshold = 1.5\n\
         [models.\"gpt-4o-mini\"]\ncontext_window = \"big\"\n",
        &[("CTXGATE_STORE__TIMEOUT_MS", "0")],
    )
    .unwrap_err();
    let all = err.0.join("\n");
    for needle in [
        "context.strategy: unknown variant `summarise`",
        "models.\"gpt-4o-mini\".context_window: invalid type",
        "server.listen: \"nowhere\"",
        "context.threshold: 1.5 must be a fraction",
        "store.timeout_ms: must be greater than 0",
    ] {
        assert!(all.contains(needle), "missing {needle}: {all}");
    }
    assert_eq!(err.0.len(), 5, "{all}");
    // A rule between two keys names the one the file set, the other being a default.
    let err = load("[context]\nthreshold = 0.97\n", &[]).unwrap_err();
    assert_eq!(
        err.0,
        ["context.threshold: 0.97 must not exceed context.hard_limit (0.95, the default)"]
    );
    let err = load("[context]\nhard_limit = 0.5\n", &[]).unwrap_err();
    assert_eq!(
        err.0,
        ["context.hard_limit: 0.5 must not be below context.threshold (0.8, the default)"]
    );
}

#[test]
fn env_overrides_file() {
    let c = load(
        "[upstream]\nbase_url = \"http://a.example/v1\"\n",
        &[
            ("CTXGATE_UPSTREAM__BASE_URL", "http://b.example/v1"),
            ("CTXGATE_SERVER__MAX_BODY_BYTES", "1024"),
            ("CTXGATE_REQUIRE_EXTERNAL", "1"),
            ("OTHER", "x"),
        ],
    )
    .unwrap();
    assert_eq!(c.upstream.base_url, "http://b.example/v1");
    assert_eq!(c.server.max_body_bytes, 1024);
    let err = load("", &[("CTXGATE_SERVER__NOPE", "1")]).unwrap_err();
    assert!(err.0[0].contains("server.nope"), "{:?}", err.0);
}

#[test]
fn secrets_are_masked() {
    let c = load(
        "[upstream]\napi_key = \"sk-secret\"\n[admin]\ntoken = \"adm-secret-123\"\n",
        &[],
    )
    .unwrap();
    let shown = c.masked().to_toml();
    assert!(!shown.contains("sk-secret") && !shown.contains("adm-secret"));
    assert!(shown.contains("***"));
}

#[test]
fn otel_is_off_by_default_and_its_header_values_are_masked() {
    assert_eq!(Config::default().otel.endpoint, None);
    let c = load(
        "[otel]\nendpoint = \"http://127.0.0.1:4318\"\nheaders = { x-honeycomb-team = \"hc-secret\" }\n",
        &[("CTXGATE_OTEL__SAMPLE_RATIO", "0.5")],
    )
    .unwrap();
    assert_eq!(c.otel.sample_ratio, 0.5);
    assert_eq!(c.otel.headers["x-honeycomb-team"], "hc-secret");
    let shown = c.masked().to_toml();
    assert!(
        !shown.contains("hc-secret") && shown.contains("x-honeycomb-team"),
        "{shown}"
    );
    let err = load("[otel]\nsample_ratio = 2.0\nendpont = \"x\"\n", &[]).unwrap_err();
    assert!(
        err.0.iter().any(|m| m.contains("otel.endpont")),
        "{:?}",
        err.0
    );
    let err = load("[otel]\nsample_ratio = 2.0\n", &[]).unwrap_err();
    assert!(
        err.0.iter().any(|m| m.contains("otel.sample_ratio")),
        "{:?}",
        err.0
    );
}

#[test]
fn redis_keys_are_checked_and_their_passwords_masked() {
    let c = load(
        "[store]\nbackend = \"redis\"\nredis_url = \"redis://app:hunter2@db:6379/0\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.store.redis_prefix, "ctxgate:");
    let shown = c.masked().to_toml();
    assert!(!shown.contains("hunter2") && shown.contains("redis://app:***@db:6379/0"));
    let err = load(
        "[store]\nbackend = \"redis\"\nredis_url = \"http://db\"\nredis_prefix = \"a{b\"\n",
        &[],
    )
    .unwrap_err();
    assert!(
        err.0.iter().any(|m| m.contains("store.redis_url")),
        "{:?}",
        err.0
    );
    assert!(
        err.0.iter().any(|m| m.contains("store.redis_prefix")),
        "{:?}",
        err.0
    );
    let err = load(
        "[store]\nbackend = \"redis\"\nredis_cluster_nodes = [\"redis://a:1\", \"nope\"]\n",
        &[],
    )
    .unwrap_err();
    assert!(
        err.0
            .iter()
            .any(|m| m.contains("store.redis_cluster_nodes")),
        "{:?}",
        err.0
    );
    assert_eq!(mask_url_password("rediss://:pw@h:1"), "rediss://:***@h:1");
    assert_eq!(mask_url_password("redis://h:1/0"), "redis://h:1/0");
}

#[test]
fn durations_and_models() {
    let c = load(
        "[prune]\nmax_age = \"7d\"\n[models.\"my-model*\"]\ncontext_window = 32000\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.prune.max_age, Some(DurationSpec::from_secs(7 * 86_400)));
    assert_eq!(c.models["my-model*"].context_window, Some(32000));
    assert!(load("[prune]\nmax_age = \"soon\"\n", &[]).is_err());
    assert!(load("[models.\"x\"]\ncontext_windo = 1\n", &[]).is_err());
}

#[test]
fn every_duration_key_takes_one_syntax() {
    let c = load(
        "[prune]\nmax_age = \"90m\"\n[hooks]\nsession_idle_after = \"1500ms\"\nmax_backoff = \"2h\"\n",
        &[("CTXGATE_HOOKS__SESSION_IDLE_AFTER", "45s")],
    )
    .unwrap();
    assert_eq!(c.prune.max_age, Some(DurationSpec::from_secs(90 * 60)));
    assert_eq!(c.hooks.idle_after(), std::time::Duration::from_secs(45));
    assert_eq!(c.hooks.max_backoff(), std::time::Duration::from_secs(7200));
    // Shown as written, in the largest whole unit.
    assert!(c.to_toml().contains("max_age = \"90m\""), "{}", c.to_toml());
    // `ms` everywhere, a unit always: the old bare seconds of `max_age` are refused with the fix named, in the
    // same one-pass message as the rest.
    let err = load(
        "[prune]\nmax_age = 3600\n[hooks]\nsession_idle_after = \"30\"\nmax_backoff = \"5 weeks\"\n\
         [context]\nthreshold = 2.0\n",
        &[],
    )
    .unwrap_err();
    let mut all = err.0.clone();
    all.sort();
    assert_eq!(
        all,
        [
            "context.threshold: 2 must be a fraction in (0, 1]",
            "hooks.max_backoff: \"5 weeks\": the unit must be ms, s, m, h or d",
            "hooks.session_idle_after: 30 has no unit: write \"30s\" for seconds; a duration is a whole number \
             and a unit, ms, s, m, h or d (\"500ms\", \"90s\", \"30m\", \"24h\", \"7d\")",
            "prune.max_age: 3600 has no unit: write \"3600s\" for seconds; a duration is a whole number and a \
             unit, ms, s, m, h or d (\"500ms\", \"90s\", \"30m\", \"24h\", \"7d\")",
        ]
    );
    let c = load("[prune]\nmax_age = \"500ms\"\n", &[]).unwrap();
    assert_eq!(
        c.prune.max_age.map(DurationSpec::duration),
        Some(std::time::Duration::from_millis(500))
    );
}
