//! Compressed bodies of conversation requests (`Content-Encoding`: `gzip`, `deflate`, `br`, `zstd`, a list of them
//! decoded in reverse order, `identity` ignored): the codings read from the head, and the body decoded within a
//! bound — never more than the bound plus one chunk inflated, whatever the ratio. A request without the header
//! costs one header lookup. Admission (`admission`) runs the decoding and reserves its bytes; the gateway then
//! manages and forwards the decoded body, without the header.

use crate::error::GatewayError;
use bytes::{Buf, Bytes};
use http::header::{HeaderMap, CONTENT_ENCODING};
use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};
use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Decoded bytes taken from the decoder at a time: the most a body can inflate beyond its bound.
pub const CHUNK: usize = 32 * 1024;

/// The most codings a body may be stacked in (real clients use one).
const MAX_CODINGS: usize = 3;

/// The largest zstd window accepted: 8 MiB, what RFC 9659 allows the `zstd` content coding (libzstd's default
/// would let a 10-byte frame make the decoder allocate 128 MiB).
const ZSTD_MAX_WINDOW: u64 = 8 << 20;

/// A content coding ctxgate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `gzip` (and its alias `x-gzip`): one or more gzip members.
    Gzip,
    /// `deflate`: a zlib stream, as RFC 9110 defines it, or a raw deflate stream, as some clients send it.
    Deflate,
    /// `br`: Brotli.
    Br,
    /// `zstd`: one or more Zstandard frames.
    Zstd,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Br => "br",
            Coding::Zstd => "zstd",
        }
    }
}

/// The codings of a body, in the order they were applied (the header's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Codings(Vec<Coding>);

impl Codings {
    /// The header's value as it is named in messages (`gzip, br`).
    fn named(&self) -> String {
        let names: Vec<&str> = self.0.iter().map(|c| c.name()).collect();
        names.join(", ")
    }
}

/// The codings `headers` say the body is in, taking the `Content-Encoding` header out of them (the body is
/// forwarded decoded); `None` when there is nothing to decode (no header: the one lookup a plain request costs; or
/// only `identity`, the header then left as it is). An unknown coding, or more than three, is 415 naming it.
pub fn take_codings(headers: &mut HeaderMap) -> Result<Option<Codings>, GatewayError> {
    if !headers.contains_key(CONTENT_ENCODING) {
        return Ok(None);
    }
    let mut codings = Vec::new();
    for value in headers.get_all(CONTENT_ENCODING) {
        let Ok(value) = value.to_str() else {
            return Err(unsupported("a Content-Encoding that is not ASCII"));
        };
        for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let coding = match token.to_ascii_lowercase().as_str() {
                "identity" => continue,
                "gzip" | "x-gzip" => Coding::Gzip,
                "deflate" => Coding::Deflate,
                "br" => Coding::Br,
                "zstd" => Coding::Zstd,
                _ => return Err(unsupported(&format!("Content-Encoding {token:?}"))),
            };
            codings.push(coding);
        }
    }
    if codings.len() > MAX_CODINGS {
        return Err(GatewayError::UnsupportedMediaType(format!(
            "the request body is encoded {} times over (Content-Encoding: {}); ctxgate decodes at most {MAX_CODINGS} stacked codings",
            codings.len(),
            Codings(codings).named()
        )));
    }
    if codings.is_empty() {
        return Ok(None);
    }
    headers.remove(CONTENT_ENCODING);
    Ok(Some(Codings(codings)))
}

fn unsupported(what: &str) -> GatewayError {
    GatewayError::UnsupportedMediaType(format!(
        "the request body has {what}, which ctxgate does not decode; it decodes gzip, deflate, br and zstd \
         (or identity: no Content-Encoding)"
    ))
}

/// A body being decoded: the decoders stacked over the received bytes, and what came out of them so far.
pub struct Decoding {
    reader: Box<dyn Read + Send>,
    out: Vec<u8>,
    chunk: Box<[u8]>,
    limit: usize,
    codings: Codings,
    /// Set by an inner layer of a stack that came out larger than the bound.
    inner_overflow: Arc<AtomicBool>,
}

impl Decoding {
    /// Starts decoding `raw` (in `codings`) into at most `limit` bytes (`server.max_body_bytes`).
    pub fn new(raw: Bytes, codings: Codings, limit: u64) -> Result<Self, GatewayError> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let inner_overflow = Arc::new(AtomicBool::new(false));
        let failed = |e: io::Error| failure(&codings, limit, &inner_overflow, &e);
        // The last coding applied is undone first; each layer but the outermost is bounded too, so a stack can
        // neither hide a bomb in its middle nor spin on a layer that decodes to nothing.
        let mut layers = codings.0.iter().rev();
        let Some(&last) = layers.next() else {
            return Err(GatewayError::Internal("no coding to decode".into()));
        };
        let mut reader = undo(last, Box::new(raw.reader())).map_err(failed)?;
        for &coding in layers {
            let bounded = Bounded {
                inner: reader,
                left: limit,
                overflow: inner_overflow.clone(),
            };
            let src = Box::new(BufReader::with_capacity(CHUNK, bounded));
            reader = undo(coding, src).map_err(failed)?;
        }
        Ok(Self {
            reader,
            out: Vec::new(),
            chunk: vec![0; CHUNK].into_boxed_slice(),
            limit,
            codings,
            inner_overflow,
        })
    }

    /// Whether the body is in one coding (not a stack): then the work of [`Self::run`] is bounded by the
    /// body's size and `budget`, whatever the data.
    pub fn single(&self) -> bool {
        self.codings.0.len() == 1
    }

    /// Decodes until the body ends (`true`) or `budget` more bytes came out, no more (`false`: call again). `grow` is told
    /// the size of the decoded body's buffer before it grows (the memory reservation); its error ends the
    /// decoding.
    pub fn run(
        &mut self,
        budget: usize,
        grow: &mut dyn FnMut(u64) -> Result<(), GatewayError>,
    ) -> Result<bool, GatewayError> {
        let mut produced = 0usize;
        loop {
            if produced >= budget {
                return Ok(false);
            }
            let room = CHUNK.min(budget - produced);
            let n = match self.reader.read(&mut self.chunk[..room]) {
                Ok(0) => return Ok(true),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(failure(&self.codings, self.limit, &self.inner_overflow, &e)),
            };
            let len = self.out.len() + n;
            if len > self.limit {
                return Err(too_large(&self.codings, self.limit));
            }
            if self.out.capacity() < len {
                // Doubling, but never past the bound: the buffer holds at most `limit` bytes.
                let want = (self.out.capacity() * 2)
                    .max(len)
                    .max(CHUNK)
                    .min(self.limit);
                grow(want as u64)?;
                self.out.reserve_exact(want - self.out.len());
            }
            self.out.extend_from_slice(&self.chunk[..n]);
            produced += n;
        }
    }

    /// The decoded body.
    pub fn finish(self) -> Bytes {
        Bytes::from(self.out)
    }
}

/// The reader that undoes `coding` over `src`.
fn undo(coding: Coding, mut src: Box<dyn BufRead + Send>) -> io::Result<Box<dyn Read + Send>> {
    Ok(match coding {
        Coding::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(src)),
        Coding::Deflate => {
            // RFC 9110's `deflate` is zlib (RFC 1950); a raw deflate stream cannot start with a valid zlib header
            // (method 8, check bits), which is how browsers and servers tell the two apart.
            let head = src.fill_buf()?;
            let zlib = head.len() >= 2
                && head[0] & 0x0f == 8
                && (u16::from(head[0]) << 8 | u16::from(head[1])) % 31 == 0;
            if zlib {
                Box::new(flate2::bufread::ZlibDecoder::new(src))
            } else {
                Box::new(flate2::bufread::DeflateDecoder::new(src))
            }
        }
        Coding::Br => Box::new(brotli_decompressor::Decompressor::new(src, CHUNK)),
        Coding::Zstd => Box::new(ZstdFrames {
            src,
            frame: {
                let mut f = FrameDecoder::new();
                f.set_max_window_size(ZSTD_MAX_WINDOW);
                f
            },
            in_frame: false,
        }),
    })
}

/// A decoder's error: 413 when an inner layer of a stack overflowed, otherwise 400 (the data is not what its
/// coding says).
fn failure(codings: &Codings, limit: usize, overflow: &AtomicBool, e: &io::Error) -> GatewayError {
    if overflow.load(Ordering::Relaxed) {
        return too_large(codings, limit);
    }
    GatewayError::bad_request(format!(
        "the request body could not be decoded as its Content-Encoding ({}) says: {e}",
        codings.named()
    ))
}

fn too_large(codings: &Codings, limit: usize) -> GatewayError {
    GatewayError::TooLarge {
        message: format!(
            "the request body (Content-Encoding: {}) decodes to more than {limit} bytes (server.max_body_bytes)",
            codings.named()
        ),
    }
}

/// An inner layer of a stack, cut off with an error (and `overflow` set) past `left` bytes.
struct Bounded {
    inner: Box<dyn Read + Send>,
    left: usize,
    overflow: Arc<AtomicBool>,
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > self.left {
            self.overflow.store(true, Ordering::Relaxed);
            return Err(io::Error::other("a layer decodes past the bound"));
        }
        self.left -= n;
        Ok(n)
    }
}

/// Every frame of a zstd body in turn (a body may hold several, and skippable ones), each within the window bound.
struct ZstdFrames {
    src: Box<dyn BufRead + Send>,
    frame: FrameDecoder,
    in_frame: bool,
}

impl Read for ZstdFrames {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.in_frame {
                if self.frame.can_collect() > 0 {
                    return self.frame.read(buf);
                }
                if !self.frame.is_finished() {
                    self.frame
                        .decode_blocks(&mut self.src, BlockDecodingStrategy::UptoBlocks(1))
                        .map_err(io::Error::other)?;
                    continue;
                }
                self.in_frame = false;
            }
            if self.src.fill_buf()?.is_empty() {
                return Ok(0);
            }
            match self.frame.reset(&mut self.src) {
                Ok(()) => self.in_frame = true,
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let want = u64::from(length);
                    let skipped = io::copy(&mut (&mut self.src).take(want), &mut io::sink())?;
                    if skipped != want {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn br(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
        e.write_all(data).unwrap();
        drop(e);
        out
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    fn codings(value: &str) -> Result<Option<Codings>, GatewayError> {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_ENCODING, HeaderValue::from_str(value).unwrap());
        let c = take_codings(&mut h);
        if matches!(c, Ok(Some(_))) {
            assert!(!h.contains_key(CONTENT_ENCODING));
        }
        c
    }

    fn decode(body: Vec<u8>, value: &str, limit: u64) -> Result<Bytes, GatewayError> {
        let c = codings(value)?.expect("a coding");
        let mut d = Decoding::new(Bytes::from(body), c, limit)?;
        let mut grown = 0;
        let done = d.run(usize::MAX, &mut |n| {
            assert!(n >= grown && n <= limit);
            grown = n;
            Ok(())
        })?;
        assert!(done);
        assert_eq!(d.out.capacity() as u64, grown);
        Ok(d.finish())
    }

    const TEXT: &[u8] =
        br#"{"model":"m","messages":[{"role":"user","content":"hello hello hello hello"}]}"#;

    #[test]
    fn each_coding_round_trips() {
        for (body, name) in [
            (gzip(TEXT), "gzip"),
            (gzip(TEXT), "X-GZIP"),
            (zlib(TEXT), "deflate"),
            (raw_deflate(TEXT), "deflate"),
            (br(TEXT), "br"),
            (zstd(TEXT), "zstd"),
            (gzip(TEXT), " identity , gzip"),
        ] {
            assert_eq!(decode(body, name, 1 << 20).unwrap(), TEXT, "{name}");
        }
    }

    #[test]
    fn no_header_or_identity_is_nothing_to_do() {
        let mut h = HeaderMap::new();
        assert_eq!(take_codings(&mut h).unwrap(), None);
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("identity"));
        assert_eq!(take_codings(&mut h).unwrap(), None);
        assert!(h.contains_key(CONTENT_ENCODING), "left as it was");
    }

    #[test]
    fn a_stack_is_undone_last_first() {
        let body = br(&gzip(TEXT));
        assert_eq!(decode(body.clone(), "gzip, br", 1 << 20).unwrap(), TEXT);
        let mut h = HeaderMap::new();
        h.append(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        h.append(CONTENT_ENCODING, HeaderValue::from_static("br"));
        let c = take_codings(&mut h).unwrap().unwrap();
        assert_eq!(c, Codings(vec![Coding::Gzip, Coding::Br]));
        // Undone in the wrong order it is not valid br.
        let e = decode(body, "br, gzip", 1 << 20).err().unwrap();
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn unknown_or_too_many_codings_are_415_naming_them() {
        let e = codings("gzip, xz").err().unwrap();
        assert_eq!(e.status(), 415);
        assert!(e.to_string().contains("\"xz\""), "{e}");
        let e = codings("gzip, gzip, gzip, gzip").err().unwrap();
        assert_eq!(e.status(), 415);
        assert!(e.to_string().contains("at most 3"), "{e}");
    }

    #[test]
    fn corrupt_data_is_400_naming_the_coding() {
        for name in ["gzip", "deflate", "br", "zstd"] {
            let e = decode(b"{\"not\":\"compressed at all\"}".to_vec(), name, 1 << 20)
                .err()
                .unwrap();
            assert_eq!(e.status(), 400, "{name}: {e}");
            assert!(e.to_string().contains(name), "{e}");
        }
        let mut cut = gzip(TEXT);
        cut.truncate(cut.len() - 6);
        assert_eq!(decode(cut, "gzip", 1 << 20).err().unwrap().status(), 400);
    }

    #[test]
    fn a_frame_from_libzstd_decodes() {
        // Python's `zstandard` (libzstd) at level 19, with a checksum and the content size: what real clients send,
        // beside the frames of ruzstd's own encoder that the other tests use.
        let frame = hex::decode(
            "28b52ffd64b3002d0200a2c40e11a0edd4cdbcbee035ab355285205e40f53095d40314e1348c41eb974033efba78741b5d9f\
             87bf85f2e2cbfd4e87385c5520dcf6f076715ed4ed3401008699a9330a3e47c5ee",
        )
        .unwrap();
        let want = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "hello from libzstd ".repeat(20)
        );
        assert_eq!(decode(frame, "zstd", 1 << 20).unwrap(), want.as_bytes());
    }

    #[test]
    fn zstd_reads_every_frame_and_skips_skippable_ones() {
        let mut body = zstd(b"{\"a\":");
        body.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"xyz");
        body.extend_from_slice(&zstd(b"1}"));
        assert_eq!(decode(body, "zstd", 1 << 20).unwrap(), &b"{\"a\":1}"[..]);
    }

    #[test]
    fn a_bomb_stops_at_the_bound_plus_a_chunk() {
        let zeros = vec![0u8; 8 << 20];
        let limit = 1 << 20;
        for (body, name) in [
            (gzip(&zeros), "gzip"),
            (zlib(&zeros), "deflate"),
            (br(&zeros), "br"),
            (zstd(&zeros), "zstd"),
            (gzip(&gzip(&zeros)), "gzip, gzip"),
            (br(&gzip(&zeros)), "gzip, br"),
        ] {
            let c = codings(name).unwrap().unwrap();
            let mut d = Decoding::new(Bytes::from(body), c, limit).unwrap();
            let mut most = 0;
            let e = d
                .run(usize::MAX, &mut |n| {
                    most = n;
                    Ok(())
                })
                .err()
                .unwrap();
            assert_eq!(e.status(), 413, "{name}: {e}");
            assert!(e.to_string().contains("server.max_body_bytes"), "{e}");
            assert!(most <= limit, "{name}: kept {most}");
            assert!(d.out.capacity() <= limit as usize, "{name}");
        }
    }

    #[test]
    fn a_zstd_window_beyond_8_mib_is_refused() {
        // A frame header declaring a 16 MiB window (Window_Descriptor exponent 14), and no content.
        let mut body = 0xFD2F_B528u32.to_le_bytes().to_vec();
        body.extend_from_slice(&[0x00, 14 << 3]);
        let e = decode(body, "zstd", 1 << 30).err().unwrap();
        assert_eq!(e.status(), 400, "{e}");
        assert!(e.to_string().contains("window_size is too big"), "{e}");
    }

    #[test]
    fn a_budget_pauses_and_run_resumes() {
        let big: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let c = codings("gzip").unwrap().unwrap();
        let mut d = Decoding::new(Bytes::from(gzip(&big)), c, 1 << 24).unwrap();
        let mut ok = |_| Ok(());
        assert!(!d.run(CHUNK, &mut ok).unwrap(), "paused after its budget");
        assert!(d.out.len() < big.len());
        assert!(d.run(usize::MAX, &mut ok).unwrap());
        assert_eq!(d.finish(), big);
    }

    #[test]
    fn a_refused_reservation_ends_the_decoding() {
        let c = codings("gzip").unwrap().unwrap();
        let mut d = Decoding::new(Bytes::from(gzip(&[b' '; 100_000])), c, 1 << 20).unwrap();
        let e = d
            .run(usize::MAX, &mut |_| Err(GatewayError::bad_request("busy")))
            .err()
            .unwrap();
        assert_eq!(e.to_string(), "busy");
    }
}
