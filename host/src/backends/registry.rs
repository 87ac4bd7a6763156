//! The registry: loaded backends, which resource each one serves, the latest device list of every
//! resource (health polled through `discover`), and the [`ResourceCalls`] that route a resource's
//! calls to the backend's current instance.

use crate::sync::Locked;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::settings::{BackendSettings, DefaultGrant};
use super::source::{BackendSource, Origin};
use crate::model::names::resource_name_problem;
use crate::model::{ContainerEdits, Health, Resource, ResourceOptions};
use crate::runtime::caps::{Capabilities, Globs};
use crate::runtime::state::{Roots, Sandbox};
use crate::runtime::{BackendInstance, CallError, LoadError, Runtime};

/// See [`Registry::with_publish_hook`].
pub type PublishHook = Arc<dyn Fn(&Resource) + Send + Sync>;

/// Where this layer reports backend calls and swaps; the daemon passes the process's metrics in
/// (none by default), so the layer does not depend on how they are exported.
pub trait BackendMetrics: Send + Sync + 'static {
    /// One call (`discover`, `allocate`, ...) of `backend` that took `took`, answered or not.
    fn backend_call(&self, backend: &str, call: &str, took: std::time::Duration);
    /// A hot swap of `backend`, taken (`ok`) or refused.
    fn swap(&self, backend: &str, ok: bool);
}

/// Metrics that go nowhere (tests, `devplug discover`).
struct NoMetrics;

impl BackendMetrics for NoMetrics {
    fn backend_call(&self, _: &str, _: &str, _: std::time::Duration) {}
    fn swap(&self, _: &str, _: bool) {}
}

/// A resource whose device list is not empty for the first time: what serving it needs. Its
/// `devices` carry every later list; `calls` reach whichever instance is current.
pub struct ReadyResource {
    pub name: String,
    pub backend: String,
    pub options: ResourceOptions,
    pub devices: watch::Receiver<Arc<Resource>>,
    pub calls: Arc<ResourceCalls>,
}

/// A loaded backend; `current` is swapped atomically, in-flight calls keep the old one alive.
struct Slot {
    /// Where the current instance came from and its source key (content identity).
    origin: ArcSwap<(Origin, String)>,
    current: ArcSwap<BackendInstance>,
    last_error: Mutex<Option<String>>,
}

/// Distinct problems remembered per resource for log-once; past this they are not logged again.
const MAX_LOGGED: usize = 64;

struct ResSlot {
    backend: String,
    options: ResourceOptions,
    tx: watch::Sender<Arc<Resource>>,
    published: bool,
    logged: HashSet<String>,
}

/// One backend's discover, ready to run on a blocking thread.
pub struct PollJob {
    pub name: String,
    slot: Arc<Slot>,
    inst: Arc<BackendInstance>,
}

impl PollJob {
    /// Call the backend (blocking, bounded by its discover deadline).
    pub fn run(self) -> PollDone {
        let t0 = std::time::Instant::now();
        let result = self.inst.discover();
        PollDone { job: self, result, took: t0.elapsed() }
    }
}

/// A finished discover, for [`Registry::finish_poll`].
pub struct PollDone {
    job: PollJob,
    result: Result<Vec<Resource>, CallError>,
    took: std::time::Duration,
}

impl PollDone {
    pub fn backend(&self) -> &str {
        &self.job.name
    }
}

/// What a poll found.
#[derive(Default)]
pub struct PollReport {
    /// Resources that have devices for the first time: start serving them to kubelet.
    pub ready: Vec<ReadyResource>,
}

/// A resource a backend no longer serves. Its stream already carries an empty device list;
/// keep this value until its endpoint is stopped (dropping it ends the stream).
pub struct Retired {
    pub name: String,
    _devices: watch::Sender<Arc<Resource>>,
}

fn retire(name: String, r: ResSlot) -> Retired {
    r.tx.send_modify(|v| *v = Arc::new(Resource { name: name.clone(), ..Default::default() }));
    tracing::info!(resource = %name, backend = %r.backend, "resource retired: its backend no longer serves it");
    Retired { name, _devices: r.tx }
}

/// What a swap changed.
pub struct Swapped {
    /// Resources to start serving (new names, or names whose backend moved to a new slot).
    pub ready: Vec<ReadyResource>,
    /// Resources the new version no longer declares.
    pub retired: Vec<Retired>,
}

/// One backend, for `devplug discover` and status.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BackendSummary {
    pub name: String,
    pub version: String,
    pub wit_version: String,
    pub digest: String,
    pub origin: String,
    pub breaker_open: bool,
    pub resources: Vec<String>,
    /// The loaded version's call and fault counts.
    pub stats: StatsSnapshot,
    /// The last discover error, if discover is failing now.
    pub last_error: Option<String>,
}

/// A copy of a backend instance's counters.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct StatsSnapshot {
    pub calls: u64,
    pub guest_errors: u64,
    pub traps: u64,
    pub timeouts: u64,
    pub memory_cap_hits: u64,
    pub refused: u64,
}

pub struct Registry {
    runtime: Arc<Runtime>,
    /// Where the backends' views of the machine are rooted.
    roots: Roots,
    settings: BTreeMap<String, BackendSettings>,
    default_grant: DefaultGrant,
    /// Called with a resource's new device list before it is published (the daemon writes its
    /// CDI spec there, so kubelet never sees a device its spec does not name yet).
    publish_hook: Option<PublishHook>,
    backends: Mutex<BTreeMap<String, Arc<Slot>>>,
    resources: Mutex<BTreeMap<String, ResSlot>>,
    metrics: Arc<dyn BackendMetrics>,
}

impl Registry {
    pub fn new(
        runtime: Arc<Runtime>,
        roots: Roots,
        settings: BTreeMap<String, BackendSettings>,
        default_grant: DefaultGrant,
    ) -> Self {
        Registry {
            runtime,
            roots,
            settings,
            default_grant,
            publish_hook: None,
            backends: Mutex::new(BTreeMap::new()),
            resources: Mutex::new(BTreeMap::new()),
            metrics: Arc::new(NoMetrics),
        }
    }

    /// Record every backend call's latency in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<dyn BackendMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Run `hook` on every resource's new device list before it reaches kubelet.
    pub fn with_publish_hook(mut self, hook: PublishHook) -> Self {
        self.publish_hook = Some(hook);
        self
    }

    /// Whether the operator's config turns this backend off.
    pub fn enabled(&self, name: &str) -> bool {
        self.settings.get(name).is_none_or(|s| s.enabled)
    }

    fn capabilities(&self, src: &BackendSource) -> Result<Capabilities, LoadError> {
        let requested = &src.manifest.requests;
        let granted: Globs = match self.settings.get(&src.name).and_then(|s| s.grant.clone()) {
            Some(g) => g,
            None if src.origin == Origin::Embedded => requested.clone(),
            None => match self.default_grant {
                DefaultGrant::Requested => requested.clone(),
                DefaultGrant::None => {
                    if requested != &Globs::default() {
                        tracing::warn!(
                            backend = %src.name,
                            "no grant in the config: this backend sees nothing; add [backends.{}.grant] or set default_grant = \"requested\"",
                            src.name
                        );
                    }
                    Globs::default()
                }
            },
        };
        Capabilities::new(requested, &granted).map_err(LoadError::Manifest)
    }

    /// Compile, instantiate and `init` a backend (its config: the operator's, else the
    /// manifest's default). Blocking.
    fn instantiate(&self, src: &BackendSource) -> Result<BackendInstance, LoadError> {
        let caps = self.capabilities(src)?;
        let sandbox = Sandbox::new(&src.name, &caps, &self.roots, self.runtime.config.memory_cap);
        let config = self
            .settings
            .get(&src.name)
            .map(|s| s.config.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| src.manifest.config.clone())
            .unwrap_or_default();
        BackendInstance::load(&self.runtime, &src.bytes, config, sandbox)
    }

    /// Compile, instantiate and `init` a backend and claim its resources. Blocking.
    pub fn load(&self, src: BackendSource) -> Result<(), LoadError> {
        let inst = self.instantiate(&src)?;
        self.log_loaded(&src, &inst, "backend loaded");
        let retired = self.install(&src, Arc::new(inst));
        debug_assert!(retired.is_empty(), "a first load retires nothing");
        Ok(())
    }

    fn log_loaded(&self, src: &BackendSource, inst: &BackendInstance, what: &'static str) {
        tracing::info!(
            backend = %src.name,
            version = %inst.info().version,
            wit = inst.wit_version(),
            digest = &inst.digest()[..12],
            origin = %src.origin,
            cache = ?inst.cache,
            "{what}"
        );
    }

    /// Replace (or add) a backend while everything keeps serving: the new version is built and
    /// must `init` and `discover` within its deadlines before anything changes; then the slot
    /// is swapped atomically (calls in flight finish on the old instance) and the new device
    /// lists are published (kubelet hears only of real changes). On any failure the old version
    /// keeps serving and the error says which step failed. Blocking.
    pub fn swap(&self, src: BackendSource) -> Result<Swapped, LoadError> {
        let inst = self.instantiate(&src)?;
        let found = inst.discover().map_err(LoadError::Discover)?;
        self.log_loaded(&src, &inst, "backend swapped in");
        let inst = Arc::new(inst);
        let retired = self.install(&src, inst.clone());
        let slot = self.backends.locked().get(&src.name).cloned();
        let mut ready = Vec::new();
        if let Some(slot) = slot {
            self.publish_discovered(&src.name, &slot, &inst, Ok(found), &mut ready);
        }
        Ok(Swapped { ready, retired })
    }

    /// Stop a backend: its resources stream an empty device list (kubelet has no deregister
    /// call) and are handed back to be stopped.
    pub fn unload(&self, name: &str) -> Vec<Retired> {
        self.backends.locked().remove(name);
        let mut resources = self.resources.locked();
        let names: Vec<String> = resources.iter().filter(|(_, r)| r.backend == name).map(|(n, _)| n.clone()).collect();
        names.into_iter().filter_map(|n| resources.remove(&n).map(|r| retire(n, r))).collect()
    }

    /// Loaded backends: name → (origin, source key).
    pub fn loaded(&self) -> BTreeMap<String, (Origin, String)> {
        self.backends.locked().iter().map(|(n, s)| (n.clone(), (**s.origin.load()).clone())).collect()
    }

    /// Put `inst` in the backend's slot and bring resource claims in line with its `init`:
    /// new names are claimed (unless another backend has them), names it no longer declares
    /// are retired.
    fn install(&self, src: &BackendSource, inst: Arc<BackendInstance>) -> Vec<Retired> {
        let info = inst.info().clone();
        let mut resources = self.resources.locked();
        for (name, options) in &info.resources {
            if let Some(why) = resource_name_problem(name) {
                tracing::error!(backend = %src.name, resource = %name, "resource skipped: kubelet would refuse it: {why}");
                continue;
            }
            match resources.get(name) {
                Some(r) if r.backend != src.name => {
                    tracing::error!(
                        backend = %src.name,
                        resource = %name,
                        owner = %r.backend,
                        "resource skipped: already served by another backend (the first one loaded keeps it)"
                    );
                }
                Some(r) => {
                    if r.options != *options {
                        tracing::warn!(backend = %src.name, resource = %name, "the new version announces other options; kubelet learns them at the next registration");
                    }
                }
                None => {
                    let (tx, _) = watch::channel(Arc::new(Resource { name: name.clone(), ..Default::default() }));
                    resources.insert(
                        name.clone(),
                        ResSlot {
                            backend: src.name.clone(),
                            options: *options,
                            tx,
                            published: false,
                            logged: HashSet::new(),
                        },
                    );
                }
            }
        }
        let declared: HashSet<&String> = info.resources.iter().map(|(n, _)| n).collect();
        let gone: Vec<String> = resources
            .iter()
            .filter(|(n, r)| r.backend == src.name && !declared.contains(n))
            .map(|(n, _)| n.clone())
            .collect();
        let retired: Vec<Retired> =
            gone.into_iter().filter_map(|n| resources.remove(&n).map(|r| retire(n, r))).collect();
        drop(resources);
        let mut backends = self.backends.locked();
        match backends.get(&src.name) {
            // Swap in place, so every ResourceCalls already handed to kubelet's servers routes to
            // the new instance and no resource is re-registered.
            Some(slot) => {
                slot.origin.store(Arc::new((src.origin.clone(), src.key.clone())));
                slot.current.store(inst);
            }
            None => {
                let slot = Slot {
                    origin: ArcSwap::from_pointee((src.origin.clone(), src.key.clone())),
                    current: ArcSwap::new(inst),
                    last_error: Mutex::new(None),
                };
                backends.insert(src.name.clone(), Arc::new(slot));
            }
        }
        retired
    }

    /// One `discover` for each loaded backend not in `busy`. Each runs on its own (blocking)
    /// and is handed back with [`finish_poll`](Self::finish_poll), so a backend that takes its
    /// whole deadline delays no other backend's poll.
    pub fn start_polls(&self, busy: &HashSet<String>) -> Vec<PollJob> {
        self.backends
            .locked()
            .iter()
            .filter(|(n, _)| !busy.contains(*n))
            .map(|(n, s)| PollJob { name: n.clone(), slot: s.clone(), inst: s.current.load_full() })
            .collect()
    }

    /// The discover of backend `name` alone (a uevent asked for it).
    pub fn poll_job(&self, name: &str) -> Option<PollJob> {
        let backends = self.backends.locked();
        let s = backends.get(name)?;
        Some(PollJob { name: name.to_owned(), slot: s.clone(), inst: s.current.load_full() })
    }

    /// Backends subscribed to kernel uevents of `subsystem`.
    pub fn subscribers(&self, subsystem: &str) -> Vec<String> {
        let backends = self.backends.locked();
        backends.iter().filter(|(_, s)| s.current.load().subscribes(subsystem)).map(|(n, _)| n.clone()).collect()
    }

    /// Publish a finished poll; returns resources to start serving.
    pub fn finish_poll(&self, done: PollDone) -> Vec<ReadyResource> {
        let PollDone { job, result, took } = done;
        self.metrics.backend_call(&job.name, "discover", took);
        let mut ready = Vec::new();
        self.publish_discovered(&job.name, &job.slot, &job.inst, result, &mut ready);
        ready
    }

    /// Run every backend's `discover`, all at once, and update the device lists.
    pub async fn poll_once(&self) -> PollReport {
        let jobs = self.start_polls(&HashSet::new());
        let runs = jobs.into_iter().map(|job| async move {
            let name = job.name.clone();
            tokio::task::spawn_blocking(move || job.run()).await.map_err(|e| (name, e))
        });
        let mut report = PollReport::default();
        for done in futures::future::join_all(runs).await {
            match done {
                Ok(done) => report.ready.extend(self.finish_poll(done)),
                Err((name, e)) => tracing::error!(backend = %name, "discover panicked in the host: {e}"),
            }
        }
        report
    }

    /// Publish one backend's discover result to its resources' streams.
    fn publish_discovered(
        &self,
        name: &str,
        slot: &Arc<Slot>,
        inst: &BackendInstance,
        result: Result<Vec<Resource>, CallError>,
        ready: &mut Vec<ReadyResource>,
    ) {
        // A discover that raced a swap or unload must not publish over the newer state.
        let current = self.backends.locked().get(name).is_some_and(|s| Arc::ptr_eq(s, slot));
        if !current || !std::ptr::eq(slot.current.load().as_ref(), inst) {
            return;
        }
        self.note_error(name, slot, result.as_ref().err());
        let breaker = inst.breaker_open();
        let ok = result.is_ok();
        let found: BTreeMap<String, Resource> = match result {
            Ok(list) => list.into_iter().map(|r| (r.name.clone(), r)).collect(),
            Err(_) => BTreeMap::new(),
        };
        let mut resources = self.resources.locked();
        for (rname, rs) in resources.iter_mut().filter(|(_, r)| r.backend == name) {
            let prev = rs.tx.borrow().clone();
            let mut next = match found.get(rname) {
                // Already vetted (IDs, sizes, grants) by the runtime.
                Some(r) => r.clone(),
                // A failed discover keeps the last list (a passing fault must not empty
                // kubelet's view); an answer without this resource means no devices.
                None if ok => Resource { name: rname.clone(), ..Default::default() },
                None => (*prev).clone(),
            };
            if breaker {
                next.devices.iter_mut().for_each(|d| d.health = Health::Unhealthy);
            }
            let kubelet_changed = prev.kubelet_view() != next.kubelet_view();
            if kubelet_changed {
                for d in &next.devices {
                    let before = prev.device(&d.id).map(|p| p.health);
                    if before.is_some_and(|b| b != d.health) {
                        tracing::warn!(resource = %rname, device = %d.id, health = d.health.as_str(), "device health changed");
                    }
                }
            }
            if let Some(hook) = &self.publish_hook
                && (kubelet_changed || next != *prev)
            {
                hook(&next);
            }
            rs.tx.send_if_modified(|v| {
                *v = Arc::new(next);
                kubelet_changed
            });
            if !rs.published && !rs.tx.borrow().devices.is_empty() {
                rs.published = true;
                ready.push(ReadyResource {
                    name: rname.clone(),
                    backend: name.to_owned(),
                    options: rs.options,
                    devices: rs.tx.subscribe(),
                    calls: Arc::new(ResourceCalls {
                        slot: slot.clone(),
                        resource: rname.clone(),
                        backend: name.to_owned(),
                        metrics: self.metrics.clone(),
                    }),
                });
            }
        }
        let extras: Vec<&String> = found.keys().filter(|k| !resources.contains_key(*k)).collect();
        for extra in extras {
            let key = format!("undeclared {extra}");
            if let Some(r) = resources.values_mut().find(|r| r.backend == name)
                && r.logged.len() < MAX_LOGGED
                && r.logged.insert(key)
            {
                tracing::warn!(backend = %name, resource = %extra, "discover returned a resource init did not declare; ignored");
            }
        }
    }

    fn note_error(&self, backend: &str, slot: &Slot, err: Option<&CallError>) {
        let mut last = slot.last_error.locked();
        let now = err.map(|e| e.to_string());
        if now != *last {
            match &now {
                Some(e) if !err.is_some_and(CallError::is_fault) => {
                    tracing::warn!(backend, error = %e, "discover failed; keeping the last device list")
                }
                None if last.is_some() => tracing::info!(backend, "discover works again"),
                _ => {}
            }
            *last = now;
        }
    }

    /// Current device lists, by resource name.
    pub fn snapshot(&self) -> Vec<Arc<Resource>> {
        self.resources.locked().values().map(|r| r.tx.borrow().clone()).collect()
    }

    pub fn summaries(&self) -> Vec<BackendSummary> {
        let resources = self.resources.locked();
        self.backends
            .locked()
            .iter()
            .map(|(name, slot)| {
                let inst = slot.current.load();
                BackendSummary {
                    name: name.clone(),
                    version: inst.info().version.clone(),
                    wit_version: inst.wit_version().to_owned(),
                    digest: inst.digest().to_owned(),
                    origin: slot.origin.load().0.to_string(),
                    breaker_open: inst.breaker_open(),
                    resources: resources.iter().filter(|(_, r)| &r.backend == name).map(|(n, _)| n.clone()).collect(),
                    stats: {
                        let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                        StatsSnapshot {
                            calls: l(&inst.stats.calls),
                            guest_errors: l(&inst.stats.guest_errors),
                            traps: l(&inst.stats.traps),
                            timeouts: l(&inst.stats.timeouts),
                            memory_cap_hits: l(&inst.stats.memory_cap_hits),
                            refused: l(&inst.stats.refused),
                        }
                    },
                    last_error: slot.last_error.locked().clone(),
                }
            })
            .collect()
    }
}

/// One resource's calls (Allocate and friends), routed to its backend's current instance: a
/// swap changes where they go without the caller noticing.
pub struct ResourceCalls {
    slot: Arc<Slot>,
    resource: String,
    backend: String,
    metrics: Arc<dyn BackendMetrics>,
}

impl ResourceCalls {
    pub async fn allocate(&self, ids: Vec<String>) -> Result<ContainerEdits, CallError> {
        self.run("allocate", move |b, r| b.allocate(r, &ids)).await
    }

    pub async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must: Vec<String>,
        size: u32,
    ) -> Result<Vec<String>, CallError> {
        self.run("preferred_allocation", move |b, r| b.preferred_allocation(r, &available, &must, size)).await
    }

    pub async fn pre_start(&self, ids: Vec<String>) -> Result<(), CallError> {
        self.run("pre_start", move |b, r| b.pre_start(r, &ids)).await
    }

    async fn run<T: Send + 'static>(
        &self,
        call: &'static str,
        f: impl FnOnce(&BackendInstance, &str) -> Result<T, CallError> + Send + 'static,
    ) -> Result<T, CallError> {
        let t0 = std::time::Instant::now();
        let out = self.run_inner(f).await;
        self.metrics.backend_call(&self.backend, call, t0.elapsed());
        out
    }

    async fn run_inner<T: Send + 'static>(
        &self,
        f: impl FnOnce(&BackendInstance, &str) -> Result<T, CallError> + Send + 'static,
    ) -> Result<T, CallError> {
        let inst = self.slot.current.load_full();
        // Kubelet's calls are short (microseconds, bounded by the call deadline): run them on
        // this worker and let tokio move its other tasks away, instead of paying a hop to the
        // blocking pool on every Allocate. A current-thread runtime cannot do that: hop there.
        if tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            return tokio::task::block_in_place(|| f(&inst, &self.resource));
        }
        let resource = self.resource.clone();
        tokio::task::spawn_blocking(move || f(&inst, &resource))
            .await
            .map_err(|e| CallError::Trap(format!("the call panicked in the host: {e}")))?
    }
}
