//! The summary request, pure: the prompt, the transcript of the messages to summarize (after a previous summary,
//! when there is one), the summary message that replaces them, and the check of what the model wrote.

use crate::config::SummaryConfig;
use crate::message::{is_system, message_text, role};
use crate::upstream::Api;
use serde_json::{json, Value};

/// The shipped prompt (`config/summary_prompt.txt`).
pub const SHIPPED_PROMPT: &str = include_str!("../../config/summary_prompt.txt");
pub use crate::message::SUMMARY_PREFIX;
/// Characters of one message kept in the transcript (long tool results are cut: they stay recallable).
const MAX_MESSAGE_CHARS: usize = 2_000;
/// Characters of the whole transcript (the newest part is kept when longer).
const MAX_TRANSCRIPT_CHARS: usize = 200_000;

/// The prompt: `[summary] prompt_file` when set, else the shipped one.
pub fn load_prompt(cfg: &SummaryConfig) -> Result<String, String> {
    match &cfg.prompt_file {
        None => Ok(SHIPPED_PROMPT.to_string()),
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("summary.prompt_file: cannot read {}: {e}", p.display()))
            .and_then(|t| match t.trim() {
                "" => Err(format!("summary.prompt_file: {} is empty", p.display())),
                t => Ok(t.to_string()),
            }),
    }
}

/// The messages `from..to` as numbered lines (system messages left out: they are always kept), after the
/// previous summary when given. Tool calls keep their ids, so the summary can name them.
pub fn transcript(messages: &[Value], from: usize, to: usize, previous: Option<&str>) -> String {
    let mut lines = Vec::new();
    for (i, m) in messages.iter().enumerate().take(to).skip(from) {
        if is_system(m) {
            continue;
        }
        let mut text = cut(&content_text(m));
        if role(m) == "tool" {
            let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("?");
            lines.push(format!("[{i}] tool result of call {id}: {text}"));
            continue;
        }
        for c in m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let s = |p: &str| c.pointer(p).and_then(Value::as_str).unwrap_or("");
            text.push_str(&format!(
                "\n    -> call {} {}({})",
                s("/id"),
                s("/function/name"),
                cut(s("/function/arguments"))
            ));
        }
        lines.push(format!("[{i}] {}: {text}", role(m)));
    }
    let mut body = lines.join("\n");
    if body.len() > MAX_TRANSCRIPT_CHARS {
        let mut start = body.len() - MAX_TRANSCRIPT_CHARS;
        while !body.is_char_boundary(start) {
            start += 1;
        }
        body = format!("…(older messages omitted)\n{}", &body[start..]);
    }
    match previous {
        Some(p) => format!("Previous summary:\n{p}\n\nNew messages:\n{body}"),
        None => format!("Messages:\n{body}"),
    }
}

fn content_text(m: &Value) -> String {
    let mut only_content = m.clone();
    if let Some(o) = only_content.as_object_mut() {
        o.remove("tool_calls");
    }
    message_text(&only_content)
}

fn cut(s: &str) -> String {
    if s.chars().count() <= MAX_MESSAGE_CHARS {
        return s.to_string();
    }
    let kept: String = s.chars().take(MAX_MESSAGE_CHARS).collect();
    format!("{kept}…[cut]")
}

/// The `anthropic-version` of summary requests to the Anthropic Messages API.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The API of a summary model: Anthropic Messages for a Claude model (`claude-*`), the Gemini API for a Gemini
/// model (`gemini-*`), chat completions otherwise.
pub fn api_of(model: &str) -> Api {
    if model.starts_with("claude") {
        Api::Anthropic
    } else if model.starts_with("gemini") {
        Api::Gemini
    } else {
        Api::OpenAi
    }
}

/// The prompt with the length the summary must keep under: `tokens` (about three quarters as many words).
pub fn with_length(prompt: &str, tokens: u64) -> String {
    format!(
        "{}\n\nLength limit: at most {tokens} tokens (about {} words).",
        prompt.trim_end(),
        tokens * 3 / 4
    )
}

/// Where summary requests for `model` go, below the API's base URL.
pub fn upstream_path(api: Api, model: &str) -> String {
    match api {
        Api::OpenAi => "chat/completions".into(),
        Api::Anthropic => "messages".into(),
        Api::Gemini => format!("v1beta/models/{model}:generateContent"),
    }
}

/// The body of the summary request: a chat completion, or a Messages request (no thinking, no context
/// management: a plain, deterministic text answer).
pub fn request_body(
    api: Api,
    model: &str,
    prompt: &str,
    transcript: &str,
    max_tokens: u64,
) -> Value {
    match api {
        Api::OpenAi => json!({
            "model": model,
            "messages": [
                {"role": "system", "content": prompt},
                {"role": "user", "content": transcript},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": false,
        }),
        Api::Anthropic => json!({
            "model": model,
            "system": prompt,
            "messages": [{"role": "user", "content": transcript}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": false,
        }),
        // the model is in the path
        Api::Gemini => json!({
            "systemInstruction": {"parts": [{"text": prompt}]},
            "contents": [{"role": "user", "parts": [{"text": transcript}]}],
            "generationConfig": {"maxOutputTokens": max_tokens, "temperature": 0},
        }),
    }
}

/// The text of the answer to a summary request (`None` when it is not an answer of `api`): a chat completion's
/// message content, a Messages answer's text blocks, or a Gemini answer's text parts (not its thoughts).
pub fn answer_text(api: Api, answer: &Value) -> Option<String> {
    match api {
        Api::OpenAi => {
            let message = answer.pointer("/choices/0/message")?;
            Some(
                message
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            )
        }
        Api::Anthropic => {
            let blocks = answer.get("content")?.as_array()?;
            let texts: Vec<&str> = blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            Some(texts.join("\n"))
        }
        Api::Gemini => {
            let parts = answer.pointer("/candidates/0/content/parts")?.as_array()?;
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("thought").and_then(Value::as_bool) != Some(true))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            Some(texts.concat())
        }
    }
}

/// The text answering the summary request, checked: not empty, at most `max_tokens` (counted by `count`).
pub fn summary_text(
    text: &str,
    max_tokens: u64,
    count: impl Fn(&str) -> u64,
) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty summary".into());
    }
    let tokens = count(text);
    if tokens > max_tokens {
        return Err(format!(
            "summary of {tokens} tokens exceeds summary.max_tokens ({max_tokens})"
        ));
    }
    Ok(text
        .strip_prefix(SUMMARY_PREFIX)
        .unwrap_or(text)
        .to_string())
}

/// The system message that replaces the summarized messages.
pub fn summary_message(text: &str) -> Value {
    json!({"role": "system", "content": format!("{SUMMARY_PREFIX}{text}")})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history() -> Vec<Value> {
        vec![
            json!({"role":"system","content":"sys"}),
            json!({"role":"user","content":"find the bug"}),
            json!({"role":"assistant","content":"Looking.","tool_calls":[{"id":"call_7","type":"function","function":{"name":"grep","arguments":"{\"q\":\"panic\"}"}}]}),
            json!({"role":"tool","tool_call_id":"call_7","content":"src/a.rs:3: panic!()"}),
            json!({"role":"assistant","content":"Found it in src/a.rs."}),
        ]
    }

    #[test]
    fn the_prompt_states_the_length_limit() {
        let p = with_length("Summarize.\n", 400);
        assert_eq!(
            p,
            "Summarize.\n\nLength limit: at most 400 tokens (about 300 words)."
        );
    }

    #[test]
    fn transcript_numbers_messages_and_keeps_call_ids() {
        let t = transcript(&history(), 0, 5, None);
        assert!(t.starts_with("Messages:\n[1] user: find the bug"));
        assert!(t.contains("-> call call_7 grep({\"q\":\"panic\"})"));
        assert!(t.contains("[3] tool result of call call_7: src/a.rs:3: panic!()"));
        assert!(
            !t.contains("sys"),
            "system messages are kept, not summarized"
        );
        let inc = transcript(
            &history(),
            3,
            5,
            Some("Earlier: user wants a fix (call_1)."),
        );
        assert!(inc.starts_with(
            "Previous summary:\nEarlier: user wants a fix (call_1).\n\nNew messages:\n[3]"
        ));
        assert!(!inc.contains("[1] user"));
    }

    #[test]
    fn long_messages_and_transcripts_are_cut() {
        let big = vec![json!({"role":"tool","tool_call_id":"c","content":"x".repeat(10_000)})];
        let t = transcript(&big, 0, 1, None);
        assert!(t.len() < 2_100 && t.ends_with("…[cut]"));
        let many: Vec<Value> = (0..200)
            .map(|i| json!({"role":"user","content":format!("{i} {}", "y".repeat(1_500))}))
            .collect();
        let t = transcript(&many, 0, 200, None);
        assert!(t.len() <= MAX_TRANSCRIPT_CHARS + 100 && t.contains("[199] user"));
    }

    #[test]
    fn answers_are_checked() {
        let chat = json!({"choices":[{"message":{"content":"  Goals: fix.  "}}]});
        let ok = answer_text(Api::OpenAi, &chat).unwrap();
        assert_eq!(
            summary_text(&ok, 100, |s| s.len() as u64).unwrap(),
            "Goals: fix."
        );
        let claude = json!({"type":"message","content":[{"type":"thinking","thinking":"x","signature":"s"},
            {"type":"text","text":"  Goals: fix.  "}]});
        assert_eq!(answer_text(Api::Anthropic, &claude).unwrap(), ok);
        assert_eq!(answer_text(Api::Anthropic, &chat), None);
        assert_eq!(answer_text(Api::OpenAi, &claude), None);
        assert!(summary_text("  ", 100, |_| 0).is_err());
        assert_eq!(answer_text(Api::OpenAi, &json!({"error":{}})), None);
        let gemini = json!({"candidates":[{"content":{"role":"model","parts":[
            {"text":"thinking","thought":true},{"text":"a "},{"text":"summary"}]}}]});
        assert_eq!(answer_text(Api::Gemini, &gemini).unwrap(), "a summary");
        assert_eq!(answer_text(Api::Gemini, &chat), None);
        assert_eq!(api_of("gemini-2.5-flash"), Api::Gemini);
        assert!(summary_text(&ok, 5, |s| s.len() as u64)
            .unwrap_err()
            .contains("max_tokens"));
        assert_eq!(
            summary_message("S")["content"],
            "Summary of the earlier conversation: S"
        );
        let body = request_body(Api::OpenAi, "m", "P", "T", 300);
        assert_eq!(body["max_tokens"], 300);
        assert_eq!(body["messages"][1]["content"], "T");
        let body = request_body(
            api_of("claude-haiku-4-5"),
            "claude-haiku-4-5",
            "P",
            "T",
            300,
        );
        assert_eq!(
            (&body["system"], &body["messages"][0]["content"]),
            (&json!("P"), &json!("T"))
        );
        assert!(body.get("thinking").is_none() && body.get("context_management").is_none());
        assert!(load_prompt(&SummaryConfig::default())
            .unwrap()
            .contains("call id"));
    }
}
