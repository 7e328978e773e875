//! The mock upstream's Gemini API: `POST /{version}/models/{model}:{method}` for `generateContent`,
//! `streamGenerateContent` (as SSE with `?alt=sse`, else as one JSON array) and `countTokens`; a scripted reply
//! rendered in the shape the call asks for, errors in Google's shape, and the deterministic token estimate behind
//! `usageMetadata.promptTokenCount` and `countTokens`.
//!
//! A stream is a sequence of `GenerateContentResponse` chunks, one part (or one piece of a text part) each, every
//! chunk with `modelVersion` and `responseId`; the last one carries the candidate's `finishReason` and the
//! `usageMetadata`. With `alt=sse` each chunk is `data: <chunk>\r\n\r\n` (no event names, no `[DONE]`); without
//! it the chunks are the items of one JSON array, `[<chunk>,\r\n<chunk>]`. A scripted `stream_error` ends a
//! stream after some parts with an `{"error": …}` item, as the API does when it fails after answering 200.
//!
//! The API takes its key in `x-goog-api-key` or `?key=` (or an OAuth `Authorization: Bearer`); a call with
//! none is refused 403 `PERMISSION_DENIED` before any scripted reply is taken (see [`refusal`]).

use super::anthropic::pieces;
use super::{MockReply, RecordedRequest};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The methods a Gemini reply answers (the conversation calls).
const GENERATE: [&str; 2] = ["generateContent", "streamGenerateContent"];

/// The signature the mock puts on a step's first `functionCall` part when the script gives none.
pub const MOCK_SIGNATURE: &str = "bW9jay10aG91Z2h0LXNpZ25hdHVyZQ==";

/// A Gemini API call named by its path: `/{v1beta|v1|v1alpha}/models/{model}:{method}`, split at the last `:`
/// (a model name has no `:`, but a tuned model's path may have `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeminiCall {
    /// The API version, e.g. `v1beta`.
    pub version: String,
    /// The model, e.g. `gemini-2.5-flash`.
    pub model: String,
    /// The method, e.g. `streamGenerateContent`.
    pub method: String,
}

impl GeminiCall {
    /// The call `path` (without its query) names, if it is one.
    pub fn parse(path: &str) -> Option<GeminiCall> {
        let rest = path.strip_prefix('/')?;
        let (version, rest) = rest.split_once('/')?;
        if !matches!(version, "v1beta" | "v1" | "v1alpha") {
            return None;
        }
        let model_method = rest.strip_prefix("models/")?;
        let (model, method) = model_method.rsplit_once(':')?;
        if model.is_empty() || method.is_empty() {
            return None;
        }
        Some(GeminiCall {
            version: version.to_string(),
            model: model.to_string(),
            method: method.to_string(),
        })
    }

    /// The call `rec` makes, when it is a `POST` to a Gemini method.
    pub fn of(rec: &RecordedRequest) -> Option<GeminiCall> {
        if rec.method != axum::http::Method::POST {
            return None;
        }
        GeminiCall::parse(rec.path())
    }

    /// Whether it is `generateContent` or `streamGenerateContent` (what a [`GeminiReply`] answers).
    pub fn generates(&self) -> bool {
        GENERATE.contains(&self.method.as_str())
    }
}

/// How a call wants its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// One `GenerateContentResponse` (`generateContent`).
    Json,
    /// `streamGenerateContent?alt=sse`.
    Sse,
    /// `streamGenerateContent` without `alt`: one JSON array of chunks.
    Array,
}

fn shape(rec: &RecordedRequest, call: &GeminiCall) -> Shape {
    if call.method != "streamGenerateContent" {
        return Shape::Json;
    }
    let query = rec.uri.split_once('?').map_or("", |(_, q)| q);
    if query.split('&').any(|kv| kv == "alt=sse") {
        Shape::Sse
    } else {
        Shape::Array
    }
}

/// An error in Google's shape: `{"error":{"code","message","status"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct GeminiError {
    /// HTTP status, repeated as `error.code`.
    pub code: u16,
    /// The gRPC status name, e.g. `RESOURCE_EXHAUSTED`.
    pub status: String,
    /// `error.message`.
    pub message: String,
}

/// gRPC status names and the HTTP status Google answers them with.
const STATUSES: [(&str, u16); 11] = [
    ("INVALID_ARGUMENT", 400),
    ("FAILED_PRECONDITION", 400),
    ("UNAUTHENTICATED", 401),
    ("PERMISSION_DENIED", 403),
    ("NOT_FOUND", 404),
    ("ABORTED", 409),
    ("RESOURCE_EXHAUSTED", 429),
    ("CANCELLED", 499),
    ("INTERNAL", 500),
    ("UNAVAILABLE", 503),
    ("DEADLINE_EXCEEDED", 504),
];

impl GeminiError {
    /// An error of gRPC `status` with the HTTP code Google gives it (400 for unknown names).
    pub fn new(status: &str, message: &str) -> GeminiError {
        let code = STATUSES
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(400, |(_, c)| *c);
        GeminiError {
            code,
            status: status.to_string(),
            message: message.to_string(),
        }
    }

    /// The error object: `{"error":{"code","message","status"}}` (the body of an error answer, and the item
    /// that ends a failing stream).
    pub fn body(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message, "status": self.status}})
    }

    /// The error as a whole HTTP answer.
    pub fn reply(&self) -> MockReply {
        MockReply::json(self.code, self.body())
    }

    /// From `{"status"?, "code"?, "message"?}`: the status name defaults from the code (`INTERNAL` for an
    /// unknown 5xx, `INVALID_ARGUMENT` otherwise), the code from the status name; one of the two is needed.
    pub fn from_spec(spec: &Value) -> Result<GeminiError, String> {
        let o = spec
            .as_object()
            .ok_or_else(|| format!("a Gemini error must be an object, got {spec}"))?;
        let code = match o.get("code") {
            None => None,
            Some(c) => Some(
                c.as_u64()
                    .and_then(|c| u16::try_from(c).ok())
                    .filter(|c| (400..600).contains(c))
                    .ok_or_else(|| format!("bad error code {c}"))?,
            ),
        };
        let status = match o.get("status") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(format!("\"status\" must be a string, got {other}")),
        };
        let status = match (status, code) {
            (Some(s), _) => s,
            (None, Some(c)) => STATUSES
                .iter()
                .find(|(_, sc)| *sc == c)
                .map(|(s, _)| (*s).to_string())
                .unwrap_or_else(|| {
                    if c >= 500 {
                        "INTERNAL"
                    } else {
                        "INVALID_ARGUMENT"
                    }
                    .to_string()
                }),
            (None, None) => {
                return Err(format!(
                    "a Gemini error needs \"status\" or \"code\", got {spec}"
                ))
            }
        };
        let message = o.get("message").and_then(Value::as_str).unwrap_or(&status);
        let mut e = GeminiError::new(&status, message);
        if let Some(c) = code {
            e.code = c;
        }
        Ok(e)
    }
}

/// One scripted Gemini answer, rendered as one response, an SSE stream or a JSON-array stream as the call asks.
#[derive(Debug, Clone, PartialEq)]
pub struct GeminiReply {
    /// The candidate's parts in the API's own shape (`text`, `functionCall`, `thought: true` text, or any other
    /// part, sent as is). The first `functionCall` gets [`MOCK_SIGNATURE`] as its `thoughtSignature` and every
    /// `functionCall` an `id` (`mock_call_…`) when the script gives none.
    pub parts: Vec<Value>,
    /// The candidate's `finishReason`; unset: `STOP` (the API's reason for a function call too).
    pub finish_reason: Option<String>,
    /// `usageMetadata` fields given by the script (e.g. `promptTokenCount`, `cachedContentTokenCount`,
    /// `thoughtsTokenCount`); the others are estimated: `promptTokenCount` from the request ([`estimate_tokens`]),
    /// `candidatesTokenCount` from the parts, `totalTokenCount` their sum.
    pub usage: Map<String, Value>,
    /// `modelVersion`; unset: the model the path names.
    pub model_version: Option<String>,
    /// In a stream, an `{"error": …}` item sent after this many parts, ending the stream (no finish reason, no
    /// usage); a `generateContent` call gets the error as an HTTP error instead.
    pub stream_error: Option<(usize, GeminiError)>,
    /// Delay between two stream chunks (or before a JSON answer).
    pub delay: Duration,
}

impl GeminiReply {
    /// A reply saying `text`.
    pub fn text(text: &str) -> GeminiReply {
        GeminiReply::parts(vec![json!({"text": text})])
    }

    /// A reply made of `parts`, everything else defaulted.
    pub fn parts(parts: Vec<Value>) -> GeminiReply {
        GeminiReply {
            parts,
            finish_reason: None,
            usage: Map::new(),
            model_version: None,
            stream_error: None,
            delay: Duration::ZERO,
        }
    }

    /// A reply calling one function.
    pub fn function_call(id: &str, name: &str, args: Value) -> GeminiReply {
        GeminiReply::parts(vec![
            json!({"functionCall": {"id": id, "name": name, "args": args}}),
        ])
    }

    /// From the value of a `{"gemini": …}` spec: `parts` (a string, or a list of parts), and optional
    /// `finish_reason`, `usage` (any `usageMetadata` counts), `model_version`, `stream_error` (`{"after_parts",
    /// "status"?, "code"?, "message"?}`).
    pub fn from_spec(spec: &Value) -> Result<GeminiReply, String> {
        let o = spec
            .as_object()
            .ok_or_else(|| format!("\"gemini\" must be an object, got {spec}"))?;
        let parts = match o.get("parts") {
            Some(Value::String(s)) => vec![json!({"text": s})],
            Some(Value::Array(parts)) => parts.iter().map(check_part).collect::<Result<_, _>>()?,
            _ => return Err("\"gemini\" needs \"parts\": a string or a list of parts".into()),
        };
        let string = |k: &str| -> Result<Option<String>, String> {
            match o.get(k) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(format!("\"{k}\" must be a string, got {other}")),
            }
        };
        let usage = match o.get("usage") {
            None => Map::new(),
            Some(Value::Object(u)) => {
                if let Some((k, v)) = u.iter().find(|(_, v)| v.as_u64().is_none()) {
                    return Err(format!("usage.{k} must be a count, got {v}"));
                }
                u.clone()
            }
            Some(other) => return Err(format!("\"usage\" must be an object, got {other}")),
        };
        let stream_error = match o.get("stream_error") {
            None => None,
            Some(e) => {
                let after = e.get("after_parts").and_then(Value::as_u64).unwrap_or(0);
                let after = usize::try_from(after).map_err(|_| "after_parts is too big")?;
                let mut e = e.clone();
                if let Some(e) = e.as_object_mut() {
                    e.remove("after_parts");
                }
                Some((after, GeminiError::from_spec(&e)?))
            }
        };
        Ok(GeminiReply {
            parts,
            finish_reason: string("finish_reason")?,
            usage,
            model_version: string("model_version")?,
            stream_error,
            delay: Duration::ZERO,
        })
    }

    /// The answer to `rec` (a Gemini call): one response, or the stream its method and `alt` ask for.
    pub fn render(&self, rec: &RecordedRequest) -> MockReply {
        let request = rec.json();
        let call = GeminiCall::parse(rec.path()).unwrap_or(GeminiCall {
            version: "v1beta".into(),
            model: "mock-model".into(),
            method: "generateContent".into(),
        });
        let parts = self.signed_parts(&request);
        let model = self.model_version.clone().unwrap_or(call.model.clone());
        let id = response_id(&request);
        let response = |parts: Vec<Value>, last: bool| -> Value {
            let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
            let mut chunk = Map::new();
            if last {
                candidate["finishReason"] = json!(self.finish_reason.as_deref().unwrap_or("STOP"));
            }
            chunk.insert("candidates".into(), json!([candidate]));
            if last {
                chunk.insert("usageMetadata".into(), self.usage_metadata(&request));
            }
            chunk.insert("modelVersion".into(), json!(model));
            chunk.insert("responseId".into(), json!(id));
            Value::Object(chunk)
        };
        let shape = shape(rec, &call);
        if shape == Shape::Json {
            let reply = match &self.stream_error {
                Some((_, e)) => e.reply(),
                None => MockReply::json(200, response(parts, true)),
            };
            return reply.delayed(self.delay);
        }
        let mut chunks = Vec::new();
        let mut failed = None;
        for (i, part) in parts.iter().enumerate() {
            if let Some((after, e)) = &self.stream_error {
                if *after == i {
                    failed = Some(e);
                    break;
                }
            }
            chunks.extend(part_pieces(part).into_iter().map(|p| vec![p]));
        }
        let mut items: Vec<Value> = Vec::new();
        match failed.or(self.stream_error.as_ref().map(|(_, e)| e)) {
            Some(e) => {
                items.extend(chunks.into_iter().map(|p| response(p, false)));
                items.push(e.body());
            }
            None => {
                let last = chunks.pop().unwrap_or_else(|| vec![json!({"text": ""})]);
                items.extend(chunks.into_iter().map(|p| response(p, false)));
                items.push(response(last, true));
            }
        }
        stream(shape, &items, self.delay)
    }

    /// The parts as sent: each `functionCall` with an `id`, the first one with a `thoughtSignature`.
    fn signed_parts(&self, request: &Value) -> Vec<Value> {
        let hash = fnv(request);
        let mut signed = false;
        let mut parts = self.parts.clone();
        for (i, part) in parts.iter_mut().enumerate() {
            let Some(call) = part.get_mut("functionCall").and_then(Value::as_object_mut) else {
                continue;
            };
            call.entry("id")
                .or_insert_with(|| json!(format!("mock_call_{:08x}_{i}", hash as u32)));
            call.entry("args").or_insert_with(|| json!({}));
            if !signed {
                signed = true;
                if let Some(p) = part.as_object_mut() {
                    p.entry("thoughtSignature")
                        .or_insert_with(|| json!(MOCK_SIGNATURE));
                }
            }
        }
        parts
    }

    fn usage_metadata(&self, request: &Value) -> Value {
        let count = |k: &str| self.usage.get(k).and_then(Value::as_u64);
        let size = |thought: bool| -> u64 {
            let len: usize = self
                .parts
                .iter()
                .filter(|p| (p.get("thought") == Some(&json!(true))) == thought)
                .map(|p| p.to_string().len())
                .sum();
            (len as u64).div_ceil(4)
        };
        let prompt = count("promptTokenCount").unwrap_or_else(|| estimate_tokens(request));
        let candidates = count("candidatesTokenCount").unwrap_or_else(|| size(false).max(1));
        let thoughts = count("thoughtsTokenCount").unwrap_or_else(|| size(true));
        let tool_prompt = count("toolUsePromptTokenCount").unwrap_or(0);
        let mut usage = self.usage.clone();
        usage.insert("promptTokenCount".into(), json!(prompt));
        usage.insert("candidatesTokenCount".into(), json!(candidates));
        if thoughts > 0 {
            usage.insert("thoughtsTokenCount".into(), json!(thoughts));
        }
        usage
            .entry("totalTokenCount")
            .or_insert_with(|| json!(prompt + candidates + thoughts + tool_prompt));
        usage.insert(
            "promptTokensDetails".into(),
            json!([{"modality": "TEXT", "tokenCount": prompt}]),
        );
        Value::Object(usage)
    }
}

/// A part must be an object; a `functionCall` needs a string `name` and object `args` (when given).
fn check_part(part: &Value) -> Result<Value, String> {
    let o = part
        .as_object()
        .ok_or_else(|| format!("a part must be an object, got {part}"))?;
    if let Some(call) = o.get("functionCall") {
        if !call.get("name").is_some_and(Value::is_string) {
            return Err(format!(
                "a functionCall needs a string \"name\", got {part}"
            ));
        }
        if call.get("args").is_some_and(|a| !a.is_object()) {
            return Err(format!(
                "a functionCall's \"args\" must be an object, got {part}"
            ));
        }
    }
    Ok(part.clone())
}

/// How a part goes out in a stream: a text (or thought) part in up to three pieces, every other part whole.
fn part_pieces(part: &Value) -> Vec<Value> {
    let Some(text) = part.get("text").and_then(Value::as_str) else {
        return vec![part.clone()];
    };
    let cut = pieces(text, 3);
    let n = cut.len();
    if n <= 1 {
        return vec![part.clone()];
    }
    cut.into_iter()
        .enumerate()
        .map(|(i, piece)| {
            let mut p = part.clone();
            p["text"] = json!(piece);
            // A signature rides on the last piece of its part, as the API sends it.
            if i + 1 < n {
                if let Some(o) = p.as_object_mut() {
                    o.remove("thoughtSignature");
                }
            }
            p
        })
        .collect()
}

/// The stream of `items`: SSE events, or the items of one JSON array sent piece by piece.
fn stream(shape: Shape, items: &[Value], delay: Duration) -> MockReply {
    let chunks = match shape {
        Shape::Sse => items
            .iter()
            .map(|c| (delay, Bytes::from(format!("data: {c}\r\n\r\n"))))
            .collect(),
        _ => {
            let n = items.len();
            items
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let open = if i == 0 { "[" } else { ",\r\n" };
                    let close = if i + 1 == n { "]" } else { "" };
                    (delay, Bytes::from(format!("{open}{c}{close}")))
                })
                .collect()
        }
    };
    if shape == Shape::Sse {
        MockReply::Sse {
            chunks,
            stall_after: false,
        }
    } else {
        MockReply::Stream {
            content_type: "application/json; charset=UTF-8".into(),
            chunks,
        }
    }
}

/// FNV-1a of the request's JSON text.
fn fnv(request: &Value) -> u64 {
    request
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

/// `responseId`: a hash of the request, the same for the same request and different for the next turn.
fn response_id(request: &Value) -> String {
    format!("mock-{:016x}", fnv(request))
}

/// A deterministic token estimate of a `GenerateContentRequest`: a quarter of the JSON length of its
/// `systemInstruction`, `contents` and `tools` (at least 1).
pub fn estimate_tokens(request: &Value) -> u64 {
    let len: usize = ["systemInstruction", "contents", "tools"]
        .iter()
        .filter_map(|k| request.get(k))
        .map(|v| v.to_string().len())
        .sum();
    (len as u64).div_ceil(4).max(1)
}

/// The answer to `:countTokens`: `{"totalTokens"}` for `{contents}` or `{generateContentRequest: {…}}`, a 400
/// for neither.
pub fn count_tokens(request: &Value) -> MockReply {
    let counted = if request.get("contents").is_some() {
        request
    } else if let Some(inner) = request.get("generateContentRequest") {
        inner
    } else {
        return GeminiError::new(
            "INVALID_ARGUMENT",
            "* CountTokensRequest: either contents or generate_content_request must be set\n",
        )
        .reply();
    };
    MockReply::json(200, json!({"totalTokens": estimate_tokens(counted)}))
}

/// A Gemini call without an API key (`x-goog-api-key`, `?key=` or `Authorization: Bearer`): the 403 the API
/// answers it with. `None` for any other request.
pub fn refusal(rec: &RecordedRequest) -> Option<MockReply> {
    GeminiCall::of(rec)?;
    let header = |k: &str| {
        rec.headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| !v.trim().is_empty())
    };
    let query = rec.uri.split_once('?').map_or("", |(_, q)| q);
    let key_param = query
        .split('&')
        .any(|kv| kv.strip_prefix("key=").is_some_and(|k| !k.is_empty()));
    if header("x-goog-api-key") || header("authorization") || key_param {
        return None;
    }
    Some(
        GeminiError::new(
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established identity). Please use API \
             Key or other form of API consumer identity to call this API.",
        )
        .reply(),
    )
}

/// The default answer to a Gemini call: `mock reply` for the generate methods (a 400 for a request without
/// `contents`), the estimate for `countTokens`, a 404 for any other method.
pub fn default_reply(rec: &RecordedRequest, call: &GeminiCall) -> MockReply {
    let request = rec.json();
    if call.method == "countTokens" {
        return count_tokens(&request);
    }
    if !call.generates() {
        return GeminiError::new("NOT_FOUND", &format!("Method not found: {}", call.method))
            .reply();
    }
    if request.get("contents").is_none() {
        return GeminiError::new(
            "INVALID_ARGUMENT",
            "* GenerateContentRequest.contents: contents is not specified\n",
        )
        .reply();
    }
    GeminiReply::text("mock reply").render(rec)
}

#[cfg(test)]
#[path = "gemini/tests.rs"]
mod tests;
