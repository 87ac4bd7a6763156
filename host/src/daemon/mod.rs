//! The daemon (`devplug run`): its control loop loads the backends, polls them, serves each
//! resource to kubelet, keeps its CDI spec current, hot-swaps backends when their directory
//! changes, and stops cleanly on SIGTERM whatever a backend is doing.

mod reconcile;
mod specs;
mod trim;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

pub use reconcile::Reconciler;

use crate::backends::watch::DirTicks;
use crate::backends::{Registry, load_all, sources};
use crate::config::Config;
use crate::kubelet::{Endpoints, KubeletPaths, podresources};
use crate::observe;
use crate::oci::Follower;
use crate::runtime::Runtime;

/// Why the control loop woke up.
enum Wake {
    Swap,
    Poll,
    Polled(crate::backends::PollDone),
    /// A kernel uevent of this subsystem.
    Uevent(String),
    Beat,
}

/// How often the control loop shows it is alive even with nothing to do.
const BEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Run until `shutdown` resolves; then stop serving and remove every socket.
///
/// Nothing a backend does holds up the loop's answer to `shutdown`: loading at start, each
/// poll and each swap run as futures raced against it (a backend call cut short keeps running
/// on its blocking thread only until its own deadline, and nothing waits for it).
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let runtime = Runtime::new(cfg.runtime_config())?;
    let specs = specs::open_cdi(&cfg);
    let mut registry = Registry::new(runtime, cfg.roots(), cfg.backends.clone(), cfg.default_grant);
    if let Some(s) = &specs {
        registry = registry.with_publish_hook(specs::writer(s.clone(), &cfg));
    }
    let registry = Arc::new(registry);
    // Backends from registries: the cached versions at once, then one look at each registry
    // (bounded by registry.timeout), so a node that can pull starts with the newest.
    let mut follower = Follower::new(&cfg)?;
    let statuses = follower.as_ref().map(Follower::statuses).unwrap_or_default();
    let (pulled_tx, pulled_rx) = tokio::sync::watch::channel(Vec::new());
    if let Some(f) = follower.as_mut() {
        tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(()),
            _ = f.start() => {}
        }
        pulled_tx.send_replace(f.sources());
    }
    let (srcs, problems) = sources(&cfg, &pulled_rx.borrow());
    for p in &problems {
        tracing::error!("backends dir: {p}");
    }
    let refused = tokio::select! {
        biased;
        _ = &mut shutdown => {
            tracing::info!("shutting down while backends were loading");
            return Ok(());
        }
        refused = load_all(&registry, srcs) => refused,
    };
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
    let heartbeat = Arc::new(observe::Heartbeat::new(observe::STALLED_AFTER));
    let probes = observe::Probes {
        endpoints: endpoints.clone(),
        registry: registry.clone(),
        pods,
        polled: polled.clone(),
        heartbeat: heartbeat.clone(),
        sources: statuses.clone(),
    };
    observe::serve(cfg.metrics_addr, probes, stop.clone()).await?;

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
    let mut reconciler = Reconciler::new(cfg.clone(), registry.clone(), endpoints.clone(), specs.clone(), refused)
        .with_registry_sources(pulled_rx.clone(), statuses);
    let mut pulled_rx = pulled_rx;
    // The follower polls the registries on its own task: a slow registry never holds up the loop.
    let following = follower.map(|f| f.spawn(pulled_tx));
    let mut next_poll = tokio::time::Instant::now();
    let mut beat = tokio::time::interval(BEAT);
    // Discovers under way, one per backend at most: each backend keeps its own cadence, and one
    // that hangs until its deadline holds up nobody else.
    let mut polls: tokio::task::JoinSet<crate::backends::PollDone> = tokio::task::JoinSet::new();
    let mut busy: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut first_round: Option<usize> = None;
    let mut trimmed = false;
    // Backends a uevent asked for while their discover was running: once more when it ends, so
    // the last event of a burst is always seen.
    let mut again: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut uevents = if cfg.uevents {
        match crate::backends::uevents::listen() {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(
                    "kernel uevents unavailable ({e}); devices change at polls only (hostNetwork is needed in a pod)"
                );
                None
            }
        }
    } else {
        None
    };

    loop {
        heartbeat.beat();
        let tick = async {
            match ticks.as_mut() {
                Some(t) => t.changed().await,
                None => std::future::pending().await,
            }
        };
        let wake = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = tick => Wake::Swap,
            Ok(()) = pulled_rx.changed(), if following.is_some() => Wake::Swap,
            _ = tokio::time::sleep_until(next_poll) => Wake::Poll,
            Some(done) = polls.join_next(), if !polls.is_empty() => match done {
                Ok(done) => Wake::Polled(done),
                Err(e) => {
                    // A discover that panicked in the host: its backend stays marked busy (and
                    // unpolled) rather than be called into a host bug again.
                    tracing::error!("a backend's discover panicked in the host: {e}");
                    Wake::Beat
                }
            },
            Some(ev) = async {
                match uevents.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => Wake::Uevent(ev.subsystem),
            _ = beat.tick() => Wake::Beat,
        };
        let work = async {
            match wake {
                Wake::Swap => reconciler.reconcile().await,
                Wake::Poll => {
                    // The poll after the first round: start-up (loading, first lists,
                    // registration) is over, and what only it needed can go.
                    if polled.load(Ordering::Acquire) && !std::mem::replace(&mut trimmed, true) {
                        tokio::task::spawn_blocking(trim::after_start);
                    }
                    let jobs = registry.start_polls(&busy);
                    if *first_round.get_or_insert(jobs.len()) == 0 {
                        polled.store(true, Ordering::Release);
                    }
                    for job in jobs {
                        busy.insert(job.name.clone());
                        polls.spawn_blocking(move || job.run());
                    }
                    next_poll = tokio::time::Instant::now() + cfg.poll_interval;
                    return;
                }
                Wake::Uevent(subsystem) => {
                    for name in registry.subscribers(&subsystem) {
                        if busy.contains(&name) {
                            again.insert(name);
                        } else if let Some(job) = registry.poll_job(&name) {
                            busy.insert(name);
                            polls.spawn_blocking(move || job.run());
                        }
                    }
                    return;
                }
                Wake::Polled(done) => {
                    let name = done.backend().to_owned();
                    busy.remove(&name);
                    let ready = registry.finish_poll(done);
                    if again.remove(&name)
                        && let Some(job) = registry.poll_job(&name)
                    {
                        busy.insert(name);
                        polls.spawn_blocking(move || job.run());
                    }
                    reconciler.serve(ready).await;
                    if let Some(left) = first_round.as_mut() {
                        *left = left.saturating_sub(1);
                        if *left == 0 {
                            polled.store(true, Ordering::Release);
                        }
                    }
                }
                Wake::Beat => return,
            }
            // Once every backend has answered once, specs for resources no backend serves any
            // more (left by a killed devplug) go.
            if let Some(specs) = &specs
                && polled.load(Ordering::Acquire)
            {
                specs::sweep_once(specs, &registry, &cfg, &mut first);
            }
        };
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            _ = work => {}
        }
    }
    tracing::info!("shutting down: closing sockets");
    stop.cancel();
    if let Some(f) = following {
        f.abort();
    }
    endpoints.shutdown().await;
    if let Some(specs) = &specs {
        specs.remove_all();
    }
    Ok(())
}
