//! Server-sent events over raw bytes: an incremental parser that accepts any chunking, and the assembler of an
//! assistant message from chat-completion chunks. Pure: no I/O.

mod assemble;

pub use assemble::{AssembledReply, MessageAssembler};

/// One dispatched SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

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
}

impl SseParser {
    /// A fresh parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let mut rest = chunk;
        if rest.is_empty() {
            // Nothing arrived: a `\r` ending the previous chunk still waits for a possible `\n`.
            return out;
        }
        if self.pending_cr {
            self.pending_cr = false;
            if let Some(b'\n') = rest.first() {
                rest = &rest[1..];
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&rest[..pos]);
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, &mut out);
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
        }
        self.line.extend_from_slice(rest);
        out
    }

    /// Ends the stream: dispatches an event left without its closing blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
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
            "data" => match &mut self.data {
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
        if let Some(data) = self.data.take() {
            out.push(SseEvent { event, data });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
