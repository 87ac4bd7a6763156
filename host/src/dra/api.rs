//! devplug's side of the API server: connecting (a kubeconfig, or the pod's service account),
//! keeping one driver's pool of ResourceSlices equal to what its backends describe, and reading
//! the ResourceClaims kubelet asks a driver to prepare.
//!
//! A pool is replaced whole: every slice of the new generation is written before the slices it
//! no longer needs are deleted, so the scheduler (which ignores a pool whose slices disagree on
//! the generation) never sees a mix it would act on.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::Value;

/// The label every slice devplug publishes carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "devplug");

/// A client for the API server: from `kubeconfig`, else the in-cluster service account (or
/// `$KUBECONFIG`, as kubectl reads it).
pub async fn connect(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            anyhow::anyhow!("no API server: {e} (run in a pod with a service account, or pass --kubeconfig)")
        })?,
    };
    kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("API client: {e}"))
}

/// One driver's pool on one node, as the API server holds it.
pub struct PoolWriter {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    pub node: String,
    pub driver: String,
    owner: Option<OwnerReference>,
    /// The generation last written (the next write uses a higher one).
    generation: i64,
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
    pub fn new(client: kube::Client, node: &str, driver: &str) -> Self {
        PoolWriter {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            node: node.to_owned(),
            driver: driver.to_owned(),
            owner: None,
            generation: 0,
        }
    }

    fn selector(&self) -> ListParams {
        ListParams::default().fields(&format!("spec.nodeName={},spec.driver={}", self.node, self.driver))
    }

    /// The slices of this pool the server has now, by name.
    async fn current(&self) -> anyhow::Result<BTreeMap<String, ResourceSlice>> {
        let list =
            self.slices.list(&self.selector()).await.map_err(|e| anyhow::anyhow!("listing ResourceSlices: {e}"))?;
        Ok(list.items.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect())
    }

    /// Make the server's pool what `build(generation)` returns, unless it already is (then
    /// nothing is written). `build` is called with generation 0 to compare, and again with the
    /// generation to write.
    pub async fn sync<E: std::fmt::Display>(
        &mut self,
        build: impl Fn(i64) -> Result<Vec<Value>, E>,
    ) -> anyhow::Result<Written> {
        let current = self.current().await?;
        let wanted = typed(build(0).map_err(|e| anyhow::anyhow!("{e}"))?)?;
        if same_pool(&current, &wanted) {
            let generation = current.values().map(|s| s.spec.pool.generation).max().unwrap_or(0);
            self.generation = self.generation.max(generation);
            return Ok(Written { generation, ..Written::default() });
        }
        if self.owner.is_none() {
            self.owner = self.node_owner().await;
        }
        let newest = current.values().map(|s| s.spec.pool.generation).max().unwrap_or(0);
        let generation = self.generation.max(newest) + 1;
        let wanted = typed(build(generation).map_err(|e| anyhow::anyhow!("{e}"))?)?;
        let mut out = Written { generation, ..Written::default() };
        for (name, slice) in &wanted {
            let mut slice = slice.clone();
            slice.metadata.owner_references = self.owner.clone().map(|o| vec![o]);
            slice.metadata.labels = Some(BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())]));
            match current.get(name) {
                Some(old) => {
                    slice.metadata.resource_version = old.metadata.resource_version.clone();
                    self.slices
                        .replace(name, &PostParams::default(), &slice)
                        .await
                        .map_err(|e| anyhow::anyhow!("replacing ResourceSlice {name}: {e}"))?;
                    out.replaced += 1;
                }
                None => {
                    self.slices
                        .create(&PostParams::default(), &slice)
                        .await
                        .map_err(|e| anyhow::anyhow!("creating ResourceSlice {name}: {e}"))?;
                    out.created += 1;
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

    async fn delete(&self, name: &str) -> anyhow::Result<()> {
        match self.slices.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(anyhow::anyhow!("deleting ResourceSlice {name}: {e}")),
        }
    }

    /// Wake `wake` whenever the server's copy of this pool changes (a slice deleted or modified:
    /// kubelet deletes a node's slices when it starts, possibly after devplug registered again),
    /// so the pool is put back at once instead of at the next resync. The watch is opened again
    /// whenever it ends (servers close watches after a few minutes), backing off on errors.
    pub fn watch(
        &self,
        wake: std::sync::Arc<tokio::sync::Notify>,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        use futures::StreamExt;
        use kube::api::{WatchEvent, WatchParams};
        let api = self.slices.clone();
        let params = WatchParams::default().fields(&format!("spec.nodeName={},spec.driver={}", self.node, self.driver));
        let driver = self.driver.clone();
        tokio::spawn(async move {
            const FIRST: std::time::Duration = std::time::Duration::from_millis(500);
            let mut backoff = FIRST;
            loop {
                let watch = async {
                    let events = api.watch(&params, "0").await?;
                    let mut events = std::pin::pin!(events);
                    while let Some(ev) = events.next().await {
                        match ev? {
                            WatchEvent::Deleted(_) | WatchEvent::Modified(_) => wake.notify_one(),
                            // `410 Gone` and the like: watch again from now.
                            WatchEvent::Error(_) => break,
                            WatchEvent::Added(_) | WatchEvent::Bookmark(_) => {}
                        }
                    }
                    Ok::<(), kube::Error>(())
                };
                let ended = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = watch => r,
                };
                match ended {
                    Ok(()) => backoff = FIRST,
                    Err(e) => {
                        tracing::debug!(driver = %driver, "watching ResourceSlices: {e}; again in {backoff:?}");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
                    }
                }
            }
        })
    }

    /// Delete every slice of this pool (devplug stops serving the driver).
    pub async fn remove_all(&self) -> anyhow::Result<usize> {
        let current = self.current().await?;
        for name in current.keys() {
            self.delete(name).await?;
        }
        Ok(current.len())
    }

    /// The Node as the slices' owner, so they go with it; `None` (logged) when it cannot be
    /// read: slices are published all the same, and kubelet deletes them when the node goes.
    async fn node_owner(&self) -> Option<OwnerReference> {
        match self.nodes.get(&self.node).await {
            Ok(n) => Some(OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node.clone(),
                uid: n.metadata.uid?,
                controller: Some(true),
                ..OwnerReference::default()
            }),
            Err(e) => {
                tracing::warn!(node = %self.node, driver = %self.driver, "cannot read the Node for the slices' owner: {e}");
                None
            }
        }
    }
}

/// Slices as the typed objects the server speaks, by name.
fn typed(slices: Vec<Value>) -> anyhow::Result<BTreeMap<String, ResourceSlice>> {
    slices
        .into_iter()
        .map(|v| {
            let s: ResourceSlice = serde_json::from_value(v).map_err(|e| anyhow::anyhow!("a built slice: {e}"))?;
            Ok((s.metadata.name.clone().unwrap_or_default(), s))
        })
        .collect()
}

/// Whether the server's pool holds exactly the wanted slices (names, devices, counter sets, slice
/// count), each at one generation: then nothing needs writing.
fn same_pool(current: &BTreeMap<String, ResourceSlice>, wanted: &BTreeMap<String, ResourceSlice>) -> bool {
    let generations: std::collections::BTreeSet<i64> = current.values().map(|s| s.spec.pool.generation).collect();
    current.len() == wanted.len()
        && generations.len() <= 1
        && wanted.iter().all(|(name, w)| {
            current.get(name).is_some_and(|c| {
                c.spec.devices == w.spec.devices
                    && c.spec.shared_counters == w.spec.shared_counters
                    && c.spec.pool.name == w.spec.pool.name
                    && c.spec.pool.resource_slice_count == w.spec.pool.resource_slice_count
            })
        })
}

/// The claim `namespace/name` as the API server has it.
pub async fn claim(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<ResourceClaim> {
    Api::<ResourceClaim>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("reading ResourceClaim {namespace}/{name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(counters: &str) -> BTreeMap<String, ResourceSlice> {
        let slice = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": { "name": "s-0" },
            "spec": { "driver": "d.io", "nodeName": "n", "pool": { "name": "n", "generation": 1, "resourceSliceCount": 1 },
                      "sharedCounters": [{ "name": "gpu-0", "counters": { "memory": { "value": counters } } }] },
        });
        typed(vec![slice]).unwrap()
    }

    #[test]
    fn a_pool_differs_when_only_its_counter_sets_do() {
        assert!(same_pool(&pool("8"), &pool("8")));
        assert!(!same_pool(&pool("8"), &pool("7")), "a changed counter set is written");
        assert!(!same_pool(&BTreeMap::new(), &pool("8")), "a missing slice is written");
    }
}
