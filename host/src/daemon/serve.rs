//! Starting and stopping what kubelet sees: a backend's ready resource becomes what the kubelet
//! layer serves (a [`ResourceHandle`] carrying its calls, the one [`Port`] both APIs use, its
//! Allocate delivery and the process's metrics) or what a DRA driver serves, with its CDI spec
//! written first; a retired resource's endpoint and spec go. The backends and kubelet layers
//! know nothing of each other; this is where they meet.
//!
//! [`Port`]: crate::model::port::Port

use std::sync::Arc;

use super::Daemon;
use super::specs::delivery;
use crate::backends::{ReadyResource, Retired};
use crate::config::Api;
use crate::dra::served::ServedResource;
use crate::kubelet::{Delivery, KubeletMetrics, ResourceHandle};

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
            port: ready.port,
        };
        match dra.add(&driver, served).await {
            Ok(()) => {
                tracing::info!(resource = %ready.name, backend = %ready.backend, driver = %driver, node = %dra.node(), "serving resource through DRA")
            }
            Err(e) => tracing::error!(resource = %ready.name, "not served: {e:#}"),
        }
    }
}

/// The handle the kubelet layer serves `ready` through.
pub fn handle(ready: ReadyResource, delivery: Delivery, metrics: Arc<dyn KubeletMetrics>) -> ResourceHandle {
    ResourceHandle {
        name: ready.name,
        options: ready.options,
        devices: ready.devices,
        port: ready.port,
        delivery,
        metrics: Some(metrics),
    }
}
