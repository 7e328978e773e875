//! Per-model upstreams: one gateway in front of several mock upstreams — `[models."<pattern>"] upstream` sends a
//! model's conversation requests to its `[upstreams.<name>]` (with that upstream's key in place of the client's),
//! a model without a route goes to `[upstream]` / `[anthropic]`, a request of another API than its upstream's is
//! refused in its dialect's error shape, each upstream is counted under its name, and a reload changes the routes
//! for the next request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{test_config, Harness};
use ctxgate::config::{Config, ModelEntry, NamedUpstream, UpstreamKind};
use ctxgate::mock::{MockUpstream, RecordedRequest};
use serde_json::{json, Value};
use std::path::Path;

/// The named upstreams' mocks: an OpenAI one, an Anthropic one, a local OpenAI-compatible one.
struct Mocks {
    oai: MockUpstream,
    claude: MockUpstream,
    local: MockUpstream,
}

impl Mocks {
    async fn start() -> Mocks {
        Mocks {
            oai: MockUpstream::start().await.unwrap(),
            claude: MockUpstream::start().await.unwrap(),
            local: MockUpstream::start().await.unwrap(),
        }
    }

    /// `[upstreams]` and the routes: `gpt-4o*` → oai (keyed), `claude-*` → claude (keyed), `qwen*` → local (the
    /// client's key passes through).
    fn toml(&self) -> String {
        format!(
            "[upstreams.oai]\nbase_url = \"{}\"\nkind = \"openai\"\napi_key = \"sk-route-oai\"\n\
             [upstreams.claude]\nbase_url = \"{}\"\nkind = \"anthropic\"\napi_key = \"sk-route-claude\"\n\
             [upstreams.local]\nbase_url = \"{}\"\n\
             [models.\"gpt-4o*\"]\nupstream = \"oai\"\n\
             [models.\"claude-*\"]\nupstream = \"claude\"\n\
             [models.\"qwen*\"]\nupstream = \"local\"\n",
            self.oai.base_url(),
            self.claude.base_url(),
            self.local.base_url()
        )
    }

    fn configure(&self, c: &mut Config) {
        for (name, mock, kind, key) in [
            ("oai", &self.oai, UpstreamKind::Openai, Some("sk-route-oai")),
            (
                "claude",
                &self.claude,
                UpstreamKind::Anthropic,
                Some("sk-route-claude"),
            ),
            ("local", &self.local, UpstreamKind::Openai, None),
        ] {
            c.upstreams.insert(
                name.into(),
                NamedUpstream {
                    base_url: mock.base_url(),
                    kind,
                    api_key: key.map(str::to_string),
                    ..NamedUpstream::default()
                },
            );
        }
        for (pattern, upstream) in [
            ("gpt-4o*", "oai"),
            ("claude-*", "claude"),
            ("qwen*", "local"),
        ] {
            c.models.insert(
                pattern.into(),
                ModelEntry {
                    upstream: Some(upstream.into()),
                    ..ModelEntry::default()
                },
            );
        }
    }
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

fn messages(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]})
}

fn header<'a>(r: &'a RecordedRequest, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(|v| v.to_str().unwrap())
}

const CLIENT: (&str, &str) = ("authorization", "Bearer sk-client");
const CLIENT_ANT: (&str, &str) = ("x-api-key", "sk-ant-client");
const ANT_VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

/// The conversation requests (not model lists, not probes) a mock received.
fn conversations(m: &MockUpstream) -> Vec<RecordedRequest> {
    m.requests()
        .into_iter()
        .filter(|r| r.method == http::Method::POST)
        .collect()
}

#[tokio::test]
async fn three_models_reach_three_upstreams_with_their_keys_and_others_the_defaults() {
    let mocks = Mocks::start().await;
    let h = Harness::start_with(|c| mocks.configure(c)).await;

    // chat → the OpenAI upstream, its key in place of the client's
    let r = h
        .post_json("/v1/chat/completions", &[CLIENT], &chat("gpt-4o-mini"))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Anthropic Messages → the Anthropic upstream, its key as x-api-key, the client's gone
    let r = h
        .post_json(
            "/v1/messages",
            &[CLIENT_ANT, ANT_VERSION, CLIENT],
            &messages("claude-sonnet-4-5"),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // chat and Responses → the local OpenAI-compatible server, the client's own key passing through
    let r = h
        .post_json("/v1/chat/completions", &[CLIENT], &chat("qwen2.5-coder"))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = h
        .post_json(
            "/v1/responses",
            &[CLIENT],
            &json!({"model": "Qwen3-32B", "input": "hello"}),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // no route: [upstream] and [anthropic] (the harness's mock), with the client's credentials
    let r = h
        .post_json("/v1/chat/completions", &[CLIENT], &chat("mock-model"))
        .await;
    assert_eq!(r.status(), 200);
    let r = h
        .post_json(
            "/v1/messages",
            &[CLIENT_ANT, ANT_VERSION],
            &messages("opus-unrouted"),
        )
        .await;
    assert_eq!(r.status(), 200);

    let oai = conversations(&mocks.oai);
    assert_eq!(oai.len(), 1, "{oai:?}");
    assert_eq!(oai[0].path(), "/v1/chat/completions");
    assert_eq!(oai[0].json()["model"], "gpt-4o-mini");
    assert_eq!(
        header(&oai[0], "authorization"),
        Some("Bearer sk-route-oai")
    );

    let claude = conversations(&mocks.claude);
    assert_eq!(claude.len(), 1, "{claude:?}");
    assert_eq!(claude[0].path(), "/v1/messages");
    assert_eq!(header(&claude[0], "x-api-key"), Some("sk-route-claude"));
    assert_eq!(header(&claude[0], "authorization"), None);
    assert_eq!(header(&claude[0], "anthropic-version"), Some("2023-06-01"));

    let local = conversations(&mocks.local);
    let paths: Vec<&str> = local.iter().map(RecordedRequest::path).collect();
    assert_eq!(paths, ["/v1/chat/completions", "/v1/responses"]);
    for r in &local {
        assert_eq!(header(r, "authorization"), Some("Bearer sk-client"));
    }

    let default = conversations(&h.mock);
    let models: Vec<Value> = default.iter().map(|r| r.json()["model"].clone()).collect();
    assert_eq!(models, [json!("mock-model"), json!("opus-unrouted")]);
    assert_eq!(
        header(&default[0], "authorization"),
        Some("Bearer sk-client")
    );
    assert_eq!(header(&default[1], "x-api-key"), Some("sk-ant-client"));

    // each upstream counted under its name
    for (series, n) in [
        (
            "upstream=\"oai\",dialect=\"chat\",outcome=\"answered\"",
            1.0,
        ),
        (
            "upstream=\"claude\",dialect=\"anthropic\",outcome=\"answered\"",
            1.0,
        ),
        (
            "upstream=\"local\",dialect=\"chat\",outcome=\"answered\"",
            1.0,
        ),
        (
            "upstream=\"local\",dialect=\"responses\",outcome=\"answered\"",
            1.0,
        ),
        (
            "upstream=\"default\",dialect=\"chat\",outcome=\"answered\"",
            1.0,
        ),
        (
            "upstream=\"anthropic\",dialect=\"anthropic\",outcome=\"answered\"",
            1.0,
        ),
    ] {
        let labels = sorted_labels(series);
        assert_eq!(
            h.metric(&format!("ctxgate_upstream_requests_total{{{labels}}}"))
                .await,
            n,
            "{labels}"
        );
    }
    let text = h.metrics_text().await;
    assert!(!text.contains("sk-route"), "a key in the metrics");
}

/// Labels in the exposition's order (alphabetical by name).
fn sorted_labels(labels: &str) -> String {
    let mut l: Vec<&str> = labels.split(',').collect();
    l.sort();
    l.join(",")
}

#[tokio::test]
async fn a_request_for_a_model_routed_to_another_api_is_refused_in_its_dialects_shape() {
    let mocks = Mocks::start().await;
    let h = Harness::start_with(|c| mocks.configure(c)).await;

    let r = h
        .post_json("/v1/chat/completions", &[CLIENT], &chat("claude-opus-4"))
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"claude-opus-4\"") && msg.contains("\"claude\""),
        "{v}"
    );
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");

    let r = h
        .post_json(
            "/v1/messages",
            &[CLIENT_ANT, ANT_VERSION],
            &messages("gpt-4o"),
        )
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("\"gpt-4o\"") && msg.contains("\"oai\""), "{v}");

    for m in [&mocks.oai, &mocks.claude, &mocks.local, &h.mock] {
        assert!(conversations(m).is_empty(), "nothing goes upstream");
    }
}

fn write(path: &Path, upstream: &str, routes: &str) {
    std::fs::write(
        path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[upstream]\nbase_url = \"{upstream}\"\n[anthropic]\n\
             base_url = \"{upstream}\"\n[store]\nbackend = \"memory\"\n{routes}"
        ),
    )
    .unwrap();
}

#[tokio::test]
async fn a_reload_changes_the_routes_for_the_next_request() {
    let mocks = Mocks::start().await;
    let default = MockUpstream::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctxgate.toml");
    // at first: no routes
    write(&path, &default.base_url(), "");
    let cfg = Config::load(Some(&path)).unwrap();
    let h = Harness::start_config(default, cfg.clone()).await;
    h.state.reload.set(Some(path.clone()), cfg);
    let send = |model: &'static str| {
        let h = &h;
        async move {
            let r = h
                .post_json("/v1/chat/completions", &[CLIENT], &chat(model))
                .await;
            assert_eq!(r.status(), 200);
        }
    };
    send("qwen3").await;
    assert_eq!(conversations(&h.mock).len(), 1);
    assert!(conversations(&mocks.local).is_empty());

    // the routes arrive
    write(&path, &h.mock.base_url(), &mocks.toml());
    let r = h
        .client
        .post(h.url("/admin/config/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let changed = v["changed"].to_string();
    assert!(changed.contains("upstreams"), "{v}");
    assert!(v["restart_required"].as_array().unwrap().is_empty(), "{v}");
    send("qwen3").await;
    send("gpt-4o").await;
    assert_eq!(conversations(&mocks.local).len(), 1);
    assert_eq!(conversations(&mocks.oai).len(), 1);
    assert_eq!(conversations(&h.mock).len(), 1);

    // qwen moves to the OpenAI upstream; a route to an unknown upstream is refused whole
    let moved = mocks.toml().replace(
        "[models.\"qwen*\"]\nupstream = \"local\"",
        "[models.\"qwen*\"]\nupstream = \"oai\"",
    );
    write(
        &path,
        &h.mock.base_url(),
        &format!("{moved}[models.\"x*\"]\nupstream = \"nowhere\"\n"),
    );
    let r = h
        .client
        .post(h.url("/admin/config/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v.to_string().contains("nowhere"), "{v}");
    send("qwen3").await;
    assert_eq!(
        conversations(&mocks.local).len(),
        2,
        "the refused reload changed nothing"
    );

    write(&path, &h.mock.base_url(), &moved);
    let r = h
        .client
        .post(h.url("/admin/config/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    send("qwen3").await;
    assert_eq!(conversations(&mocks.local).len(), 2);
    assert_eq!(conversations(&mocks.oai).len(), 2);
    let last = conversations(&mocks.oai).pop().unwrap();
    assert_eq!(last.json()["model"], "qwen3");
    assert_eq!(header(&last, "authorization"), Some("Bearer sk-route-oai"));
}

#[test]
fn check_config_names_an_unknown_upstream_a_bad_kind_and_a_bad_base_url() {
    let cfg = |text: &str| Config::from_toml_str(text).unwrap_err().0.join("\n");
    let all = cfg(
        "[upstreams.local]\nbase_url = \"localhost:8000\"\n[models.\"qwen*\"]\nupstream = \"lokal\"\n",
    );
    assert!(all.contains("upstreams.local.base_url"), "{all}");
    assert!(
        all.contains("models.\"qwen*\".upstream")
            && all.contains("\"lokal\"")
            && all.contains("local"),
        "{all}"
    );
    let all = cfg("[upstreams.g]\nbase_url = \"https://g.example\"\nkind = \"palm\"\n");
    assert!(all.contains("upstreams.g.kind"), "{all}");
    let gemini = Config::from_toml_str(
        "[upstreams.g]\nbase_url = \"https://g.example\"\nkind = \"gemini\"\n",
    );
    assert_eq!(gemini.unwrap().upstreams["g"].kind, UpstreamKind::Gemini);
    let all = cfg("[upstreams.default]\nbase_url = \"https://g.example\"\n");
    assert!(all.contains("upstreams.default"), "{all}");
    let all = cfg("[upstreams.x]\nkind = \"anthropic\"\n");
    assert!(all.contains("upstreams.x.base_url: required"), "{all}");
    // a good one, its key masked
    let c = Config::from_toml_str(
        "[upstreams.local]\nbase_url = \"http://127.0.0.1:8000/v1\"\napi_key = \"sk-secret-route\"\n\
         [models.\"qwen*\"]\nupstream = \"local\"\n",
    )
    .unwrap();
    assert_eq!(c.upstreams["local"].kind, UpstreamKind::Openai);
    let shown = c.masked().to_toml();
    assert!(!shown.contains("sk-secret-route"), "{shown}");
    assert!(shown.contains("[upstreams.local]"), "{shown}");
    let _ = test_config;
}
