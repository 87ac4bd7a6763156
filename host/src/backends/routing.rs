//! Per-resource call routing: a resource that has devices is handed up as a [`ReadyResource`],
//! and its [`ResourceCalls`] (Allocate and friends, behind the node gate of its [`Port`]) always
//! reach the backend's current instance, so a hot swap changes where they go without kubelet
//! noticing.

use std::sync::Arc;

use tokio::sync::watch;

use super::slot::{BackendMetrics, Slot};
use crate::model::calls::BackendCalls;
use crate::model::port::Port;
use crate::model::{ContainerEdits, Resource, ResourceOptions};
use crate::runtime::{BackendInstance, CallError};

/// A resource whose device list is not empty for the first time: what serving it needs. Its
/// `devices` carry every later list; `calls` reach whichever instance is current.
pub struct ReadyResource {
    pub name: String,
    pub backend: String,
    pub options: ResourceOptions,
    pub devices: watch::Receiver<Arc<Resource>>,
    /// Its calls, routed to whichever instance is current, with the node gate inside.
    pub port: Port,
}

/// One resource's calls (Allocate and friends; the [`BackendCalls`] port both APIs use), routed
/// to its backend's current instance: a swap changes where they go without the caller noticing.
pub struct ResourceCalls {
    pub(super) slot: Arc<Slot>,
    pub(super) resource: String,
    pub(super) backend: String,
    pub(super) metrics: Arc<dyn BackendMetrics>,
}

#[async_trait::async_trait]
impl BackendCalls for ResourceCalls {
    async fn allocate(&self, ids: Vec<String>) -> Result<ContainerEdits, CallError> {
        self.run("allocate", move |b, r| b.allocate(r, &ids)).await
    }

    async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must: Vec<String>,
        size: u32,
    ) -> Result<Vec<String>, CallError> {
        self.run("preferred_allocation", move |b, r| b.preferred_allocation(r, &available, &must, size)).await
    }

    async fn pre_start(&self, ids: Vec<String>) -> Result<(), CallError> {
        self.run("pre_start", move |b, r| b.pre_start(r, &ids)).await
    }

    async fn prepare(
        &self,
        claim: String,
        devices: Vec<crate::model::dra::ClaimDevice>,
        config: Vec<String>,
    ) -> Result<Option<ContainerEdits>, CallError> {
        self.run("prepare", move |b, _| b.prepare(&claim, &devices, &config)).await
    }

    async fn unprepare(&self, claim: String) -> Result<(), CallError> {
        self.run("unprepare", move |b, _| b.unprepare(&claim)).await
    }
}

impl ResourceCalls {
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
        // this worker, not with a hop to the blocking pool on every Allocate. The guest call
        // holds the worker for one epoch tick at most and then goes on in `block_in_place`
        // (`Runtime::run_until`). A current-thread runtime cannot do that: hop there.
        if tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            return f(&inst, &self.resource);
        }
        let resource = self.resource.clone();
        tokio::task::spawn_blocking(move || f(&inst, &resource))
            .await
            .map_err(|e| CallError::Trap(format!("the call panicked in the host: {e}")))?
    }
}
