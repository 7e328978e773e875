//! Rendering a rewrite back onto the client's messages, for a dialect one of whose messages may stand for several
//! neutral ones (an Anthropic user message's `tool_result` blocks, a Gemini user content's `functionResponse`
//! parts): the rewritten neutral messages grouped by the client message they come from, each group rendered by the
//! dialect, the messages ctxgate added rendered in their place.

use crate::message::Source;
use serde_json::Value;
use std::borrow::Cow;

/// The client's messages after a rewrite: `out[k]` is the k-th rewritten neutral message, `sources[k]` where it
/// came from. `client_of(j)` is the client message neutral message `j` comes from (`Some(None)`: a top-level system
/// prompt, never rendered back; `None`: no such neutral message). `render_one(i, present, total)` renders client
/// message `i` from its neutral messages present in the rewrite (`(neutral index, rewritten)`, `total` of them in
/// all); `added` renders a message ctxgate added (a summary, a note).
pub fn by_client_message<'a, 'm>(
    native: &'a [Value],
    neutral_len: usize,
    client_of: impl Fn(usize) -> Option<Option<usize>>,
    out: &'m [Cow<'_, Value>],
    sources: &[Source],
    mut render_one: impl FnMut(usize, &[(usize, &'m Value)], usize) -> Option<Cow<'a, Value>>,
    added: impl Fn(&Value) -> Option<Value>,
) -> Vec<Cow<'a, Value>> {
    let mut total = vec![0usize; native.len()];
    for i in (0..neutral_len).filter_map(|j| client_of(j).flatten()) {
        if let Some(c) = total.get_mut(i) {
            *c += 1;
        }
    }
    let mut rendered: Vec<Cow<'a, Value>> = Vec::with_capacity(out.len());
    // The client message being collected, and its neutral messages present in the rewrite.
    let mut group: Option<(usize, Vec<(usize, &'m Value)>)> = None;
    let mut flush = |group: &mut Option<(usize, Vec<(usize, &'m Value)>)>,
                     rendered: &mut Vec<_>| {
        if let Some((i, present)) = group.take() {
            rendered.extend(render_one(i, &present, total[i]));
        }
    };
    for (k, m) in out.iter().enumerate() {
        let j = match sources.get(k) {
            Some(Source::Client(j)) => Some(*j),
            Some(Source::Added) | None => None,
        };
        match j.and_then(|j| Some((j, client_of(j)?))) {
            Some((_, None)) => {}
            Some((j, Some(i))) => {
                if i >= native.len() {
                    continue;
                }
                if group.as_ref().is_some_and(|(g, _)| *g != i) {
                    flush(&mut group, &mut rendered);
                }
                group
                    .get_or_insert_with(|| (i, Vec::new()))
                    .1
                    .push((j, m.as_ref()));
            }
            None => {
                flush(&mut group, &mut rendered);
                rendered.extend(added(m.as_ref()).map(Cow::Owned));
            }
        }
    }
    flush(&mut group, &mut rendered);
    rendered
}
