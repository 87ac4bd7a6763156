//! A kubelet stand-in that speaks the real Device Plugin API over real Unix sockets and enforces
//! what kubelet enforces.
//!
//! What it enforces, as kubelet's `devicemanager` does: `version == "v1beta1"`; an extended
//! resource name (`domain/name`, not `kubernetes.io`); an endpoint that is a file inside the
//! device-plugins dir; a blocking dial back to the plugin inside `Register` (10 s) before it
//! answers, then `ListAndWatch`. A second registration of a resource replaces the first. In
//! plugin-watcher mode it finds sockets in `plugins_registry`, calls `GetInfo`, checks type and
//! versions, dials the endpoint and reports through `NotifyRegistrationStatus` on the same
//! connection — dialed as kubelet 1.36's `operationexecutor` dials: grpc-go's headers with the
//! socket path, percent-encoded, as `:authority` (see `h2wire` and
//! tests/fixtures/k8s/README.md), which no `http`-based client can send.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::proto::deviceplugin as pb;
use crate::proto::pluginregistration as pr;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

use crate::{h2wire, uds};

/// Kubelet's dial timeout when it connects back to a plugin.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A plugin kubelet currently knows.
#[derive(Clone)]
pub struct Plugin {
    pub resource: String,
    pub endpoint: PathBuf,
    pub options: pb::DevicePluginOptions,
    pub client: pb::device_plugin_client::DevicePluginClient<Channel>,
    /// The latest list from ListAndWatch.
    pub devices: watch::Receiver<Vec<pb::Device>>,
    /// How many lists the stream delivered.
    pub updates: Arc<AtomicU64>,
}

/// A plugin type other than `DevicePlugin` (kubelet's plugin manager dispatches the watcher's
/// finds by `PluginInfo.type` to one handler per type; see `kubelet_dra` for DRA's).
#[tonic::async_trait]
pub trait PluginHandler: Send + Sync {
    /// Validate and register the plugin found at `socket`; `Err` is kubelet's refusal.
    async fn register(&self, socket: &Path, info: &pr::PluginInfo) -> Result<(), String>;
    /// This kubelet starts again (before its watcher scans the dir).
    async fn restarted(&self) {}
}

#[derive(Default)]
struct Shared {
    handlers: std::sync::Mutex<HashMap<String, Arc<dyn PluginHandler>>>,
    plugins: Mutex<HashMap<String, (Plugin, CancellationToken)>>,
    registrations: AtomicU64,
    refusals: std::sync::Mutex<Vec<String>>,
    /// Failed attempts of dials that kubelet's blocking dial tries again.
    dial_retries: std::sync::Mutex<Vec<String>>,
    changed: tokio::sync::Notify,
    generation: watch::Sender<u64>,
}

/// The stand-in. Dropping it stops everything.
pub struct Kubelet {
    dir: PathBuf,
    registry_dir: Option<PathBuf>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// Kubelet's check, written independently of devplug's: `IsExtendedResourceName`.
pub fn kubelet_accepts_resource_name(name: &str) -> Result<(), String> {
    let (domain, short) =
        name.split_once('/').ok_or_else(|| format!("{name}: not an extended resource name (no '/')"))?;
    if domain.contains("kubernetes.io") {
        return Err(format!("{name}: native resource namespace"));
    }
    let dns1123 = domain.len() <= 253
        && domain.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && l.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && l.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        });
    let qualified = !short.is_empty()
        && short.len() <= 63
        && short.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && short.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && short.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if dns1123 && qualified { Ok(()) } else { Err(format!("{name}: invalid extended resource name")) }
}

impl Kubelet {
    /// Kubelet with its registration socket at `<dir>/kubelet.sock` (tests: a failure panics).
    pub async fn start(dir: &Path) -> Self {
        Self::try_start(dir, None).await.unwrap_or_else(|e| panic!("kubelet stand-in in {}: {e}", dir.display()))
    }

    /// Kubelet whose plugin watcher also scans `registry_dir` (tests: a failure panics).
    pub async fn start_with_watcher(dir: &Path, registry_dir: &Path) -> Self {
        Self::try_start(dir, Some(registry_dir))
            .await
            .unwrap_or_else(|e| panic!("kubelet stand-in in {}: {e}", dir.display()))
    }

    /// Kubelet in `dir` (its plugin watcher also scanning `registry_dir` when given), or why it
    /// could not start: `devplug try` says that instead of panicking.
    pub async fn try_start(dir: &Path, registry_dir: Option<&Path>) -> std::io::Result<Self> {
        fn with(what: &'static str, p: &Path) -> impl FnOnce(std::io::Error) -> std::io::Error + use<> {
            let p = p.display().to_string();
            move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{what} {p}: {e}"))
        }
        std::fs::create_dir_all(dir).map_err(with("create the kubelet dir", dir))?;
        if let Some(r) = registry_dir {
            std::fs::create_dir_all(r).map_err(with("create the plugins_registry dir", r))?;
        }
        let mut k = Kubelet {
            dir: dir.to_owned(),
            registry_dir: registry_dir.map(Path::to_owned),
            shared: Arc::new(Shared::default()),
            stop: CancellationToken::new(),
            tasks: Vec::new(),
        };
        k.boot().map_err(with("serve kubelet.sock in", dir))?;
        Ok(k)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Dispatch plugins of `kind` to `handler` (register it before the plugin's socket appears,
    /// or restart so the watcher scans again).
    pub fn handle(&self, kind: &str, handler: Arc<dyn PluginHandler>) {
        self.shared.handlers.lock().unwrap().insert(kind.to_owned(), handler);
    }

    fn boot(&mut self) -> std::io::Result<()> {
        self.stop = CancellationToken::new();
        let sock = self.dir.join(pb::KUBELET_SOCKET);
        let listener = uds::bind(&sock)?;
        let svc = RegistrationSvc { dir: self.dir.clone(), shared: self.shared.clone(), stop: self.stop.clone() };
        let stop = self.stop.clone();
        self.tasks.push(tokio::spawn(async move {
            let _ = Server::builder()
                .add_service(pb::registration_server::RegistrationServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled_owned())
                .await;
        }));
        if let Some(reg) = self.registry_dir.clone() {
            self.tasks.push(tokio::spawn(plugin_watcher(reg, self.shared.clone(), self.stop.clone())));
        }
        Ok(())
    }

    /// What a kubelet restart does: drop every plugin connection, wipe the device-plugins dir
    /// (every socket in it), and serve a new `kubelet.sock`.
    pub async fn restart(&mut self) {
        self.restart_after(Duration::ZERO).await;
    }

    /// A kubelet restart as a real node sees it: the old kubelet dies (its streams close, its
    /// `kubelet.sock` stays behind, dead), `gap` later the new one starts, wipes every socket in
    /// the dir (upstream's `Start`: stale sockets are the plugins' signal) and listens on a new
    /// `kubelet.sock` — often with the old one's inode on ext4 and tmpfs.
    pub async fn restart_after(&mut self, gap: Duration) {
        self.stop_serving().await;
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        for entry in std::fs::read_dir(&self.dir).expect("read kubelet dir").flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        self.shared.generation.send_modify(|g| *g += 1);
        let handlers: Vec<_> = self.shared.handlers.lock().unwrap().values().cloned().collect();
        for h in handlers {
            h.restarted().await;
        }
        if let Err(e) = self.boot() {
            panic!("kubelet stand-in restart in {}: {e}", self.dir.display());
        }
    }

    /// Restart the way [`restart_after`](Self::restart_after) does, then wait until every
    /// resource in `resources` is registered again (`registrations` in total) and its stream
    /// delivered a list of `devices`; returns the time from the new kubelet to that.
    pub async fn restart_and_wait(
        &mut self,
        gap: Duration,
        resources: &[String],
        registrations: u64,
        devices: usize,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        self.restart_after(gap).await;
        let t = std::time::Instant::now();
        self.wait_for(timeout, &format!("{registrations} registrations"), |k| k.registrations() >= registrations)
            .await?;
        for r in resources {
            self.wait_devices(r, timeout, |l| l.len() == devices).await?;
        }
        Ok(t.elapsed())
    }

    /// Kubelet's process ends: connections drop, the socket file stays.
    async fn stop_serving(&mut self) {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        let plugins: Vec<_> = self.shared.plugins.lock().await.drain().collect();
        for (_, (_, cancel)) in plugins {
            cancel.cancel();
        }
    }

    /// Kubelet goes away (and its socket with it).
    pub async fn shutdown(&mut self) {
        self.stop_serving().await;
        let _ = std::fs::remove_file(self.dir.join(pb::KUBELET_SOCKET));
    }

    /// Successful registrations since start.
    pub fn registrations(&self) -> u64 {
        self.shared.registrations.load(Ordering::SeqCst)
    }

    /// Reasons for refused registrations, in order.
    pub fn refusals(&self) -> Vec<String> {
        self.shared.refusals.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The failed attempts of dials back to plugins, tried again as kubelet's blocking dial
    /// does (a plugin that registers before it serves, or whose socket went, costs one).
    pub fn dial_retries(&self) -> Vec<String> {
        self.shared.dial_retries.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Every plugin registered now, by resource name.
    pub async fn plugins(&self) -> Vec<Plugin> {
        let mut all: Vec<Plugin> = self.shared.plugins.lock().await.values().map(|(p, _)| p.clone()).collect();
        all.sort_by(|a, b| a.resource.cmp(&b.resource));
        all
    }

    /// The plugin registered for `resource`, if any.
    pub async fn plugin(&self, resource: &str) -> Option<Plugin> {
        self.shared.plugins.lock().await.get(resource).map(|(p, _)| p.clone())
    }

    /// Wait (bounded) until `cond` holds over the stand-in's state.
    pub async fn wait_for<F>(&self, timeout: Duration, what: &str, mut cond: F) -> anyhow::Result<()>
    where
        F: FnMut(&Kubelet) -> bool,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            if cond(self) {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                anyhow::bail!("timed out after {timeout:?} waiting for {what}");
            }
        }
    }

    /// Wait until at least `n` registrations happened, then return the plugin for `resource`.
    pub async fn wait_registered(&self, resource: &str, n: u64, timeout: Duration) -> anyhow::Result<Plugin> {
        self.wait_for(timeout, &format!("registration #{n} of {resource}"), |k| k.registrations() >= n).await?;
        self.plugin(resource).await.ok_or_else(|| anyhow::anyhow!("{resource} is not registered"))
    }

    /// Wait until `resource` is registered (whatever else registered before it).
    pub async fn wait_plugin(&self, resource: &str, timeout: Duration) -> anyhow::Result<Plugin> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            if let Some(p) = self.plugin(resource).await {
                return Ok(p);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                anyhow::bail!("timed out after {timeout:?} waiting for {resource} to register");
            }
        }
    }

    /// Wait until `resource`'s device list satisfies `pred`; returns that list.
    pub async fn wait_devices(
        &self,
        resource: &str,
        timeout: Duration,
        pred: impl Fn(&[pb::Device]) -> bool,
    ) -> anyhow::Result<Vec<pb::Device>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let plugin = self.plugin(resource).await;
            if let Some(mut p) = plugin {
                loop {
                    let list = p.devices.borrow_and_update().clone();
                    if pred(&list) {
                        return Ok(list);
                    }
                    match tokio::time::timeout_at(deadline, p.devices.changed()).await {
                        Err(_) => anyhow::bail!("timed out waiting for {resource}'s devices; last list: {list:?}"),
                        Ok(Err(_)) => break, // stream replaced: look the plugin up again
                        Ok(Ok(())) => {}
                    }
                }
            } else if tokio::time::timeout_at(deadline, self.shared.changed.notified()).await.is_err() {
                anyhow::bail!("timed out waiting for {resource} to register");
            }
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Dial the plugin as kubelet does (blocking, 10 s), start ListAndWatch, record the plugin.
async fn connect_plugin(
    shared: &Arc<Shared>,
    resource: &str,
    endpoint: PathBuf,
    options: pb::DevicePluginOptions,
    kubelet_stop: &CancellationToken,
) -> Result<(), String> {
    let retried = |why: String| {
        if let Ok(mut r) = shared.dial_retries.lock() {
            r.push(format!("dial {}: {why}", endpoint.display()));
        }
    };
    let channel = uds::connect_blocking(&endpoint, DIAL_TIMEOUT, retried)
        .await
        .map_err(|e| format!("dial {}: {e}", endpoint.display()))?;
    let mut client = pb::device_plugin_client::DevicePluginClient::new(channel);
    let (tx, rx) = watch::channel(Vec::new());
    let updates = Arc::new(AtomicU64::new(0));
    let cancel = kubelet_stop.child_token();
    let stream = client.list_and_watch(pb::Empty {}).await.map_err(|e| format!("ListAndWatch: {e}"))?.into_inner();
    let (u, c, sh) = (updates.clone(), cancel.clone(), shared.clone());
    tokio::spawn(async move {
        let mut stream = Box::pin(futures::StreamExt::take_until(stream, c.cancelled_owned()));
        while let Some(Ok(resp)) = stream.next().await {
            u.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(resp.devices);
            sh.changed.notify_waiters();
        }
    });
    let plugin = Plugin { resource: resource.to_owned(), endpoint, options, client, devices: rx, updates };
    let old = shared.plugins.lock().await.insert(resource.to_owned(), (plugin, cancel));
    if let Some((_, old_cancel)) = old {
        old_cancel.cancel();
    }
    shared.registrations.fetch_add(1, Ordering::SeqCst);
    shared.changed.notify_waiters();
    Ok(())
}

fn refuse(shared: &Shared, why: String) -> Status {
    if let Ok(mut r) = shared.refusals.lock() {
        r.push(why.clone());
    }
    shared.changed.notify_waiters();
    Status::invalid_argument(why)
}

struct RegistrationSvc {
    dir: PathBuf,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

#[tonic::async_trait]
impl pb::registration_server::Registration for RegistrationSvc {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::Empty>, Status> {
        let r = req.into_inner();
        if r.version != pb::VERSION {
            return Err(refuse(&self.shared, format!("unsupported API version {:?}", r.version)));
        }
        if let Err(why) = kubelet_accepts_resource_name(&r.resource_name) {
            return Err(refuse(&self.shared, why));
        }
        if r.endpoint.is_empty() || r.endpoint.contains('/') || r.endpoint == ".." {
            return Err(refuse(
                &self.shared,
                format!("endpoint {:?} is not a file in {}", r.endpoint, self.dir.display()),
            ));
        }
        let endpoint = self.dir.join(&r.endpoint);
        let options = r.options.unwrap_or_default();
        connect_plugin(&self.shared, &r.resource_name, endpoint, options, &self.stop)
            .await
            .map_err(|why| refuse(&self.shared, why))?;
        Ok(Response::new(pb::Empty {}))
    }
}

/// Kubelet's plugin watcher: scan `dir` now and on every new socket.
async fn plugin_watcher(dir: PathBuf, shared: Arc<Shared>, stop: CancellationToken) {
    use notify::Watcher;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut w = match notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        // fsnotify (kubelet's) reports a file moved into the directory once, as a create;
        // notify reports it as a rename `To` (and again as `Both` with the old name: not a
        // second event for kubelet).
        use notify::event::{ModifyKind, RenameMode};
        if let Ok(e) = e
            && matches!(
                e.kind,
                notify::EventKind::Create(_) | notify::EventKind::Modify(ModifyKind::Name(RenameMode::To))
            )
        {
            for p in e.paths {
                let _ = tx.send(p);
            }
        }
    }) {
        Ok(w) => w,
        Err(_) => return,
    };
    if w.watch(&dir, notify::RecursiveMode::NonRecursive).is_err() {
        return;
    }
    let existing: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    for p in existing {
        watcher_register(&shared, p, &stop).await;
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            Some(p) = rx.recv() => watcher_register(&shared, p, &stop).await,
        }
    }
}

/// Kubelet's reconciler keeps trying a socket it saw appear (its create event can arrive between
/// the plugin's bind and listen); so does the stand-in, a bounded number of times. A GetInfo
/// that fails (a reset stream, a gRPC error) is retried the same way, as kubelet does: it
/// never reports a failed GetInfo to the plugin.
async fn watcher_register(shared: &Arc<Shared>, socket: PathBuf, stop: &CancellationToken) {
    use prost::Message;
    // As kubelet's `handleCreateEvent`: hidden names are ignored, and so is anything that is not
    // a socket.
    if socket.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
        return;
    }
    if !std::fs::metadata(&socket).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())) {
        return;
    }
    let authority = h2wire::grpc_go_authority(&socket);
    for _ in 0..50 {
        if stop.is_cancelled() || !socket.exists() {
            return;
        }
        if let Ok(mut conn) = h2wire::Conn::dial(&socket).await
            && conn.start().await.is_ok()
        {
            // Kubelet's GetInfo deadline is 1 s (`grpc-timeout` in the recording: 999467u).
            let info = conn
                .unary(
                    1,
                    &authority,
                    "/pluginregistration.Registration/GetInfo",
                    "999467u",
                    &[],
                    Duration::from_secs(1),
                )
                .await;
            if let Ok(a) = info
                && a.grpc_status() == Some("0")
                && let Some(info) = a.message().and_then(|m| pr::PluginInfo::decode(m).ok())
            {
                let status = watcher_verdict(shared, &socket, stop, info).await;
                // NotifyRegistrationStatus on stream 3 of the same connection, 5 s deadline.
                let _ = conn
                    .unary(
                        3,
                        &authority,
                        "/pluginregistration.Registration/NotifyRegistrationStatus",
                        "4999990u",
                        &status.encode_to_vec(),
                        Duration::from_secs(5),
                    )
                    .await;
                conn.close(3).await;
                return;
            }
            conn.close(1).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kubelet's verdict on a plugin found by the watcher (the handler of its type registers it).
async fn watcher_verdict(
    shared: &Arc<Shared>,
    socket: &Path,
    stop: &CancellationToken,
    info: pr::PluginInfo,
) -> pr::RegistrationStatus {
    let handler = shared.handlers.lock().unwrap().get(&info.r#type).cloned();
    let verdict = if let Some(h) = handler {
        h.register(socket, &info).await
    } else if info.r#type != pr::DEVICE_PLUGIN {
        Err(format!("plugin type {:?} is not handled", info.r#type))
    } else if !info.supported_versions.iter().any(|v| v == pb::VERSION) {
        Err(format!("none of the versions {:?} is supported", info.supported_versions))
    } else if let Err(e) = kubelet_accepts_resource_name(&info.name) {
        Err(e)
    } else {
        let endpoint = if info.endpoint.is_empty() { socket.to_owned() } else { PathBuf::from(&info.endpoint) };
        let mut options = pb::DevicePluginOptions::default();
        if let Ok(ch) = uds::connect(&endpoint, DIAL_TIMEOUT).await {
            let mut c = pb::device_plugin_client::DevicePluginClient::new(ch);
            if let Ok(o) = c.get_device_plugin_options(pb::Empty {}).await {
                options = o.into_inner();
            }
        }
        connect_plugin(shared, &info.name, endpoint, options, stop).await
    };
    match verdict {
        Ok(()) => pr::RegistrationStatus { plugin_registered: true, error: String::new() },
        Err(e) => {
            refuse(shared, e.clone());
            pr::RegistrationStatus { plugin_registered: false, error: e }
        }
    }
}
