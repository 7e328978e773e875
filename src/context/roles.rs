//! Strict role order in a rewrite (chat completions and Responses; Anthropic keeps its own layout): ctxgate never
//! adds a `system` message after the first non-system one, nor makes two user or two assistant messages follow each
//! other that the client did not send in a row. The summary goes where the messages it covers were, as an
//! assistant message (merged into the next assistant message when one with text follows); a gap the cuts opened between two
//! messages of one role gets a short ctxgate message of the other role; and the recall note rides at the end of the
//! last message ctxgate wrote before the cut (see [`arrange`]).

use super::tokens::{Encoding, TokenCounter};
use crate::message::{field, message_text, role, tool_calls, Source};
use serde_json::{json, Value};
use std::borrow::Cow;

/// The text of the message ctxgate puts between two messages of one role that the cuts brought together.
pub const GAP_TEXT: &str = "[ctxgate] Earlier messages were left out here to save space.";

/// Where the recall note goes after [`arrange`], and what the arrangement cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arranged {
    /// The message the note is appended to (index into the arranged messages); `None` when there is none but
    /// system messages and the client's newest (the note is then left out).
    pub note_in: Option<usize>,
    /// One past the last message before the cut (where a notice of ctxgate's own begins, when there is one).
    pub note_at: usize,
    /// Tokens of the arranged messages minus those of the messages given.
    pub delta: i64,
}

/// Rearranges a rewrite (`messages`, with `sources`; the client's messages are `originals`) into strict role
/// order. `summary_at`: the index of the summary message (neutral `system`, added by ctxgate) when there is one;
/// `note_at`: one past the last message before the cut, and whether a note will need a carrier. Deterministic.
pub fn arrange(
    messages: &mut Vec<Cow<'_, Value>>,
    sources: &mut Vec<Source>,
    originals: &[Value],
    summary_at: Option<usize>,
    (note_at, needs_note): (usize, bool),
    (counter, enc): (&TokenCounter, Encoding),
) -> Arranged {
    let tokens = |m: &Value| counter.message_tokens(enc, m) as i64;
    let mut delta = 0i64;
    // Whether each message is before the cut.
    let mut before: Vec<bool> = (0..messages.len()).map(|k| k < note_at).collect();
    if let Some(s) = summary_at.filter(|&s| s < messages.len()) {
        let text = message_text(&messages[s]);
        delta -= tokens(&messages[s]);
        // Never into the client's newest message, which is sent as it came, nor into calls without text (servers
        // that want a message's content or its calls, not both: a gap's message then keeps the order).
        let newest_message = Source::Client(originals.len().saturating_sub(1));
        let merge = messages.get(s + 1).is_some_and(|n| {
            role(n) == "assistant"
                && !matches!(sources[s + 1], Source::Added)
                && sources[s + 1] != newest_message
                && (tool_calls(n).is_empty() || !message_text(&without_calls(n)).is_empty())
        });
        if merge {
            delta -= tokens(&messages[s + 1]);
            let merged = with_text_first(&messages[s + 1], &text);
            delta += tokens(&merged);
            messages[s + 1] = Cow::Owned(merged);
            messages.remove(s);
            sources.remove(s);
            let b = before.remove(s);
            before[s] |= b;
        } else {
            let own = json!({"role": "assistant", "content": text});
            delta += tokens(&own);
            messages[s] = Cow::Owned(own);
        }
    }
    // Gaps: two messages of one role the client did not send in a row (system messages between them aside: in
    // Responses they may stand for items that are not messages) get a ctxgate message between them.
    let is_sys = |m: &Value| crate::message::is_system(m);
    let mut k = 1;
    while k < messages.len() {
        let Some(p) = (0..k).rev().find(|&p| !is_sys(&messages[p])) else {
            k += 1;
            continue;
        };
        let (a, b) = (role(&messages[p]), role(&messages[k]));
        let adjacent = matches!((sources[p], sources[k]), (Source::Client(x), Source::Client(y))
            if x < y && originals.get(x + 1..y).is_some_and(|between| between.iter().all(is_sys)));
        if a == b && matches!(a, "user" | "assistant") && !adjacent {
            let other = if a == "user" { "assistant" } else { "user" };
            let gap = json!({"role": other, "content": GAP_TEXT});
            delta += tokens(&gap);
            messages.insert(k, Cow::Owned(gap));
            sources.insert(k, Source::Added);
            before.insert(k, before[k - 1]);
            k += 1;
        }
        k += 1;
    }
    let note_at = before.iter().take_while(|b| **b).count();
    let written = |k: usize| match sources[k] {
        Source::Added => true,
        Source::Client(i) => {
            matches!(messages[k], Cow::Owned(_)) && originals.get(i) != Some(messages[k].as_ref())
        }
    };
    // Any message but a system one, the task and the client's newest (both sent as they came: the task pinned at
    // the head of every request keeps the prompt cache, and the newest is what the model answers).
    let newest = Source::Client(originals.len().saturating_sub(1));
    let task = super::task::task_index(originals).map(Source::Client);
    let speaks = |k: usize| {
        !crate::message::is_system(&messages[k]) && sources[k] != newest && Some(sources[k]) != task
    };
    let mut carrier = (0..note_at).rev().find(|&k| written(k) && speaks(k));
    if carrier.is_none() && needs_note {
        // Nothing of ctxgate's before the cut (only left-out messages): a notice of its own at the cut, one
        // message (or two) in the roles that keep the order, the note riding in the last.
        let prev = (0..note_at)
            .rev()
            .map(|k| role(&messages[k]))
            .find(|r| !matches!(*r, "system" | "developer"));
        let next = (note_at..messages.len())
            .map(|k| role(&messages[k]))
            .find(|r| !matches!(*r, "system" | "developer"));
        // After a user message an assistant one, after an assistant's text a user one; after a tool result (or
        // nothing) whichever differs from the message that follows.
        let first = match prev {
            Some("user") => "assistant",
            Some("assistant") => "user",
            _ if next == Some("user") => "assistant",
            _ => "user",
        };
        let mut notice = vec![first];
        if next == Some(first) {
            notice.push(if first == "user" { "assistant" } else { "user" });
        }
        for (x, r) in notice.iter().enumerate() {
            let m = json!({"role": r, "content": GAP_TEXT});
            delta += tokens(&m);
            messages.insert(note_at + x, Cow::Owned(m));
            sources.insert(note_at + x, Source::Added);
        }
        // (`note_at` stays where the notice begins: it moves with the cut)
        carrier = Some(note_at + notice.len() - 1);
    }
    // A note on a message with tool calls goes to the last of its results instead (closer to ctxgate's voice),
    // unless that is the client's newest message.
    let note_in = carrier.map(|k| {
        if tool_calls(&messages[k]).is_empty() {
            return k;
        }
        let mut last = k;
        while messages.get(last + 1).is_some_and(|m| role(m) == "tool") {
            last += 1;
        }
        if sources[last] == newest {
            k
        } else {
            last
        }
    });
    Arranged {
        note_in,
        note_at,
        delta,
    }
}

/// `m` without its tool calls.
fn without_calls(m: &Value) -> Value {
    let mut out = m.clone();
    if let Some(o) = out.as_object_mut() {
        o.remove("tool_calls");
    }
    out
}

/// `m` with `text` put before its text: string content, null, or a text part first.
fn with_text_first(m: &Value, text: &str) -> Value {
    let mut out = m.clone();
    let content = match field(m, "content") {
        Some(Value::String(s)) if !s.is_empty() => Value::String(format!("{text}\n\n{s}")),
        Some(Value::Array(parts)) if !parts.is_empty() => {
            let mut p = Vec::with_capacity(parts.len() + 1);
            p.push(json!({"type": "text", "text": text}));
            p.extend(parts.iter().cloned());
            Value::Array(p)
        }
        _ => Value::String(text.to_string()),
    };
    if let Some(o) = out.as_object_mut() {
        o.insert("content".into(), content);
    }
    out
}

/// `m` with `text` appended to its text: string content, null, or a text part last.
pub fn with_text_last(m: &Value, text: &str) -> Value {
    let mut out = m.clone();
    let content = match field(m, "content") {
        Some(Value::String(s)) if !s.is_empty() => Value::String(format!("{s}\n\n{text}")),
        Some(Value::Array(parts)) if !parts.is_empty() => {
            let mut p = parts.clone();
            p.push(json!({"type": "text", "text": text}));
            Value::Array(p)
        }
        _ => Value::String(text.to_string()),
    };
    if let Some(o) = out.as_object_mut() {
        o.insert("content".into(), content);
    }
    out
}

/// Checks the role rule on a rewrite of a chat conversation: `sent` (what goes upstream) has no `system` or
/// `developer` message after its first other message that is not one the client sent after its own first other
/// message, and no two user or two assistant messages in a row that the client did not send in a row (a message
/// sent stands for the client's when it is equal to it or begins with its first 40 characters: cleared, cut or
/// given a note).
pub fn check_roles(client: &[Value], sent: &[Value]) -> Result<(), String> {
    let is_sys = |m: &Value| matches!(role(m), "system" | "developer");
    let first = |x: &[Value]| x.iter().position(|m| !is_sys(m)).unwrap_or(x.len());
    let client_late: Vec<&Value> = client[first(client)..]
        .iter()
        .filter(|m| is_sys(m))
        .collect();
    if let Some(i) = (first(sent)..sent.len())
        .find(|&i| is_sys(&sent[i]) && !client_late.iter().any(|c| **c == sent[i]))
    {
        return Err(format!(
            "message {i}: a {} message after the conversation began that the client did not send there",
            role(&sent[i])
        ));
    }
    for i in 1..sent.len() {
        let (a, b) = (&sent[i - 1], &sent[i]);
        if role(a) != role(b) || !matches!(role(a), "user" | "assistant") {
            continue;
        }
        let sent_so = client
            .windows(2)
            .any(|w| stands_for(&w[0], a) && stands_for(&w[1], b));
        if !sent_so {
            return Err(format!(
                "messages {} and {i}: two {} messages in a row that the client did not send in a row",
                i - 1,
                role(a)
            ));
        }
    }
    Ok(())
}

/// Whether `sent` stands for the client's message `orig`: equal, or of the same role with the same tool calls'
/// ids and text beginning as `orig`'s does (its first 40 characters).
fn stands_for(orig: &Value, sent: &Value) -> bool {
    if orig == sent {
        return true;
    }
    if role(orig) != role(sent) {
        return false;
    }
    let ids = |m: &Value| -> Vec<String> {
        tool_calls(m)
            .iter()
            .filter_map(|c| field(c, "id").and_then(Value::as_str).map(str::to_owned))
            .collect()
    };
    let text = |m: &Value| match field(m, "content") {
        Some(Value::String(s)) => s.clone(),
        Some(c @ Value::Array(_)) => message_text(&json!({ "content": c })),
        _ => String::new(),
    };
    let head: String = text(orig).chars().take(40).collect();
    ids(orig) == ids(sent) && text(sent).starts_with(&head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arranged(
        msgs: &[Value],
        sources: &[Source],
        originals: &[Value],
        summary_at: Option<usize>,
        note_at: usize,
    ) -> (Vec<Value>, Vec<Source>, Arranged) {
        let mut m: Vec<Cow<'_, Value>> = msgs.iter().cloned().map(Cow::Owned).collect();
        for (k, s) in sources.iter().enumerate() {
            if let Source::Client(i) = s {
                if originals[*i] == msgs[k] {
                    m[k] = Cow::Borrowed(&originals[*i]);
                }
            }
        }
        let mut s = sources.to_vec();
        let counter = TokenCounter::new();
        let a = arrange(
            &mut m,
            &mut s,
            originals,
            summary_at,
            (note_at, true),
            (&counter, Encoding::O200k),
        );
        let out: Vec<Value> = m.into_iter().map(Cow::into_owned).collect();
        let before = counter.request_tokens(Encoding::O200k, msgs, None) as i64;
        let after = counter.request_tokens(Encoding::O200k, &out, None) as i64;
        assert_eq!(after - before, a.delta, "the delta is exact");
        (out, s, a)
    }

    fn u(t: &str) -> Value {
        json!({"role":"user","content":t})
    }
    fn a(t: &str) -> Value {
        json!({"role":"assistant","content":t})
    }

    #[test]
    fn a_summary_becomes_an_assistant_message_or_joins_the_next_one() {
        let client = vec![
            json!({"role":"system","content":"s"}),
            u("task"),
            a("x"),
            u("more"),
            json!({"role":"assistant","content":"checking","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}),
            json!({"role":"tool","tool_call_id":"c","content":"r"}),
            u("newest"),
        ];
        let summary = json!({"role":"system","content":"Summary: did x"});
        // followed by a user message: an assistant message of its own, and the note at its end
        let msgs = vec![
            client[0].clone(),
            client[1].clone(),
            summary.clone(),
            client[3].clone(),
        ];
        let src = [
            Source::Client(0),
            Source::Client(1),
            Source::Added,
            Source::Client(3),
        ];
        let (out, _, ar) = arranged(&msgs, &src, &client, Some(2), 3);
        assert_eq!(out[2], a("Summary: did x"));
        assert_eq!(ar.note_in, Some(2));
        assert_eq!(check_roles(&client, &out), Ok(()));
        assert!(
            check_roles(&client, &msgs).is_err(),
            "the old layout breaks the rule"
        );
        // followed by an assistant message: merged into it; the note goes to the call's result
        let msgs = vec![
            client[0].clone(),
            client[1].clone(),
            summary,
            client[4].clone(),
            client[5].clone(),
            client[6].clone(),
        ];
        let src = [
            Source::Client(0),
            Source::Client(1),
            Source::Added,
            Source::Client(4),
            Source::Client(5),
            Source::Client(6),
        ];
        let (out, s, ar) = arranged(&msgs, &src, &client, Some(2), 3);
        assert_eq!(out.len(), 5);
        assert_eq!(out[2]["content"], "Summary: did x\n\nchecking");
        assert_eq!(out[2]["tool_calls"], client[4]["tool_calls"]);
        assert_eq!(s[2], Source::Client(4));
        assert_eq!(
            ar.note_in,
            Some(3),
            "a message with calls passes the note to its result"
        );
        assert_eq!(check_roles(&client, &out), Ok(()));
        // calls without text are not given any: the summary stands alone, and a gap's message keeps the order
        let mut bare = client.clone();
        bare[4]["content"] = Value::Null;
        let mut msgs = msgs;
        msgs[3] = bare[4].clone();
        let (out, _, _) = arranged(&msgs, &src, &bare, Some(2), 3);
        assert_eq!(out[2], a("Summary: did x"));
        assert_eq!(out[3], u(GAP_TEXT));
        assert_eq!(out[4], bare[4]);
        assert_eq!(check_roles(&bare, &out), Ok(()));
    }

    #[test]
    fn gaps_get_a_message_of_the_other_role_unless_the_client_sent_them_so() {
        let client = vec![u("task"), a("r1"), u("q2"), a("r2"), u("q3"), u("q3b")];
        // the first loop's reply and the second loop left out: task, q3, q3b
        let msgs = vec![client[0].clone(), client[4].clone(), client[5].clone()];
        let src = [Source::Client(0), Source::Client(4), Source::Client(5)];
        let (out, _, ar) = arranged(&msgs, &src, &client, None, 1);
        assert_eq!(
            out.len(),
            4,
            "one gap: q3 and q3b came in a row from the client"
        );
        assert_eq!(out[1], a(GAP_TEXT));
        assert_eq!(
            ar.note_in,
            Some(1),
            "the gap is the last message ctxgate wrote before the cut"
        );
        assert_eq!(ar.note_at, 2);
        assert_eq!(check_roles(&client, &out), Ok(()));
        assert!(check_roles(&client, &msgs).is_err());
    }

    #[test]
    fn the_note_rides_in_the_last_placeholder_or_falls_back_to_the_message_at_the_cut() {
        let client = vec![
            u("task"),
            json!({"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}),
            json!({"role":"tool","tool_call_id":"c","content":"long result"}),
            u("next"),
        ];
        let mut msgs = client.clone();
        msgs[2] = json!({"role":"tool","tool_call_id":"c","content":"[ctxgate] cleared"});
        let src: Vec<Source> = (0..4).map(Source::Client).collect();
        let (_, _, ar) = arranged(&msgs, &src, &client, None, 3);
        assert_eq!(ar.note_in, Some(2));
        // nothing written before the cut (only left-out messages): a notice of its own at the cut, in the roles
        // that keep the order
        let (out, _, ar) = arranged(&client, &src, &client, None, 3);
        assert_eq!(ar.note_in, Some(3));
        assert_eq!(
            out[3],
            a(GAP_TEXT),
            "between a result and a user message: an assistant message"
        );
        assert_eq!(check_roles(&client, &out), Ok(()));
        let (out, _, ar) = arranged(&client, &src, &client, None, 1);
        assert_eq!(
            ar.note_in,
            Some(2),
            "after the task, before calls: two messages, the note in the second"
        );
        assert_eq!((out[1].clone(), out[2].clone()), (a(GAP_TEXT), u(GAP_TEXT)));
        assert_eq!(ar.note_at, 1, "the notice begins at the cut");
        assert_eq!(check_roles(&client, &out), Ok(()));
    }

    #[test]
    fn appending_keeps_the_text_and_adds_the_note() {
        assert_eq!(with_text_last(&u("a"), "n")["content"], "a\n\nn");
        let parts =
            json!({"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"a"}]});
        assert_eq!(with_text_last(&parts, "n")["content"][1]["text"], "n");
        let null = json!({"role":"assistant","content":null});
        assert_eq!(with_text_last(&null, "n")["content"], "n");
    }

    #[test]
    fn late_system_messages_are_refused_unless_the_client_sent_them() {
        let client = vec![
            json!({"role":"system","content":"s"}),
            u("t"),
            a("r"),
            u("q"),
        ];
        let mut sent = client.clone();
        sent.insert(3, json!({"role":"system","content":"note"}));
        assert!(check_roles(&client, &sent).is_err());
        let mut own = client.clone();
        own.insert(2, json!({"role":"system","content":"mid"}));
        assert_eq!(check_roles(&own, &own), Ok(()));
    }
}
