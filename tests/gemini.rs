//! The Gemini dialect through the gateway: transparency (an untouched request byte for byte, the key in the query
//! forwarded, never stored), sessions named by the key wherever it is sent, rewriting valid for the API, recall
//! rounds in a JSON answer and in a streamed JSON array, errors in Google's shape, and the paths that are not
//! conversation requests passed to the right API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{session_header, Harness};
use ctxgate::dialect::gemini::validate::{check_rewrite, check_sequence};
use ctxgate::mock::GeminiReply;
use serde_json::{json, Value};

const MODEL: &str = "gemini-2.5-flash";

/// A Gemini CLI-like history: its `<session_context>` opening, then `turns` steps of a signed call and its output.
fn history(turns: usize, words: usize) -> Vec<Value> {
    let mut c = vec![
        json!({"role":"user","parts":[{"text":"<session_context>linux</session_context>"},{"text":"Fix the build."}]}),
    ];
    for i in 0..turns {
        c.push(json!({"role":"model","parts":[{"text":format!("Step {i}.")},
            {"functionCall":{"id":format!("fc_{i}"),"name":"run_shell_command","args":{"command":format!("make step{i}")}},
             "thoughtSignature":format!("CiQBsig{i}==")}]}));
        let out: String = (0..words).map(|w| format!("line{i}-{w} ")).collect();
        c.push(json!({"role":"user","parts":[{"functionResponse":{"id":format!("fc_{i}"),"name":"run_shell_command",
            "response":{"output":format!("MARKER-{i} {out}")}}}]}));
    }
    c
}

fn body(contents: &[Value]) -> Value {
    json!({"contents": contents,
        "systemInstruction": {"role":"user","parts":[{"text":"You are Gemini CLI."}]},
        "tools": [{"functionDeclarations":[{"name":"run_shell_command","parametersJsonSchema":{"type":"object"}}]}],
        "generationConfig": {"temperature": 0}})
}

async fn post(h: &Harness, path: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut headers = vec![("x-goog-api-client", "google-genai-sdk/1.30.0 gl-node/v22")];
    if let Some(k) = key {
        headers.push(("x-goog-api-key", k));
    }
    h.post_json(path, &headers, body).await
}

fn path(method: &str) -> String {
    format!("/v1beta/models/{MODEL}:{method}")
}

#[tokio::test]
async fn an_untouched_request_goes_upstream_byte_for_byte_and_the_answer_comes_back_unchanged() {
    let h = Harness::start().await;
    h.mock.push_gemini(GeminiReply::text("Done."));
    let b = body(&history(2, 10));
    let raw = serde_json::to_vec(&b).unwrap();
    let resp = post(&h, &path("generateContent"), Some("AIza-test-key"), &b).await;
    assert_eq!(resp.status(), 200);
    let session = session_header(&resp);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer["candidates"][0]["content"]["parts"][0]["text"],
        "Done."
    );
    let rec = &h.mock.requests()[0];
    assert_eq!(rec.uri, path("generateContent"));
    assert_eq!(&rec.body[..], &raw[..], "byte for byte");
    assert_eq!(rec.headers.get("x-goog-api-key").unwrap(), "AIza-test-key");
    // the session is the Gemini dialect's, holding the contents as sent and the model's answer
    let view = h.get_json(&format!("/admin/sessions/{session}")).await;
    assert_eq!(view["dialect"], "gemini");
    let stored = view.to_string();
    assert!(stored.contains("CiQBsig1=="), "thought signatures kept");
    assert!(stored.contains("Done."));
    assert!(!stored.contains("AIza-test-key"));
}

#[tokio::test]
async fn the_key_in_the_query_names_the_tenant_and_is_forwarded_but_never_kept() {
    let h = Harness::start().await;
    let b = body(&history(1, 5));
    let mut sessions = Vec::new();
    for key in ["AIza-one", "AIza-one", "AIza-two"] {
        h.mock.push_gemini(GeminiReply::text("ok"));
        let url = format!("{}?key={key}&alt=sse", path("streamGenerateContent"));
        let resp = post(&h, &url, None, &b).await;
        assert_eq!(resp.status(), 200);
        sessions.push(session_header(&resp));
        let _ = resp.bytes().await.unwrap();
        let rec = h.mock.requests().pop().unwrap();
        assert!(
            rec.uri.ends_with(&format!("?key={key}&alt=sse")),
            "{}",
            rec.uri
        );
    }
    assert_eq!(sessions[0], sessions[1], "one key, one conversation");
    assert_ne!(sessions[0], sessions[2], "another key is another tenant");
    // the same key as a header names the same tenant
    h.mock.push_gemini(GeminiReply::text("ok"));
    let resp = post(&h, &path("generateContent"), Some("AIza-one"), &b).await;
    assert_eq!(session_header(&resp), sessions[0]);
    let export = h
        .get_json(&format!("/admin/sessions/{}", sessions[0]))
        .await;
    assert!(!export.to_string().contains("AIza-one"));
}

#[tokio::test]
async fn a_long_history_is_rewritten_validly_and_a_recall_is_answered_in_a_streamed_json_array() {
    let h = common::small_window("gemini-*", 6_000).await;
    let contents = history(14, 300);
    let b = body(&contents);
    // the model recalls the first output, then answers; without `alt=sse` the stream is one JSON array
    h.mock.push_gemini(GeminiReply::function_call(
        "r1",
        "recall_tool_call",
        json!({"call_id": "fc_0"}),
    ));
    h.mock
        .push_gemini(GeminiReply::text("It printed MARKER-0."));
    let resp = post(&h, &path("streamGenerateContent"), Some("k"), &b).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-ctxgate-rewrite").is_some());
    let answer: Value = resp.json().await.unwrap();
    let arr = answer
        .as_array()
        .expect("a JSON array, as the client asked");
    let text = arr[0]["candidates"][0]["content"]["parts"].to_string();
    assert!(text.contains("It printed MARKER-0."), "{text}");
    assert!(
        !answer.to_string().contains("recall_tool_call"),
        "the client never sees ctxgate's tool"
    );
    let reqs = h.mock.requests();
    assert_eq!(reqs.len(), 2);
    // the usage of both rounds, summed; the first round's id
    let prompts: u64 = reqs
        .iter()
        .map(|r| ctxgate::mock::gemini::estimate_tokens(&serde_json::from_slice(&r.body).unwrap()))
        .sum();
    assert_eq!(arr[0]["usageMetadata"]["promptTokenCount"], prompts);
    assert!(arr[0]["responseId"].is_string(), "{}", arr[0]["responseId"]);
    let first: Value = serde_json::from_slice(&reqs[0].body).unwrap();
    let sent = first["contents"].as_array().unwrap();
    check_sequence(sent).unwrap();
    check_rewrite(&b, &first).unwrap();
    assert!(
        reqs[0].body.len() < serde_json::to_vec(&b).unwrap().len(),
        "shortened"
    );
    assert!(!String::from_utf8_lossy(&reqs[0].body).contains("MARKER-0 line0-0"));
    let offered = first["tools"].to_string();
    assert!(offered.contains("recall_tool_call") && offered.contains("parametersJsonSchema"));
    // the second round carries the model's call and ctxgate's answer: the first output, byte-exact
    let second: Value = serde_json::from_slice(&reqs[1].body).unwrap();
    let parts: Vec<&Value> = second["contents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["parts"].as_array().unwrap())
        .collect();
    let answer = parts
        .iter()
        .find(|p| p["functionResponse"]["id"] == "r1")
        .unwrap();
    assert!(answer.to_string().contains("MARKER-0 line0-0 line0-1"));
}

#[tokio::test]
async fn errors_take_googles_shape_and_other_paths_go_to_their_api() {
    let h = Harness::start().await;
    let resp = post(
        &h,
        &path("generateContent"),
        Some("k"),
        &json!({"contents": {}}),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["status"], "INVALID_ARGUMENT");
    assert_eq!(e["error"]["code"], 400);
    assert!(h.mock.requests().is_empty());
    // not conversation requests: Gemini's own paths to the Gemini API, OpenAI's model list to OpenAI's
    let _ = h
        .client
        .get(h.url("/v1beta/models?key=k"))
        .send()
        .await
        .unwrap();
    let _ = h.client.get(h.url("/v1/models")).send().await.unwrap();
    let _ = post(
        &h,
        "/v1beta/models/text-embedding-004:embedContent",
        Some("k"),
        &json!({}),
    )
    .await;
    let uris: Vec<String> = h.mock.requests().into_iter().map(|r| r.uri).collect();
    assert_eq!(
        uris,
        [
            "/v1beta/models?key=k",
            "/v1/models",
            "/v1beta/models/text-embedding-004:embedContent"
        ]
    );
}

/// The session store's list of dialect names (`session/` does not import `dialect/`) is every dialect's: a session
/// read back from the store keeps its dialect, and an export of it imports.
#[test]
fn the_store_knows_every_dialect_by_name() {
    let names: Vec<&str> = ctxgate::dialect::Dialect::ALL
        .iter()
        .map(|d| d.as_str())
        .collect();
    let mut stored = ctxgate::session::manager::DIALECT_NAMES.to_vec();
    let mut all = names.clone();
    stored.sort_unstable();
    all.sort_unstable();
    assert_eq!(stored, all);
}

#[tokio::test]
async fn a_gemini_session_survives_a_restart_and_an_export() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctx.db");
    let sqlite = |db: std::path::PathBuf| {
        move |c: &mut ctxgate::config::Config| {
            c.store.backend = ctxgate::config::StoreBackend::Sqlite;
            c.store.path = db;
        }
    };
    let mut h = Harness::start_with(sqlite(db.clone())).await;
    h.mock.push_gemini(GeminiReply::text("first"));
    let contents = history(2, 10);
    let resp = post(&h, &path("generateContent"), Some("k"), &body(&contents)).await;
    let sid = session_header(&resp);
    let _ = resp.bytes().await.unwrap();
    h.state.drain().await;
    h.stop().await;

    // A new gateway on the same store: the conversation goes on in the same session, read back as Gemini's.
    let h = Harness::start_with(sqlite(db)).await;
    h.mock.push_gemini(GeminiReply::text("second"));
    let mut more = contents.clone();
    more.push(json!({"role":"model","parts":[{"text":"first"}]}));
    more.push(json!({"role":"user","parts":[{"text":"Go on."}]}));
    let resp = post(&h, &path("generateContent"), Some("k"), &body(&more)).await;
    assert_eq!(session_header(&resp), sid);
    let _ = resp.bytes().await.unwrap();
    let view = h.get_json(&format!("/admin/sessions/{sid}")).await;
    assert_eq!(view["dialect"], "gemini");
    assert_eq!(view["total"], more.len() + 1);

    // Its export imports (replacing it) as it was.
    let export = h
        .client
        .get(h.url(&format!("/admin/sessions/{sid}/export")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&export).contains("\"dialect\":\"gemini\""));
    let r = h
        .client
        .post(h.url("/admin/sessions/import?replace=true"))
        .header("content-type", "application/x-ndjson")
        .body(export.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(
        h.get_json(&format!("/admin/sessions/{sid}")).await["dialect"],
        "gemini"
    );
}
