//! Bringing the running host in line with its backend sources when the backends directory
//! changes: new or changed files are swapped in (and their resources served), removed files
//! unloaded (and their resources stopped), every refusal logged once, naming the file and the
//! reason; a registry version that fails is noted in its source's status. Which sources there are
//! is [`crate::backends::sources`]'s business.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use super::serve;
use super::specs::delivery;
use crate::backends::{BackendSource, ReadyResource, Registry, Retired, Statuses, sources};
use crate::cdi::SpecDir;
use crate::config::Config;
use crate::kubelet::Endpoints;
use crate::observe::Metrics;

/// Keeps the running set of backends in line with the sources.
pub struct Reconciler {
    pub cfg: Config,
    pub registry: Arc<Registry>,
    pub endpoints: Arc<Endpoints>,
    pub specs: Option<Arc<SpecDir>>,
    pub metrics: Arc<Metrics>,
    /// Sources that failed to load or swap, by name → key: not retried until the file changes.
    refused: HashMap<String, String>,
    /// Directory problems already logged (logged again only after they went away).
    noted: HashSet<String>,
    /// The registry versions on offer (see [`crate::backends::Follower`]).
    pulled: Option<tokio::sync::watch::Receiver<Vec<BackendSource>>>,
    statuses: Arc<Statuses>,
}

impl Reconciler {
    pub fn new(
        cfg: Config,
        registry: Arc<Registry>,
        endpoints: Arc<Endpoints>,
        specs: Option<Arc<SpecDir>>,
        metrics: Arc<Metrics>,
        refused: HashMap<String, String>,
    ) -> Self {
        Reconciler {
            cfg,
            registry,
            endpoints,
            specs,
            metrics,
            refused,
            noted: HashSet::new(),
            pulled: None,
            statuses: Arc::default(),
        }
    }

    /// Also reconcile against the registry versions `pulled` offers; refusals go to `statuses`.
    pub fn with_registry_sources(
        mut self,
        pulled: tokio::sync::watch::Receiver<Vec<BackendSource>>,
        statuses: Arc<Statuses>,
    ) -> Self {
        self.pulled = Some(pulled);
        self.statuses = statuses;
        self
    }

    /// Start serving resources that have devices for the first time.
    pub async fn serve(&self, ready: Vec<ReadyResource>) {
        for ready in ready {
            // The spec first, so kubelet never sees a device the CDI directory does not name yet
            // (a failure here is logged by the poll loop's sync).
            if let Some(specs) = &self.specs {
                let snapshot = ready.devices.borrow().clone();
                let _ = specs.sync(&snapshot);
            }
            let delivery = delivery(&self.cfg, &ready.name, self.specs.as_ref());
            let handle = serve::handle(ready, delivery, self.metrics.clone());
            tracing::info!(resource = %handle.name, devices = handle.devices.borrow().devices.len(), strategies = ?handle.delivery.strategies, "serving resource");
            self.endpoints.add(handle).await;
        }
    }

    /// Stop serving retired resources: their streams already sent an empty list.
    async fn stop(&self, retired: Vec<Retired>) {
        for r in retired {
            self.endpoints.remove(&r.name).await;
            if let Some(specs) = &self.specs {
                specs.remove(&r.name);
            }
            tracing::info!(resource = %r.name, "stopped serving: socket removed");
        }
    }

    /// Look at the sources again and swap, load or unload what changed.
    pub async fn reconcile(&mut self) {
        let pulled = self.pulled.as_mut().map(|p| p.borrow_and_update().clone()).unwrap_or_default();
        let (sources, problems) = sources(&self.cfg.catalog(), &pulled);
        let now: HashSet<String> = problems.into_iter().collect();
        for p in now.difference(&self.noted) {
            tracing::error!("backends dir: {p}");
        }
        self.noted = now;

        let loaded = self.registry.loaded();
        let wanted: HashSet<&str> =
            sources.iter().filter(|s| self.registry.enabled(&s.name)).map(|s| s.name.as_str()).collect();
        for gone in loaded.keys().filter(|n| !wanted.contains(n.as_str())) {
            let retired = self.registry.unload(gone);
            tracing::info!(backend = %gone, "backend removed from the directory: unloaded");
            self.refused.remove(gone);
            self.stop(retired).await;
        }
        for src in sources {
            if !self.registry.enabled(&src.name) {
                continue;
            }
            let unchanged = loaded.get(&src.name).is_some_and(|(o, k)| *o == src.origin && *k == src.key);
            if unchanged || self.refused.get(&src.name) == Some(&src.key) {
                continue;
            }
            let had_one = loaded.contains_key(&src.name);
            self.swap(src, had_one).await;
        }
    }

    /// Swap one source in; on failure the old version (`had_one`) keeps serving.
    async fn swap(&mut self, src: BackendSource, had_one: bool) {
        let (name, origin, key) = (src.name.clone(), src.origin.clone(), src.key.clone());
        let r = self.registry.clone();
        let t0 = Instant::now();
        let result = tokio::task::spawn_blocking(move || r.swap(src)).await;
        match result {
            Ok(Ok(swapped)) => {
                self.metrics.swap(&name, true);
                self.refused.remove(&name);
                tracing::info!(backend = %name, file = %origin, took_ms = t0.elapsed().as_millis() as u64, "backend swapped: the new version serves");
                self.serve(swapped.ready).await;
                self.stop(swapped.retired).await;
            }
            Ok(Err(e)) => {
                self.metrics.swap(&name, false);
                let keeps = if had_one { "the old version keeps serving" } else { "nothing was loaded" };
                tracing::error!(backend = %name, file = %origin, "backend refused, {keeps}: {e}");
                self.statuses.refused(&name, &format!("{origin}: {e}"));
                self.refused.insert(name, key);
            }
            Err(e) => {
                tracing::error!(backend = %name, file = %origin, "backend swap panicked: {e}");
                self.refused.insert(name, key);
            }
        }
    }
}
