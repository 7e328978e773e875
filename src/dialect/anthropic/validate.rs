//! What the Messages API requires of a conversation, and what a rewrite of a client's body must keep: the checks
//! the property tests run on every rewritten request (and that a caller may run before sending one).

use crate::context::shape::TRUNCATED_MARKER;
use crate::dialect::shared::{check_fields, conversation};
use serde_json::{Map, Value};
use std::collections::HashSet;

/// Most `cache_control` markers a request may carry.
pub const MAX_CACHE_MARKERS: usize = 4;

fn block_type(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or("")
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or("")
}

fn blocks(m: &Value) -> &[Value] {
    m.get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Ids of the blocks of type `kind` in `m`, under `key`, in order.
fn ids<'v>(m: &'v Value, kind: &str, key: &str) -> Vec<&'v str> {
    blocks(m)
        .iter()
        .filter(|b| block_type(b) == kind)
        .map(|b| b.get(key).and_then(Value::as_str).unwrap_or(""))
        .collect()
}

/// Checks a message list as the Messages API does (research doc A.5): roles `user`/`assistant`/`system`, content a
/// non-empty string or a non-empty array of typed blocks (text blocks non-empty, a `tool_use` input an object), the
/// first non-system message a
/// user message; each assistant's `tool_use` ids unique in the conversation and answered, each exactly once, by
/// `tool_result` blocks of the very next message, a user message; every `tool_result` answering a `tool_use` of the
/// message just before; `tool_result` blocks before any other block of their message.
pub fn check_sequence(messages: &[Value]) -> Result<(), String> {
    if messages.is_empty() {
        return Err("there are no messages".into());
    }
    let mut used: HashSet<&str> = HashSet::new();
    let mut opened = false;
    for (i, m) in messages.iter().enumerate() {
        let r = role(m);
        if !matches!(r, "user" | "assistant" | "system") {
            return Err(format!("messages.{i}: invalid role {r:?}"));
        }
        check_content(i, m)?;
        if r != "system" && !opened {
            opened = true;
            if r != "user" {
                return Err(format!(
                    "messages.{i}: the first message must be a user message"
                ));
            }
        }
        let uses = ids(m, "tool_use", "id");
        let results = ids(m, "tool_result", "tool_use_id");
        if r != "assistant" && !uses.is_empty() {
            return Err(format!("messages.{i}: tool_use in a {r} message"));
        }
        if r != "user" && !results.is_empty() {
            return Err(format!("messages.{i}: tool_result in a {r} message"));
        }
        for id in &uses {
            if !used.insert(id) {
                return Err(format!("messages.{i}: tool_use id {id:?} is not unique"));
            }
        }
        let mut after_other = false;
        for b in blocks(m) {
            let result = block_type(b) == "tool_result";
            if result && after_other {
                return Err(format!("messages.{i}: tool_result blocks must come first"));
            }
            after_other |= !result;
        }
        if !uses.is_empty() {
            let next = messages.get(i + 1).filter(|n| role(n) == "user");
            let answered = next.map(|n| ids(n, "tool_result", "tool_use_id"));
            let answered: HashSet<&str> = answered.unwrap_or_default().into_iter().collect();
            if let Some(id) = uses.iter().find(|id| !answered.contains(*id)) {
                return Err(format!(
                    "messages.{i}: tool_use id {id:?} has no tool_result block immediately after"
                ));
            }
        }
        if !results.is_empty() {
            let prev = i.checked_sub(1).map(|p| &messages[p]);
            let calls: Vec<&str> = prev
                .filter(|p| role(p) == "assistant")
                .map(|p| ids(p, "tool_use", "id"))
                .unwrap_or_default();
            let mut seen = HashSet::new();
            for id in &results {
                if !calls.contains(id) {
                    return Err(format!(
                        "messages.{i}: tool_result {id:?} has no tool_use in the previous message"
                    ));
                }
                if !seen.insert(*id) {
                    return Err(format!("messages.{i}: tool_use {id:?} answered twice"));
                }
            }
        }
    }
    Ok(())
}

fn check_content(i: usize, m: &Value) -> Result<(), String> {
    match m.get("content") {
        Some(Value::String(s)) if !s.is_empty() => Ok(()),
        Some(Value::Array(bs)) if !bs.is_empty() => {
            for (b, block) in bs.iter().enumerate() {
                if !block.get("type").is_some_and(Value::is_string) {
                    return Err(format!("messages.{i}.content.{b}: a block without a type"));
                }
                if block_type(block) == "text"
                    && block
                        .get("text")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                {
                    return Err(format!("messages.{i}.content.{b}: empty text block"));
                }
                if block_type(block) == "tool_use"
                    && !block.get("input").is_some_and(Value::is_object)
                {
                    return Err(format!(
                        "messages.{i}.content.{b}: tool_use input is not an object"
                    ));
                }
            }
            Ok(())
        }
        _ => Err(format!(
            "messages.{i}: content is empty or not a string or array"
        )),
    }
}

/// Checks that `sent`, the body sent upstream, keeps what must not change of `client`, the client's body: every
/// top-level field but `messages` and `tools` identical and in the same order (`system`, `context_management`
/// among them); the client's `tools` an identical prefix of the sent ones (ctxgate may only append its own); at
/// most [`MAX_CACHE_MARKERS`] `cache_control` markers, each on a client block that carries it as sent, or on the
/// block that replaced a marked client block of the same role, type (and tool use: a `tool_use` whose input was
/// cleared keeps its own call's marker); every thinking or redacted
/// thinking block sent byte-identical to one of the client's; an assistant message sent (as it was or rebuilt)
/// with exactly the thinking blocks of the client's message it comes from; the thinking blocks of the client's last assistant
/// message all sent, in order in one message, unless that message went as a whole and the conversation does not end
/// in its tool loop; every mid-conversation `system` message kept in order; the client's newest message kept.
pub fn check_rewrite(client: &Value, sent: &Value) -> Result<(), String> {
    let (Some(c), Some(s)) = (client.as_object(), sent.as_object()) else {
        return Err("both bodies must be JSON objects".into());
    };
    check_fields(c, s, "messages")?;
    let (cm, sm) = (conversation(c, "messages"), conversation(s, "messages"));
    check_markers(c, s, cm, sm)?;
    check_thinking(cm, sm)?;
    let mut rest = sm.iter();
    for (i, m) in cm.iter().enumerate().filter(|(_, m)| role(m) == "system") {
        if !rest.any(|x| x == m) {
            return Err(format!(
                "the client's system message messages.{i} is missing or changed"
            ));
        }
    }
    if cm.last() != sm.last() {
        return Err("the client's newest message is not the last message sent".into());
    }
    Ok(())
}

/// The marked blocks of messages with their message's role (tool_result contents included).
fn marked(messages: &[Value]) -> Vec<(&str, &Value)> {
    let mut out = Vec::new();
    for m in messages {
        for b in blocks(m) {
            if b.get("cache_control").is_some() {
                out.push((role(m), b));
            }
            if let Some(inner) = b.get("content").and_then(Value::as_array) {
                out.extend(
                    inner
                        .iter()
                        .filter(|x| x.get("cache_control").is_some())
                        .map(|x| (role(m), x)),
                );
            }
        }
    }
    out
}

fn count_outside(o: &Map<String, Value>) -> usize {
    let list = |k: &str| {
        o.get(k)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    };
    let marked = |v: &&Value| v.get("cache_control").is_some();
    list("system").iter().filter(marked).count() + list("tools").iter().filter(marked).count()
}

fn check_markers(
    c: &Map<String, Value>,
    s: &Map<String, Value>,
    cm: &[Value],
    sm: &[Value],
) -> Result<(), String> {
    let (cmk, smk) = (marked(cm), marked(sm));
    let (client_total, sent_total) = (count_outside(c) + cmk.len(), count_outside(s) + smk.len());
    if sent_total > MAX_CACHE_MARKERS && sent_total > client_total {
        return Err(format!(
            "{sent_total} cache_control markers sent (at most {MAX_CACHE_MARKERS})"
        ));
    }
    let mut free: Vec<Option<(&str, &Value)>> = cmk.into_iter().map(Some).collect();
    let mut rewritten = Vec::new();
    for (r, b) in smk {
        match free
            .iter_mut()
            .find(|f| f.is_some_and(|(fr, fb)| fr == r && fb == b))
        {
            Some(slot) => *slot = None,
            None => rewritten.push((r, b)),
        }
    }
    for (r, b) in rewritten {
        let same_place = |(fr, fb): (&str, &Value)| {
            fr == r
                && block_type(fb) == block_type(b)
                && fb.get("cache_control") == b.get("cache_control")
                && fb.get("tool_use_id") == b.get("tool_use_id")
                && (block_type(b) != "tool_use" || fb.get("id") == b.get("id"))
        };
        match free.iter_mut().find(|f| f.is_some_and(same_place)) {
            Some(slot) => *slot = None,
            None => return Err(format!("a cache_control marker was added or moved: {b}")),
        }
    }
    Ok(())
}

fn is_thinking(b: &Value) -> bool {
    matches!(block_type(b), "thinking" | "redacted_thinking")
}

fn check_thinking(cm: &[Value], sm: &[Value]) -> Result<(), String> {
    let client: HashSet<String> = cm
        .iter()
        .flat_map(blocks)
        .filter(|b| is_thinking(b))
        .map(Value::to_string)
        .collect();
    for (i, m) in sm.iter().enumerate() {
        if blocks(m)
            .iter()
            .any(|b| is_thinking(b) && !client.contains(&b.to_string()))
        {
            return Err(format!(
                "messages.{i}: a thinking block not sent by the client as it is"
            ));
        }
    }
    check_whole_turns(cm, sm)?;
    let Some(li) = cm.iter().rposition(|m| role(m) == "assistant") else {
        return Ok(());
    };
    let last: Vec<&Value> = blocks(&cm[li]).iter().filter(|b| is_thinking(b)).collect();
    if last.is_empty() {
        return Ok(());
    }
    let kept = sm.iter().any(|m| {
        let sent: Vec<&Value> = blocks(m).iter().filter(|b| is_thinking(b)).collect();
        role(m) == "assistant" && sent == last
    });
    let any_sent = sm.iter().flat_map(blocks).any(|b| last.contains(&b));
    let in_loop = li + 2 == cm.len() && !ids(&cm[li], "tool_use", "id").is_empty();
    if kept || (!any_sent && !in_loop) {
        Ok(())
    } else {
        Err("the thinking blocks of the client's last assistant message were not all kept".into())
    }
}

fn thinking_of(m: &Value) -> Vec<&Value> {
    blocks(m).iter().filter(|b| is_thinking(b)).collect()
}

/// The text of a message: its string content, or its text blocks joined by newlines.
fn text_of(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            let texts: Vec<&str> = blocks(m)
                .iter()
                .filter(|b| block_type(b) == "text")
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            texts.join("\n")
        }
    }
}

/// Whether sent assistant message `s` is client assistant message `c`, rebuilt: they share a tool use id or a
/// thinking block, or the sent text is the client's text or a cut of it (marked as truncated).
fn derives(s: &Value, c: &Value) -> bool {
    let cb = blocks(c);
    let shared = blocks(s).iter().any(|b| match block_type(b) {
        "tool_use" => cb
            .iter()
            .any(|x| block_type(x) == "tool_use" && x.get("id") == b.get("id")),
        "thinking" | "redacted_thinking" => cb.contains(b),
        _ => false,
    });
    let (st, ct) = (text_of(s), text_of(c));
    shared
        || (!st.is_empty()
            && (st == ct
                || st
                    .strip_suffix(TRUNCATED_MARKER)
                    .is_some_and(|cut| ct.starts_with(cut))))
}

/// Thinking goes only with its whole message: an assistant message sent, as it was or rebuilt, carries exactly
/// the thinking blocks the client's message had, in order.
fn check_whole_turns(cm: &[Value], sm: &[Value]) -> Result<(), String> {
    let mut from = 0;
    for (i, s) in sm
        .iter()
        .enumerate()
        .filter(|(_, m)| role(m) == "assistant")
    {
        let assistants = (from..cm.len()).filter(|&k| role(&cm[k]) == "assistant");
        let found = assistants
            .clone()
            .find(|&k| cm[k] == *s)
            .or_else(|| assistants.clone().find(|&k| derives(s, &cm[k])));
        let Some(k) = found else {
            continue;
        };
        from = k + 1;
        if thinking_of(s) != thinking_of(&cm[k]) {
            return Err(format!(
                "messages.{i}: the thinking blocks of the client's messages.{k} were not kept with it"
            ));
        }
    }
    Ok(())
}
