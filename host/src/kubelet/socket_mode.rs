//! Socket mode: serve the resource's socket in kubelet's device-plugins dir, `Register` on
//! `kubelet.sock`, and ride out kubelet restarts.
//!
//! A kubelet restart fires several signs at once (its streams close, it wipes our socket, it
//! re-creates `kubelet.sock`). They are taken as one: after the first, devplug waits for the new
//! `kubelet.sock`, re-serves only if its own socket is really gone (a socket kubelet may be
//! dialing is never replaced), and registers once, with the server already answering.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::dirwatch::DirEvent;
use super::plumbing::{EndpointCtx, FIRST_BACKOFF, MAX_BACKOFF, back_off, file_id, finish, pause, serve, stop_server};
use super::registration::register;
use super::service::{DevicePluginService, StreamTracker};
use super::{ResourceHandle, names};
use crate::plugin_socket::Stage;
use crate::proto::deviceplugin::KUBELET_SOCKET;

/// How long a sign of a kubelet restart (our stream closed, our socket gone) waits for the new
/// `kubelet.sock` before devplug registers again anyway (kubelet dropped us without restarting).
const RESTART_GRACE: Duration = Duration::from_secs(10);
/// How often the wait for a new kubelet looks again without an event.
const RECHECK: Duration = Duration::from_millis(250);

/// A file's identity (see [`file_id`]); `None` when it is not there.
type FileId = Option<(u64, i64, i64)>;

/// One serving generation: the server on our socket and the socket file it bound.
struct Generation {
    stop: CancellationToken,
    server: JoinHandle<()>,
    tracker: Arc<StreamTracker>,
    socket: FileId,
}

/// How a registration attempt ended.
enum Registration {
    /// Kubelet took it; the identity of the `kubelet.sock` it came through.
    Done(FileId),
    /// Our socket went away before kubelet took it: serve it again first.
    SocketGone,
    /// The endpoint is being stopped.
    Cancelled,
}

/// One resource's endpoint in socket mode: its paths and retry state, a method per phase.
struct SocketEndpoint {
    ctx: EndpointCtx,
    handle: ResourceHandle,
    sock_name: String,
    sock_path: PathBuf,
    kubelet_sock: PathBuf,
    backoff: Duration,
}

/// Serve and register `handle` until the endpoint is cancelled; the socket is removed then.
pub(super) async fn run(ctx: EndpointCtx, handle: ResourceHandle) {
    let sock_name = names::socket_file_name(&handle.name);
    let sock_path = ctx.paths.device_plugin_dir.join(&sock_name);
    let kubelet_sock = ctx.paths.device_plugin_dir.join(KUBELET_SOCKET);
    ctx.registering_at(crate::plugin_socket::Mode::KubeletSocket, &sock_path);
    let mut ep = SocketEndpoint { ctx, handle, sock_name, sock_path, kubelet_sock, backoff: FIRST_BACKOFF };
    let mut reason = "start";
    let mut current: Option<Generation> = None;
    loop {
        let Some(gen_) = ep.serving(current.take()).await else { return };
        let kubelet_id = match ep.register(&gen_).await {
            Registration::Done(id) => id,
            Registration::SocketGone => {
                current = Some(gen_);
                continue;
            }
            Registration::Cancelled => return ep.finish(gen_).await,
        };
        ep.registered(reason);
        reason = match ep.serve_until_restart(&gen_, kubelet_id).await {
            Some(r) => r,
            None => return ep.finish(gen_).await,
        };
        if !ep.wait_for_new_kubelet(kubelet_id).await {
            return ep.finish(gen_).await;
        }
        current = Some(gen_);
    }
}

impl SocketEndpoint {
    /// The generation serving our socket: `current` while the socket it bound is still there,
    /// else a new server (retried with backoff). `None` when cancelled.
    async fn serving(&mut self, current: Option<Generation>) -> Option<Generation> {
        match current {
            Some(g) if g.socket.is_some() && file_id(&self.sock_path) == g.socket => return Some(g),
            Some(stale) => stop_server(&stale.stop, stale.server).await,
            None => {}
        }
        loop {
            let stop = self.ctx.cancel.child_token();
            let tracker = Arc::new(StreamTracker::default());
            let svc = DevicePluginService::new(self.handle.clone(), tracker.clone(), stop.clone());
            match serve(&self.sock_path, svc, None, stop.clone()) {
                Ok(server) => return Some(Generation { stop, server, tracker, socket: file_id(&self.sock_path) }),
                Err(e) => {
                    tracing::error!(resource = %self.handle.name, socket = %self.sock_path.display(), error = %e, "cannot serve the plugin socket; retrying");
                    if !back_off(&mut self.ctx, &mut self.backoff, Some(&self.kubelet_sock)).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Register, waiting for kubelet and backing off on refusals.
    async fn register(&mut self, gen_: &Generation) -> Registration {
        let mut said_waiting = false;
        loop {
            if self.ctx.cancel.is_cancelled() {
                return Registration::Cancelled;
            }
            if file_id(&self.sock_path) != gen_.socket {
                return Registration::SocketGone;
            }
            if !self.kubelet_sock.exists() {
                if !said_waiting {
                    tracing::info!(resource = %self.handle.name, kubelet = %self.kubelet_sock.display(), "waiting for kubelet");
                    said_waiting = true;
                }
                self.ctx.set(Stage::Serving);
                if !pause(&mut self.ctx, MAX_BACKOFF, Some(&self.kubelet_sock)).await {
                    return Registration::Cancelled;
                }
                continue;
            }
            let id = file_id(&self.kubelet_sock);
            match register(&self.kubelet_sock, &self.sock_name, &self.handle).await {
                Ok(()) => return Registration::Done(id),
                Err(e) => {
                    tracing::warn!(resource = %self.handle.name, error = %e, retry_in = ?self.backoff, "registration failed");
                    self.ctx.set(Stage::Refused(e.to_string()));
                    if !back_off(&mut self.ctx, &mut self.backoff, Some(&self.kubelet_sock)).await {
                        return Registration::Cancelled;
                    }
                }
            }
        }
    }

    /// Count and announce a registration kubelet took (`reason`: what made us register).
    fn registered(&mut self, reason: &str) {
        self.backoff = FIRST_BACKOFF;
        self.ctx.registrations.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.handle.metrics {
            m.registered(&self.handle.name, reason != "start");
        }
        self.ctx.set(Stage::Registered);
        tracing::info!(resource = %self.handle.name, socket = %self.sock_name, reason, "registered with kubelet");
    }

    /// Serve until something says kubelet restarted; that sign, or `None` when cancelled.
    async fn serve_until_restart(&mut self, gen_: &Generation, kubelet_id: FileId) -> Option<&'static str> {
        let reason = loop {
            tokio::select! {
                // First: a devplug stopping closes its own streams too, which is not kubelet
                // restarting.
                biased;
                _ = self.ctx.cancel.cancelled() => return None,
                _ = gen_.tracker.all_closed() => break "kubelet closed ListAndWatch",
                ev = self.ctx.events.recv() => match ev {
                    Ok(DirEvent::Created(p)) if p == self.kubelet_sock && file_id(&self.kubelet_sock) != kubelet_id => {
                        break "kubelet.sock re-created"
                    }
                    Ok(DirEvent::Removed(p)) if p == self.sock_path && file_id(&self.sock_path) != gen_.socket => {
                        break "plugin socket deleted"
                    }
                    Err(broadcast::error::RecvError::Lagged(_))
                        if file_id(&self.sock_path) != gen_.socket || file_id(&self.kubelet_sock) != kubelet_id =>
                    {
                        break "kubelet dir changed"
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                    _ => {}
                },
            }
        };
        if self.ctx.cancel.is_cancelled() {
            return None;
        }
        self.ctx.set(Stage::Starting);
        tracing::info!(resource = %self.handle.name, reason, "kubelet went away (restarting, or stopped); waiting for its new socket");
        Some(reason)
    }

    /// The other signs of the same restart arrive now: wait for the new `kubelet.sock` (or, if
    /// none comes within [`RESTART_GRACE`], go on with the one there is). False when cancelled.
    async fn wait_for_new_kubelet(&mut self, kubelet_id: FileId) -> bool {
        let give_up = tokio::time::Instant::now() + RESTART_GRACE;
        loop {
            let now = file_id(&self.kubelet_sock);
            if (now.is_some() && now != kubelet_id) || tokio::time::Instant::now() >= give_up {
                return true;
            }
            tokio::select! {
                _ = self.ctx.cancel.cancelled() => return false,
                _ = tokio::time::sleep(RECHECK) => {}
                ev = self.ctx.events.recv() => if let Err(broadcast::error::RecvError::Closed) = ev {
                    return false;
                },
            }
        }
    }

    async fn finish(&self, gen_: Generation) {
        finish(&gen_.stop, gen_.server, &self.sock_path).await;
    }
}
