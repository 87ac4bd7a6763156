//! The table of loaded backends ([`Loaded`]): loading, hot-swapping and unloading them, which
//! resource each one serves (the first backend to claim a name keeps it), and what status reads.
//! Polling lives in [`super::polls`], per-resource call routing in [`super::routing`].

use crate::sync::Locked;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::routing::ReadyResource;
use super::settings::{BackendSettings, DefaultGrant};
pub use super::slot::BackendMetrics;
use super::slot::{NoMetrics, Slot};
use super::source::{BackendSource, Origin};
use crate::model::contest::Contest;
use crate::model::names::resource_name_problem;
use crate::model::nodes::{Conflict, OwnersView};
use crate::model::owns::Decisions;
use crate::model::{Resource, ResourceOptions};
use crate::runtime::caps::{Capabilities, Globs};
use crate::runtime::state::{Roots, Sandbox};
use crate::runtime::{BackendInstance, LoadError, Runtime};

/// See [`Loaded::with_publish_hook`].
pub type PublishHook = Arc<dyn Fn(&Resource) + Send + Sync>;

/// Distinct problems remembered per resource for log-once; past this they are not logged again.
pub(super) const MAX_LOGGED: usize = 64;

pub(super) struct ResSlot {
    pub(super) backend: String,
    pub(super) options: ResourceOptions,
    /// What is published: [`raw`](Self::raw) less what is refused.
    pub(super) tx: watch::Sender<Arc<Resource>>,
    /// The list as its backend last discovered it: what the node-ownership table is built from.
    pub(super) raw: Arc<Resource>,
    pub(super) published: bool,
    pub(super) logged: HashSet<String>,
    /// Device nodes another backend's resource names too: this one's devices naming them are
    /// refused ([`crate::model::nodes`]), and so are the other side's.
    pub(super) conflicts: Vec<Conflict>,
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

/// One backend, for `devplug discover` and status (read back by `devplug status`: every field
/// has a default, for what an older devplug did not send).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct BackendSummary {
    pub name: String,
    /// Whether a version of it is loaded: `false` for a backend that failed to load and has
    /// no version serving (its error is in `last_error`). An older devplug sent no `loaded`:
    /// everything it listed was loaded.
    #[serde(default = "yes")]
    pub loaded: bool,
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
    /// The first distinct accesses it was refused, each with the grant that would allow it.
    pub denied: Vec<Denied>,
    /// Each pair of resources (one of this backend's, one of another's) naming the same device
    /// nodes, one line each: what is withheld and the config line that settles it.
    pub conflicts: Vec<String>,
    /// Which compiler made the code serving now (`baseline` until the optimised code of a large
    /// backend is swapped in), and whether that optimised compile is pending.
    pub compiler: crate::runtime::Tier,
    pub optimizing: bool,
    /// Requests of its manifest no grant can hold, each with what to write instead.
    pub warnings: Vec<String>,
}

fn yes() -> bool {
    true
}

/// Refused accesses a summary names (the count is in [`StatsSnapshot::denied`]).
pub(crate) const MAX_DENIED_SHOWN: usize = 32;

/// One refused access and the grant line that would allow it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Denied {
    /// The capability call (`sysfs.read`, `sysfs.list-dir`, `devfs.stat`).
    pub call: String,
    pub path: String,
    /// `[backends.NAME.grant] sysfs = ["…"]` (and the same under `[requests]` for its manifest).
    pub grant: String,
    /// The path is there on this machine (a refused look at what is not here fails nothing).
    pub present: bool,
}

impl Denied {
    fn new(backend: &str, call: &str, path: &str, grantable: bool, present: bool) -> Denied {
        let kind = match call.split('.').next().unwrap_or("") {
            "devfs" => "dev",
            other => other,
        };
        let grant = if grantable {
            let pattern = crate::runtime::learn::general(path);
            format!("[backends.{backend}.grant] {kind} = [{pattern:?}] (or in its manifest's [requests])")
        } else {
            "no grant allows it: the path or pattern is malformed; fix the backend".to_owned()
        };
        Denied { call: call.to_owned(), path: path.to_owned(), grant, present }
    }
}

/// A copy of a backend instance's counters.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StatsSnapshot {
    pub calls: u64,
    pub guest_errors: u64,
    pub traps: u64,
    pub timeouts: u64,
    pub memory_cap_hits: u64,
    pub refused: u64,
    /// Distinct accesses of the machine refused (reads, listings' hidden entries, nodes).
    pub denied: u64,
}

pub struct Loaded {
    runtime: Arc<Runtime>,
    /// Where the backends' views of the machine are rooted.
    roots: Roots,
    settings: BTreeMap<String, BackendSettings>,
    default_grant: DefaultGrant,
    /// Called with a resource's new device list before it is published (the daemon writes its
    /// CDI spec there, so kubelet never sees a device its spec does not name yet).
    pub(super) publish_hook: Option<PublishHook>,
    pub(super) backends: Mutex<BTreeMap<String, Arc<Slot>>>,
    pub(super) resources: Mutex<BTreeMap<String, ResSlot>>,
    pub(super) metrics: Arc<dyn BackendMetrics>,
    /// Resources this node serves through DRA: a backend that may serve one is asked to
    /// `describe` its devices.
    dra_resources: Vec<String>,
    /// Every resource counts as served through DRA (`devplug dra slices` previews them all).
    all_dra: bool,
    /// Who owns each device node, from every backend's latest discover: the answer writers'
    /// gate reads it.
    pub(super) owners: OwnersView,
    /// Backends that failed to load with no version serving: name → (origin, error).
    failed: Mutex<BTreeMap<String, (String, String)>>,
    /// The operator's `owns`: which resource keeps a node two backends name.
    pub(super) decisions: Decisions,
    /// The contests as last told, one per pair of resources.
    pub(super) contests: Mutex<Vec<Contest>>,
}

impl Loaded {
    pub fn new(
        runtime: Arc<Runtime>,
        roots: Roots,
        settings: BTreeMap<String, BackendSettings>,
        default_grant: DefaultGrant,
    ) -> Self {
        Loaded {
            runtime,
            roots,
            settings,
            default_grant,
            publish_hook: None,
            backends: Mutex::new(BTreeMap::new()),
            resources: Mutex::new(BTreeMap::new()),
            metrics: Arc::new(NoMetrics),
            dra_resources: Vec::new(),
            all_dra: false,
            owners: OwnersView::default(),
            failed: Mutex::new(BTreeMap::new()),
            decisions: Decisions::default(),
            contests: Mutex::new(Vec::new()),
        }
    }

    /// Settle contested device nodes by the config's `owns` (see [`crate::model::contest`]).
    pub(crate) fn with_decisions(mut self, decisions: Decisions) -> Self {
        self.decisions = decisions;
        self
    }

    /// How many of `resource`'s devices are withheld for device nodes another backend's
    /// resource names too (contested, or the other's by the config).
    pub fn withheld(&self, resource: &str) -> usize {
        let resources = self.resources.locked();
        let Some(r) = resources.get(resource) else { return 0 };
        let ids: std::collections::BTreeSet<&str> =
            r.conflicts.iter().flat_map(|c| c.devices.iter().map(String::as_str)).collect();
        ids.len()
    }

    /// Every pair of resources of two backends naming the same device nodes, as last told:
    /// undecided ones withhold both sides' devices naming them, decided ones the loser's.
    pub fn contests(&self) -> Vec<Contest> {
        self.contests.locked().clone()
    }

    /// Remember that `name` (from `origin`) failed to load with `error`, for status, until a
    /// version of it loads.
    pub(crate) fn note_failed(&self, name: &str, origin: &str, error: &str) {
        let error = crate::gate::clip_to(error, 2048).into_owned();
        self.failed.locked().insert(name.to_owned(), (origin.to_owned(), error));
    }

    /// Record every backend call's latency in `metrics`.
    /// The resources this node serves through DRA (their backends are asked to `describe`).
    pub(crate) fn with_dra_resources(mut self, names: Vec<String>) -> Self {
        self.dra_resources = names;
        self
    }

    /// Treat every resource as served through DRA (a preview of what this node would publish).
    pub(crate) fn with_all_dra(mut self) -> Self {
        self.all_dra = true;
        self
    }

    /// Whether `resource` is served through DRA here.
    pub(crate) fn serves_dra(&self, resource: &str) -> bool {
        self.all_dra || self.dra_resources.iter().any(|r| r == resource)
    }

    pub(crate) fn with_metrics(mut self, metrics: Arc<dyn BackendMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Run `hook` on every resource's new device list before it reaches kubelet.
    pub(crate) fn with_publish_hook(mut self, hook: PublishHook) -> Self {
        self.publish_hook = Some(hook);
        self
    }

    /// Whether the operator's config turns this backend off.
    pub fn enabled(&self, name: &str) -> bool {
        self.settings.get(name).is_none_or(|s| s.enabled)
    }

    /// Compile `src` ahead of its [`Loaded::load`] (a standby does, before the instance lock),
    /// unless the config turns it off. Blocking.
    pub fn prepare(&self, src: &BackendSource) {
        if self.enabled(&src.name) {
            let t0 = std::time::Instant::now();
            self.runtime.prepare(Some(&src.name), &src.bytes, src.signed.take());
            tracing::info!(backend = %src.name, origin = %src.origin, compile_ms = t0.elapsed().as_millis() as u64,
                "backend compiled ahead of its load");
        }
    }

    /// Drop compiled code [`Loaded::prepare`] made that no load took.
    pub(crate) fn forget_prepared(&self) {
        self.runtime.forget_prepared();
    }

    fn capabilities(&self, src: &BackendSource) -> Result<Capabilities, LoadError> {
        let settings = self.settings.get(&src.name);
        let explicit = settings.and_then(|s| s.grant.clone());
        let mut requested = src.manifest.requests.clone();
        if src.manifest.resources_unstated {
            // A manifest from before resource names were a capability: the operator's explicit
            // grant speaks for it, so an upgrade does not silently empty a granted backend.
            tracing::warn!(backend = %src.name, "{}", crate::backends::Manifest::MISSING_RESOURCES);
            requested.resources = explicit.as_ref().map(|g| g.resources.clone()).unwrap_or_default();
        }
        let requested = &requested;
        let granted: Globs = match explicit {
            Some(g) if settings.is_some_and(|s| s.grant_resources_unstated) => {
                // A grant written before devplug 0.2.0 could narrow only sysfs and dev: every kind
                // added since (resource names, env, mounts, ...) gets the origin's default grant.
                let default = match (&src.origin, self.default_grant) {
                    (Origin::Embedded, _) | (_, DefaultGrant::Requested) => requested.clone(),
                    (_, DefaultGrant::None) => Globs::default(),
                };
                tracing::warn!(
                    backend = %src.name,
                    resources = ?default.resources,
                    "[backends.{}.grant] has no `resources` (configs before devplug 0.2.0, whose grants had only sysfs and dev): everything else gets the default for its origin, these resource names among it; add `resources = [...]` (and env, mounts, ... as needed) to the grant to choose",
                    src.name
                );
                Globs { sysfs: g.sysfs, dev: g.dev, ..default }
            }
            Some(g) => g,
            None if src.origin == Origin::Embedded => requested.clone(),
            None => match self.default_grant {
                DefaultGrant::Requested => {
                    // A third-party manifest's request stands in for a grant here, so it gets the
                    // grant's gate: env globs only as vendor prefixes (embedded manifests ship in
                    // the binary and are reviewed with it).
                    let mut g = requested.clone();
                    g.env.retain(|p| match crate::gate::EnvGrant::new(p) {
                        Ok(_) => true,
                        Err(e) => {
                            tracing::warn!(backend = %src.name, "default_grant = \"requested\" does not grant env {e}; grant the keys in [backends.{}.grant]", src.name);
                            false
                        }
                    });
                    g
                }
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
        let describe = self.all_dra || self.dra_resources.iter().any(|r| caps.resources.allows(r));
        let sandbox = Sandbox::new(&src.name, &caps, &self.roots, self.runtime.config.memory_cap).describing(describe);
        let config = self
            .settings
            .get(&src.name)
            .map(|s| s.config.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| src.manifest.config.clone())
            .unwrap_or_default();
        BackendInstance::load_signed(&self.runtime, &src.bytes, src.signed.take(), config, sandbox)
    }

    /// Compile, instantiate and `init` a backend and claim its resources. Blocking.
    pub fn load(&self, src: BackendSource) -> Result<(), LoadError> {
        let inst = self.instantiate(&src)?;
        self.log_loaded(&src, &inst, None, "backend loaded");
        let retired = self.install(&src, Arc::new(inst));
        debug_assert!(retired.is_empty(), "a first load retires nothing");
        Ok(())
    }

    fn log_loaded(&self, src: &BackendSource, inst: &BackendInstance, discover: Option<Duration>, what: &'static str) {
        let ms = |d: Duration| d.as_millis() as u64;
        tracing::info!(
            backend = %src.name,
            version = %inst.info().version,
            wit = inst.wit_version(),
            digest = &inst.digest()[..12],
            origin = %src.origin,
            cache = ?inst.cache,
            compiler = ?inst.compiled_as,
            compile_ms = ms(inst.took.compile),
            init_ms = ms(inst.took.init),
            discover_ms = discover.map(ms),
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
        let t0 = std::time::Instant::now();
        let found = inst.discover().map_err(LoadError::Discover)?;
        self.log_loaded(&src, &inst, Some(t0.elapsed()), "backend swapped in");
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
    pub(crate) fn unload(&self, name: &str) -> Vec<Retired> {
        self.backends.locked().remove(name);
        let mut resources = self.resources.locked();
        let names: Vec<String> = resources.iter().filter(|(_, r)| r.backend == name).map(|(n, _)| n.clone()).collect();
        let retired: Vec<Retired> =
            names.into_iter().filter_map(|n| resources.remove(&n).map(|r| retire(n, r))).collect();
        // A node it contested is free again for the other side.
        self.settle(&mut resources, None);
        retired
    }

    /// Loaded backends: name → (origin, source key).
    pub(crate) fn origins(&self) -> BTreeMap<String, (Origin, String)> {
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
                    let empty = Arc::new(Resource { name: name.clone(), ..Default::default() });
                    let (tx, _) = watch::channel(empty.clone());
                    resources.insert(
                        name.clone(),
                        ResSlot {
                            backend: src.name.clone(),
                            options: *options,
                            tx,
                            raw: empty,
                            published: false,
                            logged: HashSet::new(),
                            conflicts: Vec::new(),
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
                slot.warnings.store(Arc::new(src.manifest.never_granted()));
            }
            None => {
                let slot = Slot {
                    origin: ArcSwap::from_pointee((src.origin.clone(), src.key.clone())),
                    current: ArcSwap::new(inst),
                    last_error: Mutex::new(None),
                    warnings: ArcSwap::from_pointee(src.manifest.never_granted()),
                };
                backends.insert(src.name.clone(), Arc::new(slot));
            }
        }
        retired
    }

    /// Current device lists, by resource name.
    pub fn snapshot(&self) -> Vec<Arc<Resource>> {
        self.resources.locked().values().map(|r| r.tx.borrow().clone()).collect()
    }

    pub(crate) fn summaries(&self) -> Vec<BackendSummary> {
        // Copied before the other locks are taken (the polls take it under `resources`).
        let contests = self.contests();
        let resources = self.resources.locked();
        let backends = self.backends.locked();
        let failed: Vec<BackendSummary> = self
            .failed
            .locked()
            .iter()
            .filter(|(name, _)| !backends.contains_key(*name))
            .map(|(name, (origin, error))| BackendSummary {
                name: name.clone(),
                loaded: false,
                version: String::new(),
                wit_version: String::new(),
                digest: String::new(),
                origin: origin.clone(),
                breaker_open: false,
                resources: Vec::new(),
                stats: StatsSnapshot::default(),
                last_error: Some(format!("not loaded: {error}")),
                denied: Vec::new(),
                conflicts: Vec::new(),
                compiler: crate::runtime::Tier::Optimized,
                optimizing: false,
                warnings: Vec::new(),
            })
            .collect();
        backends
            .iter()
            .map(|(name, slot)| {
                let inst = slot.current.load();
                BackendSummary {
                    name: name.clone(),
                    loaded: true,
                    version: inst.info().version.clone(),
                    wit_version: inst.wit_version().to_owned(),
                    digest: inst.digest().to_owned(),
                    origin: slot.origin.load().0.to_string(),
                    breaker_open: inst.breaker_open(),
                    compiler: inst.tier(),
                    optimizing: inst.optimizing(),
                    warnings: slot.warnings.load().to_vec(),
                    resources: resources.iter().filter(|(_, r)| &r.backend == name).map(|(n, _)| n.clone()).collect(),
                    conflicts: contests.iter().filter(|c| c.involves(name)).map(ToString::to_string).collect(),
                    stats: {
                        let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                        StatsSnapshot {
                            calls: l(&inst.stats.calls),
                            guest_errors: l(&inst.stats.guest_errors),
                            traps: l(&inst.stats.traps),
                            timeouts: l(&inst.stats.timeouts),
                            memory_cap_hits: l(&inst.stats.memory_cap_hits),
                            refused: l(&inst.stats.refused),
                            denied: inst.refusals().count(),
                        }
                    },
                    denied: inst
                        .refusals()
                        .paths(MAX_DENIED_SHOWN)
                        .into_iter()
                        .map(|r| Denied::new(name, &r.call, &r.path, r.grantable, r.present))
                        .collect(),
                    last_error: slot.last_error.locked().clone(),
                }
            })
            .chain(failed)
            .collect()
    }
}

/// A [`Loaded`] over a fixture `/dev` (`kvm`, `fuse`) with backends made from the embedded
/// generic backend under other names and configs: enough to test the rules of claiming,
/// swapping and polling without a daemon.
#[cfg(test)]
pub(super) mod testing {
    use std::path::Path;

    use super::Loaded;
    use crate::backends::{BackendSource, DefaultGrant};
    use crate::runtime::state::Roots;
    use crate::runtime::{Runtime, RuntimeConfig};

    /// The embedded generic backend, named `name`, serving each `(resource, node)` (two shares
    /// of the node) through its manifest's default config.
    pub fn generic(name: &str, resources: &[(&str, &str)]) -> BackendSource {
        let mut src = BackendSource::embedded().into_iter().find(|s| s.name == "generic").expect("generic is embedded");
        src.name = name.to_owned();
        let config = resources
            .iter()
            .map(|(name, path)| format!("[[resource]]\nname = \"{name}\"\npaths = [\"{path}\"]\ncount = 2\n"))
            .collect();
        src.manifest.config = Some(config);
        src
    }

    /// One round of discovers, as the daemon runs it (backend calls block, so not inside an
    /// async test's own runtime).
    pub fn poll(l: &Loaded) -> crate::backends::PollReport {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.block_on(l.poll_once())
    }

    pub fn loaded(machine: &Path) -> Loaded {
        std::fs::create_dir_all(machine.join("dev")).unwrap();
        std::fs::write(machine.join("dev/kvm"), "c 10:232").unwrap();
        std::fs::write(machine.join("dev/fuse"), "c 10:229").unwrap();
        std::fs::write(machine.join("dev/zero"), "c 1:5").unwrap();
        let rt = Runtime::new(RuntimeConfig::default()).unwrap();
        Loaded::new(rt, Roots::fixture(machine), Default::default(), DefaultGrant::Requested)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{generic, loaded, poll};

    fn resources_of(l: &super::Loaded, backend: &str) -> Vec<String> {
        l.summaries().into_iter().find(|b| b.name == backend).map(|b| b.resources).unwrap_or_default()
    }

    #[test]
    fn the_first_backend_to_claim_a_resource_name_keeps_it() {
        let d = tempfile::tempdir().unwrap();
        let l = loaded(d.path());
        let second = generic("second", &[("test.io/kvm", "zero"), ("test.io/fuse", "fuse")]);
        l.load(generic("first", &[("test.io/kvm", "kvm")])).unwrap();
        l.load(second.clone()).unwrap();
        assert_eq!(resources_of(&l, "first"), ["test.io/kvm"]);
        assert_eq!(resources_of(&l, "second"), ["test.io/fuse"], "the name first claimed is not handed over");
        poll(&l);
        let kvm = l.snapshot().into_iter().find(|r| r.name == "test.io/kvm").unwrap();
        let paths: Vec<&str> = kvm
            .devices
            .iter()
            .flat_map(|d| d.attributes.iter().filter(|(k, _)| k == "paths").map(|(_, v)| v.as_str()))
            .collect();
        assert_eq!(paths, ["/dev/kvm", "/dev/kvm"], "the list is the first backend's, never the second's");
        // Once the owner is gone, the name is free for the next backend that declares it.
        drop(l.unload("first"));
        l.swap(second).unwrap();
        assert_eq!(resources_of(&l, "second"), ["test.io/fuse", "test.io/kvm"]);
    }

    #[test]
    fn resource_names_kubelet_would_refuse_are_not_claimed() {
        let d = tempfile::tempdir().unwrap();
        let l = loaded(d.path());
        l.load(generic("b", &[("kubernetes.io/kvm", "kvm"), ("test.io/fuse", "fuse")])).unwrap();
        assert_eq!(resources_of(&l, "b"), ["test.io/fuse"]);
    }

    #[test]
    fn a_swap_retires_the_names_the_new_version_drops_and_keeps_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let l = loaded(d.path());
        l.load(generic("b", &[("test.io/kvm", "kvm"), ("test.io/fuse", "fuse")])).unwrap();
        let ready = poll(&l).ready;
        let fuse = ready.iter().find(|r| r.name == "test.io/fuse").unwrap();
        let swapped = l.swap(generic("b", &[("test.io/kvm", "kvm")])).unwrap();
        let retired: Vec<&str> = swapped.retired.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(retired, ["test.io/fuse"]);
        assert!(swapped.ready.is_empty(), "a name the old version served is not handed up again");
        assert!(fuse.devices.borrow().devices.is_empty(), "a retired resource streams an empty list last");
        assert_eq!(resources_of(&l, "b"), ["test.io/kvm"]);
    }
}
