//! The run loop's side of CDI: opening the spec directory, writing each resource's spec before
//! its device list is published, sweeping stale specs once, and each resource's Allocate
//! strategies.

use crate::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backends::Loaded;
use crate::cdi::{Kind, SpecDir};
use crate::config::Config;
use crate::kubelet::{CdiTarget, Delivery};
use crate::model::Resource;

/// The CDI directory, or `None` (logged) when specs are off or the directory is unusable.
pub(crate) fn open_cdi(cfg: &Config) -> Option<Arc<SpecDir>> {
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

/// The publish hook of the loaded backends: write a resource's spec from the list about to be published
/// (none for the resources the config says `write_cdi = false`). Errors are logged once per
/// resource and message (and said again once fixed).
pub fn writer(specs: Arc<SpecDir>, cfg: &Config) -> crate::backends::PublishHook {
    let errors: Mutex<HashMap<String, String>> = Mutex::default();
    let cfg = cfg.clone();
    Arc::new(move |r: &Resource| {
        let Some(outcome) = write(&specs, &cfg, r) else { return };
        let outcome = outcome.map_err(|e| e.to_string());
        let mut errors = errors.locked();
        match outcome {
            Ok(_) => {
                if errors.remove(&r.name).is_some() {
                    tracing::info!(resource = %r.name, dir = %specs.dir().display(), "CDI spec written again");
                }
            }
            Err(msg) => {
                if errors.get(&r.name) != Some(&msg) {
                    tracing::warn!(resource = %r.name, "CDI spec not written: {msg}");
                    errors.insert(r.name.clone(), msg);
                }
            }
        }
    })
}

/// Write `r`'s spec, unless the config says `write_cdi = false` for it (`None`): the one place
/// the run loop writes a resource's spec, so no path can skip the setting.
pub fn write(specs: &SpecDir, cfg: &Config, r: &Resource) -> Option<Result<bool, crate::cdi::CdiError>> {
    cfg.writes_cdi(&r.name).then(|| specs.sync(r))
}

/// After the first round of discovers: remove specs an earlier, killed devplug left for
/// resources that no longer exist (or that the config no longer writes).
pub(crate) fn sweep_once(specs: &SpecDir, loaded: &Loaded, cfg: &Config, first: &mut bool) {
    if !std::mem::take(first) {
        return;
    }
    let live: Vec<String> = loaded.snapshot().iter().map(|r| r.name.clone()).filter(|r| cfg.writes_cdi(r)).collect();
    for gone in specs.sweep(&live) {
        tracing::info!(file = %gone.display(), "removed a stale CDI spec");
    }
}

/// How `resource` answers Allocate, from the config.
pub fn delivery(cfg: &Config, resource: &str, specs: Option<&Arc<SpecDir>>) -> Delivery {
    let cdi = specs.filter(|_| cfg.writes_cdi(resource)).and_then(|s| match Kind::for_resource(resource) {
        Ok(kind) => Some(CdiTarget { kind, specs: s.clone() }),
        Err(e) => {
            tracing::warn!(resource, "no CDI spec for this resource: {e}");
            None
        }
    });
    Delivery::new(cfg.strategies(resource), cdi)
}
