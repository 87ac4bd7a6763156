//! Which pod holds which device: kubelet's pod resources API v1 (`List` on
//! `/var/lib/kubelet/pod-resources/kubelet.sock`), polled, for the `device_allocated` metric and
//! `devplug status`. Optional: without the socket devplug works and says once that attribution
//! is off (and once when it is back).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use super::uds;
use crate::proto::podresources as pb;

/// One device held by one container.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Assignment {
    pub resource: String,
    pub device: String,
    pub pod: String,
    pub namespace: String,
    pub container: String,
}

/// The latest assignments, for devplug's own resources.
#[derive(Default)]
pub struct PodAssignments {
    current: ArcSwap<Vec<Assignment>>,
}

impl PodAssignments {
    pub fn get(&self) -> Arc<Vec<Assignment>> {
        self.current.load_full()
    }
}

/// Poll `socket` every `every` until `stop`; `ours` says which resource names to keep.
pub fn spawn(
    socket: PathBuf,
    every: Duration,
    ours: impl Fn(&str) -> bool + Send + Sync + 'static,
    stop: CancellationToken,
) -> Arc<PodAssignments> {
    let out = Arc::new(PodAssignments::default());
    let shared = out.clone();
    tokio::spawn(async move {
        let mut working: Option<bool> = None;
        loop {
            match list(&socket).await {
                Ok(resp) => {
                    if working != Some(true) {
                        tracing::info!(socket = %socket.display(), "pod resources API answers: allocations carry pod, namespace and container");
                        working = Some(true);
                    }
                    shared.current.store(Arc::new(flatten(resp, &ours)));
                }
                Err(e) => {
                    if working != Some(false) {
                        tracing::warn!(socket = %socket.display(), "pod attribution is off: {e}; devplug works without it");
                        working = Some(false);
                    }
                    shared.current.store(Arc::default());
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    });
    out
}

async fn list(socket: &std::path::Path) -> anyhow::Result<pb::ListPodResourcesResponse> {
    let ch = uds::connect(socket, Duration::from_secs(2)).await.map_err(|e| anyhow::anyhow!("cannot connect: {e}"))?;
    let mut client = pb::pod_resources_lister_client::PodResourcesListerClient::new(ch);
    let resp = tokio::time::timeout(Duration::from_secs(5), client.list(pb::ListPodResourcesRequest {}))
        .await
        .map_err(|_| anyhow::anyhow!("List timed out"))??;
    Ok(resp.into_inner())
}

fn flatten(resp: pb::ListPodResourcesResponse, ours: &impl Fn(&str) -> bool) -> Vec<Assignment> {
    let mut out = Vec::new();
    for pod in resp.pod_resources {
        for c in &pod.containers {
            for d in c.devices.iter().filter(|d| ours(&d.resource_name)) {
                for id in &d.device_ids {
                    out.push(Assignment {
                        resource: d.resource_name.clone(),
                        device: id.clone(),
                        pod: pod.name.clone(),
                        namespace: pod.namespace.clone(),
                        container: c.name.clone(),
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.resource, &a.device).cmp(&(&b.resource, &b.device)));
    out
}
