//! One DRA driver on this node, as a task: its kubelet plugin (`dra.sock`) and registration
//! socket, its pool of ResourceSlices kept equal to its resources' device lists (on every
//! change, on every registration with kubelet, whenever a watch sees the server's copy change
//! under it — kubelet deletes a node's slices when it starts — and every `resync` in any case),
//! and on stop its sockets removed.
//!
//! The pool is published only once the driver has a resource (never an empty pool first), and
//! a stop keeps it unless the driver stops being served ([`Driver::stop`]'s `retire`): a devplug
//! restart (a DaemonSet rolling update, SIGTERM) leaves the node's devices schedulable, and
//! kubelet itself deletes a driver's slices when its plugin stays away.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::plugin::health::HealthService;
use super::plugin::prepare::Preparer;
use super::plugin::{Checkpoint, DraPlugin, registration};
use super::pool_id::PoolId;
use super::publish::PoolWriter;
use super::served::{Served, ServedResource};
use crate::cdi::SpecDir;
use crate::plugin_socket::registration::{Board, RegistrationState, alarm};
use crate::plugin_socket::{Registration, Stage};
use crate::sync::Locked;

/// What starting a driver needs.
#[derive(Clone)]
pub struct DriverSetup {
    pub driver: String,
    pub node: String,
    pub client: kube::Client,
    pub specs: Arc<SpecDir>,
    pub registry_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub resync: Duration,
    /// Which prepared devices get a claim status entry.
    pub claim_status: super::plugin::status::StatusPolicy,
    /// Where the driver's registration with kubelet shows (`/readyz`, `/status`).
    pub board: Arc<Board>,
    /// How long kubelet may take to register the driver before an ERROR.
    pub patience: Duration,
    /// Where the driver's claims show (prepared, stuck).
    pub claims: Arc<super::plugin::claims::ClaimBoard>,
    /// This machine's sysfs, where PCIe roots are read (`standard.rs`).
    pub sysfs_root: PathBuf,
}

/// How long stopping waits for the API server to delete the pool.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running driver.
pub struct Driver {
    pub name: String,
    served: Arc<Served>,
    wake: Arc<Notify>,
    /// Bumped on every change of a device list (the health streams).
    health: tokio::sync::watch::Sender<u64>,
    /// A task per resource, waking the driver when its list changes.
    watchers: Mutex<BTreeMap<String, JoinHandle<()>>>,
    stop: CancellationToken,
    /// Set when the stop is for good: the pool is deleted too.
    retire: Arc<std::sync::atomic::AtomicBool>,
    task: JoinHandle<()>,
}

impl Driver {
    /// Serve the driver's sockets and start keeping its pool.
    pub fn start(setup: DriverSetup) -> anyhow::Result<Driver> {
        let dir = setup.plugins_dir.join(&setup.driver);
        let checkpoint = Checkpoint::open(&dir)?;
        let id = PoolId::new(&setup.driver, &setup.node);
        let served = Arc::new(Served::new(id, Some(setup.sysfs_root.clone())));
        let api: Arc<dyn super::plugin::ClaimApi> = Arc::new(super::plugin::ApiServer(setup.client.clone()));
        let preparer = Arc::new(Preparer {
            served: served.clone(),
            specs: setup.specs.clone(),
            status: super::plugin::status::Reporter::new(api.clone(), setup.driver.clone(), setup.claim_status),
        });
        let plugin = Arc::new(DraPlugin::new(&setup.driver, preparer, api, checkpoint, setup.claims.clone()));
        let wake = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let (health, changes) = tokio::sync::watch::channel(0u64);
        let reg_path = registration::registration_socket(&setup.registry_dir, &setup.driver);
        let (registration, shown) = tokio::sync::watch::channel(RegistrationState::new(
            format!("DRA driver {}", setup.driver),
            crate::plugin_socket::Mode::PluginWatcher,
            reg_path.clone(),
        ));
        setup.board.show(shown.clone());
        let warn = tokio::spawn(alarm(shown, setup.patience));
        let sockets = Sockets {
            health: HealthService { served: served.clone(), changes, stop: stop.clone() },
            plugin,
            dra: registration::plugin_socket(&setup.plugins_dir, &setup.driver),
            reg: reg_path,
            driver: setup.driver.clone(),
            registered: wake.clone(),
            registration,
            warn,
            stop: stop.clone(),
            servers: Vec::new(),
        };
        let retire = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task =
            tokio::spawn(keep(setup.clone(), sockets, served.clone(), wake.clone(), stop.clone(), retire.clone()));
        Ok(Driver { name: setup.driver, served, wake, health, watchers: Mutex::default(), stop, retire, task })
    }

    /// Serve `r` through this driver (its devices join the pool).
    pub fn add(&self, r: ServedResource) {
        let mut devices = r.devices.clone();
        let (wake, health) = (self.wake.clone(), self.health.clone());
        let watcher = tokio::spawn(async move {
            while devices.changed().await.is_ok() {
                wake.notify_one();
                health.send_modify(|n| *n += 1);
            }
        });
        if let Some(old) = self.watchers.locked().insert(r.name.clone(), watcher) {
            old.abort();
        }
        self.served.add(r);
        self.wake.notify_one();
        self.health.send_modify(|n| *n += 1);
    }

    /// The backend whose resources this driver serves (none yet: any).
    pub fn backend(&self) -> Option<String> {
        self.served.backend()
    }

    /// Whether this driver serves `resource`.
    pub fn serves(&self, resource: &str) -> bool {
        self.served.resource(resource).is_some()
    }

    /// Stop serving `resource`; whether the driver has nothing left.
    pub fn remove(&self, resource: &str) -> bool {
        if let Some(w) = self.watchers.locked().remove(resource) {
            w.abort();
        }
        let empty = self.served.remove(resource);
        self.wake.notify_one();
        self.health.send_modify(|n| *n += 1);
        empty
    }

    /// Remove the sockets and end the task; with `retire` (devplug no longer serves this driver
    /// on this node) delete the pool too, else leave it for the next devplug.
    pub async fn stop(self, retire: bool) {
        for (_, w) in std::mem::take(&mut *self.watchers.locked()) {
            w.abort();
        }
        self.retire.store(retire, std::sync::atomic::Ordering::Release);
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The driver's two sockets and their servers.
struct Sockets {
    plugin: Arc<DraPlugin>,
    health: HealthService,
    dra: PathBuf,
    reg: PathBuf,
    driver: String,
    registered: Arc<Notify>,
    registration: tokio::sync::watch::Sender<RegistrationState>,
    /// The ERROR when kubelet never registers the driver.
    warn: JoinHandle<()>,
    stop: CancellationToken,
    servers: Vec<(CancellationToken, JoinHandle<()>)>,
}

impl Sockets {
    /// Serve both sockets unless both are there and served.
    fn ensure(&mut self) {
        let up = self.servers.iter().all(|(_, h)| !h.is_finished());
        if up && self.servers.len() == 2 && self.dra.exists() && self.reg.exists() {
            return;
        }
        for (t, h) in self.servers.drain(..) {
            t.cancel();
            h.abort();
        }
        if let Some(dir) = self.dra.parent()
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            tracing::error!(driver = %self.driver, dir = %dir.display(), "cannot make the plugin dir: {e}");
            return;
        }
        let t = self.stop.child_token();
        match super::plugin::service::serve(self.plugin.clone(), Some(self.health.clone()), &self.dra, t.clone()) {
            Ok(h) => self.servers.push((t, h)),
            Err(e) => {
                tracing::error!(driver = %self.driver, socket = %self.dra.display(), "cannot serve the DRA plugin: {e}");
                return;
            }
        }
        let registered = self.registered.clone();
        let reg = Registration::new(registration::info(&self.driver, &self.dra), self.registration.clone())
            .on_registered(move |_| registered.notify_one());
        let t = self.stop.child_token();
        let routes = tonic::service::Routes::new(reg.service());
        match crate::plugin_socket::serve(&self.reg, routes, t.clone(), "DRA registration server") {
            Ok(h) => {
                self.servers.push((t, h));
                self.registration.send_modify(|r| r.enter(Stage::Serving));
                tracing::info!(driver = %self.driver, socket = %self.reg.display(), "DRA plugin serving for kubelet's plugin watcher");
            }
            Err(e) => {
                tracing::error!(driver = %self.driver, socket = %self.reg.display(), "cannot serve the registration socket: {e}")
            }
        }
    }

    async fn close(&mut self) {
        self.warn.abort();
        for (t, h) in self.servers.drain(..) {
            t.cancel();
            let _ = h.await;
        }
        for p in [&self.reg, &self.dra] {
            crate::plugin_socket::bind::unbind(p);
        }
    }
}

/// The driver's task.
async fn keep(
    setup: DriverSetup,
    mut sockets: Sockets,
    served: Arc<Served>,
    wake: Arc<Notify>,
    stop: CancellationToken,
    retire: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut writer = PoolWriter::new(setup.client.clone(), served.id.clone());
    let watching = writer.watch(wake.clone(), stop.clone());
    let mut resync = tokio::time::interval(setup.resync);
    let mut last_error: Option<String> = None;
    sockets.ensure();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = wake.notified() => {}
            _ = resync.tick() => sockets.ensure(),
        }
        // Nothing to publish before the first resource arrives: an empty pool would take the
        // node's devices away from the scheduler until the real one follows.
        if served.resources().is_empty() {
            continue;
        }
        // Built once per change of the lists (a resync or a watch event reuses it).
        let pool = served.pool();
        let written = match pool.as_ref() {
            Ok(pool) => writer.sync(pool).await,
            Err(e) => Err(anyhow::anyhow!("{e}; nothing was written: the pool stays as it was")),
        };
        match written {
            Ok(w) => {
                if last_error.take().is_some() {
                    tracing::info!(driver = %setup.driver, "ResourceSlices published again");
                }
                if w.changed() {
                    tracing::info!(driver = %setup.driver, generation = w.generation, created = w.created, replaced = w.replaced, deleted = w.deleted, "ResourceSlices published");
                }
            }
            Err(e) => {
                let msg = format!("{e:#}");
                if last_error.as_ref() != Some(&msg) {
                    tracing::error!(driver = %setup.driver, "ResourceSlices not published: {msg}");
                    last_error = Some(msg);
                }
            }
        }
    }
    watching.abort();
    sockets.close().await;
    setup.board.hide(&format!("DRA driver {}", setup.driver));
    if !retire.load(std::sync::atomic::Ordering::Acquire) {
        tracing::info!(driver = %setup.driver, "ResourceSlices left in place for the next devplug on this node");
        return;
    }
    match tokio::time::timeout(REMOVE_TIMEOUT, writer.remove_all()).await {
        Ok(Ok(n)) => tracing::info!(driver = %setup.driver, slices = n, "ResourceSlices deleted"),
        Ok(Err(e)) => tracing::warn!(driver = %setup.driver, "ResourceSlices not deleted: {e:#}"),
        Err(_) => {
            tracing::warn!(driver = %setup.driver, "ResourceSlices not deleted: the API server did not answer within {REMOVE_TIMEOUT:?}")
        }
    }
}
