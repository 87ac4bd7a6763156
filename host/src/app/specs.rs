//! The run loop's side of CDI: opening the spec directory, keeping every resource's spec in
//! step with its device list, and each resource's Allocate strategies.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backends::Registry;
use crate::cdi::{Kind, SpecDir};
use crate::config::Config;
use crate::kubelet::{CdiTarget, Delivery};

/// The CDI directory, or `None` (logged) when specs are off or the directory is unusable.
pub fn open_cdi(cfg: &Config) -> Option<Arc<SpecDir>> {
    if !cfg.write_cdi {
        return None;
    }
    match SpecDir::open(&cfg.cdi_dir) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            tracing::warn!(
                "CDI specs are off: {e}. Allocate answers use device specs; give devplug a writable --cdi-dir to use CDI"
            );
            None
        }
    }
}

/// Rewrite the specs whose devices changed; on the first round, also remove specs an earlier,
/// killed devplug left for resources that no longer exist. Errors are logged once per change.
pub fn sync_cdi(specs: &SpecDir, registry: &Registry, errors: &mut HashMap<String, String>, first: bool) {
    let resources = registry.snapshot();
    if first {
        let live: Vec<String> = resources.iter().map(|r| r.name.clone()).collect();
        for gone in specs.sweep(&live) {
            tracing::info!(file = %gone.display(), "removed a stale CDI spec");
        }
    }
    for r in resources {
        match specs.sync(&r) {
            Ok(changed) => {
                if errors.remove(&r.name).is_some() || changed {
                    tracing::debug!(resource = %r.name, dir = %specs.dir().display(), "CDI spec written");
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if errors.get(&r.name) != Some(&msg) {
                    tracing::warn!(resource = %r.name, "CDI spec not written: {msg}");
                    errors.insert(r.name.clone(), msg);
                }
            }
        }
    }
}

/// How `resource` answers Allocate, from the config.
pub fn delivery(cfg: &Config, resource: &str, specs: Option<&Arc<SpecDir>>) -> Delivery {
    let cdi = specs.and_then(|s| match Kind::for_resource(resource) {
        Ok(kind) => Some(CdiTarget { kind, specs: s.clone() }),
        Err(e) => {
            tracing::warn!(resource, "no CDI spec for this resource: {e}");
            None
        }
    });
    Delivery::new(cfg.strategies(resource), cdi)
}
