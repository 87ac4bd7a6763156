//! `devplug run`: load the backends, poll them, serve each resource to kubelet, keep its CDI
//! spec current, hot-swap backends when their directory changes, stop cleanly.

mod hotswap;
mod specs;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

pub use hotswap::{Reconciler, load_all, sources};

use crate::backends::Registry;
use crate::backends::watch::DirTicks;
use crate::config::Config;
use crate::kubelet::{Endpoints, KubeletPaths, podresources};
use crate::observe;
use crate::runtime::Runtime;

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
    let (srcs, problems) = sources(&cfg);
    for p in &problems {
        tracing::error!("backends dir: {p}");
    }
    let refused = load_all(&registry, srcs).await;
    tracing::info!(loaded = registry.loaded().len(), "backends loaded");

    let paths =
        KubeletPaths { device_plugin_dir: cfg.kubelet_dir.clone(), plugins_registry_dir: cfg.plugins_registry_dir() };
    let endpoints = Arc::new(Endpoints::new(paths, cfg.registration)?);
    let stop = CancellationToken::new();
    let served = registry.clone();
    let pods = podresources::spawn(
        cfg.pod_resources_socket(),
        cfg.pod_resources_interval,
        move |r| served.snapshot().iter().any(|x| x.name == r),
        stop.clone(),
    );
    let polled = Arc::new(AtomicBool::new(false));
    let health =
        observe::Health { endpoints: endpoints.clone(), registry: registry.clone(), pods, polled: polled.clone() };
    observe::serve(cfg.metrics_addr, health, stop.clone()).await?;

    let specs = specs::open_cdi(&cfg);
    let mut cdi_errors = HashMap::new();
    let mut first = true;
    // Hot swap: watch the backends directory (a missing or unwatchable one is logged; the
    // backends loaded at start keep serving).
    let mut ticks = match &cfg.backends_dir {
        Some(dir) => match DirTicks::new(dir) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!("{e:#}; backends will not be hot-swapped");
                None
            }
        },
        None => None,
    };
    let mut hot = Reconciler::new(cfg.clone(), registry.clone(), endpoints.clone(), specs.clone(), refused);
    let mut next_poll = tokio::time::Instant::now();

    tokio::pin!(shutdown);
    loop {
        let tick = async {
            match ticks.as_mut() {
                Some(t) => t.changed().await,
                None => std::future::pending().await,
            }
        };
        // A swap does not wait for the poll, nor delays it.
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = tick => hot.reconcile().await,
            _ = tokio::time::sleep_until(next_poll) => {
                let report = registry.poll_once().await;
                hot.serve(report.ready).await;
                polled.store(true, Ordering::Release);
                next_poll = tokio::time::Instant::now() + cfg.poll_interval;
            }
        }
        if let Some(specs) = &specs {
            specs::sync_cdi(specs, &registry, &mut cdi_errors, std::mem::take(&mut first));
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
