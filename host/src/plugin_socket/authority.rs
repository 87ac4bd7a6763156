//! An HTTP/2 front on every accepted plugin connection that makes kubelet's `:authority`
//! acceptable to tonic's h2.
//!
//! Kubelet's plugin watcher dials with `grpc.DialContext(socketPath)` and a context dialer, so
//! grpc-go sends the socket path, percent-encoded, as `:authority`
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F<name>-reg.sock`; older grpc-go sent the raw
//! path). h2 parses `:authority` as a URI authority, refuses both forms and resets the stream
//! with PROTOCOL_ERROR before any service code runs (hyperium/h2#487, open since 2020), so no
//! plugin served by tonic could ever register through the watcher.
//!
//! This front sits in the read half of the connection, below h2: it parses the client's frames
//! (only their 9-byte headers, RFC 9113 §4.1), decodes each header block with the connection's
//! HPACK state ([`loona_hpack`]), replaces an `:authority` that is not a URI authority with
//! `localhost` (what grpc-go sends for `unix:` targets, and what h2 accepts), and encodes the
//! block again. Every other frame passes through unchanged, streamed, and the write half is
//! untouched. It was chosen over forking h2 or tonic because it keeps both as they are, and over
//! a proxy socket because it adds no hop: it is a wrapper around the accepted stream.
//!
//! A connection's first header block decides: an acceptable `:authority` (kubelet's device
//! manager and DRA client send `localhost`) passes that block and everything after it through
//! unchanged, without decoding anything more — a gRPC client keeps one authority per connection,
//! and the Allocate path pays for one decode per connection, not per call. A refused one puts
//! the connection in rewriting mode: every header block from then on is re-encoded (not only
//! the ones it changes), because the client's blocks refer to its HPACK dynamic table by index
//! and h2's decoder must see one consistent encoder. Our encoder keeps no dynamic table (size
//! 0), so what h2 decodes never depends on state kept here. A block that cannot be decoded, or that grows past [`MAX_BLOCK`], ends the connection
//! with an error (h2 would end it with COMPRESSION_ERROR); bytes before the preface that are
//! not HTTP/2 pass through untouched for h2 to refuse.

use std::borrow::Cow;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest header block (all fragments of one HEADERS + CONTINUATIONs) and the largest
/// decoded header list (RFC 7541 sizes: name + value + 32 per field) accepted. Kubelet's are
/// about 150 bytes; tonic refuses lists over 16 KiB anyway.
pub(crate) const MAX_BLOCK: usize = 64 * 1024;
/// Frames one header block may span (a HEADERS and its CONTINUATIONs), and the bytes those
/// frames may take on the wire, their 9-byte headers included: a block of empty CONTINUATION
/// frames carries no payload, so a payload cap alone let one connection grow devplug past 1 GiB.
/// Kubelet's blocks are one frame.
pub(crate) const MAX_BLOCK_FRAMES: usize = 64;
pub(crate) const MAX_BLOCK_WIRE: usize = MAX_BLOCK + MAX_BLOCK_FRAMES * FRAME_HEADER;
/// Frames written to h2 stay within the smallest SETTINGS_MAX_FRAME_SIZE a peer may use.
const MAX_FRAME: usize = 16_384;
/// The dynamic table a decoder starts with (SETTINGS_HEADER_TABLE_SIZE's default; tonic's h2
/// does not change it, so no client may grow its table past it).
const CLIENT_TABLE: usize = 4_096;
/// What stands in for an authority h2 would refuse.
pub(crate) const LOCALHOST: &[u8] = b"localhost";

/// Whether h2 accepts `value` as `:authority`.
pub(crate) fn acceptable(value: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(value).is_ok()
}

enum Phase {
    /// This many preface bytes have been seen.
    Preface(usize),
    Frames,
    /// Not HTTP/2 with prior knowledge: everything passes unchanged.
    Raw,
}

/// A HEADERS frame whose block continues in CONTINUATION frames.
struct OpenBlock {
    stream: u32,
    /// HEADERS flags kept on the re-encoded frame (END_STREAM, PRIORITY).
    flags: u8,
    priority: Option<[u8; 5]>,
    fragments: Vec<u8>,
    /// The block's frames as they came (passed on unchanged when nothing needs rewriting).
    raw: Vec<u8>,
    /// Frames and wire bytes the block has taken so far (bounded: [`MAX_BLOCK_FRAMES`],
    /// [`MAX_BLOCK_WIRE`]).
    frames: usize,
    wire: usize,
}

/// The read-side rewriter: raw client bytes in, bytes for h2 out.
pub struct Rewriter {
    phase: Phase,
    input: BytesMut,
    output: BytesMut,
    /// Payload bytes of the current pass-through frame still to come.
    passing: usize,
    open: Option<OpenBlock>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    /// How many `:authority` values were replaced on this connection.
    pub rewritten: u64,
    /// The first header block set the connection's mode (rewriting, or passing through).
    decided: bool,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(CLIENT_TABLE);
        let mut encoder = loona_hpack::Encoder::new();
        encoder.set_max_table_size(0);
        Rewriter {
            phase: Phase::Preface(0),
            input: BytesMut::new(),
            output: BytesMut::new(),
            passing: 0,
            open: None,
            decoder,
            encoder,
            rewritten: 0,
            decided: false,
        }
    }
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

impl Rewriter {
    /// Take `bytes` from the client; what h2 may read is in [`Self::ready`] afterwards.
    pub fn feed(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.input.extend_from_slice(bytes);
        self.process()
    }

    /// Bytes ready for h2.
    pub fn ready(&mut self) -> &mut BytesMut {
        &mut self.output
    }

    /// Whether the connection is still owed a complete header block: its first one (a client
    /// that connects and never asks anything is not kubelet), or one it has begun and not
    /// ended. [`KubeletStream`] gives it [`HEADER_DEADLINE`].
    pub fn waiting(&self) -> bool {
        !self.decided || self.open.is_some()
    }

    /// The client closed: whatever is left (a torn frame) goes to h2 as it came.
    pub fn finish(&mut self) {
        let rest = self.input.split();
        self.output.extend_from_slice(&rest);
    }

    fn process(&mut self) -> io::Result<()> {
        loop {
            match self.phase {
                Phase::Raw => {
                    let all = self.input.split();
                    self.output.extend_from_slice(&all);
                    return Ok(());
                }
                Phase::Preface(seen) => {
                    let n = (PREFACE.len() - seen).min(self.input.len());
                    if self.input[..n] != PREFACE[seen..seen + n] {
                        self.phase = Phase::Raw;
                        continue;
                    }
                    let part = self.input.split_to(n);
                    self.output.extend_from_slice(&part);
                    if seen + n < PREFACE.len() {
                        self.phase = Phase::Preface(seen + n);
                        return Ok(());
                    }
                    self.phase = Phase::Frames;
                }
                Phase::Frames => {
                    if self.passing > 0 {
                        let n = self.passing.min(self.input.len());
                        let part = self.input.split_to(n);
                        self.output.extend_from_slice(&part);
                        self.passing -= n;
                        if self.passing > 0 {
                            return Ok(());
                        }
                    }
                    if self.input.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let h = &self.input[..FRAME_HEADER];
                    let length = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                    let (kind, flags) = (h[3], h[4]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    let in_block = self.open.is_some();
                    if kind != HEADERS && kind != CONTINUATION {
                        if in_block {
                            return Err(invalid("a frame interrupted a header block (RFC 9113 §6.10)"));
                        }
                        let head = self.input.split_to(FRAME_HEADER);
                        self.output.extend_from_slice(&head);
                        self.passing = length;
                        continue;
                    }
                    if length > MAX_BLOCK {
                        return Err(invalid(format!("a header frame of {length} bytes (at most {MAX_BLOCK})")));
                    }
                    if self.input.len() < FRAME_HEADER + length {
                        return Ok(());
                    }
                    let frame = self.input.split_to(FRAME_HEADER + length);
                    self.header_frame(kind, flags, stream, &frame)?;
                }
            }
        }
    }

    /// One HEADERS or CONTINUATION `frame` (its 9-byte header included).
    fn header_frame(&mut self, kind: u8, flags: u8, stream: u32, frame: &[u8]) -> io::Result<()> {
        let payload = &frame[FRAME_HEADER..];
        let fragment = match (kind, self.open.as_mut()) {
            (HEADERS, None) => {
                let mut body = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let (&p, rest) =
                        body.split_first().ok_or_else(|| invalid("a PADDED HEADERS frame without its pad length"))?;
                    pad = usize::from(p);
                    body = rest;
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    let p: [u8; 5] = body
                        .get(..5)
                        .and_then(|p| p.try_into().ok())
                        .ok_or_else(|| invalid("a HEADERS frame too short for its priority"))?;
                    priority = Some(p);
                    body = &body[5..];
                }
                if pad > body.len() {
                    return Err(invalid("HEADERS padding longer than the frame"));
                }
                let body = &body[..body.len() - pad];
                self.open = Some(OpenBlock {
                    stream,
                    flags: flags & (END_STREAM | PRIORITY),
                    priority,
                    fragments: Vec::with_capacity(body.len()),
                    raw: Vec::new(),
                    frames: 0,
                    wire: 0,
                });
                body
            }
            (CONTINUATION, Some(open)) if open.stream == stream => payload,
            (CONTINUATION, _) => return Err(invalid("a CONTINUATION frame outside its header block")),
            _ => return Err(invalid("a HEADERS frame inside another header block")),
        };
        let Some(open) = self.open.as_mut() else { return Ok(()) };
        if open.fragments.len() + fragment.len() > MAX_BLOCK {
            return Err(invalid(format!("a header block over {MAX_BLOCK} bytes")));
        }
        open.frames += 1;
        open.wire += frame.len();
        if open.frames > MAX_BLOCK_FRAMES || open.wire > MAX_BLOCK_WIRE {
            return Err(invalid(format!(
                "a header block over {MAX_BLOCK_FRAMES} frames or {MAX_BLOCK_WIRE} bytes with their frame headers (a CONTINUATION flood)"
            )));
        }
        open.fragments.extend_from_slice(fragment);
        if !self.decided {
            open.raw.extend_from_slice(frame);
        }
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.open.take() else { return Ok(()) };
        self.reencode(block)
    }

    fn reencode(&mut self, block: OpenBlock) -> io::Result<()> {
        let mut fields: Vec<(Cow<'static, [u8]>, Vec<u8>)> = Vec::new();
        let mut list_size = 0usize;
        let mut too_big = false;
        let mut rewritten = 0;
        self.decoder
            .decode_with_cb(&block.fragments, |name, value| {
                list_size += name.len() + value.len() + 32;
                if list_size > MAX_BLOCK {
                    too_big = true;
                    return;
                }
                let value = if &*name == b":authority" && !acceptable(&value) {
                    rewritten += 1;
                    LOCALHOST.to_vec()
                } else {
                    value.into_owned()
                };
                fields.push((Cow::Owned(name.into_owned()), value));
            })
            .map_err(|e| invalid(format!("HPACK: {e}")))?;
        if too_big {
            return Err(invalid(format!("a header list over {MAX_BLOCK} bytes")));
        }
        self.rewritten += rewritten;
        if !self.decided {
            self.decided = true;
            if rewritten == 0 {
                // The client's own bytes, so h2's table is the client's from here on.
                self.output.extend_from_slice(&block.raw);
                self.phase = Phase::Raw;
                return Ok(());
            }
        }
        let encoded = self.encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
        let mut first = true;
        let mut rest: &[u8] = &encoded;
        loop {
            let prefix = if first { block.priority.map_or(0, |_| 5) } else { 0 };
            let take = rest.len().min(MAX_FRAME - prefix);
            let (chunk, after) = rest.split_at(take);
            let last = after.is_empty();
            let (kind, mut flags) = if first { (HEADERS, block.flags) } else { (CONTINUATION, 0) };
            if last {
                flags |= END_HEADERS;
            }
            let len = prefix + chunk.len();
            self.output.put_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
            self.output.put_u32(block.stream);
            if first && let Some(p) = block.priority {
                self.output.put_slice(&p);
            }
            self.output.put_slice(chunk);
            if last {
                return Ok(());
            }
            first = false;
            rest = after;
        }
    }
}

/// How long a connection may owe a complete header block (see [`Rewriter::waiting`]): kubelet
/// sends its first request with the connection (grpc-go connects when a call is made) and each
/// block in one write; 2,000 connections each holding a half-sent block grew devplug by 380 MiB
/// and were never let go.
pub(crate) const HEADER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// An accepted plugin connection with its read half passed through a [`Rewriter`], ended when it
/// owes a header block past [`HEADER_DEADLINE`], when it has been idle for
/// [`IDLE_TIMEOUT`](super::admission::IDLE_TIMEOUT) or when it is told to make room
/// ([`super::admission`]), holding `slot` (its place under the socket's connection limit) while
/// it lives. Ending is an end of input to h2, which closes the connection.
pub struct KubeletStream<S> {
    inner: S,
    rewriter: Rewriter,
    eof: bool,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    standing: Arc<super::admission::Conn>,
    idle: Pin<Box<tokio::time::Sleep>>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S> KubeletStream<S> {
    pub fn new(
        inner: S,
        standing: Arc<super::admission::Conn>,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Self {
        KubeletStream {
            inner,
            rewriter: Rewriter::default(),
            eof: false,
            deadline: Some(Box::pin(tokio::time::sleep(HEADER_DEADLINE))),
            standing,
            idle: Box::pin(tokio::time::sleep(super::admission::IDLE_TIMEOUT)),
            _slot: slot,
        }
    }

    /// Whether the connection is to end now: told to make room, or idle past its timeout (the
    /// timer wakes the reader when it may be).
    fn ending(&mut self, cx: &mut Context<'_>) -> bool {
        if self.standing.closing(cx.waker()) {
            return true;
        }
        let timeout = super::admission::IDLE_TIMEOUT;
        while self.idle.as_mut().poll(cx).is_ready() {
            match self.standing.quiet_for() {
                Some(quiet) if quiet >= timeout => return true,
                Some(quiet) => self.idle.as_mut().reset(tokio::time::Instant::now() + (timeout - quiet)),
                None => self.idle.as_mut().reset(tokio::time::Instant::now() + timeout),
            }
        }
        false
    }

    /// Pending while the client is within its time (the timer wakes the reader at the end);
    /// an error once it owes a header block past [`HEADER_DEADLINE`].
    fn in_time(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.rewriter.waiting() {
            self.deadline = None;
            return Poll::Pending;
        }
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(HEADER_DEADLINE)));
        ready!(deadline.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no complete header block within {HEADER_DEADLINE:?}: connection closed"),
        )))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for KubeletStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let ready = this.rewriter.ready();
            if !ready.is_empty() {
                let n = ready.len().min(buf.remaining());
                buf.put_slice(&ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.ending(cx) {
                this.eof = true;
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut raw = ReadBuf::new(&mut chunk);
            if Pin::new(&mut this.inner).poll_read(cx, &mut raw)?.is_pending() {
                return this.in_time(cx);
            }
            if raw.filled().is_empty() {
                this.eof = true;
                this.rewriter.finish();
            } else {
                let before = this.rewriter.rewritten;
                this.rewriter.feed(raw.filled())?;
                if before == 0 && this.rewriter.rewritten > 0 {
                    tracing::debug!(
                        "a client sent an :authority h2 refuses (kubelet's plugin watcher does); passed on as localhost"
                    );
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for KubeletStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for KubeletStream<tokio::net::UnixStream> {
    type ConnectInfo = super::admission::ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        super::admission::ConnInfo { uds: self.inner.connect_info(), conn: self.standing.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Split `bytes` (after the preface) into frames: (type, flags, stream, payload).
    fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&bytes[..PREFACE.len()], PREFACE);
        let mut rest = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            out.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        out
    }

    fn headers(decoder: &mut loona_hpack::Decoder<'static>, block: &[u8]) -> Vec<(String, String)> {
        decoder
            .decode(block)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    fn through(bytes: &[u8], chunk: usize) -> io::Result<Vec<u8>> {
        let mut r = Rewriter::default();
        for part in bytes.chunks(chunk) {
            r.feed(part)?;
        }
        r.finish();
        Ok(r.ready().to_vec())
    }

    /// Kubelet 1.36.2's plugin watcher, recorded byte for byte (tests/fixtures/k8s/README.md).
    fn recorded() -> Vec<u8> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/k8s/kubelet-1.36-plugin-registration.client.bin"),
        )
        .unwrap()
    }

    #[test]
    fn kubelets_recorded_authority_reaches_h2_as_localhost_and_nothing_else_changes() {
        let original = recorded();
        for chunk in [1, 7, 100, original.len()] {
            let out = through(&original, chunk).unwrap();
            let (before, after) = (frames(&original), frames(&out));
            assert_eq!(before.len(), after.len(), "one frame out for each frame in (chunk {chunk})");
            let (mut d_before, mut d_after) = (loona_hpack::Decoder::new(), loona_hpack::Decoder::new());
            let mut streams = Vec::new();
            for (b, a) in before.iter().zip(&after) {
                assert_eq!((b.0, b.2), (a.0, a.2), "type and stream kept");
                if b.0 != HEADERS {
                    assert_eq!(b, a, "non-header frames pass unchanged");
                    continue;
                }
                assert_eq!(a.1, b.1, "flags kept");
                let (hb, ha) = (headers(&mut d_before, &b.3), headers(&mut d_after, &a.3));
                assert_eq!(hb.len(), ha.len());
                for ((nb, vb), (na, va)) in hb.iter().zip(&ha) {
                    assert_eq!(nb, na);
                    if nb == ":authority" {
                        assert!(vb.starts_with("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F"), "{vb}");
                        assert_eq!(va, "localhost");
                    } else {
                        assert_eq!(vb, va, "{nb} kept");
                    }
                }
                streams.push(a.2);
            }
            // Stream 3 names the authority by dynamic-table index in the recording: decoding it
            // needs the state stream 1 built.
            assert_eq!(streams, [1, 3]);
        }
    }

    #[test]
    fn a_connection_that_starts_with_an_acceptable_authority_passes_unchanged() {
        let mut enc = loona_hpack::Encoder::new();
        let mut bytes = PREFACE.to_vec();
        for (id, authority) in [(1u32, "localhost"), (3, "localhost"), (5, "%2Flater")] {
            let block = enc.encode([(&b":method"[..], &b"POST"[..]), (b":authority", authority.as_bytes())]);
            bytes.extend(frame(HEADERS, END_HEADERS, id, &block));
            bytes.extend(frame(0x0, END_STREAM, id, b"x"));
        }
        let mut r = Rewriter::default();
        for part in bytes.chunks(5) {
            r.feed(part).unwrap();
        }
        assert_eq!(r.ready().to_vec(), bytes, "byte for byte: later blocks are not even decoded");
        assert_eq!(r.rewritten, 0);
    }

    #[test]
    fn valid_authorities_stay_and_raw_paths_are_replaced() {
        for (authority, want) in [
            ("localhost", "localhost"),
            ("/var/lib/kubelet/plugins_registry/x-reg.sock", "localhost"),
            ("%2Fvar%2Flib%2Fx.sock", "localhost"),
            ("127.0.0.1:80", "127.0.0.1:80"),
        ] {
            let mut enc = loona_hpack::Encoder::new();
            let block = enc.encode([(&b":method"[..], &b"POST"[..]), (b":authority", authority.as_bytes())]);
            let mut bytes = PREFACE.to_vec();
            bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
            let out = frames(&through(&bytes, 3).unwrap());
            let got = headers(&mut loona_hpack::Decoder::new(), &out[0].3);
            assert_eq!(got[1], (":authority".into(), want.into()), "{authority}");
            assert_eq!(out[0].1, END_HEADERS | END_STREAM);
        }
    }

    #[test]
    fn padded_prioritised_and_continued_blocks_are_joined_and_reframed() {
        let mut enc = loona_hpack::Encoder::new();
        let long = "x".repeat(20_000);
        let block = enc.encode([(&b":authority"[..], &b"/run/x.sock"[..]), (b"big", long.as_bytes())]);
        let (a, b) = block.split_at(10);
        let mut first = vec![3u8]; // pad length
        first.extend_from_slice(&[0x80, 0, 0, 1, 16]); // priority
        first.extend_from_slice(a);
        first.extend_from_slice(&[0, 0, 0]);
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &first));
        bytes.extend(frame(CONTINUATION, END_HEADERS, 5, b));
        bytes.extend(frame(0x0, 0, 5, b"data"));
        let out = frames(&through(&bytes, 4096).unwrap());
        assert_eq!(out[0].0, HEADERS);
        assert_eq!(out[0].1, PRIORITY | END_STREAM, "not padded, not ended: a continuation follows");
        assert_eq!(&out[0].3[..5], &[0x80, 0, 0, 1, 16], "priority kept");
        assert!(out[0].3.len() <= MAX_FRAME && out[1].3.len() <= MAX_FRAME);
        assert_eq!((out[1].0, out[1].1), (CONTINUATION, END_HEADERS));
        assert_eq!(out[2], (0x0, 0, 5, b"data".to_vec()));
        let mut joined = out[0].3[5..].to_vec();
        joined.extend_from_slice(&out[1].3);
        let got = headers(&mut loona_hpack::Decoder::new(), &joined);
        assert_eq!(got[0].1, "localhost");
        assert_eq!(got[1].1.len(), 20_000);
    }

    /// Issue 41: empty CONTINUATION frames carry no payload, so the 64 KiB payload cap never
    /// fired while the block's raw frames grew by 9 bytes each (25 MiB to past 1 GiB from one
    /// connection). The block is bounded by frames and by wire bytes.
    #[test]
    fn a_continuation_flood_ends_the_connection_before_it_grows() {
        let mut r = Rewriter::default();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, 0, 1, b""));
        r.feed(&bytes).unwrap();
        let empty = frame(CONTINUATION, 0, 1, b"");
        let mut fed = 0;
        let err = loop {
            match r.feed(&empty) {
                Ok(()) => fed += 1,
                Err(e) => break e,
            }
            assert!(fed < 100_000, "a flood of empty CONTINUATION frames was taken");
        };
        assert!(fed < MAX_BLOCK_FRAMES, "{fed} frames taken");
        assert!(err.to_string().contains("CONTINUATION flood"), "{err}");
        let kept = r.open.as_ref().map_or(0, |o| o.raw.len() + o.fragments.len());
        assert!(kept <= MAX_BLOCK_WIRE, "{kept} bytes kept");
    }

    #[test]
    fn hostile_blocks_end_the_connection_with_a_reason() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff, 0x7f]));
        assert!(through(&bytes, 64).unwrap_err().to_string().contains("HPACK"));

        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, 0, 1, &[0x82]));
        bytes.extend(frame(0x0, 0, 1, b"x"));
        assert!(through(&bytes, 64).unwrap_err().to_string().contains("interrupted"));

        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, 0, 1, &[0x82]));
        for _ in 0..5 {
            bytes.extend(frame(CONTINUATION, 0, 1, &vec![0u8; MAX_FRAME]));
        }
        assert!(through(&bytes, 4096).unwrap_err().to_string().contains("over"));

        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82]));
        assert!(through(&bytes, 64).unwrap_err().to_string().contains("padding"));
    }

    #[test]
    fn what_is_not_http2_passes_untouched() {
        let bytes = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(through(bytes, 5).unwrap(), bytes);
    }

    /// A connection with no request under way is closed after [`IDLE_TIMEOUT`](super::super::admission::IDLE_TIMEOUT) (an end of input
    /// to h2); one serving a request (kubelet's ListAndWatch) stays open.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_its_timeout_and_a_serving_one_is_not() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // What kubelet's first request leaves behind: the preface, SETTINGS and a whole header
        // block (`:authority: localhost`), so the header deadline is met.
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let block = [&[0x82, 0x86, 0x84, 0x41, 9][..], b"localhost"].concat();
        hello.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x4, 0, 0, 0, 1]);
        hello.extend_from_slice(&block);
        use super::super::admission::{Connections, IDLE_TIMEOUT, serving};
        use std::time::Duration;
        let conns = Connections::default();
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(&hello).await.unwrap();
        let mut idle = KubeletStream::new(server, conns.admit(), None);
        let mut got = vec![0u8; hello.len()];
        idle.read_exact(&mut got).await.unwrap();
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 16];
        assert_eq!(idle.read(&mut buf).await.unwrap(), 0, "closed");
        assert!(started.elapsed() >= IDLE_TIMEOUT - Duration::from_secs(1), "{:?}", started.elapsed());
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(&hello).await.unwrap();
        let standing = conns.admit();
        let _watch = serving(&standing);
        let mut serving = KubeletStream::new(server, standing, None);
        serving.read_exact(&mut got).await.unwrap();
        let read = tokio::time::timeout(IDLE_TIMEOUT * 3, serving.read(&mut buf)).await;
        assert!(read.is_err(), "still open while it serves a request: {read:?}");
    }
}
