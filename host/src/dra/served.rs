//! What one DRA driver serves right now: each of its resources' device list and calls, handed
//! over by the daemon as resources come and go, and the pool built from them, once per change
//! of the lists, for the slice writer, the preparer and the health stream alike.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::pool_id::PoolId;
use super::publish::{Pool, PoolError};
use crate::model::Resource;
use crate::sync::Locked;

/// One resource served through DRA.
#[derive(Clone)]
pub struct ServedResource {
    pub name: String,
    pub backend: String,
    pub devices: watch::Receiver<Arc<Resource>>,
    /// Its backend's calls (the one port both APIs use; a claim's edits pass the node gate
    /// there).
    pub port: crate::model::port::Port,
}

/// A driver's resources, by name, and the pool built from their lists.
pub struct Served {
    pub id: PoolId,
    /// This machine's sysfs, where the standard attributes are read.
    sysfs: Option<std::path::PathBuf>,
    resources: Mutex<BTreeMap<String, ServedResource>>,
    /// The pool and the lists it was built from: built again only when one of them is no
    /// longer the list a resource holds (a new `Arc`), or a resource came or went.
    built: Mutex<Option<(Vec<Arc<Resource>>, Built)>>,
}

/// A pool built from the lists of the moment, or why none could be.
pub type Built = Arc<Result<Pool, PoolError>>;

impl Served {
    pub fn new(id: PoolId, sysfs: Option<std::path::PathBuf>) -> Self {
        Served { id, sysfs, resources: Mutex::default(), built: Mutex::default() }
    }

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

    /// The backend whose resources these are (none yet: any).
    pub fn backend(&self) -> Option<String> {
        self.resources.locked().values().next().map(|r| r.backend.clone())
    }

    /// The current device lists, in name order (what the pool is built from).
    pub fn snapshot(&self) -> Vec<Arc<Resource>> {
        self.resources.locked().values().map(|r| r.devices.borrow().clone()).collect()
    }

    /// The pool of the current lists: the one built before when they have not changed since.
    pub fn pool(&self) -> Built {
        let lists = self.snapshot();
        let mut built = self.built.locked();
        if let Some((from, pool)) = &*built
            && from.len() == lists.len()
            && from.iter().zip(&lists).all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return pool.clone();
        }
        let backend = self.backend().unwrap_or_default();
        let resources: Vec<Resource> = lists.iter().map(|r| (**r).clone()).collect();
        let pool = Arc::new(super::publish::pool_on(self.sysfs.as_deref(), &backend, &self.id, &resources));
        *built = Some((lists, pool.clone()));
        pool
    }

    /// The resource and device a pool device name stands for in the current pool: the way back
    /// from what the scheduler allocated to what the backend knows.
    pub fn lookup(&self, device_name: &str) -> Option<(ServedResource, String)> {
        let pool = self.pool();
        let (id, resource) = pool.as_ref().as_ref().ok()?.ids.get(device_name)?;
        Some((self.resource(resource)?, id.clone()))
    }
}
