//! Fuzzes the SSE parser and the chat-chunk assembler: arbitrary bytes, split at arbitrary points.
//!
//! Input layout: byte 0 gives the number of cuts `k` (mod 8), the next `2k` bytes their offsets (u16 LE, mod the
//! stream's length + 1), the rest is the stream. Invariants: no panic; the events (and the reply assembled from
//! them) are the same whether the stream arrives whole, cut at those points, or byte by byte with empty chunks; they match a
//! straightforward reference reading of the SSE spec; no event's data holds a `\r`, no event name a line break.
#![no_main]

use ctxgate::dialect::chat::MessageAssembler;
use ctxgate::dialect::AssembledReply;
use ctxgate::sse::{SseEvent, SseParser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (cuts, stream) = split_input(data);
    let whole = parse(&[stream]);
    let mut pieces = Vec::new();
    let mut at = 0;
    for c in cuts {
        pieces.push(&stream[at..c]);
        at = c;
    }
    pieces.push(&stream[at..]);
    let cut = parse(&pieces);
    // One byte at a time, with an empty chunk after each (a transport may hand over empty frames).
    let bytes: Vec<&[u8]> = stream.chunks(1).flat_map(|b| [b, &[][..]]).collect();
    let bytewise = parse(&bytes);
    assert_eq!(whole, cut, "cut at {pieces:?}");
    assert_eq!(whole, bytewise, "byte by byte");
    assert_eq!(
        whole.0,
        reference(stream),
        "differs from the reference reading"
    );
    for e in &whole.0 {
        assert!(!e.data.contains('\r'), "{e:?}");
        assert!(
            !e.event.as_deref().unwrap_or("").contains(['\r', '\n']),
            "{e:?}"
        );
    }
    // The same bytes read as a whole (non-streaming) completion body.
    let _ = MessageAssembler::from_completion_body(stream);
});

/// The cut offsets (sorted, within the stream) and the stream.
fn split_input(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let Some((&k, rest)) = data.split_first() else {
        return (Vec::new(), data);
    };
    let k = usize::from(k % 8);
    if rest.len() < 2 * k {
        return (Vec::new(), rest);
    }
    let (offsets, stream) = rest.split_at(2 * k);
    let mut cuts: Vec<usize> = offsets
        .chunks(2)
        .map(|o| usize::from(u16::from_le_bytes([o[0], o[1]])) % (stream.len() + 1))
        .collect();
    cuts.sort_unstable();
    (cuts, stream)
}

/// Feeds the pieces in order; returns the events and the reply assembled from their data.
fn parse(pieces: &[&[u8]]) -> (Vec<SseEvent>, AssembledReply) {
    let mut p = SseParser::new();
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(p.feed(piece));
    }
    events.extend(p.finish());
    let mut a = MessageAssembler::new();
    for e in &events {
        a.on_event_data(&e.data);
    }
    (events, a.finish())
}

/// The SSE spec's event stream interpretation, written independently: decode the whole stream (lossy UTF-8),
/// drop one leading BOM, split lines at CRLF / LF / CR, and dispatch on blank lines. Like `SseParser::finish`,
/// the end of the stream ends the last line and dispatches a pending event.
fn reference(stream: &[u8]) -> Vec<SseEvent> {
    let text = String::from_utf8_lossy(stream);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut lines = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(['\r', '\n']) {
        lines.push(&rest[..i]);
        rest = if rest[i..].starts_with("\r\n") {
            &rest[i + 2..]
        } else {
            &rest[i + 1..]
        };
    }
    if !rest.is_empty() {
        lines.push(rest);
    }
    lines.push(""); // the end of the stream dispatches
    let (mut out, mut event, mut data): (Vec<SseEvent>, Option<String>, Option<Vec<String>>) =
        (Vec::new(), None, None);
    for line in lines {
        if line.is_empty() {
            let name = event.take();
            if let Some(d) = data.take() {
                out.push(SseEvent {
                    event: name,
                    data: d.join("\n"),
                });
            }
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => data.get_or_insert_with(Vec::new).push(value.to_string()),
            "event" => event = Some(value.to_string()),
            _ => {}
        }
    }
    out
}
