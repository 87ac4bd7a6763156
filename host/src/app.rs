//! `devplug run`: load the backends, poll them, serve each resource to kubelet, stop cleanly.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::backends::{BackendSource, Registry, load_dir};
use crate::config::Config;
use crate::kubelet::{Endpoints, KubeletPaths};
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

    tokio::pin!(shutdown);
    loop {
        let report = registry.poll_once().await;
        for handle in report.ready {
            tracing::info!(resource = %handle.name, devices = handle.devices.borrow().devices.len(), "serving resource");
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
    Ok(())
}
