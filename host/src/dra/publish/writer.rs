//! Keeping one driver's pool of ResourceSlices on the API server equal to the pool devplug
//! built (upstream's `resourceslice` controller, for one node-local pool).
//!
//! A pool is replaced whole: every slice of the new generation is written before the slices it
//! no longer needs are deleted, so the scheduler (which ignores a pool whose slices disagree on
//! the generation) never sees a mix it would act on.
//!
//! Whether the server's pool is already what devplug wants is decided by what devplug owns, not
//! by comparing the stored objects field by field: the server adds to what it stores (a taint's
//! `timeAdded`), drops what is empty (`"devices": []`) and canonicalises quantities, so a field
//! by field comparison never finds them equal and every sync would write again (and wake its own
//! watch, and write again). Each slice carries the SHA-256 of the spec devplug built
//! ([`SPEC_HASH`]); equal hashes, names and one generation mean nothing to write.
//!
//! What the server holds is known from a watch ([`PoolView`]): a sync compares against that
//! view, so a resync or a device change costs no request unless something must be written.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use super::pool::{Pool, SPEC_HASH};
use super::view::PoolView;
use crate::dra::pool_id::PoolId;

/// The label every slice devplug publishes carries.
pub(crate) const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "devplug");
/// One driver's pool on one node, as the API server holds it.
pub struct PoolWriter {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    pub id: PoolId,
    owner: Option<OwnerReference>,
    /// The generation last written (the next write uses a higher one).
    generation: i64,
    /// The server's pool as the watch keeps it.
    view: std::sync::Arc<PoolView>,
}

/// What a pool write did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub generation: i64,
    pub created: usize,
    pub replaced: usize,
    pub deleted: usize,
}

impl Written {
    pub fn changed(&self) -> bool {
        self.created + self.replaced + self.deleted > 0
    }
}

impl PoolWriter {
    pub fn new(client: kube::Client, id: PoolId) -> Self {
        PoolWriter {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            id,
            owner: None,
            generation: 0,
            view: Default::default(),
        }
    }

    fn selector(&self) -> ListParams {
        ListParams::default().fields(&format!("spec.nodeName={},spec.driver={}", self.id.node, self.id.driver))
    }

    /// The slices of this pool the server has now, by name.
    async fn current(&self) -> anyhow::Result<BTreeMap<String, ResourceSlice>> {
        let list =
            self.slices.list(&self.selector()).await.map_err(|e| anyhow::anyhow!("listing ResourceSlices: {e}"))?;
        Ok(list.items.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect())
    }

    /// Make the server's pool `pool`, unless it already is (then nothing is written).
    pub async fn sync(&mut self, pool: &Pool) -> anyhow::Result<Written> {
        // The watch's view when it is in step; a LIST only before the watch has one.
        let current = match self.view.snapshot() {
            Some(view) => view,
            None => match self.view.first_list(super::view::FIRST_LIST_PATIENCE).await {
                Some(view) => view,
                None => self.current().await?,
            },
        };
        if same_pool(&current, pool) {
            let generation = current.values().map(|s| s.spec.pool.generation).max().unwrap_or(0);
            self.generation = self.generation.max(generation);
            return Ok(Written { generation, ..Written::default() });
        }
        if self.owner.is_none() {
            self.owner = self.node_owner().await;
        }
        let newest = current.values().map(|s| s.spec.pool.generation).max().unwrap_or(0);
        let generation = self.generation.max(newest) + 1;
        let wanted = &pool.slices;
        let mut out = Written { generation, ..Written::default() };
        // What this sync changed, to undo if a later slice of the generation is refused: the
        // name, the slice it replaced (none: created) and the resource version written.
        let mut done: Vec<(String, Option<ResourceSlice>, Option<String>)> = Vec::new();
        for (name, (slice, hash)) in wanted {
            let mut slice = slice.clone();
            slice.spec.pool.generation = generation;
            slice.metadata.owner_references = self.owner.clone().map(|o| vec![o]);
            slice.metadata.labels = Some(BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())]));
            slice.metadata.annotations = Some(BTreeMap::from([(SPEC_HASH.to_owned(), hash.clone())]));
            let old = current.get(name);
            let verb = if old.is_some() { "update" } else { "create" };
            let written = match old {
                Some(old) => {
                    slice.metadata.resource_version = old.metadata.resource_version.clone();
                    self.slices.replace(name, &PostParams::default(), &slice).await
                }
                None => self.slices.create(&PostParams::default(), &slice).await,
            };
            match written {
                Ok(stored) => {
                    done.push((name.clone(), old.cloned(), stored.metadata.resource_version.clone()));
                    self.view.wrote(stored);
                    if old.is_some() { out.replaced += 1 } else { out.created += 1 }
                }
                Err(e) => {
                    // A conflict means the view was behind the server: the next sync LISTs.
                    self.view.invalidate();
                    let after = self.roll_back(done, newest).await;
                    let refused = self.refused(verb, name, &e);
                    return Err(anyhow::anyhow!("{refused} (generation {generation}); {after}"));
                }
            }
        }
        self.generation = generation;
        for name in current.keys().filter(|n| !wanted.contains_key(*n)) {
            self.delete(name).await?;
            out.deleted += 1;
        }
        Ok(out)
    }

    /// Undo a generation's partial write so the previous generation is whole again (upstream's
    /// allocator ignores a pool whose newest generation lacks slices, so a half-written pool
    /// hides every device); says which state the pool is left in.
    async fn roll_back(&self, done: Vec<(String, Option<ResourceSlice>, Option<String>)>, previous: i64) -> String {
        if done.is_empty() {
            return format!("nothing was written: the pool of generation {previous} stays whole");
        }
        let mut failed = Vec::new();
        for (name, old, version) in done.into_iter().rev() {
            let undone = match old {
                None => self.delete(&name).await,
                Some(mut old) => {
                    old.metadata.resource_version = version;
                    match self.slices.replace(&name, &PostParams::default(), &old).await {
                        Ok(stored) => {
                            self.view.wrote(stored);
                            Ok(())
                        }
                        Err(e) => Err(anyhow::anyhow!("{}", self.refused("update", &name, &e))),
                    }
                }
            };
            if let Err(e) = undone {
                failed.push(format!("{name}: {e:#}"));
            }
        }
        if failed.is_empty() {
            format!("the slices already written were put back: the pool of generation {previous} is whole again")
        } else {
            self.view.invalidate();
            format!(
                "the pool is incomplete until the next sync ({} slice(s) could not be put back: {})",
                failed.len(),
                crate::gate::clip(&failed.join("; "))
            )
        }
    }

    async fn delete(&self, name: &str) -> anyhow::Result<()> {
        match self.slices.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                self.view.removed(name);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.view.removed(name);
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("{}", self.refused("delete", name, &e))),
        }
    }

    /// What the server's refusal of `verb` on slice `name` means, once, with what to do.
    fn refused(&self, verb: &str, name: &str, e: &kube::Error) -> String {
        let write = crate::dra::refusal::Write::Slice { verb, name, driver: &self.id.driver, node: &self.id.node };
        crate::dra::refusal::explain(write, e)
    }

    /// Keep this pool's [`PoolView`] by a watch, and wake `wake` whenever the server's copy
    /// changes by someone else's hand (a slice deleted or modified: kubelet deletes a node's
    /// slices when it starts, possibly after devplug registered again), so the pool is put back
    /// at once instead of at the next resync. One LIST starts the view; the watch then resumes
    /// from the last resource version it saw (servers close watches every few minutes), and
    /// LISTs again only when the server says that version is gone (`410`). Errors back off.
    pub fn watch(
        &self,
        wake: std::sync::Arc<tokio::sync::Notify>,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        use futures::StreamExt;
        use kube::api::{WatchEvent, WatchParams};
        let api = self.slices.clone();
        let list = self.selector();
        // Bookmarks are on by default: the version to resume from stays fresh on a quiet pool.
        let params =
            WatchParams::default().fields(&format!("spec.nodeName={},spec.driver={}", self.id.node, self.id.driver));
        let (driver, view) = (self.id.driver.clone(), self.view.clone());
        view.watched();
        tokio::spawn(async move {
            const FIRST: std::time::Duration = std::time::Duration::from_millis(500);
            const LONG_WATCH: std::time::Duration = std::time::Duration::from_secs(10);
            let mut backoff = FIRST;
            let mut version: Option<String> = None;
            loop {
                let round = async {
                    let from = match &version {
                        Some(v) => v.clone(),
                        None => {
                            let mark = view.mark();
                            let items = api.list(&list).await.map_err(|e| {
                                view.list_failed();
                                format!("listing: {e}")
                            })?;
                            let v = items.metadata.resource_version.clone().unwrap_or_default();
                            view.reset(items.items, mark);
                            // The pool may differ from what devplug wants (it may be gone).
                            wake.notify_one();
                            version = Some(v.clone());
                            v
                        }
                    };
                    let events = api.watch(&params, &from).await.map_err(|e| e.to_string())?;
                    let mut events = std::pin::pin!(events);
                    while let Some(ev) = events.next().await {
                        match ev.map_err(|e| e.to_string())? {
                            WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                                version = s.metadata.resource_version.clone().or(version.take());
                                if view.seen(s) {
                                    wake.notify_one();
                                }
                            }
                            WatchEvent::Deleted(s) => {
                                version = s.metadata.resource_version.clone().or(version.take());
                                if let Some(name) = &s.metadata.name {
                                    view.deleted(name);
                                }
                                wake.notify_one();
                            }
                            WatchEvent::Bookmark(b) => version = Some(b.metadata.resource_version),
                            // `410 Gone`: the version is too old to resume from; LIST again.
                            WatchEvent::Error(e) if e.code == 410 => {
                                version = None;
                                return Err(format!("the server ended the watch: {} ({})", e.message, e.code));
                            }
                            // Throttling, an error of the server's own: watch again, but after
                            // the backoff, so a server that ends every watch at once is not
                            // asked again at once.
                            WatchEvent::Error(e) => {
                                return Err(format!("the server ended the watch: {} ({})", e.message, e.code));
                            }
                        }
                    }
                    Ok::<(), String>(())
                };
                let began = tokio::time::Instant::now();
                let ended = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = round => r,
                };
                // A watch the server closed cleanly after a while (they do, every few minutes)
                // is opened again at once; one that failed, or ended at once, after the backoff.
                let why = match ended {
                    Ok(()) if began.elapsed() >= LONG_WATCH => {
                        backoff = FIRST;
                        continue;
                    }
                    Ok(()) => "the server ended the watch at once".to_owned(),
                    Err(e) => e,
                };
                tracing::debug!(driver = %driver, "watching ResourceSlices: {why}; again in {backoff:?}");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
            }
        })
    }

    /// Delete every slice of this pool (devplug stops serving the driver).
    pub(crate) async fn remove_all(&self) -> anyhow::Result<usize> {
        let current = self.current().await?;
        for name in current.keys() {
            self.delete(name).await?;
        }
        Ok(current.len())
    }

    /// The Node as the slices' owner, so they go with it; `None` (logged) when it cannot be
    /// read: slices are published all the same, and kubelet deletes them when the node goes.
    async fn node_owner(&self) -> Option<OwnerReference> {
        match self.nodes.get(&self.id.node).await {
            Ok(n) => Some(OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.id.node.clone(),
                uid: n.metadata.uid?,
                controller: Some(true),
                ..OwnerReference::default()
            }),
            Err(e) => {
                tracing::warn!(node = %self.id.node, driver = %self.id.driver, "cannot read the Node for the slices' owner: {e}");
                None
            }
        }
    }
}

/// Whether the server's pool holds exactly the wanted slices (the same names, each stored from
/// the spec devplug wants now, by [`SPEC_HASH`]), all at one generation: then nothing needs
/// writing. What the server added or dropped when it stored them does not count.
fn same_pool(current: &BTreeMap<String, ResourceSlice>, wanted: &Pool) -> bool {
    let generations: std::collections::BTreeSet<i64> = current.values().map(|s| s.spec.pool.generation).collect();
    current.len() == wanted.slices.len()
        && generations.len() <= 1
        && wanted.slices.iter().all(|(name, (_, hash))| {
            current
                .get(name)
                .is_some_and(|c| c.metadata.annotations.as_ref().and_then(|a| a.get(SPEC_HASH)) == Some(hash))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::publish::pool::spec_hash;

    /// A built pool of the one slice `v` (what `pool::pool_on` hands the writer).
    fn built(v: serde_json::Value) -> Pool {
        let s: ResourceSlice = serde_json::from_value(v.clone()).unwrap();
        let hash = spec_hash(&s);
        Pool { slices: BTreeMap::from([(s.metadata.name.clone().unwrap(), (s, hash))]), ids: BTreeMap::new() }
    }

    fn pool(counters: &str) -> Pool {
        built(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": { "name": "s-0" },
            "spec": { "driver": "d.io", "nodeName": "n", "pool": { "name": "n", "generation": 0, "resourceSliceCount": 1 },
                      "sharedCounters": [{ "name": "gpu-0", "counters": { "memory": { "value": counters } } }] },
        }))
    }

    /// `wanted` as the server stores it: annotated by devplug, then changed by the server.
    fn stored(wanted: &Pool, server: impl Fn(&mut ResourceSlice)) -> BTreeMap<String, ResourceSlice> {
        wanted
            .slices
            .iter()
            .map(|(n, (s, hash))| {
                let mut s = s.clone();
                s.metadata.annotations = Some(BTreeMap::from([(SPEC_HASH.to_owned(), hash.clone())]));
                s.spec.pool.generation = 7;
                server(&mut s);
                (n.clone(), s)
            })
            .collect()
    }

    #[test]
    fn a_pool_differs_when_only_its_counter_sets_do() {
        assert!(same_pool(&stored(&pool("8"), |_| {}), &pool("8")));
        assert!(!same_pool(&stored(&pool("8"), |_| {}), &pool("7")), "a changed counter set is written");
        assert!(!same_pool(&BTreeMap::new(), &pool("8")), "a missing slice is written");
        let unannotated: BTreeMap<String, ResourceSlice> =
            pool("8").slices.into_iter().map(|(n, (s, _))| (n, s)).collect();
        assert!(!same_pool(&unannotated, &pool("8")), "a slice devplug did not annotate is written once");
    }

    #[test]
    fn what_the_server_adds_or_drops_is_not_a_difference() {
        let wanted = built(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": { "name": "s-0" },
            "spec": { "driver": "d.io", "nodeName": "n", "pool": { "name": "n", "generation": 0, "resourceSliceCount": 1 },
                      "devices": [{ "name": "d0", "taints": [{ "key": "devplug.io/unhealthy", "effect": "NoSchedule" }] }] },
        }));
        let server = |s: &mut ResourceSlice| {
            for d in s.spec.devices.iter_mut().flatten() {
                for t in d.taints.iter_mut().flatten() {
                    t.time_added = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
                }
            }
        };
        assert!(same_pool(&stored(&wanted, server), &wanted), "a taint's timeAdded is the server's");
        let empty = built(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": { "name": "s-0" },
            "spec": { "driver": "d.io", "nodeName": "n", "pool": { "name": "n", "generation": 0, "resourceSliceCount": 1 }, "devices": [] },
        }));
        assert!(same_pool(&stored(&empty, |s| s.spec.devices = None), &empty), "an empty list the server dropped");
    }
}
