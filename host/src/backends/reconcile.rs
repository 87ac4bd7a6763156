//! Bringing the loaded backends in line with their sources when the backends directory or a
//! followed registry reference changes: new or changed sources are swapped in, removed ones
//! unloaded, every refusal logged once, naming the file and the reason; a registry version that
//! fails is noted in its source's status. What changed for kubelet (resources to serve, to stop)
//! goes back to the caller. Which sources there are is [`super::sources`]'s business.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::{BackendMetrics, BackendSource, Catalog, Loaded, ReadyResource, Retired, Statuses, sources};

/// What one reconcile changed: resources that have devices under a new version, and resources no
/// backend serves any more (their streams already carry an empty list).
#[derive(Default)]
pub struct Changes {
    pub ready: Vec<ReadyResource>,
    pub retired: Vec<Retired>,
}

/// Keeps the loaded backends in line with their sources.
pub struct Reconciler {
    loaded: Arc<Loaded>,
    metrics: Arc<dyn BackendMetrics>,
    /// Sources that failed to load or swap, by name → key: not retried until the file changes.
    refused: HashMap<String, String>,
    /// Directory problems already logged (logged again only after they went away).
    noted: HashSet<String>,
    /// The registry versions on offer (see [`super::Follower`]).
    pulled: Option<watch::Receiver<Vec<BackendSource>>>,
    statuses: Arc<Statuses>,
    /// Loaded backends whose source went, by name → when it was first seen gone: unloaded once
    /// [`REMOVAL_GRACE`] has passed and it has not come back.
    missing: HashMap<String, Instant>,
}

/// How long a loaded backend whose file went stays loaded, waiting for it to come back: a
/// delete-then-create (an editor, `kubectl cp`, a copy tool) is a change, not a removal, however
/// slow the machine is between the two (the directory watch settles bursts only 20 ms apart).
pub(crate) const REMOVAL_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl Reconciler {
    /// `refused`: the sources that failed at start (see [`super::load_all`]).
    pub fn new(loaded: Arc<Loaded>, metrics: Arc<dyn BackendMetrics>, refused: HashMap<String, String>) -> Self {
        Reconciler {
            loaded,
            metrics,
            refused,
            noted: HashSet::new(),
            pulled: None,
            statuses: Arc::default(),
            missing: HashMap::new(),
        }
    }

    /// Also reconcile against the registry versions `pulled` offers; refusals go to `statuses`.
    pub(crate) fn with_registry_sources(
        mut self,
        pulled: watch::Receiver<Vec<BackendSource>>,
        statuses: Arc<Statuses>,
    ) -> Self {
        self.pulled = Some(pulled);
        self.statuses = statuses;
        self
    }

    /// Look at the sources again and swap, load or unload what changed.
    pub(crate) async fn reconcile(&mut self, catalog: &Catalog<'_>) -> Changes {
        let pulled = self.pulled.as_mut().map(|p| p.borrow_and_update().clone()).unwrap_or_default();
        let (sources, problems) = sources(catalog, &pulled);
        let now: HashSet<String> = problems.into_iter().collect();
        for p in now.difference(&self.noted) {
            tracing::error!("backends dir: {p}");
        }
        self.noted = now;

        let mut changes = Changes::default();
        let loaded = self.loaded.origins();
        let wanted: HashSet<&str> =
            sources.iter().filter(|s| self.loaded.enabled(&s.name)).map(|s| s.name.as_str()).collect();
        self.missing.retain(|name, _| !wanted.contains(name.as_str()) && loaded.contains_key(name));
        let now = Instant::now();
        for gone in loaded.keys().filter(|n| !wanted.contains(n.as_str())) {
            let since = *self.missing.entry(gone.clone()).or_insert_with(|| {
                tracing::info!(backend = %gone, grace_ms = REMOVAL_GRACE.as_millis() as u64, "backend's source went: it serves on, and is unloaded unless it comes back within the grace");
                now
            });
            if now.duration_since(since) < REMOVAL_GRACE {
                continue;
            }
            self.missing.remove(gone);
            changes.retired.extend(self.loaded.unload(gone));
            tracing::info!(backend = %gone, "backend removed from the directory: unloaded");
            self.refused.remove(gone);
        }
        for src in sources {
            if !self.loaded.enabled(&src.name) {
                continue;
            }
            let unchanged = loaded.get(&src.name).is_some_and(|(o, k)| *o == src.origin && *k == src.key);
            if unchanged || self.refused.get(&src.name) == Some(&src.key) {
                continue;
            }
            let had_one = loaded.contains_key(&src.name);
            self.swap(src, had_one, &mut changes).await;
        }
        changes
    }

    /// When a backend whose source went is due to be unloaded (the caller reconciles then).
    pub(crate) fn next_removal(&self) -> Option<tokio::time::Instant> {
        self.missing.values().min().map(|since| tokio::time::Instant::from_std(*since + REMOVAL_GRACE))
    }

    /// Swap one source in; on failure the old version (`had_one`) keeps serving.
    async fn swap(&mut self, src: BackendSource, had_one: bool, changes: &mut Changes) {
        let (name, origin, key) = (src.name.clone(), src.origin.clone(), src.key.clone());
        let r = self.loaded.clone();
        let t0 = Instant::now();
        match tokio::task::spawn_blocking(move || r.swap(src)).await {
            Ok(Ok(swapped)) => {
                self.metrics.swap(&name, true);
                self.refused.remove(&name);
                tracing::info!(backend = %name, file = %origin, took_ms = t0.elapsed().as_millis() as u64, "backend swapped: the new version serves");
                changes.ready.extend(swapped.ready);
                changes.retired.extend(swapped.retired);
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
