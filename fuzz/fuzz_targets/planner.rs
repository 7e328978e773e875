//! Fuzzes the context planner with structured histories: system/developer/user/assistant messages, tool calls
//! answered in order, out of order, partly, twice or not at all, orphan tool results, fresh, repeated, empty and
//! missing call ids, contents of every shape and of random sizes, under a small window and random settings.
//!
//! Invariants: no panic; the plan is deterministic; a rewrite's estimate is the count of what it sends; and when
//! the client's history is valid (`check_sequence`), the rewrite is valid too, keeps the system messages, the
//! newest message and the newest user message, stays under the hard limit and is a fixed point of the planner.
//! On the way, the token counter's exact count is checked against tiktoken's own for short raw texts.
#![no_main]

use arbitrary::Arbitrary;
use ctxgate::config::{ContextConfig, DurationSpec, PruneConfig, Strategy};
use ctxgate::context::plan::Summaries;
use ctxgate::context::tokens::{count_text, Encoding, TokenCounter};
use ctxgate::context::units::check_sequence;
use ctxgate::context::{plan, Plan, PlanInput};
use ctxgate::message::{is_system, role};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use std::sync::LazyLock;

static COUNTER: LazyLock<TokenCounter> = LazyLock::new(TokenCounter::new);
static O200K: LazyLock<tiktoken_rs::CoreBPE> =
    LazyLock::new(|| tiktoken_rs::o200k_base().unwrap_or_else(|e| panic!("{e}")));
static CL100K: LazyLock<tiktoken_rs::CoreBPE> =
    LazyLock::new(|| tiktoken_rs::cl100k_base().unwrap_or_else(|e| panic!("{e}")));

const SUMMARY: &str = "Summary of the earlier conversation: ";
const WORDS: &[&str] = &[
    "lorem ",
    "fn main() {",
    "\n",
    "  ",
    "héllo ",
    "1234567 ",
    "I'll ",
    "😀",
    "\t\r\n",
    "QmFzZTY0",
    "x",
];

#[derive(Arbitrary, Debug)]
struct Input {
    messages: Vec<Msg>,
    window: u16,
    strategy: u8,
    ratio: u8,
    reserve: u8,
    tools: bool,
    recall: bool,
    cl100k: bool,
    ages: Option<Vec<u16>>,
    prune: Knobs,
    summaries: Option<(u8, u16)>,
}

#[derive(Arbitrary, Debug)]
struct Knobs {
    keep_tool_results: u8,
    min_result_tokens: u8,
    max_message_length: u16,
    keep_run_loops: u8,
    more_run_loops: u8,
    max_age: Option<u16>,
}

#[derive(Arbitrary, Debug)]
enum Msg {
    System(Text),
    Developer(Text),
    User(Content),
    Assistant(Content),
    Calls {
        content: Option<Text>,
        calls: Vec<Call>,
        answer: Answer,
    },
    Tool {
        id: Id,
        content: Content,
    },
    Odd(Odd),
}

#[derive(Arbitrary, Debug)]
struct Call {
    id: Id,
    name: u8,
    arguments: Text,
    result: Content,
}

#[derive(Arbitrary, Debug)]
enum Answer {
    InOrder,
    Reversed,
    DropFirst,
    DuplicateLast,
    Unanswered,
    ThenUser,
}

#[derive(Arbitrary, Debug)]
enum Id {
    Fresh,
    Again(u8),
    Empty,
    Missing,
    Number,
}

#[derive(Arbitrary, Debug)]
enum Text {
    Words { word: u8, count: u16 },
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Content {
    Text(Text),
    Null,
    Empty,
    Missing,
    Parts(Vec<Part>),
}

#[derive(Arbitrary, Debug)]
enum Part {
    Text(Text),
    Image,
    Unknown,
}

/// Messages of shapes a client should not send, which the planner must survive all the same.
#[derive(Arbitrary, Debug)]
enum Odd {
    NoRole,
    NumberRole,
    NotAnObject(Text),
    ToolCallsNotArray,
    UserWithToolCalls,
    Function,
}

struct Ids {
    all: Vec<String>,
}

impl Ids {
    fn make(&mut self, id: &Id) -> Option<Value> {
        match id {
            Id::Fresh => {
                let s = format!("call_{}", self.all.len());
                self.all.push(s.clone());
                Some(json!(s))
            }
            Id::Again(k) if !self.all.is_empty() => {
                Some(json!(self.all[usize::from(*k) % self.all.len()]))
            }
            Id::Again(_) | Id::Empty => Some(json!("")),
            Id::Missing => None,
            Id::Number => Some(json!(7)),
        }
    }
}

fn text(t: &Text) -> String {
    match t {
        Text::Words { word, count } => {
            WORDS[usize::from(*word) % WORDS.len()].repeat(usize::from(*count % 1500))
        }
        Text::Raw(s) => s.clone(),
    }
}

fn content(c: &Content) -> Option<Value> {
    Some(match c {
        Content::Text(t) => Value::String(text(t)),
        Content::Null => Value::Null,
        Content::Empty => json!(""),
        Content::Missing => return None,
        Content::Parts(parts) => parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => json!({"type": "text", "text": text(t)}),
                Part::Image => json!({"type": "image_url", "image_url": {"url": "data:x"}}),
                Part::Unknown => json!({"type": "input_audio", "input_audio": {"data": "AAAA"}}),
            })
            .collect(),
    })
}

fn message(role: &str, c: Option<Value>) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), json!(role));
    if let Some(c) = c {
        m.insert("content".into(), c);
    }
    Value::Object(m)
}

fn tool_result(id: Option<Value>, c: Option<Value>) -> Value {
    let mut m = message("tool", c);
    if let (Some(id), Value::Object(o)) = (id, &mut m) {
        o.insert("tool_call_id".into(), id);
    }
    m
}

fn build(msgs: &[Msg]) -> Vec<Value> {
    let mut ids = Ids { all: Vec::new() };
    let mut out = Vec::new();
    for m in msgs {
        match m {
            Msg::System(t) => out.push(message("system", Some(json!(text(t))))),
            Msg::Developer(t) => out.push(message("developer", Some(json!(text(t))))),
            Msg::User(c) => out.push(message("user", content(c))),
            Msg::Assistant(c) => out.push(message("assistant", content(c))),
            Msg::Calls {
                content,
                calls,
                answer,
            } => {
                let made: Vec<(Option<Value>, &Call)> =
                    calls.iter().map(|c| (ids.make(&c.id), c)).collect();
                let list: Vec<Value> = made
                    .iter()
                    .map(|(id, c)| {
                        let mut call = json!({"type": "function", "function": {
                            "name": format!("tool_{}", c.name % 5), "arguments": text(&c.arguments)}});
                        if let (Some(id), Value::Object(o)) = (id, &mut call) {
                            o.insert("id".into(), id.clone());
                        }
                        call
                    })
                    .collect();
                let mut a = message("assistant", Some(content.as_ref().map_or(Value::Null, |t| json!(text(t)))));
                if let Value::Object(o) = &mut a {
                    o.insert("tool_calls".into(), Value::Array(list));
                }
                out.push(a);
                let mut results: Vec<Value> = made
                    .iter()
                    .map(|(id, c)| tool_result(id.clone(), self::content(&c.result)))
                    .collect();
                match answer {
                    Answer::InOrder => {}
                    Answer::Reversed => results.reverse(),
                    Answer::DropFirst => {
                        if !results.is_empty() {
                            results.remove(0);
                        }
                    }
                    Answer::DuplicateLast => {
                        if let Some(last) = results.last().cloned() {
                            results.push(last);
                        }
                    }
                    Answer::Unanswered => results.clear(),
                    Answer::ThenUser => results.insert(0, message("user", Some(json!("wait")))),
                }
                out.extend(results);
            }
            Msg::Tool { id, content } => out.push(tool_result(ids.make(id), self::content(content))),
            Msg::Odd(o) => out.push(match o {
                Odd::NoRole => json!({"content": "no role"}),
                Odd::NumberRole => json!({"role": 3, "content": "x"}),
                Odd::NotAnObject(t) => json!(text(t)),
                Odd::ToolCallsNotArray => json!({"role": "assistant", "tool_calls": {"id": "x"}}),
                Odd::UserWithToolCalls => json!({"role": "user", "content": "u", "tool_calls": [
                    {"id": "u1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
                Odd::Function => json!({"role": "function", "name": "f", "content": "legacy"}),
            }),
        }
    }
    out
}

/// Checks the token counter's exact count against tiktoken's for the short raw texts of the input.
fn check_counts(msgs: &[Msg]) {
    let mut texts = Vec::new();
    let mut add = |t: &Text| {
        if let Text::Raw(s) = t {
            texts.push(s.clone());
        }
    };
    for m in msgs {
        match m {
            Msg::System(t) | Msg::Developer(t) | Msg::Odd(Odd::NotAnObject(t)) => add(t),
            Msg::User(Content::Text(t)) | Msg::Assistant(Content::Text(t)) => add(t),
            Msg::Calls { calls, .. } => calls.iter().for_each(|c| add(&c.arguments)),
            _ => {}
        }
    }
    for s in texts.iter().filter(|s| s.len() <= 256) {
        let want = O200K.encode_ordinary(s).len() as u64;
        assert_eq!(count_text(Encoding::O200k, s), want, "o200k count of {s:?}");
        let want = CL100K.encode_ordinary(s).len() as u64;
        assert_eq!(
            count_text(Encoding::Cl100k, s),
            want,
            "cl100k count of {s:?}"
        );
    }
}

fn summary_msg(upto: usize) -> Value {
    json!({"role": "system", "content": format!("{SUMMARY}the story so far (covers {upto})")})
}

fn wanted(p: &Plan) -> Option<usize> {
    match p {
        Plan::Forward { wanted_summary, .. } => *wanted_summary,
        Plan::Rewrite(r) => r.wanted_summary,
        Plan::Reject { .. } => None,
    }
}

fuzz_target!(|input: Input| {
    if input.messages.len() > 200 {
        return;
    }
    check_counts(&input.messages);
    let messages = build(&input.messages);
    let tools = json!([{"type": "function", "function": {"name": "tool_0", "description": "reads a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    let now = 1_000_000_i64;
    let first_seen: Option<Vec<i64>> = input.ages.as_ref().map(|a| {
        (0..messages.len())
            .map(|i| now - i64::from(a.get(i).copied().unwrap_or(0)))
            .collect()
    });
    let strategy = match input.strategy % 4 {
        0 => Strategy::Off,
        1 => Strategy::Prune,
        2 => Strategy::Summarize,
        _ => Strategy::Hybrid,
    };
    let k = &input.prune;
    let keep_run_loops = 1 + usize::from(k.keep_run_loops % 4);
    let prune = PruneConfig {
        keep_tool_results: usize::from(k.keep_tool_results % 6),
        min_result_tokens: u64::from(k.min_result_tokens),
        max_message_length: 16 + usize::from(k.max_message_length % 3000),
        keep_run_loops,
        max_run_loops: keep_run_loops + usize::from(k.more_run_loops % 50),
        max_age: k.max_age.map(|a| DurationSpec::from_secs(u64::from(a))),
        ..PruneConfig::default()
    };
    let ctx = ContextConfig::default();
    let window = 256 + u64::from(input.window % 16_000);
    let base = PlanInput {
        messages: &messages,
        tools: input.tools.then_some(&tools),
        first_seen: first_seen.as_deref(),
        now,
        encoding: if input.cl100k {
            Encoding::Cl100k
        } else {
            Encoding::O200k
        },
        ratio: 0.25 + f64::from(input.ratio) / 64.0,
        strategy,
        window,
        recall_tool: input.recall.then_some("recall_tool_call"),
        reserve: u64::from(input.reserve),
        summaries: None,
        precompute_at: 0.6,
        strict_roles: input.cl100k,
    };
    let summaries = |ready| {
        input.summaries.map(|(keep, max)| Summaries {
            keep_recent: usize::from(keep % 8),
            max_tokens: u64::from(max % 2000),
            ready,
        })
    };
    let first = PlanInput {
        summaries: summaries(&[]),
        ..base
    };
    check(&first, &ctx, &prune);
    if let Some(upto) = wanted(&plan(&first, &ctx, &prune, &COUNTER)) {
        let ready = [(upto, summary_msg(upto))];
        let later = PlanInput {
            summaries: summaries(&ready),
            ..base
        };
        check(&later, &ctx, &prune);
    }
});

fn check(input: &PlanInput<'_>, ctx: &ContextConfig, prune: &PruneConfig) {
    let m = input.messages;
    let p = plan(input, ctx, prune, &COUNTER);
    assert_eq!(
        p,
        plan(input, ctx, prune, &TokenCounter::new()),
        "deterministic"
    );
    let Plan::Rewrite(r) = p else {
        return;
    };
    let out = r.owned_messages();
    assert_eq!(
        r.estimate,
        COUNTER.request_tokens(input.encoding, &out, input.tools),
        "the estimate is the count of what is sent"
    );
    if check_sequence(m).is_err() {
        return;
    }
    if let Err(e) = check_sequence(&out) {
        panic!("a valid history was rewritten into an invalid one: {e}");
    }
    let ours = |v: &Value| {
        v["content"]
            .as_str()
            .is_some_and(|c| c.starts_with(SUMMARY))
    };
    let systems = |x: &[Value]| -> Vec<Value> {
        x.iter()
            .filter(|v| is_system(v) && !ours(v))
            .cloned()
            .collect()
    };
    assert_eq!(systems(&out), systems(m), "system messages kept");
    assert_eq!(out.last(), m.last(), "newest message kept");
    let newest_user = |x: &[Value]| x.iter().rev().find(|v| role(v) == "user").cloned();
    assert_eq!(
        newest_user(&out),
        newest_user(m),
        "newest user message kept"
    );
    let hard = (ctx.hard_limit * input.window as f64).ceil() as u64;
    assert!(
        r.record.tokens_after <= hard,
        "over the hard limit: {:?}",
        r.record
    );
    if r.record.stages.contains(&"summarized") || input.first_seen.is_some() {
        return;
    }
    let again = PlanInput {
        messages: &out,
        ..*input
    };
    match plan(&again, ctx, prune, &COUNTER) {
        Plan::Forward { .. } => {}
        Plan::Rewrite(again) => assert_eq!(again.owned_messages(), out, "idempotent"),
        Plan::Reject { .. } => panic!("the output of a rewrite was rejected"),
    }
}
