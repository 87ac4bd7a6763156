//! What both registration modes share: the endpoint task's context, binding and stopping a
//! DevicePlugin server, removing its socket, and pausing with backoff (cut short when
//! `kubelet.sock` appears). A leaf: it imports neither mode nor the endpoints.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

use super::KubeletPaths;
use super::dirwatch::DirEvent;
use super::service::DevicePluginService;
use crate::plugin_socket::{Registration, RegistrationState, Stage};
use crate::proto::deviceplugin::device_plugin_server::DevicePluginServer;

pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a stopping generation's server may take to close its connections.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What every endpoint task needs: kubelet's paths, directory events, its cancel token, where it
/// reports where its registration stands (read by `Endpoints::states`, `/readyz` and `/status`)
/// and counts registrations.
pub(super) struct EndpointCtx {
    pub paths: KubeletPaths,
    pub events: broadcast::Receiver<DirEvent>,
    pub cancel: CancellationToken,
    pub registration: watch::Sender<RegistrationState>,
    pub registrations: Arc<AtomicU64>,
    /// How long kubelet may take to complete a registration before an ERROR (and, in `auto`
    /// mode, the fall back from the plugin watcher to `kubelet.sock`).
    pub patience: Duration,
}

impl EndpointCtx {
    /// Move the registration to `stage`.
    pub fn set(&self, stage: Stage) {
        self.registration.send_modify(|r| r.enter(stage));
    }

    /// Registrations from now on are of `mode` on `socket`.
    pub(crate) fn registering_at(&self, mode: crate::plugin_socket::Mode, socket: &Path) {
        self.registration.send_modify(|r| {
            r.mode = mode;
            r.socket = socket.to_owned();
        });
    }
}

/// Identity of a file: a re-created `kubelet.sock` has a new one even at the same path.
pub(super) fn file_id(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Serve DevicePlugin (and, in watcher mode, the plugin-watcher Registration) on `path`.
pub(super) fn serve(
    path: &Path,
    svc: DevicePluginService,
    watcher_reg: Option<Registration>,
    stop: CancellationToken,
) -> std::io::Result<JoinHandle<()>> {
    use crate::plugin_socket::serve::MAX_DEVICE_PLUGIN_REQUEST;
    let mut routes = Routes::new(DevicePluginServer::new(svc).max_decoding_message_size(MAX_DEVICE_PLUGIN_REQUEST));
    if let Some(reg) = watcher_reg {
        routes = routes.add_service(reg.service());
    }
    crate::plugin_socket::serve(path, routes, stop, "device plugin server")
}

pub(super) async fn stop_server(stop: &CancellationToken, server: JoinHandle<()>) {
    stop.cancel();
    let abort = server.abort_handle();
    if tokio::time::timeout(STOP_GRACE, server).await.is_err() {
        abort.abort();
    }
}

/// Sleep for `d`, cut short by `kubelet.sock` appearing (when there is one to wait for).
/// Returns false when cancelled.
pub(super) async fn pause(ctx: &mut EndpointCtx, d: Duration, kubelet_sock: Option<&Path>) -> bool {
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = ctx.cancel.cancelled() => return false,
            _ = &mut sleep => return true,
            ev = ctx.events.recv() => match ev {
                Ok(DirEvent::Created(p)) if Some(p.as_path()) == kubelet_sock => return true,
                Err(broadcast::error::RecvError::Closed) => return false,
                _ => {}
            },
        }
    }
}

/// Wait out `backoff` (see [`pause`]) and double it for the next failure, up to
/// [`MAX_BACKOFF`]. Returns false when cancelled.
pub(super) async fn back_off(ctx: &mut EndpointCtx, backoff: &mut Duration, kubelet_sock: Option<&Path>) -> bool {
    let go_on = pause(ctx, *backoff, kubelet_sock).await;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    go_on
}

pub(super) async fn finish(stop: &CancellationToken, server: JoinHandle<()>, sock_path: &Path) {
    stop_server(stop, server).await;
    crate::plugin_socket::bind::unbind(sock_path);
}
