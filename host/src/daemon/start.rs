//! Putting the daemon together at start: the runtime and CDI directory, the table of loaded backends
//! (with the registries' versions first, when the config follows any), loading every backend,
//! the kubelet endpoints, the HTTP probes, and the watches that wake the control loop.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::polls::Polls;
use super::{BEAT, Daemon, specs};
use crate::backends::watch::DirTicks;
use crate::backends::{BackendSource, Follower, Loaded, Reconciler, load_all, prepare_all, sources};
use crate::config::Config;
use crate::kubelet::{Endpoints, KubeletPaths, podresources};
use crate::observe;
use crate::runtime::Runtime;

impl Daemon {
    /// Everything the control loop needs, with the backends loaded; `None` when `shutdown`
    /// came first.
    pub(super) async fn start<F: Future<Output = ()>>(
        mut cfg: Config,
        mut shutdown: Pin<&mut F>,
    ) -> anyhow::Result<Option<Daemon>> {
        raise_open_files();
        // First of all: a devplug stopping for this one waits until it has prepared.
        let preparing = super::handover::preparing(&super::handover::preparing_path(&cfg.instance_lock()));
        cfg.cache_dir = cfg.cache_dir.take().map(|dir| own_cache_dir(&dir));
        let runtime = Runtime::new(cfg.runtime_config())?;
        let specs = specs::open_cdi(&cfg);
        let metrics = Arc::new(observe::Metrics::new());
        let dra_resources = cfg.dra_resources();
        let mut loaded = Loaded::new(runtime, cfg.roots(), cfg.backends.clone(), cfg.default_grant)
            .with_metrics(metrics.clone())
            .with_dra_resources(dra_resources)
            .with_decisions(cfg.decisions()?);
        if let Some(s) = &specs {
            loaded = loaded.with_publish_hook(specs::writer(s.clone(), &cfg));
        }
        let loaded = Arc::new(loaded);
        let follower = Follower::new(&cfg.backends, &cfg.registry, cfg.cache_dir.as_deref())?;
        let statuses = follower.as_ref().map(Follower::statuses).unwrap_or_default();

        // The HTTP endpoints come up first: `/healthz` answers while backends load (a cold compile
        // of a big backend takes seconds), `/readyz` says not ready until they are served.
        let paths = KubeletPaths {
            device_plugin_dir: cfg.kubelet_dir.clone(),
            plugins_registry_dir: cfg.plugins_registry_dir(),
        };
        let endpoints = Arc::new(Endpoints::new(paths, cfg.registration)?.with_patience(cfg.registration_timeout));
        let claims = Arc::new(crate::dra::plugin::claims::ClaimBoard::default());
        let dra = connect_dra(&cfg, specs.as_ref(), endpoints.board(), claims.clone()).await;
        let stop = CancellationToken::new();
        let served = loaded.clone();
        let pods = podresources::spawn(
            cfg.pod_resources_socket(),
            cfg.pod_resources_interval,
            move |r| served.snapshot().iter().any(|x| x.name == r),
            stop.clone(),
        );
        let polled = Arc::new(AtomicBool::new(false));
        let standby = Arc::new(std::sync::atomic::AtomicU8::new(observe::Standby::No as u8));
        let heartbeat = Arc::new(observe::Heartbeat::new(observe::STALLED_AFTER));
        let probes = observe::Probes {
            endpoints: endpoints.clone(),
            loaded: loaded.clone(),
            metrics: metrics.clone(),
            pods,
            polled: polled.clone(),
            standby: standby.clone(),
            heartbeat: heartbeat.clone(),
            sources: statuses.clone(),
            claims,
            device_pages: observe::Probes::device_pages(),
            dra_driver: {
                let cfg = cfg.clone();
                Arc::new(move |backend: &str| cfg.dra_driver(backend))
            },
        };
        observe::serve(cfg.metrics_addr, probes.clone(), stop.clone()).await?;
        let loading = tokio::spawn({
            let heartbeat = heartbeat.clone();
            async move {
                let mut beat = tokio::time::interval(BEAT);
                loop {
                    beat.tick().await;
                    heartbeat.beat();
                }
            }
        });
        // What needs nothing exclusive comes before the lock: the registries' versions pulled
        // and every backend compiled, so a standby takes over with loads from memory.
        let Some(prepared) = prepare(&cfg, &loaded, follower, shutdown.as_mut()).await? else {
            loading.abort();
            stop.cancel();
            return Ok(None);
        };
        drop(preparing);
        // One devplug serves the node at a time: nothing is loaded, written or served before
        // the instance lock is held (a second devplug stands by, see handover.rs).
        let Some(instance) =
            super::handover::acquire(&cfg.instance_lock(), cfg.registration_timeout, shutdown.as_mut(), |s| {
                standby.store(s as u8, Ordering::Release)
            })
            .await?
        else {
            loading.abort();
            stop.cancel();
            return Ok(None);
        };
        // The status socket is the serving devplug's: bound only once the lock is held.
        if let Err(e) = observe::serve_status(&cfg.status_socket(), probes, stop.clone()).await {
            tracing::warn!(
                "{e:#}: `devplug status` cannot reach this devplug (a loopback --metrics-addr still serves /status)"
            );
        }
        let started = load(&cfg, &loaded, prepared, shutdown).await;
        loading.abort();
        let Some(Started { refused, follower, pulled_tx, pulled }) = started? else {
            stop.cancel();
            return Ok(None);
        };
        tracing::info!(loaded = loaded.origins().len(), "backends loaded");
        let ticks = cfg.backends_dir.as_deref().and_then(|dir| {
            // A missing or unwatchable directory is logged; the backends loaded at start serve on.
            DirTicks::new(dir).map_err(|e| tracing::error!("{e:#}; backends will not be hot-swapped")).ok()
        });
        let uevents = if cfg.uevents { listen_uevents() } else { None };
        let reconciler =
            Reconciler::new(loaded.clone(), metrics.clone(), refused).with_registry_sources(pulled.clone(), statuses);
        // The follower polls the registries on its own task: a slow registry never holds up the loop.
        let following = follower.map(|f| f.spawn(pulled_tx));
        Ok(Some(Daemon {
            cfg,
            loaded,
            specs,
            endpoints,
            dra,
            metrics,
            reconciler,
            polls: Polls::default(),
            polled,
            heartbeat,
            stop,
            following,
            pulled,
            ticks,
            uevents,
            beat: tokio::time::interval(BEAT),
            next_poll: tokio::time::Instant::now(),
            trimmed: false,
            sweep_pending: true,
            _instance: instance,
        }))
    }
}

/// What start-up loaded: the sources that failed (by name → key, not retried until they change)
/// and, when the config follows registry references, the follower and its channel.
struct Started {
    refused: HashMap<String, String>,
    follower: Option<Follower>,
    pulled_tx: watch::Sender<Vec<BackendSource>>,
    pulled: watch::Receiver<Vec<BackendSource>>,
}

/// What [`prepare`] did before the instance lock: the follower (started) and its channel.
struct Prepared {
    follower: Option<Follower>,
    pulled_tx: watch::Sender<Vec<BackendSource>>,
    pulled: watch::Receiver<Vec<BackendSource>>,
}

/// Before the instance lock: the registries' versions (the cached ones at once, then one look
/// at each registry, bounded by registry.timeout, so a node that can pull starts with the
/// newest) and every backend compiled. Nothing here is exclusive: the registry cache is
/// content-addressed and written by rename, compiled code is kept in memory for [`load`] (and
/// in the compile cache, likewise). `None` when `shutdown` came first.
async fn prepare<F: Future<Output = ()>>(
    cfg: &Config,
    loaded: &Arc<Loaded>,
    mut follower: Option<Follower>,
    mut shutdown: Pin<&mut F>,
) -> anyhow::Result<Option<Prepared>> {
    let (pulled_tx, pulled) = tokio::sync::watch::channel(Vec::new());
    if let Some(f) = follower.as_mut() {
        tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(None),
            _ = f.start() => {}
        }
        pulled_tx.send_replace(f.sources());
    }
    let (srcs, _) = sources(&cfg.catalog(), &pulled.borrow());
    tokio::select! {
        biased;
        _ = &mut shutdown => return Ok(None),
        _ = prepare_all(loaded, &srcs) => {}
    }
    Ok(Some(Prepared { follower, pulled_tx, pulled }))
}

/// Load every backend the config names, as the backends dir and the registries have them now
/// (a standby may have waited long: what changed meanwhile is loaded, compiled then); `None`
/// when `shutdown` came first.
async fn load<F: Future<Output = ()>>(
    cfg: &Config,
    loaded: &Arc<Loaded>,
    prepared: Prepared,
    mut shutdown: Pin<&mut F>,
) -> anyhow::Result<Option<Started>> {
    let Prepared { follower, pulled_tx, pulled } = prepared;
    let (srcs, problems) = sources(&cfg.catalog(), &pulled.borrow());
    for p in &problems {
        tracing::error!("backends dir: {p}");
    }
    let refused = tokio::select! {
        biased;
        _ = &mut shutdown => {
            tracing::info!("shutting down while backends were loading");
            return Ok(None);
        }
        refused = load_all(loaded, srcs) => refused,
    };
    loaded.forget_prepared();
    Ok(Some(Started { refused, follower, pulled_tx, pulled }))
}

/// The DRA side, when the config serves any resource through DRA; `None` (with an error saying
/// what to fix) when it cannot be had: those resources are then not served at all.
async fn connect_dra(
    cfg: &Config,
    specs: Option<&Arc<crate::cdi::SpecDir>>,
    board: Arc<crate::plugin_socket::registration::Board>,
    claims: Arc<crate::dra::plugin::claims::ClaimBoard>,
) -> Option<Arc<crate::dra::node::DraNode>> {
    if !cfg.uses_dra() {
        return None;
    }
    let Some(specs) = specs else {
        tracing::error!(
            "DRA is unavailable: claims are handed to the runtime through CDI and the CDI dir is not usable (see above)"
        );
        return None;
    };
    let settings = crate::dra::node::NodeSettings {
        kubeconfig: cfg.dra.kubeconfig.as_deref(),
        node_name: cfg.dra.node_name.as_deref(),
        registry_dir: cfg.plugins_registry_dir(),
        plugins_dir: cfg.dra_plugins_dir(),
        resync: cfg.dra.resync,
        claim_status: cfg.dra.claim_status,
        board,
        patience: cfg.registration_timeout,
        claims,
        sysfs_root: cfg.sysfs_root.clone(),
    };
    match crate::dra::node::DraNode::connect(settings, specs.clone()).await {
        Ok(node) => {
            tracing::info!(node = %node.node(), "DRA: publishing ResourceSlices for this node");
            Some(Arc::new(node))
        }
        Err(e) => {
            tracing::error!("DRA is unavailable: {e:#}; resources configured api = \"dra\" are not served");
            None
        }
    }
}

fn listen_uevents() -> Option<tokio::sync::mpsc::Receiver<crate::backends::uevents::Uevent>> {
    crate::backends::uevents::listen()
        .map_err(|e| {
            tracing::warn!(
                "kernel uevents unavailable ({e}); devices change at polls only (hostNetwork is needed in a pod)"
            )
        })
        .ok()
}

/// Where the compile and registry cache lives for a configured `dir`: the directory itself, or
/// devplug's own private directory inside it when others may write it (an emptyDir volume is
/// `0777`), said once.
fn own_cache_dir(dir: &std::path::Path) -> std::path::PathBuf {
    let place = crate::durable::StateDir::own_place(dir);
    if place != dir {
        tracing::info!(dir = %dir.display(), cache = %place.display(),
            "the cache dir is writable by other users (a Kubernetes emptyDir is); devplug keeps its cache in a private directory inside it");
    }
    place
}

/// Take the whole open-file limit the process may have: a node's default soft limit (often
/// 1,024) is less than the connection limits of a few sockets together (the sockets keep theirs,
/// `plugin_socket::serve`), and past it kubelet's own connections cannot be accepted.
fn raise_open_files() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit write and read only the struct passed, which lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let before = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        tracing::debug!(from = before, to = lim.rlim_cur, "open-file limit raised to its hard limit");
    }
}
