//! `devplug run`: load the backends, poll them, serve each resource to kubelet, keep its CDI
//! spec current, stop cleanly.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::backends::{BackendSource, Registry, load_dir};
use crate::cdi::{self, Kind, SpecDir};
use crate::config::Config;
use crate::kubelet::{CdiTarget, Delivery, Endpoints, KubeletPaths};
use crate::observe;
use crate::runtime::Runtime;

/// The backends to load: the embedded set, then the directory's (which replace embedded ones of
/// the same name, so a vendor can ship a newer first-party backend without a new host).
pub fn sources(cfg: &Config) -> Vec<BackendSource> {
    let mut out: Vec<BackendSource> = if cfg.embedded { BackendSource::embedded() } else { Vec::new() };
    if let Some(dir) = &cfg.backends_dir {
        let (found, errors) = load_dir(dir);
        for e in errors {
            tracing::error!("backend not loaded: {e:#}");
        }
        for src in found {
            if let Some(i) = out.iter().position(|s| s.name == src.name) {
                tracing::info!(backend = %src.name, origin = %src.origin, "directory backend replaces the embedded one");
                out.remove(i);
            }
            out.push(src);
        }
    }
    out
}

/// Load every enabled source into `registry`; failures are logged with file and reason.
pub async fn load_all(registry: &Arc<Registry>, sources: Vec<BackendSource>) -> usize {
    let mut loaded = 0;
    for src in sources {
        if !registry.enabled(&src.name) {
            tracing::info!(backend = %src.name, "disabled in the config");
            continue;
        }
        let (name, origin) = (src.name.clone(), src.origin.clone());
        let r = registry.clone();
        match tokio::task::spawn_blocking(move || r.load(src)).await {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(e)) => tracing::error!(backend = %name, origin = %origin, "backend not loaded: {e}"),
            Err(e) => tracing::error!(backend = %name, origin = %origin, "backend load panicked: {e}"),
        }
    }
    loaded
}

/// Run until `shutdown` resolves; then stop serving and remove every socket.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let runtime = Runtime::new(cfg.runtime_config())?;
    let registry = Arc::new(Registry::new(
        runtime,
        cfg.sysfs_root.clone(),
        cfg.dev_root.clone(),
        cfg.backends.clone(),
        cfg.default_grant,
    ));
    let loaded = load_all(&registry, sources(&cfg)).await;
    tracing::info!(loaded, "backends loaded");

    let paths =
        KubeletPaths { device_plugin_dir: cfg.kubelet_dir.clone(), plugins_registry_dir: cfg.plugins_registry_dir() };
    let endpoints = Arc::new(Endpoints::new(paths, cfg.registration)?);
    let stop = CancellationToken::new();
    observe::serve(cfg.metrics_addr, observe::Health { endpoints: endpoints.clone() }, stop.clone()).await?;

    let specs = open_cdi(&cfg);
    let mut cdi_errors = HashMap::new();
    let mut first = true;

    tokio::pin!(shutdown);
    loop {
        let report = registry.poll_once().await;
        if let Some(specs) = &specs {
            sync_cdi(specs, &registry, &mut cdi_errors, std::mem::take(&mut first));
        }
        for mut handle in report.ready {
            handle.delivery = delivery(&cfg, &handle.name, specs.as_ref());
            tracing::info!(resource = %handle.name, devices = handle.devices.borrow().devices.len(), strategies = ?handle.delivery.strategies, "serving resource");
            endpoints.add(handle).await;
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(cfg.poll_interval) => {}
        }
    }
    tracing::info!("shutting down: closing sockets");
    stop.cancel();
    endpoints.shutdown().await;
    if let Some(specs) = &specs {
        specs.remove_all();
    }
    Ok(())
}

/// The CDI directory, or `None` (logged) when specs are off or the directory is unusable.
fn open_cdi(cfg: &Config) -> Option<Arc<SpecDir>> {
    if !cfg.write_cdi {
        return None;
    }
    match SpecDir::open(&cfg.cdi_dir, cdi::dev_view(&cfg.dev_root)) {
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
fn sync_cdi(specs: &SpecDir, registry: &Registry, errors: &mut HashMap<String, String>, first: bool) {
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
fn delivery(cfg: &Config, resource: &str, specs: Option<&Arc<SpecDir>>) -> Delivery {
    let cdi = specs.and_then(|s| match Kind::for_resource(resource) {
        Ok(kind) => Some(CdiTarget { kind, specs: s.clone() }),
        Err(e) => {
            tracing::warn!(resource, "no CDI spec for this resource: {e}");
            None
        }
    });
    Delivery::new(cfg.strategies(resource), cdi)
}
