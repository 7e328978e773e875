//! Planner tests of the third round: strict role order (the summary where its messages were, gaps filled, the
//! recall note inside the last message ctxgate wrote) and the message-count trigger through `decide`.

use super::*;
use crate::config::{Config, RecallConfig};
use crate::context::body::RewrittenBody;
use crate::context::decide::{self, Additions, Decision};
use crate::context::roles::{check_roles, GAP_TEXT};
use crate::dialect::Dialect;
use crate::recall::{Offer, NOTE_PREFIX};

/// The messages a rewrite sends as chat, with the recall note where `decide::render` puts it.
fn sent(
    messages: &[Value],
    window: u64,
    strategy: Rewriting,
    ready: &[(usize, Value)],
) -> Vec<Value> {
    let body = json!({"model": "gpt-4o", "messages": messages});
    let mut cfg = Config::default();
    cfg.context.strategy = strategy;
    let recall = RecallConfig::default();
    let offer = Offer::new(Dialect::Chat, body.as_object().unwrap(), &recall);
    let req = decide_request(
        body.as_object().unwrap(),
        messages,
        window,
        strategy,
        !ready.is_empty(),
    );
    let counter = TokenCounter::new();
    let ready = (!ready.is_empty()).then_some(ready);
    let plan = decide::plan_cuts(&req, ready, &cfg, &offer, &counter);
    let serialise = |b: &RewrittenBody<'_>| b.to_vec();
    match decide::render(&req, plan, (&cfg, &offer), &counter, &serialise).unwrap() {
        Decision::Rewrite(r) => {
            assert!(r.injected, "the recall tools are offered");
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            v["messages"].as_array().unwrap().clone()
        }
        other => panic!("expected a rewrite, got {other:?}"),
    }
}

fn late_systems(m: &[Value]) -> usize {
    let first = m.iter().position(|x| !is_system(x)).unwrap_or(m.len());
    m[first..].iter().filter(|x| is_system(x)).count()
}

#[test]
fn the_note_rides_at_the_end_of_the_last_placeholder() {
    let m = agent_run(20, 300);
    let out = sent(&m, count(&m) * 10 / 9, Rewriting::Prune, &[]);
    assert_eq!(late_systems(&out), 0, "no system message after the task");
    assert_eq!(check_roles(&m, &out), Ok(()));
    check_sequence(&out).unwrap();
    let with_note: Vec<usize> = (0..out.len())
        .filter(|&k| crate::message::message_text(&out[k]).contains(NOTE_PREFIX))
        .collect();
    assert_eq!(with_note.len(), 1, "one note");
    let k = with_note[0];
    assert_eq!(role(&out[k]), "tool");
    assert!(shape::is_placeholder(&out[k]), "inside a placeholder");
    assert!(
        out[k + 1..].iter().all(|x| !shape::is_placeholder(x)),
        "the last one"
    );
    assert_eq!(out.len(), m.len(), "nothing added beside it");
}

#[test]
fn a_summary_takes_the_place_of_its_messages_as_an_assistant_message() {
    // Several finished loops, then a long one: the summary covers the first loops and ends before a user message.
    let m = chat_loops(12, 200);
    let upto = 1 + 4 * 8;
    assert_eq!(role(&m[upto]), "user");
    let ready = vec![(upto, summary_msg(upto))];
    let out = sent(&m, count(&m) * 10 / 9, Rewriting::Summarize, &ready);
    assert_eq!(late_systems(&out), 0);
    assert_eq!(check_roles(&m, &out), Ok(()));
    check_sequence(&out).unwrap();
    let s = out
        .iter()
        .position(|x| crate::message::message_text(x).starts_with(SUMMARY))
        .expect("the summary is sent");
    assert_eq!(role(&out[s]), "assistant");
    assert_eq!(out[s - 1], m[1], "right after the task, which stays whole");
    assert!(
        crate::message::message_text(&out[s]).contains(NOTE_PREFIX)
            || out[s + 1..]
                .iter()
                .any(|x| crate::message::message_text(x).contains(NOTE_PREFIX)),
        "the note rides in the summary or after it"
    );

    // A summary ending inside a run, before a call without text: an assistant message of its own, then a gap's
    // message (the call is not given text: some servers want a message's content or its calls, not both).
    let run = agent_run(30, 200);
    let upto = 2 + 2 * 20;
    assert_eq!(role(&run[upto]), "assistant");
    let ready = vec![(upto, summary_msg(upto))];
    let out = sent(&run, count(&run) * 10 / 9, Rewriting::Summarize, &ready);
    assert_eq!(check_roles(&run, &out), Ok(()));
    check_sequence(&out).unwrap();
    let s = out
        .iter()
        .position(|x| crate::message::message_text(x).starts_with(SUMMARY))
        .expect("the summary is sent");
    assert_eq!(role(&out[s]), "assistant");
    assert_eq!(role(&out[s + 1]), "user");
    assert!(crate::message::message_text(&out[s + 1]).starts_with(GAP_TEXT));
    assert_eq!(out[s + 2], run[upto]);
}

#[test]
fn pruned_loops_that_bring_two_user_messages_together_get_a_gap_message() {
    // The task's loop has a nudge (a user message inside it) and no final reply: pruning it leaves task, nudge.
    let mut m = vec![sys("agent"), user("Fix the bug.")];
    for i in 0..6 {
        let id = format!("n{i}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, 400));
    }
    m.push(user("Please continue working on the task."));
    for l in 0..6 {
        m.push(user(&format!("question {l}")));
        let id = format!("c{l}");
        m.push(calls(std::slice::from_ref(&id)));
        m.push(result(&id, 400));
        m.push(reply(&format!("answer {l}")));
    }
    m.push(user("last"));
    let out = sent(&m, count(&m) * 2 / 3, Rewriting::Prune, &[]);
    assert_eq!(check_roles(&m, &out), Ok(()));
    check_sequence(&out).unwrap();
    assert_eq!(late_systems(&out), 0);
    for w in out.windows(2) {
        assert!(
            !(role(&w[0]) == role(&w[1]) && role(&w[0]) == "user" && !m.windows(2).any(|c| c == w)),
            "two user messages in a row the client did not send so"
        );
    }
    assert!(
        out.iter()
            .any(|x| crate::message::message_text(x).starts_with(GAP_TEXT)),
        "a gap message stands between them"
    );
}

#[test]
fn the_old_layout_is_kept_when_roles_need_not_be_strict() {
    let m = agent_run(20, 300);
    let mut i = input(&m, count(&m) * 10 / 9);
    i.strict_roles = false;
    let Plan::Rewrite(r) = run_with(&i, &ContextConfig::default(), &PruneConfig::default()) else {
        panic!("expected a rewrite")
    };
    assert_eq!(
        r.note_in, None,
        "the note is a message of its own (Anthropic's layout)"
    );
}

/// Additions that take `reserve` tokens and add nothing.
struct Reserve(u64);

impl Additions for Reserve {
    fn tool_name(&self) -> Option<&str> {
        None
    }
    fn reserve(&self, _: usize) -> u64 {
        self.0
    }
    fn add(&self, _: &mut RewrittenBody<'_>, _: &[PrunedCall], _: usize) -> bool {
        false
    }
}

#[test]
fn the_message_count_fires_whatever_clear_at_least_says() {
    // 40 short messages under a 128k window: far under every token point, over `max_messages`.
    let mut m = vec![sys("You help travellers.")];
    for l in 0..20 {
        m.push(user(&format!("question {l}")));
        m.push(reply(&format!("answer {l}")));
    }
    m.push(user("last"));
    let body = json!({"model": "gpt-4o", "messages": m});
    let mut cfg = Config::default();
    cfg.context.max_messages = Some(20);
    let req = decide_request(
        body.as_object().unwrap(),
        &m,
        128_000,
        Rewriting::Prune,
        false,
    );
    let counter = TokenCounter::new();
    let additions = Reserve(300);
    match decide::plan_cuts(&req, None, &cfg, &additions, &counter) {
        Plan::Rewrite(r) => {
            assert!(r.messages.len() <= 20, "{} messages sent", r.messages.len());
            let out = r.owned_messages();
            assert_eq!(out.last(), m.last());
            assert_eq!(check_roles(&m, &out), Ok(()));
        }
        other => panic!("40 messages with max_messages = 20 went out unchanged: {other:?}"),
    }
}
