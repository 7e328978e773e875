//! Unit tests of the mock's Gemini API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::mock::Scripted;
use axum::http::{HeaderMap, Method};

fn rec(uri: &str, body: Value) -> RecordedRequest {
    let mut headers = HeaderMap::new();
    headers.insert("x-goog-api-key", "k".parse().unwrap());
    RecordedRequest {
        method: Method::POST,
        uri: uri.into(),
        headers,
        body: Bytes::from(body.to_string()),
    }
}

fn request() -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": "list the files"}]}],
           "systemInstruction": {"role": "user", "parts": [{"text": "You are an agent."}]},
           "tools": [{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {"type": "object"}}]}]})
}

const SSE: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
const ARRAY: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
const JSON: &str = "/v1beta/models/gemini-2.5-flash:generateContent";

fn json_body(reply: &MockReply) -> (u16, Value) {
    let MockReply::Json { status, body, .. } = reply else {
        panic!("not JSON: {reply:?}")
    };
    (*status, serde_json::from_slice(body).unwrap())
}

/// The chunks of an SSE reply, checking each is `data: <json>\r\n\r\n`.
fn sse_chunks(reply: &MockReply) -> Vec<Value> {
    let MockReply::Sse { chunks, .. } = reply else {
        panic!("not SSE: {reply:?}")
    };
    chunks
        .iter()
        .map(|(_, b)| {
            let text = std::str::from_utf8(b).unwrap();
            let data = text.strip_prefix("data: ").unwrap();
            let data = data.strip_suffix("\r\n\r\n").unwrap();
            assert!(!data.contains('\n'), "one line per chunk");
            serde_json::from_str(data).unwrap()
        })
        .collect()
}

fn text_of(chunks: &[Value]) -> String {
    chunks
        .iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p["text"].as_str().map(String::from))
        .collect()
}

#[test]
fn calls_are_split_at_the_last_colon() {
    let call = GeminiCall::parse("/v1beta/models/gemini-2.5-flash:streamGenerateContent").unwrap();
    assert_eq!(
        call,
        GeminiCall {
            version: "v1beta".into(),
            model: "gemini-2.5-flash".into(),
            method: "streamGenerateContent".into()
        }
    );
    assert!(call.generates());
    let tuned = GeminiCall::parse("/v1/models/tunedModels/x:countTokens").unwrap();
    assert_eq!(
        (tuned.model.as_str(), tuned.method.as_str()),
        ("tunedModels/x", "countTokens")
    );
    assert!(!tuned.generates());
    for not in [
        "/v1/chat/completions",
        "/v1/models",
        "/v1/models/gpt-4o",
        "/v2/models/m:generateContent",
        "/v1beta/models/:generateContent",
        "/v1beta/models/m:",
    ] {
        assert_eq!(GeminiCall::parse(not), None, "{not}");
    }
}

#[test]
fn a_json_answer_is_one_generate_content_response() {
    let reply = GeminiReply::text("hello");
    let (status, body) = json_body(&reply.render(&rec(JSON, request())));
    assert_eq!(status, 200);
    let candidate = &body["candidates"][0];
    assert_eq!(
        candidate["content"],
        json!({"role": "model", "parts": [{"text": "hello"}]})
    );
    assert_eq!(candidate["finishReason"], "STOP");
    assert_eq!(candidate["index"], 0);
    assert_eq!(body["modelVersion"], "gemini-2.5-flash");
    let usage = &body["usageMetadata"];
    let prompt = usage["promptTokenCount"].as_u64().unwrap();
    assert_eq!(prompt, estimate_tokens(&request()));
    assert_eq!(
        usage["totalTokenCount"].as_u64().unwrap(),
        prompt + usage["candidatesTokenCount"].as_u64().unwrap()
    );
    let other = json!({"contents": [{"role": "user", "parts": [{"text": "y"}]}]});
    let (_, again) = json_body(&reply.render(&rec(JSON, other)));
    assert_ne!(
        body["responseId"], again["responseId"],
        "each turn has its own id"
    );
}

#[test]
fn the_prompt_count_grows_with_the_request() {
    let small = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let big = json!({"contents": [{"role": "user", "parts": [{"text": "hi ".repeat(1000)}]}]});
    assert!(estimate_tokens(&big) > estimate_tokens(&small) + 700);
    assert_eq!(estimate_tokens(&json!({})), 1);
}

#[test]
fn a_function_call_gets_an_id_and_the_first_a_signature() {
    let reply = GeminiReply::parts(vec![
        json!({"text": "Reading both."}),
        json!({"functionCall": {"name": "read_file", "args": {"path": "a.txt"}}}),
        json!({"functionCall": {"id": "given", "name": "read_file", "args": {"path": "b.txt"}}}),
    ]);
    let (_, body) = json_body(&reply.render(&rec(JSON, request())));
    let parts = body["candidates"][0]["content"]["parts"]
        .as_array()
        .unwrap();
    assert_eq!(parts[1]["thoughtSignature"], MOCK_SIGNATURE);
    assert!(parts[1]["functionCall"]["id"]
        .as_str()
        .unwrap()
        .starts_with("mock_call_"));
    assert_eq!(parts[1]["functionCall"]["args"], json!({"path": "a.txt"}));
    assert_eq!(parts[2]["functionCall"]["id"], "given");
    assert!(
        parts[2].get("thoughtSignature").is_none(),
        "only the step's first call is signed"
    );
    assert!(parts[0].get("thoughtSignature").is_none());
    assert_eq!(body["candidates"][0]["finishReason"], "STOP");
}

#[test]
fn an_sse_stream_ends_with_the_finish_reason_and_the_usage() {
    let reply = GeminiReply::parts(vec![
        json!({"text": "Let me think about it", "thought": true}),
        json!({"text": "Reading the file now."}),
        json!({"functionCall": {"id": "c1", "name": "read_file", "args": {"path": "a.txt"}}}),
    ]);
    let chunks = sse_chunks(&reply.render(&rec(SSE, request())));
    assert!(chunks.len() > 3, "text goes out in pieces");
    let (last, rest) = chunks.split_last().unwrap();
    for c in rest {
        assert!(c["candidates"][0].get("finishReason").is_none(), "{c}");
        assert!(c.get("usageMetadata").is_none(), "{c}");
        assert_eq!(c["candidates"][0]["content"]["role"], "model");
        assert!(c["responseId"] == last["responseId"] && c["modelVersion"] == "gemini-2.5-flash");
    }
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    let call = &last["candidates"][0]["content"]["parts"][0];
    assert_eq!(
        call["functionCall"],
        json!({"id": "c1", "name": "read_file", "args": {"path": "a.txt"}})
    );
    assert_eq!(call["thoughtSignature"], MOCK_SIGNATURE);
    let usage = &last["usageMetadata"];
    assert_eq!(usage["promptTokenCount"], estimate_tokens(&request()));
    assert!(usage["thoughtsTokenCount"].as_u64().unwrap() > 0);
    let thoughts: String = chunks
        .iter()
        .map(|c| &c["candidates"][0]["content"]["parts"][0])
        .filter(|p| p["thought"] == true)
        .filter_map(|p| p["text"].as_str())
        .collect();
    assert_eq!(thoughts, "Let me think about it");
    assert_eq!(
        text_of(&chunks),
        "Let me think about itReading the file now."
    );
}

#[test]
fn without_alt_the_stream_is_one_json_array() {
    let reply = GeminiReply::text("one two three four");
    let MockReply::Stream {
        content_type,
        chunks,
    } = reply.render(&rec(ARRAY, request()))
    else {
        panic!()
    };
    assert!(content_type.starts_with("application/json"));
    assert!(chunks.len() > 1, "sent piece by piece");
    let whole: String = chunks
        .iter()
        .map(|(_, b)| std::str::from_utf8(b).unwrap())
        .collect();
    assert!(whole.starts_with("[{") && whole.ends_with("}]") && whole.contains("},\r\n{"));
    let items: Vec<Value> = serde_json::from_str(&whole).unwrap();
    assert_eq!(text_of(&items), "one two three four");
    assert_eq!(
        items.last().unwrap()["candidates"][0]["finishReason"],
        "STOP"
    );
    assert!(
        items.last().unwrap()["usageMetadata"]["promptTokenCount"]
            .as_u64()
            .unwrap()
            > 1
    );
}

#[test]
fn a_stream_error_ends_the_stream_and_fails_a_json_call() {
    let spec = json!({"parts": [{"text": "Partial"}, {"text": "never sent"}],
                      "stream_error": {"after_parts": 1, "status": "UNAVAILABLE", "message": "overloaded"}});
    let reply = GeminiReply::from_spec(&spec).unwrap();
    let chunks = sse_chunks(&reply.render(&rec(SSE, request())));
    assert_eq!(
        chunks.last().unwrap(),
        &json!({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}})
    );
    assert_eq!(text_of(&chunks), "Partial");
    assert!(!chunks.iter().any(|c| c.get("usageMetadata").is_some()));
    let (status, body) = json_body(&reply.render(&rec(JSON, request())));
    assert_eq!(status, 503);
    assert_eq!(body["error"]["status"], "UNAVAILABLE");
}

#[test]
fn scripted_usage_and_finish_reason_are_reported() {
    let spec = json!({"parts": "x", "finish_reason": "MAX_TOKENS", "model_version": "gemini-2.5-pro-001",
                      "usage": {"promptTokenCount": 3000, "cachedContentTokenCount": 2048, "candidatesTokenCount": 7}});
    let reply = GeminiReply::from_spec(&spec).unwrap();
    for r in [rec(JSON, request()), rec(SSE, request())] {
        let body = match reply.render(&r) {
            MockReply::Json { body, .. } => serde_json::from_slice(&body).unwrap(),
            sse => sse_chunks(&sse).pop().unwrap(),
        };
        let usage = &body["usageMetadata"];
        assert_eq!(usage["promptTokenCount"], 3000);
        assert_eq!(usage["cachedContentTokenCount"], 2048);
        assert_eq!(usage["candidatesTokenCount"], 7);
        assert_eq!(usage["totalTokenCount"], 3007);
        assert_eq!(body["candidates"][0]["finishReason"], "MAX_TOKENS");
        assert_eq!(body["modelVersion"], "gemini-2.5-pro-001");
    }
}

#[test]
fn count_tokens_takes_contents_or_a_generate_content_request() {
    let contents = json!({"contents": request()["contents"]});
    let (status, body) = json_body(&count_tokens(&contents));
    assert_eq!(status, 200);
    assert_eq!(body, json!({"totalTokens": estimate_tokens(&contents)}));
    let wrapped = json!({"generateContentRequest": request()});
    let (_, body) = json_body(&count_tokens(&wrapped));
    assert_eq!(body["totalTokens"], estimate_tokens(&request()));
    let (status, body) = json_body(&count_tokens(&json!({})));
    assert_eq!(
        (status, body["error"]["status"].as_str()),
        (400, Some("INVALID_ARGUMENT"))
    );
}

#[test]
fn defaults_answer_each_method() {
    let count = "/v1beta/models/gemini-2.5-flash:countTokens";
    let call = |uri: &str| GeminiCall::parse(uri.split('?').next().unwrap()).unwrap();
    let (_, body) = json_body(&default_reply(&rec(count, request()), &call(count)));
    assert!(body["totalTokens"].as_u64().unwrap() > 1);
    let chunks = sse_chunks(&default_reply(&rec(SSE, request()), &call(SSE)));
    assert_eq!(text_of(&chunks), "mock reply");
    let (status, body) = json_body(&default_reply(&rec(JSON, json!({})), &call(JSON)));
    assert_eq!((status, body["error"]["code"].as_u64()), (400, Some(400)));
    let embed = "/v1beta/models/m:embedContent";
    let (status, body) = json_body(&default_reply(&rec(embed, request()), &call(embed)));
    assert_eq!(
        (status, body["error"]["status"].as_str()),
        (404, Some("NOT_FOUND"))
    );
}

#[test]
fn a_call_needs_a_key_in_a_header_or_the_query() {
    let mut keyless = rec(JSON, request());
    keyless.headers.clear();
    let (status, body) = json_body(&refusal(&keyless).unwrap());
    assert_eq!(status, 403);
    assert_eq!(body["error"]["status"], "PERMISSION_DENIED");
    assert_eq!(body["error"]["code"], 403);
    let mut by_query = keyless.clone();
    by_query.uri = format!("{JSON}?key=abc");
    assert!(refusal(&by_query).is_none());
    let mut empty = keyless.clone();
    empty.uri = format!("{JSON}?key=");
    assert!(refusal(&empty).is_some());
    assert!(refusal(&rec(JSON, request())).is_none());
    let mut chat = keyless.clone();
    chat.uri = "/v1/chat/completions".into();
    assert!(refusal(&chat).is_none(), "other APIs are not concerned");
}

#[test]
fn gemini_replies_fit_generate_calls_and_their_model() {
    let g = Scripted::from_spec(&json!({"gemini": {"parts": "hi"}, "model": "gemini-2.5-flash"}))
        .unwrap();
    let lite = "/v1beta/models/gemini-2.5-flash-lite:generateContent";
    let count = "/v1beta/models/gemini-2.5-flash:countTokens";
    assert!(g.fits(&rec(SSE, request())) && g.fits(&rec(JSON, request())));
    assert!(!g.fits(&rec(lite, request())), "another model's call");
    assert!(!g.fits(&rec(count, request())));
    assert!(!g.fits(&rec(
        "/v1/chat/completions",
        json!({"model": "gemini-2.5-flash"})
    )));
    let raw = Scripted::from_spec(&json!({"json": {}})).unwrap();
    assert!(raw.fits(&rec(JSON, request())) && !raw.fits(&rec(count, request())));
    let err =
        Scripted::from_spec(&json!({"gemini_error": {"code": 429, "message": "quota"}})).unwrap();
    let (status, body) = json_body(&err.answer(&rec(JSON, request())));
    assert_eq!(status, 429);
    assert_eq!(
        body,
        json!({"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}})
    );
}

#[test]
fn bad_specs_are_refused() {
    for bad in [
        json!({"gemini": {}}),
        json!({"gemini": "text"}),
        json!({"gemini": {"parts": ["text"]}}),
        json!({"gemini": {"parts": [{"functionCall": {"args": {}}}]}}),
        json!({"gemini": {"parts": [{"functionCall": {"name": "f", "args": "x"}}]}}),
        json!({"gemini": {"parts": "x", "usage": {"promptTokenCount": "many"}}}),
        json!({"gemini": {"parts": "x", "stream_error": {"message": "no status"}}}),
        json!({"gemini_error": {"message": "no status"}}),
        json!({"gemini_error": {"code": 200}}),
    ] {
        assert!(Scripted::from_spec(&bad).is_err(), "{bad}");
    }
    assert_eq!(
        GeminiError::from_spec(&json!({"status": "UNAVAILABLE"}))
            .unwrap()
            .code,
        503
    );
    assert_eq!(
        GeminiError::from_spec(&json!({"code": 502}))
            .unwrap()
            .status,
        "INTERNAL"
    );
}

#[tokio::test]
async fn the_mock_serves_gemini_calls_over_http() {
    let mock = crate::mock::MockUpstream::start().await.unwrap();
    let root = format!("http://{}", mock.addr);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    mock.script(
        Scripted::from_spec(&json!({"gemini": {"parts": "scripted"}, "model": "gemini-2.5-flash"}))
            .unwrap(),
    );
    let post = |path: &str, key: Option<&str>| {
        let mut r = http.post(format!("{root}{path}")).json(&request());
        if let Some(k) = key {
            r = r.header("x-goog-api-key", k);
        }
        r.send()
    };
    // without a key: refused, and the scripted reply stays queued
    let refused = post(SSE, None).await.unwrap();
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["status"], "PERMISSION_DENIED");
    // a side call to another model does not take it
    let lite = post(
        "/v1beta/models/gemini-2.5-flash-lite:generateContent?key=k",
        None,
    )
    .await
    .unwrap();
    let body: Value = lite.json().await.unwrap();
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["text"],
        "mock reply"
    );
    let sse = post(SSE, Some("k")).await.unwrap();
    assert_eq!(sse.headers()["content-type"], "text/event-stream");
    let text = sse.text().await.unwrap();
    assert!(text.starts_with("data: {") && text.ends_with("}\r\n\r\n") && !text.contains("[DONE]"));
    let chunks: Vec<Value> = text
        .split("\r\n\r\n")
        .filter(|c| !c.is_empty())
        .map(|c| serde_json::from_str(c.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert_eq!(text_of(&chunks), "scripted");
    let array = post(ARRAY, Some("k")).await.unwrap();
    assert!(array.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let items: Vec<Value> = array.json().await.unwrap();
    assert_eq!(text_of(&items), "mock reply");
    let count = post("/v1/models/gemini-2.5-flash:countTokens", Some("k"))
        .await
        .unwrap();
    let body: Value = count.json().await.unwrap();
    assert_eq!(body["totalTokens"], estimate_tokens(&request()));
    let uris: Vec<String> = mock.requests().iter().map(|r| r.uri.clone()).collect();
    assert_eq!(uris.len(), 5, "every call is recorded: {uris:?}");
}
