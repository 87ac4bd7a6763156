//! HTTP/2 on the wire as kubelet's grpc-go writes it, for what no `http`-based client can send:
//! the `:authority` kubelet's plugin watcher uses (the socket path, percent-encoded; the `http`
//! crate refuses it, so tonic's client cannot send it either).
//!
//! Two users: the kubelet stand-in's plugin watcher (GetInfo + NotifyRegistrationStatus on one
//! connection, kubelet's `operationexecutor` order, with kubelet's exact `:authority`) and the
//! replay test, which writes kubelet's recorded bytes and reads what comes back. Frames are
//! parsed here from RFC 9113 §4.1 and HPACK comes from `loona_hpack`, independently of devplug's
//! own front (`devplug::plugin_socket::authority`), so a bug there cannot hide itself here.

use std::io;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// grpc-go's user agent in the recording.
pub const USER_AGENT: &str = "grpc-go/1.79.3";

/// What grpc-go's `encodeAuthority` makes of a dialed socket path: unreserved characters,
/// sub-delims and `:[]@` stay, everything else is percent-encoded (upper-case hex).
pub fn grpc_go_authority(target: &Path) -> String {
    let mut out = String::new();
    for b in target.as_os_str().as_encoded_bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]@".contains(b);
        if keep {
            out.push(char::from(*b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One frame.
#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A gRPC message on the wire: uncompressed flag, length, bytes.
pub fn grpc_message(body: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8];
    m.extend_from_slice(&(body.len() as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// How one stream ended, as the client saw it.
#[derive(Debug, Default)]
pub struct Answer {
    pub headers: Vec<(String, String)>,
    pub data: Vec<u8>,
    pub trailers: Vec<(String, String)>,
    /// RST_STREAM's error code, if the server reset the stream.
    pub reset: Option<u32>,
}

impl Answer {
    pub fn grpc_status(&self) -> Option<&str> {
        self.trailers.iter().chain(&self.headers).find(|(n, _)| n == "grpc-status").map(|(_, v)| v.as_str())
    }

    /// The first gRPC message of the answer's body.
    pub fn message(&self) -> Option<&[u8]> {
        let len = u32::from_be_bytes(self.data.get(1..5)?.try_into().ok()?) as usize;
        self.data.get(5..5 + len)
    }
}

/// One client connection, frame by frame.
pub struct Conn {
    stream: UnixStream,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    buf: Vec<u8>,
}

impl Conn {
    /// Connect without writing anything.
    pub async fn dial(path: &Path) -> io::Result<Conn> {
        let stream = UnixStream::connect(path).await?;
        Ok(Conn { stream, decoder: loona_hpack::Decoder::new(), encoder: loona_hpack::Encoder::new(), buf: Vec::new() })
    }

    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// The next frame the server sent; `None` at EOF.
    pub async fn read(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if self.buf.len() >= 9 {
                let len = (usize::from(self.buf[0]) << 16) | (usize::from(self.buf[1]) << 8) | usize::from(self.buf[2]);
                if self.buf.len() >= 9 + len {
                    let f = Frame {
                        kind: self.buf[3],
                        flags: self.buf[4],
                        stream: u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]) & 0x7fff_ffff,
                        payload: self.buf[9..9 + len].to_vec(),
                    };
                    self.buf.drain(..9 + len);
                    return Ok(Some(f));
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Read until the server's SETTINGS has come (the recorded SETTINGS ACK acknowledges it,
    /// so a replay writes past the preface only then). False at EOF.
    pub async fn server_settings(&mut self) -> io::Result<bool> {
        while let Some(f) = self.read().await? {
            if f.kind == SETTINGS && f.flags & ACK == 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn decode(&mut self, block: &[u8]) -> io::Result<Vec<(String, String)>> {
        let fields = self
            .decoder
            .decode(block)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("HPACK: {e:?}")))?;
        Ok(fields
            .into_iter()
            .map(|(n, v)| (String::from_utf8_lossy(&n).into_owned(), String::from_utf8_lossy(&v).into_owned()))
            .collect())
    }

    /// Read until every stream of `ids` has ended (trailers, END_STREAM or RST_STREAM) or the
    /// server closed, answering its SETTINGS and PINGs as grpc-go does; within `limit`.
    pub async fn answers(&mut self, ids: &[u32], limit: Duration) -> io::Result<Vec<Answer>> {
        let mut answers: Vec<(Answer, bool)> = ids.iter().map(|_| (Answer::default(), false)).collect();
        let reading = async {
            let mut block: Option<(u32, Vec<u8>, bool)> = None;
            while answers.iter().any(|(_, done)| !done) {
                let Some(f) = self.read().await? else { break };
                let at = ids.iter().position(|i| *i == f.stream);
                // Acknowledgements are best effort: after a client GOAWAY (a replay ends with
                // kubelet's) the server may have stopped reading while it still answers.
                match f.kind {
                    SETTINGS if f.flags & ACK == 0 => {
                        let _ = self.write(&frame(SETTINGS, ACK, 0, &[])).await;
                    }
                    PING if f.flags & ACK == 0 => {
                        let _ = self.write(&frame(PING, ACK, 0, &f.payload)).await;
                    }
                    // A server's GOAWAY still answers the streams up to its last stream ID.
                    GOAWAY => {}
                    RST_STREAM => {
                        if let Some(i) = at {
                            answers[i].0.reset =
                                f.payload.get(..4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                            answers[i].1 = true;
                        }
                    }
                    DATA => {
                        if let Some(i) = at {
                            answers[i].0.data.extend_from_slice(&f.payload);
                            answers[i].1 |= f.flags & END_STREAM != 0;
                        }
                    }
                    HEADERS | CONTINUATION => {
                        let (stream, mut bytes, ends) = match block.take() {
                            Some(open) => open,
                            None => (f.stream, Vec::new(), f.flags & END_STREAM != 0),
                        };
                        bytes.extend_from_slice(&f.payload);
                        if f.flags & END_HEADERS == 0 {
                            block = Some((stream, bytes, ends));
                            continue;
                        }
                        let fields = self.decode(&bytes)?;
                        if let Some(i) = ids.iter().position(|id| *id == stream) {
                            let a = &mut answers[i];
                            if a.0.headers.is_empty() {
                                a.0.headers = fields;
                            } else {
                                a.0.trailers = fields;
                            }
                            a.1 |= ends;
                        }
                    }
                    _ => {}
                }
            }
            Ok::<(), io::Error>(())
        };
        tokio::time::timeout(limit, reading).await.map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, format!("no end of streams {ids:?} within {limit:?}"))
        })??;
        Ok(answers.into_iter().map(|(a, _)| a).collect())
    }

    /// Start a connection as grpc-go does: the preface and an empty SETTINGS.
    pub async fn start(&mut self) -> io::Result<()> {
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        self.write(&hello).await
    }

    /// A unary call on stream `id` with grpc-go's headers, in its order, and `authority`.
    pub async fn unary(
        &mut self,
        id: u32,
        authority: &str,
        path: &str,
        timeout: &str,
        request: &[u8],
        limit: Duration,
    ) -> io::Result<Answer> {
        self.open(id, authority, path, timeout).await?;
        self.write(&frame(DATA, END_STREAM, id, &grpc_message(request))).await?;
        let mut answers = self.answers(&[id], limit).await?;
        Ok(answers.remove(0))
    }

    /// Open stream `id` with grpc-go's headers of a unary call and send no body yet: alone, a
    /// request that holds its stream open until the server gives up on it.
    pub async fn open(&mut self, id: u32, authority: &str, path: &str, timeout: &str) -> io::Result<()> {
        let fields: [(&[u8], &[u8]); 8] = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", authority.as_bytes()),
            (b"content-type", b"application/grpc"),
            (b"user-agent", USER_AGENT.as_bytes()),
            (b"te", b"trailers"),
            (b"grpc-timeout", timeout.as_bytes()),
        ];
        let block = self.encoder.encode(fields);
        self.write(&frame(HEADERS, END_HEADERS, id, &block)).await
    }

    /// Acknowledge the server's SETTINGS (read with [`Conn::server_settings`]).
    pub async fn ack_settings(&mut self) -> io::Result<()> {
        self.write(&frame(SETTINGS, ACK, 0, &[])).await
    }

    /// End the connection as grpc-go does (GOAWAY, then close).
    pub async fn close(mut self, last_stream: u32) {
        let mut payload = last_stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u32.to_be_bytes());
        payload.extend_from_slice(b"client transport shutdown");
        let _ = self.write(&frame(GOAWAY, 0, 0, &payload)).await;
        let _ = self.stream.shutdown().await;
    }
}
