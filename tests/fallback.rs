//! `context.on_overflow = "fallback"`: a request that would lose whole messages to its model's hard limit goes to
//! the model's `[models] fallback` — whole when it fits there, its `model` replaced and every other byte kept — and
//! to that model's upstream, a chain followed while it still does not fit (the last one rewritten to its window);
//! the answer says so (`x-ctxgate-fallback`) in every dialect, and so do the turn record and
//! `ctxgate_fallbacks_total`. A request that fits, and a later turn of the same session that fits again, go to the
//! model asked for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{session_header, Harness};
use ctxgate::config::{Config, NamedUpstream, OnOverflow, Price, UpstreamKind};
use ctxgate::mock::MockUpstream;
use serde_json::{json, Value};

use common::fallback::{chat, model, posts, AUTH};

/// `small` (4,000 tokens) falls back to `medium` (8,000, upstream `mid`), which falls back to `large` (64,000,
/// upstream `big`); `solo` (4,000) has none.
fn chain(c: &mut Config, mid: &MockUpstream, big: &MockUpstream) {
    c.context.on_overflow = OnOverflow::Fallback;
    c.context.default_context_window = 4_000;
    for (name, mock) in [("mid", mid), ("big", big)] {
        c.upstreams.insert(
            name.into(),
            NamedUpstream {
                base_url: mock.base_url(),
                kind: UpstreamKind::Openai,
                ..NamedUpstream::default()
            },
        );
    }
    c.models
        .insert("small".into(), model(4_000, Some("medium"), None));
    // `medium` is priced (`small` is not): a turn it answers is counted at its price.
    let mut medium = model(8_000, Some("large"), Some("mid"));
    medium.price = Some(Price {
        input: Some(1.0),
        output: Some(2.0),
        ..Price::default()
    });
    c.models.insert("medium".into(), medium);
    c.models
        .insert("large".into(), model(64_000, None, Some("big")));
    c.models.insert("solo".into(), model(4_000, None, None));
}

#[tokio::test]
async fn a_request_over_its_window_goes_to_the_fallback_and_its_upstream_and_says_so() {
    let (mid, big) = (
        MockUpstream::start().await.unwrap(),
        MockUpstream::start().await.unwrap(),
    );
    let h = Harness::start_with(|c| chain(c, &mid, &big)).await;

    // Fits `small`: goes as it is, to `small`'s (the default) upstream, no header.
    let r = h
        .post_json("/v1/chat/completions", &[AUTH], &chat("small", 100))
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-ctxgate-fallback").is_none());
    r.text().await.unwrap();
    assert_eq!(posts(&h.mock).len(), 1);
    assert_eq!(posts(&h.mock)[0].json()["model"], "small");

    // ~6,000 tokens: over `small`'s hard limit, under `medium`'s: `medium`, on its own upstream.
    let body = chat("small", 6_000);
    let r = h.post_json("/v1/chat/completions", &[AUTH], &body).await;
    assert_eq!(r.status(), 200, "{:?}", r.headers());
    assert_eq!(r.headers()["x-ctxgate-fallback"], "medium");
    let sid = session_header(&r);
    r.text().await.unwrap();
    let sent = posts(&mid);
    assert_eq!(sent.len(), 1, "the fallback's upstream got it");
    assert_eq!(sent[0].json()["model"], "medium");
    assert_eq!(
        sent[0].json()["messages"],
        body["messages"],
        "sent whole: nothing dropped"
    );
    assert_eq!(posts(&h.mock).len(), 1, "the model's own upstream did not");

    // The same session's next turn fits `small` again: back to `small`, same session.
    let mut next = chat("small", 100);
    let m = next["messages"].as_array_mut().unwrap();
    m.push(json!({"role": "assistant", "content": "Done."}));
    m.push(json!({"role": "user", "content": "Thanks. And the CHANGELOG?"}));
    let r = h.post_json("/v1/chat/completions", &[AUTH], &next).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-ctxgate-fallback").is_none());
    assert_eq!(session_header(&r), sid, "one conversation");
    r.text().await.unwrap();
    assert_eq!(posts(&h.mock).len(), 2);
    assert_eq!(posts(&h.mock)[1].json()["model"], "small");

    h.state.drain().await;
    let turns = h.get_json(&format!("/admin/sessions/{sid}/turns")).await;
    let turns = turns["turns"].as_array().unwrap();
    // The first request, the one that fell back, the one that fits again.
    assert_eq!(turns.len(), 3);
    let fell: Vec<&Value> = turns.iter().map(|t| &t["fallback"]).collect();
    assert_eq!(fell, [&Value::Null, &json!("medium"), &Value::Null]);
    assert!(turns.iter().all(|t| t["model"] == "small"));
    assert_eq!(turns[1]["tokens"]["window"], 8_000);
    // priced at the model that answered
    assert!(turns[1]["dollars"]["spent"].as_f64().unwrap() > 0.0);
    assert!(turns[0].get("dollars").is_none() && turns[2].get("dollars").is_none());
    let metrics = h.metrics_text().await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("ctxgate_fallbacks_total{"))
        .expect(&metrics);
    assert!(
        line.contains("model=\"small\"") && line.contains("fallback=\"medium\""),
        "{line}"
    );
    assert!(line.ends_with(" 1"), "{line}");
}

#[tokio::test]
async fn a_chain_is_followed_while_the_request_does_not_fit() {
    let (mid, big) = (
        MockUpstream::start().await.unwrap(),
        MockUpstream::start().await.unwrap(),
    );
    let h = Harness::start_with(|c| chain(c, &mid, &big)).await;

    // ~12,000 tokens: fits neither `small` nor `medium`; `large` takes it whole, byte for byte but its model.
    let body = chat("small", 12_000);
    let r = h.post_json("/v1/chat/completions", &[AUTH], &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-ctxgate-fallback"],
        "large",
        "{:?}",
        r.headers()
    );
    r.text().await.unwrap();
    assert!(posts(&mid).is_empty() && posts(&h.mock).is_empty());
    let sent = posts(&big);
    assert_eq!(sent.len(), 1);
    let expected = serde_json::to_string(&body).unwrap().replacen(
        "\"model\":\"small\"",
        "\"model\":\"large\"",
        1,
    );
    assert_eq!(std::str::from_utf8(&sent[0].body).unwrap(), expected);

    // ~100,000 tokens: over the end of the chain too: rewritten to `large`'s window.
    let r = h
        .post_json("/v1/chat/completions", &[AUTH], &chat("small", 100_000))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ctxgate-fallback"], "large");
    let rewrite = r.headers()["x-ctxgate-rewrite"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(rewrite.contains("truncated"), "{rewrite}");
    r.text().await.unwrap();
    assert_eq!(posts(&big).len(), 2);
    assert_eq!(posts(&big)[1].json()["model"], "large");

    // A model without a fallback is truncated, as with `truncate`.
    let r = h
        .post_json("/v1/chat/completions", &[AUTH], &chat("solo", 6_000))
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-ctxgate-fallback").is_none());
    let rewrite = r.headers()["x-ctxgate-rewrite"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(rewrite.contains("truncated"), "{rewrite}");
    r.text().await.unwrap();
    assert_eq!(posts(&h.mock)[0].json()["model"], "solo");
}

#[test]
fn check_config_names_a_bad_fallback_and_warns_when_none_is_set() {
    let errors = |text: &str| Config::from_toml_str(text).unwrap_err().0.join("\n");
    let all = errors(
        "[models.a]\ncontext_window = 4000\nfallback = \"b\"\n\
         [models.b]\ncontext_window = 8000\nfallback = \"a\"\n",
    );
    assert!(
        all.contains("models.\"b\".fallback") && all.contains("cycle"),
        "{all}"
    );
    let all = errors("[models.a]\ncontext_window = 4000\nfallback = \"nowhere-model\"\n");
    assert!(all.contains("not in the model table"), "{all}");
    let all = errors(
        "[models.a]\ncontext_window = 9000\nfallback = \"b\"\n[models.b]\ncontext_window = 8000\n",
    );
    assert!(all.contains("must be larger"), "{all}");
    // valid, with a chain; the warning only when no entry sets a fallback
    let ok = Config::from_toml_str(
        "[context]\non_overflow = \"fallback\"\n\
         [models.a]\ncontext_window = 4000\nfallback = \"b\"\n\
         [models.b]\ncontext_window = 8000\nfallback = \"gpt-4.1\"\n",
    )
    .unwrap();
    assert!(ok.warnings().iter().all(|w| !w.contains("fallback")));
    let none = Config::from_toml_str("[context]\non_overflow = \"fallback\"\n").unwrap();
    assert!(
        none.warnings()
            .iter()
            .any(|w| w.contains("no [models] entry sets a fallback")),
        "{:?}",
        none.warnings()
    );
}
