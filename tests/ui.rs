//! The inspector page's HTTP side: its assets embedded and served with their types and a strict policy, and the
//! admin API features it relies on — search by id with paging, node ids beside the history. (The page itself is
//! driven in a real browser by tests/ui/test_inspector.py.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Harness;
use ctxgate::config::StoreBackend;
use serde_json::{json, Value};

#[tokio::test]
async fn the_page_and_its_assets_are_served_with_a_strict_policy() {
    let h = Harness::start().await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client.get(h.url("/ui")).send().await.unwrap();
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], "/ui/");
    for (path, ty, needle) in [
        (
            "/ui/",
            "text/html; charset=utf-8",
            "<script src=\"/ui/app.js\"",
        ),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "/admin/sessions",
        ),
        ("/ui/app.css", "text/css; charset=utf-8", ".msg"),
    ] {
        let r = client.get(h.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let hd = r.headers();
        assert_eq!(hd["content-type"], ty, "{path}");
        assert_eq!(hd["x-content-type-options"], "nosniff");
        let csp = hd["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(hd["cache-control"], "no-cache");
        let body = r.text().await.unwrap();
        assert!(body.contains(needle), "{path}");
        // Nothing is loaded from elsewhere (the SVG namespace is a name, not a resource).
        let body = body.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !body.contains("http://") && !body.contains("https://"),
            "{path} loads nothing external"
        );
    }
    assert_eq!(
        client
            .get(h.url("/ui/nope.js"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

async fn make_sessions(h: &Harness, ids: &[&str]) {
    for id in ids {
        let r = h
            .client
            .post(h.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-ui")
            .header("x-session-id", *id)
            .json(&json!({"model": "mock-model", "messages": [{"role": "user", "content": format!("hi {id}")}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    h.state.drain().await;
}

async fn list(h: &Harness, query: &str) -> Value {
    h.get_json(&format!("/admin/sessions{query}")).await
}

async fn search(h: &Harness) {
    let names = ["alpha-1", "alpha-2", "beta-1", "alpha-3", "gamma"];
    make_sessions(h, &names).await;
    let all = list(h, "").await;
    assert_eq!(all["total"], 5);
    // Session ids carry a tenant prefix; the client's header is their tail.
    let v = list(h, "?q=alpha").await;
    assert_eq!(v["total"], 3);
    let ids: Vec<&str> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|i| i.contains("alpha")), "{ids:?}");
    let page = list(h, "?q=alpha&limit=2&offset=2").await;
    assert_eq!(page["total"], 3);
    assert_eq!(page["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(
        page["sessions"][0]["id"].as_str().unwrap(),
        ids[2],
        "the same order, paged"
    );
    assert_eq!(list(h, "?q=zzz").await["total"], 0);
    assert_eq!(
        list(h, "?q=").await["total"],
        5,
        "an empty search lists everything"
    );
}

#[tokio::test]
async fn sessions_are_searched_by_id_in_memory() {
    let h = Harness::start().await;
    search(&h).await;
}

#[tokio::test]
async fn sessions_are_searched_by_id_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctx.db");
    let h = Harness::start_with(move |c| {
        c.store.backend = StoreBackend::Sqlite;
        c.store.path = db;
    })
    .await;
    search(&h).await;
}

#[tokio::test]
async fn the_session_view_names_the_node_of_each_message() {
    let h = Harness::start().await;
    make_sessions(&h, &["ids-1"]).await;
    let sid = list(&h, "").await["sessions"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let v: Value = h.get_json(&format!("/admin/sessions/{sid}")).await;
    let turns: Value = h.get_json(&format!("/admin/sessions/{sid}/turns")).await;
    assert_eq!(
        v["ids"].as_array().unwrap().len(),
        v["messages"].as_array().unwrap().len()
    );
    assert_eq!(
        turns["turns"][0]["sent_from"][0]["node"], v["ids"][0],
        "what a turn's sent_from refers to"
    );
    assert_eq!(turns["turns"][0]["head"], v["ids"][0]);
}

/// What the page shows explains itself: turns numbered from 1 (the admin API's `turn`, which the page shows and
/// opens with `offset = turn - 1`), a turn ctxgate did not count says so instead of `? → ?`, and the session's
/// token figure is marked as an estimate, with a legend. (The page itself: tests/clients/python/test_inspector.py.)
#[tokio::test]
async fn the_page_numbers_turns_from_one_and_explains_its_figures() {
    let h = Harness::start().await;
    // A short streamed request that asks for no usage: sent as it came, not counted, no usage reported.
    let r = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-ui")
        .header("x-session-id", "uncounted")
        .json(&json!({"model": "mock-model", "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    h.state.drain().await;
    let turns = h.get_json("/admin/sessions/uncounted/turns").await;
    let turn = &turns["turns"][0];
    assert_eq!(turn["turn"], 1, "{turn}");
    assert!(
        turn["tokens"]["client"].is_null() && turn["tokens"]["sent"].is_null(),
        "{turn}"
    );
    let get = |path: &'static str| {
        let client = h.client.clone();
        let url = h.url(path);
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let js = get("/ui/app.js").await;
    assert!(
        js.contains("turns?offset=${n - 1}&limit=1"),
        "turn n is offset n - 1"
    );
    assert!(js.contains("\"not counted: sent as it came\""));
    assert!(!js.contains("?? \"?\""), "no bare `?` for a missing count");
    let html = get("/ui/").await;
    assert!(html.contains("~tokens (est.)</th>"), "{html}");
    assert!(html.contains("id=\"list-legend\""), "{html}");
    // the turn table's cache column: why a turn missed the provider's cache, from the turn's `cache`
    assert!(html.contains("<th id=\"th-cache\""), "{html}");
    assert!(
        js.contains("cacheCell(t.cache)"),
        "the turn table shows each turn's cache"
    );
    assert!(turn["cache"].is_object(), "{turn}");
}
