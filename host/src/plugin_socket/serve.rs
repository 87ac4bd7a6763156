//! Serving a tonic router on a plugin socket, every connection through the
//! [`authority`](super::authority) front, until a cancel token fires; and the bounds every such
//! socket keeps whoever connects (any local client can): at most [`MAX_CONNECTIONS`] at once (a
//! new one takes the place of the connection quiet longest, see [`super::admission`]; when every
//! one is serving a request, it is closed, with an ERROR), the request bytes of all of them under
//! [`super::admission::REQUEST_BYTES`], a connection owing a header block past
//! [`HEADER_DEADLINE`](super::authority::HEADER_DEADLINE) closed, at most
//! [`MAX_STREAMS`] requests at once on one connection, each bounded by [`REQUEST_TIMEOUT`] and
//! its message by the socket's own size ([`MAX_DEVICE_PLUGIN_REQUEST`], [`MAX_DRA_REQUEST`],
//! [`MAX_REGISTRATION_REQUEST`], set where each service is built), and
//! an accept error (out of file descriptors) logged and waited out instead of ending the server.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

use super::authority::KubeletStream;

/// Connections one socket holds at once. Kubelet keeps one or two per socket (its device
/// manager's, its DRA client's, a registration call's); 2,000 idle ones grew devplug from 27 to
/// 407 MiB and, past the open-file limit, left kubelet's NodePrepareResources unanswered.
pub const MAX_CONNECTIONS: usize = 128;
/// Requests (HTTP/2 streams) one connection may have open at once, told to the client in its
/// SETTINGS; grpc-go waits for a stream to end before it opens one past it, and a client that
/// opens more is refused (`RST_STREAM REFUSED_STREAM`). Kubelet keeps a ListAndWatch or health
/// stream and makes its calls beside it. Each request under way costs the host about 11 KiB
/// before its body comes (tonic's decode buffer, h2's stream, the call's task): 128 connections
/// holding 16 each grew devplug by 45 MiB; at 4, about 12 MiB.
pub const MAX_STREAMS: u32 = 4;
/// The largest request message the Device Plugin socket decodes. Kubelet's largest is a
/// `GetPreferredAllocation` naming every device of a resource twice (available and must-include):
/// at devplug's caps (8,192 devices, 63-byte IDs) about 1.1 MiB; this is that with headroom.
/// tonic reads the length prefix and refuses a longer message before buffering its body
/// (`OUT_OF_RANGE`, "decoded message length too large"); its default was 4 MiB on every socket.
pub(crate) const MAX_DEVICE_PLUGIN_REQUEST: usize = 2 << 20;
/// The largest request message a DRA socket decodes. Kubelet sends one pod's claims per
/// `NodePrepareResources`/`NodeUnprepareResources`, each about 360 bytes at the longest names
/// (a 36-byte UID, a 253-byte name, a 63-byte namespace): 64 KiB holds 180 of them.
pub(crate) const MAX_DRA_REQUEST: usize = 64 << 10;
/// The largest request message the plugin-watcher `Registration` service decodes: kubelet sends
/// an empty `InfoRequest` and a `RegistrationStatus` with its error text.
pub(crate) const MAX_REGISTRATION_REQUEST: usize = 16 << 10;
/// The longest a request may take from its headers to its answer (kubelet's own deadlines are
/// shorter: 45 s for a prepare); a streaming call (ListAndWatch) answers at once and streams on.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an accept error (EMFILE) is waited out before the next accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The least time between two ERRORs about refused connections on one socket.
const LOG_GAP: Duration = Duration::from_secs(60);

/// Bind `path` (see [`super::bind`]) and serve `routes` there until `stop`; `what` names the
/// server in the log line of an abnormal end.
pub fn serve(
    path: &Path,
    routes: Routes,
    stop: CancellationToken,
    what: &'static str,
) -> std::io::Result<JoinHandle<()>> {
    let listener = super::bind(path)?;
    let shown = path.display().to_string();
    let incoming = accepted(listener, Arc::new(Semaphore::new(MAX_CONNECTIONS)), shown.clone());
    Ok(tokio::spawn(async move {
        let server = tonic::transport::Server::builder()
            .timeout(REQUEST_TIMEOUT)
            .max_concurrent_streams(Some(MAX_STREAMS))
            .layer(super::admission::Track { budget: super::admission::BYTES.clone() })
            .add_routes(routes);
        if let Err(e) = server.serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await {
            tracing::warn!(socket = %shown, error = %e, "{what} stopped with an error");
        }
    }))
}

/// How long a new connection waits, at the cap, for the connection told to make room to go.
const ROOM_WAIT: Duration = Duration::from_secs(1);

/// What one socket's accept loop remembers for its log.
struct Accepting {
    listener: UnixListener,
    slots: Arc<Semaphore>,
    connections: super::admission::Connections,
    socket: String,
    refused: u64,
    logged: Option<Instant>,
}

impl Accepting {
    /// An ERROR about `what`, at most once per [`LOG_GAP`] with the count since the last one.
    fn complain(&mut self, what: &str) {
        self.refused += 1;
        if self.logged.is_some_and(|t| t.elapsed() < LOG_GAP) {
            return;
        }
        tracing::error!(
            socket = %self.socket,
            refused = self.refused,
            "{what}; a local client is holding connections open or the process is out of file descriptors (see /proc/<pid>/fd, and who else connects to this socket)"
        );
        self.logged = Some(Instant::now());
        self.refused = 0;
    }
}

/// The connections of `listener` that fit under `slots`, each through the authority front.
fn accepted(
    listener: UnixListener,
    slots: Arc<Semaphore>,
    socket: String,
) -> impl futures::Stream<Item = std::io::Result<KubeletStream<tokio::net::UnixStream>>> {
    let state = Accepting { listener, slots, connections: Default::default(), socket, refused: 0, logged: None };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            match s.listener.accept().await {
                Ok((conn, _)) => {
                    let slot = match s.slots.clone().try_acquire_owned() {
                        Ok(slot) => Some(slot),
                        // At the cap: the connection quiet longest makes room, if there is one.
                        Err(_) if s.connections.close_quietest() => {
                            s.complain(&format!(
                                "connection limit of {MAX_CONNECTIONS} reached: the connection quiet longest was closed to make room for a new one"
                            ));
                            tokio::time::timeout(ROOM_WAIT, s.slots.clone().acquire_owned())
                                .await
                                .ok()
                                .and_then(Result::ok)
                        }
                        Err(_) => None,
                    };
                    match slot {
                        Some(slot) => {
                            let standing = s.connections.admit();
                            return Some((Ok(KubeletStream::new(conn, standing, Some(slot))), s));
                        }
                        None => {
                            drop(conn);
                            s.complain(&format!(
                                "connection limit of {MAX_CONNECTIONS} reached and every connection is serving a request: new connections are closed"
                            ));
                        }
                    }
                }
                Err(e) => {
                    s.complain(&format!("accepting a connection failed: {e}"));
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    })
}
