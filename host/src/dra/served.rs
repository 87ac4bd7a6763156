//! What one DRA driver serves right now: each of its resources' device list and calls, handed
//! over by the daemon as resources come and go, and read by the slice publisher and the
//! preparer alike.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::model::{ContainerEdits, Resource};
use crate::sync::Locked;

/// A resource's backend calls as DRA needs them (the daemon adapts the backends' own).
#[async_trait::async_trait]
pub trait DeviceCalls: Send + Sync + 'static {
    /// The backend's edits for handing devices `ids` to one container, checked against its grants.
    async fn allocate(&self, ids: Vec<String>) -> Result<ContainerEdits, String>;

    /// The backend's edits for a claim's devices (WIT 0.3.0 `prepare`), checked against its
    /// grants; `Ok(None)` when it leaves that to `allocate`.
    async fn prepare(
        &self,
        claim: String,
        devices: Vec<crate::model::dra::ClaimDevice>,
        config: Vec<String>,
    ) -> Result<Option<ContainerEdits>, String>;

    /// Undo the backend's `prepare` of a claim.
    async fn unprepare(&self, claim: String) -> Result<(), String>;
}

/// One resource served through DRA.
#[derive(Clone)]
pub struct ServedResource {
    pub name: String,
    pub backend: String,
    pub devices: watch::Receiver<Arc<Resource>>,
    pub calls: Arc<dyn DeviceCalls>,
}

/// A driver's resources, by name.
#[derive(Default)]
pub struct Served {
    resources: Mutex<BTreeMap<String, ServedResource>>,
}

impl Served {
    pub fn add(&self, r: ServedResource) {
        self.resources.locked().insert(r.name.clone(), r);
    }

    /// Drop a resource; whether the driver serves nothing now.
    pub fn remove(&self, name: &str) -> bool {
        let mut all = self.resources.locked();
        all.remove(name);
        all.is_empty()
    }

    pub fn resources(&self) -> Vec<ServedResource> {
        self.resources.locked().values().cloned().collect()
    }

    pub fn resource(&self, name: &str) -> Option<ServedResource> {
        self.resources.locked().get(name).cloned()
    }

    /// The current device lists, in name order (what the pool is built from).
    pub fn snapshot(&self) -> Vec<Arc<Resource>> {
        self.resources.locked().values().map(|r| r.devices.borrow().clone()).collect()
    }

    /// The resource and device a pool device name stands for now: the way back from what the
    /// scheduler allocated to what the backend knows (computed from the current lists, so it
    /// also holds before the first pool of a restarted devplug is written).
    pub fn lookup(&self, device_name: &str) -> Option<(ServedResource, String)> {
        let all = self.resources.locked();
        all.values().find_map(|r| {
            let list = r.devices.borrow();
            // A shared device's replicas all stand for it: the first answers for them.
            let id = list.devices.iter().find(|d| super::slices::pool_device_name(d) == device_name)?.id.clone();
            Some((r.clone(), id))
        })
    }
}
