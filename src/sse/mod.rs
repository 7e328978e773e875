//! Server-sent events over raw bytes: an incremental parser that accepts any chunking (the dialects assemble
//! replies from its events: `dialect/*/assemble.rs`). Pure: no I/O.

/// One dispatched SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Longest line, and largest event `data`, the parser keeps (16 MiB). A longer line is dropped with the event it
/// belongs to (counted in [`SseParser::dropped`]), so an upstream that never sends a newline cannot grow memory.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// An incremental SSE parser. Feed it chunks as they arrive, split anywhere (even inside a `\r\n`).
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous chunk ended with `\r`: a `\n` starting the next chunk belongs to that line ending.
    pending_cr: bool,
    /// A line has been read: a byte order mark is only dropped from the first.
    started: bool,
    event: Option<String>,
    data: Option<String>,
    /// The current line went over [`MAX_LINE_BYTES`]: its bytes are skipped up to its end.
    skipping_line: bool,
    /// The current event lost a line or went over the bound: it is not dispatched.
    broken_event: bool,
    dropped: u64,
}

impl SseParser {
    /// A fresh parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.feed_with_ends(chunk)
            .into_iter()
            .map(|(e, _)| e)
            .collect()
    }

    /// [`Self::feed`], with where each event ends in `chunk`: the offset just after the line that dispatched it.
    pub fn feed_with_ends(&mut self, chunk: &[u8]) -> Vec<(SseEvent, usize)> {
        let mut out = Vec::new();
        let mut ends = Vec::new();
        let mut rest = chunk;
        if rest.is_empty() {
            // Nothing arrived: a `\r` ending the previous chunk still waits for a possible `\n`.
            return Vec::new();
        }
        if self.pending_cr {
            self.pending_cr = false;
            if let Some(b'\n') = rest.first() {
                rest = &rest[1..];
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.push_line(&rest[..pos]);
            let before = out.len();
            if self.skipping_line {
                self.skipping_line = false;
            } else {
                let line = std::mem::take(&mut self.line);
                self.process_line(&line, &mut out);
            }
            if rest[pos] == b'\r' {
                match rest.get(pos + 1) {
                    Some(b'\n') => rest = &rest[pos + 2..],
                    Some(_) => rest = &rest[pos + 1..],
                    None => {
                        self.pending_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[pos + 1..];
            }
            if out.len() > before {
                ends.push(chunk.len() - rest.len());
            }
        }
        self.push_line(rest);
        out.into_iter().zip(ends).collect()
    }

    /// Lines and events dropped for going over [`MAX_LINE_BYTES`].
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Bytes held for the line and the event in progress (never much more than twice [`MAX_LINE_BYTES`]).
    pub fn buffered(&self) -> usize {
        self.line.len() + self.data.as_ref().map_or(0, String::len)
    }

    /// The stream stopped inside an event: part of a line, or data lines without their closing blank line.
    pub fn mid_event(&self) -> bool {
        !self.line.is_empty() || self.skipping_line || self.data.is_some() || self.broken_event
    }

    fn push_line(&mut self, bytes: &[u8]) {
        if self.skipping_line {
            return;
        }
        if self.line.len() + bytes.len() > MAX_LINE_BYTES {
            self.line = Vec::new();
            self.skipping_line = true;
            self.drop_event();
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn drop_event(&mut self) {
        if !self.broken_event {
            self.dropped += 1;
        }
        self.broken_event = true;
        self.data = None;
    }

    /// Ends the stream: dispatches an event left without its closing blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        self.skipping_line = false;
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, &mut out);
        }
        self.dispatch(&mut out);
        out.pop()
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        let line = match std::mem::replace(&mut self.started, true) {
            // The spec ignores one leading U+FEFF: without this the stream's first event would be lost.
            false => line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(line),
            true => line,
        };
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // comment, e.g. `: keep-alive`
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.find(':') {
            Some(i) => {
                let v = &text[i + 1..];
                (&text[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&text[..], ""),
        };
        match field {
            "data" if self.broken_event => {}
            "data" => match &mut self.data {
                Some(d) if d.len() + 1 + value.len() > MAX_LINE_BYTES => self.drop_event(),
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "event" => self.event = Some(value.to_string()),
            _ => {} // id, retry and unknown fields carry nothing we need
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if std::mem::take(&mut self.broken_event) {
            self.data = None;
            return;
        }
        if let Some(data) = self.data.take() {
            out.push(SseEvent { event, data });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ends_are_offsets_in_the_chunk() {
        let mut p = SseParser::new();
        let chunk = b"data: a\n\n: comment\r\nevent: x\ndata: b\r\n\r\ndata: c";
        let got = p.feed_with_ends(chunk);
        let ends: Vec<usize> = got.iter().map(|(_, e)| *e).collect();
        assert_eq!(
            got.iter().map(|(e, _)| e.data.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(&chunk[..ends[0]], b"data: a\n\n");
        assert_eq!(
            &chunk[ends[0]..ends[1]],
            b": comment\r\nevent: x\ndata: b\r\n\r\n"
        );
        // the event left open ends in the next chunk, at its own offset there
        assert_eq!(
            p.feed_with_ends(b"\n\n"),
            vec![(
                SseEvent {
                    event: None,
                    data: "c".into()
                },
                2
            )]
        );
    }

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut v: Vec<SseEvent> = chunks.iter().flat_map(|c| p.feed(c)).collect();
        v.extend(p.finish());
        v
    }

    #[test]
    fn crlf_comments_multiline_and_any_split() {
        let stream = b": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\ndata:[DONE]\n\n";
        let expected = vec![
            SseEvent {
                event: None,
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                event: Some("x".into()),
                data: "line1\nline2".into(),
            },
            SseEvent {
                event: None,
                data: "[DONE]".into(),
            },
        ];
        assert_eq!(all(&[stream]), expected);
        // every possible split into two chunks, and byte by byte
        for i in 0..stream.len() {
            assert_eq!(all(&[&stream[..i], &stream[i..]]), expected, "split at {i}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&bytes), expected);
    }

    /// Found by `cargo fuzz run sse` (differential against the spec): a stream opening with a byte order mark lost
    /// its first event, read as a field named `\u{feff}data`.
    #[test]
    fn a_leading_byte_order_mark_is_ignored() {
        let stream = b"\xef\xbb\xbfdata: {\"a\":1}\n\ndata: [DONE]\n\n";
        let expected = vec![
            SseEvent {
                event: None,
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                event: None,
                data: "[DONE]".into(),
            },
        ];
        assert_eq!(all(&[stream]), expected);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&bytes), expected, "the mark split over chunks");
        // only one, and only at the very start
        assert_eq!(
            all(&[b"data: a\n\n\xef\xbb\xbfdata: b\n\n"]),
            [SseEvent {
                event: None,
                data: "a".into()
            }]
        );
    }

    /// Found with the `sse` fuzz target: an empty chunk between the `\r` and the `\n` of a line ending (hyper may
    /// hand over an empty data frame) made the `\n` a second line ending, a blank line that split one event in two.
    #[test]
    fn an_empty_chunk_inside_a_crlf_changes_nothing() {
        let expected = vec![SseEvent {
            event: None,
            data: "a\nb".into(),
        }];
        assert_eq!(all(&[b"data: a\r\ndata: b\n\n"]), expected);
        assert_eq!(
            all(&[b"data: a\r", b"", b"\ndata: b\n\n"]),
            expected,
            "an empty chunk after the \\r"
        );
    }

    #[test]
    fn lone_cr_line_endings_and_unterminated_tail() {
        assert_eq!(
            all(&[b"data: a\r\rdata: b"]),
            vec![
                SseEvent {
                    event: None,
                    data: "a".into()
                },
                SseEvent {
                    event: None,
                    data: "b".into()
                },
            ]
        );
    }

    #[test]
    fn a_line_without_end_is_bounded_and_dropped() {
        let mut p = SseParser::new();
        let mb = vec![b'x'; 1024 * 1024];
        assert!(p.feed(b"data: {\"a\":1}\n\ndata: ").len() == 1);
        for _ in 0..40 {
            assert!(p.feed(&mb).is_empty());
            assert!(p.buffered() <= MAX_LINE_BYTES, "{}", p.buffered());
        }
        assert_eq!(p.dropped(), 1);
        assert!(p.mid_event());
        // the overlong line ends; the event it belonged to is dropped, the next one is whole
        let after = p.feed(b"tail\ndata: more of the dropped event\n\ndata: next\n\n");
        assert_eq!(
            after,
            vec![SseEvent {
                event: None,
                data: "next".into()
            }]
        );
        assert_eq!(p.buffered(), 0);
        assert!(!p.mid_event());
    }

    #[test]
    fn an_event_of_many_lines_is_bounded_too() {
        let mut p = SseParser::new();
        let line = format!("data: {}\n", "y".repeat(1024 * 1024));
        for _ in 0..40 {
            assert!(p.feed(line.as_bytes()).is_empty());
            assert!(p.buffered() <= MAX_LINE_BYTES + line.len());
        }
        assert_eq!(p.dropped(), 1);
        assert!(
            p.feed(b"\n").is_empty(),
            "the broken event is not dispatched"
        );
        assert_eq!(p.feed(b"data: ok\n\n")[0].data, "ok");
        assert_eq!(p.dropped(), 1);
    }
}
