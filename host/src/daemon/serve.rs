//! Starting and stopping what kubelet sees: a backend's ready resource becomes what the kubelet
//! layer serves (its calls as kubelet's [`ResourceOps`], backend failures mapped to the status
//! classes kubelet tells apart, and a [`ResourceHandle`] carrying its Allocate delivery and the
//! process's metrics), with its CDI spec written first; a retired resource's endpoint and spec go.
//! The backends and kubelet layers know nothing of each other; this is where they meet.

use std::sync::Arc;

use super::Daemon;
use super::specs::delivery;
use crate::backends::{ReadyResource, ResourceCalls, Retired};
use crate::config::Api;
use crate::dra::error::DraError;
use crate::dra::served::{DeviceCalls, ServedResource};
use crate::kubelet::{Delivery, KubeletMetrics, OpError, ResourceHandle, ResourceOps};
use crate::model::ContainerEdits;
use crate::runtime::CallError;

impl Daemon {
    /// Start serving resources that have devices for the first time.
    pub(super) async fn serve(&self, ready: Vec<ReadyResource>) {
        for ready in ready {
            if self.cfg.api(&ready.name) == Api::Dra {
                self.serve_dra(ready).await;
                continue;
            }
            // The spec first, so kubelet never sees a device the CDI directory does not name yet
            // (a failure here is logged by the poll loop's sync); none for `write_cdi = false`.
            if let Some(specs) = &self.specs {
                let snapshot = ready.devices.borrow().clone();
                let _ = super::specs::write(specs, &self.cfg, &snapshot);
            }
            let delivery = delivery(&self.cfg, &ready.name, self.specs.as_ref());
            let backend = ready.backend.clone();
            let handle = handle(ready, delivery, self.metrics.clone());
            tracing::info!(resource = %handle.name, backend = %backend, devices = handle.devices.borrow().devices.len(), strategies = ?handle.delivery.strategies, "serving resource");
            self.endpoints.add(handle).await;
        }
    }

    /// Stop serving retired resources: their streams already sent an empty list.
    pub(super) async fn stop_serving(&self, retired: Vec<Retired>) {
        for r in retired {
            if self.cfg.api(&r.name) == Api::Dra {
                if let Some(dra) = &self.dra {
                    dra.remove(&r.name).await;
                }
                tracing::info!(resource = %r.name, "stopped serving through DRA");
                continue;
            }
            self.endpoints.remove(&r.name).await;
            if let Some(specs) = &self.specs {
                specs.remove(&r.name);
            }
            tracing::info!(resource = %r.name, "stopped serving: socket removed");
        }
    }
}

impl Daemon {
    /// Serve a resource configured `api = "dra"` through its backend's driver; never through
    /// the Device Plugin API as well, not even when DRA is unavailable (kubelet would count the
    /// devices twice once DRA came back).
    async fn serve_dra(&self, ready: ReadyResource) {
        let Some(dra) = &self.dra else {
            tracing::error!(resource = %ready.name, backend = %ready.backend, "not served: it is configured api = \"dra\" and DRA is unavailable (see the error at start)");
            return;
        };
        let driver = self.cfg.dra_driver(&ready.backend);
        let served = ServedResource {
            name: ready.name.clone(),
            backend: ready.backend.clone(),
            devices: ready.devices,
            owners: ready.owners,
            calls: Arc::new(DraCalls {
                calls: ready.calls,
                backend: ready.backend.clone(),
                resource: ready.name.clone(),
            }),
        };
        match dra.add(&driver, served).await {
            Ok(()) => {
                tracing::info!(resource = %ready.name, backend = %ready.backend, driver = %driver, node = %dra.node(), "serving resource through DRA")
            }
            Err(e) => tracing::error!(resource = %ready.name, "not served: {e:#}"),
        }
    }
}

/// A backend's calls as the DRA side asks them, its failures named by backend and resource.
struct DraCalls {
    calls: Arc<ResourceCalls>,
    backend: String,
    resource: String,
}

impl DraCalls {
    fn failed(&self, e: CallError) -> DraError {
        DraError::backend(&self.backend, Some(&self.resource), e.to_string())
    }
}

#[async_trait::async_trait]
impl DeviceCalls for DraCalls {
    async fn allocate(&self, ids: Vec<String>) -> Result<ContainerEdits, DraError> {
        self.calls.allocate(ids).await.map_err(|e| self.failed(e))
    }

    async fn prepare(
        &self,
        claim: String,
        devices: Vec<crate::model::dra::ClaimDevice>,
        config: Vec<String>,
    ) -> Result<Option<ContainerEdits>, DraError> {
        self.calls.prepare(claim, devices, config).await.map_err(|e| self.failed(e))
    }

    async fn unprepare(&self, claim: String) -> Result<(), DraError> {
        self.calls.unprepare(claim).await.map_err(|e| self.failed(e))
    }
}

/// The handle the kubelet layer serves `ready` through.
pub fn handle(ready: ReadyResource, delivery: Delivery, metrics: Arc<dyn KubeletMetrics>) -> ResourceHandle {
    ResourceHandle {
        name: ready.name,
        options: ready.options,
        devices: ready.devices,
        ops: Arc::new(KubeletOps(ready.calls)),
        delivery,
        owners: ready.owners,
        metrics: Some(metrics),
    }
}

struct KubeletOps(Arc<ResourceCalls>);

/// A backend's own error is `Internal` to kubelet (the pod fails with its message); a backend
/// that cannot answer (trap, timeout, breaker) is `Unavailable`, which kubelet retries.
fn op_error(e: CallError) -> OpError {
    match e {
        CallError::Guest(m) => OpError::Backend(m),
        e @ CallError::Refused(_) => OpError::Backend(e.to_string()),
        other => OpError::Unavailable(other.to_string()),
    }
}

#[async_trait::async_trait]
impl ResourceOps for KubeletOps {
    async fn allocate(&self, ids: Vec<String>) -> Result<ContainerEdits, OpError> {
        self.0.allocate(ids).await.map_err(op_error)
    }

    async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must: Vec<String>,
        size: u32,
    ) -> Result<Vec<String>, OpError> {
        self.0.preferred_allocation(available, must, size).await.map_err(op_error)
    }

    async fn pre_start(&self, ids: Vec<String>) -> Result<(), OpError> {
        self.0.pre_start(ids).await.map_err(op_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_answers_and_faults_reach_kubelet_as_different_classes() {
        assert!(matches!(op_error(CallError::Guest("no".into())), OpError::Backend(m) if m == "no"));
        assert!(matches!(op_error(CallError::Refused("node".into())), OpError::Backend(m) if m.contains("node")));
        assert!(matches!(op_error(CallError::Trap("x".into())), OpError::Unavailable(_)));
        assert!(matches!(op_error(CallError::BreakerOpen), OpError::Unavailable(_)));
    }
}
