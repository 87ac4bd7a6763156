//! One resource's life with kubelet: serve its socket, register, and start over whenever kubelet
//! restarts — noticed by `kubelet.sock` being re-created, by our socket being deleted (kubelet
//! wipes the dir on start), or by kubelet closing the ListAndWatch stream. Kubelet not being there
//! yet is waited for, never a reason to exit.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, broadcast, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use super::dirwatch::{DirEvent, DirWatcher};
use super::registration::{WatcherRegistration, register};
use super::service::{DevicePluginService, StreamTracker};
use super::{KubeletPaths, ResourceHandle, names, uds};
use crate::proto::deviceplugin::{KUBELET_SOCKET, device_plugin_server::DevicePluginServer};
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

/// Where one resource stands with kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointState {
    Starting,
    WaitingForKubelet,
    Registered,
    /// Kubelet said no; retried with backoff.
    Refused(String),
}

/// The form `/status` and `devplug status` show (a wire format: keep it stable).
impl std::fmt::Display for EndpointState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointState::Starting => f.write_str("Starting"),
            EndpointState::WaitingForKubelet => f.write_str("WaitingForKubelet"),
            EndpointState::Registered => f.write_str("Registered"),
            EndpointState::Refused(why) => write!(f, "Refused: {why}"),
        }
    }
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

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
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
            RegistrationMode::PluginWatcher => tokio::spawn(watcher_mode(ctx, handle)),
            _ => tokio::spawn(socket_mode(ctx, handle)),
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
struct EndpointCtx {
    paths: KubeletPaths,
    events: broadcast::Receiver<DirEvent>,
    cancel: CancellationToken,
    state: watch::Sender<EndpointState>,
    registrations: Arc<AtomicU64>,
}

/// Identity of a file: a re-created `kubelet.sock` has a new one even at the same path.
fn file_id(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Serve DevicePlugin (and, in watcher mode, the plugin-watcher Registration) on `path`.
fn serve(
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

async fn stop_server(stop: &CancellationToken, server: JoinHandle<()>) {
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
async fn pause(ctx: &mut EndpointCtx, d: Duration, kubelet_sock: Option<&Path>) -> bool {
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
async fn back_off(ctx: &mut EndpointCtx, backoff: &mut Duration, kubelet_sock: Option<&Path>) -> bool {
    let go_on = pause(ctx, *backoff, kubelet_sock).await;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    go_on
}

/// How long a sign of a kubelet restart (our stream closed, our socket gone) waits for the new
/// `kubelet.sock` before devplug registers again anyway (kubelet dropped us without restarting).
const RESTART_GRACE: Duration = Duration::from_secs(10);
/// How often the wait for a new kubelet looks again without an event.
const RECHECK: Duration = Duration::from_millis(250);

/// One serving generation: the server on our socket and the socket file it bound.
struct Generation {
    stop: CancellationToken,
    server: JoinHandle<()>,
    tracker: Arc<StreamTracker>,
    socket: Option<(u64, i64, i64)>,
}

/// A kubelet restart fires several signs at once (its streams close, it wipes our socket, it
/// re-creates `kubelet.sock`). They are taken as one: after the first, devplug waits for the new
/// `kubelet.sock`, re-serves only if its own socket is really gone (a socket kubelet may be
/// dialing is never replaced), and registers once, with the server already answering.
async fn socket_mode(mut ctx: EndpointCtx, handle: ResourceHandle) {
    let resource = handle.name.clone();
    let sock_name = names::socket_file_name(&resource);
    let sock_path = ctx.paths.device_plugin_dir.join(&sock_name);
    let kubelet_sock = ctx.paths.device_plugin_dir.join(KUBELET_SOCKET);
    let mut reason = "start";
    let mut backoff = FIRST_BACKOFF;
    let mut current: Option<Generation> = None;
    loop {
        // Serve, unless the socket we bound is still there.
        let gen_ = match current.take() {
            Some(g) if g.socket.is_some() && file_id(&sock_path) == g.socket => g,
            stale => {
                if let Some(g) = stale {
                    stop_server(&g.stop, g.server).await;
                }
                let stop = ctx.cancel.child_token();
                let tracker = Arc::new(StreamTracker::default());
                let svc = DevicePluginService::new(handle.clone(), tracker.clone(), stop.clone());
                match serve(&sock_path, svc, None, stop.clone()) {
                    Ok(server) => Generation { stop, server, tracker, socket: file_id(&sock_path) },
                    Err(e) => {
                        tracing::error!(resource = %resource, socket = %sock_path.display(), error = %e, "cannot serve the plugin socket; retrying");
                        if !back_off(&mut ctx, &mut backoff, Some(&kubelet_sock)).await {
                            return;
                        }
                        continue;
                    }
                }
            }
        };

        // Register, waiting for kubelet and backing off on refusals.
        let mut said_waiting = false;
        let registered = loop {
            if ctx.cancel.is_cancelled() {
                return finish(&gen_.stop, gen_.server, &sock_path).await;
            }
            if file_id(&sock_path) != gen_.socket {
                break None;
            }
            if !kubelet_sock.exists() {
                if !said_waiting {
                    tracing::info!(resource = %resource, kubelet = %kubelet_sock.display(), "waiting for kubelet");
                    said_waiting = true;
                }
                ctx.state.send_replace(EndpointState::WaitingForKubelet);
                if !pause(&mut ctx, MAX_BACKOFF, Some(&kubelet_sock)).await {
                    return finish(&gen_.stop, gen_.server, &sock_path).await;
                }
                continue;
            }
            let id = file_id(&kubelet_sock);
            match register(&kubelet_sock, &sock_name, &handle).await {
                Ok(()) => break Some(id),
                Err(e) => {
                    tracing::warn!(resource = %resource, error = %e, retry_in = ?backoff, "registration failed");
                    ctx.state.send_replace(EndpointState::Refused(e.to_string()));
                    if !back_off(&mut ctx, &mut backoff, Some(&kubelet_sock)).await {
                        return finish(&gen_.stop, gen_.server, &sock_path).await;
                    }
                }
            }
        };
        let Some(kubelet_id) = registered else {
            // Our socket went away before kubelet took it: serve it again first.
            current = Some(gen_);
            continue;
        };
        backoff = FIRST_BACKOFF;
        ctx.registrations.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &handle.metrics {
            m.registered(&resource, reason != "start");
        }
        ctx.state.send_replace(EndpointState::Registered);
        tracing::info!(resource = %resource, socket = %sock_name, reason, "registered with kubelet");

        // Serve until something says kubelet restarted.
        reason = loop {
            tokio::select! {
                _ = ctx.cancel.cancelled() => return finish(&gen_.stop, gen_.server, &sock_path).await,
                _ = gen_.tracker.all_closed() => break "kubelet closed ListAndWatch",
                ev = ctx.events.recv() => match ev {
                    Ok(DirEvent::Created(p)) if p == kubelet_sock && file_id(&kubelet_sock) != kubelet_id => {
                        break "kubelet.sock re-created"
                    }
                    Ok(DirEvent::Removed(p)) if p == sock_path && file_id(&sock_path) != gen_.socket => break "plugin socket deleted",
                    Err(broadcast::error::RecvError::Lagged(_))
                        if file_id(&sock_path) != gen_.socket || file_id(&kubelet_sock) != kubelet_id =>
                    {
                        break "kubelet dir changed"
                    }
                    Err(broadcast::error::RecvError::Closed) => return finish(&gen_.stop, gen_.server, &sock_path).await,
                    _ => {}
                },
            }
        };
        ctx.state.send_replace(EndpointState::Starting);
        tracing::info!(resource = %resource, reason, "kubelet is restarting; waiting for its new socket");
        // The other signs of the same restart arrive now: wait for the new kubelet.sock (or,
        // if none comes, re-register with the one there is).
        let give_up = tokio::time::Instant::now() + RESTART_GRACE;
        loop {
            let now = file_id(&kubelet_sock);
            if (now.is_some() && now != kubelet_id) || tokio::time::Instant::now() >= give_up {
                break;
            }
            tokio::select! {
                _ = ctx.cancel.cancelled() => return finish(&gen_.stop, gen_.server, &sock_path).await,
                _ = tokio::time::sleep(RECHECK) => {}
                ev = ctx.events.recv() => if let Err(broadcast::error::RecvError::Closed) = ev {
                    return finish(&gen_.stop, gen_.server, &sock_path).await;
                },
            }
        }
        current = Some(gen_);
    }
}

async fn finish(stop: &CancellationToken, server: JoinHandle<()>, sock_path: &Path) {
    stop_server(stop, server).await;
    remove_socket(sock_path);
}

async fn watcher_mode(mut ctx: EndpointCtx, handle: ResourceHandle) {
    let resource = handle.name.clone();
    // Whether the next registration is the first of this endpoint (for the metrics).
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sock_path: PathBuf = ctx.paths.plugins_registry_dir.join(names::socket_file_name(&resource));
    let mut backoff = FIRST_BACKOFF;
    loop {
        let stop = ctx.cancel.child_token();
        let tracker = Arc::new(StreamTracker::default());
        let svc = DevicePluginService::new(handle.clone(), tracker, stop.clone());
        let reg = WatcherRegistration {
            resource: resource.clone(),
            endpoint: sock_path.display().to_string(),
            state: ctx.state.clone(),
            registered: ctx.registrations.clone(),
            metrics: handle.metrics.clone(),
            first: first.clone(),
        };
        let server = match serve(&sock_path, svc, Some(reg), stop.clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(resource = %resource, socket = %sock_path.display(), error = %e, "cannot serve the plugin socket; retrying");
                if !back_off(&mut ctx, &mut backoff, None).await {
                    return;
                }
                continue;
            }
        };
        backoff = FIRST_BACKOFF;
        ctx.state.send_replace(EndpointState::WaitingForKubelet);
        tracing::info!(resource = %resource, socket = %sock_path.display(), "serving for kubelet's plugin watcher");
        // Kubelet's watcher finds the socket by itself, also after a kubelet restart; only the
        // socket vanishing needs us.
        loop {
            tokio::select! {
                _ = ctx.cancel.cancelled() => return finish(&stop, server, &sock_path).await,
                ev = ctx.events.recv() => match ev {
                    Ok(DirEvent::Removed(p)) if p == sock_path && !sock_path.exists() => break,
                    Err(broadcast::error::RecvError::Lagged(_)) if !sock_path.exists() => break,
                    Err(broadcast::error::RecvError::Closed) => return finish(&stop, server, &sock_path).await,
                    _ => {}
                },
            }
        }
        tracing::info!(resource = %resource, "plugin socket deleted; serving it again");
        stop_server(&stop, server).await;
    }
}
