//! Plain-text log fields, written as `tracing_subscriber`'s default formatter writes them without colours (the
//! message, then `name=value` pairs; strings quoted and escaped as `{:?}` does; terminal control characters of
//! the message escaped), without going through `{:?}` character by character for the usual plain values: an
//! access log line costs a fraction of what it did.

use std::fmt::{self, Write as _};
use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

/// The field formatter of plain-text logs (`.fmt_fields(PlainFields)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainFields;

impl<'a> MakeVisitor<Writer<'a>> for PlainFields {
    type Visitor = PlainVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        PlainVisitor {
            writer: target,
            empty: true,
            result: Ok(()),
        }
    }
}

/// Writes one event's or span's fields.
pub struct PlainVisitor<'a> {
    writer: Writer<'a>,
    empty: bool,
    result: fmt::Result,
}

impl PlainVisitor<'_> {
    /// Starts a field: the separating space, then `name=` (nothing for the message). `None`: the field is skipped
    /// (a `log.` field is metadata of a `log` record, already written) or writing failed.
    fn start(&mut self, field: &Field) -> Option<bool> {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return None;
        }
        if self.empty {
            self.empty = false;
        } else if let Err(e) = self.writer.write_char(' ') {
            self.result = Err(e);
            return None;
        }
        if name == "message" {
            return Some(true);
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = self
            .writer
            .write_str(name)
            .and_then(|()| self.writer.write_char('='));
        self.result.is_ok().then_some(false)
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        match self.start(field) {
            Some(true) => self.result = write_escaped(&mut self.writer, value),
            Some(false) if debug_is_verbatim(value) => {
                self.result = self
                    .writer
                    .write_char('"')
                    .and_then(|()| self.writer.write_str(value))
                    .and_then(|()| self.writer.write_char('"'));
            }
            Some(false) => self.result = write!(self.writer, "{value:?}"),
            None => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.number(field, itoa::Buffer::new().format(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.number(field, itoa::Buffer::new().format(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.number(field, if value { "true" } else { "false" });
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        match value.source() {
            Some(source) => {
                let mut list = String::from("[");
                let mut next = Some(source);
                while let Some(e) = next {
                    if list.len() > 1 {
                        list.push_str(", ");
                    }
                    let _ = write!(Escaping(&mut list), "{e}");
                    next = e.source();
                }
                list.push(']');
                let name = field.name();
                self.record_debug(
                    field,
                    &format_args!("{} {name}.sources={list}", EscapedDisplay(value)),
                );
            }
            None => self.record_debug(field, &format_args!("{}", EscapedDisplay(value))),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match self.start(field) {
            Some(true) => self.result = write!(Escaping(&mut self.writer), "{value:?}"),
            Some(false) => self.result = write!(self.writer, "{value:?}"),
            None => {}
        }
    }
}

impl PlainVisitor<'_> {
    fn number(&mut self, field: &Field, text: &str) {
        if self.start(field).is_some() {
            self.result = self.writer.write_str(text);
        }
    }
}

impl VisitOutput<fmt::Result> for PlainVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for PlainVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

/// A string that `{:?}` writes as `"` + itself + `"`: printable ASCII without quotes or backslashes.
fn debug_is_verbatim(s: &str) -> bool {
    s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

/// Whether `c` is escaped in a message: the C0 controls a terminal acts on, DEL and the C1 controls.
fn escaped(c: char) -> bool {
    matches!(
        c,
        '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' | '\u{80}'..='\u{9f}'
    )
}

/// Writes `s` with [`escaped`] characters as `\xNN` / `\u{NN}`, the rest as is.
fn write_escaped(out: &mut dyn fmt::Write, s: &str) -> fmt::Result {
    let mut rest = s;
    while let Some(i) = rest.find(escaped) {
        out.write_str(&rest[..i])?;
        let c = rest[i..].chars().next().unwrap_or_default();
        if (c as u32) < 0x80 {
            write!(out, "\\x{:02x}", c as u32)?;
        } else {
            write!(out, "\\u{{{:x}}}", c as u32)?;
        }
        rest = &rest[i + c.len_utf8()..];
    }
    out.write_str(rest)
}

/// A writer that escapes what goes through it (see [`write_escaped`]).
struct Escaping<'w, W: fmt::Write>(&'w mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_escaped(self.0, s)
    }
}

/// A value's `Display`, escaped.
struct EscapedDisplay<'e>(&'e (dyn std::error::Error + 'static));

impl fmt::Display for EscapedDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(Escaping(f), "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("outer \x1b[31m failed")
        }
    }
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("inner \u{85} cause")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    impl std::error::Error for Inner {}

    fn events() {
        let s = "plain";
        tracing::info!(target: "ctxgate::access", method = "POST", path = "/v1/chat/completions", status = 200u16,
            stream = false, upstream_ms = 44.722938, total_ms = 1.0, bytes = 327u64, delta = -3i64,
            session = "t-fp1", upstream_error = "", "conversation");
        tracing::warn!(
            quoted = "a \"b\" \\ c",
            tab = "x\ty",
            uni = "héllo ✓",
            ctl = "\x1b[0m",
            "with {} {s}",
            2
        );
        tracing::error!(error = %Outer(Inner), shown = ?Some("x"), "message \x07 bell");
        let e = Outer(Inner);
        tracing::error!(
            error = &e as &(dyn std::error::Error + 'static),
            r#type = "raw",
            "failed"
        );
        tracing::info!(empty = "", "");
        tracing::info!("only a message \u{9b}");
    }

    fn output(plain: bool) -> String {
        let buf = Buf::default();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(buf.clone());
        if plain {
            tracing::subscriber::with_default(builder.fmt_fields(PlainFields).finish(), events);
        } else {
            tracing::subscriber::with_default(builder.finish(), events);
        }
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_are_the_default_formatters_own() {
        let ours = output(true);
        let theirs = output(false);
        assert_eq!(ours, theirs);
        assert!(ours.contains(r#"conversation method="POST" path="/v1/chat/completions" status=200 stream=false upstream_ms=44.722938 total_ms=1.0 bytes=327 delta=-3"#), "{ours}");
        assert!(
            ours.contains(r#"ctl="\u{1b}[0m""#)
                && ours.contains("\\x07 bell")
                && ours.contains("\\u{9b}"),
            "{ours}"
        );
        assert_eq!(ours.lines().count(), 6);
    }
}
