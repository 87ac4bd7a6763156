//! The endpoints of this host, one per served resource, each a task that serves its socket and
//! registers in the chosen mode ([`super::socket_mode`], [`super::watcher_mode`]), and the
//! plumbing both modes share: binding and stopping a server, removing its socket, and pausing
//! with backoff (cut short when `kubelet.sock` appears). Kubelet not being there yet is waited
//! for, never a reason to exit.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::{Mutex, broadcast, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use super::dirwatch::{DirEvent, DirWatcher};
use super::registration::WatcherRegistration;
use super::service::DevicePluginService;
use super::state::EndpointState;
use super::{KubeletPaths, ResourceHandle, socket_mode, uds, watcher_mode};
use crate::proto::deviceplugin::device_plugin_server::DevicePluginServer;
use crate::proto::pluginregistration::registration_server::RegistrationServer;

/// How devplug announces itself to kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegistrationMode {
    /// Plugin watcher when kubelet's `plugins_registry` dir exists, else the kubelet socket.
    Auto,
    /// `Register` on `kubelet.sock` in the device-plugins dir.
    KubeletSocket,
    /// A socket in `plugins_registry` that kubelet's plugin watcher finds by itself.
    PluginWatcher,
}

struct Running {
    cancel: CancellationToken,
    task: JoinHandle<()>,
    state: watch::Receiver<EndpointState>,
}

/// All resource endpoints of this host.
pub struct Endpoints {
    paths: KubeletPaths,
    mode: RegistrationMode,
    watcher: DirWatcher,
    running: Mutex<HashMap<String, Running>>,
    /// Successful registrations (first ones and re-registrations), for metrics and tests.
    pub registrations: Arc<AtomicU64>,
}

pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a stopping generation's server may take to close its connections.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Endpoints {
    /// Resolve `Auto` (as the SR-IOV plugin does: the plugin watcher when its dir exists) and
    /// start watching kubelet's directories.
    pub fn new(paths: KubeletPaths, mode: RegistrationMode) -> anyhow::Result<Self> {
        let mode = match mode {
            RegistrationMode::Auto if paths.plugins_registry_dir.is_dir() => RegistrationMode::PluginWatcher,
            RegistrationMode::Auto => RegistrationMode::KubeletSocket,
            m => m,
        };
        let dirs: Vec<&Path> = match mode {
            RegistrationMode::PluginWatcher => vec![&paths.plugins_registry_dir],
            _ => vec![&paths.device_plugin_dir],
        };
        let watcher = DirWatcher::new(&dirs)?;
        tracing::info!(mode = ?mode, "kubelet registration mode");
        Ok(Endpoints { paths, mode, watcher, running: Mutex::new(HashMap::new()), registrations: Arc::default() })
    }

    /// Start serving a resource (replacing an endpoint of the same name).
    pub async fn add(&self, handle: ResourceHandle) {
        let name = handle.name.clone();
        self.remove(&name).await;
        let cancel = CancellationToken::new();
        let (state_tx, state) = watch::channel(EndpointState::Starting);
        let ctx = EndpointCtx {
            paths: self.paths.clone(),
            events: self.watcher.subscribe(),
            cancel: cancel.clone(),
            state: state_tx,
            registrations: self.registrations.clone(),
        };
        let task = match self.mode {
            RegistrationMode::PluginWatcher => tokio::spawn(watcher_mode::run(ctx, handle)),
            _ => tokio::spawn(socket_mode::run(ctx, handle)),
        };
        self.running.lock().await.insert(name, Running { cancel, task, state });
    }

    /// Stop serving a resource and remove its socket.
    pub async fn remove(&self, name: &str) {
        let running = self.running.lock().await.remove(name);
        if let Some(r) = running {
            r.cancel.cancel();
            let _ = r.task.await;
        }
    }

    /// Every endpoint's state, by resource name.
    pub async fn states(&self) -> Vec<(String, EndpointState)> {
        let running = self.running.lock().await;
        let mut v: Vec<_> = running.iter().map(|(n, r)| (n.clone(), r.state.borrow().clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Stop everything (SIGTERM): sockets are removed, tasks finished.
    pub async fn shutdown(&self) {
        let all: Vec<Running> = self.running.lock().await.drain().map(|(_, r)| r).collect();
        for r in &all {
            r.cancel.cancel();
        }
        for r in all {
            let _ = r.task.await;
        }
    }
}

/// What every endpoint task needs: kubelet's paths, directory events, its cancel token, where it
/// reports its state and counts registrations.
pub(super) struct EndpointCtx {
    pub paths: KubeletPaths,
    pub events: broadcast::Receiver<DirEvent>,
    pub cancel: CancellationToken,
    pub state: watch::Sender<EndpointState>,
    pub registrations: Arc<AtomicU64>,
}

/// Identity of a file: a re-created `kubelet.sock` has a new one even at the same path.
pub(super) fn file_id(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Serve DevicePlugin (and, in watcher mode, the plugin-watcher Registration) on `path`.
pub(super) fn serve(
    path: &Path,
    svc: DevicePluginService,
    watcher_reg: Option<WatcherRegistration>,
    stop: CancellationToken,
) -> std::io::Result<JoinHandle<()>> {
    let incoming = UnixListenerStream::new(uds::bind(path)?);
    let router = Server::builder()
        .add_service(DevicePluginServer::new(svc))
        .add_optional_service(watcher_reg.map(RegistrationServer::new));
    let shown = path.display().to_string();
    Ok(tokio::spawn(async move {
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await {
            tracing::warn!(socket = %shown, error = %e, "device plugin server stopped with an error");
        }
    }))
}

pub(super) async fn stop_server(stop: &CancellationToken, server: JoinHandle<()>) {
    stop.cancel();
    let abort = server.abort_handle();
    if tokio::time::timeout(STOP_GRACE, server).await.is_err() {
        abort.abort();
    }
}

fn remove_socket(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(socket = %path.display(), error = %e, "could not remove socket");
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
    remove_socket(sock_path);
}
