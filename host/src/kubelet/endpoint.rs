//! The endpoints of this host, one per served resource, each a task that serves its socket and
//! registers in the chosen mode ([`super::socket_mode`], [`super::watcher_mode`]; what both
//! share is in [`super::plumbing`]). Kubelet not being there yet is waited for, never a reason
//! to exit.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::dirwatch::DirWatcher;
use super::plumbing::EndpointCtx;
use super::{KubeletPaths, ResourceHandle, socket_mode, watcher_mode};
use crate::plugin_socket::registration::{Board, RegistrationState, alarm};

/// How long kubelet may take to complete a registration before devplug says so (an ERROR,
/// `/readyz`) and, in `auto` mode, falls back from the plugin watcher to `kubelet.sock`.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// How a resource's registration is named on the board.
fn subject(resource: &str) -> String {
    format!("resource {resource}")
}

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
    state: watch::Receiver<RegistrationState>,
}

/// All resource endpoints of this host.
pub struct Endpoints {
    paths: KubeletPaths,
    mode: RegistrationMode,
    /// `auto` chose the plugin watcher: fall back to `kubelet.sock` if it never calls.
    fall_back: bool,
    /// Every registration and how long kubelet may take with one.
    board: Arc<Board>,
    watcher: DirWatcher,
    running: Mutex<HashMap<String, Running>>,
    /// Successful registrations (first ones and re-registrations), for metrics and tests.
    pub registrations: Arc<AtomicU64>,
}

impl Endpoints {
    /// Resolve `Auto` (as the SR-IOV plugin does: the plugin watcher when its dir exists) and
    /// start watching kubelet's directories.
    pub fn new(paths: KubeletPaths, mode: RegistrationMode) -> anyhow::Result<Self> {
        let fall_back = mode == RegistrationMode::Auto;
        let mode = match mode {
            RegistrationMode::Auto if paths.plugins_registry_dir.is_dir() => RegistrationMode::PluginWatcher,
            RegistrationMode::Auto => RegistrationMode::KubeletSocket,
            m => m,
        };
        let dirs: Vec<&Path> = match (mode, fall_back) {
            // The fall back needs to see `kubelet.sock` too.
            (RegistrationMode::PluginWatcher, true) => vec![&paths.plugins_registry_dir, &paths.device_plugin_dir],
            (RegistrationMode::PluginWatcher, false) => vec![&paths.plugins_registry_dir],
            _ => vec![&paths.device_plugin_dir],
        };
        let watcher = DirWatcher::new(&dirs)?;
        tracing::info!(mode = ?mode, "kubelet registration mode");
        Ok(Endpoints {
            paths,
            mode,
            fall_back,
            board: Arc::new(Board::new(PATIENCE)),
            watcher,
            running: Mutex::new(HashMap::new()),
            registrations: Arc::default(),
        })
    }

    /// Wait `patience` (instead of [`PATIENCE`]) for kubelet to complete a registration.
    pub(crate) fn with_patience(mut self, patience: Duration) -> Self {
        self.board = Arc::new(Board::new(patience));
        self
    }

    /// Every registration with kubelet, for `/readyz` and `/status` (the DRA drivers show
    /// theirs on the same board).
    pub fn board(&self) -> Arc<Board> {
        self.board.clone()
    }

    /// Start serving a resource (replacing an endpoint of the same name).
    pub async fn add(&self, handle: ResourceHandle) {
        let name = handle.name.clone();
        self.remove(&name).await;
        let cancel = CancellationToken::new();
        let (registration, state) = watch::channel(RegistrationState::new(
            subject(&name),
            crate::plugin_socket::Mode::KubeletSocket,
            self.paths.device_plugin_dir.clone(),
        ));
        self.board.show(state.clone());
        let (patience, shown) = (self.board.patience, state.clone());
        let ctx = EndpointCtx {
            paths: self.paths.clone(),
            events: self.watcher.subscribe(),
            cancel: cancel.clone(),
            registration,
            registrations: self.registrations.clone(),
            patience,
        };
        let (mode, fall_back) = (self.mode, self.fall_back);
        let task = tokio::spawn(async move {
            let warn = tokio::spawn(alarm(shown, patience));
            if mode == RegistrationMode::PluginWatcher {
                if let watcher_mode::Ended::FallBack(ctx) = watcher_mode::run(ctx, handle.clone(), fall_back).await {
                    socket_mode::run(ctx, handle).await;
                }
            } else {
                socket_mode::run(ctx, handle).await;
            }
            warn.abort();
        });
        self.running.lock().await.insert(name, Running { cancel, task, state });
    }

    /// Stop serving a resource and remove its socket.
    pub async fn remove(&self, name: &str) {
        let running = self.running.lock().await.remove(name);
        self.board.hide(&subject(name));
        if let Some(r) = running {
            r.cancel.cancel();
            let _ = r.task.await;
        }
    }

    /// Every endpoint's registration stage, by resource name.
    pub async fn states(&self) -> Vec<(String, crate::plugin_socket::Stage)> {
        let running = self.running.lock().await;
        let mut v: Vec<_> = running.iter().map(|(n, r)| (n.clone(), r.state.borrow().stage.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Stop everything (SIGTERM): sockets are removed, tasks finished.
    pub async fn shutdown(&self) {
        let all: Vec<(String, Running)> = self.running.lock().await.drain().collect();
        for (name, _) in &all {
            self.board.hide(&subject(name));
        }
        let all: Vec<Running> = all.into_iter().map(|(_, r)| r).collect();
        for r in &all {
            r.cancel.cancel();
        }
        for r in all {
            let _ = r.task.await;
        }
    }
}
